"""Faults and resuming, fast: the real ServerApp strategy and ClientApp over the
in-process grid, with grids that lose, drop or tamper with messages.

The deployment version (a SuperNode killed mid-run, restarted, resumed) is in
tests/test_reliability_deploy.py (slow).
"""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower import checks as validate
from fairvfl_flwr.flower import store
from fairvfl_flwr.flower.party import MODEL_STATE
from fairvfl_flwr.features.checkpoint import SERVER_FILE, CheckpointError, load_server
from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.flower.errors import FederationError, PartyUnavailable

N = 1200  # Crime training rows
ROUNDS = 6
BASE = {"optimizer": "gd", "dataset": "crime", "num-server-rounds": ROUNDS, "eval-every": 3, "epsilon": 0.05,
        "reliability.checkpoint-every": 2, "reliability.round-timeout": 0.3, "reliability.round-retries": 1}
KEYS = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn", "rounds")


pytestmark = pytest.mark.usefixtures("private_party_cache")


def _rc(tmp_path, **extra):
    rc = {**BASE, "output-dir": str(tmp_path / "runs"), "reliability.checkpoint-dir": str(tmp_path / "party-ckpt"), **extra}
    return RunConfig.from_flower(rc).to_flower()


class FaultyGrid(InProcessGrid):
    """An in-process grid where messages to chosen nodes get lost or replies tampered with.

    ``silent(node_index, round)`` → True: the message never reaches the node (the node is down).
    ``lose_reply(node_index, round)`` → True: the node handles it, but its reply is lost.
    ``tamper(node_index, round, reply)``: may change the reply before the server sees it.
    """

    def __init__(self, *a, silent=None, lose_reply=None, tamper=None, **kw):
        super().__init__(*a, **kw)
        self.silent, self.lose_reply, self.tamper = silent, lose_reply, tamper
        self.delivered: list[tuple[int, str, str]] = []

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            idx = self.node_ids.index(msg.metadata.dst_node_id)
            rnd = msg.metadata.group_id
            if self.silent and self.silent(idx, rnd):
                msg.metadata.__dict__["_message_id"] = f"lost-{len(self.delivered)}-{id(msg)}"
                self.delivered.append((idx, rnd, "dropped"))
                ids.append(msg.metadata.message_id)
                continue
            (mid,) = super().push_messages([msg])
            self.delivered.append((idx, rnd, msg.metadata.message_type))
            if self.lose_reply and self.lose_reply(idx, rnd):
                self._replies.pop(mid)
            elif self.tamper:
                self.tamper(idx, rnd, self._replies[mid])
            ids.append(mid)
        return ids


def _grid(rc, seed=0, **faults):
    return FaultyGrid(client_app, rc, rc["num-parties"], seed=seed, **faults)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    rc = {**_rc(tmp), "reliability.checkpoint-every": 0}
    summary, folder = run_server(_grid(rc), rc)
    return summary, json.loads((folder / "history.json").read_text())


# -- the validation layer (unit) -----------------------------------------------------------
def test_short_vector_nan_and_wrong_dtype_are_rejected_with_what_was_wrong():
    who = "node 7 (partition 2, passive)"
    ok = np.zeros(N)
    assert validate.check_vector(ok, "train logits", N, who) is ok
    with pytest.raises(validate.ReplyError, match=r"node 7 \(partition 2, passive\): train logits has shape \(1199,\), expected \(1200,\)"):
        validate.check_vector(np.zeros(N - 1), "train logits", N, who)
    bad = ok.copy()
    bad[[3, 9]] = [np.nan, np.inf]
    with pytest.raises(validate.ReplyError, match=r"train logits holds 2 non-finite value\(s\).*larger eta"):
        validate.check_vector(bad, "train logits", N, who)
    with pytest.raises(validate.ReplyError, match=r"has dtype int64, expected float32 or float64"):
        validate.check_vector(np.zeros(N, dtype=np.int64), "train logits", N, who)
    with pytest.raises(validate.ReplyError, match=r"is a list, not an array"):
        validate.check_vector([0.0] * N, "train logits", N, who)
    with pytest.raises(validate.ReplyError, match=r"lam has negative entries"):
        validate.check_vector(np.array([0.1, -1.0]), "lam", 2, who, nonneg=True)


def test_reply_content_checks():
    who = "node 1 (partition 0, active)"
    good = RecordDict({msgs.LOGITS: ArrayRecord({"train": Array(np.zeros(N)), "test": Array(np.zeros(794))}),
                       msgs.STATS: MetricRecord({"sq-norm": 1.0, "steps": 5})})
    assert set(validate.check_logits_reply(good, who, N, 794)) == {"train", "test"}
    with pytest.raises(validate.ReplyError, match=r"reply holds no 'logits' arrays"):
        validate.check_logits_reply(RecordDict({msgs.STATS: MetricRecord({"sq-norm": 1.0, "steps": 1})}), who, N, 794)
    short_test = RecordDict({msgs.LOGITS: ArrayRecord({"train": Array(np.zeros(N)), "test": Array(np.zeros(10))}),
                             msgs.STATS: MetricRecord({"sq-norm": 1.0, "steps": 5})})
    with pytest.raises(validate.ReplyError, match=r"test logits has shape \(10,\), expected \(794,\)"):
        validate.check_logits_reply(short_test, who, N, 794)
    nan_norm = RecordDict({msgs.LOGITS: ArrayRecord({"train": Array(np.zeros(N))}),
                           msgs.STATS: MetricRecord({"sq-norm": float("nan"), "steps": 5})})
    with pytest.raises(validate.ReplyError, match=r"sq-norm=nan is not a finite number"):
        validate.check_logits_reply(nan_norm, who, N, 794)


def test_envelope_checks_type_and_sender():
    def meta(**kw):
        return SimpleNamespace(metadata=SimpleNamespace(**kw))

    sent = {"m1": meta(dst_node_id=5, message_type=msgs.TRAIN_PASSIVE)}
    validate.check_envelope(meta(reply_to_message_id="m1", src_node_id=5, message_type=msgs.TRAIN_PASSIVE), sent, "n")
    with pytest.raises(validate.ReplyError, match=r"reply has message type 'train.active', expected 'train.passive'"):
        validate.check_envelope(meta(reply_to_message_id="m1", src_node_id=5, message_type=msgs.TRAIN_ACTIVE), sent, "n")
    with pytest.raises(validate.ReplyError, match=r"reply comes from node 6, but the message went to node 5"):
        validate.check_envelope(meta(reply_to_message_id="m1", src_node_id=6, message_type=msgs.TRAIN_PASSIVE), sent, "n")
    with pytest.raises(validate.ReplyError, match=r"reply to unknown message 'zz'"):
        validate.check_envelope(meta(reply_to_message_id="zz", src_node_id=5, message_type=msgs.TRAIN_PASSIVE), sent, "n")


def test_divergence_guard_unit():
    validate.check_state(0.5, np.array([0.1, 0.0]), 3)
    with pytest.raises(validate.DivergenceError, match=r"diverged at round 4.*smaller step \(a larger eta"):
        validate.check_state(float("nan"), np.array([0.1, 0.0]), 4)
    with pytest.raises(validate.DivergenceError, match=r"diverged at round 5"):
        validate.check_state(0.5, np.array([np.inf, 0.0]), 5)


def test_new_options_are_checked():
    with pytest.raises(ConfigError, match="reliability.round-retries"):
        RunConfig(round_retries=-1).validate()
    with pytest.raises(ConfigError, match="reliability.checkpoint-every"):
        RunConfig(checkpoint_every=-2).validate()


# -- bad replies through real messages -----------------------------------------------------
def _tamper_train(kind):
    def tamper(idx, rnd, reply):
        if idx != 2 or rnd != "3":
            return
        record = reply.content.array_records[msgs.LOGITS]
        u = record["train"].numpy()
        if kind == "short":
            record["train"] = Array(u[:-1].copy())
        elif kind == "nan":
            v = u.copy()
            v[5] = np.nan
            record["train"] = Array(v)
        elif kind == "dtype":
            record["train"] = Array(np.zeros(len(u), dtype=np.int32))
        elif kind == "type":
            reply.metadata.__dict__["_message_type"] = msgs.TRAIN_ACTIVE
    return tamper


@pytest.mark.parametrize("kind, message", [
    ("short", r"train logits has shape \(1199,\), expected \(1200,\)"),
    ("nan", r"train logits holds 1 non-finite value"),
    ("dtype", r"train logits has dtype int32"),
    ("type", r"reply has message type 'train.active', expected 'train.passive'"),
])
def test_bad_reply_is_rejected_naming_the_node_before_it_reaches_lambda(tmp_path, kind, message):
    rc = _rc(tmp_path)
    grid = _grid(rc, tamper=_tamper_train(kind))
    node = grid.node_ids[2]
    with pytest.raises(FederationError, match=rf"rejected a reply: node {node} \(partition 2, passive\): {message}"):
        run_server(grid, rc)
    (folder,) = (tmp_path / "runs").iterdir()
    history = json.loads((folder / "history.json").read_text())
    assert [r["round"] for r in history] == [0, 1, 2]  # round 3's replies were not used
    assert all(np.isfinite(r["lambda1"]) for r in history)
    state, _ = load_server(folder)
    assert state["round"] == 2  # the last good checkpoint stays


def test_party_rejects_a_malformed_nu(tmp_path):
    rc = _rc(tmp_path)

    def tap(msg):
        if msg.metadata.message_type == msgs.TRAIN_PASSIVE and msg.metadata.group_id == "2":
            nu = msg.content.array_records[msgs.PAYLOAD]["nu"].numpy()
            msg.content.array_records[msgs.PAYLOAD]["nu"] = Array(nu[:100].copy())

    grid = _grid(rc, tap=tap)
    with pytest.raises(FederationError, match=r"failed: ReplyError: party \d \(passive, node \d+\): nu has shape \(100,\)"):
        run_server(grid, rc)


# -- divergence -------------------------------------------------------------------------------
def test_divergence_stops_the_run_keeping_the_last_good_checkpoint(tmp_path):
    rc = _rc(tmp_path, **{"eta": 1e-5, "num-server-rounds": 60, "reliability.checkpoint-every": 1})
    # a real blow-up: the first non-finite numbers show up in a party's reply (rejected) or in z/L/λ (guard)
    with pytest.raises((validate.DivergenceError, FederationError), match=r"larger eta"):
        run_server(_grid(rc), rc)
    (folder,) = (tmp_path / "runs").iterdir()
    _, state = load_server(folder)
    kept = state["snapshot"]
    assert np.isfinite(kept["lam"]).all() and all(np.isfinite(v).all() for v in kept["u_train"].values())
    assert np.isfinite(kept["history"][-1]["loss"])


# -- missing party, lost reply, resume ----------------------------------------------------------
def test_lost_reply_is_resent_and_not_applied_twice(tmp_path, uninterrupted):
    rc = _rc(tmp_path)
    lost = set()

    def lose(idx, rnd):  # the first reply of the passive party 4 in round 3 and of the active party in round 4
        if (idx, rnd) in {(4, "3"), (0, "4")} and (idx, rnd) not in lost:
            lost.add((idx, rnd))
            return True
        return False

    grid = _grid(rc, lose_reply=lose)
    summary, _ = run_server(grid, rc)
    assert [d for d in grid.delivered if d[0] == 4 and d[1] == "3"] == [(4, "3", msgs.TRAIN_PASSIVE)] * 2
    assert [d for d in grid.delivered if d[0] == 0 and d[1] == "4"] == [(0, "4", msgs.TRAIN_ACTIVE)] * 2
    for context in grid.contexts.values():  # no copy of the logits kept in the party's state
        assert not [k for k in context.state if k.startswith("fairvfl.last-reply.")]
    for key in KEYS:
        assert summary[key] == uninterrupted[0][key], key  # the party answered the re-send from its cache


@pytest.mark.parametrize("optimizer, model", [("newton", "linear"), ("gd", "linear"),
                                              pytest.param("newton", "mlp", marks=pytest.mark.slow)])
def test_a_masked_run_that_stops_resumes_to_the_uninterrupted_model_bit_for_bit(tmp_path, caplog, optimizer, model):
    """Under secure aggregation (and block Newton, whose parties continue from their directions and
    last moves; Gauss-Newton blocks, whose round ends with its move): every party restores the
    checkpoint's round at the resumed run's signed set-up."""
    extra = {"privacy.secure-aggregation": True, "optimizer": optimizer, "model": model}
    full_rc = _rc(tmp_path / "full", **{**extra, "reliability.checkpoint-every": 0})
    full, full_folder = run_server(_grid(full_rc), full_rc)
    rc = _rc(tmp_path, **extra)
    grid = _grid(rc, silent=lambda idx, rnd: idx == 3 and rnd.isdigit() and int(rnd) >= 5)
    with pytest.raises(PartyUnavailable):
        run_server(grid, rc)
    (folder,) = (tmp_path / "runs").iterdir()
    assert "run stopped after round 4" in caplog.text and f'reliability.resume-from="{folder}"' in caplog.text
    resumed_rc = {**rc, "reliability.resume-from": str(folder)}
    dtypes = []

    def seen(idx, rnd, reply):
        for name in (msgs.LOGITS, msgs.DIRECTIONS):
            dtypes.extend(a.numpy().dtype for a in reply.content.array_records.get(name, {}).values())

    resumed = _grid(resumed_rc, seed=99, tamper=seen)  # every party restarted: fresh node state, new node ids
    summary, _ = run_server(resumed, resumed_rc)
    assert "every party signed the move back to round 4" in caplog.text
    for key in KEYS:
        assert summary[key] == full[key], key
    ours, theirs = (json.loads((f / "history.json").read_text()) for f in (folder, full_folder))
    assert [(r["round"], r["loss"], r["max_gap"]) for r in ours] == [(r["round"], r["loss"], r["max_gap"]) for r in theirs]
    assert dtypes and all(d == np.uint64 for d in dtypes)  # masked words only, resumed too


@pytest.mark.slow
def test_a_registry_run_with_a_release_margin_resumes_to_the_uninterrupted_model_bit_for_bit(tmp_path, caplog):
    """A registry's randomized-response groups with the default release margin under block Newton: the
    scores the spread gaps take their slopes at are part of the checkpoint, so the resumed rounds
    take the same steps (the registry's secret is a file: the resumed run gets the same release)."""
    key = tmp_path / "registry-secret"
    key.write_bytes(bytes(range(32)))
    extra = {"optimizer": "newton", "groups.holder": "registry", "groups.epsilon-s": 1.0}
    nodes = [{"partition-id": k, "num-partitions": 6} for k in range(6)]
    nodes[-1]["release-secret"] = str(key)
    full_rc = _rc(tmp_path / "full", **{**extra, "reliability.checkpoint-every": 0})
    full, full_folder = run_server(_grid(full_rc, node_configs=nodes), full_rc)
    rc = _rc(tmp_path, **extra)
    grid = _grid(rc, silent=lambda idx, rnd: idx == 3 and rnd.isdigit() and int(rnd) >= 5, node_configs=nodes)
    with pytest.raises(PartyUnavailable):
        run_server(grid, rc)
    (folder,) = (tmp_path / "runs").iterdir()
    resumed_rc = {**rc, "reliability.resume-from": str(folder)}
    summary, _ = run_server(_grid(resumed_rc, seed=99, node_configs=nodes), resumed_rc)
    ours, theirs = (json.loads((f / "history.json").read_text()) for f in (folder, full_folder))
    assert [(r["round"], r["loss"], r["gaps"], r["lambdas"]) for r in ours] == \
        [(r["round"], r["loss"], r["gaps"], r["lambdas"]) for r in theirs]
    spreads = [name for name in theirs[-1]["gaps"] if name.endswith(" (release spread)")]
    assert spreads and len(spreads) == len(theirs[-1]["gaps"]) // 2
    # the spread gaps held the run somewhere after the checkpoint (their multipliers: the second half)
    assert any(max(r["lambdas"][len(r["lambdas"]) // 2:]) > 0 for r in theirs[5:])
    assert summary["train_release_error"] == full["train_release_error"]


def test_missing_party_stops_the_run_then_resume_equals_uninterrupted(tmp_path, uninterrupted, caplog):
    rc = _rc(tmp_path)
    down_from = 5  # party 3 goes down in round 5; the last checkpoint is round 4
    grid = _grid(rc, silent=lambda idx, rnd: idx == 3 and rnd.isdigit() and int(rnd) >= down_from)
    with pytest.raises(PartyUnavailable, match=rf"no reply within 0.3 s after 2 tries from node {grid.node_ids[3]} \(partition 3, passive\)"):
        run_server(grid, rc)
    assert sum(d[0] == 3 and d[1] == str(down_from) for d in grid.delivered) == 2  # first try + 1 retry
    (folder,) = (tmp_path / "runs").iterdir()
    assert "run stopped after round 4" in caplog.text and f'reliability.resume-from="{folder}"' in caplog.text
    history = json.loads((folder / "history.json").read_text())
    assert [r["round"] for r in history] == list(range(down_from))
    assert load_server(folder)[0]["round"] == 4

    # "restart" every party: fresh contexts (no state), new node ids; θ comes from their own disks
    resumed_rc = {**rc, "reliability.resume-from": str(folder)}
    summary, folder2 = run_server(_grid(resumed_rc, seed=99), resumed_rc)
    assert folder2 == folder
    full_summary, full_history = uninterrupted
    for key in KEYS:
        assert summary[key] == pytest.approx(full_summary[key], rel=1e-9, abs=1e-12), key
    history = json.loads((folder / "history.json").read_text())
    assert [r["round"] for r in history] == list(range(ROUNDS + 1))
    for a, b in zip(history, full_history):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-9) and a["lambda1"] == pytest.approx(b["lambda1"], rel=1e-9, abs=1e-15)


def test_resume_refuses_other_settings_and_missing_party_checkpoints(tmp_path):
    rc = _rc(tmp_path, **{"num-server-rounds": 2})
    _, folder = run_server(_grid(rc), rc)
    with pytest.raises(CheckpointError, match=r"run config epsilon=0.1 differs from the checkpoint's 0.05"):
        run_server(_grid(rc), {**rc, "epsilon": 0.1, "reliability.resume-from": str(folder), "num-server-rounds": 4})
    with pytest.raises(CheckpointError, match=r"nothing to run"):
        run_server(_grid(rc), {**rc, "reliability.resume-from": str(folder)})
    with pytest.raises(CheckpointError, match=r"no checkpoint.npz"):
        run_server(_grid(rc), {**rc, "reliability.resume-from": str(tmp_path), "num-server-rounds": 4})
    # a party whose disk lost its checkpoints is named
    other = {**rc, "reliability.checkpoint-dir": str(tmp_path / "empty"), "reliability.resume-from": str(folder), "num-server-rounds": 4}
    with pytest.raises(FederationError, match=r"party \d \((active|passive), node \d+\) holds no state of round 2 of this run"):
        run_server(_grid(other), other)
    # extending a finished run continues it
    more = {**rc, "reliability.resume-from": str(folder), "num-server-rounds": 4}
    summary, _ = run_server(_grid(more), more)
    assert summary["rounds"] == 4 and (folder / SERVER_FILE).exists()


def test_divergence_guard_catches_overflowing_sums(tmp_path):
    """Every reply finite (1e308), their sum z is not: the guard stops before ν or λ use it."""
    rc = _rc(tmp_path, **{"reliability.checkpoint-every": 1})

    def tamper(idx, rnd, reply):
        if rnd == "3":
            record = reply.content.array_records[msgs.LOGITS]
            record["train"] = Array(np.full(N, 1e308))

    with pytest.raises(validate.DivergenceError, match=r"diverged at round 3: .*1200 non-finite summed logits z.*larger eta"):
        run_server(_grid(rc, tamper=tamper), rc)
    (folder,) = (tmp_path / "runs").iterdir()
    assert load_server(folder)[0]["round"] == 2  # the last good checkpoint is kept, round 3 never written


def test_party_states_keep_the_latest_rounds_and_checkpoint_rounds_up_to_now(tmp_path):
    """A run that got further before it stopped leaves later rounds; a resumed run replaces them.
    Checkpoint rounds outlive the rounds a rejoin keeps."""
    folder = tmp_path / "p"

    def state(r):
        return RecordDict({MODEL_STATE: ArrayRecord({"w": Array(np.array([float(r)]))})})

    for r in range(0, 12):
        store.save_state(folder, r, state(r), checkpoint_every=4)
    assert sorted(p.stem for p in folder.iterdir()) == ["round-00000000", "round-00000004", "round-00000008",
                                                         "round-00000009", "round-00000010", "round-00000011"]
    store.save_state(folder, 8, state(8), checkpoint_every=4)  # resumed from round 7 elsewhere: 9-11 are stale now
    assert sorted(p.stem for p in folder.iterdir()) == ["round-00000000", "round-00000004", "round-00000008"]
    assert float(store.load_state(folder, 8, "party 0")[MODEL_STATE]["w"].numpy()[0]) == 8.0
    with pytest.raises(store.StateStoreError, match=r"party 0 holds no state of round 9 .*has: round-00000000, "
                                                    r"round-00000004, round-00000008"):
        store.load_state(folder, 9, "party 0")


@pytest.mark.slow  # CKKS key set-up; lost replies are re-sent in the fast loop without CKKS
def test_lost_replies_under_ckks_are_resent_without_new_masks_or_steps(tmp_path):
    """privacy.secure-nu=ckks: the re-sent encrypted leg gets the same masked ciphertexts (its masks stay)."""
    pytest.importorskip("tenseal")
    from fairvfl_flwr.features import ckks as secure

    rc = _rc(tmp_path, **{"privacy.secure-nu": "ckks", "num-server-rounds": 3, "eval-every": 3, "reliability.checkpoint-every": 0})
    plain, _ = run_server(_grid(rc), rc)
    lost = set()

    def lose(idx, rnd):
        if (idx, rnd) in {(3, "2"), (4, "3")} and (idx, rnd) not in lost:
            lost.add((idx, rnd))
            return True
        return False

    grid = _grid(rc, lose_reply=lose)
    summary, _ = run_server(grid, rc)
    assert sum(d == (3, "2", secure.TRAIN_PASSIVE_ENC) for d in grid.delivered) == 2
    assert sum(d == (4, "3", secure.TRAIN_PASSIVE_ENC) for d in grid.delivered) == 2
    for key in KEYS:
        assert summary[key] == pytest.approx(plain[key], rel=1e-9, abs=1e-9), key  # CKKS noise only
