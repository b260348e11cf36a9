"""DEO (the paper): the groups' gap on the rows with the protected label (equal opportunity)."""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.constraints.base import ConstraintSet


class DEO(ConstraintSet):
    kind = "deo"
    label_subsets = 1
    newton_by_default = True
    newton_past_bound = True
    gap_label = "DEO"

    def own_columns(self, gaps, lam: np.ndarray) -> dict[str, float]:
        """The paper's names: ``gap`` = D (signed), ``deo`` = |D|, ``lambda1``/``lambda2`` (the
        first gap's, with several groups)."""
        return {"deo": abs(float(gaps[0])), "gap": float(gaps[0]), "lambda1": float(lam[0]), "lambda2": float(lam[1])}

    @classmethod
    def subsets(cls, y: np.ndarray, protected_label: int) -> list[tuple[str, np.ndarray]]:
        return [(f"y={protected_label:+d}", y == protected_label)]
