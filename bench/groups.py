"""Several groups: FairVFL (pairwise DEO on the pooled groups) against fairlearn's
ExponentiatedGradient (central, the same groups, equal opportunity on the protected label:
TruePositiveRateParity, each group against the overall rate) and unconstrained VFL.

    python bench/groups.py [--datasets compas-race,adult-sex-race] [--seeds 0,1,2]

Prints one row per method and dataset: mean over seeds of test accuracy, and DFP / DFN as
the largest pairwise gap over the constraint's groups (small groups pooled as the run
pooled them, so a group of one or two test rows does not decide the figure), and the
largest training gap of FairVFL's constraint. Needs the baselines extra (fairlearn).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.core.metrics import fairness_metrics
from fairvfl_flwr.data.problem import constraint_groups, load_data
from fairvfl_flwr.features.scores import SCORES
from fairvfl_flwr.tools.baselines import centralised_reference


def pooled_codes(groups, ds):
    """Each test row's group in the constraint's (pooled) grouping."""
    raw = {name: k for k, name in enumerate(ds.group_names)}
    out = np.empty(len(ds.s_test), dtype=np.int64)
    for k, name in enumerate(groups.groups.names):
        members = name[len("pooled("):-1].split("+") if name.startswith("pooled(") else [name]
        for m in members:
            out[ds.s_test == raw[m]] = k
    return out


def one(dataset: str, seed: int) -> list[dict]:
    base = {"dataset": dataset, "seed": seed, "pool-small-groups": True, "num-parties": 3, "eval-every": 1000,
            "mode": "fairvfl-scores"}
    cfg = RunConfig.from_flower(base)
    ds = load_data(cfg)
    groups = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label, ds.group_names)
    test_groups = pooled_codes(groups, ds)
    rows = []
    for method, extra in (("FairVFL multi-group", {}), ("unconstrained VFL", {"fairness": False})):
        summary, folder = run_inprocess({**base, **extra, "output-dir": tempfile.mkdtemp()}, quiet=True)
        with np.load(Path(folder) / SCORES) as f:
            z = f["z_test"]
        m = fairness_metrics(ds.y_test, test_groups, z)
        rows.append({"method": method, "acc": m["acc"], "dfp": m["dfp"], "dfn": m["dfn"],
                     "train_max_gap": summary.get("train_max_gap"), "rounds": summary.get("rounds")})
    train_groups = groups.groups.codes
    m = centralised_reference(ds.X_train, ds.y_train, train_groups, ds.X_test, ds.y_test, test_groups,
                              ds.protected_label, seed=seed)
    rows.append({"method": "fairlearn EG (central)", "acc": m["acc"], "dfp": m["dfp"], "dfn": m["dfn"],
                 "train_max_gap": None, "rounds": None})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="compas-race,adult-sex-race")
    ap.add_argument("--seeds", default="0,1,2")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    print("| data | method | test ACC | DFP (max pairwise) | DFN (max pairwise) | train max gap | rounds |")
    print("|---|---|---|---|---|---|---|")
    for dataset in a.datasets.split(","):
        runs = [one(dataset, s) for s in seeds]
        for i, method in enumerate(r["method"] for r in runs[0]):
            def mean(key):
                v = [run[i][key] for run in runs if run[i][key] is not None]
                return np.mean(v) if v else None
            gap, rounds = mean("train_max_gap"), mean("rounds")
            print(f"| {dataset} | {method} | {100 * mean('acc'):.2f}% | {mean('dfp'):.3f} | {mean('dfn'):.3f} | "
                  f"{'' if gap is None else f'{gap:.4f}'} | {'' if rounds is None else f'{rounds:.0f}'} |", flush=True)


if __name__ == "__main__":
    main()
