"""Encrypted groups against the label owner's groups: the same run on the same rows, its rounds, gaps,
accuracy and time, where the registry keeps the groups under its CKKS key.

    python bench/registry_encrypted.py                  # adult, compas x deo, DP, EO, block Newton (auto), print
    python bench/registry_encrypted.py --page           # also writes docs/results/privacy/registry-encrypted-newton.md
    python bench/registry_encrypted.py --repeats 5 --page   # each encrypted run five times (fresh noise each)
    python bench/registry_encrypted.py --datasets compas --constraints deo --rounds 30
    python bench/registry_encrypted.py --optimizer gd --rounds 150 --page   # docs/results/privacy/registry-encrypted.md
    python bench/registry_encrypted.py --datasets compas --converged --rounds 30 --repeats 5 --page   # ...-converged.md
    python bench/registry_encrypted.py --datasets compas --constraints equalized-odds --sum-noise 0   # print only
    python bench/registry_encrypted.py --datasets compas --constraints equalized-odds --stop-tolerance 5e-7

One in-process app run per (dataset, constraint) with the label owner's groups (``exact``) and
one with ``groups.holder = "registry"``, ``groups.release = "ckks"`` (the registry, the last of 6
parties, at its node config's defaults: 256 sums a round, noise 4 on every sum it decrypts), both
with ``--optimizer`` at ε = 0.01 on the smooth gaps (``hard-epsilon = false``). Gradient descent
runs with the stop rule off (``stop-tolerance = 0``), so that both take ``--rounds`` rounds; block
Newton (``auto`` takes it) with the stop rule on and ``--rounds`` as the cap, so that the rounds
each takes are compared. The exact run is seeded and runs once; the registry's noise is fresh OS
entropy, so the encrypted run repeats ``--repeats`` times. Per pair: the rounds, the largest difference of any training gap over
the history's common rounds and at the end, the final training and test accuracy and fairness
figures of both, the most sums the registry decrypted in one round, and the seconds each took;
and, row by row on the test set, the rows the two final models predict apart and how near the
exact run's decision boundary those rows lie (on COMPAS one row is 0.21 points of accuracy).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, table, write  # noqa: E402
from fairvfl_flwr.app.client import app as client_app  # noqa: E402
from fairvfl_flwr.app.run import run_inprocess  # noqa: E402
from fairvfl_flwr.config import RunConfig  # noqa: E402
from fairvfl_flwr.core.metrics import predict  # noqa: E402
from fairvfl_flwr.features.final_logits import load_scores  # noqa: E402
from fairvfl_flwr.flower.inprocess import InProcessGrid, partition_configs  # noqa: E402
from fairvfl_flwr.jobs.encrypted_groups import GROUPS_SUM  # noqa: E402

EPSILON = 0.01
OPTIMIZERS = ("auto", "newton", "gd")


def one(dataset: str, constraint: str, optimizer: str, rounds: int, encrypted: bool,
        tmp: str, converged: bool = False, stop_tolerance: float | None = None,
        sum_noise: float | None = None) -> tuple[dict, list[dict], float, int, np.ndarray]:
    """(summary, history, seconds, the most sums the registry decrypted in one round (0 without it),
    the final test logits).
    ``converged``: the stop rule off, ``rounds`` rounds whatever the optimizer; ``stop_tolerance``:
    the run config's in place of its default; ``sum_noise``: the registry's node config's."""
    rc = {"dataset": dataset, "constraint": constraint, "optimizer": optimizer, "epsilon": EPSILON,
          "hard-epsilon": False, "num-server-rounds": rounds, "eval-every": rounds, "output-dir": tmp,
          "mode": "fairvfl-scores"}  # the final scores in the run folder, for the row-by-row comparison
    if stop_tolerance is not None:
        rc["stop-tolerance"] = stop_tolerance
    if optimizer == "gd" or converged:
        rc["stop-tolerance"] = 0
    if encrypted:
        rc.update({"groups.holder": "registry", "groups.release": "ckks"})
    settings = RunConfig.from_flower(rc)
    sums: dict[int, int] = {}

    def count(message) -> None:
        if message.metadata.message_type == GROUPS_SUM:
            r = int(message.content.config_records["sum"]["round"])
            sums[r] = sums.get(r, 0) + 2 * len(message.content.array_records["masked"])

    nodes = partition_configs(settings.num_parties)
    if encrypted and sum_noise is not None:
        nodes[-1]["sum-noise"] = sum_noise  # the registry is the last party
    grid = InProcessGrid(client_app, settings.to_flower(), settings.num_parties, tap=count, node_configs=nodes)
    started = time.perf_counter()
    summary, folder = run_inprocess(settings.to_flower(), quiet=True, grid=grid)
    seconds = time.perf_counter() - started
    return (summary, json.loads((folder / "history.json").read_text()), seconds, max(sums.values(), default=0),
            load_scores(folder)[1])


def paired(dataset: str, constraint: str, exact: dict, h_exact: list[dict], s_exact: float, z_exact: np.ndarray,
           runs: list[tuple[dict, list[dict], float, int, np.ndarray]]) -> dict:
    """One row: the exact run against the encrypted runs (the registry's noise is fresh each run, so
    repeats differ): each encrypted figure the median of the runs, the rounds each took, the largest
    differences over the runs, and how many runs are within the bars (rounds at most 2 more, test
    accuracy within 0.1 points, every final gap within 0.002). Row by row on the test set: the most
    rows any encrypted run predicts apart from the exact run, the largest |z| the exact run gave
    one of them (how near its boundary a row must lie to be predicted apart), and the largest
    difference of any test logit."""
    def end_diff(h):
        return max(abs(h_exact[-1]["gaps"][k] - h[-1]["gaps"][k]) for k in h_exact[-1]["gaps"])

    def median(values):
        return float(np.median(values))

    runs, logits = [run[:4] for run in runs], [run[4] for run in runs]
    apart = [np.flatnonzero(predict(z) != predict(z_exact)) for z in logits]
    far = [float(np.max(np.abs(z_exact[rows]))) for rows in apart if len(rows)]
    rounds = [len(h) - 1 for _, h, _, _ in runs]
    acc = [enc["test_acc"] for enc, _, _, _ in runs]
    ends = [end_diff(h) for _, h, _, _ in runs]
    within = sum(r <= len(h_exact) + 1 and abs(a - exact["test_acc"]) <= 0.001 + 1e-12 and e <= 0.002
                 for r, a, e in zip(rounds, acc, ends))
    gap_diff = max(abs(a["gaps"][k] - b["gaps"][k]) for _, h, _, _ in runs for a, b in zip(h_exact, h)
                   for k in a["gaps"])
    return {"dataset": dataset, "constraint": constraint,
            "rounds exact": len(h_exact) - 1, "rounds encrypted": " ".join(map(str, sorted(rounds))),
            "largest gap difference": float(f"{gap_diff:.3g}"),
            "gap difference at the end": float(f"{max(ends):.3g}"),
            "train gap exact": round(exact["train_max_gap"], 5),
            "train gap encrypted": round(median([enc["train_max_gap"] for enc, _, _, _ in runs]), 5),
            "test acc exact": round(exact["test_acc"], 5), "test acc encrypted": round(median(acc), 5),
            "largest test acc difference (points)": round(100 * max(abs(a - exact["test_acc"]) for a in acc), 3),
            "test rows": len(z_exact),
            "most test rows apart": max(len(rows) for rows in apart),
            "their farthest exact logit from 0": float(f"{max(far, default=0.0):.3g}"),
            "largest test logit difference": float(f"{max(float(np.max(np.abs(z - z_exact))) for z in logits):.3g}"),
            "test DFP exact": round(exact["test_dfp"], 4),
            "test DFP encrypted": round(median([enc["test_dfp"] for enc, _, _, _ in runs]), 4),
            "test DFN exact": round(exact["test_dfn"], 4),
            "test DFN encrypted": round(median([enc["test_dfn"] for enc, _, _, _ in runs]), 4),
            "runs within the bars": f"{within}/{len(runs)}",
            "most sums a round": max(most for _, _, _, most in runs),
            "seconds exact": round(s_exact, 1),
            "seconds encrypted": round(median([sec for _, _, sec, _ in runs]), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="adult,compas")
    ap.add_argument("--constraints", default="deo,demographic-parity,equalized-odds")
    ap.add_argument("--optimizer", default="auto", choices=OPTIMIZERS,
                    help="the optimizer of both runs (auto: block Newton for these runs)")
    ap.add_argument("--rounds", type=int, default=100, help="gd: the rounds of both runs; newton: the cap")
    ap.add_argument("--repeats", type=int, default=1,
                    help="encrypted runs per pair (the registry's noise is fresh each run); one exact run")
    ap.add_argument("--converged", action="store_true",
                    help="block Newton with the stop rule off: both runs take --rounds rounds, so that the final "
                    "models are compared at convergence rather than where the stop rule ends each")
    ap.add_argument("--stop-tolerance", type=float, default=None,
                    help="both runs' stop-tolerance in place of the default (where the stop rule ends them)")
    ap.add_argument("--sum-noise", type=float, default=None,
                    help="the registry's sum-noise in place of its node config's default")
    ap.add_argument("--page", action="store_true", help="write docs/results/privacy/registry-encrypted-newton.md "
                    "(registry-encrypted.md with --optimizer gd, registry-encrypted-newton-converged.md with "
                    "--converged)")
    args = ap.parse_args(argv)
    if args.page and (args.stop_tolerance is not None or args.sum_noise is not None):
        ap.error("--stop-tolerance and --sum-noise print their figures; the pages hold the defaults' runs")
    if args.converged and args.optimizer == "gd":
        ap.error("--converged compares block Newton runs; gradient descent runs with the stop rule off already")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dataset, constraint in itertools.product(args.datasets.split(","), args.constraints.split(",")):
            how = {"converged": args.converged, "stop_tolerance": args.stop_tolerance, "sum_noise": args.sum_noise}
            exact, h_exact, s_exact, _, z_exact = one(dataset, constraint, args.optimizer, args.rounds, False, tmp,
                                                      **how)
            runs = [one(dataset, constraint, args.optimizer, args.rounds, True, tmp, **how)
                    for _ in range(args.repeats)]
            row = paired(dataset, constraint, exact, h_exact, s_exact, z_exact, runs)
            print(json.dumps(row), flush=True)
            rows.append(row)
    cols = list(rows[0])
    markdown = table(rows, cols)
    if not args.page:
        print(markdown)
        return 0
    newton = args.optimizer != "gd"
    how = (f"Both `optimizer = \"{args.optimizer}\"` (block Newton: the server's search takes the gaps from a "
           "per-round Taylor model in its step lengths, summed by the registry, and checks its step against the "
           "true gaps; docs/newton.md, \"On a registry's encrypted groups\"), "
           + (f"the stop rule off: both runs take {args.rounds} rounds, and the final models are compared at "
              "convergence. " if args.converged else f"the stop rule on, {args.rounds} rounds the cap: ")
           + "`largest gap difference` is over the rounds both ran (their trajectories may part), `gap difference "
           "at the end` between the two final models."
           if newton else
           "Both `optimizer = \"gd\"`, the stop rule off: the same rounds. `largest gap difference`: over every "
           "round and gap of the history.")
    notes = ("`exact`: the label owner holds the groups; `encrypted`: a registry holds them under its own CKKS key "
             "(`groups.release = \"ckks\"`, its node config at the defaults: 256 sums a round, noise 4 on each), the "
             "server computing the gaps, the stop rule's objective and the metrics by group from the registry's sums, "
             f"every party's gradient through ν under the registry's key. {how} ε = {EPSILON} on the smooth gaps. "
             f"The exact run is seeded and ran once; the registry's noise is fresh each run, so the encrypted run ran "
             f"{args.repeats} time(s): `rounds encrypted` lists each run's rounds, every other encrypted figure is "
             "their median, the differences are the largest over the runs, and `runs within the bars` counts the "
             "runs with at most 2 rounds more, test accuracy within 0.1 points and every final gap within 0.002. "
             "Row by row on the test set (`test rows` of them, one row 100/that points of accuracy): `most test rows "
             "apart`, the most rows one encrypted run predicts otherwise than the exact run; `their farthest exact "
             "logit from 0`, the farthest of those rows from the exact run's decision boundary; `largest test logit "
             "difference`, over every row and run. "
             "`most sums a round`: the most the registry decrypted for one round of an encrypted run. Seconds: the "
             "whole in-process run (set-up included) on this machine, every party in one process.")
    name = ("registry-encrypted-newton-converged" if args.converged else
            "registry-encrypted-newton" if newton else "registry-encrypted")
    title = ("Encrypted groups against the label owner's groups (block Newton, run to convergence)"
             if args.converged else "Encrypted groups against the label owner's groups (block Newton)" if newton
             else "Encrypted groups against the label owner's groups (gradient descent)")
    write(DEFAULT_OUT, name, {"rows": rows, "rounds": args.rounds, "epsilon": EPSILON, "optimizer": args.optimizer,
                              "repeats": args.repeats},
          markdown, title=title, notes=notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
