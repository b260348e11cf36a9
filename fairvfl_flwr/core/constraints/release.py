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

import dataclasses
import hashlib
import hmac
import math
from dataclasses import dataclass
from typing import ClassVar

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
    true group (k × G × G), and per gap that compares groups its rows and its noisy sides (group,
    sign, weights on those rows, size)."""

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
        if isinstance(gap, SpreadGap):
            continue
        rows = gap.in_a | gap.in_b
        sides = tuple((_group_of(weight, rows, table, codes), sign, weight[rows], float(weight.sum()))
                      for weight, sign in ((gap.weight_a, 1.0), (gap.weight_b, -1.0))
                      if weight is not None)  # an exact side (every row of the subset): no noise
        plans.append((rows, sides))
    return ErrorPlan(cov, tuple(plans))


def gap_errors(constraint, rr: RandomizedResponse, q: np.ndarray, plan: ErrorPlan | None = None) -> np.ndarray:
    """Per gap of ``constraint`` (built on a release by ``rr``) that compares groups (its spread gaps,
    :class:`SpreadGap`, left out), the standard deviation the release
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
        return np.zeros(int(estimates(constraint).sum()))
    q = np.asarray(q, dtype=np.float64)
    return np.array([_spread(plan.cov, rows, sides, q)[0] for rows, sides in plan.gaps])


def gap_error_slopes(constraint, rr: RandomizedResponse, q: np.ndarray, plan: ErrorPlan | None = None) -> np.ndarray:
    """n × C: column c is ∂S_c/∂q at the rows' values ``q``, S_c the c-th of :func:`gap_errors` (zero
    where S_c is 0: S_c is a norm of q's centred values, not differentiable there).

    With each row's variance taken at the true group that is largest at ``q``, S_c(q) = ‖M_c q‖ for
    a fixed linear M_c: convex and of degree 1 in q, so the slope at q gives S_c(q) = slope · q
    (Euler) and slope · q' <= S_c(q') at every other q' (a supporting plane through 0)."""
    plan = error_plan(constraint, rr) if plan is None else plan
    q = np.asarray(q, dtype=np.float64)
    if plan is None:
        return np.zeros((len(q), int(estimates(constraint).sum())))
    out = np.zeros((len(q), len(plan.gaps)))
    for c, (rows, sides) in enumerate(plan.gaps):
        out[rows, c] = _spread(plan.cov, rows, sides, q, slope=True)[1]
    return out


def _spread(cov: np.ndarray, rows: np.ndarray, sides, q: np.ndarray, slope: bool = False
            ) -> tuple[float, np.ndarray | None]:
    """One gap's S at ``q`` and, with ``slope``, ∂S/∂q on the gap's rows (see :func:`gap_errors`).

    S² = Σ_r coef_rᵀ C_r coef_r, coef_r[g] = Σ_(sides on g) sign (q_r − m_side)/size, m_side =
    weightᵀq/size, C_r the weights' covariance given the row's largest true group; with
    v_r = C_r coef_r, ∂S²/∂q_j = 2 Σ_sides (sign/size)(v_j[g] − (weight_j/size) Σ_r v_r[g])."""
    coef = _coefficients(sides, q[rows], cov.shape[1])
    worst, spread = _at_worst(cov, coef)
    return spread, (_slope(cov, sides, coef, worst, spread) if slope else None)


def _slope(cov: np.ndarray, sides, coef: np.ndarray, worst: np.ndarray, spread: float) -> np.ndarray:
    """∂S/∂q on a gap's rows from its :func:`_coefficients` and :func:`_at_worst` (see :func:`_spread`)."""
    grad = np.zeros(len(coef))
    if spread > SPREAD_FLOOR:
        v = np.einsum("rab,rb->ra", cov[worst], coef)
        for g, sign, weight, size in sides:
            grad += (sign / size) * (v[:, g] - weight * (float(v[:, g].sum()) / size))
        grad /= spread  # ∂S = ∂S² / (2S)
    return grad


def _coefficients(sides, values: np.ndarray, groups: int) -> np.ndarray:
    """Each of a gap's rows' ∂D/∂W in each group at the rows' ``values`` (R → R × G), or for each
    column of them (R × J → R × J × G): Σ_(sides on g) sign (value − weightᵀvalues/size)/size."""
    out = np.zeros(values.shape + (groups,))
    for g, sign, weight, size in sides:
        out[..., g] += sign * (values - (weight @ values) / size) / size
    return out


def _at_worst(cov: np.ndarray, coef: np.ndarray) -> tuple[np.ndarray, float]:
    """Each row's true group of the largest variance at ``coef`` (:func:`_coefficients`), and S."""
    per_group = np.einsum("ra,iab,rb->ri", coef, cov, coef)  # rows × true groups
    worst = per_group.argmax(axis=1)
    return worst, float(np.sqrt(per_group[np.arange(len(worst)), worst].sum()))


#: Where S is below this it is 0 but for rounding (the rows' values are the same, as a run's first
#: scores make them), and its slope, the ratio of two rounding errors, is taken as 0.
SPREAD_FLOOR = 1e-12

#: How many of the release's standard deviations a release margin covers (:class:`ReleaseMargin`).
MARGIN_DEVIATIONS = 2.0


@dataclass(frozen=True)
class ReleaseMargin:
    """A run's bound on the release's error (run config ``groups.release-margin``): per gap c,
    ``deviations`` · S_c <= ``margin``, so that with the estimate held within ε the true groups'
    gap is likely within ε + margin (a statement of about two standard deviations per gap, each row's
    variance at its worst true group; not a certainty). Held as one more gap per gap, whose value
    ``scale`` · S_c the run's one bound ε holds (:class:`SpreadGap`)."""

    margin: float
    epsilon: float
    deviations: float = MARGIN_DEVIATIONS

    @property
    def scale(self) -> float:
        """ε · deviations / margin: |scale · S_c| <= ε exactly where deviations · S_c <= margin."""
        return self.epsilon * self.deviations / self.margin

    def apply(self, constraint, rr: RandomizedResponse):
        """``constraint`` (built on a release by ``rr``) with a :class:`SpreadGap` after its gaps for
        each gap that compares groups, in their order; as it is where the groups are exact."""
        plan = error_plan(constraint, rr)
        if plan is None:
            return constraint
        spreads = tuple(SpreadGap(f"{gap.name} (release spread)", rows, sides, plan.cov, self.scale)
                        for gap, (rows, sides) in zip(constraint.gap_list, plan.gaps))
        return dataclasses.replace(constraint, gap_list=constraint.gap_list + spreads)


@dataclass(frozen=True)
class SpreadGap:
    """A gap whose value is ``scale`` · S, S the release's error of another gap's estimate
    (:func:`gap_errors`), exact at every q. S is not linear in q, but it is convex and of degree 1
    (:func:`gap_error_slopes`): its slope at a reference q_ref, ``slope`` (scale · ∂S/∂q there),
    is a plane through 0 that meets scale · S at q_ref and lies below it elsewhere. The rows'
    weights take the gap by that slope (:meth:`add_to`), so the multipliers, the signed weights,
    ν, a label owner's weights, the weight bounds and the dual steps treat it as any gap. The
    server takes the slope again at each round's scores, and block Newton's search at each of its
    trial points (``ConstraintSet.linearised``): there the weights' derivative and the value agree.
    None before any: no weight, as at scores that are the same on every row, where S is 0 (a run's
    first round)."""

    name: str
    rows: np.ndarray
    sides: tuple[tuple[int, float, np.ndarray, float], ...]
    cov: np.ndarray
    scale: float
    slope: np.ndarray | None = None
    #: S is not linear in q: its slope depends on where it is taken (:meth:`at`)
    linear: ClassVar[bool] = False

    def value(self, q: np.ndarray) -> float:
        """scale · S at ``q``."""
        return self.scale * _spread(self.cov, self.rows, self.sides, q)[0]

    def at(self, q: np.ndarray) -> "SpreadGap":
        """The same gap with its slope taken at ``q``."""
        slope = np.zeros(len(q))
        slope[self.rows] = self.scale * _spread(self.cov, self.rows, self.sides, q, slope=True)[1]
        return dataclasses.replace(self, slope=slope)

    def bend(self, q: np.ndarray, dq: np.ndarray) -> np.ndarray:
        """dqᵀ ∇²(scale · S) dq at ``q`` for the columns of ``dq`` (n × J): S's own curvature in q, which
        the rows' weights do not carry (a norm's, PSD; large where S is small, as a margin holds it).

        With coef = A q (each row's ∂D/∂W in each group, linear in q) and C_r each row's covariance
        at its worst group, S² = Σ_r coef_rᵀ C_r coef_r, so ∇²S = (AᵀCA − ∇S ∇Sᵀ)/S."""
        coef = _coefficients(self.sides, q[self.rows], self.cov.shape[1])
        worst, spread = _at_worst(self.cov, coef)
        J = dq.shape[1]
        if spread <= SPREAD_FLOOR:
            return np.zeros((J, J))
        grad = _slope(self.cov, self.sides, coef, worst, spread)
        d_rows = dq[self.rows]
        dcoef = _coefficients(self.sides, d_rows, self.cov.shape[1])
        gram = np.einsum("rja,rab,rkb->jk", dcoef, self.cov[worst], dcoef, optimize=True)
        g = grad @ d_rows
        return self.scale * (gram - np.outer(g, g)) / spread

    def add_to(self, w: np.ndarray, d: float) -> None:
        """w += d · slope, in place (nothing before a slope is taken)."""
        if self.slope is not None:
            w += d * self.slope

    def rows_on(self) -> np.ndarray:
        """1 on the compared gap's rows, where the slope may be non-zero: the rows it enters are the same
        in every round (how many gaps a row sits on, which halves every gap's weight bounds beside the
        spread gaps); its own weight bounds follow its slope's column, so they move with the reference."""
        return self.rows.astype(np.int64)

    def restrict(self, rows: np.ndarray) -> "SpreadGap":
        """Refused: the release's error is over every training row (a registry's runs are full batch)."""
        raise ValueError("a release margin is over every training row: full-batch rounds only")


def estimates(constraint) -> np.ndarray:
    """Per gap of ``constraint``: does it estimate a gap between groups (not a :class:`SpreadGap`)?"""
    return np.array([not isinstance(gap, SpreadGap) for gap in constraint.gap_list], dtype=bool)


def _group_of(weight: np.ndarray, rows: np.ndarray, table: np.ndarray, codes: np.ndarray) -> int:
    """The one group whose weights a gap's side carries on ``rows`` (refused where none or several do:
    the error would be of another group's)."""
    found = [g for g in range(table.shape[1]) if np.allclose(weight[rows], table[codes[rows], g])]
    if len(found) != 1:
        raise ValueError(f"a gap's side carries the weights of {len(found)} groups, not of one")
    return found[0]
