"""Equalized odds: the groups' gaps on each label value, the protected label first."""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.constraints.base import ConstraintSet


class EqualizedOdds(ConstraintSet):
    kind = "equalized-odds"
    default_measure = "rate"
    gap_label = "EO gap"
    label_subsets = 2

    @classmethod
    def subsets(cls, y: np.ndarray, protected_label: int) -> list[tuple[str, np.ndarray]]:
        return [(f"y={protected_label:+d}", y == protected_label), (f"y={-protected_label:+d}", y == -protected_label)]
