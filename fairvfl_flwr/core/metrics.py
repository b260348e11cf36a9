"""Test metrics the paper reports: accuracy, DFP = |FPR_a − FPR_b|, DFN = |FNR_a − FNR_b|."""

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


def fairness_metrics(y: np.ndarray, s: np.ndarray, z: np.ndarray) -> dict[str, float]:
    """ACC, DFP and DFN of the classifier sign(z) on rows (y, s)."""
    pred = predict(z)
    r = error_rates(y, s, pred)
    return {
        "acc": float((pred == np.asarray(y)).mean()),
        "dfp": abs(r["fpr_a"] - r["fpr_b"]),
        "dfn": abs(r["fnr_a"] - r["fnr_b"]),
    }
