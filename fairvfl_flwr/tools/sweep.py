"""Run a grid of FairVFL configurations and tabulate them.

::

    python -m fairvfl_flwr.tools.sweep --datasets adult,compas,crime --models linear,mlp \\
        --epsilons 0.01,off --seeds 0 --out results/quality

``off`` runs the same app with the fairness term off (FedBCD-style VFL). Each run goes
through the real ServerApp strategy and ClientApp, over the in-process grid (the same
messages as ``flwr run``, without Ray's per-round cost) or, with ``--engine flwr``, through
``flwr run`` (tools/tasks.py). Writes ``results.json``, ``results.csv`` and ``table.md``
(mean ± std over seeds) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from itertools import product
from pathlib import Path

from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.tools.cli import RunConfigArgError, comma_list, parse_run_config
from fairvfl_flwr.tools.tasks import ENGINES, Done, Task, run_tasks
from fairvfl_flwr.tools.results import publish, this_command, unfiled
from fairvfl_flwr.tools.tables import markdown, mean_std

PROG = "fairvfl-sweep"
METRICS = ("test_acc", "test_dfp", "test_dfn", "train_max_gap", "train_loss")


def run_grid(
    datasets: list[str],
    models: list[str],
    epsilons: list[str],
    seeds: list[int],
    out: Path,
    overrides: dict | None = None,
    quiet: bool = True,
    engine: str = "inprocess",
) -> list[dict]:
    """Run every combination; return one record (config + summary) per run."""
    out.mkdir(parents=True, exist_ok=True)
    tasks = []
    for dataset, model, eps, seed in product(datasets, models, epsilons, seeds):
        changes = {"preset": "paper", "dataset": dataset, "model": model, "seed": seed, "output-dir": str(out / "runs")}
        changes.update(overrides or {})
        if eps == "off":
            changes["fairness"] = False
        else:
            changes["epsilon"] = float(eps)
        cfg = RunConfig.from_flower({**RunConfig().to_flower(), **changes})
        tasks.append(Task(run_config=cfg.to_flower(), data={"method": _method(eps, cfg.constraint), "dataset": dataset,
                                                           "model": model, "seed": seed,
                                                           "rounds": cfg.num_server_rounds}))
    records: list[dict] = []

    def keep(done: Done) -> str:
        rec = {**done.task.data, "run_dir": str(done.folder), **{k: done.summary[k] for k in METRICS},
               "seconds": done.seconds}
        records.append(rec)
        _write(records, out)
        return (f"{rec['dataset']:7s} {rec['model']:6s} {rec['method']:16s} seed {rec['seed']}: "
                f"ACC {100 * rec['test_acc']:.2f}% DFP {rec['test_dfp']:.3f} DFN {rec['test_dfn']:.3f} "
                f"train max gap {rec['train_max_gap']:.4f} ({rec['seconds']:.0f} s)")

    run_tasks(tasks, keep, engine=engine, home=out / "flwr-home", quiet=quiet)
    return records


CONSTRAINT_TAGS = {"deo": "", "equalized-odds": "-EO", "demographic-parity": "-DP"}


def _method(eps: str, constraint: str = "deo") -> str:
    """``FairVFL(eps=0.01)``; other constraint sets are tagged: ``FairVFL-EO(eps=0.01)``."""
    if eps == "off":
        return "FedBCD (fair off)"
    return f"FairVFL{CONSTRAINT_TAGS.get(constraint, '-' + constraint)}(eps={float(eps):g})"


def table(records: list[dict]) -> str:
    """Markdown: one block per model, rows = methods, columns = ACC/DFP/DFN/train max gap per dataset."""
    lines = []
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    header = ["method", *[f"{d} {c}" for d in datasets for c in ("ACC %", "DFP", "DFN", "train max gap")]]
    for model in dict.fromkeys(r["model"] for r in records):
        rows = [r for r in records if r["model"] == model]
        seeds = len({r["seed"] for r in rows})
        lines.append(f"\n**{model}** ({seeds} seed{'s' if seeds > 1 else ''}; rounds: "
                     f"{', '.join(sorted({str(r['rounds']) for r in rows}))})\n")
        cells = []
        for method in dict.fromkeys(r["method"] for r in rows):
            row = [method]
            for d in datasets:
                sel = [r for r in rows if r["method"] == method and r["dataset"] == d]
                row += [
                    mean_std([r["test_acc"] for r in sel], scale=100, digits=2),
                    mean_std([r["test_dfp"] for r in sel]),
                    mean_std([r["test_dfn"] for r in sel]),
                    mean_std([r["train_max_gap"] for r in sel], digits=4),
                ] if sel else ["", "", "", ""]
            cells.append(row)
        lines += markdown(header, cells)
    return "\n".join(lines) + "\n"


def _write(records: list[dict], out: Path) -> None:
    (out / "results.json").write_text(json.dumps(records, indent=1) + "\n")
    keys = list(records[0])
    csv_lines = [",".join(keys)] + [",".join(str(r[k]) for k in keys) for r in records]
    (out / "results.csv").write_text("\n".join(csv_lines) + "\n")
    (out / "table.md").write_text(table(records))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="adult,compas,crime", help="comma list of datasets")
    p.add_argument("--models", default="linear,mlp", help="comma list of models")
    p.add_argument("--epsilons", default="0.01,off", help="comma list of ε; 'off' = fairness off")
    p.add_argument("--seeds", default="0", help="comma list of seeds")
    p.add_argument("--out", type=Path, default=Path("results/sweep"), help="folder for results and table.md")
    p.add_argument("--results", type=Path, default=None, metavar="DIR",
                   help="also publish the table as DIR/<--out's folder name>.md with this command "
                        "(docs/results refreshes the docs' results page)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="run-config override for every run in flwr run's --run-config syntax, e.g. "
                        "--set num-server-rounds=500 --set \"optimizer='newton'\" (repeatable)")
    p.add_argument("--engine", default="inprocess", choices=ENGINES,
                   help="inprocess: the app over an in-process grid; flwr: `flwr run` on a private "
                        "simulation SuperLink")
    p.add_argument("--verbose", action="store_true", help="show every run's round log")
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    if a.results is not None and (why := unfiled(a.out.name, a.results)):
        p.error(why)
    try:
        overrides = parse_run_config(a.set)
        t0 = time.perf_counter()
        records = run_grid(comma_list(a.datasets), comma_list(a.models), comma_list(a.epsilons),
                           [int(s) for s in comma_list(a.seeds)], a.out, overrides, quiet=not a.verbose,
                           engine=a.engine)
    except (RunConfigArgError, ConfigError) as exc:
        p.error(str(exc))
    print(table(records))
    if a.results is not None:
        publish(a.out.name, this_command(), {"records": records}, table(records), title="Train max gap sweep",
                out=a.results)
    print(f"{len(records)} runs in {time.perf_counter() - t0:.0f} s; results in {a.out.resolve()}")


if __name__ == "__main__":
    main()
