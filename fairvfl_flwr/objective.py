"""The FairVFL objective in numpy: loss, DEO gap, dual step and the masked weights ν.

One place for the math of SPEC.md, used by the server (strategy) and by the active
party (local steps), so both compute ν the same way.

Notation: ``z`` summed logits, ``y`` labels in {-1, +1}, ``o_i = dl/dz_i``,
``N^a`` / ``N^b`` rows of group a / b with the protected label,
``D = mean loss over N^a - mean loss over N^b``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def logistic_loss(y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Per-row ``log(1 + exp(-y z))``, computed without overflow."""
    return np.logaddexp(0.0, -y * z)


def loss_derivative(y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Per-row ``o_i = dl/dz_i = -y_i * sigmoid(-y_i z_i)``."""
    # sigmoid(m) = (1 + tanh(m/2)) / 2 stays finite for any m
    return -y * 0.5 * (1.0 + np.tanh(-0.5 * y * z))


@dataclass(frozen=True)
class Groups:
    """Row masks of N^a and N^b and the sizes the weights need."""

    in_a: np.ndarray  # bool, row in N^a
    in_b: np.ndarray  # bool, row in N^b
    n: int

    @classmethod
    def from_labels(cls, y: np.ndarray, s: np.ndarray, protected_label: int) -> "Groups":
        prot = np.asarray(y) == protected_label
        s = np.asarray(s, dtype=bool)
        g = cls(in_a=prot & s, in_b=prot & ~s, n=len(y))
        if g.size_a == 0 or g.size_b == 0:
            raise ValueError(
                f"both groups need rows with the protected label: |N^a|={g.size_a}, |N^b|={g.size_b}"
            )
        return g

    @property
    def size_a(self) -> int:
        return int(self.in_a.sum())

    @property
    def size_b(self) -> int:
        return int(self.in_b.sum())


def loss_gap(losses: np.ndarray, groups: Groups) -> float:
    """D(θ): mean loss over N^a minus mean loss over N^b."""
    return float(losses[groups.in_a].mean() - losses[groups.in_b].mean())


def dual_step(lam: np.ndarray, gap: float, epsilon: float, beta: float, c: float) -> np.ndarray:
    """Projected ascent on f̃: ``λ ← max(0, λ + β [-c λ1 + D - ε, -c λ2 - D - ε])``."""
    grad = np.array([-c * lam[0] + gap - epsilon, -c * lam[1] - gap - epsilon])
    return np.maximum(0.0, lam + beta * grad)


def row_weights(lam: np.ndarray, groups: Groups) -> np.ndarray:
    """Per-row factor w_i with ν_i = w_i o_i (1/n, shifted by ±(λ1-λ2)/|N^s| on N^a, N^b)."""
    w = np.full(groups.n, 1.0 / groups.n)
    d = float(lam[0] - lam[1])
    w[groups.in_a] += d / groups.size_a
    w[groups.in_b] -= d / groups.size_b
    return w


def masked_weights(y: np.ndarray, z: np.ndarray, lam: np.ndarray, groups: Groups) -> np.ndarray:
    """ν = w ⊙ o: the only thing a passive party receives (SPEC.md step 3)."""
    return row_weights(lam, groups) * loss_derivative(y, z)


@dataclass(frozen=True)
class TrainStats:
    """What the server records about θ on the training rows each round."""

    loss: float  # data term of L(θ) (regulariser added by the caller)
    gap: float  # D(θ)

    @property
    def deo(self) -> float:
        return abs(self.gap)


def train_stats(y: np.ndarray, z: np.ndarray, groups: Groups) -> TrainStats:
    losses = logistic_loss(y, z)
    return TrainStats(loss=float(losses.mean()), gap=loss_gap(losses, groups))
