"""Run a grid of FairVFL configurations and tabulate them.

::

    python -m fairvfl_flwr.tools.sweep --datasets adult,compas,crime --models linear,mlp \\
        --epsilons 0.01,off --seeds 0 --out results/quality

``off`` runs the same app with the fairness term off (FedBCD-style VFL). Each run goes
through the real ServerApp strategy and ClientApp over the in-process grid (the same
messages as ``flwr run``, without Ray's per-round cost); ``tests/test_simulation.py``
checks that both transports give the same numbers. Writes ``results.json``,
``results.csv`` and ``table.md`` (mean ± std over seeds) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from itertools import product
from pathlib import Path

from fairvfl_flwr.config.run import RunConfig
from fairvfl_flwr.app.run import run_inprocess

METRICS = ("test_acc", "test_dfp", "test_dfn", "train_deo", "train_loss")


def _parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key.strip()] = value.strip()
    return out


def run_grid(
    datasets: list[str],
    models: list[str],
    epsilons: list[str],
    seeds: list[int],
    out: Path,
    overrides: dict | None = None,
    quiet: bool = True,
) -> list[dict]:
    """Run every combination; return one record (config + summary) per run."""
    out.mkdir(parents=True, exist_ok=True)
    combos = list(product(datasets, models, epsilons, seeds))
    records, t0 = [], time.perf_counter()
    for i, (dataset, model, eps, seed) in enumerate(combos, 1):
        changes = {"preset": "paper", "dataset": dataset, "model": model, "seed": seed, "output-dir": str(out / "runs")}
        changes.update(overrides or {})
        if eps == "off":
            changes["fairness"] = False
        else:
            changes["epsilon"] = float(eps)
        cfg = RunConfig.from_flower({**RunConfig().to_flower(), **changes})
        started = time.perf_counter()
        summary, folder = run_inprocess(cfg.to_flower(), quiet=quiet)
        rec = {"method": _method(eps, cfg.constraint), "dataset": dataset, "model": model, "seed": seed,
               "rounds": cfg.num_server_rounds, "run_dir": str(folder), **{k: summary[k] for k in METRICS},
               "seconds": time.perf_counter() - started}
        records.append(rec)
        elapsed = time.perf_counter() - t0
        eta = elapsed / i * (len(combos) - i)
        print(
            f"[{i}/{len(combos)}] {dataset:7s} {model:6s} {rec['method']:16s} seed {seed}: "
            f"ACC {100 * rec['test_acc']:.2f}% DFP {rec['test_dfp']:.3f} DFN {rec['test_dfn']:.3f} "
            f"train DEO {rec['train_deo']:.4f} ({rec['seconds']:.0f} s, ETA {eta:.0f} s)",
            flush=True,
        )
        _write(records, out)
    return records


CONSTRAINT_TAGS = {"deo": "", "equalized-odds": "-EO", "demographic-parity": "-DP"}


def _method(eps: str, constraint: str = "deo") -> str:
    """``FairVFL(eps=0.01)``; other constraint sets are tagged: ``FairVFL-EO(eps=0.01)``."""
    if eps == "off":
        return "FedBCD (fair off)"
    return f"FairVFL{CONSTRAINT_TAGS.get(constraint, '-' + constraint)}(eps={float(eps):g})"


def _fmt(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    vals = [v * scale for v in values]
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{statistics.mean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def table(records: list[dict]) -> str:
    """Markdown: one block per model, rows = methods, columns = ACC/DFP/DFN/train DEO per dataset."""
    lines = []
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    for model in dict.fromkeys(r["model"] for r in records):
        rows = [r for r in records if r["model"] == model]
        seeds = len({r["seed"] for r in rows})
        lines.append(f"\n**{model}** ({seeds} seed{'s' if seeds > 1 else ''}; rounds: "
                     f"{', '.join(sorted({str(r['rounds']) for r in rows}))})\n")
        header = "| method | " + " | ".join(f"{d} ACC % | {d} DFP | {d} DFN | {d} train DEO" for d in datasets) + " |"
        lines += [header, "|" + "---|" * (1 + 4 * len(datasets))]
        for method in dict.fromkeys(r["method"] for r in rows):
            cells = []
            for d in datasets:
                sel = [r for r in rows if r["method"] == method and r["dataset"] == d]
                if not sel:
                    cells += ["", "", "", ""]
                    continue
                cells += [
                    _fmt([r["test_acc"] for r in sel], 100, 2),
                    _fmt([r["test_dfp"] for r in sel]),
                    _fmt([r["test_dfn"] for r in sel]),
                    _fmt([r["train_deo"] for r in sel], digits=4),
                ]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _write(records: list[dict], out: Path) -> None:
    (out / "results.json").write_text(json.dumps(records, indent=1) + "\n")
    keys = list(records[0])
    csv_lines = [",".join(keys)] + [",".join(str(r[k]) for k in keys) for r in records]
    (out / "results.csv").write_text("\n".join(csv_lines) + "\n")
    (out / "table.md").write_text(table(records))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="adult,compas,crime")
    p.add_argument("--models", default="linear,mlp")
    p.add_argument("--epsilons", default="0.01,off", help="comma list; 'off' = fairness off")
    p.add_argument("--seeds", default="0", help="comma list of seeds")
    p.add_argument("--out", type=Path, default=Path("results/sweep"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="run-config override for every run, e.g. --set num-server-rounds=500")
    p.add_argument("--verbose", action="store_true", help="show every run's round log")
    a = p.parse_args(argv)
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    t0 = time.perf_counter()
    records = run_grid(split(a.datasets), split(a.models), split(a.epsilons),
                       [int(s) for s in split(a.seeds)], a.out, _parse_overrides(a.set), quiet=not a.verbose)
    print(table(records))
    print(f"{len(records)} runs in {time.perf_counter() - t0:.0f} s; results in {a.out.resolve()}")


if __name__ == "__main__":
    main()
