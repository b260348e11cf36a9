"""FairVFL against fairlearn's ExponentiatedGradient and unconstrained VFL, per constraint kind,
on two-group and several-group data.

For each (dataset, constraint, seed) three rows on the same split and the same groups (the
constraint's groups: small groups pooled as the run pooled them, so a group of one or two
test rows does not decide the figure):

* FairVFL with that ``constraint`` and the run's defaults otherwise (``optimizer='auto'``:
  the optimizer ``resolve_optimizer`` picks is recorded, with the rounds the run took);
* unconstrained VFL (``fairness = false``, same settings);
* fairlearn's ExponentiatedGradient (central logistic regression on all columns) with the
  matching moment (tools/baselines.EG_MOMENTS): deo -> TruePositiveRateParity on the
  protected label, equalized-odds -> EqualizedOdds, demographic-parity -> DemographicParity.
  fairlearn's moments compare each group with the overall rate; FairVFL's default
  ``constraint-form`` compares every pair.

Columns: test accuracy; DFP / DFN and the demographic-parity difference (share predicted
+1), each as the largest pairwise gap over the groups and as the largest gap to the rate
over all rows; FairVFL's largest training gap (its own constraint's gaps, loss measure by
default) and rounds. Means over seeds; the JSON has every seed. Needs the baselines extra.
The full command:

    python bench/groups.py --constraints equalized-odds,demographic-parity \\
        --datasets crime,compas,adult,compas-race,adult-sex-race --seeds 0,1,2 --jobs 1

``--set KEY=VALUE`` (flwr run's --run-config syntax, repeatable) overrides a run-config key
of both VFL runs, e.g. ``--set num-server-rounds=5`` for a smoke run; the page is
published after every finished (dataset, constraint) block, so an interrupted run leaves
the blocks it finished (the page says which are missing).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, write  # noqa: E402
from fairvfl_flwr.app.run import run_inprocess  # noqa: E402
from fairvfl_flwr.config import RunConfig  # noqa: E402
from fairvfl_flwr.core.metrics import predict  # noqa: E402
from fairvfl_flwr.data.problem import constraint_groups, load_data, whole_table  # noqa: E402
from fairvfl_flwr.features.final_logits import SCORES  # noqa: E402
from fairvfl_flwr.tools.baselines import EG_MOMENTS, eg_predict, group_metrics, regroup  # noqa: E402
from fairvfl_flwr.tools.cli import RunConfigArgError, parse_run_config  # noqa: E402

BASE = {"pool-small-groups": True, "num-parties": 3, "eval-every": 1000, "mode": "fairvfl-scores"}
FAIRVFL, UNCONSTRAINED, EG = "FairVFL", "unconstrained VFL", "fairlearn EG (central)"
METRICS = ("acc", "dfp", "dfn", "dfp_overall", "dfn_overall", "dpd", "dpd_overall")


def one(task: tuple[str, str, int], overrides: dict) -> list[dict]:
    """The three rows of one (dataset, constraint, seed)."""
    dataset, constraint, seed = task
    base = {**BASE, "dataset": dataset, "seed": seed, "constraint": constraint, **overrides}
    cfg = RunConfig.from_flower(base)
    ds = load_data(cfg)
    groups = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label, ds.group_names,
                               whole_table(ds.y_train, ds.s_train, ds.y_test, ds.s_test)).groups
    test_codes = regroup(ds.s_train, groups.codes, ds.s_test)
    key = {"dataset": dataset, "constraint": constraint, "seed": seed, "groups": list(groups.names)}
    rows = []
    for method, extra in ((FAIRVFL, {}), (UNCONSTRAINED, {"fairness": False})):
        run_cfg = {**base, **extra}
        t = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            summary, folder = run_inprocess({**run_cfg, "output-dir": out}, quiet=True)
            with np.load(Path(folder) / SCORES) as f:
                z = f["z_test"]
        rows.append({**key, "method": method, **group_metrics(ds.y_test, test_codes, predict(z)),
                     "optimizer": RunConfig.from_flower(run_cfg).optimizer_in_use, "rounds": summary["rounds"],
                     "train_max_gap": summary["train_max_gap"], "seconds": time.perf_counter() - t})
    t = time.perf_counter()
    pred = eg_predict(ds.X_train, ds.y_train, groups.codes, ds.X_test, ds.protected_label, constraint, seed=seed)
    rows.append({**key, "method": EG, **group_metrics(ds.y_test, test_codes, pred), "moment": EG_MOMENTS[constraint],
                 "optimizer": None, "rounds": None, "train_max_gap": None, "seconds": time.perf_counter() - t})
    print(f"  {dataset} {constraint} seed {seed}: " + ", ".join(
        f"{r['method']} acc {r['acc']:.4f}" for r in rows), flush=True)
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """One row per (dataset, constraint, method): the mean over seeds, with min and max."""
    out = []
    for k in dict.fromkeys((r["dataset"], r["constraint"], r["method"]) for r in rows):
        mine = [r for r in rows if (r["dataset"], r["constraint"], r["method"]) == k]
        agg = {"dataset": k[0], "constraint": k[1], "method": k[2], "seeds": [r["seed"] for r in mine],
               "optimizer": ",".join(sorted({r["optimizer"] for r in mine if r["optimizer"]})) or None}
        for m in (*METRICS, "rounds", "train_max_gap"):
            v = np.array([np.nan if r[m] is None else r[m] for r in mine], dtype=float)
            have = v[~np.isnan(v)]
            agg[m] = float(have.mean()) if len(have) else None
            agg[f"{m}_min"], agg[f"{m}_max"] = (float(have.min()), float(have.max())) if len(have) else (None, None)
        out.append(agg)
    return out


def markdown(summary: list[dict], constraints: list[str]) -> str:
    def f(v, spec=".3f"):
        return "" if v is None else format(v, spec)

    parts = []
    for constraint in constraints:
        mine = [r for r in summary if r["constraint"] == constraint]
        if not mine:
            continue
        parts += [f"### constraint = {constraint} (fairlearn moment: {EG_MOMENTS[constraint]})", "",
                  "| data | method | optimizer | rounds | test ACC (min–max) | DFP / DFN, max pairwise | "
                  "DFP / DFN, max to overall | DP difference, max pairwise / to overall | train max gap |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in mine:
            parts.append(
                f"| {r['dataset']} | {r['method']} | {r['optimizer'] or ''} | {f(r['rounds'], '.0f')} | "
                f"{100 * r['acc']:.2f}% ({100 * r['acc_min']:.2f}–{100 * r['acc_max']:.2f}) | "
                f"{f(r['dfp'])} / {f(r['dfn'])} | {f(r['dfp_overall'])} / {f(r['dfn_overall'])} | "
                f"{f(r['dpd'])} / {f(r['dpd_overall'])} | {f(r['train_max_gap'], '.4f')} |")
        parts.append("")
    return "\n".join(parts)


NOTES = """\
Every row uses the constraint's groups on the test rows (small groups pooled into one as the
run pooled them, `pool-small-groups = true`); linear parties, 3 parties, ε = 0.01, every
other FairVFL setting its default. DFP / DFN: false-positive / false-negative rate; DP
difference: share of rows predicted +1. "max pairwise": largest gap between two groups
(with two groups, the gap); "to overall": largest gap of a group to the rate over all test
rows. FairVFL's train max gap is its own constraint's largest training gap (mean logistic
loss by default, `constraint-measure`), which it bounds by ε; the test columns are hard
rates, which it does not constrain directly: demographic parity on the loss equalises the
groups' mean logistic loss over all rows, not their share predicted +1, and where the
unconstrained loss gap is already within ε the FairVFL row is the unconstrained one
(`constraint-measure = "rate"` constrains mean σ(z) instead). fairlearn EG: ExponentiatedGradient
(LogisticRegression(max_iter=1000), max_iter=50) with the moment named in the heading,
each group against the overall rate, labels recoded so that the protected label is its
positive class; randomised predictions with the seed."""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--constraints", default="equalized-odds,demographic-parity",
                    help=f"comma list of run-config constraint values ({', '.join(EG_MOMENTS)})")
    ap.add_argument("--datasets", default="crime,compas,adult,compas-race,adult-sex-race")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=1, help="(dataset, constraint, seed) tasks at a time, one process each")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="run-config override of both VFL runs, flwr run's --run-config syntax (repeatable)")
    ap.add_argument("--name", default="groups-eo-dp", help="results page name")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    constraints, datasets = a.constraints.split(","), a.datasets.split(",")
    unknown = [c for c in constraints if c not in EG_MOMENTS]
    if unknown:
        ap.error(f"--constraints {','.join(unknown)}: choose from {', '.join(EG_MOMENTS)}")
    try:
        overrides = parse_run_config(a.set)
    except RunConfigArgError as exc:
        ap.error(str(exc))
    clash = sorted(set(overrides) & {"dataset", "seed", "constraint", "fairness"})
    if clash:
        ap.error(f"--set {clash[0]}=...: the bench sets {clash[0]} itself")
    seeds = [int(s) for s in a.seeds.split(",")]
    blocks = [(d, c) for d in datasets for c in constraints]
    tasks = [(d, c, s) for d, c in blocks for s in seeds]
    run = functools.partial(one, overrides=overrides)
    rows: list[dict] = []
    pool = multiprocessing.get_context("spawn").Pool(a.jobs) if a.jobs > 1 else None
    try:
        results = pool.imap(run, tasks) if pool else map(run, tasks)
        for i, task_rows in enumerate(results):
            rows += task_rows
            if (i + 1) % len(seeds) == 0:  # a (dataset, constraint) block is complete: publish what is done
                done = blocks[:(i + 1) // len(seeds)]
                missing = [f"{d} / {c}" for d, c in blocks if (d, c) not in done]
                summary = summarise(rows)
                notes = NOTES + ("" if not missing else "\n\nNot yet run: " + "; ".join(missing) + ".")
                write(a.out, a.name, {"overrides": overrides, "seeds": seeds, "summary": summary, "rows": rows},
                      markdown(summary, constraints),
                      title="Constraint kinds and several groups: FairVFL, fairlearn EG, unconstrained VFL",
                      notes=notes)
    finally:
        if pool:
            pool.close()


if __name__ == "__main__":
    main()
