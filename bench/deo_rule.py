"""Block Newton's two dual rules on two-group ``deo``: the clipped dual Newton step (a kind that
declares ``newton_past_bound``) against the constrained search (every built-in kind), the same
runs otherwise.

    python bench/deo_rule.py                       # adult, compas, crime x seeds 0-2, print
    python bench/deo_rule.py --page                # also writes docs/results/rounds/rounds-deo-rule.md
    python bench/deo_rule.py --datasets compas --seeds 0

Each run: ``constraint = "deo"``, ``optimizer = "newton"``, ε = 0.01, the stop rule on and
``--rounds`` the cap, in process. ``clipped`` sets ``DEO.newton_past_bound`` in the run's own
process, which is how a constraint kind asks for that rule (core/newton.rule_for). Per run: the
rounds until the stop rule ended it, the first round from which every training gap stays within
ε + 0.002, the final training gap and loss, test accuracy and the test DEO (DFN), and seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, table, write  # noqa: E402

EPSILON = 0.01
SLACK = 0.002
RULES = ("clipped", "constrained")


def one(job: tuple[str, int, str, int]) -> dict:
    """One run in this (fresh) process: its row."""
    dataset, seed, rule, rounds = job
    from fairvfl_flwr.app.run import run_inprocess
    from fairvfl_flwr.core.constraints.deo import DEO

    DEO.newton_past_bound = rule == "clipped"
    with tempfile.TemporaryDirectory() as tmp:
        rc = {"dataset": dataset, "constraint": "deo", "optimizer": "newton", "seed": seed, "epsilon": EPSILON,
              "num-server-rounds": rounds, "output-dir": tmp}
        started = time.perf_counter()
        summary, folder = run_inprocess(rc, quiet=True)
        seconds = time.perf_counter() - started
        history = json.loads((folder / "history.json").read_text())
    within = [r["round"] for r in history if r["round"] > 0
              and all(later["max_gap"] <= EPSILON + SLACK for later in history if later["round"] >= r["round"])]
    return {"dataset": dataset, "seed": seed, "rule": rule, "rounds": summary["rounds"],
            "stopped": summary["rounds"] < rounds, "within ε + 0.002 from": within[0] if within else None,
            "train gap": summary["train_max_gap"], "train loss": summary["train_loss"],
            "test acc": 100 * summary["test_acc"], "test DFN": summary["test_dfn"], "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="adult,compas,crime")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=100, help="the cap; the stop rule ends a run before it")
    ap.add_argument("--jobs", type=int, default=2, help="runs side by side, each in its own process")
    ap.add_argument("--page", action="store_true", help="write docs/results/rounds/rounds-deo-rule.md")
    args = ap.parse_args(argv)
    jobs = [(d, int(s), rule, args.rounds) for d in args.datasets.split(",") for s in args.seeds.split(",")
            for rule in RULES]
    # a fresh process per run: the rule is a class attribute of the constraint kind
    with ProcessPoolExecutor(args.jobs, max_tasks_per_child=1) as pool:
        rows = list(pool.map(one, jobs))
    cols = list(rows[0])
    markdown = table(rows, cols)
    summary = []
    for d in args.datasets.split(","):
        by = {rule: [r for r in rows if r["dataset"] == d and r["rule"] == rule] for rule in RULES}
        summary.append(f"- {d}: rounds " + "; ".join(
            f"{rule} {' '.join(str(r['rounds']) for r in by[rule])}" for rule in RULES)
            + "; largest final training gap " + "; ".join(
            f"{rule} {max(r['train gap'] for r in by[rule]):.4g}" for rule in RULES)
            + "; test accuracy difference (constrained − clipped, points) "
            + " ".join(f"{c['test acc'] - k['test acc']:+.2f}" for k, c in zip(by["clipped"], by["constrained"])))
    markdown += "\n\n" + "\n".join(summary)
    if not args.page:
        print(markdown)
    else:
        notes = (f"`clipped`: the dual Newton step on d = λ+ − λ−, clipped to the loss measure's weight bounds "
                 f"and past them the paper's gradient step with β; `constrained`: the server's search solves for "
                 f"the step lengths and λ together, every gap within ε on the round's subspace "
                 f"(docs/newton.md). ε = {EPSILON} on the loss gap, the stop rule on, {args.rounds} rounds the cap. "
                 f"`within ε + 0.002 from`: the first round from which every training gap stays within it. Seconds: "
                 f"the whole in-process run, {args.jobs} side by side.")
        write(DEFAULT_OUT, "rounds-deo-rule", {"rows": rows, "epsilon": EPSILON, "rounds": args.rounds},
              markdown, title="Block Newton on two-group deo: the clipped dual step against the constrained search",
              notes=notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
