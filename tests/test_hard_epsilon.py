"""ε as fairlearn's hard-prediction difference on the training rows (core/stopping.py's target,
run config ``hard-epsilon``): the stop rule tightens the smooth rates' bound until the hard
gap meets ε, reports both, and leaves the loss measure (the paper's) alone."""

from __future__ import annotations

import numpy as np
import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.core.constraints import ConstraintSet
from fairvfl_flwr.core.metrics import fairness_metrics
from fairvfl_flwr.core.stopping import StopRule


def _quiet(rule: StopRule, hard: float, rounds: int) -> bool:
    done = False
    for _ in range(rounds):
        done = rule.update(1.0, 1.0, np.array([rule.epsilon]), np.array([1.0, 0.0]), hard)
    return done


def test_hard_gaps_are_fairlearns_differences():
    rng = np.random.default_rng(0)
    y = rng.choice([-1, 1], 400)
    s = rng.integers(0, 2, 400)
    z = rng.normal(size=400) + 0.8 * s
    hard = fairness_metrics(y, s, z)
    for kind, key in (("demographic-parity", "dp_diff"), ("equalized-odds", "eo_diff")):
        groups = ConstraintSet.from_labels(y, s, 1, kind, "rate")
        assert np.max(np.abs(groups.hard_gaps(y, z))) == pytest.approx(hard[key])
    assert ConstraintSet.from_labels(y, s, 1, "deo", "loss").hard_gaps(y, z) is None


def test_stop_rule_tightens_instead_of_stopping_above_the_target():
    rule = StopRule(1e-3, 2, 0.02, True, target=0.02)
    assert not _quiet(rule, 0.10, 2)  # converged on the smooth gaps, the hard one 5x above: tighten
    assert rule.tightenings == 1 and rule.epsilon == pytest.approx(0.02 * 0.02 / 0.10)
    assert rule.quiet_rounds == 0
    assert not _quiet(rule, 0.03, 2)  # secant through (0.02, 0.10) and (0.004, 0.03)
    assert rule.epsilon == pytest.approx(0.004 - 0.01 / (0.07 / 0.016))
    assert _quiet(rule, 0.0205, 2) and rule.met()
    state = rule.state_dict()
    again = StopRule(1e-3, 2, 0.02, True, target=0.02)
    again.load_state_dict(state)
    assert (again.epsilon, again.tightenings) == (rule.epsilon, rule.tightenings)


def test_stop_rule_gives_up_where_only_a_constant_classifier_would_do():
    rule = StopRule(1e-3, 1, 0.02, True, target=0.02)
    assert _quiet(rule, 0.5, 1)  # the bound would fall below MIN_BOUND_SHARE of ε
    assert rule.gave_up and rule.tightenings == 0 and not rule.met()


def test_compas_demographic_parity_meets_epsilon_on_hard_predictions(tmp_path):
    summary, _ = run_inprocess({"dataset": "compas", "constraint": "demographic-parity", "epsilon": 0.02,
                                "output-dir": str(tmp_path)}, quiet=True)
    assert summary["train_dp_diff"] <= 0.025
    assert summary["rounds"] <= 30
    assert summary["epsilon_bounds"] == "hard" and summary["epsilon_met"]
    assert summary["tightenings"] >= 1 and summary["surrogate_bound"] < 0.02
    assert summary["train_hard_gap"] == pytest.approx(summary["train_dp_diff"])
    assert summary["train_max_gap"] <= summary["surrogate_bound"] + 1e-3  # the smooth gap, within its bound
    assert "test_dp_diff" in summary and "test_eo_diff" in summary


def test_switched_off_epsilon_bounds_the_smooth_rates(tmp_path):
    summary, _ = run_inprocess({"dataset": "compas", "constraint": "demographic-parity", "epsilon": 0.02,
                                "hard-epsilon": False, "output-dir": str(tmp_path)}, quiet=True)
    assert summary["epsilon_bounds"] == "smooth" and "tightenings" not in summary
    assert summary["train_max_gap"] <= 0.021
    assert summary["train_dp_diff"] > 0.05  # what the rule is for: the hard gap is far above ε
