"""Block Newton's dual step where gaps share rows or must keep every weight > 0
(core/dual_newton.FractionToBoundary): equalized odds, demographic parity, several groups."""

from __future__ import annotations

import numpy as np
import pytest

from fairvfl_flwr.core.constraints import ConstraintSet
from fairvfl_flwr.core.dual_newton import ClippedNewton, FractionToBoundary, dual_newton_step, rule_for
from fairvfl_flwr.core.newton import subspace_gap_jacobian
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.data.problem import party_problem

from .test_groups import group_rows



def _jacobian(y, z, groups, rng, lam, directions=6):
    du = rng.normal(size=(len(y), directions))
    return subspace_gap_jacobian(y, z, du, np.eye(directions), lam, groups, mu=2 / len(y))


def test_dependent_gaps_give_a_finite_step_with_the_fewest_multipliers():
    """Three groups, pairwise: D_ab + D_bc = D_ac, so J is singular; the step is solved on
    the combinations of multipliers that change the row weights."""
    y, s, z, rng = group_rows(G=3)
    groups = ConstraintSet.from_labels(y, s, 1, "deo")
    assert len(groups.constraints) == 3 and isinstance(rule_for(groups), FractionToBoundary)
    lam = np.zeros(6)
    jac = _jacobian(y, z, groups, rng, lam)
    assert np.linalg.matrix_rank(jac, tol=1e-10 * np.abs(jac).max()) == 2
    gaps = groups.gaps(y, z)
    out = FractionToBoundary().step(lam, gaps, jac, groups, epsilon=0.01, beta=0.1, c=1e-3)
    assert np.isfinite(out).all() and (out >= 0).all() and np.abs(out).max() > 0
    d = out[0::2] - out[1::2]
    null = np.array([1.0, -1.0, 1.0]) / np.sqrt(3)  # d_ab − d_ac + d_bc: no row weight changes
    assert np.allclose(groups.gap_weights() @ null, 0.0, atol=1e-15)
    # of the multipliers that give these weights, the step keeps those with the least Σ|d_c|
    # (the dual's −ε Σ|d_c| term): moving along the null direction only adds to it
    for t in np.linspace(-0.1, 0.1, 41):
        assert np.abs(d + t * null).sum() >= np.abs(d).sum() - 1e-9


def test_each_step_keeps_every_weight_above_a_share_of_its_value():
    """Sensitivities that ask for huge steps: the step is damped until no row keeps less than
    1 − weight_fraction of its weight, on rows that sit on several gaps' sides."""
    y, s, z, rng = group_rows(1, G=4)
    groups = ConstraintSet.from_labels(y, s, 1, "equalized-odds")
    assert groups.gaps_per_row() == 3
    lam = np.zeros(groups.num_multipliers)
    gaps = np.where(np.arange(len(groups.constraints)) % 2 == 0, 0.5, -0.5)
    tiny = -1e-6 * np.eye(len(gaps))
    for _ in range(5):
        w_before = groups.signed_weights(lam)
        lam = FractionToBoundary().step(lam, gaps, tiny, groups, epsilon=0.01, beta=0.1, c=1e-3)
        w = groups.signed_weights(lam)
        assert (w >= (1 - FractionToBoundary().weight_fraction) * w_before * (1 - 1e-9)).all()
        assert np.abs(w - w_before).max() > 0.01 * w_before.max()  # damped, not stopped
    assert (groups.signed_weights(lam) > 0).all()


@pytest.mark.parametrize("measure", ["rate", "loss"])
def test_a_step_back_to_zero_multipliers_is_taken(measure):
    """Three groups: the one gap with a multiplier is met far inside ε, the others rest inside
    it, so the Newton step stops every d_c at 0 (the dual's kink). The fewest multipliers for
    the weights 1/n are none, and the step says so (it once divided by |d| = 0 there)."""
    y, s, z, _ = group_rows(5, G=3)
    groups = ConstraintSet.from_labels(y, s, 1, "deo", measure)
    lam = np.array([0.0, 0.0, 0.0, 0.0, 0.01, 0.0])
    gaps = np.array([0.001, -0.002, -0.5])
    out = FractionToBoundary().step(lam, gaps, -1e-2 * np.eye(3), groups, epsilon=0.01, beta=0.1, c=1e-3)
    assert np.array_equal(out, np.zeros(6))  # every weight back at 1/n: none falls, so the whole step


def test_round_one_gradient_step_keeps_the_weights_positive_too():
    y, s, z, _ = group_rows(2, G=3)
    groups = ConstraintSet.from_labels(y, s, 1, "deo")
    out = dual_newton_step(np.zeros(6), groups.gaps(y, z), None, groups, epsilon=0.01, beta=1e4, c=1e-3)
    assert (groups.signed_weights(out) > 0).all() and np.abs(out).max() > 0


@pytest.mark.parametrize("constraint", ["equalized-odds", "demographic-parity"])
def test_two_groups_equalized_odds_and_parity_take_the_fraction_to_the_boundary_step(constraint):
    y, s, z, rng = group_rows(3, G=2)
    groups = ConstraintSet.from_labels(y, s == 0, 1, constraint)
    assert groups.gaps_per_row() == 1 and isinstance(rule_for(groups), FractionToBoundary)
    lam = np.zeros(groups.num_multipliers)
    jac = _jacobian(y, z, groups, rng, lam)
    gaps = groups.gaps(y, z)
    out = dual_newton_step(lam, groups.gaps(y, z), jac, groups, epsilon=0.01, beta=0.1, c=1e-3)
    # where the plain Newton step leaves every weight well above 0, it is that step
    plain = ClippedNewton().newton(lam, gaps, jac, groups, epsilon=0.01, c=1e-3)
    if FractionToBoundary().boundary_fraction(groups, np.zeros(len(gaps)), plain[0::2] - plain[1::2]) == 1.0:
        np.testing.assert_allclose(out, plain, rtol=1e-10, atol=1e-14)
    assert (groups.signed_weights(out) > 0).all()


def test_deo_with_two_groups_keeps_its_clipped_step_bit_for_bit():
    """The paper's case: the step clipped to the weight bounds, past them by gradient."""
    y, s, z, rng = group_rows(4, G=2)
    groups = ConstraintSet.from_labels(y, s == 0, 1, "deo")
    assert isinstance(rule_for(groups), ClippedNewton)
    lam = np.array([0.0, 0.05])
    jac = _jacobian(y, z, groups, rng, lam)
    gaps = groups.gaps(y, z)
    out = dual_newton_step(lam, groups.gaps(y, z), jac, groups, epsilon=0.01, beta=0.1, c=1e-3)
    np.testing.assert_array_equal(out, ClippedNewton().newton(lam, gaps, jac, groups, epsilon=0.01, c=1e-3))
    assert np.array_equal(dual_newton_step(np.zeros(2), groups.gaps(y, z), None, groups, epsilon=0.01, beta=0.1, c=1e-3),
                          groups.project(np.maximum(0.0, 0.1 * np.array([gaps[0] - 0.01, -gaps[0] - 0.01]))))


def test_newton_meets_equalized_odds_within_thirty_rounds(run_app, tmp_path):
    """Through the ServerApp and ClientApp (float32 wire): both gaps <= ε + 0.002 at the end
    of a Newton run of at most 30 rounds (COMPAS; docs/results/rounds-newton-coupled.md)."""
    run = run_app({"dataset": "compas", "constraint": "equalized-odds", "constraint-measure": "loss",
                   "sensitive-as-input": True, "optimizer": "newton", "num-parties": 3,
                   "num-server-rounds": 30, "eval-every": 30, "output-dir": str(tmp_path)})
    last = run.history[-1]
    assert len(last["gaps"]) == 2 and last["round"] <= 30
    assert max(abs(g) for g in last["gaps"].values()) <= 0.01 + 0.002, last["gaps"]


def test_newton_runs_with_several_groups_and_keeps_every_weight_positive(run_app, tmp_path):
    """Four pooled COMPAS races, six dependent gaps: no longer refused, and the dual step
    keeps every row weight > 0 while the largest gap comes down."""
    run = run_app({"dataset": "compas-race", "pool-small-groups": True, "optimizer": "newton", "num-parties": 3,
                   "num-server-rounds": 8, "eval-every": 8, "stop-tolerance": 0.0, "sensitive-as-input": True,
                   "output-dir": str(tmp_path)})
    first, last = run.history[1], run.history[-1]
    assert len(last["gaps"]) == 6 and last["round"] == 8
    assert max(abs(g) for g in last["gaps"].values()) < 0.5 * max(abs(g) for g in first["gaps"].values())
    # the row weights follow from the recorded λ and the run's groups
    _, _, groups = party_problem(RunConfig.from_flower({"dataset": "compas-race", "pool-small-groups": True,
                                                        "num-parties": 3}))
    for row in run.history[1:]:
        assert (groups.signed_weights(np.asarray(row["lambdas"])) > 0).all(), row["round"]


@pytest.mark.parametrize("extra", [
    {"privacy.label-dp-epsilon": 8.0, "privacy.label-dp-lambda-bound": 0.5},
    {"privacy.secure-aggregation": True},
], ids=["label-dp", "secure-aggregation"])
def test_newton_with_several_groups_runs_under_label_dp_and_secure_aggregation(run_app, tmp_path, extra):
    """Label DP bounds λ and secure aggregation shares the step lengths: both need nothing of
    the dual step but λ, so Newton runs with dependent gaps, every row weight > 0."""
    run = run_app({"dataset": "compas-race", "pool-small-groups": True, "optimizer": "newton", "num-parties": 3,
                   "num-server-rounds": 4, "eval-every": 4, "stop-tolerance": 0.0, "output-dir": str(tmp_path),
                   **extra})
    last = run.history[-1]
    assert last["round"] == 4 and len(last["gaps"]) == 6 and np.isfinite(last["loss"])
    _, _, groups = party_problem(RunConfig.from_flower({"dataset": "compas-race", "pool-small-groups": True,
                                                        "num-parties": 3}))
    for row in run.history[1:]:
        assert (groups.signed_weights(np.asarray(row["lambdas"])) > 0).all(), row["round"]
    if "privacy.label-dp-lambda-bound" in extra:
        assert max(last["lambdas"]) <= 0.5
