"""Block Newton where gaps share rows, several groups or the rate measure: the server's
constrained search (core/newton.constrained_step, core/newton.ConstrainedSearch)."""

from __future__ import annotations

import numpy as np
import pytest

from fairvfl_flwr.core.constraints import from_labels, gap_weights
from fairvfl_flwr.core.newton import ClippedNewton, ConstrainedSearch, dual_newton_step, rule_for
from fairvfl_flwr.core.newton import LAM_MAX, constrained_step, held_step, subspace_gap_jacobian, subspace_step
from fairvfl_flwr.core.constraints.measures import logistic_loss
from fairvfl_flwr.config import RunConfig

from .test_groups import group_rows


def _jacobian(y, z, constraint, rng, lam, directions=6):
    du = rng.normal(size=(len(y), directions))
    return subspace_gap_jacobian(y, z, du, np.eye(directions), lam, constraint, mu=2 / len(y))


def _search_problem(seed, G, kind, measure):
    """Rows with a feature that separates the labels and differs by group, directions along it."""
    y, s, _, rng = group_rows(seed, G=G)
    constraint = from_labels(y, s, 1, kind, measure)
    x = np.column_stack([y + s + rng.normal(size=len(y)), rng.normal(size=(len(y), 3))])
    return y, constraint, x, rng


@pytest.mark.parametrize("kind,measure,G", [("equalized-odds", "rate", 4), ("demographic-parity", "rate", 3),
                                            ("deo", "loss", 3), ("equalized-odds", "loss", 2)])
def test_the_constrained_search_meets_every_gap_and_does_not_raise_the_loss(kind, measure, G):
    """From z = 0 (every gap 0) along directions that would open the gaps far past ε: the
    search ends with every |D_c| <= ε (to its feasibility tolerance), the loss below its start,
    and multipliers only on gaps at ε."""
    y, constraint, x, rng = _search_problem(1, G, kind, measure)
    n, eps, mu = len(y), 0.02, 2 / len(y)
    z, du = np.zeros(n), x
    a, b = np.zeros(x.shape[1]), np.eye(x.shape[1])
    assert isinstance(rule_for(constraint), ConstrainedSearch)
    free = subspace_step(y, z, du, a, b, np.zeros(constraint.num_multipliers), constraint, mu)
    assert np.abs(constraint.gaps(y, z + du @ free)).max() > 3 * eps  # the unconstrained search opens the gaps
    alpha, lam = constrained_step(y, z, du, a, b, np.zeros(constraint.num_multipliers), constraint, mu, epsilon=eps)
    gaps = constraint.gaps(y, z + du @ alpha)
    assert np.abs(gaps).max() <= eps + 1e-5
    assert logistic_loss(y, z + du @ alpha).mean() < logistic_loss(y, z).mean() - 0.01
    assert (lam >= 0).all() and lam.max() > 0
    in_use = (lam[0::2] - lam[1::2]) != 0
    assert (np.abs(gaps[in_use]) >= eps - 1e-3).all()


def test_the_constrained_search_keeps_a_feasible_point_when_no_direction_helps():
    """α = 0 is feasible from a feasible z, so a search whose directions can only break a gap
    stays (near) where it is."""
    y, constraint, x, _ = _search_problem(2, 3, "equalized-odds", "rate")
    z = np.zeros(len(y))
    du = (gap_weights(constraint)[:, :1] * len(y))  # only moves a gap
    alpha, _ = constrained_step(y, z, du, np.zeros(1), np.eye(1), np.zeros(constraint.num_multipliers), constraint,
                                2 / len(y), epsilon=0.01)
    assert np.abs(constraint.gaps(y, z + du @ alpha)).max() <= 0.01 + 1e-5


def test_a_bound_out_of_the_subspaces_reach_is_approached_with_bounded_multipliers():
    """Gaps far above ε (as right after the stop rule sharpened the rates) and a direction that can
    barely move them: the search at ε lets its penalty and multipliers grow without end (the next
    round's ν overflowed the wire); the held step searches halfway to the gaps instead, with
    multipliers of order 1 to 100 and every gap lower than it was."""
    y, s, _, rng = group_rows(2, G=3)
    constraint = from_labels(y, s, 1, "equalized-odds", "rate")
    z = 1.5 * (s == 0) - 0.5 + 0.3 * rng.normal(size=len(y))
    du, a, b, lam, mu = 0.05 * rng.normal(size=(len(y), 1)), np.zeros(1), np.eye(1), np.zeros(12), 2 / len(y)
    before = np.abs(constraint.gaps(y, z)).max()
    assert before > 0.3
    _, blown = constrained_step(y, z, du, a, b, lam, constraint, mu, epsilon=0.01)
    assert blown.max() > LAM_MAX
    alpha, held = held_step(y, z, du, a, b, lam, constraint, mu, epsilon=0.01)
    assert np.all(np.isfinite(alpha)) and 0 < held.max() <= LAM_MAX
    after = np.abs(constraint.gaps(y, z + du @ alpha)).max()
    assert after <= 0.01 + 0.5 * (before - 0.01) + 1e-5 and after < before
    # a bound within reach is searched as it is
    near = held_step(y, z, du, a, b, lam, constraint, mu, epsilon=before)
    plain = constrained_step(y, z, du, a, b, lam, constraint, mu, epsilon=before)
    assert np.array_equal(near[0], plain[0]) and np.array_equal(near[1], plain[1])


@pytest.mark.parametrize("kind,two", [("equalized-odds", True), ("demographic-parity", True), ("deo", False),
                                      ("deo", True)])
def test_every_builtin_constraint_takes_no_dual_step(kind, two):
    """λ comes from the search: the dual step between rounds leaves it as it is, in round 1 too."""
    y, s, z, rng = group_rows(3, G=2 if two else 3)
    constraint = from_labels(y, s == 0 if two else s, 1, kind)
    assert isinstance(rule_for(constraint), ConstrainedSearch)
    lam = np.arange(constraint.num_multipliers, dtype=float) * 0.01
    jac = _jacobian(y, z, constraint, rng, lam)
    for j in (None, jac):
        np.testing.assert_array_equal(dual_newton_step(lam, constraint.gaps(y, z), j, constraint, epsilon=0.01, beta=0.1,
                                                       c=1e-3), lam)


def test_a_kind_that_declares_the_clipped_step_gets_it_with_two_groups_only():
    """``newton_past_bound``: the step clipped to the weight bounds, past them by gradient, where one gap
    holds each row; with three groups the constrained search."""
    y, s, z, rng = group_rows(4, G=2)
    constraint = from_labels(y, s == 0, 1, "deo")
    object.__setattr__(constraint, "newton_past_bound", True)
    assert isinstance(rule_for(constraint), ClippedNewton)
    lam = np.array([0.0, 0.05])
    jac = _jacobian(y, z, constraint, rng, lam)
    gaps = constraint.gaps(y, z)
    out = dual_newton_step(lam, constraint.gaps(y, z), jac, constraint, epsilon=0.01, beta=0.1, c=1e-3)
    np.testing.assert_array_equal(out, ClippedNewton().newton(lam, gaps, jac, constraint, epsilon=0.01, c=1e-3))
    assert np.array_equal(dual_newton_step(np.zeros(2), constraint.gaps(y, z), None, constraint, epsilon=0.01, beta=0.1, c=1e-3),
                          constraint.project(np.maximum(0.0, 0.1 * np.array([gaps[0] - 0.01, -gaps[0] - 0.01]))))
    y3, s3, _, _ = group_rows(4, G=3)
    three = from_labels(y3, s3, 1, "deo")
    object.__setattr__(three, "newton_past_bound", True)
    assert isinstance(rule_for(three), ConstrainedSearch)


def test_newton_meets_equalized_odds_within_thirty_rounds(run_app, tmp_path):
    """Through the ServerApp and ClientApp (float32 wire): both gaps <= ε + 0.002 at the end
    of a Newton run of at most 30 rounds (COMPAS; docs/results/rounds/rounds-newton-coupled.md)."""
    run = run_app({"dataset": "compas", "constraint": "equalized-odds", "constraint-measure": "loss",
                   "sensitive-as-input": True, "optimizer": "newton", "num-parties": 3,
                   "num-server-rounds": 30, "eval-every": 30, "output-dir": str(tmp_path)})
    last = run.history[-1]
    assert len(last["gaps"]) == 2 and last["round"] <= 30
    assert max(abs(g) for g in last["gaps"].values()) <= 0.01 + 0.002, last["gaps"]


def test_newton_meets_several_groups_from_the_first_round(run_app, tmp_path):
    """Four pooled COMPAS races, six dependent gaps on the loss: every gap within ε from round
    1 on (the search keeps them there), while the loss comes down."""
    run = run_app({"dataset": "compas-race", "pool-small-groups": True, "optimizer": "newton", "num-parties": 3,
                   "num-server-rounds": 8, "eval-every": 8, "stop-tolerance": 0.0, "sensitive-as-input": True,
                   "output-dir": str(tmp_path)})
    last = run.history[-1]
    assert len(last["gaps"]) == 6 and last["round"] == 8
    for row in run.history[1:]:
        assert row["max_gap"] <= 0.01 + 1e-4, row["round"]
    assert last["loss"] < run.history[1]["loss"]


@pytest.mark.parametrize("extra", [
    {"privacy.label-dp-epsilon": 8.0, "privacy.label-dp-lambda-bound": 0.5},
    {"privacy.secure-aggregation": True},
], ids=["label-dp", "secure-aggregation"])
def test_newton_with_several_groups_runs_under_label_dp_and_secure_aggregation(run_app, tmp_path, extra):
    """Label DP bounds λ and secure aggregation shares the step lengths: both need nothing of
    the search but λ, so Newton runs with dependent gaps."""
    run = run_app({"dataset": "compas-race", "pool-small-groups": True, "optimizer": "newton", "num-parties": 3,
                   "num-server-rounds": 4, "eval-every": 4, "stop-tolerance": 0.0, "output-dir": str(tmp_path),
                   **extra})
    last = run.history[-1]
    assert last["round"] == 4 and len(last["gaps"]) == 6 and np.isfinite(last["loss"])
    if "privacy.label-dp-lambda-bound" in extra:
        assert max(last["lambdas"]) <= 0.5


@pytest.mark.slow  # a 30-round run
def test_compas_race_equalized_odds_meets_epsilon_within_thirty_rounds_under_auto(run_app, tmp_path):
    """The fairness issue's target: compas-race, equalized odds at ε = 0.02, every other setting its
    default (6 parties, the small groups pooled): auto picks block Newton, the run ends within 30
    rounds with fairlearn's equalized odds difference of the hard predictions on the training rows
    <= ε + 0.005 over the constrained groups, and the summary names those groups."""
    rc = {"dataset": "compas-race", "constraint": "equalized-odds", "epsilon": 0.02}
    assert RunConfig.from_flower(rc).optimizer_in_use == "newton"
    run = run_app({**rc, "output-dir": str(tmp_path)})
    assert run.summary["rounds"] <= 30 and len(run.history[-1]["gaps"]) == 12
    assert run.summary["epsilon_met"] and run.summary["train_eo_diff"] <= 0.02 + 0.005
    assert set(run.summary["groups"]) == {"African-American", "Caucasian", "Hispanic", "Asian + Native American + Other"}
    assert 0.0 <= run.summary["test_eo_diff"] <= 1.0


@pytest.mark.parametrize("rc", [{"dataset": "compas-race"}, {"dataset": "adult-sex-race", "constraint": "equalized-odds"},
                                {"constraint-form": "overall"}, {"dataset": "csv", "csv.path": "x.csv", "csv.label": "y", "csv.positive": "1",
                                 "csv.sensitive": "sex,race"},
                                {"server-labels": "labels.csv", "constraint": "demographic-parity"}])
def test_auto_does_not_depend_on_the_group_count(rc):
    """Several groups, the overall form, a CSV whose every value is a group, or a deployment
    whose groups only its label file knows: auto picks what it picks for two groups."""
    two = RunConfig.from_flower({k: v for k, v in rc.items() if k == "constraint"})
    assert two.optimizer_in_use == "newton"
    assert RunConfig.from_flower(rc).optimizer_in_use == two.optimizer_in_use
