"""One server step for everyone: the one-process floor runs the app's algorithm, whatever the measure."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.core.reference import NumpyFloor

from fairvfl_flwr.data.problem import party_problem


@pytest.mark.parametrize("measure", ["loss", "rate"])
def test_numpy_floor_follows_the_app_round_for_round(measure, tmp_path):
    rounds = 30
    cfg = RunConfig(optimizer="gd", dataset="crime", constraint_measure=measure, epsilon=0.02, beta=1.0, num_server_rounds=rounds,
                    eval_every=rounds, wire_dtype="float64", output_dir=str(tmp_path))
    _, folder = run_inprocess(cfg.to_flower(), quiet=True)
    history = json.loads((folder / "history.json").read_text())
    ds, blocks, constraint = party_problem(cfg)
    floor = NumpyFloor(blocks, ds.y_train, constraint, epsilon=cfg.epsilon, beta=cfg.beta, c=cfg.c,
                       mu=cfg.mu_value(constraint.n), lr=cfg.lr, Q=cfg.local_steps)
    lams = []
    for _ in range(rounds):
        floor.round()
        lams.append(floor.lam.copy())
    app_lams = np.array([row["lambdas"] for row in history[1:]])
    assert np.abs(app_lams).max() > 1e-3  # the constraint is active: the comparison means something
    np.testing.assert_allclose(app_lams, np.array(lams), rtol=1e-6, atol=1e-9)
