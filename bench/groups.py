"""Accuracy against the hard-rate test gap: FairVFL over a grid of ε, fairlearn's
ExponentiatedGradient over a grid of bounds, and ThresholdOptimizer, compared on their curves.

Each row is a dataset and a constraint (:data:`ROWS`): Adult with demographic parity, Crime
with equalized odds, COMPAS race with equalized odds (six races, the small ones pooled), and
an own CSV with four groups (Adult's table with a column ``age_band``, sex × age band, written
to a temporary folder and run as ``dataset = "csv"``, as a user's own table is). On each seed's
split, with the groups the run constrains (small groups pooled on the whole table, so every
method is scored on the same groups):

* FairVFL over ``--epsilons`` and with ``fairness = false`` (the curve's unconstrained end),
  through the in-process engine, with the defaults a user gets (``constraint-measure =
  "auto"``: rates for both kinds; ``sensitive-as-input = false``; ``optimizer = "auto"``),
  3 parties and at most ``--rounds`` rounds;
* fairlearn's ExponentiatedGradient (LogisticRegression on the same columns, the sensitive
  attribute not among them) with the constraint's moment at each difference bound of
  ``--bounds``, and the plain LogisticRegression as its unconstrained end;
* fairlearn's ThresholdOptimizer on that LogisticRegression: one point, and it reads each
  test row's group at prediction time, which the other two do not.

Every method's test accuracy is paired with its hard-rate test gap, fairlearn's
``demographic_parity_difference`` or ``equalized_odds_difference`` (core/metrics.py) on the
constraint's groups. The curves are then read at common gaps (tools/tradeoff.py): linear
interpolation between a method's non-dominated points, nothing below its smallest gap.

``--quick`` is a smoke run (two ε, two bounds). ``--set KEY=VALUE`` (flwr run's
--run-config syntax) overrides a run-config key of every FairVFL run. The page is published
after every finished row, so an interrupted run leaves the rows it finished. A run of some
rows keeps the page's other rows (:func:`kept_rows`) when they were run with the same
settings, and each row's section names the command and commit it came from.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, REPO, write  # noqa: E402
from fairvfl_flwr.app.run import run_inprocess  # noqa: E402
from fairvfl_flwr.config import RunConfig  # noqa: E402
from fairvfl_flwr.core.metrics import predict  # noqa: E402
from fairvfl_flwr.data.problem import constraint_groups, load_data, whole_table  # noqa: E402
from fairvfl_flwr.data.tables import packaged_file, read_csv  # noqa: E402
from fairvfl_flwr.features.final_logits import SCORES  # noqa: E402
from fairvfl_flwr.tools.baselines import (  # noqa: E402
    eg_predict, group_metrics, plain_predict, regroup, threshold_predict)
from fairvfl_flwr.tools.cli import RunConfigArgError, parse_run_config  # noqa: E402
from fairvfl_flwr.tools.results import commit, include, this_command  # noqa: E402
from fairvfl_flwr.tools.tradeoff import accuracy_at_gap, frontier, matched_gaps  # noqa: E402

FAIRVFL, EG, THRESHOLD = "FairVFL", "fairlearn EG", "ThresholdOptimizer (group at prediction time)"
METHODS = (FAIRVFL, EG, THRESHOLD)
#: which hard-rate test gap a constraint is read by: fairlearn's metric of the same meaning
GAP = {"demographic-parity": "dp_diff", "equalized-odds": "eo_diff"}
GAP_NAME = {"dp_diff": "demographic_parity_difference", "eo_diff": "equalized_odds_difference"}
OWN_CSV = "adult-sex-age.csv"
ROWS = {
    "adult-dp": {"dataset": "adult", "constraint": "demographic-parity"},
    "crime-eo": {"dataset": "crime", "constraint": "equalized-odds"},
    "compas-race-eo": {"dataset": "compas-race", "constraint": "equalized-odds", "pool-small-groups": True},
    "own-csv-eo": {"dataset": "csv", "constraint": "equalized-odds", "csv.label": "income",
                   "csv.positive": ">50K", "csv.sensitive": "sex,age_band", "csv.id-column": "row_id"},
}
TITLES = {"adult-dp": "Adult, demographic parity (sex)",
          "crime-eo": "Crime, equalized odds (black share > 0.06)",
          "compas-race-eo": "COMPAS race, equalized odds (six races; race not an input)",
          "own-csv-eo": "Own CSV, equalized odds (Adult's table, four groups: sex × age band)"}
BASE = {"num-parties": 3, "eval-every": 1000, "mode": "fairvfl-scores"}
EPSILONS, BOUNDS = (0.005, 0.01, 0.02, 0.05, 0.1), (0.005, 0.01, 0.02, 0.05, 0.1)
QUICK = (0.01, 0.05)
#: the payload keys a kept row must share with the run that adds rows to its page
SETTINGS = ("rounds", "epsilons", "bounds", "seeds", "overrides")


def own_csv(folder: Path) -> Path:
    """Adult's packaged table with a column ``age_band`` ("<40" or "40+"): with
    ``csv.sensitive = "sex,age_band"`` its four groups are sex × age band. ``age`` stays a
    feature (only the declared sensitive columns and their one-hot copies are left out)."""
    path = Path(folder) / OWN_CSV
    if not path.exists():
        df = read_csv(packaged_file("adult.csv.gz"))
        df = df.copy()  # one block: the packaged table arrives column by column
        df["age_band"] = np.where(df["age"].astype(float) < 40, "<40", "40+")
        df.to_csv(path, index=False)
    return path


def run_config(row: str, seed: int, rounds: int, overrides: dict, csv_folder: Path) -> dict:
    """The FairVFL run config of a row and seed (before ε)."""
    cfg = {**BASE, **ROWS[row], "seed": seed, "num-server-rounds": rounds, **overrides}
    if cfg["dataset"] == "csv":
        cfg["csv.path"] = str(own_csv(csv_folder))
    return cfg


def points(row: str, seed: int, epsilons, bounds, rounds: int, overrides: dict, csv_folder: Path) -> tuple[list, dict]:
    """Every method's test points (accuracy, hard-rate gaps) on one row and seed, and the groups."""
    base = run_config(row, seed, rounds, overrides, csv_folder)
    cfg = RunConfig.from_flower(base)
    constraint = cfg.constraint
    ds = load_data(cfg)
    groups = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label, ds.group_names,
                               whole_table(ds.y_train, ds.s_train, ds.y_test, ds.s_test)).groups
    test_codes = regroup(ds.s_train, groups.codes, ds.s_test)
    info = {"groups": list(groups.names),
            "test_rows": {n: int((test_codes == k).sum()) for k, n in enumerate(groups.names)}}
    out = []

    def add(method, setting, pred, seconds, **extra):
        m = group_metrics(ds.y_test, test_codes, pred)
        out.append({"row": row, "seed": seed, "method": method, "setting": setting, "acc": m["acc"],
                    "gap": m[GAP[constraint]], "dp_diff": m["dp_diff"], "eo_diff": m["eo_diff"],
                    "seconds": seconds, **extra})

    for eps in (*epsilons, None):
        run = {**base, "epsilon": eps} if eps is not None else {**base, "fairness": False}
        t = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            summary, run_dir = run_inprocess({**run, "output-dir": folder}, quiet=True)
            with np.load(Path(run_dir) / SCORES) as f:
                z, z_train = f["z_test"], f["z_train"]
        train = group_metrics(ds.y_train, groups.codes, predict(z_train))
        add(FAIRVFL, "off" if eps is None else f"ε={eps:g}", predict(z), time.perf_counter() - t, epsilon=eps,
            rounds=summary["rounds"], train_max_gap=summary["train_max_gap"], train_gap=train[GAP[constraint]],
            optimizer=RunConfig.from_flower(run).optimizer_in_use, measure=summary.get("constraint_measure"))
    for bound in (*bounds, None):
        t = time.perf_counter()
        if bound is None:
            pred = plain_predict(ds.X_train, ds.y_train, ds.X_test)
        else:
            pred = eg_predict(ds.X_train, ds.y_train, groups.codes, ds.X_test, ds.protected_label, constraint,
                              seed=seed, bound=bound)
        add(EG, "off (plain LR)" if bound is None else f"bound={bound:g}", pred, time.perf_counter() - t, bound=bound)
    t = time.perf_counter()
    pred = threshold_predict(ds.X_train, ds.y_train, groups.codes, ds.X_test, test_codes, ds.protected_label,
                             constraint, seed=seed)
    add(THRESHOLD, "thresholds per group", pred, time.perf_counter() - t)
    print(f"  {row} seed {seed}: " + "; ".join(f"{p['method']} {p['setting']} acc {p['acc']:.4f} gap {p['gap']:.3f}"
                                               for p in out), flush=True)
    return out, info


def kept_rows(previous: Path, rows: list[str], settings: dict) -> tuple[list[dict], dict]:
    """The points and group info of the rows on the page ``previous`` (a results json) that
    this run does not rerun, each info with the command and commit it came from; nothing when
    there is no such page or its settings differ from ``settings`` (their curves would not
    be comparable on one page)."""
    if not previous.exists():
        return [], {}
    old = json.loads(previous.read_text())
    differ = [k for k in SETTINGS if old.get(k) != settings[k]]
    if differ:
        print(f"[groups] not keeping the rows of {previous}: its {', '.join(differ)} differ from this run's", flush=True)
        return [], {}
    info = {row: {"command": old.get("command", ""), "commit": old.get("commit", ""), **i}
            for row, i in old.get("groups", {}).items() if row not in rows}
    return [p for p in old.get("points", []) if p["row"] in info], info


def summarise(rows: list[dict]) -> list[dict]:
    """One point per (row, method, setting): accuracy and gap averaged over the seeds (min, max)."""
    out = []
    for key in dict.fromkeys((r["row"], r["method"], r["setting"]) for r in rows):
        mine = [r for r in rows if (r["row"], r["method"], r["setting"]) == key]
        agg = {"row": key[0], "method": key[1], "setting": key[2], "seeds": [r["seed"] for r in mine]}
        for m in ("acc", "gap", "dp_diff", "eo_diff", "rounds", "train_max_gap", "train_gap"):
            v = np.array([np.nan if r.get(m) is None else r[m] for r in mine], dtype=float)
            have = v[~np.isnan(v)]
            agg[m] = float(have.mean()) if len(have) else None
            agg[f"{m}_min"], agg[f"{m}_max"] = (float(have.min()), float(have.max())) if len(have) else (None, None)
        agg["optimizer"] = ",".join(sorted({r["optimizer"] for r in mine if r.get("optimizer")})) or None
        agg["epsilon"] = mine[0].get("epsilon")
        out.append(agg)
    return out


def curve(summary: list[dict], row: str, method: str) -> list[tuple[float, float]]:
    """A method's (gap, accuracy) points on a row, means over the seeds."""
    return [(p["gap"], p["acc"]) for p in summary if p["row"] == row and p["method"] == method]


def matched(summary: list[dict]) -> list[dict]:
    """Per row, the gaps of FairVFL's and EG's frontier points (tools/tradeoff.matched_gaps) and
    every method's accuracy there, with FairVFL − EG where both have one."""
    out = []
    for row in dict.fromkeys(p["row"] for p in summary):
        curves = {m: curve(summary, row, m) for m in METHODS}
        for g in matched_gaps([curves[FAIRVFL], curves[EG]]):
            acc = {m: accuracy_at_gap(curves[m], g) for m in METHODS}
            diff = None if acc[FAIRVFL] is None or acc[EG] is None else acc[FAIRVFL] - acc[EG]
            out.append({"row": row, "gap": g, "acc": acc, "fairvfl_minus_eg": diff})
    return out


def _pct(v) -> str:
    return "—" if v is None else f"{100 * v:.2f}%"


def _num(v, spec=".3f") -> str:
    return "" if v is None else format(v, spec)


def matched_table(at: list[dict]) -> str:
    """The accuracy of every method at the common gaps, one line per row and gap."""
    lines = [f"| row | gap ≤ | {FAIRVFL} | {EG} | {THRESHOLD} | FairVFL − EG |", "|---|---|---|---|---|---|"]
    for a in at:
        diff = "" if a["fairvfl_minus_eg"] is None else f"{100 * a['fairvfl_minus_eg']:+.2f} pt"
        lines.append(f"| {a['row']} | {a['gap']:.3f} | {_pct(a['acc'][FAIRVFL])} | {_pct(a['acc'][EG])} | "
                     f"{_pct(a['acc'][THRESHOLD])} | {diff} |")
    return "\n".join(lines)


def markdown(summary: list[dict], at: list[dict], info: dict, plot: str | None) -> str:
    """The page: the matched-gap table, then every row's points."""
    parts = ["## Accuracy at matched gaps", "",
             "Each method's test accuracy read off its curve at a common hard-rate test gap (a mean over the "
             "seeds; how: see the notes). \"—\": the method never got a gap that small.", "",
             matched_table(at), ""]
    if plot:
        parts += [f"![test accuracy against the hard-rate test gap]({plot})", ""]
    for row in dict.fromkeys(p["row"] for p in summary):
        constraint = ROWS[row]["constraint"]
        groups = info[row]
        parts += [f"### {row}: {TITLES[row]}", "",
                  f"Gap: `{GAP_NAME[GAP[constraint]]}` on the test rows over the constraint's groups "
                  f"{', '.join(groups['groups'])} (test rows, seed {groups['seed']}: "
                  + ", ".join(f"{n} {c}" for n, c in groups["test_rows"].items()) + ")."
                  + (f" From `{groups['command']}` at commit {groups['commit'] or '?'}." if "command" in groups else ""),
                  "",
                  "| method | setting | test ACC (min–max over seeds) | test gap (min–max) | DP diff | EO diff | "
                  "FairVFL: optimizer, rounds, train max gap (soft) / train gap (hard) | on the frontier |",
                  "|---|---|---|---|---|---|---|---|"]
        for m in METHODS:
            mine = [p for p in summary if p["row"] == row and p["method"] == m]
            front = set(frontier(curve(summary, row, m)))
            for p in mine:
                run = "" if m != FAIRVFL else (f"{p['optimizer']}, {_num(p['rounds'], '.0f')}, "
                                               f"{_num(p['train_max_gap'], '.4f')} / {_num(p['train_gap'])}")
                parts.append(
                    f"| {m} | {p['setting']} | {100 * p['acc']:.2f}% ({100 * p['acc_min']:.2f}–{100 * p['acc_max']:.2f}) | "
                    f"{p['gap']:.3f} ({p['gap_min']:.3f}–{p['gap_max']:.3f}) | {_num(p['dp_diff'])} | "
                    f"{_num(p['eo_diff'])} | {run} | {'yes' if (p['gap'], p['acc']) in front else ''} |")
        parts.append("")
    return "\n".join(parts)


NOTES = """\
**Methods.** FairVFL: the in-process engine, linear parties, 3 parties, the constraint of the
row at each ε with every other setting its default (`constraint-measure = "auto"`, i.e. soft
rates for equalized odds and demographic parity; `sensitive-as-input = false`; `optimizer =
"auto"`; `constraint-form = "pairwise"`), at most the page's round cap (`--rounds`; the stop
rule may end a run sooner); "off" is `fairness = false`. Its "train max gap (soft)" is the
largest constrained gap on the training rows in the run's own measure (soft rates, pairwise),
which ε bounds: a value above ε + 0.002 is a run that had not reached ε within the cap; its
"train gap (hard)" is the page's hard-rate gap on the training rows. fairlearn EG:
`ExponentiatedGradient(LogisticRegression(max_iter=1000), max_iter=50)` with the constraint's
moment (`DemographicParity`, `EqualizedOdds`) at `difference_bound` = the bound (each group
against the overall rate, on training rows), randomised predictions with the seed; "off" is
the plain LogisticRegression. Both see the same columns: the sensitive attribute and its
one-hot copies are not inputs. ThresholdOptimizer: fairlearn's post-processing of that
LogisticRegression (`predict_proba`), one randomised threshold per group: it needs each test
row's group when it predicts, so it is not a model of the same inputs; shown for reference.

**Groups.** Every method is trained and scored on the groups FairVFL's run constrains (COMPAS
race: Asian, Native American and Other pooled into one group, decided on the whole table's
counts, `pool-small-groups = true`; the others have no small group). The own CSV is Adult's
packaged table with `age_band = "<40" | "40+"` from `age`, run as `dataset = "csv"`,
`csv.sensitive = "sex,age_band"` (four groups; `age` stays a feature).

**Matched gaps.** The gap on the x-axis is the hard-rate test gap (fairlearn's
`demographic_parity_difference` or `equalized_odds_difference`, the largest difference over
the groups). Per method, the points are the seed means of each setting; only non-dominated
points count (no other point has a smaller or equal gap and a higher accuracy), and between
two of them the accuracy is interpolated linearly in the gap: predicting with one of the two
at random attains that accuracy with a gap no larger. Above a method's largest frontier gap
its accuracy stays that point's; below its smallest it has none ("—"). The common gaps are
the gaps of FairVFL's and EG's frontier points (shown to 3 decimals): each method's own points
against the other's curve at the same gap; a gap one method reaches and the other does not
shows as "—". FairVFL − EG is in percentage points."""


def plot_curves(summary: list[dict], rows: list[str], path: Path) -> bool:
    """Test accuracy against the hard-rate test gap, one panel per row; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.8), squeeze=False)
    style = {FAIRVFL: ("C0", "o"), EG: ("C1", "s"), THRESHOLD: ("C2", "*")}
    for ax, row in zip(axes[0], rows):
        for m in METHODS:
            pts = sorted(curve(summary, row, m))
            if not pts:
                continue
            color, marker = style[m]
            front = frontier(pts)
            ax.plot(*zip(*front), color=color, lw=1.2)
            ax.scatter(*zip(*pts), color=color, marker=marker, s=60 if marker == "*" else 22,
                       label=m.replace(" (group at prediction time)", "\n(group at prediction)"))
        gap = GAP_NAME[GAP[ROWS[row]["constraint"]]]
        ax.set_title(row, fontsize=10)
        ax.set_xlabel(f"test {gap}")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> None:
    """Run the rows and publish the page (and the plot) after each."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
    ap.add_argument("--seeds", default="0", help="comma list of seeds")
    ap.add_argument("--epsilons", default=",".join(map(str, EPSILONS)), help="FairVFL's ε grid")
    ap.add_argument("--bounds", default=",".join(map(str, BOUNDS)), help="fairlearn EG's difference bounds")
    ap.add_argument("--rounds", type=int, default=30, help="FairVFL's round cap (num-server-rounds)")
    ap.add_argument("--quick", action="store_true", help=f"a smoke run: ε and bounds {QUICK} only")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="run-config override of every FairVFL run, flwr run's --run-config syntax (repeatable)")
    ap.add_argument("--name", default="groups", help="results page name")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    rows = a.rows.split(",")
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        ap.error(f"--rows {','.join(unknown)}: choose from {', '.join(ROWS)}")
    try:
        overrides = parse_run_config(a.set)
        seeds = [int(s) for s in a.seeds.split(",")]
        epsilons = QUICK if a.quick else tuple(float(e) for e in a.epsilons.split(","))
        bounds = QUICK if a.quick else tuple(float(b) for b in a.bounds.split(","))
    except (RunConfigArgError, ValueError) as exc:
        ap.error(str(exc))
    clash = sorted(set(overrides) & {"dataset", "seed", "constraint", "fairness", "epsilon", "num-server-rounds"})
    if clash:
        ap.error(f"--set {clash[0]}=...: the bench sets {clash[0]} itself")
    settings = {"rounds": a.rounds, "epsilons": list(epsilons), "bounds": list(bounds), "seeds": seeds,
                "overrides": overrides}
    results, info = kept_rows(Path(a.out) / f"{a.name}.json", rows, settings)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as csv_folder:
        for i, row in enumerate(rows):
            for seed in seeds:
                pts, groups = points(row, seed, epsilons, bounds, a.rounds, overrides, Path(csv_folder))
                results += pts
                info.setdefault(row, {"command": this_command(), "commit": commit(), **groups, "seed": seed})
            summary = summarise(results)
            at = matched(summary)
            done = list(info)  # the kept rows in their order, then this run's
            plot = f"{a.name}.png" if plot_curves(summary, done, Path(a.out) / f"{a.name}.png") else None
            missing = rows[i + 1:]
            notes = NOTES + ("" if plot else "\n\nNo plot: matplotlib is not installed.")
            notes += "" if not missing else "\n\nNot yet run: " + ", ".join(missing) + "."
            write(a.out, a.name, {**settings, "groups": info, "matched": at,
                                  "summary": summary, "points": results},
                  markdown(summary, at, info, plot),
                  title="Accuracy against the hard-rate test gap: FairVFL, fairlearn EG and ThresholdOptimizer",
                  notes=notes)
            if Path(a.out).resolve() == Path(DEFAULT_OUT).resolve():  # the reference page shows the same table
                include(REPO / "docs" / "fairness-constraints.md", a.name, matched_table(at))


if __name__ == "__main__":
    main()
