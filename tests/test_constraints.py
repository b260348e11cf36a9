"""Constraint sets (deo / equalized-odds / demographic-parity), several active
parties, and the validation split used to choose ε."""

import json

import numpy as np
import pytest
import torch

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.jobs import saving
from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.core.constraints import CONSTRAINTS, MEASURES, from_labels
from fairvfl_flwr.core.models import build_model
from fairvfl_flwr.core.constraints.measures import loss_derivative
from fairvfl_flwr.core.objective import train_stats
from fairvfl_flwr.data.partition import split_columns
from fairvfl_flwr.data.problem import load_data, party_columns
from fairvfl_flwr.core.metrics import fairness_metrics
from fairvfl_flwr.core.reference import CentralisedGDA
from fairvfl_flwr.core.step import dual_step

from .test_objective import assert_gradient_identity


# -- the math ------------------------------------------------------------------------
@pytest.mark.parametrize("measure", MEASURES)
@pytest.mark.parametrize("constraint", CONSTRAINTS)
@pytest.mark.parametrize("model", ["linear", "mlp"])
@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_identity_for_every_constraint_set(constraint, model, seed, measure):
    """J_kᵀν + μθ_k = ∇_{θ_k} f̃ (autograd on the centralised Lagrangian), every constraint set and measure."""
    assert_gradient_identity(model, seed, constraint, measure)


def test_rate_measure_gaps_are_soft_positive_rate_gaps():
    y = np.array([1, 1, 1, -1, -1, -1, 1, -1])
    s = np.array([1, 1, 0, 1, 0, 0, 0, 1], dtype=bool)
    z = np.array([2.0, -1.0, 0.5, -3.0, 1.0, 0.0, -0.5, 0.2])
    g = from_labels(y, s, 1, "equalized-odds", "rate")
    p = 1 / (1 + np.exp(-z))
    tpr_gap = p[(y == 1) & s].mean() - p[(y == 1) & ~s].mean()
    fpr_gap = p[(y == -1) & s].mean() - p[(y == -1) & ~s].mean()
    assert train_stats(y, z, g).gaps == pytest.approx((tpr_gap, fpr_gap))
    assert train_stats(y, z, g).loss == pytest.approx(train_stats(y, z, from_labels(y, s, 1)).loss)
    with pytest.raises(ValueError, match="constraint measure 'error'"):
        from_labels(y, s, 1, "deo", "error")


def test_constraint_sets_have_the_documented_subsets_and_multipliers():
    y = np.array([1, 1, 1, -1, -1, -1, 1, -1])
    s = np.array([1, 0, 1, 1, 0, 0, 0, 1], dtype=bool)
    deo = from_labels(y, s, 1, "deo")
    eo = from_labels(y, s, 1, "equalized-odds")
    dp = from_labels(y, s, 1, "demographic-parity")
    assert [deo.num_multipliers, eo.num_multipliers, dp.num_multipliers] == [2, 4, 2]
    first = deo.gap_list[0]
    assert np.array_equal(eo.gap_list[0].in_a, first.in_a) and np.array_equal(eo.gap_list[0].in_b, first.in_b)
    assert np.array_equal(eo.gap_list[1].in_a, (y == -1) & s)
    assert np.array_equal(dp.gap_list[0].in_a, s) and np.array_equal(dp.gap_list[0].in_b, ~s)
    # protected label -1: the first equalized-odds constraint is still the protected one
    eo_neg = from_labels(y, s, -1, "equalized-odds")
    assert np.array_equal(eo_neg.gap_list[0].in_a, (y == -1) & s)


def test_general_nu_formula_by_hand():
    y = np.array([1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 1.0, -1.0])
    s = np.array([1, 0, 1, 1, 0, 0, 0, 1], dtype=bool)
    g = from_labels(y, s, 1, "equalized-odds")
    lam = np.array([0.5, 0.1, 0.0, 0.3])
    w = g.signed_weights(lam)
    # rows 0,2: y=+1 & a (2 rows); rows 1,6: y=+1 & b; rows 3,7: y=-1 & a; rows 4,5: y=-1 & b
    d1, d2 = 0.4, -0.3
    want = np.array([1 / 8 + d1 / 2, 1 / 8 - d1 / 2, 1 / 8 + d1 / 2, 1 / 8 + d2 / 2,
                     1 / 8 - d2 / 2, 1 / 8 - d2 / 2, 1 / 8 - d1 / 2, 1 / 8 + d2 / 2])
    assert w == pytest.approx(want)
    z = np.linspace(-1, 1, 8)
    assert g.masked_weights(y, z, lam) == pytest.approx(want * loss_derivative(y, z))
    with pytest.raises(ValueError, match="4 multipliers"):
        g.signed_weights(np.zeros(2))


def test_dual_step_over_all_multipliers():
    lam = dual_step(np.zeros(4), np.array([0.2, -0.3]), epsilon=0.05, beta=0.1, c=0.0)
    assert lam == pytest.approx([0.015, 0.0, 0.0, 0.025])
    # one constraint, scalar gap: the paper's step, unchanged
    assert dual_step(np.zeros(2), 0.2, 0.05, 0.1, 0.0) == pytest.approx([0.015, 0.0])


def test_equalized_odds_needs_both_label_values_in_both_groups():
    y = np.array([1, 1, -1, -1])
    s = np.array([1, 0, 1, 1], dtype=bool)  # no group-b row with y = -1
    from_labels(y, s, 1, "deo")
    with pytest.raises(ValueError, match="equalized-odds"):
        from_labels(y, s, 1, "equalized-odds")


# -- configuration -------------------------------------------------------------------
@pytest.mark.parametrize("key,value", [("constraint", "eo"), ("validation-fraction", 0.9),
                                       ("constraint-measure", "error"), ("batching.batch-size", -1),
                                       ("validation-fraction", -0.1)])
def test_bad_new_keys_are_refused_by_name(key, value):
    with pytest.raises(ConfigError, match=f"run config {key}="):
        RunConfig.from_flower({key: value})


def test_new_keys_are_listed_in_pyproject_and_fairness_bool_still_works():
    import tomllib
    from pathlib import Path

    listed = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert listed["constraint"] == "deo" and listed["validation-fraction"] == 0.0
    cfg = RunConfig.from_flower({"fairness": "false", "constraint": "equalized-odds"})
    assert cfg.fairness is False and cfg.constraint == "equalized-odds"


def test_validation_split_is_seeded_disjoint_and_replaces_the_test_rows():
    base = RunConfig(dataset="crime", seed=2)
    full = load_data(base)
    a = load_data(base.replace(validation_fraction=0.25))
    b = load_data(base.replace(validation_fraction=0.25))
    assert len(a.y_test) == 300 and len(a.y_train) == 900
    assert np.array_equal(a.ids_train, b.ids_train) and np.array_equal(a.ids_test, b.ids_test)
    assert not set(a.ids_train) & set(a.ids_test)
    assert set(a.ids_train) | set(a.ids_test) == set(full.ids_train)  # carved from train, test untouched
    other = load_data(base.replace(validation_fraction=0.25, seed=3))
    assert not np.array_equal(np.sort(other.ids_test), np.sort(a.ids_test))


# -- federated runs ------------------------------------------------------------------
@pytest.mark.parametrize("constraint,measure", [(c, "loss") for c in CONSTRAINTS] + [("equalized-odds", "rate")])
def test_two_active_parties_q1_equals_centralised_descent_ascent(constraint, measure, out_dir, run_app):
    federated_equals_centralised(constraint, measure, out_dir, run_app)


def federated_equals_centralised(kind, measure, out_dir, run_app):
    """Eight rounds of the app (two active parties, Q = 1) against the centralised descent–ascent
    on the same constraint: the same θ and λ every round. Returns the app's run."""
    rounds, seed = 8, 4
    cfg = RunConfig(
        optimizer="gd", dataset="crime", model="linear", local_steps=1, num_server_rounds=rounds, eval_every=4, num_active=2,
        epsilon=0.01, eta=5.0, beta=1.0, output_dir=out_dir, seed=seed, constraint=kind,
        constraint_measure=measure,
    )
    run = run_app(cfg)
    summary, history = run.summary, run.history

    ds = load_data(cfg)
    cols = split_columns(ds.n_features, 6, 2, 49)
    models = [build_model("linear", len(c), bias=k < 2, seed=seed * 1000 + k) for k, c in enumerate(cols)]
    blocks = [torch.from_numpy(np.ascontiguousarray(ds.X_train[:, c])) for c in cols]
    constraint = from_labels(ds.y_train, ds.s_train, ds.protected_label, kind, measure)
    ref = CentralisedGDA(models, blocks, ds.y_train.astype(float), constraint,
                         epsilon=0.01, beta=1.0, c=1e-3, mu=2 / len(ds.y_train), lr=1 / 5.0)
    for _ in range(rounds):
        ref.round()

    fed = run.thetas()
    for k, m in enumerate(models):
        for name, p in m.state_dict().items():
            assert torch.allclose(fed[k][name], p, atol=1e-10), (k, name)
    lams = np.array([r["lambdas"] for r in history[1:]])
    assert lams.shape == (rounds, constraint.num_multipliers)
    assert np.allclose(lams, np.array(ref.lams), atol=1e-12)
    if kind == "deo":  # the paper's names, for DEO only
        assert [[r["lambda1"], r["lambda2"]] for r in history] == [r["lambdas"][:2] for r in history]
    else:
        assert not any("lambda1" in r or "deo" in r for r in history)
    assert lams[-1].max() > 0
    assert summary["constraint"] == kind and len(summary["lambdas"]) == constraint.num_multipliers
    return run


@pytest.mark.parametrize("batch_size", [0, 400])  # 400: mini-batch rounds send ν on 400 rows (batching.py)
def test_equalized_odds_passive_parties_still_receive_only_nu(batch_size, out_dir, run_app):
    seen = []
    cfg = RunConfig(dataset="crime", num_server_rounds=3, eval_every=2, output_dir=out_dir, optimizer="gd",
                    constraint="equalized-odds", num_active=2, batch_size=batch_size)
    rows = batch_size or 1200
    grid, _, _ = run_app(cfg, tap=seen.append)
    active_ids = {nid for nid, ctx in grid.contexts.items() if ctx.node_config["partition-id"] < 2}
    for m in seen:
        if m.metadata.dst_node_id in active_ids:
            if m.metadata.message_type == msgs.TRAIN_ACTIVE:
                payload = m.content.array_records[msgs.PAYLOAD]
                assert set(payload) == {"z", "lam"} and list(payload["lam"].shape) == [4]
                assert list(payload["z"].shape) == [rows]
            continue
        assert m.metadata.message_type in (msgs.INFO, msgs.INIT, msgs.TRAIN_PASSIVE, saving.SAVE)
        assert not m.content.metric_records
        if m.metadata.message_type == msgs.TRAIN_PASSIVE:
            assert set(m.content.array_records) == {msgs.PAYLOAD}
            assert set(m.content.array_records[msgs.PAYLOAD]) == {"nu"}
            assert list(m.content.array_records[msgs.PAYLOAD]["nu"].shape) == [rows]
        for record in m.content.config_records.values():  # query.save: where to save, no data
            assert set(record) <= ({"run-id", "run-folder", "round", "checkpoint"} if m.metadata.message_type == saving.SAVE
                                   else {"round", "evaluate"})


def _compas_parity(run_app, tmp_path, **extra):
    """The run of `flwr run . --run-config "dataset='compas' constraint='demographic-parity'
    epsilon=0.02"` (every other key at its default), in process."""
    cfg = RunConfig.from_flower({"dataset": "compas", "constraint": "demographic-parity", "epsilon": 0.02,
                                 "output-dir": str(tmp_path), **extra})
    return cfg, run_app(cfg)


def test_compas_parity_reports_the_hard_gaps_beside_the_soft_one(run_app, tmp_path):
    """COMPAS demographic parity at ε = 0.02 on the soft rates alone (``hard-epsilon = false``;
    block Newton, race not an input): the soft positive-rate gap is within ε within 30 rounds,
    and the summary reports fairlearn's differences of the hard predictions on the test rows
    and on the training rows, the latter those of the final model's own training scores. ε
    then does not bound the hard gaps (seed 0: 0.109 train, 0.113 test; docs/newton.md,
    "Rates"), which is why the default reads ε as the hard gap (tests/test_hard_epsilon.py)."""
    cfg, run = _compas_parity(run_app, tmp_path, **{"hard-epsilon": False})
    summary = run.summary
    assert summary["constraint_measure"] == "rate" and summary["rounds"] <= 30
    assert summary["train_max_gap"] <= 0.02 + 1e-4
    ds = load_data(cfg)
    thetas = run.thetas()
    z = sum(ds.X_train[:, c] @ thetas[k]["weight"].numpy().ravel() + float(thetas[k].get("bias", torch.zeros(1)))
            for k, c in enumerate(party_columns(cfg, ds)))
    hard = fairness_metrics(ds.y_train, ds.s_train, z)
    assert summary["train_dp_diff"] == pytest.approx(hard["dp_diff"], abs=1e-12)
    assert summary["train_eo_diff"] == pytest.approx(hard["eo_diff"], abs=1e-12)
    assert summary["test_dp_diff"] == run.history[-1]["dp_diff"]
    # the search ends at the constrained problem's optimum: the hard gap is the problem's, not the optimizer's
    pytest.importorskip("scipy")
    from bench.parity_frontier import central

    w = central(ds, 1.0, 0.02)
    assert hard["dp_diff"] == pytest.approx(fairness_metrics(ds.y_train, ds.s_train, ds.X_train @ w[:-1] + w[-1])["dp_diff"],
                                            abs=0.01)
    card = (run.folder / "model-card.md").read_text()
    assert f"{summary['train_dp_diff']:.4f} / {summary['train_eo_diff']:.4f}" in card


def test_compas_parity_meets_the_hard_target_where_race_is_an_input(run_app, tmp_path):
    """The same run with race among the inputs (the setting fairlearn's and gradient descent's
    yardsticks were measured in): within 30 rounds the soft gap ε bounds takes the hard test gap
    below 0.08 at an accuracy of at least 64 %. Without race the race-blind linear model's
    frontier lies below that point on average over seeds (docs/newton.md, "Rates")."""
    _, run = _compas_parity(run_app, tmp_path, **{"sensitive-as-input": True})
    summary = run.summary
    assert summary["rounds"] <= 30 and summary["train_max_gap"] <= 0.02 + 1e-4
    assert summary["test_dp_diff"] <= 0.08 and summary["test_acc"] >= 0.64
    assert summary["train_dp_diff"] <= 0.08


def test_fairness_off_keeps_every_multiplier_zero(out_dir, run_app):
    cfg = RunConfig(dataset="crime", fairness=False, constraint="equalized-odds", num_server_rounds=20,
                    eval_every=10, output_dir=out_dir)
    _, summary, _ = run_app(cfg)
    assert "lambda" not in summary and summary["lambdas"] == [0.0] * 4


@pytest.mark.slow  # 200 rounds to meet the constraints; the fast loop runs two active parties above
def test_two_active_parties_with_local_steps_meet_the_constraint_set(out_dir, run_app):
    cfg = RunConfig(dataset="crime", optimizer="gd", constraint="equalized-odds", num_active=2, local_steps=3, epsilon=0.05,
                    num_server_rounds=200, eval_every=100, output_dir=out_dir)
    _, summary, _ = run_app(cfg)
    assert summary["train_max_gap"] <= 0.05 + 0.015
    assert summary["test_acc"] > 0.75


def test_validation_run_evaluates_on_validation_rows(out_dir, run_app):
    cfg = RunConfig(dataset="crime", validation_fraction=0.2, num_server_rounds=4, eval_every=2, output_dir=out_dir)
    _, summary, folder = run_app(cfg)
    assert summary["evaluated_on"] == "validation"
    config = json.loads((folder / "config.json").read_text())
    assert config["dataset-summary"]["train"]["rows"] == 960 and config["dataset-summary"]["test"]["rows"] == 240


@pytest.mark.slow
def test_equalized_odds_mode_lowers_dfp_and_dfn_below_deo_mode_on_adult(out_dir, run_app):
    """Same ε, each run to the stop rule with the default optimizer (block Newton): constraining
    both label values beats constraining one on both gaps.

    Seed 0: DEO stops at round 14 with test DFP 0.034 / DFN 0.046, EO at round 18 with 0.006 / 0.041.
    EO runs with ε bounding its smooth rates (hard-epsilon off), as DEO on the loss does: with
    the hard-gap rule on, EO's training hard gap meets ε at test DFP 0.002 / DFN 0.052, the
    comparison this test makes is then one of two different bounds.
    """
    base = RunConfig(dataset="adult", epsilon=0.01, output_dir=out_dir, seed=0)
    deo = run_app(base)[1]
    eo = run_app(base.replace(constraint="equalized-odds", hard_epsilon=False))[1]
    assert eo["test_dfp"] < deo["test_dfp"] and eo["test_dfn"] < deo["test_dfn"]
    assert eo["rounds"] < 1000 and eo["train_max_gap"] <= 0.01 + 0.002  # the stop rule's target
    assert eo["test_acc"] > 0.82
