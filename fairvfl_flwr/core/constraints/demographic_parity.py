"""Demographic parity: the groups' gap on all rows (the label does not enter)."""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.constraints.base import ConstraintSet


class DemographicParity(ConstraintSet):
    kind = "demographic-parity"
    default_measure = "rate"
    gap_label = "DP gap"
    label_subsets = 0

    @classmethod
    def subsets(cls, y: np.ndarray, protected_label: int) -> list[tuple[str, np.ndarray]]:
        return [("all rows", np.ones(len(y), dtype=bool))]
