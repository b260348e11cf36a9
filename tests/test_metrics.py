"""The test metrics every run reports, against independent references."""

from __future__ import annotations

import numpy as np
import pytest

from fairvfl_flwr.core.metrics import demographic_parity_difference, equalized_odds_difference, fairness_metrics


def _random_rows(seed: int, n: int, groups: int):
    rng = np.random.default_rng(seed)
    y = rng.choice([-1, 1], size=n)
    pred = np.where(rng.random(n) < 0.3 + 0.4 * (y == 1), 1, -1)
    s = rng.integers(0, groups, size=n)
    return y, pred, s


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("groups", [2, 3, 7])
def test_the_fairlearn_differences_equal_fairlearns_own(seed, groups):
    metrics = pytest.importorskip("fairlearn.metrics")
    # small tables: some groups lack a label value, where fairlearn counts the rate as 0
    y, pred, s = _random_rows(seed, 12 + 40 * seed, groups)
    want_dp = metrics.demographic_parity_difference(y == 1, pred == 1, sensitive_features=s)
    want_eo = metrics.equalized_odds_difference(y == 1, pred == 1, sensitive_features=s)
    assert demographic_parity_difference(pred, s) == pytest.approx(want_dp, abs=1e-12)
    assert equalized_odds_difference(y, pred, s) == pytest.approx(want_eo, abs=1e-12)


def test_every_run_metric_set_has_the_fairlearn_differences_for_two_groups_and_several():
    y, pred, s = _random_rows(0, 400, 4)
    z = pred.astype(float)
    for groups in (s == 0, s):  # a boolean group column (group a / b) and group codes
        out = fairness_metrics(y, groups, z)
        assert out["dp_diff"] == demographic_parity_difference(pred, groups)
        assert out["eo_diff"] == equalized_odds_difference(y, pred, groups)
    # by hand, two groups: share predicted positive, and the larger of the TPR and FPR gaps
    a = s == 0
    share = [(pred[g] == 1).mean() for g in (a, ~a)]
    tpr = [(pred[g & (y == 1)] == 1).mean() for g in (a, ~a)]
    fpr = [(pred[g & (y == -1)] == 1).mean() for g in (a, ~a)]
    assert demographic_parity_difference(pred, a) == pytest.approx(abs(share[0] - share[1]))
    assert equalized_odds_difference(y, pred, a) == pytest.approx(max(abs(tpr[0] - tpr[1]), abs(fpr[0] - fpr[1])))
