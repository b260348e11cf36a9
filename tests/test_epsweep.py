"""Choosing ε: the selection rule and the sweep command end to end (small, on Crime)."""

import json

import pytest

from fairvfl_flwr.tools.epsweep import Rule, main, select_epsilon

POINTS = [
    {"epsilon": 0.001, "acc": 0.80, "dfp": 0.01, "dfn": 0.02},
    {"epsilon": 0.01, "acc": 0.83, "dfp": 0.02, "dfn": 0.04},
    {"epsilon": 0.05, "acc": 0.84, "dfp": 0.05, "dfn": 0.09},
]


def test_rule_takes_the_most_accurate_epsilon_within_bounds():
    assert select_epsilon(POINTS, Rule(max_dfn=0.05)) == (POINTS[1], True)
    assert select_epsilon(POINTS, Rule(max_dfn=0.03)) == (POINTS[0], True)
    assert select_epsilon(POINTS, Rule()) == (POINTS[2], True)
    assert select_epsilon(POINTS, Rule(max_dfp=0.03, min_acc=0.81)) == (POINTS[1], True)


def test_rule_without_a_qualifying_epsilon_says_so_and_takes_the_nearest():
    chosen, ok = select_epsilon(POINTS, Rule(max_dfn=0.015))
    assert not ok and chosen is POINTS[0]


def test_sweep_command_writes_table_plot_and_refit(tmp_path, capsys):
    out = tmp_path / "eps"
    result = main(["--dataset", "crime", "--constraint", "equalized-odds", "--epsilons", "0.01,0.1",
                   "--max-dfn", "0.5", "--out", str(out), "--set", "num-server-rounds=20", "--set", "eval-every=10"])
    assert [p["epsilon"] for p in result["points"]] == [0.01, 0.1]
    assert result["chosen"] in (0.01, 0.1) and result["qualifies"]
    assert result["test"]["epsilon"] == result["chosen"]
    for name in ("epsweep.json", "table.md", "tradeoff.png"):
        assert (out / name).stat().st_size > 0
    runs = json.loads((out / "epsweep.json").read_text())["runs"]
    for r in runs:  # validation runs evaluate on the validation split, never the test rows
        summary = json.loads((tmp_path / r["run_dir"] / "summary.json").read_text())
        assert summary["evaluated_on"] == "validation" and summary["constraint"] == "equalized-odds"
    assert "Chosen ε" in capsys.readouterr().out


def test_sweep_refuses_a_zero_validation_fraction(tmp_path):
    with pytest.raises(SystemExit):
        main(["--validation-fraction", "0", "--out", str(tmp_path)])
