"""A malicious server against the real ClientApps, as a state machine (hypothesis).

The server interleaves, in any order and to any subset of the parties, what looks legal
on the wire: rounds with any content (ν from a few probes, the same or not for every
passive party), re-sends of any earlier exchange, fresh signed sessions, a per-party
``query.rejoin``, a rollback (signed by every party, or asked of some only) and the start
message. Each exchange goes through the protocol's own pieces (tools/malicious.HandServer:
the set-up's request and relay, the round's views and the relayed confirmations).

Invariant: every sum the server can decode (its masks cancel) is over every party's reply
to one common history, or some party refused. The test keeps a shadow per party of the
exchanges whose messages it accepted (a byte-identical re-send of the last one adds
nothing unless the party's θ moved; the start message starts it over); where a party's state moves outside an
exchange (a rejoin, a set-up), the shadow follows what the party's θ shows: back to the
last entry of that round or before with the same θ, or an unknown history. A decodable
sum needs every shadow equal.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pytest
from flwr.app import Message, RecordDict
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.data.partydata import party_spec
from fairvfl_flwr.features import guards
from fairvfl_flwr.secure import agreement, identity, view
from fairvfl_flwr.flower import history
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.flower.party import MODEL_STATE, party_data
from fairvfl_flwr.tools.malicious import HandServer

K = 3  # one active party, two passive ones
ROUNDS = 4  # rounds the server may name (and roll back to); sequences are short
PARTIES = tuple(range(K))
SUBSETS = [s for size in range(1, K + 1) for s in itertools.combinations(PARTIES, size)]
#: every party half of the time, else any subset (a lone party included)
TO = st.one_of(st.just(PARTIES), st.sampled_from(SUBSETS))
#: the probe of each passive party: the same for both half of the time (one view), else any two
NUS = st.one_of(st.integers(0, 2).map(lambda i: (i, i)), st.tuples(st.integers(0, 2), st.integers(0, 2)))


class Violation(AssertionError):
    """A sum decoded over parties whose histories differ."""


class Federation(NamedTuple):
    run_config: dict
    identities: list[dict]
    folder: Path
    n: int  # training rows
    multipliers: int  # λ's length
    probes: list[np.ndarray]  # the ν a round may carry: no zero entry, so every step moves θ
    active: list[tuple[np.ndarray, np.ndarray]]  # the (z, λ) a round may carry


def _scratch() -> Path:
    """Scratch space for the parties' state files: memory where the machine has it (each reply
    writes one)."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="fairvfl-sm-", dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None))


@pytest.fixture(scope="module")
def federation():
    folder = _scratch()
    rng = np.random.default_rng(7)
    rows = 40
    table = pd.DataFrame({f"x{j}": rng.standard_normal(rows) for j in range(5)})
    table["s"], table["y"] = rng.choice(["a", "b"], rows), rng.choice(["yes", "no"], rows)
    table.to_csv(folder / "table.csv", index=False)
    rc = RunConfig.from_flower({
        "dataset": "csv", "csv.path": str(folder / "table.csv"), "csv.label": "y", "csv.positive": "yes",
        "csv.sensitive": "s", "min-group-size": 1, "num-parties": K, "optimizer": "gd", "num-server-rounds": ROUNDS,
        "privacy.secure-aggregation": True, "reliability.rejoin-timeout": 5.0, "output-dir": str(folder / "runs"),
    })
    active = party_data(rc, party_spec({"partition-id": 0}, K, rc.num_active))
    for pid in PARTIES[1:]:
        party_data(rc, party_spec({"partition-id": pid}, K, rc.num_active))  # loaded once for every sequence
    n, m = len(active.y), active.constraint.num_multipliers
    probes = [(rng.choice([-1.0, 1.0], n) * (0.5 + rng.random(n)) / n).astype(np.float32) for _ in range(3)]
    pairs = [(rng.standard_normal(n).astype(np.float32), np.abs(rng.standard_normal(m)) * t) for t in (0.0, 0.1)]
    yield Federation(rc.to_flower(), identity.generate_identities(folder / "identities", K), folder, n, m, probes,
                     pairs)
    shutil.rmtree(folder, ignore_errors=True)


def _digest(mtype: str, content: RecordDict) -> str:
    """What a message asks, for the shadow: its type, payload and round config (the test's own
    digest, not the protocol's)."""
    h = hashlib.sha256(mtype.encode())
    for name in (msgs.PAYLOAD, msgs.ROUND):
        record = content.get(name)
        if record is None:
            continue
        for key in sorted(record.keys()):
            value = record[key]
            h.update(key.encode() + (value.numpy().tobytes() if name == msgs.PAYLOAD else repr(value).encode()))
    return h.hexdigest()


class Stats:
    """What the runs exercised (a machine that never decodes anything proves nothing)."""

    sequences = 0
    exchanges = 0
    decoded = 0
    refusals = 0


class Play:
    """One federation under a malicious server: the parties (their node state and state folder),
    the server, and the test's shadow of every party's history."""

    def __init__(self, fed: Federation, folder: Path) -> None:
        self.fed, self.folder = fed, folder
        self.grid = InProcessGrid(client_app, fed.run_config, K, node_configs=[
            {"partition-id": i, "num-partitions": K, "state-dir": str(folder), **fed.identities[i]} for i in PARTIES])
        self.server = HandServer(self.grid)
        self.nodes = self.grid.node_ids
        self.entries: dict[int, list[tuple]] = {p: [] for p in PARTIES}  # (round, view parts, θ's digest after)
        self.last: dict[int, tuple | None] = {p: None for p in PARTIES}  # (round, type, digest) last accepted
        self.sent: list[dict[int, tuple[str, RecordDict]]] = []  # every exchange: party -> (type, content)
        self.top = 0
        self.unknown = itertools.count()

    def honest_start(self) -> None:
        """A signed session, the start message and round 1 to every party, as the real server would."""
        assert self.server.session()
        assert self.exchange({p: self.start_message() for p in PARTIES}) is not None
        assert self.exchange(self.round(1, (0, 0), 0, PARTIES)) is not None
        self.top = 1

    def copy(self, folder: Path) -> "Play":
        """This federation as it stands, in fresh node states and state folder ``folder``."""
        shutil.copytree(self.folder, folder)
        other = Play(self.fed, folder)
        for nid in self.nodes:  # the same seeded node ids
            other.grid.contexts[nid].state = copy.deepcopy(self.grid.contexts[nid].state)
        other.server.views = copy.deepcopy(self.server.views)
        other.entries, other.last = copy.deepcopy(self.entries), dict(self.last)
        other.sent, other.top = list(self.sent), self.top
        return other

    # -- what the server sends ---------------------------------------------------------------
    @staticmethod
    def start_message() -> tuple[str, RecordDict]:
        return msgs.INIT, RecordDict({msgs.ROUND: msgs.round_config(0, False)})

    def round(self, server_round: int, nus: tuple[int, int], z: int, to) -> dict[int, tuple[str, RecordDict]]:
        """Round ``server_round`` to the parties ``to``: the active party the ``z``-th (z, λ), each
        passive party its probe of ``nus``."""
        out = {}
        for p in to:
            if p == 0:
                zs, lam = self.fed.active[z]
                out[p] = msgs.TRAIN_ACTIVE, msgs.active_content(zs, lam, server_round, False, "float32")
            else:
                out[p] = msgs.TRAIN_PASSIVE, msgs.passive_content(self.fed.probes[nus[p - 1]], server_round, False,
                                                                  "float32")
        return out

    # -- the shadow ---------------------------------------------------------------------------
    def theta(self, pid: int) -> str | None:
        state = self.grid.contexts[self.nodes[pid]].state.array_records
        if MODEL_STATE not in state:
            return None
        h = hashlib.sha256()
        for key, value in sorted(state[MODEL_STATE].items()):  # θ and its step rule's state
            h.update(key.encode() + value.numpy().tobytes())
        return h.hexdigest()

    def observe(self, bound: int | None) -> None:
        """A party whose θ moved outside an exchange: its shadow goes back to the last entry of
        round ``bound`` or before with that θ (None: any round), or to an unknown history."""
        for p in PARTIES:
            now, entries = self.theta(p), self.entries[p]
            if now == (entries[-1][2] if entries else None):
                continue
            keep = next((i for i in range(len(entries) - 1, -1, -1)
                         if entries[i][2] == now and (bound is None or entries[i][0] <= bound)), None)
            self.entries[p] = entries[:keep + 1] if keep is not None else [("unknown", next(self.unknown), now)]
            self.last[p] = None

    def exchange(self, contents: dict[int, tuple[str, RecordDict]]):
        """Send each party its message under the exchange's views; update the shadows of those that
        accepted; check every decodable sum. Returns the sum, or None."""
        Stats.exchanges += 1
        self.sent.append(contents)
        messages = [Message(RecordDict(dict(content)), dst_node_id=self.nodes[p], message_type=mtype,
                            group_id=str(content[msgs.ROUND]["round"])) for p, (mtype, content) in contents.items()]
        replies = self.server.exchange(messages)
        Stats.refusals += sum(r.has_error() for r in replies)
        for (p, (mtype, content)), message, reply in zip(contents.items(), messages, replies):
            if reply.has_error():
                continue
            server_round = int(content[msgs.ROUND]["round"])
            parts = tuple(sorted(message.content.config_records[view.VIEW]["parts"]))
            seen, theta = (server_round, mtype, _digest(mtype, content)), self.theta(p)
            stepped = theta != (self.entries[p][-1][2] if self.entries[p] else None)
            if mtype == msgs.INIT:
                self.entries[p] = [(server_round, parts, theta)]
            elif seen != self.last[p] or stepped:  # a re-send that moved θ was no re-send
                self.entries[p].append((server_round, parts, theta))
            self.last[p] = seen
        if len(contents) < K:
            return None
        total = self.server.decode(replies)
        if total is not None:
            Stats.decoded += 1
            histories = {p: [e[:2] for e in self.entries[p]] for p in PARTIES}
            if any(histories[p] != histories[0] for p in PARTIES):
                raise Violation("a sum decoded over parties whose histories differ: " + "; ".join(
                    f"party {p}: " + " → ".join(f"{e[0]}:{hashlib.sha256(repr(e[1]).encode()).hexdigest()[:6]}"
                                                for e in histories[p]) for p in PARTIES))
        return total


class MaliciousServer(RuleBasedStateMachine):
    """Each sequence starts from a copy of the federation after its honest start (the parties are
    built, and the start played, once per module)."""

    start: Play
    count = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        Stats.sequences += 1

    @initialize()
    def from_the_honest_start(self):
        self.play = self.start.copy(self.start.fed.folder / f"state-{next(self.count)}")

    @rule(rnd=st.one_of(st.just(-1), st.integers(0, ROUNDS)), nus=NUS, z=st.integers(0, 1), to=TO)
    def train(self, rnd, nus, z, to):
        """A round (the next one, or any round named) with any content, to ``to``."""
        play = self.play
        server_round = play.top + 1 if rnd < 0 else rnd
        play.top = max(play.top, server_round)
        play.exchange(play.round(server_round, nus, z, to))

    @rule(nu=st.integers(0, 2), z=st.integers(0, 1))
    def next_round(self, nu, z):
        """The next round to every party under one view, as the real server plays it."""
        play = self.play
        play.top += 1
        play.exchange(play.round(play.top, (nu, nu), z, PARTIES))

    @rule(back=st.one_of(st.just(1), st.integers(1, 6)), to=TO, fresh=st.booleans())
    def resend(self, back, to, fresh):
        """An earlier exchange again, each party's message as it was; ``fresh``: in a new session."""
        earlier = self.play.sent[-min(back, len(self.play.sent))]
        again = {p: earlier[p] for p in to if p in earlier}
        if fresh:
            self.session(None, PARTIES)
        if again:
            self.play.exchange(again)

    @rule(to=TO)
    def start_again(self, to):
        """The start message (round 0) to ``to``."""
        self.play.exchange({p: Play.start_message() for p in to})

    @rule(rollback=st.one_of(st.none(), st.integers(0, ROUNDS)), to=TO)
    def session(self, rollback, to):
        """A fresh signed session; ``rollback``: asked of the parties ``to`` (every party: the
        federation-wide signed move back)."""
        if rollback is None:
            self.play.server.session()
        else:
            self.play.server.session(to=[self.play.nodes[p] for p in to], rollback=rollback)
        self.play.observe(rollback)

    @rule(server_round=st.one_of(st.just(-1), st.integers(0, ROUNDS)), to=TO, then_session=st.booleans())
    def rejoin(self, server_round, to, then_session):
        """``query.rejoin`` of a round (-1: the latest the server sent) to ``to`` only; ``then_session``:
        and a fresh session, as the server's rejoin hook follows it."""
        play = self.play
        server_round = play.top if server_round < 0 else server_round
        play.server.rejoin([play.nodes[p] for p in to], server_round)
        play.observe(server_round)
        if then_session:
            self.session(None, PARTIES)


@pytest.fixture(scope="module")
def started(federation):
    play = Play(federation, federation.folder / "start")
    play.honest_start()
    return play


def machine(start: Play) -> type[MaliciousServer]:
    return type("MaliciousServerOn", (MaliciousServer,), {"start": start})


#: Deterministic (derandomize: the examples follow from the test's code), no example database.
RUNS = settings(max_examples=200, stateful_step_count=15, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


def _counts() -> dict[str, int]:
    return {k: getattr(Stats, k) for k in ("sequences", "exchanges", "decoded", "refusals")}


@pytest.mark.slow  # 200 sequences of the real ClientApps: half a minute
def test_every_decodable_sum_is_over_one_common_history_or_a_party_refused(started):
    before = _counts()
    run_state_machine_as_test(machine(started), settings=RUNS)
    ran = {k: v - before[k] for k, v in _counts().items()}
    assert ran["sequences"] >= 200 and ran["exchanges"] > 1000, ran
    assert ran["decoded"] > 200 and ran["refusals"] > 1000, ran  # beyond the honest start's sums, which each copies


class _ByTypeAndRound:
    """secure/view.py for the guard alone, with a message's digest its round only: the guard's
    re-send is then recognised by (type, round), as before the history (its reply check too)."""

    def __getattr__(self, name):
        return getattr(view, name)

    @staticmethod
    def content_digest(content, message_type, role):
        rc = content.get(msgs.ROUND)
        return repr(None if rc is None else rc.get("round")) if role == "" else view.content_digest(
            content, message_type, role)


@pytest.mark.slow  # the model checker's whole search
def test_it_finds_a_resend_recognised_by_type_and_round_only(started, monkeypatch):
    """The weakness the red team used: a message of a round and part already answered gets the
    kept answer whatever it carries. Planted in the history and the guard, the machine finds a
    sum decoded over parties of which some accepted other content (deterministic: derandomised,
    not shrunk)."""
    advance = history.History.advance

    def by_type_and_round(self, message_type, server_round, part, *rest, **named):
        if server_round == self.round and part == self.part:
            return self, True
        return advance(self, message_type, server_round, part, *rest, **named)

    monkeypatch.setattr(history.History, "advance", by_type_and_round)
    monkeypatch.setattr(guards, "view", _ByTypeAndRound())
    found = settings(RUNS, phases=[Phase.generate])
    with pytest.raises(Violation, match="a sum decoded over parties whose histories differ"):
        run_state_machine_as_test(machine(started), settings=found)


@pytest.mark.slow  # the model checker's whole search
def test_it_finds_a_session_unbound_to_the_history(started, monkeypatch):
    """The other weakness of old: a fresh session that starts the party's state afresh (its
    history, as the round counter and pending view once were) and a set-up that checks no
    peer's round and head, so a rollback asked of one party moves it alone. Planted, the
    machine finds a sum decoded over parties whose histories differ."""
    signed_key = agreement.signed_key

    def unbound(asked, context):
        held = context.state.config_records.get(agreement.SESSION_STATE)
        if held is None or held["session"] != str(asked["session"]):
            context.state.config_records.pop(history.STATE, None)
        return signed_key(asked, context)

    monkeypatch.setattr(agreement, "signed_key", unbound)
    monkeypatch.setattr(agreement, "check_histories", lambda *args: None)
    found = settings(RUNS, phases=[Phase.generate])
    with pytest.raises(Violation, match="a sum decoded over parties whose histories differ"):
        run_state_machine_as_test(machine(started), settings=found)
