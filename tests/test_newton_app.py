"""``optimizer = "newton"`` through the real ServerApp and ClientApp (algorithms/newton.py):
the same numbers as the one-process reference, centralised Newton with one party, gradient
descent unchanged, no torch, the refusals, the saved blocks and what each role receives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.algorithms.newton import NEWTON
from fairvfl_flwr.core.errors import ConfigError
from fairvfl_flwr.core.newton import CentralisedNewton
from fairvfl_flwr.core.reference import NewtonFloor
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.inprocess import InProcessGrid
from tests.paired_grid import PairedGrid
from fairvfl_flwr.features import transcripts

from fairvfl_flwr.data.problem import party_problem

ROOT = Path(__file__).resolve().parents[1]

EXACT = {"dataset": "crime", "optimizer": "newton", "wire-dtype": "float64", "eval-every": 4,
         "stop-tolerance": 0.0}  # the reference runs every round


pytestmark = pytest.mark.usefixtures("private_party_cache")


def _history(folder: Path) -> list[dict]:
    return json.loads((folder / "history.json").read_text())


def _blocks(folder: Path, parties: int) -> list[dict]:
    out = []
    for k in range(parties):
        with np.load(folder / "parties" / f"partition-{k}" / "block.npz") as f:
            out.append({name: f[name] for name in f.files})
    return out


def _problem(rc: dict):
    cfg = RunConfig.from_flower(rc)
    return cfg, *party_problem(cfg)


def test_the_app_equals_the_one_process_reference_round_for_round(tmp_path):
    """K = 6 parties on Crime: λ every round, the train DEO and the saved θ_k as NewtonFloor's."""
    rc = {**EXACT, "num-parties": 6, "num-server-rounds": 8}
    _, folder = run_inprocess({**rc, "output-dir": str(tmp_path)}, quiet=True)
    history, saved = _history(folder), _blocks(folder, 6)
    cfg, ds, blocks, groups = _problem(rc)
    n = len(ds.y_train)
    floor = NewtonFloor(blocks, ds.y_train, groups, epsilon=cfg.epsilon, beta=cfg.beta, c=cfg.c,
                        mu=cfg.mu_value(n), lr=cfg.lr, Q=cfg.local_steps, active=cfg.num_active)
    for t in range(1, cfg.num_server_rounds + 1):
        floor.round()
        np.testing.assert_allclose(history[t]["lambdas"], floor.lam, rtol=0, atol=1e-10)
        assert history[t]["deo"] == pytest.approx(abs(groups.gaps(ds.y_train, floor.z())[0]), abs=1e-10)
    assert max(abs(history[t]["lambda1"]) for t in range(1, 9)) > 0  # the constraint was active
    for k in range(6):
        np.testing.assert_allclose(saved[k]["weight"], floor.theta[k], rtol=0, atol=1e-10)
    np.testing.assert_allclose(saved[0]["bias"], floor.bias[0], rtol=0, atol=1e-10)


def test_one_active_party_is_centralised_newton(tmp_path):
    rc = {**EXACT, "num-parties": 1, "num-server-rounds": 6}
    _, folder = run_inprocess({**rc, "output-dir": str(tmp_path)}, quiet=True)
    history, (saved,) = _history(folder), _blocks(folder, 1)
    cfg, ds, (x,), groups = _problem(rc)
    ref = CentralisedNewton(x, ds.y_train, groups, epsilon=cfg.epsilon, beta=cfg.beta, c=cfg.c,
                            mu=cfg.mu_value(len(ds.y_train)))
    for t in range(1, cfg.num_server_rounds + 1):
        ref.round()
        np.testing.assert_allclose(history[t]["lambdas"], ref.lam, rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.append(saved["weight"], saved["bias"]), ref.theta, rtol=0, atol=1e-10)


@pytest.mark.parametrize("extra", [{"optimizer": "gd"}, {"preset": "paper"}])
def test_gradient_descent_is_unchanged_bit_for_bit(extra, tmp_path):
    """A short gd run's history as recorded before the optimizer key existed (tests/golden)."""
    golden = json.loads((ROOT / "tests" / "golden" / "gd-crime-12.json").read_text())
    _, folder = run_inprocess({**golden["run-config"], **extra, "output-dir": str(tmp_path)}, quiet=True)
    history = _history(folder)
    for row in history:
        row.pop("seconds", None)
    assert history == golden["history"]


ON = {"batch_size": 64, "max_staleness": 1, "local_time_budget": 1.0, "secure_aggregation": "true",
      "secure_nu": "ckks", "checkpoint_every": 5, "resume_from": "/tmp/run", "mode": "split", "groups_release": "ckks"}


@pytest.mark.parametrize("field", [row[0] for row in NEWTON.refuses])
def test_each_refusal_names_the_key_and_why_and_auto_falls_back_to_gd(field):
    on = next(row[1] for row in NEWTON.refuses if row[0] == field)
    assert on(RunConfig(**{field: ON[field]}))
    if field == "secure_nu":
        pytest.importorskip("tenseal")  # secure-nu='ckks' alone is refused without it
    with pytest.raises(ConfigError, match=rf"run config optimizer='newton': not supported with {RunConfig.key_of(field)}=.*: \S"):
        RunConfig(optimizer="newton", **{field: ON[field]}).validate()
    # the linear model stays, which AdaGrad refuses (split's mode selects the split-learning algorithm)
    expected = "split" if field == "mode" else "gd"
    assert RunConfig(optimizer="auto", **{field: ON[field]}).optimizer_in_use == expected


def test_auto_is_newton_for_linear_full_batch_runs():
    assert RunConfig(optimizer="auto").optimizer_in_use == "newton"
    assert RunConfig(optimizer="gd").optimizer_in_use == "gd"
    # parity on rates (their default measure) or on the loss: Newton (its constrained search
    # needs no row weight >= 0)
    assert RunConfig(optimizer="auto", constraint="equalized-odds").optimizer_in_use == "newton"
    assert RunConfig(optimizer="auto", constraint="demographic-parity").optimizer_in_use == "newton"
    for kind in ("equalized-odds", "demographic-parity"):
        assert RunConfig(optimizer="auto", constraint=kind, constraint_measure="loss").optimizer_in_use == "newton"
    assert RunConfig(optimizer="auto", constraint="equalized-odds", model="mlp").optimizer_in_use == "newton"
    assert RunConfig(optimizer="auto", constraint="equalized-odds", batch_size=256).optimizer_in_use == "gd"
    assert RunConfig(optimizer="newton", constraint="equalized-odds").optimizer_in_use == "newton"
    with pytest.raises(ConfigError, match=r"optimizer='sgd': choose one of auto, newton, adagrad, gd"):
        RunConfig.from_flower({"optimizer": "sgd"})


def test_newton_trained_blocks_score_as_the_run_measured(tmp_path):
    """The last round's step reaches the parties before they save: scoring the saved blocks
    gives the training run's final test metrics exactly (float32 wire, as by default)."""
    base = {"dataset": "crime", "num-server-rounds": 6, "eval-every": 3, "num-parties": 4, "optimizer": "newton"}
    summary, folder = run_inprocess({**base, "output-dir": str(tmp_path / "train")}, quiet=True)
    rc = {**base, "mode": "score", "score.model-from": str(folder), "output-dir": str(tmp_path / "score")}
    cfg = RunConfig.from_flower(rc)
    _, out = run_server(InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties), cfg.to_flower())
    import pandas as pd

    from fairvfl_flwr.core.metrics import fairness_metrics

    ds = load_data(cfg)
    p = pd.read_csv(out / "predictions.csv")
    got = fairness_metrics(ds.y_test, ds.s_test, np.where(p["decision"] == 1, 1.0, -1.0))
    assert (got["acc"], got["dfp"], got["dfn"]) == (summary["test_acc"], summary["test_dfp"], summary["test_dfn"])


def test_what_each_role_receives_under_newton(tmp_path):
    """Passive parties: ν and their own step lengths α_k, nothing else; the server: X_k s_k,
    a and the Gram matrix per party; the transcripts record exactly that."""
    rounds = 4
    rc = {"dataset": "crime", "num-server-rounds": rounds, "eval-every": 2, "num-parties": 3, "optimizer": "newton",
          "privacy.transcript-dir": str(tmp_path / "t"), "output-dir": str(tmp_path / "out")}
    cfg = RunConfig.from_flower(rc)
    seen = []
    grid = InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties, tap=seen.append)
    run_server(grid, cfg.to_flower())
    passive = [m for m in seen if m.metadata.message_type == msgs.NEWTON_PASSIVE]
    assert len(passive) == 2 * rounds  # one message per party and round
    for m in passive:
        assert set(m.content.array_records) == {msgs.PAYLOAD} and set(m.content.config_records) == {msgs.ROUND}
        assert set(m.content.array_records[msgs.PAYLOAD]) == {"nu", "alpha"}
    applied = [m for m in seen if m.metadata.message_type == msgs.NEWTON_APPLY]
    assert len(applied) == 3 and all(set(m.content.array_records[msgs.PAYLOAD]) == {"alpha"} for m in applied)
    for pid in (1, 2):
        views = transcripts.load(tmp_path / "t", pid)
        assert [len(v.get("alpha", [])) for v in views[1:]] == [0, 1, 2, 3]  # its direction and two moves
        assert all("z" not in v and "lam" not in v for v in views)
        assert "alpha-last" in views[-1] and "own-u" in views[-1]
    active = transcripts.load(tmp_path / "t", 0)
    assert {"z", "lam", "alpha", "own-dir"} <= set(active[2])
    server = transcripts.load(tmp_path / "t", transcripts.SERVER)
    assert {f"{k}-{pid}" for k in ("dir", "a", "gram") for pid in range(3)} <= set(server[3])
    assert "test-dirs-1" in server[2] and "test-dirs-1" not in server[3]
    assert server[3]["gram-1"].shape == (3, 3)


def test_newton_transcripts_hold_exactly_what_each_role_received(tmp_path):
    """Every array a role received under Newton is in its transcript, bit for bit, and nothing
    else: passive ν and α; active z, λ and α; the server each reply's X_k s_k, a, Gram matrix,
    test directions and the applied logits, with the α it computed for each party."""
    rounds = 4
    rc = {"dataset": "crime", "num-server-rounds": rounds, "eval-every": 2, "num-parties": 3, "optimizer": "newton",
          "stop-tolerance": 0.0, "privacy.transcript-dir": str(tmp_path / "t"), "output-dir": str(tmp_path / "out")}
    cfg = RunConfig.from_flower(rc)
    grid = PairedGrid(client_app, cfg.to_flower(), cfg.num_parties)
    run_server(grid, cfg.to_flower())
    pid = {nid: i for i, nid in enumerate(grid.node_ids)}  # node i holds partition i
    party = {k: {int(r["round"]): r for r in transcripts.load(tmp_path / "t", k)} for k in range(3)}
    server = {int(r["round"]): r for r in transcripts.load(tmp_path / "t", transcripts.SERVER)}
    expect_server: dict[int, set] = {t: {"round"} for t in range(rounds + 1)}
    expect_party = {k: {t: {"round"} for t in range(rounds + 1)} for k in range(3)}
    checked = 0
    for msg, reply in grid.pairs:
        mtype, k = msg.metadata.message_type, pid[msg.metadata.dst_node_id]
        if mtype not in (msgs.NEWTON_INIT, msgs.NEWTON_ACTIVE, msgs.NEWTON_PASSIVE, msgs.NEWTON_APPLY):
            continue
        t = int(msg.content.config_records[msgs.ROUND]["round"])
        got = {key: arr.numpy() for key, arr in msg.content.array_records.get(msgs.PAYLOAD, {}).items()}
        for key, value in got.items():  # the party side: what arrived
            name = "alpha-last" if mtype == msgs.NEWTON_APPLY else key
            assert np.array_equal(party[k][t][name], value), (k, t, name)
            expect_party[k][t].add(name)
            checked += 1
        if mtype == msgs.NEWTON_APPLY:  # the server computed these α in the last round
            assert np.array_equal(server[t][f"alpha-{k}"], got["alpha"])
        elif t >= 2:  # round t's α, computed in round t − 1
            assert np.array_equal(server[t - 1][f"alpha-{k}"], got["alpha"])
        if "nu" in got:
            assert np.array_equal(server[t]["nu"], got["nu"])
            expect_server[t].add("nu")
        if "z" in got:
            assert np.array_equal(server[t]["z"], got["z"]) and np.array_equal(server[t]["lam"], got["lam"])
            expect_server[t] |= {"z", "lam"}
        for record, prefix in ((msgs.DIRECTIONS, ""), (msgs.LOGITS, "u-")):  # the server side: each reply
            for key, arr in reply.content.array_records.get(record, {}).items():
                name = f"{prefix}{key}-{k}".replace("u-train-", "u-")
                assert np.array_equal(server[t][name], arr.numpy()), (t, name)
                expect_server[t].add(name)
                checked += 1
        own = {msgs.DIRECTIONS: ("dir", "own-dir"), msgs.LOGITS: ("train", "own-u")}
        for record, (key, name) in own.items():
            if record in reply.content.array_records:
                assert np.array_equal(party[k][t][name], reply.content.array_records[record][key].numpy())
                expect_party[k][t].add(name)
    for t in range(1, rounds + 1):
        expect_server[t] |= {f"alpha-{k}" for k in range(3)}
    assert {t: set(r) for t, r in server.items()} == expect_server
    for k in range(3):
        assert {t: set(r) for t, r in party[k].items()} == expect_party[k]
    assert {"u-0", "u-1", "u-2", "u-test-1"} <= expect_server[rounds]  # the applied logits, as received
    assert expect_party[1][2] == {"round", "nu", "alpha", "own-dir"}  # a passive party: ν and α, nothing else
    assert checked > 50


def test_newton_runs_with_noise_on_nu_and_records_the_passive_view(tmp_path):
    """Allowed features: passive parties derive h and s_k from the noisy ν, the server's search
    is on the true objective; privacy.record-view keeps the ν a passive party received."""
    rc = {"dataset": "crime", "num-server-rounds": 3, "eval-every": 3, "num-parties": 3, "optimizer": "newton",
          "privacy.nu-noise": 1.0, "privacy.record-view": str(tmp_path / "view"), "output-dir": str(tmp_path / "o")}
    summary, folder = run_inprocess(rc, quiet=True)
    history = _history(folder)
    assert all(np.isfinite(r["loss"]) for r in history) and history[-1]["loss"] < history[0]["loss"]
    rounds, _ = transcripts.stack(transcripts.load(tmp_path / "view", 1), "nu")
    assert list(rounds) == [1, 2, 3]


def test_a_converged_newton_run_ends_early_with_the_same_model(tmp_path):
    """stop-tolerance ends training once the objective stops moving with the gaps at ε; the
    model is the one the same run capped at that round gives (nothing skipped, nothing extra)."""
    base = {"dataset": "compas", "optimizer": "newton", "epsilon": 0.01, "num-server-rounds": 40, "eval-every": 40,
            "sensitive-as-input": True}  # as measured: race among the inputs
    stopped, folder = run_inprocess({**base, "output-dir": str(tmp_path / "a")})
    assert 2 <= stopped["rounds"] < 40
    history = _history(folder)
    assert history[-1]["round"] == stopped["rounds"] and history[-1].get("acc") is not None  # evaluated there
    assert stopped["train_deo"] <= 0.01 + 1e-3
    capped, _ = run_inprocess({**base, "num-server-rounds": stopped["rounds"], "stop-tolerance": 0.0,
                               "output-dir": str(tmp_path / "b")})
    for k in ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn"):
        assert stopped[k] == capped[k], k


def test_stop_tolerance_zero_runs_every_round_and_negative_is_refused(tmp_path):
    summary, _ = run_inprocess({"dataset": "compas", "optimizer": "newton", "num-server-rounds": 12,
                                "eval-every": 12, "stop-tolerance": 0.0, "output-dir": str(tmp_path)})
    assert summary["rounds"] == 12
    with pytest.raises(ConfigError, match="stop-tolerance"):
        RunConfig.from_flower({"stop-tolerance": -1.0})


@pytest.mark.parametrize("memory", [0, 2])
def test_newton_memory_is_the_number_of_moves_searched_with_each_new_direction(tmp_path, memory):
    """newton-memory = m: once a party has moved m times, each search holds its new direction and
    its last m moves, so the step lengths it gets have 1 + m entries, never more."""
    rc = {"dataset": "crime", "optimizer": "newton", "num-server-rounds": 6, "eval-every": 6, "num-parties": 3,
          "stop-tolerance": 0.0, "newton-memory": memory, "output-dir": str(tmp_path)}
    cfg = RunConfig.from_flower(rc)
    seen = []
    run_server(InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties, tap=seen.append), cfg.to_flower())
    lengths = {len(m.content.array_records[msgs.PAYLOAD]["alpha"].numpy()) for m in seen
               if m.metadata.message_type in (msgs.NEWTON_ACTIVE, msgs.NEWTON_PASSIVE)}
    assert max(lengths) == 1 + memory
    with pytest.raises(ConfigError, match="newton-memory"):
        RunConfig.from_flower({"newton-memory": -1})


def test_newton_shared_memory_sets_the_combined_moves_under_secure_aggregation(tmp_path):
    """Under secure aggregation the step lengths are shared: every party gets the same
    1 + newton-shared-memory of them once enough rounds have passed; newton-memory (the
    per-party search's) plays no part."""
    rc = {"dataset": "crime", "optimizer": "newton", "num-server-rounds": 8, "eval-every": 8, "num-parties": 3,
          "stop-tolerance": 0.0, "newton-memory": 1, "newton-shared-memory": 5,
          "privacy.secure-aggregation": True, "output-dir": str(tmp_path)}
    cfg = RunConfig.from_flower(rc)
    seen = []
    run_server(InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties, tap=seen.append), cfg.to_flower())
    last = {}
    for m in seen:
        if m.metadata.message_type in (msgs.NEWTON_ACTIVE, msgs.NEWTON_PASSIVE):
            last[m.metadata.dst_node_id] = m.content.array_records[msgs.PAYLOAD]["alpha"].numpy()
    assert len(last) == 3 and {len(a) for a in last.values()} == {6}
    first = next(iter(last.values()))
    assert all(np.array_equal(a, first) for a in last.values())
    with pytest.raises(ConfigError, match="newton-shared-memory"):
        RunConfig.from_flower({"newton-shared-memory": 17})


@pytest.mark.slow  # 30 CKKS rounds on COMPAS; the fast loop runs Newton under CKKS in test_privacy.py
def test_newton_under_encrypted_nu_ends_where_the_server_tracked_it(tmp_path):
    """Under CKKS the late directions are mostly encryption noise; the last round's apply
    message returns the parties' true logits, which must be the model the server tracked
    (before the search's float32 cut-off, 3 of 4 such runs ended at train DEO 0.02-0.21)."""
    pytest.importorskip("tenseal")
    summary, folder = run_inprocess({"dataset": "compas", "optimizer": "newton", "num-server-rounds": 30,
                                     "eval-every": 3, "stop-tolerance": 0.0, "privacy.secure-nu": "ckks",
                                     "sensitive-as-input": True,  # as measured: race among the inputs
                                     "output-dir": str(tmp_path)}, quiet=True)
    history = json.loads((folder / "history.json").read_text())
    assert abs(history[-1]["deo"] - history[-2]["deo"]) < 1e-4
    assert summary["train_deo"] <= 0.01 + 0.002


@pytest.mark.parametrize("fairness,says", [(True, "lambda from the constrained search"),
                                           (False, "lambda 0 (no fairness term)")])
def test_the_log_says_where_lambda_comes_from(tmp_path, caplog, fairness, says):
    """Block Newton's settings line names the multipliers' rule: the constrained search's, or none
    without the fairness term (where no search sets them)."""
    import logging
    caplog.set_level(logging.INFO, logger="flwr")
    run_inprocess({**EXACT, "fairness": fairness, "num-server-rounds": 1, "output-dir": str(tmp_path)})
    line = next(r.getMessage() for r in caplog.records if "optimizer=newton" in r.getMessage())
    assert says in line and "beta=" not in line, line
