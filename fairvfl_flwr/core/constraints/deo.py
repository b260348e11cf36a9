"""DEO (the paper): the groups' gap on the rows with the protected label (equal opportunity)."""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.constraints.base import ConstraintSet


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
    newton_past_bound = True
    gap_label = "DEO"

    def own_columns(self, gaps, lam: np.ndarray) -> dict[str, float]:
        """The paper's names: ``gap`` = D (signed), ``deo`` = |D|, ``lambda1``/``lambda2`` (the
        first gap's, with several groups)."""
        return {"deo": abs(float(gaps[0])), "gap": float(gaps[0]), "lambda1": float(lam[0]), "lambda2": float(lam[1])}

    @classmethod
    def subsets(cls, y: np.ndarray, protected_label: int) -> list[tuple[str, np.ndarray]]:
        """The rows the gap is measured on: those with the protected label."""
        return [(f"y={protected_label:+d}", y == protected_label)]
