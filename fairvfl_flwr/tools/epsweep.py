"""Choose ε: train over a list of ε on a validation split, pick one by a rule, plot the trade-off.

::

    python -m fairvfl_flwr.tools.epsweep --dataset adult --constraint equalized-odds \\
        --epsilons 0.002,0.005,0.01,0.02,0.05,0.1 --max-dfn 0.05 --out results/epsweep-adult

For every ε (and seed) the app trains on the training rows minus a seeded validation
split (``validation-fraction``, default 0.2) and reports ACC, DFP and DFN on the
validation rows; the test rows are not looked at. The rule: among the ε whose mean
validation DFP <= ``--max-dfp`` and DFN <= ``--max-dfn`` (and ACC >= ``--min-acc``),
take the one with the highest validation ACC (ties: the larger ε). If no ε qualifies,
the one that misses the bounds by the least is taken and the output says so. The
chosen ε is then retrained on all training rows and evaluated once on the test rows
(``--no-refit`` skips this).

Writes ``epsweep.json``, ``table.md`` and ``tradeoff.png`` into ``--out``. Every run
goes through the real ServerApp strategy and ClientApp, over the in-process grid or with
``--engine flwr`` through ``flwr run`` (tools/tasks.py), like ``fairvfl-sweep``; any
run-config key can be set with ``--set``, in flwr run's ``--run-config`` syntax.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.tools.cli import RunConfigArgError, comma_list, parse_run_config
from fairvfl_flwr.tools.tasks import ENGINES, Done, Task, run_tasks
from fairvfl_flwr.tools.results import publish, this_command, unfiled
from fairvfl_flwr.tools.tables import markdown

PROG = "fairvfl-epsweep"
METRICS = ("acc", "dfp", "dfn", "train_max_gap")


@dataclass(frozen=True)
class Rule:
    """Bounds a chosen ε must meet on the validation rows (None: no bound)."""

    max_dfp: float | None = None
    max_dfn: float | None = None
    min_acc: float | None = None

    def shortfall(self, acc: float, dfp: float, dfn: float) -> float:
        """How far a point misses the bounds (0: it meets them all)."""
        miss = 0.0
        if self.max_dfp is not None:
            miss = max(miss, dfp - self.max_dfp)
        if self.max_dfn is not None:
            miss = max(miss, dfn - self.max_dfn)
        if self.min_acc is not None:
            miss = max(miss, self.min_acc - acc)
        return miss

    def __str__(self) -> str:
        parts = [f"{name} {op} {v:g}" for name, op, v in
                 (("DFP", "<=", self.max_dfp), ("DFN", "<=", self.max_dfn), ("ACC", ">=", self.min_acc))
                 if v is not None]
        return ("validation " + " and ".join(parts) + ", then highest validation ACC") if parts else \
            "highest validation ACC"


def select_epsilon(points: list[dict], rule: Rule) -> tuple[dict, bool]:
    """Pick one point (mean validation metrics per ε) by ``rule``; return it and whether it qualifies."""
    if not points:
        raise ValueError("no ε to choose from")
    scored = [(rule.shortfall(p["acc"], p["dfp"], p["dfn"]), p) for p in points]
    ok = [p for miss, p in scored if miss <= 0]
    if ok:
        return max(ok, key=lambda p: (p["acc"], p["epsilon"])), True
    return min(scored, key=lambda mp: (mp[0], -mp[1]["acc"]))[1], False


def _record(done: Done) -> dict:
    summary = done.summary
    return {"acc": summary["test_acc"], "dfp": summary["test_dfp"], "dfn": summary["test_dfn"],
            "train_max_gap": summary["train_max_gap"], "run_dir": str(done.folder), **done.task.data,
            "seconds": done.seconds}


def _train(base: dict, epsilons: list[float], seeds: list[int], out: Path, engine: str, quiet: bool, note: str,
           **changes) -> list[dict]:
    """One run per (ε, seed); the records in that order. ``note`` names the runs in the progress lines."""
    tasks = [Task(run_config={**base, **changes, "epsilon": eps, "seed": seed, "output-dir": str(out / "runs")},
                data={"epsilon": eps, "seed": seed}) for eps in epsilons for seed in seeds]
    records: list[dict] = []

    def keep(done: Done) -> str:
        rec = _record(done)
        records.append(rec)
        return (f"eps={rec['epsilon']:g} seed {rec['seed']}: {note} ACC {100 * rec['acc']:.2f}% "
                f"DFP {rec['dfp']:.3f} DFN {rec['dfn']:.3f} | train max gap {rec['train_max_gap']:.4f} "
                f"({rec['seconds']:.0f} s)")

    run_tasks(tasks, keep, engine=engine, home=out / "flwr-home", quiet=quiet)
    return records


def _mean(rows: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in rows)


def sweep(
    base: dict,
    epsilons: list[float],
    seeds: list[int],
    rule: Rule,
    out: Path,
    refit: bool = True,
    quiet: bool = True,
    engine: str = "inprocess",
) -> dict:
    """Run the sweep; return (and write) ``{"points", "runs", "chosen", "qualifies", "test"}``."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    runs = _train(base, epsilons, seeds, out, engine, quiet, "validation")
    points = []
    for eps in epsilons:
        sel = [r for r in runs if r["epsilon"] == eps]
        points.append({"epsilon": eps, **{k: _mean(sel, k) for k in METRICS}, "seeds": len(sel)})
    chosen, qualifies = select_epsilon(points, rule)
    result = {"config": base, "rule": str(rule), "points": points, "runs": runs,
              "chosen": chosen["epsilon"], "qualifies": qualifies, "test": None}
    if refit:
        tests = _train(base, [chosen["epsilon"]], seeds, out, engine, quiet, "refit, test",
                       **{"validation-fraction": 0.0})
        result["test"] = {"epsilon": chosen["epsilon"], "runs": tests, **{k: _mean(tests, k) for k in METRICS}}
    result["seconds"] = time.perf_counter() - t0
    (out / "epsweep.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "table.md").write_text(report(result))
    plot_tradeoff(result, out / "tradeoff.png")
    return result


def report(result: dict) -> str:
    """The sweep as markdown: one row per ε (validation means), the choice, the test numbers."""
    cfg = result["config"]
    lines = [
        f"ε sweep: {cfg.get('dataset')} / {cfg.get('model')} / constraint {cfg.get('constraint')}, "
        f"validation-fraction {cfg.get('validation-fraction')}, {result['points'][0]['seeds']} seed(s)",
        "",
        *markdown(["ε", "val ACC %", "val DFP", "val DFN", "train max gap", ""],
                  [[f"{p['epsilon']:g}", f"{100 * p['acc']:.2f}", f"{p['dfp']:.4f}", f"{p['dfn']:.4f}",
                    f"{p['train_max_gap']:.4f}", "← chosen" if p["epsilon"] == result["chosen"] else ""]
                   for p in result["points"]]),
    ]
    lines += ["", f"Rule: {result['rule']}.",
              f"Chosen ε = {result['chosen']:g}" + ("" if result["qualifies"] else
                                                  " (NO ε meets the rule; this one misses it by the least)") + "."]
    t = result.get("test")
    if t:
        lines.append(f"Refit on all training rows, test rows: ACC {100 * t['acc']:.2f}%, DFP {t['dfp']:.4f}, "
                     f"DFN {t['dfn']:.4f}, train max gap {t['train_max_gap']:.4f}.")
    return "\n".join(lines) + "\n"


def plot_tradeoff(result: dict, path: Path) -> None:
    """Left: validation ACC, DFP, DFN against ε. Right: ACC against max(DFP, DFN), points labelled by ε."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = result["points"]
    eps = [p["epsilon"] for p in pts]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot(eps, [p["dfp"] for p in pts], "o-", label="val DFP")
    ax1.plot(eps, [p["dfn"] for p in pts], "s-", label="val DFN")
    ax1.set_xscale("log" if min(eps) > 0 else "symlog", **({} if min(eps) > 0 else {"linthresh": 1e-3}))
    ax1.set_xlabel(r"$\epsilon$")
    ax1.set_ylabel("fairness gap")
    acc_ax = ax1.twinx()
    acc_ax.plot(eps, [100 * p["acc"] for p in pts], "^--", color="C2", label="val ACC")
    acc_ax.set_ylabel("validation ACC %")
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = acc_ax.get_legend_handles_labels()
    ax1.legend(h1 + h2, l1 + l2, fontsize=8)
    ax1.axvline(result["chosen"], color="k", ls=":", lw=1)
    ax1.set_title("validation metrics against ε")
    worst = [max(p["dfp"], p["dfn"]) for p in pts]
    ax2.plot(worst, [100 * p["acc"] for p in pts], "o-", color="C0")
    for p, w in zip(pts, worst):
        ax2.annotate(f"{p['epsilon']:g}", (w, 100 * p["acc"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        if p["epsilon"] == result["chosen"]:
            ax2.plot([w], [100 * p["acc"]], "*", color="C3", ms=14, label=f"chosen ε={p['epsilon']:g}")
    ax2.set_xlabel("validation max(DFP, DFN)")
    ax2.set_ylabel("validation ACC %")
    ax2.set_title("accuracy–fairness trade-off")
    ax2.legend(fontsize=8)
    cfg = result["config"]
    fig.suptitle(f"FairVFL ε sweep: {cfg.get('dataset')}, {cfg.get('model')}, {cfg.get('constraint')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="adult", help="the dataset to train on (adult)")
    p.add_argument("--model", default="linear", help="the parties' model (linear)")
    p.add_argument("--constraint", default="deo", help="deo | equalized-odds | demographic-parity")
    p.add_argument("--epsilons", default="0.002,0.005,0.01,0.02,0.05,0.1", help="comma list of ε")
    p.add_argument("--seeds", default="0", help="comma list of seeds (metrics are averaged)")
    p.add_argument("--validation-fraction", type=float, default=0.2,
                   help="share of the training rows held out to choose ε on, in (0, 0.5]")
    p.add_argument("--max-dfp", type=float, default=None, help="bound on validation DFP")
    p.add_argument("--max-dfn", type=float, default=None, help="bound on validation DFN")
    p.add_argument("--min-acc", type=float, default=None, help="bound on validation ACC (a fraction, e.g. 0.83)")
    p.add_argument("--no-refit", action="store_true", help="do not retrain the chosen ε for test numbers")
    p.add_argument("--out", type=Path, default=Path("results/epsweep"),
                   help="folder for epsweep.json, table.md, tradeoff.png and the runs")
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


def main(argv: list[str] | None = None) -> dict:
    p = parser()
    a = p.parse_args(argv)
    if a.results is not None and (why := unfiled(a.out.name, a.results)):
        p.error(why)
    epsilons = [float(e) for e in comma_list(a.epsilons)]
    if not epsilons or any(e < 0 or math.isnan(e) for e in epsilons):
        p.error("--epsilons: give one or more numbers >= 0")
    if not 0 < a.validation_fraction <= 0.5:
        p.error("--validation-fraction must be in (0, 0.5]: ε is chosen on validation rows, never on test rows")
    base = {"preset": "paper", "dataset": a.dataset, "model": a.model, "constraint": a.constraint, "fairness": True,
            "validation-fraction": a.validation_fraction}
    try:
        base.update(parse_run_config(a.set))
        RunConfig.from_flower({**RunConfig().to_flower(), **base})  # refuse bad keys before the first run
    except (RunConfigArgError, ConfigError) as exc:
        p.error(str(exc))
    rule = Rule(a.max_dfp, a.max_dfn, a.min_acc)
    result = sweep(base, epsilons, [int(s) for s in comma_list(a.seeds)], rule, a.out,
                   refit=not a.no_refit, quiet=not a.verbose, engine=a.engine)
    print(report(result))
    if a.results is not None:
        publish(a.out.name, this_command(), result, report(result), title=f"ε chosen on validation rows: {a.dataset}",
                out=a.results)
    print(f"{len(result['runs'])} validation runs in {result['seconds']:.0f} s; results in {a.out.resolve()}")
    return result


def cli() -> None:
    """Console script ``fairvfl-epsweep`` (:func:`main` returns the result for callers)."""
    main()


if __name__ == "__main__":
    cli()
