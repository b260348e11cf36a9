"""The stop rule every optimizer shares: when a run's training has converged.

A round is *quiet* when its step barely moved the objective F at the round's λ
(relative decrease ``(F_before − F_after) / (1 + |F_after|)`` at most ``tolerance``) and,
with the fairness term on, λ sits where the dual step would keep it: every gap within
ε (+ :data:`GAP_SLACK`), and a multiplier pair in use only where its gap is at ε
(− :data:`GAP_SLACK`). Training ends after ``window`` quiet rounds in a row. Without the
fairness term λ stays 0 and the gaps are not the run's business, so only F counts.

The rule sees numbers only (F before and after, the gaps, λ): each algorithm measures
them its own way, and the rule's state round-trips through a checkpoint.
"""

from __future__ import annotations

import numpy as np

#: How far a gap may sit above ε in a converged run: the reproduction target
#: (bench/rounds.py) allows ε + 0.005 and the final-quality bar ε + 0.002.
GAP_SLACK = 1e-3


class StopRule:
    """``window`` quiet rounds in a row end training; ``tolerance`` 0 never stops."""

    def __init__(self, tolerance: float, window: int, epsilon: float, fairness: bool) -> None:
        self.tolerance = tolerance
        self.window = window
        self.epsilon = epsilon
        self.fairness = fairness
        self.quiet_rounds = 0  # quiet rounds in a row so far
        self.last_decrease = float("nan")  # the last round's relative decrease of F

    def update(self, f_before: float, f_after: float, gaps: np.ndarray, lam: np.ndarray) -> bool:
        """Feed one round; True once training should end with it."""
        self.last_decrease = (f_before - f_after) / (1.0 + abs(f_after))
        if self.tolerance <= 0:
            return False
        quiet = self.last_decrease <= self.tolerance and (not self.fairness or self.at_rest(gaps, lam))
        self.quiet_rounds = self.quiet_rounds + 1 if quiet else 0
        return self.quiet_rounds >= self.window

    def at_rest(self, gaps: np.ndarray, lam: np.ndarray) -> bool:
        """Every gap within ε, and a multiplier in use only where its gap is at ε."""
        gaps = np.abs(np.asarray(gaps, dtype=np.float64))
        lam = np.asarray(lam, dtype=np.float64)
        in_use = (lam[0::2] - lam[1::2]) != 0
        return bool(np.all(gaps <= self.epsilon + GAP_SLACK)
                    and np.all(~in_use | (gaps >= self.epsilon - GAP_SLACK)))

    def describe(self) -> str:
        """The rule in words, for the log line of a run it ended."""
        fair = f" with every gap within epsilon + {GAP_SLACK:g}" if self.fairness else ""
        return (f"F decreased by less than stop-tolerance={self.tolerance:g} (relative) for "
                f"stop-window={self.window} round(s) in a row{fair}")

    def state_dict(self) -> dict:
        """The count of quiet rounds so far, which a checkpoint keeps: a resumed run stops where the
        uninterrupted one did."""
        return {"quiet-rounds": self.quiet_rounds}

    def load_state_dict(self, state: dict) -> None:
        """Continue the count of quiet rounds from a checkpoint (0 for one that holds none)."""
        self.quiet_rounds = int(state.get("quiet-rounds", 0))
