"""Test metrics the paper reports: accuracy, DFP = |FPR_a − FPR_b|, DFN = |FNR_a − FNR_b|.

With G groups (``s`` holds group codes instead of a boolean), DFP and DFN are the largest
pairwise gap (max − min over the groups), and ``dfp_overall`` / ``dfn_overall`` the largest
gap of a group to the rate over all rows; :func:`group_rates` has every group's rates.
:func:`positive_rate_gaps` is the demographic-parity difference (share predicted +1).
A group without rows of a label value on the evaluated rows has no rate for it and is left
out of that gap (a small group often has none on a test split).

:func:`demographic_parity_difference` and :func:`equalized_odds_difference` are fairlearn's
metrics of the same names (``method="between_groups"``), written in numpy so that every run
reports them without fairlearn installed; they follow fairlearn where a group has no rows of
a label value: its rate counts as 0 there (tests/test_metrics.py checks both against
fairlearn on random data).

:func:`constrained_metrics` measures them over the groups a run constrained (small groups
pooled into one), with the data's own groups' differences beside them (``*_raw``) where
pooling made the two differ: a group of one test row (COMPAS's Asian people) would
otherwise decide the figure a user reads.
"""

from __future__ import annotations

import numpy as np


def predict(z: np.ndarray) -> np.ndarray:
    """Labels in {-1, +1} from summed logits (z = 0 counts as positive)."""
    return np.where(np.asarray(z) >= 0, 1, -1)


def _rate(wrong: np.ndarray, mask: np.ndarray) -> float:
    return float(wrong[mask].mean()) if mask.any() else float("nan")


def error_rates(y: np.ndarray, s: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """FPR and FNR per group (group a: ``s`` true)."""
    y, s, wrong = np.asarray(y), np.asarray(s, dtype=bool), np.asarray(pred) != np.asarray(y)
    neg, pos = y == -1, y == 1
    return {
        "fpr_a": _rate(wrong, neg & s),
        "fpr_b": _rate(wrong, neg & ~s),
        "fnr_a": _rate(wrong, pos & s),
        "fnr_b": _rate(wrong, pos & ~s),
    }


def group_rates(y: np.ndarray, codes: np.ndarray, pred: np.ndarray,
                names: tuple[str, ...] | None = None) -> dict[str, dict[str, float]]:
    """Every group's rows, error rate, FPR and FNR (``codes``: each row's group index)."""
    y, codes, wrong = np.asarray(y), np.asarray(codes), np.asarray(pred) != np.asarray(y)
    count = int(codes.max()) + 1 if len(codes) else 0
    names = names or tuple(str(k) for k in range(count))
    out = {}
    for k, name in enumerate(names):
        g = codes == k
        out[name] = {"rows": int(g.sum()), "error": _rate(wrong, g), "fpr": _rate(wrong, g & (y == -1)),
                     "fnr": _rate(wrong, g & (y == 1))}
    return out


def _spread(values: list[float]) -> float:
    v = [x for x in values if not np.isnan(x)]
    return float(max(v) - min(v)) if len(v) >= 2 else float("nan")


def _to_overall(values: list[float], overall: float) -> float:
    v = [abs(x - overall) for x in values if not np.isnan(x)]
    return float(max(v)) if v else float("nan")


def _share(hit: np.ndarray, rows: np.ndarray) -> float:
    # fairlearn's zero_division: a rate over no rows is 0
    return float(hit[rows].mean()) if rows.any() else 0.0


def positive_rate_gaps(codes: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """Demographic-parity difference of predictions ``pred`` in {-1, +1} (or {0, 1}) over the
    groups present in ``codes``: ``dpd`` the largest pairwise gap in the share predicted +1
    (fairlearn's ``demographic_parity_difference``), ``dpd_overall`` the largest gap of a
    group's share to the share over all rows."""
    codes, positive = np.asarray(codes), np.asarray(pred) == 1
    shares = [_share(positive, codes == k) for k in np.unique(codes)]
    return {"dpd": float(max(shares) - min(shares)), "dpd_overall": _to_overall(shares, float(positive.mean()))}


def demographic_parity_difference(pred: np.ndarray, groups: np.ndarray) -> float:
    """fairlearn's ``demographic_parity_difference``: the largest minus the smallest share of
    rows predicted positive over the groups present in ``groups`` (:func:`positive_rate_gaps`)."""
    return positive_rate_gaps(groups, pred)["dpd"]


def equalized_odds_difference(y: np.ndarray, pred: np.ndarray, groups: np.ndarray) -> float:
    """fairlearn's ``equalized_odds_difference``: the larger of the true-positive-rate and the
    false-positive-rate difference (each the largest minus the smallest over the groups);
    ``y`` and ``pred`` in {-1, +1} or {0, 1}."""
    y, positive, groups = np.asarray(y) == 1, np.asarray(pred) == 1, np.asarray(groups)
    tpr = [_share(positive, (groups == g) & y) for g in np.unique(groups)]
    fpr = [_share(positive, (groups == g) & ~y) for g in np.unique(groups)]
    return float(max(max(tpr) - min(tpr), max(fpr) - min(fpr)))


def fairness_metrics(y: np.ndarray, s: np.ndarray, z: np.ndarray) -> dict[str, float]:
    """ACC, DFP and DFN of the classifier sign(z) on rows (y, s), and fairlearn's demographic
    parity and equalized odds differences (``dp_diff``, ``eo_diff``)."""
    pred = predict(z)
    s = np.asarray(s)
    acc = float((pred == np.asarray(y)).mean())
    fairlearn = {"dp_diff": demographic_parity_difference(pred, s),
                 "eo_diff": equalized_odds_difference(y, pred, s)}
    if s.dtype == bool:
        r = error_rates(y, s, pred)
        return {"acc": acc, "dfp": abs(r["fpr_a"] - r["fpr_b"]), "dfn": abs(r["fnr_a"] - r["fnr_b"]), **fairlearn}
    rates = group_rates(y, s, pred).values()
    everyone = group_rates(np.asarray(y), np.zeros(len(s), dtype=np.int64), pred)["0"]
    fpr, fnr = [r["fpr"] for r in rates], [r["fnr"] for r in rates]
    return {"acc": acc, "dfp": _spread(fpr), "dfn": _spread(fnr),
            "dfp_overall": _to_overall(fpr, everyone["fpr"]), "dfn_overall": _to_overall(fnr, everyone["fnr"]),
            **fairlearn}


#: The differences :func:`constrained_metrics` also gives over the data's own groups, as ``<name>_raw``.
RAW_METRICS = ("dfp", "dfn", "dp_diff", "eo_diff")


def constrained_metrics(y: np.ndarray, s: np.ndarray, z: np.ndarray,
                        constrained: np.ndarray | None = None) -> dict[str, float]:
    """:func:`fairness_metrics` of sign(z) over the groups the run constrained: ``constrained``
    holds each row's constrained group code, None where they are the data's groups ``s``.
    Where they differ (pooling), the data's own groups' differences follow as ``<name>_raw``."""
    if constrained is None:
        return fairness_metrics(y, s, z)
    out = fairness_metrics(y, constrained, z)
    raw = fairness_metrics(y, s, z)
    return {**out, **{f"{k}_raw": raw[k] for k in RAW_METRICS}}


def _weighted_rate(hit: np.ndarray, rows: np.ndarray, weight: np.ndarray) -> float:
    total = float(weight[rows].sum())
    return float(weight[rows] @ hit[rows]) / total if total > 0 else float("nan")


def estimated_metrics(y: np.ndarray, weights: np.ndarray, z: np.ndarray) -> dict[str, float]:
    """:func:`fairness_metrics`' ACC, DFP, DFN and fairlearn's two differences where the groups are
    known only through a noisy release: ``weights`` (n × G) holds each row's membership weight
    in each group (core/constraints/release.py), and a group's rate over a row set is the
    weighted share ``Σ w_i hit_i / Σ w_i``, an estimate of the true group's rate (NaN where the
    estimated count is not positive). Differences are the largest minus the smallest rate."""
    pred = predict(z)
    y, weights = np.asarray(y), np.asarray(weights, dtype=np.float64)
    wrong, positive = (pred != y).astype(np.float64), (pred == 1).astype(np.float64)
    everyone = np.ones(len(y), dtype=bool)

    def spread(hit: np.ndarray, rows: np.ndarray) -> float:
        return _spread([_weighted_rate(hit, rows, weights[:, g]) for g in range(weights.shape[1])])

    tpr, fpr = spread(positive, y == 1), spread(positive, y == -1)
    return {"acc": float((pred == y).mean()), "dfp": fpr, "dfn": spread(wrong, y == 1),
            "dp_diff": spread(positive, everyone), "eo_diff": float(np.nanmax([tpr, fpr]))}


def group_counts(codes: np.ndarray, names: tuple[str, ...]) -> dict[str, int]:
    """Rows of each named group (``codes``: indices into ``names``; a bool column: a, b)."""
    codes = np.asarray(codes)
    if codes.dtype == bool:
        codes = np.where(codes, 0, 1)
    return {str(name): int((codes == k).sum()) for k, name in enumerate(names)}


def summed_metrics(y: np.ndarray, z: np.ndarray, by_group) -> dict[str, float]:
    """:func:`fairness_metrics`' ACC, DFP, DFN and fairlearn's two differences where the groups are
    reached only through sums: ``by_group(V)`` (K × n row vectors) gives each group's sums (K × G;
    a registry's encrypted groups, jobs/encrypted_groups.py). A group's rate over a row set is its
    hits' sum over its rows' count there (none where it has no row there)."""
    pred = predict(z)
    y = np.asarray(y)
    pos, neg, positive = y == 1, y == -1, pred == 1
    wrong = pred != y
    rows = np.stack([pos, neg, np.ones(len(y), dtype=bool)]).astype(np.float64)
    hits = np.stack([positive & pos, positive & neg, wrong & pos, positive]).astype(np.float64)
    sums = by_group(np.concatenate([rows, hits]))
    counts, hit = sums[:3], sums[3:]

    def rates(h: np.ndarray, c: np.ndarray) -> list[float]:
        return [float(a / b) if b > 0.5 else float("nan") for a, b in zip(h, c)]

    tpr, fpr = rates(hit[0], counts[0]), rates(hit[1], counts[1])
    return {"acc": float((pred == y).mean()), "dfp": _spread(fpr), "dfn": _spread(rates(hit[2], counts[0])),
            "dp_diff": _spread(rates(hit[3], counts[2])), "eo_diff": float(np.nanmax([_spread(tpr), _spread(fpr)]))}
