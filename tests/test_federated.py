"""The real ServerApp strategy and ClientApp, connected by the in-process grid."""

import numpy as np
import pytest
import torch

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.jobs import saving
from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.data.tables import load_dataset
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.core.constraints import from_labels
from fairvfl_flwr.core.models import build_model
from fairvfl_flwr.data.partition import split_columns
from fairvfl_flwr.core.reference import CentralisedGDA
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.flower.errors import FederationError


@pytest.mark.parametrize("model", ["linear", "mlp"])
def test_q1_federated_run_equals_centralised_descent_ascent(model, out_dir, run_app):
    rounds = 8
    cfg = RunConfig(
        optimizer="gd", dataset="crime", model=model, local_steps=1, num_server_rounds=rounds, eval_every=4,
        epsilon=0.01, eta=5.0, beta=1.0, output_dir=out_dir, seed=3, wire_dtype="float64",
    )
    run = run_app(cfg)

    ds = load_dataset("crime", seed=3)
    cols = split_columns(ds.n_features, 6, 1, 49)
    models = [
        build_model(model, len(c), bias=k == 0 or model == "mlp", seed=3 * 1000 + k) for k, c in enumerate(cols)
    ]
    blocks = [torch.from_numpy(np.ascontiguousarray(ds.X_train[:, c])) for c in cols]
    constraint = from_labels(ds.y_train, ds.s_train, ds.protected_label)
    ref = CentralisedGDA(
        models, blocks, ds.y_train.astype(float), constraint,
        epsilon=0.01, beta=1.0, c=1e-3, mu=2 / len(ds.y_train), lr=1 / 5.0,
    )
    for _ in range(rounds):
        ref.round()

    fed = run.thetas()
    for k, m in enumerate(models):
        for name, p in m.state_dict().items():
            assert torch.allclose(fed[k][name], p, atol=1e-10), (k, name)
    lams = np.array([[r["lambda1"], r["lambda2"]] for r in run.history[1:]])
    assert np.allclose(lams, np.array(ref.lams), atol=1e-12)
    assert lams[-1, 0] > 0  # the constraint was active, so the test exercised the λ path


def test_passive_parties_receive_only_nu(out_dir, run_app):
    seen = []
    cfg = RunConfig(optimizer="gd", dataset="crime", num_server_rounds=3, eval_every=2, output_dir=out_dir)
    grid, _, _ = run_app(cfg, tap=seen.append)
    roles = {nid: ("active" if ctx.node_config["partition-id"] < cfg.num_active else "passive")
             for nid, ctx in grid.contexts.items()}
    passive = [m for m in seen if roles[m.metadata.dst_node_id] == "passive"]
    active = [m for m in seen if roles[m.metadata.dst_node_id] == "active"]
    assert passive and active
    n = 1200
    for m in passive:
        assert m.metadata.message_type in (msgs.INFO, msgs.INIT, msgs.TRAIN_PASSIVE, saving.SAVE)
        c = m.content
        assert not c.metric_records
        if m.metadata.message_type == msgs.TRAIN_PASSIVE:
            assert set(c.array_records) == {msgs.PAYLOAD}
            assert set(c.array_records[msgs.PAYLOAD]) == {"nu"}
            assert list(c.array_records[msgs.PAYLOAD]["nu"].shape) == [n]
        else:
            assert not c.array_records
        for record in c.config_records.values():  # query.save: where to save, no data
            assert set(record) <= ({"run-id", "run-folder", "round", "checkpoint"} if m.metadata.message_type == saving.SAVE
                                   else {"round", "evaluate"})
    # The active party gets z and λ instead; that is what the passive ones must not see.
    train_active = [m for m in active if m.metadata.message_type == msgs.TRAIN_ACTIVE]
    assert set(train_active[0].content.array_records[msgs.PAYLOAD]) == {"z", "lam"}


def test_replies_carry_logits_not_models(out_dir):
    replies = []
    cfg = RunConfig(dataset="crime", model="mlp", optimizer="gd", num_server_rounds=2, eval_every=1, output_dir=out_dir)
    grid = InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties)
    original = grid.pull_messages

    def pull(ids):
        got = list(original(ids))
        replies.extend(got)
        return got

    grid.pull_messages = pull
    run_server(grid, cfg.to_flower())
    train_replies = [r for r in replies if r.metadata.message_type not in (msgs.INFO, saving.SAVE)]
    assert train_replies
    for r in train_replies:
        assert set(r.content.array_records) == {msgs.LOGITS}
        assert set(r.content.array_records[msgs.LOGITS]) <= {"train", "test"}
        assert set(r.content.metric_records[msgs.STATS]) == {"sq-norm", "steps"}


def test_run_folder_and_fairness_reach_epsilon(out_dir, run_app):
    cfg = RunConfig(dataset="crime", epsilon=0.05, num_server_rounds=150, eval_every=50, output_dir=out_dir)
    _, summary, folder = run_app(cfg)
    for name in ("config.json", "history.csv", "history.json", "summary.json", "convergence.png"):
        assert (folder / name).stat().st_size > 0, name
    assert abs(summary["train_deo"] - 0.05) <= 0.01
    assert summary["test_acc"] > 0.8


def test_fairness_off_keeps_lambda_zero(out_dir, run_app):
    cfg = RunConfig(dataset="crime", fairness=False, num_server_rounds=10, eval_every=5, output_dir=out_dir)
    _, summary, _ = run_app(cfg)
    assert summary["lambda"] == [0.0, 0.0]
    assert summary["train_deo"] > 0.1  # unconstrained: the gap stays well above any ε we use


def test_same_seed_same_results_other_seed_differs(out_dir, run_app):
    cfg = RunConfig(dataset="crime", model="mlp", num_server_rounds=5, eval_every=5, output_dir=out_dir)
    a = run_app(cfg)[1]
    b = run_app(cfg)[1]
    c = run_app(cfg.replace(seed=1))[1]
    keys = ("train_loss", "train_deo", "test_acc")
    assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-12, abs=1e-12)
    assert abs(a["train_loss"] - c["train_loss"]) > 1e-6


def test_active_party_takes_q_local_steps(out_dir):
    cfg = RunConfig(optimizer="gd", dataset="crime", num_server_rounds=3, local_steps=4, output_dir=out_dir)
    replies = []
    grid = InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties)
    original = grid.pull_messages
    grid.pull_messages = lambda ids: replies.extend(got := list(original(ids))) or got
    run_server(grid, cfg.to_flower())
    steps = {r.metadata.message_type: int(r.content.metric_records[msgs.STATS]["steps"])
             for r in replies if r.metadata.message_type.startswith("train")}
    assert steps == {msgs.TRAIN_ACTIVE: 4, msgs.TRAIN_PASSIVE: 1}


def test_wrong_federation_size_is_refused(out_dir):
    cfg = RunConfig(dataset="crime", num_server_rounds=2, output_dir=out_dir, round_timeout=0.5)
    grid = InProcessGrid(client_app, cfg.to_flower(), 4)
    with pytest.raises(FederationError, match="num-parties=6"):
        run_server(grid, cfg.to_flower())


def test_client_failure_names_the_node(out_dir):
    cfg = RunConfig(dataset="crime", num_server_rounds=2, output_dir=out_dir)
    grid = InProcessGrid(client_app, cfg.to_flower(), 6,
                         node_configs=[{"partition-id": i, "num-partitions": 5} for i in range(6)])
    with pytest.raises(FederationError, match="5 SuperNodes but the run asks for num-parties=6"):
        run_server(grid, cfg.to_flower())
