"""Groups released through randomized response: the flip matrix, and the correction that makes
every group sum, gap and ν weight computed from the release an unbiased estimate of the true one."""

from __future__ import annotations

import numpy as np
import pytest

from fairvfl_flwr.core.constraints import SensitiveGroups, from_labels
from fairvfl_flwr.core.constraints.release import (RandomizedResponse, ReleaseMargin, SpreadGap, gap_error_slopes,
                                                   gap_errors, membership_weights, row_draws)
from fairvfl_flwr.core.newton import smooth_part


@pytest.mark.parametrize("epsilon,k", [(1.0, 2), (2.0, 3), (4.0, 6)])
def test_flip_matrix_rows_sum_to_one_and_keep_is_the_diagonal(epsilon, k):
    rr = RandomizedResponse(epsilon, k)
    P = rr.matrix()
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    np.testing.assert_allclose(np.diag(P), np.exp(epsilon) / (np.exp(epsilon) + k - 1))
    # the LDP ratio: no released value is more than e^ε likelier under one true group than another
    assert P.max(axis=0).max() / P.min(axis=0).min() == pytest.approx(np.exp(epsilon))
    np.testing.assert_allclose(rr.correction() @ P, np.eye(k), atol=1e-12)


def test_release_keeps_each_group_at_the_declared_rate():
    rr = RandomizedResponse(1.0, 3)
    codes = np.repeat(np.arange(3), 20_000)
    out = rr.release(codes, np.random.default_rng(0))
    observed = np.array([[np.mean(out[codes == i] == j) for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(observed, rr.matrix(), atol=0.01)


def test_a_row_is_released_alike_whatever_rows_split_or_order_come_with_it():
    """The draws are a keyed hash of the row's id alone: a server that changes the aligned rows,
    the split or the order to get fresh draws of one row gets its same value again."""
    rr = RandomizedResponse(1.0, 3)
    ids = np.array([f"id-{i}" for i in range(3000)])
    codes = np.arange(3000) % 3
    one = rr.apply(codes, *row_draws(b"registry secret", ids, rr))
    order = np.random.default_rng(1).permutation(3000)[:1700]  # another subset, in another order
    again = rr.apply(codes[order], *row_draws(b"registry secret", ids[order], rr))
    assert np.array_equal(one[order], again)
    other = rr.apply(codes, *row_draws(b"another secret", ids, rr))
    assert np.mean(one != other) > 0.2  # a different secret draws differently
    at_two = rr.apply(codes, *row_draws(b"registry secret", ids, RandomizedResponse(2.0, 3)))
    assert not np.array_equal(one, at_two)  # another epsilon_S is another release (the ledger counts it)


def test_keyed_draws_keep_each_group_at_the_declared_rate():
    rr = RandomizedResponse(1.0, 3)
    codes = np.repeat(np.arange(3), 20_000)
    out = rr.apply(codes, *row_draws(b"s" * 32, np.arange(len(codes)), rr))
    observed = np.array([[np.mean(out[codes == i] == j) for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(observed, rr.matrix(), atol=0.01)


@pytest.mark.parametrize("epsilon,k", [(1.0, 2), (1.0, 4), (4.0, 3)])
def test_corrected_group_sums_are_unbiased(epsilon, k):
    """Monte Carlo: the mean over releases of Σ_r W[r, g] q_r and Σ_r W[r, g] is group g's true sum
    and count, within 4 standard errors; the uncorrected sums over the released groups are not."""
    rng = np.random.default_rng(1)
    n, draws = 3000, 600
    s = rng.integers(0, k, n)
    q = rng.random(n) + 0.5 * s
    rr = RandomizedResponse(epsilon, k)
    sums, counts, naive = [], [], []
    for _ in range(draws):
        released = rr.release(s, rng)
        W = membership_weights(rr, released)
        sums.append(W.T @ q)
        counts.append(W.sum(axis=0))
        naive.append(np.array([q[released == g].sum() for g in range(k)]))
    true_sums = np.array([q[s == g].sum() for g in range(k)])
    true_counts = np.bincount(s, minlength=k)
    for est, truth in ((np.array(sums), true_sums), (np.array(counts), true_counts)):
        se = est.std(axis=0) / np.sqrt(draws)
        assert np.all(np.abs(est.mean(axis=0) - truth) < 4 * se + 1e-9)
    naive = np.array(naive)
    assert np.any(np.abs(naive.mean(axis=0) - true_sums) > 10 * naive.std(axis=0) / np.sqrt(draws))


@pytest.mark.parametrize("kind,measure", [("deo", "loss"), ("demographic-parity", "rate"),
                                          ("equalized-odds", "rate")])
def test_corrected_gaps_track_the_true_gaps(kind, measure):
    """Every kind's gaps from the release, averaged over releases, are the true groups' gaps;
    the soft constraint's ν is ∂(its own f̃)/∂z, as the exact one's is."""
    rng = np.random.default_rng(2)
    n, k = 6000, 3
    s = rng.integers(0, k, n)
    y = np.where(rng.random(n) < 0.4 + 0.1 * s, 1, -1)
    z = rng.normal(size=n) + 0.4 * s
    rr = RandomizedResponse(2.0, k)
    exact = from_labels(y, s, 1, kind, measure)
    gaps = []
    for _ in range(200):
        soft = from_labels(y, rr.release(s, rng), 1, kind, measure, weights=rr.correction())
        gaps.append(soft.gaps(y, z))
    gaps = np.array(gaps)
    # ratio estimates: unbiased up to O(1/n), far below the spread of one release
    np.testing.assert_allclose(gaps.mean(axis=0), exact.gaps(y, z), atol=4 * gaps.std(axis=0).max() / np.sqrt(200) + 2e-3)
    lam = rng.random(soft.num_multipliers) * 0.01
    nu = soft.masked_weights(y, z, lam)
    h = 1e-6
    for i in rng.choice(n, 5, replace=False):
        dz = np.zeros(n)
        dz[i] = h
        numeric = (smooth_part(soft, y, z + dz, lam) - smooth_part(soft, y, z - dz, lam)) / (2 * h)
        assert nu[i] == pytest.approx(numeric, rel=1e-5, abs=1e-10)


@pytest.mark.parametrize("kind,measure,k,form", [("deo", "loss", 2, "pairwise"), ("equalized-odds", "rate", 3, "pairwise"),
                                                  ("demographic-parity", "rate", 3, "overall")])
def test_the_releases_error_on_each_gap_is_the_spread_of_its_estimate_over_releases(kind, measure, k, form):
    """Over fresh releases of the same rows, each gap's estimate spreads by the error
    :func:`gap_errors` gives from one release: never more than a quarter above it, and it takes
    each row at the largest variance over its possible groups, so it may be somewhat below."""
    rng = np.random.default_rng(4)
    n = 8000
    s = rng.integers(0, k, n)
    y = np.where(rng.random(n) < 0.4 + 0.1 * s, 1, -1)
    z = rng.normal(size=n) + 0.4 * s
    rr = RandomizedResponse(1.0, k)
    gaps, errors = [], []
    for _ in range(150):
        soft = from_labels(y, rr.release(s, rng), 1, kind, measure, weights=rr.correction(), form=form)
        gaps.append(soft.gaps(y, z))
        errors.append(gap_errors(soft, rr, soft.q.values(y, z)))
    spread, error = np.array(gaps).std(axis=0), np.array(errors).mean(axis=0)
    assert np.all(error > 0.002)  # a release at ε_S = 1 on 8,000 rows: far from exact
    np.testing.assert_array_less(0.7 * error, spread)
    np.testing.assert_array_less(spread, 1.25 * error)
    assert not np.any(gap_errors(from_labels(y, s, 1, kind, measure, form=form), rr, soft.q.values(y, z)))


@pytest.mark.parametrize("kind,measure,k,form", [("deo", "loss", 2, "pairwise"), ("equalized-odds", "rate", 3, "pairwise"),
                                                  ("demographic-parity", "rate", 3, "overall")])
def test_the_errors_slope_is_its_derivative_and_a_plane_through_zero(kind, measure, k, form):
    """∂S_c/∂q (gap_error_slopes) against central differences; S_c is convex and of degree 1 in q,
    so the slope at q gives S_c(q) exactly (Euler) and at most S_c(q') elsewhere, and a shift of
    every row's value by the same amount moves nothing."""
    rng = np.random.default_rng(6)
    n = 600
    s = rng.integers(0, k, n)
    y = np.where(rng.random(n) < 0.4 + 0.1 * s, 1, -1)
    rr = RandomizedResponse(1.0, k)
    soft = from_labels(y, rr.release(s, rng), 1, kind, measure, weights=rr.correction(), form=form)
    q = soft.q.values(y, rng.normal(size=n) + 0.4 * s)
    slopes, errors = gap_error_slopes(soft, rr, q), gap_errors(soft, rr, q)
    np.testing.assert_allclose(q @ slopes, errors, rtol=1e-10)  # Euler
    np.testing.assert_allclose(slopes.sum(axis=0), 0.0, atol=1e-10)  # centred: a constant shift moves nothing
    h = 1e-6
    for i in rng.choice(n, 6, replace=False):
        dq = np.zeros(n)
        dq[i] = h
        numeric = (gap_errors(soft, rr, q + dq) - gap_errors(soft, rr, q - dq)) / (2 * h)
        np.testing.assert_allclose(slopes[i], numeric, rtol=1e-5, atol=1e-9)
    for _ in range(5):  # a supporting plane: below S_c at every other point
        other = q + rng.normal(scale=0.3, size=n)
        np.testing.assert_array_less(other @ slopes, gap_errors(soft, rr, other) + 1e-12)
    # the same value on every row (a run's first scores): S_c is 0 but for rounding, and so is its slope
    assert not np.any(gap_error_slopes(soft, rr, np.full(n, q[0])))


def _three_groups_released(seed: int, n: int, epsilon_s: float):
    """n rows in three groups, labels at random, the groups released at ``epsilon_s``: (rng, n, true
    groups, labels, the release, equalized odds on the rate measure over the release)."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 3, n)
    y = np.where(rng.random(n) < 0.5, 1, -1)
    rr = RandomizedResponse(epsilon_s, 3)
    return rng, n, s, y, rr, from_labels(y, rr.release(s, rng), 1, "equalized-odds", "rate", weights=rr.correction())


def test_a_release_margin_adds_a_spread_gap_per_gap_that_its_bound_holds():
    """Each gap's spread gap is scale · S_c, scale = ε · 2 / margin, so |value| <= ε exactly where
    2 S_c <= margin; before a slope is taken it adds nothing to the rows' weights, after it the
    weights carry d · its slope."""
    rng, n, s, y, rr, soft = _three_groups_released(7, 900, 2.0)
    margin = ReleaseMargin(0.01, 0.02)
    held = margin.apply(soft, rr)
    C = len(soft.gap_list)
    assert len(held.gap_list) == 2 * C and held.num_multipliers == 4 * C and not held.linear
    assert all(isinstance(g, SpreadGap) and g.name == f"{f.name} (release spread)"
               for f, g in zip(soft.gap_list, held.gap_list[C:]))
    z = rng.normal(size=n) + 0.5 * s
    q = held.q.values(y, z)
    np.testing.assert_allclose(held.gaps(y, z)[C:], margin.scale * gap_errors(soft, rr, q), rtol=1e-12)
    np.testing.assert_allclose(held.gaps(y, z)[:C], soft.gaps(y, z))
    np.testing.assert_allclose(gap_errors(held, rr, q), gap_errors(soft, rr, q))  # the fairness gaps' errors only
    lam = np.zeros(held.num_multipliers)
    lam[2 * C] = 0.3  # the first spread gap's upper multiplier
    np.testing.assert_allclose(held.signed_weights(lam), 1.0 / n)  # no slope yet: nothing asked of the weights
    at = held.linearised(y, z)
    assert all(a is b for a, b in zip(at.gap_list[:C], held.gap_list[:C])) and at.linearised(y, z) is not at
    # the weights carry d · slope: at the reference the constraint's part of f̃ is d · value (Euler), below it elsewhere
    assert at.constraint_term(lam, q) == pytest.approx(0.3 * at.gaps(y, z)[C], rel=1e-10)
    other = held.q.values(y, z + rng.normal(size=n))
    assert at.constraint_term(lam, other) < 0.3 * at.gap_list[C].value(other)
    assert soft.linearised(y, z) is soft  # every gap linear: the constraint itself
    exact = from_labels(y, s, 1, "equalized-odds", "rate")
    assert margin.apply(exact, rr) is exact  # exact groups: no error to bound


def test_a_spread_gaps_bend_is_its_curvature_along_the_given_directions():
    """SpreadGap.bend (what block Newton's model adds for a held spread) against central second
    differences of its value along three random directions of the rows' values."""
    rng, n, s, y, rr, soft = _three_groups_released(8, 500, 1.0)
    gap = ReleaseMargin(0.01, 0.02).apply(soft, rr).gap_list[-1]
    q, dq, h = rng.random(n), rng.normal(size=(n, 3)), 1e-4

    def second(i: int, j: int) -> float:
        def f(a: float, b: float) -> float:
            return gap.value(q + a * dq[:, i] + b * dq[:, j])
        return (f(h, h) - f(h, -h) - f(-h, h) + f(-h, -h)) / (4 * h * h)

    numeric = np.array([[second(i, j) for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(gap.bend(q, dq), numeric, rtol=1e-5, atol=1e-6 * np.abs(numeric).max())
    assert np.all(np.linalg.eigvalsh(gap.bend(q, dq)) > -1e-12)  # a norm's: PSD


def test_the_releases_error_holds_for_groups_the_server_pooled():
    """Two groups of 1 % each, pooled by the server from the release's estimated counts (with the
    next smallest while still under min-group-size): the error of the pooled group's gaps is again
    the spread of the estimates over fresh releases."""
    rng = np.random.default_rng(5)
    n = 8000
    s = rng.choice(4, size=n, p=[0.39, 0.59, 0.01, 0.01])
    y = np.where(rng.random(n) < 0.4 + 0.1 * (s == 0), 1, -1)
    z = rng.normal(size=n) + 0.4 * (s == 0)
    rr = RandomizedResponse(4.0, 4)
    gaps, errors, names = [], [], set()
    for _ in range(150):
        soft = from_labels(y, rr.release(s, rng), 1, "equalized-odds", "rate", weights=rr.correction(),
                           min_group_size=300, pool_small_groups=True)
        names.add(soft.groups.names)
        gaps.append(soft.gaps(y, z))
        errors.append(gap_errors(soft, rr, soft.q.values(y, z)))
    assert len(names) == 1 and len(next(iter(names))) == 2  # the same pooling in every release: 1 against 0 + 2 + 3
    spread, error = np.array(gaps).std(axis=0), np.array(errors).mean(axis=0)
    np.testing.assert_array_less(0.7 * error, spread)
    np.testing.assert_array_less(spread, 1.25 * error)


def test_exact_groups_have_no_weights_and_pooling_merges_released_weights():
    s = np.array([0, 1, 2, 2, 1, 0])
    exact = SensitiveGroups.of(s, ("a", "b", "c"))
    assert exact.exact and np.array_equal(exact.weight(1), (s == 1).astype(float))
    rr = RandomizedResponse(1.0, 3)
    soft = SensitiveGroups.of(s, ("a", "b", "c"), rr.correction())
    pooled = soft.pooled([1, 2])
    assert pooled.names == ("a", "b + c")
    np.testing.assert_allclose(pooled.weight(1), soft.weight(1) + soft.weight(2))
    # the weights of every group sum to 1 on each row: the estimated group sizes add up to n
    np.testing.assert_allclose(sum(soft.weight(g) for g in range(3)), 1.0)


def test_weight_bounds_keep_every_row_weight_non_negative_under_soft_groups():
    rng = np.random.default_rng(3)
    n = 2000
    s = rng.integers(0, 2, n)
    y = np.where(rng.random(n) < 0.5, 1, -1)
    rr = RandomizedResponse(1.0, 2)
    soft = from_labels(y, rr.release(s, rng), 1, "deo", "loss", weights=rr.correction())
    lo, hi = soft.weight_bounds()
    for d in (lo[0], hi[0]):
        lam = np.array([max(d, 0.0), max(-d, 0.0)])
        assert soft.signed_weights(lam).min() >= -1e-15
    beyond = np.array([hi[0] * 1.5, 0.0])
    assert soft.signed_weights(beyond).min() < 0
