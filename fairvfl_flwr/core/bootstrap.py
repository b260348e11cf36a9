"""Group metrics of a classifier and their bootstrap intervals, from cell counts.

Every metric here (accuracy, TPR, FPR, FNR, selection rate per group, and the gaps
DFP, DFN, DEO between groups) is a function of the counts of rows in each cell
(group, true label, decision). Resampling n rows with replacement draws those counts
from a multinomial with the observed cell frequencies, so the bootstrap draws the
counts directly (one multinomial per replicate) instead of n row indices: the same
distribution, at a cost independent of n.

DFP = max−min FPR over groups, DFN = max−min FNR (with two groups |a − b|, as in
core/metrics.py), DEO = max(DFP, DFN) (the equalized-odds difference).
"""

from __future__ import annotations

import numpy as np

GAPS = ("acc", "dfp", "dfn", "deo")


def cell_counts(y: np.ndarray, group: np.ndarray, decision: np.ndarray, groups: list) -> np.ndarray:
    """Counts of shape (groups, 2, 2): [group, y = positive, decision = positive]."""
    y = np.asarray(y).astype(bool)
    d = np.asarray(decision).astype(bool)
    gi = np.searchsorted(np.asarray(groups), np.asarray(group))
    code = gi * 4 + y * 2 + d
    return np.bincount(code, minlength=4 * len(groups)).reshape(len(groups), 2, 2).astype(np.float64)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def from_counts(c: np.ndarray) -> dict[str, np.ndarray]:
    """Metrics from counts of shape (..., groups, 2, 2); per-group ones have a groups axis last."""
    tn, fp = c[..., 0, 0], c[..., 0, 1]
    fn, tp = c[..., 1, 0], c[..., 1, 1]
    n = tn + fp + fn + tp
    per = {
        "count": n,
        "accuracy": _ratio(tp + tn, n),
        "tpr": _ratio(tp, tp + fn),
        "fpr": _ratio(fp, fp + tn),
        "fnr": _ratio(fn, tp + fn),
        "selection_rate": _ratio(tp + fp, n),
    }
    with np.errstate(invalid="ignore"):
        dfp = np.nanmax(per["fpr"], axis=-1) - np.nanmin(per["fpr"], axis=-1)
        dfn = np.nanmax(per["fnr"], axis=-1) - np.nanmin(per["fnr"], axis=-1)
    total = c.sum(axis=(-3,))
    overall = {"acc": _ratio(total[..., 0, 0] + total[..., 1, 1], total.sum(axis=(-2, -1))),
               "dfp": dfp, "dfn": dfn, "deo": np.maximum(dfp, dfn)}
    return {**per, **overall}


def bootstrap(counts: np.ndarray, replicates: int = 1000, seed: int = 0, level: float = 0.95) -> dict[str, tuple[float, float]]:
    """Percentile intervals of acc, DFP, DFN and DEO from ``replicates`` resamples of the rows."""
    n = int(counts.sum())
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(n, counts.ravel() / n, size=replicates).reshape(replicates, *counts.shape)
    m = from_counts(draws.astype(np.float64))
    lo, hi = 100 * (1 - level) / 2, 100 * (1 + level) / 2
    return {k: (float(np.nanpercentile(m[k], lo)), float(np.nanpercentile(m[k], hi))) for k in GAPS}
