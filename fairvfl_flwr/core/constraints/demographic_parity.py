"""Demographic parity: the groups' gap on all rows (the label does not enter)."""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.constraints.base import ConstraintSet
from fairvfl_flwr.core.constraints.history import HistoryNames


class DemographicParity(ConstraintSet):
    r"""Demographic parity: the groups compared on all rows, whatever their label.

    With two groups a, b (A = {i : s_i = a}, B = {i : s_i = b}) there is one gap,

        D = (1/|A|) Σ_{i∈A} q_i − (1/|B|) Σ_{i∈B} q_i,   held within |D| <= ε;

    with ``constraint-measure = "rate"`` (q_i = σ(z_i)) a smooth gap in positive rates,
    fairlearn's ``DemographicParity`` (which compares each group with all rows, here
    ``constraint-form = "overall"``). No subset depends on the label: ``label_subsets = 0``.
    """

    kind = "demographic-parity"
    default_measure = "rate"
    history = HistoryNames("DP gap")
    label_subsets = 0

    @classmethod
    def subsets(cls, y: np.ndarray, protected_label: int) -> list[tuple[str, np.ndarray]]:
        """Every row: demographic parity compares the groups whatever the label."""
        return [("all rows", np.ones(len(y), dtype=bool))]
