"""The server's step of a round, in one place: the app, the centralised reference and
every benchmark floor call this function, so they run the same algorithm."""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.constraints import ConstraintSet


def server_step(
    lam: np.ndarray,
    y: np.ndarray,
    z: np.ndarray,
    groups: ConstraintSet,
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
        lam = ConstraintSet.dual_step(lam, groups.gaps(y, z), epsilon, beta, c)
    return lam, groups.masked_weights(y, z, lam)
