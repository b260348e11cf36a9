"""How benches compare a run with its yardstick: bench/registry_encrypted.py row by row on the
test set, bench/mlp_rounds.py against a reference held to the run's final smooth bound, and
bench/gap_errors.py each Gauss–Newton step's true gaps against its linearised ones."""

from __future__ import annotations

import numpy as np


def _run(acc: float, z: list[float], rounds: int = 8) -> tuple:
    summary = {"test_acc": acc, "train_max_gap": 0.01, "test_dfp": 0.06, "test_dfn": 0.07}
    history = [{"gaps": {"0": 0.0}}] * rounds + [{"gaps": {"0": 0.01}}]
    return summary, history, 1.0, 100, np.array(z)


def test_a_pair_counts_the_test_rows_predicted_apart_and_how_near_the_boundary_they_lie():
    from bench.registry_encrypted import paired

    exact = _run(0.5, [-0.001, 0.5, -2.0, 0.0])
    same_side = _run(0.5, [-0.0005, 0.45, -2.1, 0.001])  # z = 0 counts as positive, as core/metrics.predict
    one_apart = _run(0.75, [0.002, 0.4, -2.0, 0.0])
    two_apart = _run(0.5, [0.003, 0.5, -2.0, -0.02])
    row = paired("compas", "equalized-odds", *exact[:3], exact[4], [same_side, one_apart])
    assert row["test rows"] == 4
    assert row["most test rows apart"] == 1 and row["their farthest exact logit from 0"] == 0.001
    assert np.isclose(row["largest test logit difference"], 0.1)
    assert row["runs within the bars"] == "1/2"  # the row apart costs 25 points of accuracy here
    row = paired("compas", "equalized-odds", *exact[:3], exact[4], [two_apart])
    assert row["most test rows apart"] == 2 and row["their farthest exact logit from 0"] == 0.001
    row = paired("compas", "equalized-odds", *exact[:3], exact[4], [same_side])
    assert row["most test rows apart"] == 0 and row["their farthest exact logit from 0"] == 0.0


def test_an_accuracy_miss_of_a_rate_constraint_names_the_reference_held_to_its_bound():
    from bench.mlp_rounds import accuracy_misses

    row = {"dataset": "compas", "constraint": "dp", "seed": 1, "Δacc": -6.5, "hard gap": 0.0037,
           "reference gap": 0.0105, "surrogate bound": 0.006, "temperature": 0.25, "matched acc": 65.3,
           "matched hard gap": 0.0276, "Δacc matched": -1.7, "stop": 33}
    (line,) = accuracy_misses([row])
    assert "holds the hard-prediction gap (0.0037)" in line
    assert "final smooth bound (0.006, temperature 0.25) ends at Δacc -1.70 with a hard gap of 0.0276" in line
    (line,) = accuracy_misses([{k: v for k, v in row.items() if not k.startswith(("matched", "Δacc matched"))}])
    assert "final smooth bound" not in line  # a row without the matched run says nothing of it
    assert accuracy_misses([{**row, "Δacc": -0.1}]) == []


def test_a_plateaued_runs_miss_names_the_damping_that_held_its_steps():
    from bench.mlp_rounds import accuracy_misses

    row = {"dataset": "adult", "constraint": "groups", "seed": 1, "Δacc": -2.85, "hard gap": None, "stop": 33,
           "reference": "adagrad 1000", "late damping": 4.0}
    (line,) = accuracy_misses([row])
    assert "ended on its plateau at round 33" in line and "damping of 4, at most 1/17" in line
    (line,) = accuracy_misses([{**row, "late damping": 0.5}])
    assert "damping" not in line


def test_a_steps_gap_error_is_the_furthest_a_true_gap_ended_beyond_its_linearised_one():
    from bench.gap_errors import step_row

    step = {"damping": 4.0, "holds": True, "start": np.zeros(4), "predicted": np.array([0.1, -0.1, 0.1, -0.1]),
            "gaps": np.array([0.009, -0.002, 0.0])}
    row = step_row(7, step, np.zeros(4), np.array([-0.0095, 0.001, 0.0004]), True, 0.5)
    assert row["logit change"] == 0.1 and np.isclose(row["gap error"], 0.0005)  # |−0.0095| − |0.009|, sign aside
    assert np.isclose(row["error / change²"], 0.05)
    nearer = step_row(7, step, np.zeros(4), np.array([0.001, 0.0, 0.0]), True, 0.5)
    assert nearer["gap error"] == 0.0  # gaps that land nearer 0 than predicted are no error


def test_the_trace_has_one_row_per_judged_step_and_leaves_the_server_as_it_was(tmp_path):
    from bench.gap_errors import trace
    from fairvfl_flwr.algorithms.newton import NewtonVFL

    search, judge = NewtonVFL.search, NewtonVFL.judge
    rows, summary = trace({"dataset": "crime", "model": "mlp", "optimizer": "newton", "num-parties": 3,
                           "num-server-rounds": 5, "stop-tolerance": 0})
    assert NewtonVFL.search is search and NewtonVFL.judge is judge
    assert summary["rounds"] == 5 and [r["round"] for r in rows] == [2, 3, 4, 5]  # the cap's last step goes unchecked
    assert all(r["logit change"] > 0 and r["gap error"] >= 0 for r in rows)
    assert not any(r["holds gaps"] for r in rows)  # all within the default newton-warm-rounds
