"""The server's step of a round, in one place: the app, the centralised reference and
every benchmark floor call this function, so they run the same algorithm.

The dual step is the paper's projected gradient ascent on λ (:func:`dual_step`); block
Newton's dual step (core/newton.dual_newton_step) takes it too before it has a Jacobian."""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.constraints import ConstraintSet, as_multipliers


def dual_step(lam: np.ndarray, gap, epsilon: float, beta: float, c: float) -> np.ndarray:
    """The paper's projected ascent on f̃: ``λ_c± ← max(0, λ_c± + β (-c λ_c± ± D_c - ε))`` for every gap."""
    gaps = np.atleast_1d(np.asarray(gap, dtype=np.float64))
    lam = as_multipliers(lam, len(gaps))
    grad = np.empty_like(lam)
    grad[0::2] = -c * lam[0::2] + gaps - epsilon
    grad[1::2] = -c * lam[1::2] - gaps - epsilon
    return np.maximum(0.0, lam + beta * grad)


def server_step(
    lam: np.ndarray,
    y: np.ndarray,
    z: np.ndarray,
    constraint: ConstraintSet,
    *,
    epsilon: float,
    beta: float,
    c: float,
    fairness: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Projected ascent on λ from the constraint gaps at ``z``, then ν at the new λ.

    ``fairness=False`` keeps λ as it is (the unconstrained baseline: λ stays 0).
    Returns ``(λ, ν)``.
    """
    if fairness:
        lam = dual_step(lam, constraint.gaps(y, z), epsilon, beta, c)
    return lam, constraint.masked_weights(y, z, lam)
