"""The FairVFL objective in numpy: loss, DEO gap, dual step and the masked weights ν.

One place for the math of docs/algorithm.md, used by the server (strategy) and by the active
party (local steps), so both compute ν the same way.

Notation: ``z`` summed logits, ``y`` labels in {-1, +1}, ``o_i = dl/dz_i``,
``N^a`` / ``N^b`` rows of group a / b with the protected label,
``D = mean loss over N^a - mean loss over N^b``.

Constraint sets (run-config key ``constraint``). Each constraint c is a loss gap
``D_c = mean loss over A_c - mean loss over B_c`` between group a and group b on a row
subset, kept within ``|D_c| <= ε`` by two multipliers ``(λ_c+, λ_c-)``:

* ``deo``: one constraint on the protected-label rows (the paper's DEO; 2 multipliers);
* ``equalized-odds``: one constraint per label value, protected label first (4);
* ``demographic-parity``: one constraint on all rows (2).

What a gap compares (run-config key ``constraint-measure``): ``loss`` (the paper) takes
the per-row logistic loss ``q_i = l_i``; ``rate`` takes the soft positive prediction
``q_i = σ(z_i)``, so a gap over label-y rows is a smooth true/false-positive-rate gap,
the quantity DFN/DFP measure with a hard threshold.

The multiplier vector is ``[λ_1+, λ_1-, λ_2+, λ_2-, ...]``; for ``deo`` it is the
paper's ``[λ1, λ2]``. The general masked weight is

    ν_i = o_i / n + m_i g_i,  m_i = Σ_c (λ_c+ − λ_c−) ([i ∈ A_c]/|A_c| − [i ∈ B_c]/|B_c|),

with ``g_i = dq_i/dz_i``: ``o_i`` for ``loss`` (so ν_i = w_i o_i, w_i = 1/n + m_i) and
``σ(z_i)(1 − σ(z_i))`` for ``rate``.
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


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


CONSTRAINTS = ("deo", "equalized-odds", "demographic-parity")
MEASURES = ("loss", "rate")


def constrained_values(y: np.ndarray, z: np.ndarray, measure: str) -> np.ndarray:
    """Per-row q_i whose group means the constraints compare: the loss, or σ(z_i) for ``rate``."""
    return logistic_loss(y, z) if measure == "loss" else sigmoid(z)


@dataclass(frozen=True)
class Constraint:
    """One loss-gap constraint: rows of group a (``in_a``) against rows of group b (``in_b``)."""

    name: str
    in_a: np.ndarray
    in_b: np.ndarray

    @property
    def size_a(self) -> int:
        return int(self.in_a.sum())

    @property
    def size_b(self) -> int:
        return int(self.in_b.sum())


@dataclass(frozen=True)
class Groups:
    """The row subsets of every constraint, and the sizes the weights need.

    ``in_a`` / ``in_b`` are the first constraint's masks (N^a, N^b for ``deo`` and
    ``equalized-odds``); ``constraints`` lists them all (one DEO constraint if omitted).
    """

    in_a: np.ndarray  # bool, row in N^a
    in_b: np.ndarray  # bool, row in N^b
    n: int
    constraints: tuple[Constraint, ...] = ()
    measure: str = "loss"  # what the gaps compare (MEASURES)

    def __post_init__(self) -> None:
        if not self.constraints:
            object.__setattr__(self, "constraints", (Constraint("deo", self.in_a, self.in_b),))

    @classmethod
    def from_labels(
        cls, y: np.ndarray, s: np.ndarray, protected_label: int, constraint: str = "deo", measure: str = "loss"
    ) -> "Groups":
        y = np.asarray(y)
        s = np.asarray(s, dtype=bool)
        if constraint not in CONSTRAINTS:
            raise ValueError(f"unknown constraint {constraint!r}: choose one of {', '.join(CONSTRAINTS)}")
        if measure not in MEASURES:
            raise ValueError(f"unknown constraint measure {measure!r}: choose one of {', '.join(MEASURES)}")
        if constraint == "demographic-parity":
            subsets = [("all rows", np.ones(len(y), dtype=bool))]
        else:
            subsets = [(f"y={protected_label:+d}", y == protected_label)]
            if constraint == "equalized-odds":
                subsets.append((f"y={-protected_label:+d}", y == -protected_label))
        cons = tuple(Constraint(name, rows & s, rows & ~s) for name, rows in subsets)
        for c in cons:
            if c.size_a == 0 or c.size_b == 0:
                what = "the protected label" if c is cons[0] and constraint != "demographic-parity" else c.name
                raise ValueError(
                    f"both groups need rows with {what} ({constraint}): |A|={c.size_a}, |B|={c.size_b}"
                )
        return cls(in_a=cons[0].in_a, in_b=cons[0].in_b, n=len(y), constraints=cons, measure=measure)

    @property
    def size_a(self) -> int:
        return self.constraints[0].size_a

    @property
    def size_b(self) -> int:
        return self.constraints[0].size_b

    @property
    def num_multipliers(self) -> int:
        return 2 * len(self.constraints)

    def values(self, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        """Per-row q_i the gaps compare, in this set's measure."""
        return constrained_values(y, z, self.measure)

    def gaps(self, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        """D_c at scores ``z`` for every constraint, in multiplier order."""
        return loss_gaps(self.values(y, z), self)

    def signed_weights(self, lam: np.ndarray) -> np.ndarray:
        """Per-row factor w_i = 1/n + m_i (see :func:`row_weights`)."""
        return row_weights(lam, self)


def loss_gap(losses: np.ndarray, groups: Groups) -> float:
    """D(θ) of the first constraint: mean loss over N^a minus mean loss over N^b."""
    return float(losses[groups.in_a].mean() - losses[groups.in_b].mean())


def loss_gaps(losses: np.ndarray, groups: Groups) -> np.ndarray:
    """D_c(θ) of every constraint, in multiplier order, from the per-row values q (losses by default)."""
    return np.array([losses[c.in_a].mean() - losses[c.in_b].mean() for c in groups.constraints])


def dual_step(lam: np.ndarray, gap, epsilon: float, beta: float, c: float) -> np.ndarray:
    """Projected ascent on f̃: ``λ_c± ← max(0, λ_c± + β (-c λ_c± ± D_c - ε))`` for every constraint.

    ``gap`` is D (a number, one constraint) or the vector of D_c; ``lam`` has two
    entries per constraint, ``[λ_1+, λ_1-, λ_2+, λ_2-, ...]``.
    """
    lam = np.asarray(lam, dtype=np.float64)
    gaps = np.atleast_1d(np.asarray(gap, dtype=np.float64))
    if lam.shape != (2 * len(gaps),):
        raise ValueError(f"{len(gaps)} constraint(s) need {2 * len(gaps)} multipliers, got {lam.shape}")
    grad = np.empty_like(lam)
    grad[0::2] = -c * lam[0::2] + gaps - epsilon
    grad[1::2] = -c * lam[1::2] - gaps - epsilon
    return np.maximum(0.0, lam + beta * grad)


def row_weights(lam: np.ndarray, groups: Groups) -> np.ndarray:
    """Per-row factor w_i with ν_i = w_i o_i: 1/n plus ±(λ_c+ − λ_c−)/|A_c|, /|B_c| per constraint."""
    lam = np.asarray(lam, dtype=np.float64)
    if lam.shape != (groups.num_multipliers,):
        raise ValueError(
            f"{len(groups.constraints)} constraint(s) need {groups.num_multipliers} multipliers, got {lam.shape}"
        )
    w = np.full(groups.n, 1.0 / groups.n)
    for k, con in enumerate(groups.constraints):
        d = float(lam[2 * k] - lam[2 * k + 1])
        w[con.in_a] += d / con.size_a
        w[con.in_b] -= d / con.size_b
    return w


def masked_weights(y: np.ndarray, z: np.ndarray, lam: np.ndarray, groups: Groups) -> np.ndarray:
    """ν = ∂f̃/∂z: the only thing a passive party receives (docs/algorithm.md, One round, step 3).

    ``w ⊙ o`` for the loss measure; ``o/n + m ⊙ σ'(z)`` for ``rate``.
    """
    o = loss_derivative(y, z)
    w = groups.signed_weights(lam)
    if groups.measure == "loss":
        return w * o
    p = sigmoid(z)
    return o / groups.n + (w - 1.0 / groups.n) * p * (1.0 - p)


@dataclass(frozen=True)
class TrainStats:
    """What the server records about θ on the training rows each round."""

    loss: float  # data term of L(θ) (regulariser added by the caller)
    gap: float  # D(θ) of the first constraint (DEO's D for deo / equalized-odds), in the run's measure
    gaps: tuple[float, ...] = ()  # D_c(θ) of every constraint

    @property
    def deo(self) -> float:
        return abs(self.gap)

    @property
    def max_gap(self) -> float:
        """max_c |D_c(θ)|: the constraint set holds when this is <= ε."""
        return max((abs(g) for g in self.gaps), default=abs(self.gap))


def train_stats(y: np.ndarray, z: np.ndarray, groups: Groups) -> TrainStats:
    losses = logistic_loss(y, z)
    gaps = loss_gaps(losses if groups.measure == "loss" else sigmoid(z), groups)  # = groups.gaps(y, z), one loss pass
    return TrainStats(loss=float(losses.mean()), gap=float(gaps[0]), gaps=tuple(float(g) for g in gaps))
