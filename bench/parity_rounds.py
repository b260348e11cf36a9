"""Parity constraints under block Newton: rounds until the largest training gap is within
ε + 0.002, and the hard test metrics fairlearn reports, one in-process app run per line.

    python bench/parity_rounds.py                      # the rows of docs/newton.md, "Rates"
    python bench/parity_rounds.py --runs '[{"dataset": "compas", "constraint": "demographic-parity"}]'

Each run is the ServerApp and ClientApp over the in-process grid (app/run.run_inprocess)
with ``optimizer = "newton"``, at most 30 rounds and test metrics every 5, unless the run
config given says otherwise. Prints one JSON object per run: the optimizer used, the
rounds run (the stop rule may end a run sooner), the first round from which every gap
stays within ε + 0.002, the last training max gap, and the test accuracy, DFP, DFN and
fairlearn's demographic parity and equalized odds differences.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rounds import rounds_to_gaps  # noqa: E402

BASE = {"optimizer": "newton", "num-server-rounds": 30, "eval-every": 5}
RUNS = [
    *({"dataset": "compas", "constraint": "demographic-parity", "epsilon": 0.02, "seed": s} for s in (0, 1, 2)),
    {"dataset": "compas", "constraint": "equalized-odds"},
    {"dataset": "crime", "constraint": "demographic-parity"},
    {"dataset": "crime", "constraint": "equalized-odds"},
    {"dataset": "adult", "constraint": "demographic-parity"},
    {"dataset": "adult", "constraint": "equalized-odds"},
    {"dataset": "compas-race", "constraint": "equalized-odds", "epsilon": 0.02, "pool-small-groups": True,
     "num-parties": 3},
]


def run(overrides: dict) -> dict:
    from fairvfl_flwr.app.run import run_inprocess
    from fairvfl_flwr.config import RunConfig

    rc = {**BASE, **overrides}
    cfg = RunConfig.from_flower(rc)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summary, folder = run_inprocess({**rc, "output-dir": tmp}, quiet=True)
        history = json.loads((Path(folder) / "history.json").read_text())
    return {"run": overrides, "optimizer": cfg.optimizer_in_use, "measure": cfg.measure, "rounds": summary["rounds"],
            "within_from": rounds_to_gaps(history, cfg.epsilon), "train_max_gap": round(summary["train_max_gap"], 4),
            "test_acc": round(100 * summary["test_acc"], 2),
            **{k: round(summary[f"test_{k}"], 3) for k in ("dfp", "dfn", "dp_diff", "eo_diff")},
            "seconds": round(time.perf_counter() - t, 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=None, help="a JSON list of run configs (default: the docs' rows)")
    args = p.parse_args(argv)
    for overrides in json.loads(args.runs) if args.runs else RUNS:
        print(json.dumps(run(overrides)), flush=True)


if __name__ == "__main__":
    main()
