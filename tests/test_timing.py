"""The opt-in timing log (features/timing.py): the events a round's breakdown is built from,
nothing extra on the wire, nothing written when it is off."""

import json
import re
import time

import numpy as np

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.features import timing
from fairvfl_flwr.flower.inprocess import InProcessGrid

ROUNDS = 2


def _run(tmp_path, name):
    # gradient steps: one training message per party and round, each answered with logits
    cfg = RunConfig.from_flower({"optimizer": "gd", "dataset": "crime", "num-server-rounds": ROUNDS, "eval-every": 1,
                                 "output-dir": str(tmp_path / name)})
    sent, replies = [], []
    grid = InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties, tap=sent.append)
    answer = grid._answer

    def keep(msg):
        reply = answer(msg)
        replies.append(reply)
        return reply

    grid._answer = keep
    summary, _ = run_server(timing.timed(grid), cfg.to_flower())
    return summary, sent, replies


def _wire(messages):
    """What each message carries: type, round and every array's name, dtype, shape and bytes."""
    out = []
    for m in messages:
        content = m.content
        arrays = sorted((r, k, a.dtype, tuple(a.shape), a.data) for r, rec in content.array_records.items()
                        for k, a in rec.items())
        configs = sorted((r, sorted(rec.items())) for r, rec in content.config_records.items())
        # the run folder's name (its start time and random tag) is the one difference two runs have
        configs = re.sub(r"(/(plain|timed)/)?\d{8}-\d{6}-crime-linear-[0-9a-f]{6}", "RUN", repr(configs))
        out.append((m.metadata.message_type, m.metadata.group_id, arrays, configs))
    return sorted(out, key=repr)


def _lines(folder, role):
    return [json.loads(line) for f in sorted(folder.glob(f"{role}-*.jsonl")) for line in f.read_text().splitlines()]


def test_timing_log_holds_every_message_and_nothing_goes_on_the_wire(tmp_path, monkeypatch):
    monkeypatch.delenv(timing.ENV, raising=False)
    plain, sent_plain, replies_plain = _run(tmp_path, "plain")
    assert not list(tmp_path.glob("log/*"))
    log = tmp_path / "log"
    monkeypatch.setenv(timing.ENV, str(log))
    started = time.time()
    timed, sent_timed, replies_timed = _run(tmp_path, "timed")

    # identical run: same metrics, and every message and reply carries exactly the same
    assert timed["test_acc"] == plain["test_acc"] and timed["train_deo"] == plain["train_deo"]
    assert _wire(sent_timed) == _wire(sent_plain)
    assert _wire(replies_timed) == _wire(replies_plain)

    server = _lines(log, "serverapp")
    client = [r for r in _lines(log, "clientapp") if r["event"] == "message"]
    pushes = {r["message_id"]: r for r in server if r["event"] == "push"}
    pulls = {r["reply_to"]: r for r in server if r["event"] == "pull"}
    assert [r["event"] for r in server][0] == "start"
    # discovery, init and every round: one push per party, each answered, each seen by its ClientApp
    groups = {r["group"] for r in pushes.values()}
    assert {"discover", *map(str, range(ROUNDS + 1))} <= groups
    assert len(client) == len(sent_timed) == len(pushes) == len(pulls)
    assert {r["message_id"] for r in client} == set(pushes) == set(pulls)
    for r in client:
        push, pull = pushes[r["message_id"]], pulls[r["message_id"]]
        assert started <= push["t_call"] <= r["handler_start"] <= r["handler_end"] <= pull["t"] <= time.time()
        assert r["import_start"] <= r["import_done"] <= r["handler_start"]
        assert r["process_start"] is not None and r["process_start"] <= r["import_start"] + 0.02  # /proc ticks
        assert r["node_id"] == push["node_id"] == pull["node_id"] and r["group"] == push["group"]
        assert r["bytes_in"] == push["bytes"] and r["bytes_out"] == pull["bytes"]
    train = [r for r in client if r["type"].startswith("train")]
    assert len(train) == 6 * ROUNDS
    n_train = len(next(m for m in replies_timed if m.metadata.group_id == "1").content.array_records["logits"]["train"].numpy())
    # float32 wire: a training reply's train logits alone are n_train * 4 bytes
    assert all(r["bytes_out"] >= 4 * n_train for r in train)
    assert np.isfinite([r["handler_end"] - r["handler_start"] for r in client]).all()


def test_timing_is_off_without_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(timing.ENV, raising=False)
    grid = object()
    assert timing.timed(grid) is grid
    assert timing.folder() is None
