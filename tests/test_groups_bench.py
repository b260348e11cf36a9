"""The pieces bench/groups.py compares with: fairlearn's moment per constraint kind, test metrics
on the constraint's (pooled) groups, the demographic-parity difference; and one tiny run of
the script itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.core.constraints import CONSTRAINTS
from fairvfl_flwr.core.metrics import positive_rate_gaps
from fairvfl_flwr.tools import baselines
from fairvfl_flwr.tools.baselines import EG_MOMENTS, group_metrics, regroup

REPO = Path(__file__).resolve().parents[1]


def test_every_constraint_kind_has_its_fairlearn_moment():
    reductions = pytest.importorskip("fairlearn.reductions")
    assert set(EG_MOMENTS) == set(CONSTRAINTS)
    assert isinstance(baselines.eg_moment("deo"), reductions.TruePositiveRateParity)
    assert isinstance(baselines.eg_moment("equalized-odds"), reductions.EqualizedOdds)
    assert isinstance(baselines.eg_moment("demographic-parity"), reductions.DemographicParity)
    with pytest.raises(ValueError, match="'parity' has no fairlearn moment"):
        baselines.eg_moment("parity")


def test_the_positive_rate_gaps_are_the_demographic_parity_difference():
    codes = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
    pred = np.array([1, 1, 1, -1, -1, -1, 1, -1, -1, -1])
    # shares predicted +1: 3/4, 0, 1/4; overall 4/10
    gaps = positive_rate_gaps(codes, pred)
    assert gaps["dpd"] == pytest.approx(0.75) and gaps["dpd_overall"] == pytest.approx(0.4)
    fairlearn_metrics = pytest.importorskip("fairlearn.metrics")
    want = fairlearn_metrics.demographic_parity_difference(pred == 1, pred == 1, sensitive_features=codes)
    assert gaps["dpd"] == pytest.approx(want)


def test_group_metrics_read_a_boolean_column_as_two_groups():
    rng = np.random.default_rng(3)
    y, s = rng.choice([-1, 1], 200), rng.random(200) < 0.4
    pred = rng.choice([-1, 1], 200)
    two = group_metrics(y, s, pred)
    codes = group_metrics(y, np.where(s, 0, 1), pred)
    assert two == pytest.approx(codes)
    neg, pos, up = y == -1, y == 1, pred == 1
    assert two["dfp"] == pytest.approx(abs(up[neg & s].mean() - up[neg & ~s].mean()))
    assert two["dfn"] == pytest.approx(abs((~up)[pos & s].mean() - (~up)[pos & ~s].mean()))
    assert two["dpd"] == pytest.approx(abs(up[s].mean() - up[~s].mean()))
    assert two["acc"] == pytest.approx((pred == y).mean())


def test_test_rows_are_put_in_the_groups_the_constraint_pooled():
    raw_train = np.array([0, 1, 2, 3, 3, 2, 1, 0])
    pooled_train = np.array([0, 1, 2, 2, 2, 2, 1, 0])  # data groups 2 and 3 pooled into constraint group 2
    np.testing.assert_array_equal(regroup(raw_train, pooled_train, np.array([3, 0, 2, 1])), [2, 0, 2, 1])
    # a boolean column: True is group a (code 0), as SensitiveGroups reads it
    np.testing.assert_array_equal(regroup(np.array([True, False]), np.array([0, 1]), np.array([False, True])), [1, 0])
    with pytest.raises(ValueError, match="data group 1: its training rows must be in one constraint group"):
        regroup(np.array([0, 1, 1]), np.array([0, 1, 0]), np.array([1]))


def test_the_moment_decides_which_gap_exponentiated_gradient_closes_on_its_training_rows():
    pytest.importorskip("fairlearn")
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    n = 600
    s = rng.random(n) < 0.5
    x = rng.normal(size=(n, 3)) + np.where(s, 1.0, 0.0)[:, None]  # group a scores higher
    y = np.where(x[:, 0] + 0.5 * rng.normal(size=n) > 0.5, 1, -1)

    def fit(constraint, protected_label=1):
        return group_metrics(y, s, baselines.eg_predict(x, y, s, x, protected_label, constraint, seed=0))

    plain = group_metrics(y, s, LogisticRegression().fit(x, y).predict(x))
    assert plain["dfp"] > 0.1 and plain["dpd"] > 0.2
    assert fit("demographic-parity")["dpd"] < plain["dpd"] / 4
    assert fit("equalized-odds")["dfp"] < plain["dfp"] / 4
    # DEO is TPR parity on the protected label's rows: on y = -1 it closes the false-positive gap
    assert fit("deo", protected_label=-1)["dfp"] < plain["dfp"] / 4
    assert fit("deo", protected_label=1)["dfp"] > plain["dfp"] / 2


@pytest.mark.slow  # a fresh interpreter
def test_the_bench_scores_fairvfl_on_the_runs_own_split_and_records_its_optimizer(tmp_path):
    pytest.importorskip("fairlearn")
    cmd = [sys.executable, "bench/groups.py", "--datasets", "crime", "--constraints", "demographic-parity",
           "--seeds", "0", "--set", "num-server-rounds=2", "--out", str(tmp_path)]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True, timeout=300)
    page = json.loads((tmp_path / "groups-eo-dp.json").read_text())
    rows = {r["method"]: r for r in page["rows"]}
    assert set(rows) == {"FairVFL", "unconstrained VFL", "fairlearn EG (central)"}
    assert rows["fairlearn EG (central)"]["moment"] == "DemographicParity"
    base = {"dataset": "crime", "seed": 0, "constraint": "demographic-parity", "num-server-rounds": 2,
            "pool-small-groups": True, "num-parties": 3, "eval-every": 1000, "mode": "fairvfl-scores"}
    for method, extra in (("FairVFL", {}), ("unconstrained VFL", {"fairness": False})):
        summary, _ = run_inprocess({**base, **extra, "output-dir": str(tmp_path / method)}, quiet=True)
        row = rows[method]
        assert row["optimizer"] == RunConfig.from_flower({**base, **extra}).optimizer_in_use
        assert row["rounds"] == summary["rounds"] == 2
        assert row["train_max_gap"] == pytest.approx(summary["train_max_gap"])
        # two groups: the server's own test metrics are the bench's pairwise ones
        for k in ("acc", "dfp", "dfn"):
            assert row[k] == pytest.approx(summary[f"test_{k}"]), k
    assert page["summary"][0]["acc"] == pytest.approx(rows["FairVFL"]["acc"])
