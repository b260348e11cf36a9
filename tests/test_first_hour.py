"""What a newcomer meets in their first hour: a federation of the wrong size, a run that
never stops, results in an unexpected folder, a relative data path, the log's lines."""

import logging
import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.quiet import quiet_third_party_warnings
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.core.stopping import StopRule
from fairvfl_flwr.data.tables import DataError
from fairvfl_flwr.flower import discovery
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.inprocess import InProcessGrid

DOCS = Path(__file__).resolve().parents[1] / "docs"

#: The 1,000-round MLP run the stop rule is held to: model='mlp', optimizer='adagrad' on COMPAS,
#: seed 0, every round (stop-tolerance=0), ε = 0.01 on DEO: test ACC 67.15%, train DEO 0.0111
#: (`python bench/mlp_rounds.py --datasets compas --constraints deo --seeds 0 --reference adagrad`).
MLP_1000 = {"train_deo": 0.011085, "test_acc": 0.671548}


@pytest.fixture
def flwr_log(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    return caplog


# -- a federation too small ---------------------------------------------------------------
def test_a_federation_short_of_num_parties_is_refused_once_it_stops_growing(tmp_path, monkeypatch, flwr_log):
    # the in-process grid never grows: the wait ends NODE_WAIT after the last node joined
    monkeypatch.setattr(discovery, "NODE_WAIT", 0.5)
    cfg = RunConfig.from_flower({"dataset": "crime", "output-dir": str(tmp_path)})
    grid = InProcessGrid(client_app, cfg.to_flower(), 4)
    started = time.monotonic()
    with pytest.raises(FederationError, match=r"num-parties=6 nodes, the federation has 4 .*num-supernodes=6"):
        run_server(grid, cfg.to_flower())
    assert time.monotonic() - started < 10  # not reliability.round-timeout (600 s)
    assert "run stopped before round 1" in flwr_log.text and "round None" not in flwr_log.text


def test_the_wait_for_missing_nodes_is_bounded_well_inside_30_seconds():
    assert 0 < discovery.NODE_WAIT <= 10  # Ray's start-up comes on top in a flwr run simulation


@pytest.mark.slow
def test_flwr_run_with_too_few_supernodes_fails_long_before_the_round_timeout(simulation_superlink, tmp_path):
    from fairvfl_flwr.tools.flwr_engine import FlwrRunError

    started = time.monotonic()
    with pytest.raises(FlwrRunError, match=r"num-parties=6 nodes, the federation has 4"):
        simulation_superlink.run({"dataset": "crime", "output-dir": str(tmp_path / "out")}, num_supernodes=4,
                                 timeout=300)
    # the ServerApp's own wait is NODE_WAIT (bounded in process above); Ray's actors and the
    # status calls come on top, on a machine the other test worker (or another suite) is
    # loading: the point is that the run does not sit out reliability.round-timeout (600 s)
    assert time.monotonic() - started < 300


# -- one stop rule ------------------------------------------------------------------------
def test_stop_rule_needs_window_quiet_rounds_in_a_row_and_gaps_only_with_fairness():
    gaps_off, lam = np.array([0.05]), np.zeros(2)
    fair = StopRule(tolerance=1e-6, window=2, epsilon=0.01, fairness=True)
    assert not fair.update(1.0, 1.0, gaps_off, lam)  # F still, but the gap is above ε
    assert not fair.update(1.0, 1.0, np.array([0.01]), lam)
    assert not fair.update(1.0, 0.9, np.array([0.01]), lam)  # a real step resets the count
    assert not fair.update(1.0, 1.0, np.array([0.01]), lam)
    assert fair.update(1.0, 1.0, np.array([0.01]), lam)

    unfair = StopRule(tolerance=1e-6, window=2, epsilon=0.01, fairness=False)
    assert not unfair.update(1.0, 1.0, gaps_off, lam)
    assert unfair.update(1.0, 1.0, gaps_off, lam)  # the gap is not the run's business

    in_use = StopRule(tolerance=1e-6, window=1, epsilon=0.01, fairness=True)
    assert not in_use.update(1.0, 1.0, np.array([0.002]), np.array([0.3, 0.0]))  # λ > 0 with its gap below ε

    never = StopRule(tolerance=0.0, window=1, epsilon=0.01, fairness=False)
    assert not never.update(1.0, 1.0, gaps_off, lam)


def test_stop_rule_state_round_trips():
    rule = StopRule(tolerance=1e-6, window=3, epsilon=0.01, fairness=False)
    rule.update(1.0, 1.0, np.zeros(1), np.zeros(2))
    rule.update(1.0, 1.0, np.zeros(1), np.zeros(2))
    again = StopRule(tolerance=1e-6, window=3, epsilon=0.01, fairness=False)
    again.load_state_dict(rule.state_dict())
    assert again.update(1.0, 1.0, np.zeros(1), np.zeros(2))


def test_quick_start_newton_stops_where_it_did(tmp_path):
    summary, _ = run_inprocess({"output-dir": str(tmp_path)}, quiet=True)
    assert summary["rounds"] == 12
    assert round(summary["train_deo"], 4) == 0.0100 and round(100 * summary["test_acc"], 2) == 85.20


def test_fairness_false_stops_early_and_logs_no_epsilon(tmp_path, flwr_log):
    summary, folder = run_inprocess({"fairness": False, "eval-every": 5, "output-dir": str(tmp_path)})
    assert summary["rounds"] <= 20  # the cap is 1,000
    assert "converged: F decreased by less than stop-tolerance" in flwr_log.text
    rounds = [r.getMessage() for r in flwr_log.records if r.getMessage().startswith("[round ")]
    assert rounds and not any("eps" in line or "lambda" in line for line in rounds), rounds
    assert "fairness off" in flwr_log.text and "  lambda  " not in flwr_log.text  # nor in the final table


def test_fairness_on_logs_epsilon_and_lambda(tmp_path, flwr_log):
    run_inprocess({"dataset": "crime", "num-server-rounds": 2, "output-dir": str(tmp_path)})
    rounds = [r.getMessage() for r in flwr_log.records if r.getMessage().startswith("[round ") and " L=" in r.getMessage()]
    assert rounds and all("(eps 0.01) lambda=(" in line for line in rounds), rounds
    assert "fairness on, eps=0.01" in flwr_log.text and "  lambda  " in flwr_log.text


def test_the_apps_drop_other_packages_warnings_and_keep_their_own():
    """Ray warns about its accelerator variables in every simulated run; that would bury ours."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        quiet_third_party_warnings()
        for module in ("ray._private.worker", "fairvfl_flwr.core.step", "server_app", "fairvfl_flwr_other", "typer"):
            warnings.warn_explicit(module, FutureWarning, "f.py", 1, module=module)
    assert [str(w.message) for w in seen] == ["fairvfl_flwr.core.step", "server_app"]


def test_gradient_steps_stop_too_and_evaluate_their_last_round(tmp_path, flwr_log):
    """A stop between evaluation rounds takes one more round, whose test metrics end the run
    (a loose tolerance, so that gradient steps on Crime stop within a few dozen rounds)."""
    summary, folder = run_inprocess({"dataset": "crime", "optimizer": "gd", "fairness": False, "eta": 20.0,
                                     "stop-tolerance": 1e-3, "eval-every": 1000, "output-dir": str(tmp_path)})
    assert summary["rounds"] < 1000
    assert np.isfinite(summary["test_acc"])
    assert re.search(rf"training ends (here|with round {summary['rounds']} \(evaluated\))", flwr_log.text)


@pytest.mark.slow
def test_an_mlp_run_stops_once_converged_no_worse_than_1000_rounds(tmp_path):
    """Every key at its default: auto gives the MLP Gauss–Newton blocks, and the stop rule ends
    the run at its plateau, in tens of rounds, with the gap within ε + 0.002 and the test
    accuracy no more than 0.2 points below 1,000 rounds of AdaGrad."""
    summary, _ = run_inprocess({"dataset": "compas", "model": "mlp", "output-dir": str(tmp_path)}, quiet=True)
    assert summary["rounds"] <= 50
    assert summary["test_acc"] >= MLP_1000["test_acc"] - 0.002
    assert summary["train_deo"] <= 0.01 + 0.002


# -- where results and data are looked for ------------------------------------------------
def test_results_go_where_the_docs_say_the_working_directory_and_the_log_says_it(tmp_path, monkeypatch,
                                                                                  flwr_log):
    monkeypatch.chdir(tmp_path)
    _, folder = run_inprocess({"dataset": "crime", "num-server-rounds": 1})  # output-dir="outputs"
    assert folder.parent == tmp_path / "outputs" and (folder / "summary.json").is_file()
    starts = [r.getMessage() for r in flwr_log.records if "writing results to" in r.getMessage()]
    assert starts and str(folder) in starts[0] and str(tmp_path) in starts[0]
    assert f"results           {folder}" in flwr_log.text  # the final table names it again
    docs = " ".join((DOCS / "configuration.md").read_text().split())
    assert "taken from the ServerApp's working directory, which is the SuperLink's working directory" in docs


def test_two_runs_started_in_the_same_second_have_different_ids(tmp_path, monkeypatch):
    """A run's folder name is its id in the saved model (blocks of different runs are told apart
    by it); two in-process runs in one second, in different folders, still differ."""
    from fairvfl_flwr.flower.results import run_folder

    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20261128-120000")
    cfg = RunConfig.from_flower({"dataset": "crime", "output-dir": str(tmp_path / "c")})
    first, second = (run_folder(RunConfig.from_flower({"dataset": "crime", "output-dir": str(tmp_path / d)}))
                     for d in ("a", "b"))
    assert first.name != second.name and first.name.startswith("20261128-120000-crime-linear-")
    assert run_folder(cfg, 42).name == "20261128-120000-crime-linear-42"


def test_a_relative_csv_path_that_is_not_there_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as err:
        run_inprocess({"dataset": "csv", "csv.path": "mine/german.csv", "csv.label": "y", "csv.positive": "1",
                       "csv.sensitive": "s", "csv.group-a": "a", "csv.group-b": "b",
                       "output-dir": str(tmp_path / "out")}, quiet=True)
    assert str(tmp_path / "mine" / "german.csv") in str(err.value)
    assert f"working directory {tmp_path}" in str(err.value)


@pytest.mark.slow  # three runs; the stop rule's state round-trips in the fast loop above
def test_a_resumed_run_stops_where_the_uninterrupted_one_did(tmp_path, monkeypatch):
    """The stop rule's count of quiet rounds is part of the checkpoint."""
    from fairvfl_flwr.data import partydata
    from fairvfl_flwr.features.checkpoint import load_server
    from fairvfl_flwr.flower.errors import PartyUnavailable
    from tests.test_reliability import FaultyGrid

    monkeypatch.setenv(partydata.CACHE_ENV, str(tmp_path / "cache"))
    base = {"optimizer": "gd", "dataset": "crime", "epsilon": 0.05, "eval-every": 3, "stop-tolerance": 1e-3,
            "stop-window": 3, "num-server-rounds": 200, "reliability.round-timeout": 0.3,
            "reliability.checkpoint-dir": str(tmp_path / "party-ckpt")}
    full, _ = run_inprocess({**base, "output-dir": str(tmp_path / "full")}, quiet=True)
    assert full["rounds"] < 200
    rc = RunConfig.from_flower({**base, "output-dir": str(tmp_path / "runs"),
                                "reliability.checkpoint-every": 1}).to_flower()
    down = full["rounds"] - 1  # party 3 is down from then on: the last checkpoint is in the quiet stretch
    grid = FaultyGrid(client_app, rc, 6, silent=lambda idx, rnd: idx == 3 and rnd.isdigit() and int(rnd) >= down)
    with pytest.raises(PartyUnavailable):
        run_server(grid, rc)
    (folder,) = (tmp_path / "runs").iterdir()
    assert load_server(folder)[1]["snapshot"]["stop"].quiet_rounds >= 1
    resumed, _ = run_server(FaultyGrid(client_app, rc, 6), {**rc, "reliability.resume-from": str(folder)})
    assert resumed["rounds"] == full["rounds"]
    assert resumed["train_deo"] == pytest.approx(full["train_deo"], abs=1e-12)
