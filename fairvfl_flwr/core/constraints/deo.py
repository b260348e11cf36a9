"""DEO (the paper): the groups' gap on the rows with the protected label (equal opportunity)."""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.constraints.base import ConstraintSet
from fairvfl_flwr.core.constraints.history import HistoryNames


class PaperNames(HistoryNames):
    """The paper's names beside the shared ones: ``gap`` = D (signed), ``deo`` = |D|,
    ``lambda1``/``lambda2`` in the history (the first gap's, with several groups), and
    ``train_deo``, ``lambda`` = [λ1, λ2] in the summary."""

    def columns(self, gaps, lam: np.ndarray) -> dict[str, float]:
        """``deo``, ``gap``, ``lambda1``, ``lambda2`` of the first gap."""
        return {"deo": abs(float(gaps[0])), "gap": float(gaps[0]), "lambda1": float(lam[0]), "lambda2": float(lam[1])}

    def summary(self, row: dict) -> dict:
        """``train_deo`` = |D| and ``lambda`` = [λ1, λ2] of the last row."""
        return {"train_deo": row["deo"], "lambda": [row["lambda1"], row["lambda2"]]} if "deo" in row else {}


class DEO(ConstraintSet):
    r"""Difference of equal opportunity (the paper): the groups compared on the rows with the
    protected label y⁺ (run config ``protected-label``).

    With S = {i : y_i = y⁺} and two groups a, b (N^g = S ∩ {i : s_i = g}) there is one gap,

        D = (1/|N^a|) Σ_{i∈N^a} q_i − (1/|N^b|) Σ_{i∈N^b} q_i,   held within |D| <= ε,

    with q_i the measure's per-row value (the logistic loss, or σ(z_i): then D is a smooth
    true-positive-rate gap for y⁺ = +1). G groups give a gap per pair g < h
    (``constraint-form = "pairwise"``) or per group against all of S (``"overall"``:
    B = S). A label flip moves a row into or out of S: ``label_subsets = 1``.
    """

    kind = "deo"
    label_subsets = 1
    adagrad_by_default = True
    history = PaperNames("DEO")

    @classmethod
    def subsets(cls, y: np.ndarray, protected_label: int) -> list[tuple[str, np.ndarray]]:
        """The rows the gap is measured on: those with the protected label."""
        return [(f"y={protected_label:+d}", y == protected_label)]
