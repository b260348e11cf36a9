"""Block Newton with the server's subspace search (fairvfl_flwr/core/newton.py, ``optimizer = "newton"``)."""

from __future__ import annotations

import numpy as np
import pytest

from fairvfl_flwr.core.constraints import from_labels
from fairvfl_flwr.core.newton import ClippedNewton
from fairvfl_flwr.core.newton import (
    WIRE_RCOND,
    CentralisedNewton,
    block_direction,
    curvature,
    gap_directions,
    in_row_space,
    party_curvature,
    smooth_part,
    subspace_gap_jacobian,
    subspace_step,
)
from fairvfl_flwr.core.reference import NewtonFloor


def _problem(seed: int, n: int = 300, widths=(5, 3, 4), kind="deo", measure="loss"):
    rng = np.random.default_rng(seed)
    blocks = [rng.normal(size=(n, m)) for m in widths]
    true = sum(x @ rng.normal(size=x.shape[1]) for x in blocks)
    s = rng.random(n) < 0.4
    y = np.where(true - 0.8 * s + rng.normal(size=n) > 0, 1.0, -1.0)
    constraint = from_labels(y, s, protected_label=1, kind=kind, measure=measure)
    return blocks, y, constraint


def _F(y, z, du, a, B, lam, constraint, mu, alpha):
    return smooth_part(constraint, y, z + du @ alpha, lam) + mu * (a @ alpha + 0.5 * alpha @ B @ alpha)


@pytest.mark.parametrize("measure", ["loss", "rate"])
@pytest.mark.parametrize("kind", ["deo", "equalized-odds", "demographic-parity"])
def test_nu_is_the_gradient_and_h_the_curvature_of_phi_in_z(measure, kind):
    _, y, constraint = _problem(0, kind=kind, measure=measure)
    rng = np.random.default_rng(1)
    z = rng.normal(size=len(y))
    lam = rng.uniform(0, 0.05, size=constraint.num_multipliers)  # small: every row weight > 0, no clipping
    assert (constraint.signed_weights(lam) > 0).all()
    nu, h, step = constraint.masked_weights(y, z, lam), curvature(constraint, y, z, lam), 1e-5
    e = np.zeros(len(z))
    for i in rng.choice(len(z), 12, replace=False):
        e[:] = 0
        e[i] = step
        fd = (smooth_part(constraint, y, z + e, lam) - smooth_part(constraint, y, z - e, lam)) / (2 * step)
        assert abs(fd - nu[i]) < 1e-8, i
    # ν_i depends on z_i only, so φ'' is diagonal: a central difference of ν is h, row by row
    fd2 = (constraint.masked_weights(y, z + step, lam) - constraint.masked_weights(y, z - step, lam)) / (2 * step)
    if measure == "loss":
        assert np.allclose(fd2, h, atol=1e-9)
    else:
        assert np.allclose(np.maximum(fd2, 0), h, atol=1e-9)


def test_curvature_is_clipped_where_the_weight_is_negative():
    _, y, constraint = _problem(0)
    lam = np.array([0.0, 5.0])  # d = -5 makes group a's weights negative
    w = constraint.signed_weights(lam)
    assert (w < 0).any()
    h = curvature(constraint, y, np.zeros(len(y)), lam)
    assert (h >= 0).all() and (h[w < 0] == 0).all()


def test_party_curvature_from_nu_is_exact_on_rows_of_weight_one_over_n():
    _, y, constraint = _problem(2)
    z = np.random.default_rng(0).normal(size=len(y))
    lam = np.array([0.03, 0.0])
    nu, h = constraint.masked_weights(y, z, lam), curvature(constraint, y, z, lam)
    plain = np.isclose(constraint.signed_weights(lam), 1 / constraint.n)
    assert plain.sum() > 50
    assert np.allclose(party_curvature(nu, constraint.n, "nu")[plain], h[plain], rtol=1e-10, atol=0)


def test_a_gradient_keeps_its_row_space_part_and_loses_its_null_space_part():
    """Two one-hot features (each block sums to 1): xᵀν has no part along (1, 1, −1, −1), so noise
    there is dropped, and a gradient without any is returned as it came; columns of full rank keep it all."""
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    x = np.column_stack([a, 1 - a, b, 1 - b]).astype(np.float64)
    g = x.T @ rng.normal(size=200)
    null = np.array([1.0, 1.0, -1.0, -1.0]) / 2.0
    assert np.allclose(in_row_space(x, g + 1e-3 * null), g, atol=1e-12)
    assert np.allclose(in_row_space(x, g), g, atol=1e-12)
    full = rng.normal(size=(200, 3))
    noisy = full.T @ rng.normal(size=200) + 1e-3
    assert np.array_equal(in_row_space(full, noisy), noisy)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_party_is_centralised_newton(seed):
    blocks, y, constraint = _problem(seed)
    x = np.hstack(blocks)
    kw = dict(epsilon=0.01, beta=0.1, c=1e-3, mu=2 / len(y))
    fed = NewtonFloor([x], y, constraint, curvature="exact", memory=2, lr=0.0, Q=1, active=1, **kw)
    ref = CentralisedNewton(x, y, constraint, memory=2, **kw)
    for _ in range(12):
        fed.round()
        ref.round()
        assert np.allclose(fed.lam, ref.lam, atol=1e-10, rtol=0)
        assert np.allclose(np.append(fed.theta[0], fed.bias[0]), ref.theta, atol=1e-8, rtol=0)
    assert np.abs(ref.lam).max() > 1e-3  # the constraint is active: the comparison means something


def test_first_round_without_constraint_is_the_newton_direction_with_exact_line_search():
    blocks, y, constraint = _problem(3)
    x = np.hstack(blocks)
    mu = 2 / len(y)
    ref = CentralisedNewton(x, y, constraint, epsilon=0.01, beta=0.1, c=1e-3, mu=mu, fairness=False)
    ref.round()
    xb = np.hstack([x, np.ones((len(y), 1))])
    z = np.zeros(len(y))
    p = 0.5
    hess = xb.T @ (p * (1 - p) / len(y) * xb) + mu * np.eye(xb.shape[1])
    step = -np.linalg.solve(hess, xb.T @ (-y * 0.5 / len(y)))
    cos = ref.theta @ step / np.linalg.norm(ref.theta) / np.linalg.norm(step)
    assert cos > 1 - 1e-12  # along the Newton direction, its length chosen by the search
    lam = np.zeros(2)
    slope = (xb.T @ constraint.masked_weights(y, xb @ ref.theta, lam) + mu * ref.theta) @ step
    assert abs(slope) < 1e-10  # the length is the exact minimiser along the direction


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_subspace_step_never_increases_F_even_where_undamped_steps_do(seed):
    rng = np.random.default_rng(seed)
    blocks, y, constraint = _problem(seed)
    blocks = blocks + [blocks[0] + 0.01 * rng.normal(size=blocks[0].shape) for _ in range(4)]  # near-equal columns
    mu = 2 / len(y)
    lam = np.array([0.0, rng.uniform(0, 3)])  # may make some weights negative: F then non-convex
    thetas = [rng.normal(scale=0.3, size=x.shape[1]) for x in blocks]
    z = sum(x @ t for x, t in zip(blocks, thetas))
    nu, h = constraint.masked_weights(y, z, lam), curvature(constraint, y, z, lam)
    dirs = []
    for x, t in zip(blocks, thetas):
        hess = x.T @ (h[:, None] * x) + mu * np.eye(x.shape[1])
        dirs.append(-np.linalg.solve(hess, x.T @ nu + mu * t))
    du = np.column_stack([x @ d for x, d in zip(blocks, dirs)])
    a = np.array([t @ d for t, d in zip(thetas, dirs)])
    B = np.diag([d @ d for d in dirs])
    alpha = subspace_step(y, z, du, a, B, lam, constraint, mu)
    f0 = _F(y, z, du, a, B, lam, constraint, mu, np.zeros(len(dirs)))
    assert _F(y, z, du, a, B, lam, constraint, mu, alpha) < f0
    # five parties with near-equal columns: simultaneous full block steps go five times too far
    assert _F(y, z, du, a, B, lam, constraint, mu, np.ones(len(dirs))) > f0


def test_subspace_gap_jacobian_matches_finite_differences():
    blocks, y, constraint = _problem(4)
    mu, rng = 2 / len(y), np.random.default_rng(4)
    thetas = [rng.normal(scale=0.2, size=x.shape[1]) for x in blocks]
    z = sum(x @ t for x, t in zip(blocks, thetas))
    dirs = [rng.normal(size=x.shape[1]) for x in blocks]
    du = np.column_stack([x @ d for x, d in zip(blocks, dirs)])
    a = np.array([t @ d for t, d in zip(thetas, dirs)])
    b = np.array([d @ d for d in dirs])

    def gap_at(dd):
        lam = np.array([max(dd, 0.0), max(-dd, 0.0)])
        alpha = subspace_step(y, z, du, a, b, lam, constraint, mu, iters=50, tol=1e-15)
        return constraint.gaps(y, z + du @ alpha)[0], z + du @ alpha, lam

    d0, step = 0.05, 1e-5
    _, z0, lam0 = gap_at(d0)
    jac = subspace_gap_jacobian(y, z0, du, b, lam0, constraint, mu)
    fd = (gap_at(d0 + step)[0] - gap_at(d0 - step)[0]) / (2 * step)
    assert jac.shape == (1, 1) and jac[0, 0] < 0
    assert abs(jac[0, 0] - fd) < 1e-5 * (1 + abs(fd))
    assert gap_directions(constraint, y, z0).shape == (len(y), 1)


def test_clipped_newton_keeps_weights_nonnegative_and_does_not_cross_the_kink():
    _, y, constraint = _problem(5, kind="equalized-odds")
    lo, hi = constraint.weight_bounds()
    lam = np.array([0.02, 0.0, 0.0, 0.01])
    # tiny sensitivities ask for huge steps: clipped to the bounds
    out = ClippedNewton().newton(lam, np.array([0.5, -0.5]), np.diag([-1e-6, -1e-6]), constraint, epsilon=0.01, c=1e-3)
    d = out[0::2] - out[1::2]
    assert np.allclose(d, [hi[0], lo[1]]) and (constraint.signed_weights(out) >= -1e-15).all()
    # a gap on the other side: d moves toward 0 and stops there, it does not jump across
    out = ClippedNewton().newton(lam, np.array([-0.5, 0.5]), np.diag([-1e-3, -1e-3]), constraint, epsilon=0.01, c=1e-3)
    assert np.allclose(out, 0.0)
    # inside the band at d = 0 nothing moves
    out = ClippedNewton().newton(np.zeros(4), np.array([0.005, -0.002]), -np.eye(2), constraint, epsilon=0.01, c=1e-3)
    assert np.allclose(out, 0.0)
    # the Newton step solves a linear gap exactly: D(d) = D0 + J d reaches ε
    out = ClippedNewton().newton(np.zeros(4), np.array([0.11, 0.0]), np.diag([-2.0, -2.0]), constraint, epsilon=0.01, c=0.0)
    assert np.isclose(out[0], 0.05) and np.allclose(out[1:], 0.0)
    assert np.allclose(constraint.project(np.array([-1.0, 0.0, 0.0, 0.0])), 0.0)


def test_a_step_from_the_weight_bound_moves_d_by_a_share_of_the_bounds_width_at_most():
    _, y, constraint = _problem(5)
    lo, hi = constraint.weight_bounds()
    width = (hi - lo)[0]
    at_bound = np.array([hi[0], 0.0])
    # a huge gap on the other side (a group's loss grown past 40) would throw d across both bounds
    thrown = np.array([0.0, hi[0] + 10 * width])
    out = ClippedNewton().past_bound(at_bound, thrown, constraint)
    assert np.isclose(out[0] - out[1], hi[0] - ClippedNewton().past_bound_share * width)
    assert (out >= 0).all()
    # a moderate step (the measured datasets' past-bound steps) is left exactly as it was
    small = np.array([hi[0] + 0.01 * width, 0.0])
    assert ClippedNewton().past_bound(at_bound, small, constraint) is small


@pytest.mark.parametrize("curv", ["nu", "const", "exact"])
def test_federated_newton_decreases_the_primal_at_fixed_multipliers(curv):
    blocks, y, constraint = _problem(6, widths=(4, 3, 3, 2))
    fl = NewtonFloor(blocks, y, constraint, curvature=curv, epsilon=0.01, beta=0.0, c=1e-3, mu=2 / len(y), lr=0.0, Q=1,
                     active=1, fairness=False)
    values = []
    for _ in range(10):
        fl.round()
        reg = sum(t @ t for t in fl.theta) + sum(b * b for b in fl.bias if b is not None)
        values.append(smooth_part(constraint, y, fl.z(), fl.lam) + 0.5 * fl.mu * reg)
    assert all(b <= a + 1e-15 for a, b in zip(values, values[1:]))


def test_the_search_does_not_turn_float32_rounding_into_step_lengths():
    """At convergence, nearly collinear directions whose logits came as float32: the server's
    record of the move (float32 logits times α) must equal the party's exact move."""
    rng = np.random.default_rng(0)
    n = 400
    x = rng.normal(size=(n, 4))
    s = rng.random(n) < 0.4
    y = np.where(x @ np.array([1.0, -0.5, 0.3, 0.2]) + rng.normal(size=n) > 0, 1.0, -1.0)
    constraint = from_labels(y, s, protected_label=1, kind="deo", measure="loss")
    lam, mu, theta = np.zeros(2), 2 / n, np.zeros(4)
    for _ in range(30):  # the block's optimum: the new direction is ~0, as late in a run
        z = x @ theta
        theta = theta + block_direction(x, constraint.masked_weights(y, z, lam), curvature(constraint, y, z, lam), theta, mu)
    z = x @ theta
    drift = {}
    for rcond in (1e-12, WIRE_RCOND["float32"]):
        worst = 0.0
        for eps in (1e-4, 1e-5, 1e-6):
            base = rng.normal(size=4)
            D = np.column_stack([1e-9 * rng.normal(size=4), base, base + eps * rng.normal(size=4)])
            du64 = x @ D
            du32 = du64.astype(np.float32).astype(np.float64)  # what the server received
            a, B = theta @ D, D.T @ D
            alpha = subspace_step(y, z, du32, a, B, lam, constraint, mu, rcond=rcond)
            if rcond > 1e-12:  # the true F (exact logits) does not increase; under the float64 cut-off it may
                assert _F(y, z, du64, a, B, lam, constraint, mu, alpha) <= _F(y, z, du64, a, B, lam, constraint, mu, 0 * alpha)
            worst = max(worst, float(np.abs(du64 @ alpha - du32 @ alpha).max()))
        drift[rcond] = worst
    assert drift[WIRE_RCOND["float32"]] <= 1e-9
    assert drift[1e-12] > 1e-6  # the exact method's cut-off amplifies the rounding (what the test guards)
