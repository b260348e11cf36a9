"""bench/parity_frontier.py: the one-process optimum it compares the app with, and how a row counts the seeds."""

from __future__ import annotations

import numpy as np
import pytest


def test_the_central_optimum_holds_the_soft_gap_and_a_sharper_rate_binds_harder():
    """On COMPAS seed 0 the optimum meets |soft gap| <= ε at the temperature it was solved for,
    and τ = 0.3 at the same ε leaves a smaller hard training gap than τ = 1."""
    pytest.importorskip("scipy")
    from bench.parity_frontier import central, hard
    from fairvfl_flwr.core.constraints.measures import sigmoid
    from fairvfl_flwr.data.tables import load_dataset

    ds = load_dataset("compas", 0)
    s = np.asarray(ds.s_train, dtype=bool)
    gaps = {}
    for tau in (1.0, 0.3):
        w = central(ds, tau, 0.02)
        z = ds.X_train @ w[:-1] + w[-1]
        q = sigmoid(z / tau)
        assert abs(q[s].mean() - q[~s].mean()) <= 0.02 + 1e-6
        gaps[tau] = hard(ds.y_train, s, z)[1]
    assert gaps[0.3] < gaps[1.0] / 2


def test_a_row_averages_the_seeds_and_counts_those_meeting_the_target():
    from bench.parity_frontier import rows

    runs = {"app": [{"train_gap": 0.1, "acc": 0.65, "gap": 0.07, "rounds": 7},
                    {"train_gap": 0.2, "acc": 0.63, "gap": 0.05, "rounds": 9}],
            "EG": [{"train_gap": None, "acc": 0.60, "gap": 0.09}]}
    app, eg = rows(runs, 0.08, 0.64)
    assert app["train hard gap"] == pytest.approx(0.15) and app["test ACC %"] == 64.0
    assert app["first seed: DP diff"] == 0.07 and app["rounds"] == "7/9"
    assert app["seeds with gap <= 0.08 and ACC >= 64 %"] == "1/2"
    assert eg["train hard gap"] == "—" and eg["seeds with gap <= 0.08 and ACC >= 64 %"] == "0/1"
