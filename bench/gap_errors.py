"""How far each Gauss–Newton step's true gaps land from the linearised ones, against the step's size.

    python bench/gap_errors.py --dataset adult-race --seed 1
    python bench/gap_errors.py --dataset compas --set "constraint='equalized-odds'" --set fairness=false

One in-process MLP run (``model = "mlp"``, ε = 0.01, every other key at its default unless
``--set``), printed step by step: the round whose replies judged the step, the damping δ the
search ran at (whether it held the gaps: not in the ``newton-warm-rounds``), whether the step was kept, the step's root-mean-square change of the training
logits on the linearised model, the largest amount a true gap ended further from 0 than the
linearised one (``algorithms/newton.gap_error``, what ``next_damping`` reads), that error
over the square of the logit change, and the training loss after the step. Print-only: what a
rule for δ has to go on, per step.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairvfl_flwr.algorithms.newton import NewtonVFL, gap_error  # noqa: E402
from fairvfl_flwr.app.run import run_inprocess  # noqa: E402
from fairvfl_flwr.tools.cli import RunConfigArgError, parse_run_config  # noqa: E402

COLUMNS = ("round", "holds gaps", "damping", "kept", "logit change", "gap error", "error / change²", "loss")


class StepTrace:
    """The server's search and judgment, wrapped for one run: each search's starting and
    predicted training logits, then, at its judgment, what the true logits made of them."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.pending: dict | None = None

    def search(self, search):
        def searching(server: NewtonVFL, server_round: int) -> None:
            start = server.z("train").copy()
            search(server, server_round)  # which may start δ again (the first round that holds the gaps)
            if server.trial is not None:
                self.pending = {"damping": server.damping, "holds": server.trial["holds"], "start": start,
                                "predicted": server.z("train").copy(),
                                "gaps": np.asarray(server.trial["gaps_predicted"], dtype=np.float64)}
        return searching

    def judge(self, judge):
        def judging(server: NewtonVFL, server_round: int) -> bool:
            step, z = self.pending, server.z("train").copy()
            kept = judge(server, server_round)
            if step is not None:
                self.rows.append(step_row(server_round, step, z, server.constraint.gaps(server.labels.y_train, z),
                                          kept, server.loss(z)))
            return kept
        return judging


def step_row(server_round: int, step: dict, z: np.ndarray, gaps: np.ndarray, kept: bool, loss: float) -> dict:
    """One judged step: its logit change on the linearised model and the gaps' error on the true one."""
    change = float(np.sqrt(np.mean((step["predicted"] - step["start"]) ** 2)))
    error = gap_error(gaps, step["gaps"])
    return {"round": server_round, "holds gaps": step["holds"], "damping": step["damping"], "kept": kept, "logit change": change,
            "gap error": error, "error / change²": error / change ** 2 if change > 0 else float("nan"), "loss": loss}


def trace(run_config: dict) -> tuple[list[dict], dict]:
    """The steps of one run, and its summary."""
    steps = StepTrace()
    search, judge = NewtonVFL.search, NewtonVFL.judge
    NewtonVFL.search, NewtonVFL.judge = steps.search(search), steps.judge(judge)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            summary, _ = run_inprocess({**run_config, "output-dir": tmp}, quiet=True)
    finally:
        NewtonVFL.search, NewtonVFL.judge = search, judge
    return steps.rows, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="adult-race")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a run-config override, as flwr run's --run-config takes it (repeatable)")
    args = ap.parse_args(argv)
    try:
        overrides = parse_run_config(args.set)
    except RunConfigArgError as e:
        ap.error(str(e))
    run_config = {"dataset": args.dataset, "model": "mlp", "seed": args.seed, "epsilon": 0.01,
                  "optimizer": "newton", **overrides}
    rows, summary = trace(run_config)
    print(" | ".join(COLUMNS))
    for r in rows:
        print(f"{r['round']} | {'yes' if r['holds gaps'] else 'no'} | {r['damping']:.3g} | {'kept' if r['kept'] else 'taken back'} | {r['logit change']:.4f} | "
              f"{r['gap error']:.5f} | {r['error / change²']:.3g} | {r['loss']:.4f}")
    print(f"stop at round {summary['rounds']}, test accuracy {100 * summary['test_acc']:.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
