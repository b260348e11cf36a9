"""What a kind calls its gaps in the history, the log and a run's summary.

Every kind's history row has the same columns (``max_gap``, ``gaps`` by name, ``lambdas``:
flower/server.py writes them); a kind may add columns of its own and take them into the
summary (the paper's DEO: ``deo``, ``gap``, ``lambda1``, ``lambda2``), and names its largest
gap in the log. A kind declares these with a :class:`HistoryNames` (its ``history``), so
nothing outside the kind's module asks which kind a run has.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HistoryNames:
    """A kind's names for its gaps: the log's label of the largest one, and the history
    columns and summary entries only this kind has (none by default)."""

    #: the log's name of the largest gap max_c |D_c| (the quantity ε bounds)
    gap_label: str = "max gap"

    def columns(self, gaps, lam: np.ndarray) -> dict[str, float]:
        """History columns only this kind has, from the gaps D_c and the multipliers."""
        return {}

    def summary(self, row: dict) -> dict:
        """What a run's summary takes from its last history row under this kind only."""
        return {}
