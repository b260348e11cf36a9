"""Fairness report for a predictions file once the outcomes arrive.

    python -m fairvfl_flwr.tools.report outputs/<score run>/predictions.csv \\
        --outcomes outcomes.csv --groups groups.csv

The scoring job (docs/scoring.md) writes ``predictions.csv`` (id, probability, decision)
without labels or groups. Whoever later learns the outcomes (and may hold the group
attribute) joins them by id and gets, per group, accuracy, TPR, FPR, selection rate and
counts (fairlearn's ``MetricFrame``), the gaps DFP = |FPR_a − FPR_b|, DFN = |FNR_a − FNR_b|
and DEO = max(DFP, DFN) (the equalized-odds difference; with more groups, the largest
pairwise gap, and ``dfp_overall`` / ``dfn_overall`` the largest gap to the overall rate) with bootstrap intervals
(core/bootstrap.py), and one PNG. Defaults read the server label file that
``fairvfl-export`` writes (``row_id``, ``y`` = 1 / -1, ``group``), so
``--outcomes server_labels.csv --groups server_labels.csv`` works as is.

Where the training run pooled small groups into one (``pool-small-groups``), the gaps are
over the groups it constrained, the pooled one named by its members joined with " + ", and
the data's own groups' gaps and counts follow under ``raw``, labelled: a group of one scored
row would otherwise decide the figure. The pooling is the training run's (its
``summary.json``, found through the scoring run's ``score.model-from``, or ``--run``).

Writes ``report.json``, ``report-groups.csv`` and ``report.png`` next to the predictions
(or in ``--out``). Needs the ``baselines`` extra (fairlearn).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from fairvfl_flwr.core.bootstrap import bootstrap, cell_counts, from_counts
from fairvfl_flwr.data.tables import read_csv
from fairvfl_flwr.data.tables import DataError, norm_value
from fairvfl_flwr.tools.baselines import EXTRAS_HINT

PER_GROUP = ("count", "accuracy", "tpr", "fpr", "selection_rate")


def _column(df, column: str, what: str, path: str):
    if column not in df.columns:
        raise DataError(f"{what} file {path}: column {column!r} not found (columns: {list(map(str, df.columns[:10]))})")
    return df[column]


def load_joined(predictions: str, outcomes: str, groups: str, id_column: str, outcome_column: str,
                positive: str, group_column: str):
    """Predictions joined by id with the outcomes and groups: (ids, y (bool), decision (bool), group (str), notes)."""
    import pandas as pd

    pred = read_csv(predictions, "predictions")
    for c in ("id", "decision"):
        _column(pred, c, "predictions", predictions)
    out = read_csv(outcomes, "outcomes")
    grp = out if groups == outcomes else read_csv(groups, "groups")
    o = pd.DataFrame({"id": _column(out, id_column, "outcomes", outcomes).astype(str),
                      "outcome": _column(out, outcome_column, "outcomes", outcomes)})
    g = pd.DataFrame({"id": _column(grp, id_column, "groups", groups).astype(str),
                      "group": _column(grp, group_column, "groups", groups).astype(str)})
    for frame, what, path in ((o, "outcomes", outcomes), (g, "groups", groups)):
        if frame["id"].duplicated().any():
            raise DataError(f"{what} file {path}: duplicate ids in {id_column!r}, e.g. "
                            f"{frame['id'][frame['id'].duplicated()].iloc[:3].tolist()}")
    p = pd.DataFrame({"id": pred["id"].astype(str), "decision": pred["decision"]})
    joined = p.merge(o, on="id", how="inner").merge(g, on="id", how="inner")
    if joined.empty:
        raise DataError(f"no id of {predictions} is in both {outcomes} ({id_column!r}) and {groups}")
    if joined["outcome"].isna().any():
        raise DataError(f"outcomes file {outcomes}: column {outcome_column!r} has missing values for scored ids")
    y = joined["outcome"].map(lambda v: norm_value(str(v))).to_numpy() == norm_value(positive)
    if not y.any() or y.all():
        raise DataError(f"outcomes file {outcomes}: column {outcome_column!r} never / always equals --positive "
                        f"{positive!r} on the {len(joined)} scored rows; give the positive outcome value")
    decision = joined["decision"].to_numpy()
    if not np.isin(decision, (0, 1)).all():
        raise DataError(f"predictions file {predictions}: column 'decision' must hold 0 or 1")
    notes = []
    if len(joined) < len(p):
        notes.append(f"{len(p) - len(joined)} of {len(p)} predictions have no outcome or group yet: left out")
    return joined["id"].to_numpy(), y, decision.astype(bool), joined["group"].to_numpy(), notes


def metric_frame(y: np.ndarray, decision: np.ndarray, group: np.ndarray):
    """fairlearn's MetricFrame of the per-group metrics."""
    try:
        from fairlearn.metrics import MetricFrame, count, false_positive_rate, selection_rate, true_positive_rate
        from sklearn.metrics import accuracy_score
    except ImportError:
        raise SystemExit(f"fairvfl-report: {EXTRAS_HINT}") from None
    return MetricFrame(
        metrics={"count": count, "accuracy": accuracy_score, "tpr": true_positive_rate, "fpr": false_positive_rate,
                 "selection_rate": selection_rate},
        y_true=y.astype(int), y_pred=decision.astype(int), sensitive_features=group,
    )


def pooled_groups(predictions: str, run: str | None = None) -> dict[str, str]:
    """Each data group the training run pooled, with the group it was pooled into (empty: none).
    The training run is ``run``, or the model the scoring run next to ``predictions`` scored
    with (its config.json's ``score.model-from``)."""
    if run is None:
        config = Path(predictions).resolve().parent / "config.json"
        if not config.exists():
            return {}
        run = json.loads(config.read_text()).get("score.model-from") or None
        if run is None:
            return {}
    summary = Path(run).expanduser() / "summary.json"
    if not summary.exists():
        raise DataError(f"training run {run}: no summary.json, so the groups it constrained are unknown")
    raw = json.loads(summary.read_text()).get("raw_groups") or {}
    return {name: c["pooled_into"] for name, c in raw.items() if c.get("pooled_into")}


def report(y: np.ndarray, decision: np.ndarray, group: np.ndarray, replicates: int = 1000, seed: int = 0,
           level: float = 0.95, pooled: dict[str, str] | None = None) -> dict:
    """Per-group metrics (MetricFrame), gaps and their bootstrap intervals; with ``pooled``
    (data group → the group the run pooled it into), over the run's constrained groups, and
    the data's own groups' under ``raw``."""
    if pooled:
        group = np.asarray(group)
        out = report(y, decision, np.array([pooled.get(str(g), str(g)) for g in group]), replicates, seed, level)
        raw = _gaps(y, decision, group)
        out["raw"] = {"what": "the data's own groups, before the training run pooled "
                              f"{', '.join(sorted(pooled))}: not constrained one by one", **raw}
        return out
    return _gaps(y, decision, group, replicates, seed, level)


def _gaps(y: np.ndarray, decision: np.ndarray, group: np.ndarray, replicates: int = 0, seed: int = 0,
          level: float = 0.95) -> dict:
    mf = metric_frame(y, decision, group)
    names = [str(g) for g in mf.by_group.index]
    if len(names) < 2:
        raise DataError(f"the scored rows hold one group only ({names}); a fairness report needs two or more")
    diff = mf.difference(method="between_groups")
    dfp, dfn = float(diff["fpr"]), float(diff["tpr"])  # |FNR_a − FNR_b| = |TPR_a − TPR_b|
    to_overall = mf.difference(method="to_overall")
    counts = cell_counts(y, group, decision, sorted(names))
    check = from_counts(counts)  # the bootstrap's metrics must be MetricFrame's on the observed rows
    # a group without rows of a label has no rate there: cell counts leave it out, MetricFrame counts 0
    defined = all(((group == g) & y).any() and ((group == g) & ~y).any() for g in np.unique(group))
    if defined and not (np.isclose(check["dfp"], dfp) and np.isclose(check["dfn"], dfn)):
        raise RuntimeError(f"internal: gaps from cell counts ({check['dfp']}, {check['dfn']}) differ from "
                           f"MetricFrame's ({dfp}, {dfn})")
    return {
        "rows": int(len(y)),
        "overall": {"accuracy": float(mf.overall["accuracy"]), "tpr": float(mf.overall["tpr"]),
                    "fpr": float(mf.overall["fpr"]), "selection_rate": float(mf.overall["selection_rate"])},
        "groups": {g: {k: (int(v) if k == "count" else float(v)) for k, v in row.items()}
                   for g, row in zip(names, mf.by_group.to_dict("records"))},
        # deo is fairlearn's equalized_odds_difference; dp_diff its demographic_parity_difference
        "gaps": {"dfp": dfp, "dfn": dfn, "deo": max(dfp, dfn), "dp_diff": float(diff["selection_rate"]),
                 "dfp_overall": float(to_overall["fpr"]), "dfn_overall": float(to_overall["tpr"])},
        "intervals": bootstrap(counts, replicates, seed, level) if replicates > 0 else {},
        "bootstrap": {"replicates": replicates, "seed": seed, "level": level},
    }


def plot(rep: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(rep["groups"])
    keys = ("accuracy", "tpr", "fpr", "selection_rate")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / len(groups)
    for i, g in enumerate(groups):
        ax1.bar(np.arange(len(keys)) + i * width, [rep["groups"][g][k] for k in keys], width,
                label=f"{g} (n={rep['groups'][g]['count']})")
    ax1.set_xticks(np.arange(len(keys)) + width * (len(groups) - 1) / 2)
    ax1.set_xticklabels(["accuracy", "TPR", "FPR", "selection rate"])
    ax1.set_ylim(0, 1)
    ax1.set_title("per group")
    ax1.legend()
    gaps = ("dfp", "dfn", "deo")
    vals = [rep["gaps"][k] for k in gaps]
    iv = rep["intervals"]
    err = None
    if iv:
        err = np.array([[v - iv[k][0] for k, v in zip(gaps, vals)], [iv[k][1] - v for k, v in zip(gaps, vals)]])
    ax2.bar(["DFP", "DFN", "DEO"], vals, yerr=err, capsize=6, color=["C2", "C3", "C4"])
    ax2.set_ylim(bottom=0)
    lvl = rep["bootstrap"]["level"]
    ax2.set_title(f"gaps between groups ({100 * lvl:.0f}% bootstrap intervals)" if iv else "gaps between groups")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_report(rep: dict, notes: list[str]) -> str:
    lines = [f"{rep['rows']} scored rows with an outcome and a group"]
    lines += [f"  note: {n}" for n in notes]
    lines.append(f"  {'group':<16}{'count':>8}{'accuracy':>10}{'TPR':>8}{'FPR':>8}{'selected':>10}")
    for g, m in rep["groups"].items():
        lines.append(f"  {g:<16}{m['count']:>8}{m['accuracy']:>10.4f}{m['tpr']:>8.4f}{m['fpr']:>8.4f}"
                     f"{m['selection_rate']:>10.4f}")
    o = rep["overall"]
    lines.append(f"  {'all':<16}{rep['rows']:>8}{o['accuracy']:>10.4f}{o['tpr']:>8.4f}{o['fpr']:>8.4f}"
                 f"{o['selection_rate']:>10.4f}")
    for k in ("dfp", "dfn", "deo"):
        iv = rep["intervals"].get(k)
        lines.append(f"  {k.upper()} {rep['gaps'][k]:.4f}" + (f"  [{iv[0]:.4f}, {iv[1]:.4f}]" if iv else ""))
    lines.append(f"  DP diff {rep['gaps']['dp_diff']:.4f}, EO diff {rep['gaps']['deo']:.4f} (fairlearn's)")
    if len(rep["groups"]) > 2:
        lines.append(f"  largest gap to the overall rate: DFP {rep['gaps']['dfp_overall']:.4f}, "
                     f"DFN {rep['gaps']['dfn_overall']:.4f}")
    raw = rep.get("raw")
    if raw:
        lines.append(f"  raw groups ({raw['what']}): DP diff {raw['gaps']['dp_diff']:.4f}, EO diff "
                     f"{raw['gaps']['deo']:.4f}, DFP {raw['gaps']['dfp']:.4f}, DFN {raw['gaps']['dfn']:.4f}; counts "
                     + ", ".join(f"{g} {m['count']}" for g, m in raw["groups"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fairvfl-report", description=__doc__.split("\n\n")[0])
    ap.add_argument("predictions", help="predictions.csv written by the scoring job (mode = 'score')")
    ap.add_argument("--outcomes", required=True, help="CSV with the id and outcome columns")
    ap.add_argument("--groups", help="CSV with the id and group columns (default: the outcomes file)")
    ap.add_argument("--id-column", default="row_id", help="id column of the outcomes/groups files (row_id)")
    ap.add_argument("--outcome-column", default="y", help="outcome column (y)")
    ap.add_argument("--positive", default="1", help="the outcome value the decision 1 predicts (1)")
    ap.add_argument("--group-column", default="group", help="group column (group)")
    ap.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the intervals (0: none)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resamples")
    ap.add_argument("--run", help="the training run folder whose pooled groups the gaps are over (default: the "
                    "scoring run's score.model-from, read from the config.json next to the predictions)")
    ap.add_argument("--out", help="folder for report.json/report-groups.csv/report.png (default: the predictions')")
    a = ap.parse_args(argv)
    try:
        _, y, decision, group, notes = load_joined(a.predictions, a.outcomes, a.groups or a.outcomes, a.id_column,
                                                   a.outcome_column, a.positive, a.group_column)
        rep = report(y, decision, group, a.bootstrap, a.seed, pooled=pooled_groups(a.predictions, a.run))
    except DataError as exc:
        print(f"fairvfl-report: {exc}", file=sys.stderr)
        return 2
    out = Path(a.out or Path(a.predictions).resolve().parent)
    out.mkdir(parents=True, exist_ok=True)
    rep["predictions"] = str(Path(a.predictions).resolve())
    rep["notes"] = notes
    (out / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    with open(out / "report-groups.csv", "w") as fh:
        fh.write("group," + ",".join(PER_GROUP) + "\n")
        fh.writelines(f"{g}," + ",".join(str(m[k]) for k in PER_GROUP) + "\n" for g, m in rep["groups"].items())
    plot(rep, out / "report.png", f"{Path(a.predictions).name}: {rep['rows']} rows")
    print(format_report(rep, notes))
    print(f"  wrote {out / 'report.json'}, {out / 'report-groups.csv'}, {out / 'report.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
