"""``optimizer = "adagrad"`` (core/models.AdaGrad, docs/adagrad.md): one party is centralised
AdaGrad on f̃, each party keeps its own sums and sends nothing new, gradient descent on an
MLP is unchanged, the refusals, and what ``auto`` picks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config.algorithms import resolve
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.algorithms import fairvfl
from fairvfl_flwr.core.errors import ConfigError
from fairvfl_flwr.core.models import AdaGrad, TorchBlock, build_model
from fairvfl_flwr.core.reference import PartyFloor, lagrangian
from fairvfl_flwr.core.step import server_step
from fairvfl_flwr.flower import store
from fairvfl_flwr.data.problem import constraint_groups, load_data, party_columns
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.core.models import STEP_STATE
from fairvfl_flwr.flower.party import MODEL_STATE

from fairvfl_flwr.data.problem import party_problem

ROOT = Path(__file__).resolve().parents[1]
ADAGRAD = {"dataset": "crime", "model": "mlp", "optimizer": "adagrad", "wire-dtype": "float64"}


pytestmark = pytest.mark.usefixtures("private_party_cache")


def test_no_adagrad_step_moves_a_coordinate_by_more_than_lr_whatever_the_scale_of_nu():
    """The per-coordinate bound: each step is lr·g/(√Σg² + eps), at most lr; the first is
    lr·sign(g) wherever |g| is well above eps, and later ones shrink."""
    x = np.random.default_rng(0).normal(size=(50, 5))
    for scale in (1e-6, 1.0, 1e6):
        block = TorchBlock(build_model("mlp", 5, hidden=4, bias=True, seed=1), AdaGrad())
        for t in range(3):
            before = {k: v.copy() for k, v in block.weights().items()}
            block.step(x, scale * np.random.default_rng(t).normal(size=50), lr=0.01, mu=0.0)
            moved = np.concatenate([np.abs(v - before[k]).ravel() for k, v in block.weights().items()])
            assert moved.max() <= 0.01 * (1 + 1e-12)
            if t == 0 and scale >= 1:
                np.testing.assert_allclose(moved[moved > 0], 0.01, rtol=1e-5)
        assert moved.max() < 0.01 * (1 - 1e-3)  # the third step is shorter


def test_one_active_party_is_centralised_adagrad_on_the_lagrangian(tmp_path):
    """K = 1, Q = 1: the app's rounds are the paper's dual step plus torch.optim.Adagrad on f̃
    (autograd, all columns in one model), round for round."""
    rc = {**ADAGRAD, "num-parties": 1, "local-steps": 1, "num-server-rounds": 6, "eval-every": 3}
    _, folder = run_inprocess({**rc, "output-dir": str(tmp_path)}, quiet=True)
    history = json.loads((folder / "history.json").read_text())
    cfg = RunConfig.from_flower(rc)
    ds = load_data(cfg)
    (cols,) = party_columns(cfg, ds)
    x = torch.from_numpy(np.ascontiguousarray(ds.X_train[:, cols], dtype=np.float64))
    groups = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label)
    y, mu = ds.y_train.astype(np.float64), cfg.mu_value(len(ds.y_train))
    model = build_model("mlp", x.shape[1], hidden=cfg.hidden, bias=True, seed=cfg.seed * 1000)
    opt = torch.optim.Adagrad(model.parameters(), lr=cfg.lr)  # μ is inside f̃, so no weight decay here
    lam = np.zeros(groups.num_multipliers)
    for t in range(1, cfg.num_server_rounds + 1):
        with torch.no_grad():
            z = model(x).numpy()
        lam, _ = server_step(lam, y, z, groups, epsilon=cfg.epsilon, beta=cfg.beta, c=cfg.c)
        opt.zero_grad()
        lagrangian([model], [x], y, groups, lam, cfg.epsilon, cfg.c, mu).backward()
        opt.step()
        np.testing.assert_allclose(history[t]["lambdas"], lam, rtol=0, atol=1e-12)
    assert history[-1]["lambdas"][0] > 0  # the constraint was active
    with np.load(folder / "parties" / "partition-0" / "block.npz") as saved:
        for name, p in model.state_dict().items():
            np.testing.assert_allclose(saved[name], p.numpy(), rtol=0, atol=1e-10)


def test_the_app_equals_the_one_process_floor_that_the_benchmarks_use(tmp_path):
    """K = 3, Q = 5 on Crime: λ and the train DEO every round as core/reference.PartyFloor's
    (float64 wire), so the rounds-to-target table measures what the app runs."""
    rc = {**ADAGRAD, "num-parties": 3, "num-server-rounds": 5, "eval-every": 5}
    _, folder = run_inprocess({**rc, "output-dir": str(tmp_path)}, quiet=True)
    history = json.loads((folder / "history.json").read_text())
    cfg = RunConfig.from_flower(rc)
    ds, blocks, groups = party_problem(cfg)
    floor = PartyFloor(blocks, ds.y_train, groups, epsilon=cfg.epsilon, beta=cfg.beta,
                       c=cfg.c, mu=cfg.mu_value(len(ds.y_train)), lr=cfg.lr, Q=cfg.local_steps, model="mlp",
                       hidden=cfg.hidden, step_rule="adagrad", seed=cfg.seed)
    for t in range(1, cfg.num_server_rounds + 1):
        floor.round()
        np.testing.assert_allclose(history[t]["lambdas"], floor.lam, rtol=0, atol=1e-10)
        assert history[t]["deo"] == pytest.approx(abs(groups.gaps(ds.y_train, floor.z())[0]), abs=1e-10)
    assert history[-1]["lambdas"][0] > 0


def test_each_party_keeps_its_sums_and_passive_parties_receive_nu_only(tmp_path):
    rounds, q = 3, 2
    rc = {**ADAGRAD, "num-parties": 3, "local-steps": q, "num-server-rounds": rounds, "eval-every": 3,
          "output-dir": str(tmp_path)}
    cfg = RunConfig.from_flower(rc)
    seen, replies = [], []

    def party_app(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type in (msgs.TRAIN_PASSIVE, msgs.TRAIN_ACTIVE):
            replies.append(reply)
        return reply

    grid = InProcessGrid(party_app, cfg.to_flower(), cfg.num_parties, tap=seen.append)
    run_server(grid, cfg.to_flower())
    passive = [m for m in seen if m.metadata.message_type == msgs.TRAIN_PASSIVE]
    assert len(passive) == 2 * rounds
    for m in passive:  # the same message as under gd: ν and the round's config
        assert set(m.content.array_records) == {msgs.PAYLOAD} and set(m.content.config_records) == {msgs.ROUND}
        assert set(m.content.array_records[msgs.PAYLOAD]) == {"nu"}
    assert len(replies) == 3 * rounds  # the same reply as under gd: logits and the stats, no sums
    assert all(set(m.content.array_records) == {msgs.LOGITS} for m in replies)
    # the block's state_dict carries AdaGrad's step count and sums beside θ, under its step rule's keys
    steps = sorted(int(ctx.state.array_records[MODEL_STATE][STEP_STATE + "t"].numpy()) for ctx in grid.contexts.values())
    assert steps == [rounds, rounds, q * rounds]  # passive: one AdaGrad step a round, active: Q
    for ctx in grid.contexts.values():
        assert any(k.startswith(STEP_STATE + "sum.") for k in ctx.state.array_records[MODEL_STATE])


def test_gradient_descent_on_an_mlp_is_unchanged_bit_for_bit(tmp_path):
    """A short gd MLP run's history as recorded before optimizer='adagrad' existed (tests/golden)."""
    golden = json.loads((ROOT / "tests" / "golden" / "gd-mlp-crime-6.json").read_text())
    _, folder = run_inprocess({**golden["run-config"], "optimizer": "gd", "output-dir": str(tmp_path)}, quiet=True)
    history = json.loads((folder / "history.json").read_text())
    for row in history:
        row.pop("seconds", None)
    assert history == golden["history"]


def test_a_resumed_run_continues_with_each_partys_sums(tmp_path):
    """Checkpoints hold θ_k and AdaGrad's sums: a run resumed at round 2 by fresh parties
    (new contexts, state from their own disks) equals the uninterrupted run."""
    rc = {**ADAGRAD, "num-parties": 3, "eval-every": 2, "reliability.checkpoint-every": 2,
          "reliability.checkpoint-dir": str(tmp_path / "parties")}
    _, folder = run_inprocess({**rc, "num-server-rounds": 2, "output-dir": str(tmp_path / "a")}, quiet=True)
    kept = store.load_state(store.run_dir(tmp_path / "parties", RunConfig.from_flower(rc), 1), 2, "party 1")
    saved = kept[MODEL_STATE]  # θ and, under the step rule's keys, AdaGrad's step count and sums
    assert int(saved[STEP_STATE + "t"].numpy()) == 2 and any(k.startswith(STEP_STATE + "sum.") for k in saved)
    run_inprocess({**rc, "num-server-rounds": 4, "reliability.resume-from": str(folder)}, quiet=True)
    resumed = json.loads((folder / "history.json").read_text())
    _, full = run_inprocess({**rc, "num-server-rounds": 4, "output-dir": str(tmp_path / "b")}, quiet=True)
    full = json.loads((full / "history.json").read_text())
    assert [r["round"] for r in resumed] == [r["round"] for r in full] == list(range(5))
    for a, b in zip(resumed, full):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-12) and a["lambdas"] == pytest.approx(b["lambdas"], abs=1e-15)
        assert a["acc"] == b["acc"]


ON = {"model": "linear", "mode": "split"}


@pytest.mark.parametrize("field", [row[0] for row in fairvfl.ADAGRAD.refuses])
def test_each_adagrad_refusal_names_the_key_and_why_and_auto_falls_back(field):
    base = {} if field == "model" else {"model": "mlp"}
    on = next(row[1] for row in fairvfl.ADAGRAD.refuses if row[0] == field)
    assert on(RunConfig(**base, **{field: ON[field]}))
    with pytest.raises(ConfigError, match=rf"run config optimizer='adagrad': not supported with {RunConfig.key_of(field)}=.*: \S"):
        RunConfig(optimizer="adagrad", **base, **{field: ON[field]}).validate()
    if field != "mode":  # split mode has no optimizer
        assert RunConfig(optimizer="auto", **base, **{field: ON[field]}).optimizer_in_use in ("gd", "newton")


def test_auto_gives_an_mlp_gauss_newton_blocks_and_says_why():
    """auto takes block Newton for MLP parties as for linear ones, as Gauss–Newton blocks, under
    every constraint, masked, with label DP (measured: bench/mlp_rounds.py); AdaGrad where a
    setting rules Newton out."""
    cfg = RunConfig(optimizer="auto", model="mlp")
    assert cfg.optimizer_in_use == "newton"
    assert "Gauss-Newton blocks" in resolve(cfg).reason and "plateau" in resolve(cfg).reason
    for more in ({"constraint": "equalized-odds"}, {"constraint": "demographic-parity"}, {"checkpoint_every": 5},
                 {"dataset": "compas-race"}, {"secure_aggregation": "true"}, {"label_dp_epsilon": 2.0}):
        assert RunConfig(optimizer="auto", model="mlp", **more).optimizer_in_use == "newton", more
    batched = RunConfig(optimizer="auto", model="mlp", batch_size=256)  # mini-batches: Newton refused
    assert batched.optimizer_in_use == "adagrad"
    assert "batching.batch-size=256" in resolve(batched).reason
    assert RunConfig(optimizer="adagrad", model="mlp").optimizer_in_use == "adagrad"
    assert RunConfig(optimizer="newton", model="mlp").optimizer_in_use == "newton"
    assert "Gauss-Newton blocks" in resolve(RunConfig(optimizer="newton", model="mlp")).reason
    fallback = RunConfig(optimizer="auto", batch_size=256)  # linear: neither Newton nor AdaGrad
    assert fallback.optimizer_in_use == "gd"
    assert resolve(fallback).reason == ("gradient descent: block Newton does not run with batching.batch-size=256, "
                                        "and AdaGrad does not run with model='linear'")
