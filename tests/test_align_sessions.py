"""A lying server against the private alignment's sessions: it chooses every session id, so a
party takes part in each once (its own disk remembers them, across runs); a kept alignment is
taken up only under the peers file and label owner it was made with; and allow-unmasked never
turns the alignment's signatures off."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.data import psi
from fairvfl_flwr.data.own_table import normalise_ids
from fairvfl_flwr.secure import identity
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.flower.party import ALIGNED_STATE
from fairvfl_flwr.jobs import alignment
from fairvfl_flwr.jobs.alignment import align_tables

from .test_align import ID, adult_raw, own_config, own_node, write_own_tables

pytest.importorskip("private_set_intersection")
pytestmark = pytest.mark.usefixtures("private_party_cache")  # each test's parties have their own disks

ROWS = 600  # ~540 ids a party: an alignment in about a second


def replayed(step: str) -> str:
    """The refusal of a replayed session at ``step``, as a pattern."""
    return (r"alignment session [0-9a-f]{8}… was already used by this party \(step '" + step
            + r"'\); a replayed alignment session is refused")


@pytest.fixture
def tables(tmp_path):
    folder = tmp_path / "tables"
    folder.mkdir()
    write_own_tables(adult_raw(ROWS), folder)
    return folder


def _cfg(folder, masked: bool = False) -> RunConfig:
    """The run config (small groups: these runs only align); ``masked`` for parties that hold keys,
    which refuse unmasked jobs."""
    return RunConfig.from_flower(own_config(folder, **{"min-group-size": 5, "privacy.secure-aggregation": masked}))


def _grid(cfg: RunConfig, sent: list | None = None, nodes: list | None = None, cls=InProcessGrid, **kw):
    """A fresh grid: the parties' node states are new (a later run), their disks are the test's."""
    return cls(client_app, cfg.to_flower(), cfg.num_parties, tap=None if sent is None else sent.append,
               node_configs=nodes, **kw)


def _ask(grid: InProcessGrid, party: int, message_type: str, content: RecordDict) -> Message:
    """One message straight to party ``party``'s ClientApp; its reply (an error reply if refused)."""
    msg = Message(content, dst_node_id=grid.node_ids[party], message_type=message_type, group_id="align")
    (mid,) = grid.push_messages([msg])
    (reply,) = grid.pull_messages([mid])
    return reply


def _step(session: str, **fields) -> RecordDict:
    return RecordDict({alignment.STEP: ConfigRecord({"purpose": alignment.TRAIN, "session": session, **fields})})


def _taken_up(grid: InProcessGrid, party: int) -> bool:
    return grid.contexts[grid.node_ids[party]].state.config_records.get(ALIGNED_STATE) is not None


def _steps(sent: list) -> list[str]:
    return [m.metadata.message_type.removeprefix("query.align_") for m in sent
            if m.metadata.message_type in alignment.ALIGN_STEPS]


def test_a_replayed_alignment_session_is_refused_naming_the_step(tables, monkeypatch):
    cfg = _cfg(tables)
    sent: list = []
    align_tables(_grid(cfg, sent), cfg)
    size, blind = (next(m for m in sent if m.metadata.message_type == t) for t in (alignment.ALIGN_SIZE, alignment.ALIGN_BLIND))
    later = _grid(cfg)  # a later run: fresh node state, the same disk
    for message_type, old, step in ((alignment.ALIGN_SIZE, size, "size"), (alignment.ALIGN_BLIND, blind, "blind")):
        reply = _ask(later, 2, message_type, old.content)
        assert reply.has_error() and re.search(r"party 2 \(passive.*\): " + replayed(step), reply.error.reason), step
    # a server that opens every alignment with the same id: the second run's is refused at its first step
    monkeypatch.setattr("secrets.token_hex", lambda nbytes=32: "1a2b3c4d" * (nbytes // 4))
    align_tables(_grid(cfg), cfg)
    sent.clear()
    with pytest.raises(FederationError, match=r"party \d \(.*\): alignment session 1a2b3c4d… was already used by "
                                              r"this party \(step 'size'\); a replayed alignment session is refused"):
        align_tables(_grid(cfg, sent), cfg)
    assert _steps(sent) == ["size"] * 4  # no party blinded an id


def test_a_resent_size_of_the_session_in_progress_gets_the_same_answer(tables):
    cfg = _cfg(tables)
    grid = _grid(cfg)
    first, again = (_ask(grid, 1, alignment.ALIGN_SIZE, _step("00" * 16)) for _ in range(2))
    assert not first.has_error() and not again.has_error()
    answer = dict(first.content.config_records[alignment.REPLY])
    assert answer == dict(again.content.config_records[alignment.REPLY]) and answer["n"] > 0
    assert not _ask(grid, 1, alignment.ALIGN_BLIND, _step("00" * 16)).has_error()  # the session goes on


def _kept_twice(folder, sent: list) -> tuple[RunConfig, InProcessGrid]:
    """Align ``folder``'s tables, then take the kept alignment up in a second run (its grid;
    ``sent``: its messages)."""
    cfg = _cfg(folder)
    align_tables(_grid(cfg), cfg)
    align_tables(grid := _grid(cfg, sent), cfg)
    assert _steps(sent) == ["size"] * 4 + ["reuse"] * 4
    return cfg, grid


def _sent_to(sent: list, message_type: str, node: int) -> Message:
    return next(m for m in sent if m.metadata.message_type == message_type and m.metadata.dst_node_id == node)


def test_a_replayed_reuse_confirmation_is_refused_and_nothing_is_taken_up(tables):
    """The label owner's table changed since it kept the alignment: it no longer holds it. The
    server replays the label owner's signed confirmation to party 2, in the old session and in
    a fresh one; party 2 takes nothing up."""
    sent: list = []
    cfg, kept = _kept_twice(tables, sent)
    old_size, old = (_sent_to(sent, t, kept.node_ids[2]) for t in (alignment.ALIGN_SIZE, alignment.ALIGN_REUSE))
    fields = dict(old.content.config_records[alignment.STEP])
    df = pd.read_csv(tables / "party0.csv")
    df.drop(index=df.index[:5]).to_csv(tables / "party0.csv", index=False)

    replay = _grid(cfg)  # the old session, size and reuse as they were sent
    for message_type, message, step in ((alignment.ALIGN_SIZE, old_size, "size"), (alignment.ALIGN_REUSE, old, "reuse")):
        reply = _ask(replay, 2, message_type, message.content)
        assert reply.has_error() and re.search(replayed(step), reply.error.reason), step
    assert not _taken_up(replay, 2)

    fresh = _grid(cfg)  # a fresh session: every party answers; the label owner keeps nothing now
    session = "fe" * 16
    sizes = {k: _ask(fresh, k, alignment.ALIGN_SIZE, _step(session)) for k in range(4)}
    answers = {k: r.content.config_records[alignment.REPLY] for k, r in sizes.items()}
    assert answers[0].get("kept", "") == "" and "table changed" in answers[0]["why"]
    signed = {f: v for k, a in answers.items() for f, v in {f"size-{k}": alignment.size_blob(a),
                                                             f"size-signature-{k}": a["signature"]}.items()}
    digest = fields["digest"]
    for party0, refusal in (
            # the label owner's old signature of the kept digest
            ({"size-0": fields["size-0"], "size-signature-0": fields["size-signature-0"]},
             r"alignment step 'reuse': party 0's size answer and kept-alignment digest are not signed by party 0's "
             r"pinned identity key for this alignment; refused"),
            # its answer of this session, which keeps nothing
            ({}, r"alignment step 'reuse': party 0's signed size answer of this session names no or another kept "
                 r"alignment; refused")):
        reply = _ask(fresh, 2, alignment.ALIGN_REUSE, _step(session, digest=digest, **{**signed, **party0}))
        assert reply.has_error() and re.search(refusal, reply.error.reason), reply.error.reason
        assert not _taken_up(fresh, 2)


def _deployed(tables, identities: list[dict] | None, **extra) -> list[dict]:
    """Deployed parties: each names its table (and ``identities``' key files, if any)."""
    return [own_node(k, tables / f"party{k}.csv", ID, **(identities or [{}] * 4)[k], **extra) for k in range(4)]


def test_a_kept_alignment_under_another_peers_file_or_label_owner_is_not_taken_up(tables, tmp_path, caplog):
    caplog.set_level("INFO", logger="flwr")
    identities = identity.generate_identities(tmp_path / "keys", 4)
    nodes = _deployed(tables, identities)
    cfg = _cfg(tables, masked=True)
    align_tables(_grid(cfg, nodes=nodes), cfg)
    sent: list = []
    align_tables(_grid(cfg, sent, nodes=nodes), cfg)
    assert _steps(sent) == ["size"] * 4 + ["reuse"] * 4  # the same peers file: taken up
    peers = tmp_path / "keys" / "peers.json"
    peers.write_text(json.dumps(json.loads(peers.read_text())))  # the same keys, another file
    caplog.clear()
    sent.clear()
    align_tables(_grid(cfg, sent, nodes=nodes), cfg)
    assert "reuse" not in _steps(sent) and "blind" in _steps(sent)
    for k in range(4):
        assert f"party {k}: its kept alignment was made under another peers file (node config peers)" in caplog.text
    rotated = identity.generate_identities(tmp_path / "other-keys", 4)  # another label owner (and parties)
    caplog.clear()
    sent.clear()
    align_tables(_grid(cfg, sent, nodes=_deployed(tables, rotated)), cfg)
    assert "reuse" not in _steps(sent) and "blind" in _steps(sent)
    assert "party 1: its kept alignment was made with another label owner" in caplog.text


class DemoSigned(InProcessGrid):
    """Stands in for the label owner at the raise step: ids of the server's choosing, blinded under
    its own key and signed for this session with the label owner's demo key (which anyone can derive)."""

    def __init__(self, *a, chosen, **kw):
        super().__init__(*a, **kw)
        self.blinded, _, _ = psi.blind_step(normalise_ids(np.asarray(chosen)), shuffle=False)
        demo = Context(run_id=1, node_id=0, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
        self.demo = identity.identity(demo)  # a node naming no key file and reading no data of its own: the demo key
        self.raised: list[Message] = []

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            if m.metadata.message_type == alignment.ALIGN_RAISE:
                fields = dict(m.content.config_records[alignment.STEP])
                text = alignment.signed_text(fields["session"], alignment.TRAIN, "blind", 0, self.blinded)
                m.content.config_records[alignment.STEP] = ConfigRecord(
                    {**fields, "blinded": self.blinded, "signature": self.demo.sign(text)})
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        got = list(super().pull_messages(message_ids))
        self.raised += [r for r in got if r.metadata.message_type == alignment.ALIGN_RAISE and not r.has_error()]
        return got


def test_psi_messages_to_an_unmasked_waiver_node_signed_with_a_demo_key_are_refused(tables, tmp_path):
    cfg = _cfg(tables)
    chosen = adult_raw(ROWS)[ID].astype(str).iloc[:300].to_numpy()
    # the forgery is sound: where the demo keys are the parties' keys (simulation), every party raises it
    grid = _grid(cfg, cls=DemoSigned, chosen=chosen)
    with pytest.raises(FederationError):
        align_tables(grid, cfg)  # the leader then finds the raised list is not of its ids
    assert len(grid.raised) == 3
    # deployed parties that name their keys: refused, whatever allow-unmasked says
    nodes = _deployed(tables, identity.generate_identities(tmp_path / "keys", 4), **{"allow-unmasked": True})
    masked = _cfg(tables, masked=True)  # a node with keys refuses unmasked jobs
    grid = _grid(masked, nodes=nodes, cls=DemoSigned, chosen=chosen)
    with pytest.raises(FederationError, match=r"party [123] \(passive.*\): alignment step 'raise': the label owner's "
                                              r"blinded ids are not signed by party 0's pinned identity key for this "
                                              r"alignment; refused"):
        align_tables(grid, masked)
    assert grid.raised == []
    # parties without key files that waive masking (allow-unmasked=true): refused before any id is read,
    # naming what to set (their waiver lets them answer unmasked rounds, it authenticates nothing)
    sent: list = []
    with pytest.raises(FederationError, match=r"party \d \(.*\): private alignment: this node reads its own data but "
                                              r"its node config names no 'identity-key' and no 'peers'.*"
                                              r"allow-unmasked=true does not waive that.*Set node config identity-key "
                                              r"and peers; make them with `fairvfl-keys new`"):
        align_tables(_grid(cfg, sent, nodes=_deployed(tables, None, **{"allow-unmasked": True}), cls=DemoSigned,
                           chosen=chosen), cfg)
    assert _steps(sent) == ["size"] * 4
