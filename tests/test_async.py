"""Issue 8: time-budgeted local steps, simulated stragglers, bounded-staleness rounds."""

import time

import pytest

from fairvfl_flwr import messages as msgs
from fairvfl_flwr.client import app as client_app
from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.inprocess import InProcessGrid
from fairvfl_flwr.server import run_server
from fairvfl_flwr.straggler import delay_for, parse_delays


def _run(cfg: RunConfig, **grid_kwargs):
    grid = InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties, **grid_kwargs)
    try:
        summary, folder = run_server(grid, cfg.to_flower())
    finally:
        grid.close()
    return grid, summary, folder


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
    base = RunConfig(dataset="crime", num_server_rounds=3, local_steps=40, output_dir=out_dir)
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
    assert delay_for({"partition-id": 2}, {"straggler-delays": "2=0.3"}) == (0.3, 0.0)
    assert delay_for({"partition-id": 1}, {"straggler-delays": "2=0.3"}) == (0.0, 0.0)
    # a node's own node-config wins over the run config
    assert delay_for({"partition-id": 2, "delay-seconds": 0.1, "delay-jitter": 0.2}, {"straggler-delays": "2=0.3"}) == (0.1, 0.2)


def test_a_delayed_party_slows_synchronous_rounds_but_not_the_result(out_dir):
    cfg = RunConfig(dataset="crime", num_server_rounds=4, eval_every=2, output_dir=out_dir, wire_dtype="float64")
    _, plain, _ = _run(cfg)
    slow = cfg.replace(straggler_delays="3=0.1")
    t0 = time.perf_counter()
    _, delayed, folder = _run(slow, async_replies=True)
    assert time.perf_counter() - t0 >= 4 * 0.1
    assert delayed["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-12)
    assert delayed["test_acc"] == plain["test_acc"]
    # node-config delay (deployment: flower-supernode --node-config '... delay-seconds=0.1')
    nodes = [{"partition-id": i, "num-partitions": 6, **({"delay-seconds": 0.1, "delay-jitter": 0.05} if i == 2 else {})}
             for i in range(6)]
    t0 = time.perf_counter()
    _, delayed2, _ = _run(cfg, async_replies=True, node_configs=nodes)
    assert time.perf_counter() - t0 >= 4 * 0.1
    assert delayed2["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-12)

