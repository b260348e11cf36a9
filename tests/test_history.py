"""A party's history (flower/history.py): what it answers again, what it refuses, and how a
key set-up binds the round and head every party enters it with (secure/agreement.py)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from fairvfl_flwr.flower import history
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.secure import agreement, identity, view
from fairvfl_flwr.flower.errors import FederationError

PARTS = {"train.passive/passive": "a" * 64, "train.active/active": "b" * 64}
PART = "train.passive/passive"


def _answered(rounds: int) -> history.History:
    h = history.History(-1, history.genesis(7))
    h, _ = h.advance(msgs.INIT, 0, "query.init/passive", "i" * 64, {"query.init/passive": "i" * 64}, "party 1")
    for r in range(1, rounds + 1):
        h, _ = h.advance(msgs.TRAIN_PASSIVE, r, PART, f"{r:064d}", {**PARTS, PART: f"{r:064d}"}, "party 1")
    return h


def test_the_chain_links_every_exchange_and_leaves_the_session_out():
    a, b = _answered(3), _answered(3)
    assert a.head == b.head and a.round == 3
    other = history.History(-1, history.genesis(7))
    other, _ = other.advance(msgs.INIT, 0, "query.init/passive", "j" * 64, {"query.init/passive": "j" * 64}, "p")
    for r in range(1, 4):
        other, _ = other.advance(msgs.TRAIN_PASSIVE, r, PART, f"{r:064d}", {**PARTS, PART: f"{r:064d}"}, "p")
    assert other.head != a.head  # one different start: every later head differs
    assert history.genesis(7) != history.genesis(8)
    assert history.genesis(2**64 - 1) != history.genesis(2**63)  # Flower's run ids use all 64 bits


def test_an_identical_resend_is_answered_again_and_anything_else_of_that_round_is_refused():
    h = _answered(3)
    same, resend = h.advance(msgs.TRAIN_PASSIVE, 3, PART, f"{3:064d}", {**PARTS, PART: f"{3:064d}"}, "party 1")
    assert resend and same == h
    with pytest.raises(FederationError, match=r"party 1: train.passive of round 3 differs from the "
                                              r"train.passive/passive message this party answered"):
        h.advance(msgs.TRAIN_PASSIVE, 3, PART, "f" * 64, {**PARTS, PART: "f" * 64}, "party 1")


def test_an_earlier_round_and_a_start_after_round_zero_are_refused():
    h = _answered(3)
    with pytest.raises(FederationError, match=r"train.passive of round 2 after this party answered round 3"):
        h.advance(msgs.TRAIN_PASSIVE, 2, PART, f"{2:064d}", {**PARTS, PART: f"{2:064d}"}, "party 1")
    for start in (msgs.INIT, msgs.NEWTON_INIT, msgs.SPLIT_INIT):
        with pytest.raises(FederationError, match=rf"{start} after this party answered round 3: a party never "
                                                  "starts over alone"):
            h.advance(start, 0, f"{start}/passive", "i" * 64, {f"{start}/passive": "i" * 64}, "party 1")


def test_a_second_part_of_a_round_is_a_new_exchange_but_never_a_part_already_answered():
    h = _answered(3)
    apply_parts = {"train.newton_apply/passive": "c" * 64}
    after, resend = h.advance(msgs.NEWTON_APPLY, 3, "train.newton_apply/passive", "c" * 64, apply_parts, "p")
    assert not resend and after.head != h.head and after.answered == (PART, "train.newton_apply/passive")
    with pytest.raises(FederationError, match="never moves back"):  # the first part again, after the second
        after.advance(msgs.TRAIN_PASSIVE, 3, PART, f"{3:064d}", {**PARTS, PART: f"{3:064d}"}, "p")


def test_a_restored_round_is_closed_the_next_round_goes_on():
    h = _answered(3).closed()
    with pytest.raises(FederationError, match="never moves back"):  # not even the identical last message
        h.advance(msgs.TRAIN_PASSIVE, 3, PART, f"{3:064d}", {**PARTS, PART: f"{3:064d}"}, "p")
    nxt, _ = h.advance(msgs.TRAIN_PASSIVE, 4, PART, f"{4:064d}", {**PARTS, PART: f"{4:064d}"}, "p")
    assert nxt.round == 4 and nxt.head == _answered(4).head  # the same chain as a party that never restored


def test_the_history_survives_the_node_state_and_starts_at_genesis():
    state = RecordDict()
    assert history.History.held(state, 7) == history.History(-1, history.genesis(7))
    h = _answered(2)
    h.save(state)
    assert history.History.held(state, 7) == h


def _context(pid: int, h: history.History) -> Context:
    ctx = Context(run_id=7, node_id=100 + pid, node_config={"partition-id": pid}, state=RecordDict(),
                  run_config={"num-parties": 3})
    h.save(ctx.state)
    return ctx


def test_a_setup_where_one_party_entered_at_another_head_is_refused_naming_it():
    """Party 2 stepped back alone (one round less): every party refuses the session, naming party 2."""
    heads = {0: _answered(3), 1: _answered(3), 2: _answered(2)}
    contexts = {pid: _context(pid, h) for pid, h in heads.items()}
    session = agreement.new_session()
    relay = {}
    for pid, ctx in contexts.items():
        signed = agreement.signed_key(agreement.key_request(session), ctx)
        assert signed["round"] == heads[pid].round and signed["head"] == heads[pid].head
        relay.update({f"pk-{pid}": signed["public"], f"sig-{pid}": signed["signature"],
                      f"round-{pid}": signed["round"], f"head-{pid}": signed["head"]})
    held = contexts[0].state.config_records[agreement.SESSION_STATE]
    entered = (int(held["round"]), bytes(held["head"]))
    rounds = {j: relay[f"round-{j}"] for j in range(3)}
    heads_relayed = {j: relay[f"head-{j}"] for j in range(3)}
    with pytest.raises(FederationError, match=r"party 0 \(.*\): party 2 entered this secure-aggregation session at "
                                              r"round 2 .* this party at round 3"):
        agreement.check_histories(entered, rounds, heads_relayed, "party 0 (passive)")
    # a relay that claims party 2 is at round 3 does not verify against party 2's signature
    text = agreement.signed_text(session, 2, relay["pk-2"], 3, heads[0].head)
    with pytest.raises(Exception):
        identity.peer_keys(contexts[0], 3)[2].verify(relay["sig-2"], text)  # the demo keys of a simulation


def test_a_view_confirmation_binds_the_head_not_only_the_round():
    key = bytes(32)
    a, b = _answered(3).head, _answered(2).head
    assert view.confirmation(key, 1, a) != view.confirmation(key, 1, b)
    assert view.bound_key(key, a) != view.bound_key(key, b)
    assert isinstance(view.confirmations(a, 0, {1: key}), ConfigRecord)


def test_an_aligned_block_that_changed_under_a_history_is_refused():
    h = history.History(-1, history.genesis(7))
    h, _ = h.advance(msgs.INIT, 0, "query.init/passive", "i" * 64, {"query.init/passive": "i" * 64}, "p", "rows-a")
    nxt, _ = h.advance(msgs.TRAIN_PASSIVE, 1, PART, "1" * 64, {PART: "1" * 64}, "p", "rows-a")
    assert nxt.block == "rows-a"
    with pytest.raises(FederationError, match="aligned block changed since its history began"):
        h.advance(msgs.TRAIN_PASSIVE, 1, PART, "1" * 64, {PART: "1" * 64}, "p", "rows-b")


def _guard_context() -> Context:
    from fairvfl_flwr.config import RunConfig

    return Context(run_id=7, node_id=102, node_config={"partition-id": 2, "num-partitions": 6}, state=RecordDict(),
                   run_config=RunConfig(secure_nu="ckks").to_flower())


def _leg(mtype: str, server_round: int, value: float):
    from flwr.app import Message
    from flwr.supercore.task_identity import TaskIdentity

    for name, default in (("run_id", 1), ("node_id", 0), ("task_id", 1)):  # as the in-process grid sets them
        try:
            getattr(TaskIdentity, name)
        except RuntimeError:
            setattr(TaskIdentity, name, default)
    content = RecordDict({msgs.PAYLOAD: msgs.array_record(x=np.array([value])),
                          msgs.ROUND: msgs.round_config(server_round, False)})
    return Message(content, dst_node_id=102, message_type=mtype, group_id=str(server_round))


def test_the_guard_remembers_every_leg_of_a_round_not_only_the_last():
    """A round of two legs (encrypted ν): the first leg re-sent after the second is answered from
    its kept reply, never run again (a run again would let a server step one party alone)."""
    from flwr.app import Message

    from fairvfl_flwr.features.guards import guard_mod

    ran = []

    def handler(message, context):
        ran.append(message.metadata.message_type)
        return Message(RecordDict({"out": msgs.array_record(v=np.array([len(ran)], dtype=np.float64))}),
                       reply_to=message)

    ctx = _guard_context()
    first = guard_mod(_leg(msgs.TRAIN_PASSIVE_ENC, 3, 1.0), ctx, handler)
    guard_mod(_leg("train.other_leg", 3, 2.0), ctx, handler)
    again = guard_mod(_leg(msgs.TRAIN_PASSIVE_ENC, 3, 1.0), ctx, handler)
    assert ran == [msgs.TRAIN_PASSIVE_ENC, "train.other_leg"]  # the first leg did not run again
    assert again.content["out"]["v"].numpy().tolist() == first.content["out"]["v"].numpy().tolist()
    with pytest.raises(FederationError, match=r"train.passive_enc of round 3 differs from the one this party answered"):
        guard_mod(_leg(msgs.TRAIN_PASSIVE_ENC, 3, 9.0), ctx, handler)
    guard_mod(_leg(msgs.TRAIN_PASSIVE_ENC, 4, 1.0), ctx, handler)  # the next round: a new leg
    assert ran[-1] == msgs.TRAIN_PASSIVE_ENC and len(ran) == 3
