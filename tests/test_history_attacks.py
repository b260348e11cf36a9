"""A malicious server that tries to step one party away from the others across sessions.

The real ServerApp runs rounds 0 to 3 on the real ClientApps (pinned identity keys, every
party keeping its state of the last rounds); then the server plays by hand
(tools/malicious.py): a rejoin, a start message or a rollback asked of one party, a round
re-sent with other content, in the same session or a new one. Every party refuses, naming
the step, no party moves, and no sum the server decodes differs from one the honest run gave.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Message, RecordDict

from fairvfl_flwr.secure import agreement, identity, view
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.party import MODEL_STATE
from fairvfl_flwr.tools import malicious
from fairvfl_flwr.tools.malicious import HandServer, replay_round, replayed

STOP = 4  # the real ServerApp's rounds 0 .. 3, then the hand-played server
LAST = STOP - 1
TARGET = 2  # a passive party


def _config(tmp_path, optimizer="gd"):
    return malicious._config("crime", 10, str(tmp_path / "runs"), optimizer=optimizer)


def _take_over(tmp_path, optimizer="gd"):
    rc = _config(tmp_path, optimizer)
    ids = identity.generate_identities(tmp_path / "identities", rc["num-parties"])
    grid = malicious.take_over(rc, STOP, tmp_path, ids)
    return grid, HandServer(grid)


@pytest.fixture
def federation(tmp_path):
    return _take_over(tmp_path)


def _theta(grid, pid):
    return {k: a.numpy().copy() for k, a in grid.contexts[grid.node_ids[pid]].state.array_records[MODEL_STATE].items()}


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _probe(grid):
    n = len(grid.honest(LAST, grid.node_ids[TARGET]).content.array_records[msgs.PAYLOAD]["nu"].numpy())
    return malicious.probe_vectors(n, 1, seed=3)[0]


def _refusals(server, replies):
    return {server.pid(r.metadata.src_node_id): r.error.reason for r in replies if r.has_error()}


def _passive(grid):
    return set(range(1, len(grid.node_ids)))  # crime's default: party 0 is the one active party


def test_a_rejoin_to_one_party_moves_nothing_and_the_replay_it_was_for_is_refused(federation):
    grid, server = federation
    before = _theta(grid, TARGET)
    [reply] = server.rejoin([grid.node_ids[TARGET]], LAST - 1)
    assert not reply.has_error() and reply.content.config_records["info"]["round"] == LAST - 1
    assert server.session()  # the target entered it at the round and head it holds: it never stepped back
    assert _same(_theta(grid, TARGET), before)
    replies = replay_round(server, grid, LAST, _probe(grid))
    assert server.decode(replies) is None
    refused = _refusals(server, replies)
    assert set(refused) == _passive(grid)  # the target too: it answered round 3, whatever the rejoin said
    assert all(f"train.passive of round {LAST} differs from the train.passive/passive message this party answered"
               in why for why in refused.values())


@pytest.mark.parametrize("fresh", [False, True], ids=["same-session", "new-session"])
def test_after_a_rejoin_to_one_party_the_identical_round_again_gives_the_honest_sum(federation, fresh):
    """A rejoin moves no masked party, so it answers the byte-identical round as before: were
    the rejoin to make it forget what it answered, it would step again and the sum's difference
    from the honest one would be its second step alone."""
    grid, server = federation
    server.rejoin([grid.node_ids[TARGET]], LAST - 1 if fresh else LAST)
    assert server.session()
    again = server.exchange([replayed(grid.honest(LAST, nid)) for nid in grid.node_ids])
    np.testing.assert_array_equal(server.decode(again), grid.honest_sum(LAST))
    if fresh:
        assert server.session()
    server.rejoin([grid.node_ids[TARGET]], LAST)
    assert server.session()
    again = server.exchange([replayed(grid.honest(LAST, nid)) for nid in grid.node_ids])
    np.testing.assert_array_equal(server.decode(again), grid.honest_sum(LAST))


@pytest.mark.parametrize("optimizer, start", [("gd", msgs.INIT), ("newton", msgs.NEWTON_INIT)], ids=["gd", "newton"])
def test_a_start_message_to_one_party_after_round_zero_is_refused_naming_it(tmp_path, optimizer, start):
    grid, server = _take_over(tmp_path, optimizer)
    before = _theta(grid, TARGET)
    assert server.session()
    [reply] = server.exchange([Message(RecordDict({msgs.ROUND: msgs.round_config(0, False)}),
                                       dst_node_id=grid.node_ids[TARGET], message_type=start, group_id="0")])
    assert reply.has_error()
    assert f"party {TARGET} " in reply.error.reason
    assert f"{start} after this party answered round {LAST}: a party never starts over alone" in reply.error.reason
    assert _same(_theta(grid, TARGET), before)


def test_a_session_that_moves_one_party_back_is_refused_by_every_party_naming_it(federation):
    grid, server = federation
    before = _theta(grid, TARGET)
    assert not server.session(to=[grid.node_ids[TARGET]], rollback=LAST - 1)
    assert server.refused_by == set(range(len(grid.node_ids)))
    others = [why for why in server.refusals if not why.split(": ", 1)[1].startswith(f"party {TARGET} (")]
    assert len(others) == len(grid.node_ids) - 1
    assert all(f"party {TARGET} entered this secure-aggregation session at round {LAST - 1}" in why
               and "this party at round 3" in why for why in others)
    assert _same(_theta(grid, TARGET), before)  # it signed the move, and no party signed it with it
    # the move every party signs is one move: the honest round 3 again gives the honest sum again
    assert server.session(rollback=LAST - 1)
    again = server.exchange([replayed(grid.honest(LAST, nid)) for nid in grid.node_ids])
    np.testing.assert_array_equal(server.decode(again), grid.honest_sum(LAST))
    assert _same(_theta(grid, TARGET), before)


@pytest.mark.parametrize("fresh", [False, True], ids=["same-session", "new-session"])
def test_a_resend_with_other_content_is_refused_in_the_same_session_and_in_a_new_one(federation, fresh):
    grid, server = federation
    assert server.session()
    honest = server.exchange([replayed(grid.honest(LAST, nid)) for nid in grid.node_ids])
    np.testing.assert_array_equal(server.decode(honest), grid.honest_sum(LAST))  # the identical re-send
    if fresh:
        assert server.session()
    replies = replay_round(server, grid, LAST, _probe(grid))
    assert server.decode(replies) is None
    refused = _refusals(server, replies)
    assert set(refused) == _passive(grid)
    assert all("only a byte-identical re-send is answered again, in any session; refused" in why
               for why in refused.values())


@pytest.mark.parametrize("optimizer", ["gd", "newton"])
@pytest.mark.parametrize("attack, step", [(malicious.rejoin_replay, "differs from the train."),
                                          (malicious.init_replay, "a party never starts over alone")],
                         ids=["rejoin", "restart"])
def test_the_roles_that_isolated_a_party_across_sessions_decode_nothing(tmp_path, attack, step, optimizer):
    rc = _config(tmp_path, optimizer)
    ids = identity.generate_identities(tmp_path / "identities", rc["num-parties"])
    got = attack(rc, tmp_path, target=TARGET, probes=2, stop_at=STOP, identities=ids)
    assert got.decoded == 0 and got.gram_error >= 0.99
    assert got.refused and TARGET in got.refused_by
    assert any(step in why for why in got.refusals if f"party {TARGET} (" in why)


def test_a_rejoin_between_a_round_and_its_identical_resend_gives_no_second_step(tmp_path):
    """Round t to every party (one probe ν), query.rejoin to the target, a fresh session, round t
    again byte for byte: every sum decoded is one the honest exchange gave, so nothing is fitted."""
    rc = _config(tmp_path)
    ids = identity.generate_identities(tmp_path / "identities", rc["num-parties"])
    got = malicious.rejoin_resend(rc, tmp_path, target=TARGET, probes=3, stop_at=STOP, identities=ids)
    assert got.gram_error >= 0.99, got.summary(TARGET)
    assert got.repeated == got.decoded  # each re-send decoded to the sum of the exchange it repeated


def test_a_replayed_rollback_relay_moves_no_party_a_second_time(federation):
    """A signed rollback, the round after it, then the rollback's own relay once more: a party
    restores only at the first relay of its session, so the replay moves nothing and the round
    with other content is still refused."""
    grid, server = federation
    nodes = grid.node_ids
    parties = [(nid, server.pid(nid), f"party {server.pid(nid)}") for nid in nodes]
    session = agreement.new_session()
    asks = [Message(RecordDict({"secagg": agreement.key_request(session, LAST - 1)}), dst_node_id=nid,
                    message_type=agreement.SAKEYS, group_id="secagg") for nid in nodes]
    signed = agreement.signed_keys(parties, server.send(asks), session)
    agreement.relay_keys(parties, signed, server.send)
    assert not server.refusals
    server.views = view.ServerViews(session)
    again = server.exchange([replayed(grid.honest(LAST, nid)) for nid in nodes])
    np.testing.assert_array_equal(server.decode(again), grid.honest_sum(LAST))  # the one move, then round 3
    after = _theta(grid, TARGET)
    agreement.relay_keys(parties, signed, server.send)  # the rollback's relay, replayed
    assert _same(_theta(grid, TARGET), after)
    replies = replay_round(server, grid, LAST, _probe(grid))
    assert server.decode(replies) is None and set(_refusals(server, replies)) == _passive(grid)


@pytest.mark.slow  # Gauss-Newton MLP rounds on the real ClientApps
def test_a_gauss_newton_round_resent_with_other_step_lengths_or_to_one_party_decodes_nothing(tmp_path):
    """Gauss-Newton's round message (its step lengths, from the point it names, and the logits
    where they land in the reply): byte for byte to every party it gives the sum the honest
    round gave; with other step lengths to the target it is refused; to the target alone its
    masks cannot cancel."""
    rc = {**malicious._config("compas", 10, str(tmp_path / "runs"), optimizer="newton"), "model": "mlp"}
    ids = identity.generate_identities(tmp_path / "identities", rc["num-parties"])
    grid = malicious.take_over(rc, STOP, tmp_path, ids)
    server = HandServer(grid)
    assert server.session()
    same = server.exchange([replayed(grid.honest(LAST, nid)) for nid in grid.node_ids])
    np.testing.assert_array_equal(server.decode(same), grid.honest_sum(LAST))
    target = grid.node_ids[TARGET]
    honest = grid.honest(LAST, target)
    assert honest.metadata.message_type == msgs.NEWTON_PASSIVE
    alpha = honest.content.array_records[msgs.PAYLOAD]["alpha"].numpy()
    assert len(alpha)
    changed = [replayed(grid.honest(LAST, nid), alpha=alpha * 2.0) if nid == target
               else replayed(grid.honest(LAST, nid)) for nid in grid.node_ids]
    replies = server.exchange(changed)
    assert server.decode(replies) is None
    assert "differs from the train.newton_passive" in _refusals(server, replies)[TARGET]
    alone = server.exchange([replayed(honest)])
    assert server.decode(alone) is None  # one party's words: the pair masks do not cancel
