"""The fairness figures a user reads are over the groups the run constrained (small groups
pooled into one, named by their members), with the data's own groups' figures beside them,
labelled, with each group's test rows: the log's final table, summary.json, the history and
the report."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.core.constraints import constrained_codes, from_labels
from fairvfl_flwr.core.metrics import demographic_parity_difference, equalized_odds_difference, predict
from fairvfl_flwr.data.tables import load_dataset
from fairvfl_flwr.features.final_logits import load_scores
from fairvfl_flwr.flower.results import format_summary
from fairvfl_flwr.tools import report

POOLED = "Asian + Native American + Other"


@pytest.fixture(scope="module")
def compas_race(tmp_path_factory):
    """COMPAS race under equalized odds: Asian (1 test row), Native American (0) and Other pooled."""
    out = tmp_path_factory.mktemp("runs")
    summary, folder = run_inprocess({"dataset": "compas-race", "constraint": "equalized-odds", "num-server-rounds": 8,
                                     "mode": "fairvfl-scores", "output-dir": str(out)}, quiet=True)
    return summary, folder


def test_compas_race_summary_is_over_the_constrained_groups_and_names_them(compas_race):
    summary, folder = compas_race
    ds = load_dataset("compas-race", 0, False)
    assert list(summary["groups"]) == ["African-American", "Caucasian", "Hispanic", POOLED]
    assert sum(c["test_rows"] for c in summary["groups"].values()) == len(ds.y_test)
    assert sum(c["train_rows"] for c in summary["groups"].values()) == len(ds.y_train)
    # recomputed from the run's own test scores, over the pooled groups by name and over the raw ones
    z_train, z_test = load_scores(folder)
    pooled = {name: summary["raw_groups"][name]["pooled_into"] or name for name in ds.group_names}
    raw_names = np.array(ds.group_names)[ds.s_test]
    constrained = np.array([pooled[n] for n in raw_names])
    pred = predict(z_test)
    assert summary["test_dp_diff"] == pytest.approx(demographic_parity_difference(pred, constrained), abs=1e-12)
    assert summary["test_eo_diff"] == pytest.approx(equalized_odds_difference(ds.y_test, pred, constrained),
                                                    abs=1e-12)
    assert summary["test_dp_diff_raw"] == pytest.approx(demographic_parity_difference(pred, raw_names), abs=1e-12)
    train_constrained = np.array([pooled[n] for n in np.array(ds.group_names)[ds.s_train]])
    assert summary["train_dp_diff"] == pytest.approx(
        demographic_parity_difference(predict(z_train), train_constrained), abs=1e-12)
    # a member with one test row (Asian) and one with none (Native American) decide the raw figure only
    assert summary["test_dp_diff_raw"] > summary["test_dp_diff"] + 0.3
    fairlearn = pytest.importorskip("fairlearn.metrics")
    yb = (ds.y_test == 1).astype(int)
    pb = (pred == 1).astype(int)
    assert summary["test_dp_diff"] == pytest.approx(
        fairlearn.demographic_parity_difference(yb, pb, sensitive_features=constrained), abs=1e-12)
    assert summary["test_eo_diff"] == pytest.approx(
        fairlearn.equalized_odds_difference(yb, pb, sensitive_features=constrained), abs=1e-12)


def test_the_raw_groups_figures_are_labelled_raw_with_their_counts(compas_race):
    summary, folder = compas_race
    ds = load_dataset("compas-race", 0, False)
    raw = summary["raw_groups"]
    assert list(raw) == list(ds.group_names)
    assert {n: c["test_rows"] for n, c in raw.items()} == {n: int((ds.s_test == k).sum())
                                                          for k, n in enumerate(ds.group_names)}
    assert raw["Asian"]["test_rows"] == 1 and raw["Native American"]["test_rows"] == 0
    assert {n for n, c in raw.items() if c["pooled_into"]} == {"Asian", "Native American", "Other"}
    assert all(c["pooled_into"] in (None, POOLED) for c in raw.values())
    for key in ("test_dfp_raw", "test_dfn_raw", "test_eo_diff_raw", "train_eo_diff_raw"):
        assert 0 <= summary[key] <= 1
    assert json.loads((folder / "summary.json").read_text())["raw_groups"] == raw
    history = json.loads((folder / "history.json").read_text())
    assert history[-1]["dp_diff_raw"] == pytest.approx(summary["test_dp_diff_raw"])
    assert history[-1]["dp_diff"] == pytest.approx(summary["test_dp_diff"])
    text = format_summary(summary, folder)
    assert "over the 4 constrained groups" in text
    assert f"{POOLED} {summary['groups'][POOLED]['test_rows']}" in text
    assert "raw groups        test DP diff" in text and "before pooling" in text
    assert "Asian 1" in text and "Native American 0" in text
    card = (folder / "model-card.md").read_text()
    assert f"- fairness figures over the groups the run constrained: African-American " in card
    assert f"{POOLED} ({summary['groups'][POOLED]['test_rows']} test rows)" in card
    assert f"| demographic parity difference (fairlearn's, over the 4 constrained groups) | {summary['test_dp_diff']:.4f} |" in card
    assert (f"| raw groups: demographic parity / equalized odds difference (fairlearn's) | "
            f"{summary['test_dp_diff_raw']:.4f} / {summary['test_eo_diff_raw']:.4f} |") in card
    assert "| Asian | 1 |" in card and "| Native American | 0 |" in card
    manifest = json.loads((folder / "model.json").read_text())
    assert manifest["metrics"]["constrained-groups"] == summary["groups"]
    assert manifest["metrics"]["raw-groups"] == raw


def test_two_groups_are_named_by_their_values_with_no_raw_figures(tmp_path):
    summary, _ = run_inprocess({"dataset": "compas", "constraint": "demographic-parity", "num-server-rounds": 3,
                                "output-dir": str(tmp_path)}, quiet=True)
    assert list(summary["groups"]) == ["African-American", "Caucasian"]
    assert "raw_groups" not in summary and "test_dp_diff_raw" not in summary


def test_coded_maps_every_member_to_its_pooled_group():
    y = np.array([1, -1] * 60)
    s = np.repeat([0, 1, 2, 3], 30)
    s[:2] = 2  # group 2 has 32 rows, groups 0 has 28
    cs = from_labels(y, s, 1, "demographic-parity", names=("a", "b", "c", "d"), min_group_size=30,
                     pool_small_groups=True)
    assert cs.groups.names[-1] == "a + b"
    codes = constrained_codes(cs, np.array([0, 1, 2, 3]), ("a", "b", "c", "d"))
    assert [cs.groups.names[k] for k in codes] == ["a + b", "a + b", "c", "d"]
    assert np.array_equal(constrained_codes(cs, s, ("a", "b", "c", "d")), cs.groups.codes)


def test_the_report_is_over_the_groups_the_training_run_constrained(compas_race, tmp_path):
    pytest.importorskip("fairlearn")
    _, folder = compas_race
    ds = load_dataset("compas-race", 0, False)
    z_train, z_test = load_scores(folder)
    score = tmp_path / "score-run"
    score.mkdir()
    (score / "config.json").write_text(json.dumps({"mode": "score", "score.model-from": str(folder)}))
    names = np.array(ds.group_names)[ds.s_test]
    pd.DataFrame({"id": ds.ids_test, "probability": 1 / (1 + np.exp(-z_test)), "decision": (z_test >= 0).astype(int)}
                 ).to_csv(score / "predictions.csv", index=False)
    pd.DataFrame({"row_id": ds.ids_test, "y": ds.y_test, "group": names}).to_csv(tmp_path / "out.csv", index=False)
    assert report.main([str(score / "predictions.csv"), "--outcomes", str(tmp_path / "out.csv"), "--bootstrap", "0"]) == 0
    rep = json.loads((score / "report.json").read_text())
    assert list(rep["groups"]) == sorted(["African-American", "Caucasian", "Hispanic", POOLED])
    summary = json.loads((folder / "summary.json").read_text())
    assert rep["gaps"]["dp_diff"] == pytest.approx(summary["test_dp_diff"], abs=1e-12)
    assert rep["gaps"]["deo"] == pytest.approx(summary["test_eo_diff"], abs=1e-12)
    assert rep["raw"]["what"].startswith("the data's own groups, before the training run pooled Asian, ")
    assert rep["raw"]["groups"]["Asian"]["count"] == 1
    assert rep["raw"]["gaps"]["dp_diff"] == pytest.approx(summary["test_dp_diff_raw"], abs=1e-12)
