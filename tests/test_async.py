"""Time-budgeted local steps, simulated stragglers, bounded-staleness rounds."""

import json
import time

import numpy as np
import pytest

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.config.node import NodeConfig
from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.features.straggler import delay_for, parse_delays


def _steps_seen(cfg: RunConfig) -> list[int]:
    grid = InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties)
    replies = []
    original = grid.pull_messages
    grid.pull_messages = lambda ids: replies.extend(got := list(original(ids))) or got
    run_server(grid, cfg.to_flower())
    return [int(r.content.metric_records[msgs.STATS]["steps"])
            for r in replies if r.metadata.message_type == msgs.TRAIN_ACTIVE]


# -- (1) time-budgeted active steps -----------------------------------------------------
def test_time_budget_takes_between_one_and_q_steps(out_dir):
    base = RunConfig(dataset="crime", num_server_rounds=3, local_steps=40, optimizer="gd", output_dir=out_dir)
    assert _steps_seen(base.replace(local_time_budget=1e-9)) == [1, 1, 1]  # budget spent by one step: still 1
    assert _steps_seen(base.replace(local_time_budget=60.0)) == [40, 40, 40]  # Q caps a generous budget
    assert _steps_seen(base) == [40, 40, 40]  # 0 = off: always Q


def test_time_budget_is_respected(out_dir):
    cfg = RunConfig(dataset="adult", num_server_rounds=2, local_steps=10_000, local_time_budget=0.05,
                    output_dir=out_dir)
    steps = _steps_seen(cfg)
    assert all(1 <= s < 10_000 for s in steps), steps


def test_new_options_are_validated():
    for bad in (dict(local_time_budget=-1.0), dict(max_staleness=-1), dict(quorum=7),
                dict(straggler_delays="2:0.3"), dict(straggler_delays="2=-1"),
                dict(max_staleness=2, checkpoint_every=5)):
        with pytest.raises(ConfigError):
            RunConfig(dataset="crime", **bad).validate()


# -- (2) stragglers ---------------------------------------------------------------------
def test_delay_settings():
    assert parse_delays("") == {}
    assert parse_delays("2=0.3~0.1, 4=0.05") == {2: (0.3, 0.1), 4: (0.05, 0.0)}
    cfg = RunConfig(dataset="crime", straggler_delays="2=0.3")
    node = NodeConfig.from_flower
    assert delay_for(node({"partition-id": 2}), cfg) == (0.3, 0.0)
    assert delay_for(node({"partition-id": 1}), cfg) == (0.0, 0.0)
    # a node's own node-config wins over the run config
    assert delay_for(node({"partition-id": 2, "delay-seconds": 0.1, "delay-jitter": 0.2}), cfg) == (0.1, 0.2)
    assert delay_for(node({"partition-id": 2, "delay-jitter": 0.0}), cfg) == (0.0, 0.0)


def test_a_delayed_party_slows_synchronous_rounds_but_not_the_result(out_dir, run_app):
    rounds = 2
    cfg = RunConfig(dataset="crime", num_server_rounds=rounds, eval_every=2, output_dir=out_dir, wire_dtype="float64")
    _, plain, _ = run_app(cfg)
    slow = cfg.replace(straggler_delays="3=0.1")
    t0 = time.perf_counter()
    _, delayed, folder = run_app(slow, async_replies=True)
    assert time.perf_counter() - t0 >= rounds * 0.1
    assert delayed["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-12)
    assert delayed["test_acc"] == plain["test_acc"]
    # node-config delay (deployment: flower-supernode --node-config '... delay-seconds=0.1')
    nodes = [{"partition-id": i, "num-partitions": 6, **({"delay-seconds": 0.1, "delay-jitter": 0.05} if i == 2 else {})}
             for i in range(6)]
    t0 = time.perf_counter()
    _, delayed2, _ = run_app(cfg, async_replies=True, node_configs=nodes)
    assert time.perf_counter() - t0 >= rounds * 0.1
    assert delayed2["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-12)


# -- (3) bounded-staleness rounds ---------------------------------------------------------
def _history(folder):
    return json.loads((folder / "history.json").read_text())


def test_tau_zero_is_the_synchronous_run(out_dir, run_app):
    cfg = RunConfig(dataset="crime", num_server_rounds=6, eval_every=3, output_dir=out_dir, wire_dtype="float64")
    _, a, fa = run_app(cfg)
    _, b, fb = run_app(cfg.replace(max_staleness=0, quorum=2))
    drop = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert drop(_history(fa)) == drop(_history(fb))  # exactly: τ = 0 is the synchronous code path
    assert "stale" not in _history(fb)[-1]
    # with a straggler and late replies: the same rounds (replies arrive in another order, so the
    # sum over parties may differ in the last bit)
    _, c, fc = run_app(cfg.replace(straggler_delays="3=0.02"), async_replies=True)
    for ra, rc in zip(_history(fa), _history(fc)):
        assert [ra[k] for k in ("loss", "deo", "lambda1")] == pytest.approx([rc[k] for k in ("loss", "deo", "lambda1")],
                                                                             rel=1e-12, abs=1e-15)


FAST, SLOW = 0.02, 0.06  # one party 3x slower than the others
DELAYS = ",".join(f"{p}={SLOW if p == 3 else FAST}" for p in range(6))


@pytest.mark.parametrize("tau", [1, 2])
def test_one_straggler_bounded_staleness_completes(tau, out_dir):
    cfg = RunConfig(dataset="crime", epsilon=0.05, num_server_rounds=24, eval_every=12, output_dir=out_dir,
                    max_staleness=tau, straggler_delays=DELAYS)
    grid = InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties, async_replies=True)
    node_of: dict[str, int] = {}

    def one_at_a_time(msg):  # a party is never sent a message while one is outstanding
        dst = msg.metadata.dst_node_id
        assert not [m for m in grid._futures if node_of[m] == dst], f"second message to node {dst}"
        node_of[msg.metadata.message_id] = dst

    grid.tap = one_at_a_time
    try:
        summary, folder = run_server(grid, cfg.to_flower())
    finally:
        grid.close()
    rows = _history(folder)[1:]
    assert [r["round"] for r in rows] == list(range(1, 25))
    behind = [int(b) for r in rows for b in r["stale"].values()]
    assert behind and max(behind) <= tau  # staleness never exceeds τ, and the straggler did lag
    assert any("3" in r["stale"] for r in rows)  # the slow party lagged (a loaded machine may slow others too)
    for r in rows:
        assert sorted(r["fresh"] + [int(p) for p in r["stale"]]) == list(range(6))
    assert rows[11]["stale"] == {} and rows[-1]["stale"] == {}  # evaluation rounds are synchronous
    assert np.isfinite(summary["train_loss"]) and summary["test_acc"] > 0.7
    assert "stale" in (folder / "history.csv").read_text().splitlines()[0]
