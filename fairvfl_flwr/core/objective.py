"""What the server records of the FairVFL objective each round: the training loss and every gap.

The math of docs/algorithm.md is elsewhere: the constraint object (core/constraints) computes
the gaps and the masked weights ν, core/step.py the gradient steps and core/newton.py Newton's.
This module is the round's record of the objective (:class:`TrainStats`), in their notation.

Notation: ``z`` summed logits, ``y`` labels in {-1, +1}, ``o_i = dl/dz_i``. The constraint
(run-config ``constraint``, ``constraint-measure``, ``constraint-form``) is an object of
core/constraints: its gaps ``D_c = mean q over A_c − mean q over B_c``, each kept within
``|D_c| <= ε`` by two multipliers ``(λ_c+, λ_c−)``, multiplier vector
``[λ_1+, λ_1−, λ_2+, λ_2−, ...]`` (for two groups and ``deo``, the paper's ``[λ1, λ2]``).
The general masked weight is

    ν_i = o_i / n + m_i g_i,  m_i = Σ_c (λ_c+ − λ_c−) ([i ∈ A_c]/|A_c| − [i ∈ B_c]/|B_c|),

with ``g_i = dq_i/dz_i``: ``o_i`` for ``loss`` (so ν_i = w_i o_i, w_i = 1/n + m_i) and
``σ(z_i)(1 − σ(z_i))`` for ``rate`` (``ConstraintSet.masked_weights``, ``signed_weights``,
``gaps``; the dual step is core/step.server_step's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairvfl_flwr.core.constraints import ConstraintSet
from fairvfl_flwr.core.constraints.measures import logistic_loss

__all__ = ["TrainStats", "train_stats"]


@dataclass(frozen=True)
class TrainStats:
    """What the server records about θ on the training rows each round."""

    loss: float  # data term of L(θ) (regulariser added by the caller)
    gaps: tuple[float, ...]  # D_c(θ) of every gap, in the run's measure

    @property
    def max_gap(self) -> float:
        """max_c |D_c(θ)|: the constraint set holds when this is <= ε."""
        return max(abs(g) for g in self.gaps)


def train_stats(y: np.ndarray, z: np.ndarray, constraint: ConstraintSet) -> TrainStats:
    """The training loss and every gap at scores ``z``, from one pass of the logistic loss."""
    losses = logistic_loss(y, z)
    gaps = constraint.gaps(y, z, losses=losses)  # one loss pass
    return TrainStats(loss=float(losses.mean()), gaps=tuple(float(g) for g in gaps))
