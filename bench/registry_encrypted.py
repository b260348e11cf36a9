"""Encrypted groups against the label owner's groups: the same gradient-descent run on the same rows,
its gaps, accuracy and time, where the registry keeps the groups under its CKKS key.

    python bench/registry_encrypted.py                  # adult, compas x deo, DP, EO, 100 rounds, print the table
    python bench/registry_encrypted.py --page           # also writes docs/results/privacy/registry-encrypted.md
    python bench/registry_encrypted.py --datasets compas --constraints deo --rounds 30

One in-process app run per (dataset, constraint) with the label owner's groups (``exact``) and
one with ``groups.holder = "registry"``, ``groups.release = "ckks"`` (the registry, the last of 6
parties, at its node config's defaults: noise 4 on every sum it decrypts), both
``optimizer = "gd"`` (block Newton does not run on encrypted groups yet), ε = 0.01, the stop rule
off (``stop-tolerance = 0``) so that both take the same rounds. Per pair: the largest difference
of any training gap over the history, the final training and test accuracy and fairness
figures of both, and the seconds each took.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, table, write  # noqa: E402
from fairvfl_flwr.app.run import run_inprocess  # noqa: E402

EPSILON = 0.01


def one(dataset: str, constraint: str, rounds: int, encrypted: bool, tmp: str) -> tuple[dict, list[dict], float]:
    rc = {"dataset": dataset, "constraint": constraint, "optimizer": "gd", "epsilon": EPSILON, "hard-epsilon": False,
          "num-server-rounds": rounds, "eval-every": rounds, "stop-tolerance": 0, "output-dir": tmp}
    if encrypted:
        rc.update({"groups.holder": "registry", "groups.release": "ckks"})
    started = time.perf_counter()
    summary, folder = run_inprocess(rc, quiet=True)
    seconds = time.perf_counter() - started
    return summary, json.loads((folder / "history.json").read_text()), seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="adult,compas")
    ap.add_argument("--constraints", default="deo,demographic-parity,equalized-odds")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--page", action="store_true", help="write docs/results/privacy/registry-encrypted.md")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dataset, constraint in itertools.product(args.datasets.split(","), args.constraints.split(",")):
            exact, h_exact, s_exact = one(dataset, constraint, args.rounds, False, tmp)
            enc, h_enc, s_enc = one(dataset, constraint, args.rounds, True, tmp)
            gap_diff = max(abs(a["gaps"][k] - b["gaps"][k]) for a, b in zip(h_exact, h_enc) for k in a["gaps"])
            row = {"dataset": dataset, "constraint": constraint, "rounds": len(h_enc) - 1,
                   "largest gap difference": float(f"{gap_diff:.3g}"),
                   "train gap exact": round(exact["train_max_gap"], 5),
                   "train gap encrypted": round(enc["train_max_gap"], 5),
                   "test acc exact": round(exact["test_acc"], 5), "test acc encrypted": round(enc["test_acc"], 5),
                   "test DFP exact": round(exact["test_dfp"], 4), "test DFP encrypted": round(enc["test_dfp"], 4),
                   "test DFN exact": round(exact["test_dfn"], 4), "test DFN encrypted": round(enc["test_dfn"], 4),
                   "seconds exact": round(s_exact, 1), "seconds encrypted": round(s_enc, 1)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    cols = list(rows[0])
    markdown = table(rows, cols)
    if not args.page:
        print(markdown)
        return 0
    notes = ("`exact`: the label owner holds the groups; `encrypted`: a registry holds them under its own CKKS key "
             "(`groups.release = \"ckks\"`, its node config at the defaults: 256 sums a round, noise 4 on each), the "
             "server computing the gaps, the stop rule's objective and the metrics by group from the registry's sums, "
             "every party's gradient through ν under the registry's key. Both `optimizer = \"gd\"` (block Newton "
             f"does not run on encrypted groups yet), ε = {EPSILON} on the smooth gaps, the stop rule off: the same "
             "rounds. `largest gap difference`: over every round and gap of the history. Seconds: the whole "
             "in-process run (set-up included) on this machine, every party in one process.")
    write(DEFAULT_OUT, "registry-encrypted", {"rows": rows, "rounds": args.rounds, "epsilon": EPSILON}, markdown,
          title="Encrypted groups against the label owner's groups (gradient descent)", notes=notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
