"""A party's restart costs a round, not the run (features/rejoin.py), over the in-process grid.

:class:`DropGrid` makes one party's node leave the federation as a round's messages go out
(the parties before it in the batch have already stepped) and come back a moment later
with a new node id and an empty node state, as a restarted SuperNode does. Under secure
aggregation the run then ends with the same model as an undisturbed run: bit for bit for
block Newton and for gradient descent (every party restores its exact state of the last
completed round from its own disk, and the server its own). A run that cannot continue
says why, and a replayed secure-aggregation session stays refused.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.flower.party import MODEL_STATE
from fairvfl_flwr.features import rejoin
from fairvfl_flwr.secure import agreement
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower import store
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.inprocess import InProcessGrid

pytestmark = pytest.mark.usefixtures("private_party_cache")

BASE = {"dataset": "crime", "num-parties": 4, "num-server-rounds": 6, "eval-every": 3, "epsilon": 0.05,
        "stop-tolerance": 0.0, "privacy.secure-aggregation": True, "reliability.round-timeout": 30.0,
        "reliability.rejoin-timeout": 20.0}
KEYS = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn", "rounds")


class DropGrid(InProcessGrid):
    """Partition ``victim``'s node leaves as round ``at`` goes out, and is back (a new node id, an empty
    node state, the same node config) after ``away`` looks at the node list; ``back=False``: never."""

    def __init__(self, *args, victim: int, at: int, away: int = 2, back: bool = True, wipe: bool = False,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.victim, self.at, self.away, self.back, self.wipe = victim, at, away, back, wipe
        self.down: tuple[int, Context] | None = None
        self.looks = 0
        self.returned: list[int] = []
        self.rng = random.Random(99)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            nid = m.metadata.dst_node_id
            ctx = self.contexts.get(nid)
            if (self.at is not None and ctx is not None and m.metadata.group_id == str(self.at)
                    and int(ctx.node_config["partition-id"]) == self.victim):
                self.node_ids.remove(nid)
                self.down = (nid, self.contexts.pop(nid))
                self.at = None
            if nid not in self.contexts:
                ids.append("")  # the SuperLink refuses a message to a node that is not registered
                continue
            ids += super().push_messages([m])
        return ids

    def get_node_ids(self):
        if self.down is not None and self.back:
            self.looks += 1
            if self.looks >= self.away:
                old, ctx = self.down
                new = self.rng.getrandbits(63)
                config = dict(ctx.node_config)
                if self.wipe:  # its disk was replaced: it holds no state of this run
                    config[store.STATE_DIR] = str(self.wipe)
                self.contexts[new] = Context(run_id=ctx.run_id, node_id=new, node_config=config,
                                             state=RecordDict(), run_config=dict(ctx.run_config))
                self.node_ids.append(new)
                self.returned.append(new)
                self.down = None
        return list(self.node_ids)


def _thetas(grid: InProcessGrid) -> dict[int, dict[str, np.ndarray]]:
    return {int(ctx.node_config["partition-id"]): {k: v.numpy() for k, v in ctx.state.array_records[MODEL_STATE].items()}
            for ctx in grid.contexts.values()}


def _same(a: dict, b: dict) -> None:
    for key in KEYS:
        assert a[key] == b[key], (key, a[key], b[key])


# one case in the fast loop; the label owner and gradient descent in the full suite
@pytest.mark.parametrize("optimizer,victim,model", [
    ("newton", 2, "linear"),
    pytest.param("newton", 0, "linear", marks=pytest.mark.slow),
    pytest.param("gd", 2, "linear", marks=pytest.mark.slow),
    pytest.param("gd", 0, "linear", marks=pytest.mark.slow),
    # Gauss-Newton blocks: the party restores both points a step may start from
    pytest.param("newton", 2, "mlp", marks=pytest.mark.slow),
], ids=["newton-passive", "newton-label-owner", "gd-passive", "gd-label-owner", "gauss-newton-passive"])
def test_a_party_that_drops_out_and_comes_back_ends_with_the_undisturbed_model(run_app, tmp_path, optimizer, victim,
                                                                               model):
    cfg = {**BASE, "optimizer": optimizer, "model": model, "output-dir": str(tmp_path / "runs")}
    undisturbed = run_app({**cfg, "output-dir": str(tmp_path / "reference")})
    run = run_app(cfg, grid_cls=DropGrid, victim=victim, at=4)
    assert run.grid.returned, "the party never came back"
    assert [(r["partition"], r["round"]) for r in run.summary["rejoins"]] == [(victim, 4)]
    assert "rejoins" not in undisturbed.summary
    _same(run.summary, undisturbed.summary)
    assert [r["round"] for r in run.history] == list(range(7))
    assert [r["loss"] for r in run.history] == [r["loss"] for r in undisturbed.history]
    # every party's θ, the returned one's included, is the undisturbed run's, bit for bit
    thetas, reference = _thetas(run.grid), _thetas(undisturbed.grid)
    assert sorted(thetas) == sorted(reference) == [0, 1, 2, 3]
    for pid in reference:
        for name, value in reference[pid].items():
            assert np.array_equal(thetas[pid][name], value), (pid, name)


def test_a_party_that_stays_away_stops_the_run_saying_why(run_app, tmp_path):
    cfg = {**BASE, "optimizer": "gd", "reliability.rejoin-timeout": 1.0, "output-dir": str(tmp_path / "runs")}
    with pytest.raises(FederationError, match=r"partition 1, passive\) dropped out in round 3 .*did not come back "
                                              r"within reliability.rejoin-timeout=1 s; the run stops after round 2"):
        run_app(cfg, grid_cls=DropGrid, victim=1, at=3, back=False)


def test_a_party_whose_state_is_gone_refuses_naming_its_folder(run_app, tmp_path):
    cfg = {**BASE, "optimizer": "gd", "output-dir": str(tmp_path / "runs")}
    with pytest.raises(FederationError, match=r"party 3 \(passive.*holds no state of round 2 of this run in .*empty"):
        run_app(cfg, grid_cls=DropGrid, victim=3, at=3, wipe=tmp_path / "empty")


def test_without_rejoin_timeout_a_dropped_party_ends_the_run(run_app, tmp_path):
    cfg = {**BASE, "optimizer": "gd", "reliability.rejoin-timeout": 0.0, "output-dir": str(tmp_path / "runs")}
    with pytest.raises(FederationError, match="left the federation"):
        run_app(cfg, grid_cls=DropGrid, victim=1, at=2)


def test_rejoin_is_refused_with_what_it_cannot_restore():
    with pytest.raises(ConfigError, match="rejoin-timeout"):
        RunConfig.from_flower({**BASE, "privacy.secure-aggregation": False, "staleness.max-staleness": 1})


def _sakeys(grid: InProcessGrid, nid: int, session: str) -> Message:
    message = Message(RecordDict({"secagg": ConfigRecord({"session": session})}), dst_node_id=nid,
                      message_type=agreement.SAKEYS, group_id="secagg")
    return grid._answer(message)


def test_a_party_refuses_a_session_it_has_left_even_after_it_restarted(run_app, tmp_path):
    cfg = {**BASE, "optimizer": "gd", "output-dir": str(tmp_path / "runs")}
    run = run_app(cfg, grid_cls=DropGrid, victim=1, at=3)
    back = run.grid.returned[0]
    sessions = list(run.grid.contexts[back].state.config_records[agreement.SESSIONS_STATE]["sessions"])
    assert len(sessions) == 2  # the first set-up (restored from its disk) and the fresh one after it came back
    current = run.grid.contexts[back].state.config_records[agreement.SESSION_STATE]["session"]
    assert current == sessions[-1]
    assert not _sakeys(run.grid, back, current).has_error()  # a re-sent request of the current set-up
    replayed = _sakeys(run.grid, back, sessions[0])
    assert replayed.has_error() and "already left" in replayed.error.reason
    for nid in run.grid.node_ids:  # every other party too
        old = run.grid.contexts[nid].state.config_records[agreement.SESSIONS_STATE]["sessions"][0]
        reply = _sakeys(run.grid, nid, old)
        assert reply.has_error() and "replayed session is refused" in reply.error.reason
