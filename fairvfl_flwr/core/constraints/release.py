"""Groups released through k-ary randomized response: the flip matrix, the release, the correction.

A group registry (docs/privacy.md, "A registry holds the groups") releases each row's
group g ∈ {0..k−1} through k-ary randomized response at ε_S: it keeps g with probability
``p = e^ε / (e^ε + k − 1)`` and otherwise reports one of the k − 1 other groups uniformly.
Whatever anyone computes from the released value of a row is ε_S-locally differentially
private about that row's group, so the guarantee needs no trust in who receives it.

The flip matrix ``P[i, j] = Pr(released = j | true = i)`` is public (it depends on ε_S and k
only). Over any set of rows, the expected sum of a per-row value q over the rows released
as j is ``Σ_i P[i, j] · (sum of q over the rows truly in i)``, so the true groups' sums are
``P^{-T}`` times the released groups' sums (the mutually-contaminated-classes correction).
Row by row this is a membership weight: row r counts in group g with weight
``(P^{-1})[released(r), g]``, and every weighted sum Σ_r W[r, g] q_r is an unbiased
estimate of the true group's sum (:func:`membership_weights`; ``SensitiveGroups`` with
``weights`` carries them into every gap, ν weight and metric).
"""

from __future__ import annotations

import hashlib
import hmac
import math
from dataclasses import dataclass

import numpy as np

from fairvfl_flwr.core.constraints.measures import Measure
from fairvfl_flwr.core.constraints.measures import measure as measure_named

#: The noisy release: k-ary randomized response.
RANDOMIZED_RESPONSE = "randomized-response"
#: The exact mode: the groups stay under the registry's CKKS key, the server gets sums over them
#: (jobs/encrypted_groups.py, core/constraints/cells.py).
ENCRYPTED = "ckks"


@dataclass(frozen=True)
class RandomizedResponse:
    """k-ary randomized response at ``epsilon`` (ε_S) over ``k`` groups."""

    epsilon: float
    k: int

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"randomized response needs a finite epsilon > 0, got {self.epsilon!r}")
        if self.k < 2:
            raise ValueError(f"randomized response needs two groups or more, got {self.k}")

    @property
    def keep(self) -> float:
        """The probability that a row's released group is its true one, e^ε/(e^ε + k − 1): also the
        best accuracy anyone can have guessing a row's true group from its release (uniform prior)."""
        e = math.exp(self.epsilon)
        return e / (e + self.k - 1)

    def matrix(self) -> np.ndarray:
        """P[i, j] = Pr(released = j | true = i)."""
        other = (1.0 - self.keep) / (self.k - 1)
        return np.full((self.k, self.k), other) + np.eye(self.k) * (self.keep - other)

    def correction(self) -> np.ndarray:
        """P^{-1}: row j is the membership weights, one per true group, of a row released as j."""
        return np.linalg.inv(self.matrix())

    def release(self, codes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Each row's released group: its own with probability :attr:`keep`, else one of the k − 1
        others uniformly."""
        n = len(codes)
        return self.apply(codes, rng.random(n), rng.integers(1, self.k, size=n))

    def apply(self, codes: np.ndarray, u: np.ndarray, shift: np.ndarray) -> np.ndarray:
        """The release of ``codes`` given each row's uniform draw ``u`` in [0, 1) (flipped when
        ``u`` ≥ :attr:`keep`) and ``shift`` in 1..k−1 (to the group that far along, mod k)."""
        codes = np.asarray(codes, dtype=np.int64)
        if len(codes) and (codes.min() < 0 or codes.max() >= self.k):
            raise ValueError(f"group codes must lie in 0..{self.k - 1}")
        return np.where(np.asarray(u) >= self.keep, (codes + np.asarray(shift, dtype=np.int64)) % self.k, codes)


def membership_weights(rr: RandomizedResponse, released: np.ndarray) -> np.ndarray:
    """n × k: W[r, g] = (P^{-1})[released(r), g], each row's weight in each true group."""
    return rr.correction()[np.asarray(released, dtype=np.int64)]


def row_draws(secret: bytes, ids: np.ndarray, rr: RandomizedResponse) -> tuple[np.ndarray, np.ndarray]:
    """Each row's draws (``u``, ``shift``) for :meth:`RandomizedResponse.apply`, a keyed hash of the
    registry's secret, the row's id, ε_S and k alone: a row is released alike in every run, split and
    set of aligned rows, so no sequence of requests averages fresh draws of it (a server that changes
    the rows, the split or the order gets the same value for the row again). Releases at another ε_S
    draw afresh and compose: the registry's ledger counts them (jobs/group_release.py)."""
    key = hashlib.sha256(b"fairvfl.groups-release-key|" + secret).digest()
    tag = f"|{rr.epsilon!r}|{rr.k}|".encode()
    n = len(ids)
    u, shift = np.empty(n), np.empty(n, dtype=np.int64)
    for r, row in enumerate(ids):
        d = hmac.new(key, tag + str(row).encode(), hashlib.sha256).digest()
        u[r] = int.from_bytes(d[:7], "big") / 2.0**56
        shift[r] = 1 + int.from_bytes(d[8:16], "big") % (rr.k - 1)
    return u, shift


@dataclass(frozen=True)
class RowWeights:
    """The constraint as a label owner that holds no groups takes it: the signed row weights
    w = 1/n + m the server computed from λ and the released groups, sent with the round's
    message. ν = ∂f̃/∂z and the curvature of f̃ in z (core/newton.curvature) follow from w
    alone (w does not depend on z), so the label owner's local steps take the fairness term
    the server's ν carries, without a group column of its own."""

    weights: np.ndarray
    measure: str
    num_multipliers: int

    @property
    def q(self) -> Measure:
        """The gaps' measure (core/constraints/measures.py)."""
        return measure_named(self.measure)

    @property
    def n(self) -> int:
        """The rows the weights are of."""
        return len(self.weights)

    def restrict(self, rows: np.ndarray | None) -> "RowWeights":
        """The weights arrive for the round's rows: only a full batch is known to the label owner."""
        if rows is not None and len(rows) != self.n:
            raise ValueError("a label owner without groups takes full-batch rounds only (batching.batch-size = 0)")
        return self

    def signed_weights(self, lam: np.ndarray) -> np.ndarray:
        """w as received (the server computed it at the λ the message carries)."""
        return self.weights

    def masked_weights(self, y: np.ndarray, z: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """ν = ∂f̃/∂z at scores ``z`` from the received w."""
        return self.q.nu(y, z, self.weights, self.n)


@dataclass(frozen=True)
class ErrorPlan:
    """What :func:`gap_errors` reads of a constraint and a release besides the rows' values, built
    once (:func:`error_plan`): the covariance of a row's weights in every pair of groups given each
    true group (k × G × G), and per gap its rows and its noisy sides (group, sign, weights, size)."""

    cov: np.ndarray
    gaps: tuple[tuple[np.ndarray, tuple[tuple[int, float, np.ndarray, float], ...]], ...]


def error_plan(constraint, rr: RandomizedResponse) -> ErrorPlan | None:
    """The :class:`ErrorPlan` of ``constraint`` (built on a release by ``rr``); None where the
    groups are exact."""
    groups = constraint.groups
    if groups is None or groups.exact:
        return None
    P, table, codes = rr.matrix(), np.asarray(groups.weights, dtype=np.float64), groups.codes
    # the release's weight in each (possibly pooled) group of a row released as j: table[j]; its mean and
    # covariance given each true group i
    mean = P @ table  # k × G
    cov = np.einsum("ij,ja,jb->iab", P, table, table) - np.einsum("ia,ib->iab", mean, mean)
    plans = []
    for gap in constraint.gap_list:
        rows = gap.in_a | gap.in_b
        sides = tuple((_group_of(weight, rows, table, codes), sign, weight[rows], float(weight.sum()))
                      for weight, sign in ((gap.weight_a, 1.0), (gap.weight_b, -1.0))
                      if weight is not None)  # an exact side (every row of the subset): no noise
        plans.append((rows, sides))
    return ErrorPlan(cov, tuple(plans))


def gap_errors(constraint, rr: RandomizedResponse, q: np.ndarray, plan: ErrorPlan | None = None) -> np.ndarray:
    """Per gap of ``constraint`` (built on a release by ``rr``), the standard deviation the release
    adds to the gap's estimate at the rows' values ``q``, at most: how far the gap on the true
    groups may lie from the server's figure for it (a few of these either side). ``plan``: its
    :func:`error_plan`, where the caller keeps it (it depends on the constraint and the release only).

    A side's mean Σ W_r q_r / Σ W_r moves, to first order, by Σ_r η_r (q_r − mean)/Σ W_r, where
    η_r = W_r − E[W_r | the row's true group] is the release's noise on the row's weight; the two
    sides' noises of a row are correlated (one release). A row's true group is not known, so each
    row counts at the largest variance over the groups it might be in. A gap's rows are those
    with a weight on either side: the correction's weights are never 0. Zero where the groups
    are exact."""
    plan = error_plan(constraint, rr) if plan is None else plan
    if plan is None:
        return np.zeros(len(constraint.gap_list))
    q = np.asarray(q, dtype=np.float64)
    out = np.zeros(len(plan.gaps))
    for c, (rows, sides) in enumerate(plan.gaps):
        q_rows = q[rows]
        coef = np.zeros((len(q_rows), plan.cov.shape[1]))  # each row's ∂D/∂W in each group
        for g, sign, weight, size in sides:
            coef[:, g] += sign * (q_rows - float(weight @ q_rows) / size) / size
        per_group = np.einsum("ra,iab,rb->ri", coef, plan.cov, coef)  # rows × true groups
        out[c] = float(np.sqrt(per_group.max(axis=1).sum()))
    return out


def _group_of(weight: np.ndarray, rows: np.ndarray, table: np.ndarray, codes: np.ndarray) -> int:
    """The one group whose weights a gap's side carries on ``rows`` (refused where none or several do:
    the error would be of another group's)."""
    found = [g for g in range(table.shape[1]) if np.allclose(weight[rows], table[codes[rows], g])]
    if len(found) != 1:
        raise ValueError(f"a gap's side carries the weights of {len(found)} groups, not of one")
    return found[0]
