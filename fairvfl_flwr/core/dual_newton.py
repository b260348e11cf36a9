"""Block Newton's dual step (``optimizer = "newton"``): one function, :func:`dual_newton_step`,
and one small class per rule it may follow.

The step works on d_c = λ_c+ − λ_c− (one multiplier of a pair is 0 at the optimum). The
dual is concave in d with derivative r_c = D_c − ε sign(d_c) − c d_c (at d_c = 0: 0 if
|D_c| <= ε, else the side D_c points to), and Newton moves d ← d − (J − cI)⁻¹ r, with J the
gaps' sensitivity to d in the last round's subspace (core/newton.subspace_gap_jacobian).
Before there is a J (round 1) the step is the paper's gradient step with β. Every rule keeps
a step from crossing d_c = 0 (the dual's kink: the other multiplier takes over from there
on the next round). Two rules:

* :class:`ClippedNewton`: ``deo`` on two groups, where the rows of different gaps are
  disjoint: d is clipped to ``ConstraintSet.weight_bounds`` (the loss measure's row weights
  w = 1/n + A d stay >= 0), and a gap already at its bound steps past it by gradient (the
  rule measured on Adult, COMPAS and Crime; docs/newton.md).
* :class:`ConstrainedSearch`: every other constraint (several groups, equalized odds,
  demographic parity, ``constraint-form = "overall"``, the rate measure): no dual step at
  all, because the server's search solves for the step lengths and λ together
  (core/newton.constrained_step).

:func:`rule_for` says which rule a constraint takes (its kind's ``newton_past_bound`` and
how many gap sides a row sits on). The constraint object supplies the gaps' structure
(weights, bounds, projection); the linear algebra lives here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairvfl_flwr.core.constraints import ConstraintSet, as_multipliers, gaps_per_row
from fairvfl_flwr.core.step import dual_step

__all__ = ["ClippedNewton", "ConstrainedSearch", "at_weight_bound", "dual_newton_step", "rule_for", "secant_correction"]

Previous = tuple[np.ndarray, np.ndarray]


def dual_newton_step(lam: np.ndarray, gaps: np.ndarray, jac: np.ndarray | None, constraint: ConstraintSet, *,
                     epsilon: float, beta: float, c: float, previous: Previous | None = None) -> np.ndarray:
    """The server's dual step under ``optimizer = "newton"``: the new λ from the gaps D_c at the
    current θ, the last round's subspace sensitivity ``jac`` (None in round 1: the gradient
    step with β) and ``previous`` = (d, gaps) at the last dual step, by :func:`rule_for`'s rule."""
    return rule_for(constraint).step(lam, gaps, jac, constraint, epsilon=epsilon, beta=beta, c=c, previous=previous)


def rule_for(constraint: ConstraintSet) -> "ClippedNewton | ConstrainedSearch":
    """The dual rule of ``constraint``: :class:`ClippedNewton` where its kind allows the step past
    the weight bound (``newton_past_bound``) and no row sits on two gaps' sides, else
    :class:`ConstrainedSearch`."""
    if constraint.newton_past_bound and gaps_per_row(constraint) <= 1:
        return ClippedNewton()
    return ConstrainedSearch()


def at_weight_bound(constraint: ConstraintSet, lam: np.ndarray) -> np.ndarray:
    """Per gap: does d_c sit at (or past) ``ConstraintSet.weight_bounds``? (None where the measure allows w < 0.)

    From there block Newton's dual step is the paper's projected gradient step with β,
    unclipped: where the constraint needs some rows' weights below 0 (Crime), λ moves past
    the bound by β(|D_c| − ε) per round, and back once the gap is met. Small steps, because
    past the bound f̃ is not convex in those rows' logits and the Newton step's sensitivity
    J, taken at weights >= 0, says nothing about how far the primal then moves.
    """
    if not constraint.q.needs_nonnegative_weights:
        return np.zeros(len(constraint.constraints), dtype=bool)
    lo, hi = constraint.weight_bounds()
    d = np.asarray(lam, dtype=np.float64)[0::2] - np.asarray(lam, dtype=np.float64)[1::2]
    rel = 1e-9  # project puts d on the bound up to rounding
    return (d >= hi * (1 - rel)) | (d <= lo * (1 - rel))


def split(d: np.ndarray) -> np.ndarray:
    """The multipliers [λ_1+, λ_1−, ...] with λ_c+ − λ_c− = d_c and one of each pair 0."""
    out = np.empty(2 * len(d), dtype=np.float64)
    out[0::2], out[1::2] = np.maximum(d, 0.0), np.maximum(-d, 0.0)
    return out


def newton_residual(d: np.ndarray, gaps: np.ndarray, epsilon: float, c: float) -> tuple[np.ndarray, np.ndarray]:
    """The dual's derivative r in d, and which d_c are free to move (not resting at 0 inside ε)."""
    side = np.where(d != 0, np.sign(d), np.where(np.abs(gaps) > epsilon, np.sign(gaps), 0.0))
    return gaps - epsilon * side - c * d, ~((d == 0) & (side == 0))


def not_across_zero(d: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``new`` with every d_c that would change sign stopped at 0 (the dual's kink)."""
    return np.where((d != 0) & (np.sign(new) != np.sign(d)), 0.0, new)


@dataclass(frozen=True)
class ConstrainedSearch:
    """No dual step between rounds: the server's search solves for the step lengths and λ together
    (core/newton.constrained_step), so λ is already the one the next round's ν needs.

    The dual Newton steps of the other rules move λ on the subspace's sensitivity J, which
    underestimates how far a small group's gap moves (the step overshoots and the gaps
    oscillate), and must keep the loss measure's weights >= 0 (the target may need them
    below). Solving min L subject to every |D_c| <= ε on the ≤ 5K-dimensional subspace
    needs neither: the gaps are within ε from the first round on, and λ is that small
    problem's multiplier vector (docs/newton.md, "Several groups and coupled gaps").
    """

    #: the search returns λ (core/newton.search_step reads this)
    searches = True

    def step(self, lam: np.ndarray, gaps: np.ndarray, jac: np.ndarray | None, constraint: ConstraintSet, *,
             epsilon: float, beta: float, c: float, previous: Previous | None = None) -> np.ndarray:
        """λ as the last search left it (:func:`dual_newton_step`)."""
        return as_multipliers(lam, len(constraint.constraints))


@dataclass(frozen=True)
class ClippedNewton:
    """Newton on the dual clipped to the weight bounds; past a bound, a short gradient step.

    A gap whose d_c already sits at :func:`at_weight_bound` takes the paper's
    projected gradient step with β, unclipped, moving d_c by at most ``past_bound_share`` of
    its bounds' width (:meth:`past_bound`). The others take :meth:`newton`.
    """

    #: the most a gradient step from a weight bound moves d_c, as a share of the bounds' width
    past_bound_share: float = 0.1
    #: λ comes from this dual step, not from the search
    searches = False

    def step(self, lam: np.ndarray, gaps: np.ndarray, jac: np.ndarray | None, constraint: ConstraintSet, *,
             epsilon: float, beta: float, c: float, previous: Previous | None = None) -> np.ndarray:
        """The new λ (:func:`dual_newton_step`)."""
        if jac is None:
            return constraint.project(dual_step(lam, gaps, epsilon, beta, c))
        new = self.newton(lam, gaps, jac, constraint, epsilon=epsilon, c=c, previous=previous)
        past = at_weight_bound(constraint, lam)
        if past.any():
            step = self.past_bound(lam, dual_step(lam, gaps, epsilon, beta, c), constraint)
            for k in np.flatnonzero(past):
                new[2 * k:2 * k + 2] = step[2 * k:2 * k + 2]
        return new

    def newton(self, lam: np.ndarray, gaps: np.ndarray, jac: np.ndarray, constraint: ConstraintSet, *,
               epsilon: float, c: float, previous: Previous | None = None) -> np.ndarray:
        """d ← d − (J − cI)⁻¹ r on the gaps not resting at 0, not across 0, then clipped to the
        weight bounds. J is the subspace's (negative semidefinite, a lower bound on the true
        magnitude), its diagonal made steeper where the secant slope observed since
        ``previous`` is (:func:`secant_correction`), so the step errs short."""
        lam = np.asarray(lam, dtype=np.float64)
        gaps = np.atleast_1d(np.asarray(gaps, dtype=np.float64))
        d = lam[0::2] - lam[1::2]
        jac = np.atleast_2d(np.asarray(jac, dtype=np.float64))
        steeper = secant_correction(d, gaps, jac, previous)
        r, free = newton_residual(d, gaps, epsilon, c)
        new = d.copy()
        if free.any():
            M = (jac + np.diag(steeper) - c * np.eye(len(d)))[np.ix_(free, free)]
            new[free] = d[free] - np.linalg.solve(M, r[free])
        return constraint.project(split(not_across_zero(d, new)))

    def past_bound(self, lam: np.ndarray, step: np.ndarray, constraint: ConstraintSet) -> np.ndarray:
        """The gradient ``step`` from a weight bound, moving each d_c by at most
        ``past_bound_share`` of its bounds' width. Past the bound some rows' weights are <= 0,
        so their loss is held only by μ: on a small group the gap can then grow far beyond ε,
        and β times that gap would carry d across both bounds, further each round. A moderate
        gap's step is returned as it is."""
        lo, hi = constraint.weight_bounds()
        d, d_new = lam[0::2] - lam[1::2], step[0::2] - step[1::2]
        limit = self.past_bound_share * (hi - lo)
        moved = np.clip(d_new - d, -limit, limit)
        if np.array_equal(moved, d_new - d):
            return step
        return split(d + moved)


def secant_correction(d: np.ndarray, gaps: np.ndarray, jac: np.ndarray, previous: Previous | None) -> np.ndarray:
    """What to add to J's diagonal so that it is as steep as the secant slope of each gap
    observed since ``previous = (d, gaps)`` (0 where the subspace's J is steeper already)."""
    slope = np.diag(jac)
    steeper = np.zeros(len(d))
    if previous is not None:
        d_prev, gaps_prev = (np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in previous)
        moved = np.abs(d - d_prev) > 0
        secant = np.where(moved, (gaps - gaps_prev) / np.where(moved, d - d_prev, 1.0), 0.0)
        steeper = np.minimum(secant - slope, 0.0)
    return steeper
