"""The app-level mini-batch key ``batching.batch-size`` (core/batching.py, the server, the ClientApp)."""

import numpy as np
import pytest
import torch
from flwr.app import Array

from fairvfl_flwr.core import batching
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.core.constraints import from_labels
from fairvfl_flwr.core.models import build_model
from fairvfl_flwr.core.objective import train_stats
from fairvfl_flwr.data.partition import split_columns
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.core.reference import CentralisedGDA
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.flower.errors import FederationError

N_TRAIN, N_TEST = 1200, 793  # Crime's training and test rows


class RecordingGrid(InProcessGrid):
    """The in-process grid, keeping every (message, reply) pair; ``tamper(msg, reply)`` may edit a reply."""

    def __init__(self, *a, tamper=None, **kw):
        super().__init__(*a, **kw)
        self.pairs: list[tuple] = []
        self.tamper = tamper

    def _answer(self, msg):
        reply = super()._answer(msg)
        if self.tamper is not None and not reply.has_error():
            self.tamper(msg, reply)
        self.pairs.append((msg, reply))
        return reply


def _crime(out_dir, **kw) -> RunConfig:
    base = dict(optimizer="gd", dataset="crime", model="linear", num_server_rounds=6, eval_every=3, output_dir=out_dir)
    return RunConfig(**{**base, **kw})


# -- federated = centralised mini-batch descent-ascent ------------------------------------------
@pytest.mark.parametrize("kind,num_active,b", [("deo", 1, 100), ("demographic-parity", 2, 150)])
def test_q1_minibatch_run_equals_centralised_minibatch_descent_ascent(kind, num_active, b, out_dir, run_app):
    rounds, seed = 8, 3
    cfg = _crime(out_dir, local_steps=1, num_server_rounds=rounds, eval_every=4, num_active=num_active, eta=5.0,
                 beta=1.0, seed=seed, constraint=kind, batch_size=b, wire_dtype="float64")
    run = run_app(cfg)
    summary, history = run.summary, run.history

    ds = load_data(cfg)
    cols = split_columns(ds.n_features, 6, num_active, 49)
    models = [build_model("linear", len(c), bias=k < num_active, seed=seed * 1000 + k) for k, c in enumerate(cols)]
    blocks = [torch.from_numpy(np.ascontiguousarray(ds.X_train[:, c])) for c in cols]
    constraint = from_labels(ds.y_train, ds.s_train, ds.protected_label, kind, cfg.measure)
    ref = CentralisedGDA(models, blocks, ds.y_train.astype(float), constraint,
                         epsilon=cfg.epsilon, beta=1.0, c=1e-3, mu=2 / len(ds.y_train), lr=1 / 5.0)
    for t in range(1, rounds + 1):
        ref.round(batching.batch_rows(seed, t, len(ds.y_train), b))

    fed = run.thetas()
    for k, m in enumerate(models):
        for name, p in m.state_dict().items():
            assert torch.allclose(fed[k][name], p, atol=1e-10), (k, name)
    lams = np.array([r["lambdas"] for r in history[1:]])
    assert np.allclose(lams, np.array(ref.lams), atol=1e-12)
    assert lams.max() > 0
    # evaluation rounds record L and the gaps on every training row, the others on the next batch
    assert [r["train_rows"] for r in history] == [N_TRAIN if r["round"] % 4 == 0 else b for r in history]
    assert history[-1]["max_gap"] == pytest.approx(train_stats(ds.y_train, ref.z(), constraint).max_gap, abs=1e-12)
    assert summary["batch_size"] == b and summary["train_max_gap"] == history[-1]["max_gap"]


# -- what travels -----------------------------------------------------------------------------
def test_batch_rounds_send_b_values_and_passive_parties_still_receive_only_nu(out_dir, run_app):
    b = 200
    cfg = _crime(out_dir, batch_size=b)
    run = run_app(cfg, RecordingGrid)
    grid, history = run.grid, run.history
    active = {nid for nid, ctx in grid.contexts.items() if ctx.node_config["partition-id"] < cfg.num_active}
    trained = 0
    for msg, reply in grid.pairs:
        kind = msg.metadata.message_type
        if kind not in (msgs.TRAIN_ACTIVE, msgs.TRAIN_PASSIVE):
            continue
        trained += 1
        rc = msg.content.config_records[msgs.ROUND]
        t, evaluate = int(rc["round"]), bool(rc["evaluate"])
        payload = msg.content.array_records[msgs.PAYLOAD]
        if msg.metadata.dst_node_id in active:
            assert kind == msgs.TRAIN_ACTIVE and set(payload) == {"z", "lam"}
            assert payload["z"].numpy().shape == (b,)
        else:  # passive: ν on the batch rows and the round config, nothing else (no row indices either)
            assert kind == msgs.TRAIN_PASSIVE
            assert set(msg.content.array_records) == {msgs.PAYLOAD} and set(payload) == {"nu"}
            assert payload["nu"].numpy().shape == (b,)
            assert not msg.content.metric_records
            assert set(msg.content.config_records) == {msgs.ROUND} and set(rc) == {"round", "evaluate"}
        logits = reply.content.array_records[msgs.LOGITS]
        assert evaluate == (t % 3 == 0)
        if evaluate:  # full-row train logits for the train metrics, and the test rows
            assert logits["train"].numpy().shape == (N_TRAIN,) and logits["test"].numpy().shape == (N_TEST,)
        else:  # the next round's batch, for its dual step and ν
            assert set(logits) == {"train"} and logits["train"].numpy().shape == (b,)
    assert trained == 6 * cfg.num_server_rounds
    evaluated = [r for r in history if r["acc"] is not None]
    assert [r["round"] for r in evaluated] == [0, 3, 6] and all(r["train_rows"] == N_TRAIN for r in evaluated)
    assert evaluated[-1]["acc"] > 0.7  # test metrics on every test row (full-batch run: 0.75)


def test_batch_size_at_least_the_training_rows_is_the_full_batch(out_dir, run_app):
    full = run_app(_crime(out_dir))
    same = run_app(_crime(out_dir, batch_size=N_TRAIN), RecordingGrid)
    h_full, h_same = full.history, same.history
    drop = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in h_same] == \
        [{k: v for k, v in r.items() if k not in drop} for r in h_full]
    assert "train_rows" not in h_same[0] and same.summary["batch_size"] == 0 == full.summary["batch_size"]
    for msg, _ in same.grid.pairs:
        if msg.metadata.message_type == msgs.TRAIN_PASSIVE:
            assert msg.content.array_records[msgs.PAYLOAD]["nu"].numpy().shape == (N_TRAIN,)


# -- refusals and checks ------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [
    {"batching.batch-size": -1},
    {"batching.batch-size": 64, "staleness.max-staleness": 1},
    {"batching.batch-size": 64, "privacy.secure-nu": "ckks"},
    {"batching.batch-size": 64, "reliability.checkpoint-every": 5},
    {"batching.batch-size": 64, "reliability.resume-from": "/tmp/some-run"},
    {"batching.batch-size": 64, "privacy.record-view": "/tmp/views"},
])
def test_bad_batch_sizes_are_refused_by_name(extra):
    with pytest.raises(ConfigError, match=r"run config batching.batch-size="):
        RunConfig.from_flower({"dataset": "crime", **extra})


def test_split_mode_refuses_a_batch_size():
    with pytest.raises(ConfigError, match=r"batching.batch-size=64: not supported with mode='split'"):
        RunConfig(dataset="crime", batch_size=64, mode="split").validate()


def test_a_batch_too_small_to_hold_every_group_is_refused_before_round_1(out_dir):
    # equalized-odds on Crime: group b of the second label value has 39 of 1,200 training rows
    cfg = _crime(out_dir, constraint="equalized-odds", batch_size=20, num_server_rounds=50)
    grid = RecordingGrid(client_app, cfg.to_flower(), cfg.num_parties)
    with pytest.raises(ConfigError, match=r"batching.batch-size=20: round \d+'s batch holds no row of group b in "
                                          r"constraint 'y=[+-]1: [^']*' \(39 of 1200 training rows\).*use batching.batch-size >= \d+"):
        run_server(grid, cfg.to_flower())
    assert grid.pairs == []  # nothing was sent
    y = np.array([1] * 98 + [-1, -1])
    g = from_labels(y, np.arange(100) % 2 == 0, 1)
    batching.check_batches(g, 0, 80, 1000)  # large batches from groups of 49 and 49: cannot miss, not drawn


def test_reply_on_the_wrong_rows_is_rejected_naming_the_node(out_dir):
    def tamper(msg, reply):  # party 2 answers round 2 with logits on every row instead of round 3's batch
        if msg.metadata.message_type == msgs.TRAIN_PASSIVE and msg.metadata.group_id == "2" \
                and grid.contexts[msg.metadata.dst_node_id].node_config["partition-id"] == 2:
            reply.content.array_records[msgs.LOGITS]["train"] = Array(np.zeros(N_TRAIN))

    cfg = _crime(out_dir, batch_size=100)
    grid = RecordingGrid(client_app, cfg.to_flower(), cfg.num_parties, tamper=tamper)
    node = next(nid for nid, ctx in grid.contexts.items() if ctx.node_config["partition-id"] == 2)
    with pytest.raises(FederationError, match=rf"node {node} \(partition 2, passive\): train logits has shape "
                                              r"\(1200,\), expected \(100,\)"):
        run_server(grid, cfg.to_flower())


def test_party_rejects_a_nu_that_is_not_on_the_batch_rows(out_dir):
    def tap(msg):
        if msg.metadata.message_type == msgs.TRAIN_PASSIVE and msg.metadata.group_id == "2":
            msg.content.array_records[msgs.PAYLOAD]["nu"] = Array(np.zeros(N_TRAIN))

    cfg = _crime(out_dir, batch_size=100)
    grid = RecordingGrid(client_app, cfg.to_flower(), cfg.num_parties, tap=tap)
    with pytest.raises(FederationError, match=r"ReplyError: party \d \(passive, node \d+\): nu has shape "
                                              r"\(1200,\), expected \(100,\)"):
        run_server(grid, cfg.to_flower())


def test_reply_rows_are_the_next_batch_except_in_evaluation_rounds():
    cfg = RunConfig(batch_size=10, seed=5)
    assert np.array_equal(batching.reply_rows(cfg, 4, False, 100), batching.batch_rows(5, 5, 100, 10))
    assert batching.reply_rows(cfg, 4, True, 100) is None
    assert batching.round_rows(cfg.replace(batch_size=0), 4, 100) is None
    assert batching.effective_batch(100, 100) == 0 and batching.effective_batch(99, 100) == 99
