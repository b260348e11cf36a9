"""Block Newton's dual step (``optimizer = "newton"``): one function, :func:`dual_newton_step`,
and one small class per rule it may follow.

The step works on d_c = λ_c+ − λ_c− (one multiplier of a pair is 0 at the optimum). The
dual is concave in d with derivative r_c = D_c − ε sign(d_c) − c d_c (at d_c = 0: 0 if
|D_c| <= ε, else the side D_c points to), and Newton moves d ← d − (J − cI)⁻¹ r, with J the
gaps' sensitivity to d in the last round's subspace (core/newton.subspace_gap_jacobian).
Before there is a J (round 1) the step is the paper's gradient step with β. Every rule keeps
a step from crossing d_c = 0 (the dual's kink: the other multiplier takes over from there
on the next round). The rules differ in how they keep the row weights w = 1/n + A d of the
loss measure >= 0 (A: ``ConstraintSet.gap_weights``):

* :class:`ClippedNewton`: ``deo`` on two groups, where the rows of different gaps are
  disjoint: d is clipped to ``ConstraintSet.weight_bounds``, and a gap already at its bound
  steps past it by gradient (the rule measured on Adult, COMPAS and Crime; docs/newton.md).
* :class:`FractionToBoundary`: where gaps share rows (several groups, equalized odds,
  ``constraint-form = "overall"``) or the kind keeps every weight > 0: no weight may lose
  more than a share of its value in one step.

:func:`rule_for` says which rule a constraint takes (its kind's ``newton_past_bound`` and
how many gap sides a row sits on). The constraint object supplies the gaps' structure
(weights, bounds, projection); the linear algebra lives here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairvfl_flwr.core.constraints import ConstraintSet

__all__ = ["ClippedNewton", "FractionToBoundary", "dual_newton_step", "range_solve", "rule_for",
           "secant_correction", "sparsest"]

Previous = tuple[np.ndarray, np.ndarray]


def dual_newton_step(lam: np.ndarray, gaps: np.ndarray, jac: np.ndarray | None, constraint: ConstraintSet, *,
                     epsilon: float, beta: float, c: float, previous: Previous | None = None) -> np.ndarray:
    """The server's dual step under ``optimizer = "newton"``: the new λ from the gaps D_c at the
    current θ, the last round's subspace sensitivity ``jac`` (None in round 1: the gradient
    step with β) and ``previous`` = (d, gaps) at the last dual step, by :func:`rule_for`'s rule."""
    return rule_for(constraint).step(lam, gaps, jac, constraint, epsilon=epsilon, beta=beta, c=c, previous=previous)


def rule_for(constraint: ConstraintSet) -> "ClippedNewton | FractionToBoundary":
    """The dual rule of ``constraint``: :class:`ClippedNewton` where its kind allows the step past
    the weight bound (``newton_past_bound``) and no row sits on two gaps' sides, else
    :class:`FractionToBoundary`."""
    if constraint.newton_past_bound and constraint.gaps_per_row() <= 1:
        return ClippedNewton()
    return FractionToBoundary()


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
class ClippedNewton:
    """Newton on the dual clipped to the weight bounds; past a bound, a short gradient step.

    A gap whose d_c already sits at ``ConstraintSet.at_weight_bound`` takes the paper's
    projected gradient step with β, unclipped, moving d_c by at most ``past_bound_share`` of
    its bounds' width (:meth:`past_bound`). The others take :meth:`newton`.
    """

    #: the most a gradient step from a weight bound moves d_c, as a share of the bounds' width
    past_bound_share: float = 0.1

    def step(self, lam: np.ndarray, gaps: np.ndarray, jac: np.ndarray | None, constraint: ConstraintSet, *,
             epsilon: float, beta: float, c: float, previous: Previous | None = None) -> np.ndarray:
        """The new λ (:func:`dual_newton_step`)."""
        if jac is None:
            return constraint.project(ConstraintSet.dual_step(lam, gaps, epsilon, beta, c))
        new = self.newton(lam, gaps, jac, constraint, epsilon=epsilon, c=c, previous=previous)
        past = constraint.at_weight_bound(lam)
        if past.any():
            step = self.past_bound(lam, ConstraintSet.dual_step(lam, gaps, epsilon, beta, c), constraint)
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


@dataclass(frozen=True)
class FractionToBoundary:
    """Newton on the dual that keeps every row weight above a share of its current value.

    * Solved only on the combinations of d that change the row weights (:func:`range_solve`):
      where gaps are linearly dependent (pairwise, G >= 3: D_ab + D_bc = D_ac, and so are the
      columns of ``ConstraintSet.gap_weights``) a move along the null space changes neither ν
      nor any gap, and J is singular there. Of the multipliers that give the new weights, the
      step keeps those with the least Σ|d_c| (:func:`sparsest`: the dual's −ε Σ|d_c| term).
    * Fraction to the boundary on the exact row weights: no w_i may fall below
      1 − ``weight_fraction`` of its current value (w is affine in d), so every weight stays
      > 0 and the primal stays convex in z, whatever rows the gaps share. The step is damped
      (Levenberg–Marquardt, J − cI − ρI with ρ raised until it holds) rather than shortened,
      because the subspace's J can be nearly flat in one combination and ask for a huge step
      there; what is left is then shortened along the line.
    * Round 1 (no J): the paper's gradient step with β, under the same rule.
    """

    #: the share of each row weight's distance to 0 one step may cover
    weight_fraction: float = 0.5

    def step(self, lam: np.ndarray, gaps: np.ndarray, jac: np.ndarray | None, constraint: ConstraintSet, *,
             epsilon: float, beta: float, c: float, previous: Previous | None = None) -> np.ndarray:
        """The new λ (:func:`dual_newton_step`; ``previous`` is not used by this rule)."""
        lam = constraint.check_multipliers(lam)
        gaps = np.atleast_1d(np.asarray(gaps, dtype=np.float64))
        d = lam[0::2] - lam[1::2]
        nonnegative = constraint.q.needs_nonnegative_weights
        if jac is None:
            step = ConstraintSet.dual_step(lam, gaps, epsilon, beta, c)
            new = step[0::2] - step[1::2]
        else:
            r, free = newton_residual(d, gaps, epsilon, c)
            new = d.copy()
            if free.any():
                jac = np.atleast_2d(np.asarray(jac, dtype=np.float64))
                M = (jac - c * np.eye(len(d)))[np.ix_(free, free)]
                A = constraint.gap_weights()
                gram = A[:, free].T @ A[:, free]
                damping = 0.0
                while True:  # Levenberg–Marquardt: damp until the step keeps the weights' share
                    new = d.copy()
                    new[free] = d[free] + range_solve(M - damping * np.eye(len(M)), -r[free], gram)
                    new = sparsest(not_across_zero(d, new), A)
                    if not nonnegative or damping > 1e12 or self.boundary_fraction(constraint, d, new - d) >= 1.0:
                        break
                    damping = max(4.0 * damping, 1e-3 * max(float(np.abs(M).max()), c))
        if nonnegative:
            new = d + self.boundary_fraction(constraint, d, new - d) * (new - d)
        return split(new)

    def boundary_fraction(self, constraint: ConstraintSet, d: np.ndarray, step: np.ndarray) -> float:
        """The largest t in (0, 1] with w(d + t·step) >= (1 − weight_fraction) w(d) on every row."""
        A = constraint.gap_weights()
        w = 1.0 / constraint.n + A @ d
        dw = A @ step
        floor = (1.0 - self.weight_fraction) * np.maximum(w, 0.0)
        falling = dw < 0
        if not falling.any():
            return 1.0
        room = (floor[falling] - w[falling]) / dw[falling]  # t where w_i reaches its floor
        return float(np.clip(room.min(), 0.0, 1.0))


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


def range_solve(M: np.ndarray, rhs: np.ndarray, gram: np.ndarray, rcond: float = 1e-10) -> np.ndarray:
    """The x in range(gram) with P M x = P rhs (P: the projector onto that range): M's solve
    on the combinations of multipliers that ``gram`` (the weight columns' Gram matrix) does
    not map to 0, the minimum-norm solution where the gaps are dependent."""
    vals, vecs = np.linalg.eigh(gram)
    keep = vals > rcond * max(float(vals.max()), np.finfo(float).tiny)
    U = vecs[:, keep]
    return U @ np.linalg.lstsq(U.T @ M @ U, U.T @ rhs, rcond=None)[0]


def sparsest(d: np.ndarray, A: np.ndarray, iters: int = 20) -> np.ndarray:
    """The d' with the same row weights (A d' = A d) and the least Σ|d'_c|: where gaps are
    dependent, the multipliers that give a weight vector are not unique, and the dual's
    −ε Σ|d_c| term prefers the fewest. Iteratively reweighted least norms; d itself where
    the columns of A are independent, and d = 0 (the least already; the reweighting would
    divide by 0 there)."""
    if not d.any():
        return d
    gram = A.T @ A
    vals, vecs = np.linalg.eigh(gram)
    null = vecs[:, vals <= 1e-10 * max(float(vals.max()), np.finfo(float).tiny)]
    if null.shape[1] == 0:
        return d
    P = np.eye(len(d)) - null @ null.T  # onto the combinations that change the weights
    target, out = P @ d, d.copy()
    tiny = 1e-12 * max(float(np.abs(d).max()), 1e-300)
    for _ in range(iters):
        # min Σ d_c²/ω_c subject to P d = target, ω = |d| from the last iterate
        omega = np.abs(out) + tiny
        N = null
        t = np.linalg.lstsq((N.T / omega) @ N, -(N.T / omega) @ target, rcond=None)[0]
        out = target + N @ t
    return out
