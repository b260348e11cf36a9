"""Equalized odds: the groups' gaps on each label value, the protected label first."""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.constraints.base import ConstraintSet
from fairvfl_flwr.core.constraints.history import HistoryNames


class EqualizedOdds(ConstraintSet):
    r"""Equalized odds: the groups compared on each label value, the protected label y⁺ first.

    With S₊ = {i : y_i = y⁺}, S₋ = {i : y_i = −y⁺} and two groups a, b there are two gaps,

        D_y = (1/|S_y ∩ a|) Σ_{i∈S_y∩a} q_i − (1/|S_y ∩ b|) Σ_{i∈S_y∩b} q_i,   y ∈ {+, −},

    each held within |D_y| <= ε (the first is DEO's). With ``constraint-measure = "rate"``
    (q_i = σ(z_i)) they are smooth true- and false-positive-rate gaps, fairlearn's
    ``EqualizedOdds``. G groups: the pairs, or each group against all of S_y, per label
    value. A label flip moves a row between S₊ and S₋: ``label_subsets = 2``.
    """

    kind = "equalized-odds"
    default_measure = "rate"
    history = HistoryNames("EO gap")
    label_subsets = 2

    @classmethod
    def subsets(cls, y: np.ndarray, protected_label: int) -> list[tuple[str, np.ndarray]]:
        """Two row sets, one per label value: a true-positive and a false-positive rate gap."""
        return [(f"y={protected_label:+d}", y == protected_label), (f"y={-protected_label:+d}", y == -protected_label)]
