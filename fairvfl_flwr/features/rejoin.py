"""A party's restart costs a round, not the run (run config ``reliability.rejoin-timeout > 0``).

Party (:func:`rejoin_mod`): after every reply that follows a step (and the first logits,
round 0) a party writes its state of that round to its own disk (flower/store.py: θ, a
step's own state, Newton's directions and moves, the aligned block's key, the
secure-aggregation sessions it joined, its history's head). Nothing of it is ever sent.

Server (:class:`Rejoin`, a round hook): after every completed round it keeps a copy of its
own state (``VFLServer.snapshot``: λ, the held logits or their masked sum, the history, an
algorithm's own). When a round fails because a party left the federation
(``PartyUnavailable``), it returns to the last completed round r and waits up to
``rejoin-timeout`` seconds for a node of that party to join (a restarted SuperNode has a new
node id). Every party, the returning one and those that stayed, is sent ``query.rejoin``
with round r: it checks it holds its state of round r and replies as to discovery, with
that round. The server checks the party's role, rows and row-id digest as at discovery,
takes the new node in place of the old, and every hook re-establishes its set-up. Without
secure aggregation each party restores round r on the rejoin message; under it, the fresh
signed session is the move: every party signs the round and history head it restores, and
restores only once every peer signed the same (secure/agreement.py, flower/history.py), so
no party ever steps back alone. Round r + 1 then runs again. The server never holds a
party's block; a party that cannot restore round r (no state, another run's) refuses,
naming its folder.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.flower import party
from fairvfl_flwr.flower.discovery import joined_nodes
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError, PartyUnavailable
from fairvfl_flwr.flower.hooks import Node, Recovery, RoundHook
from fairvfl_flwr.flower.party import ALIGNED_STATE, Handles, PartyRuntime, handlers, round_of
from fairvfl_flwr.flower.store import load_state, restore, save_state, state_dir
from fairvfl_flwr.flower.records import config_records

POLL_SECONDS = 0.5  # how often the server looks for a returning node


# -- the party's side -------------------------------------------------------------------
def rejoin_mod(message: Message, context: Context, call_next) -> Message:
    """After a reply that follows a step (or the first logits), keep this round's state on this
    party's own disk: every round when the run waits for parties that drop out, and the
    checkpoint rounds (round 0 and every ``checkpoint-every``-th) when it checkpoints. A
    rejoin and a resume restore from the same files (flower/store.py)."""
    mtype = message.metadata.message_type
    if msgs.kind_of(mtype) not in msgs.IN_ROUNDS or msgs.kind_of(mtype) is msgs.Kind.FINAL:
        return call_next(message, context)
    reply = call_next(message, context)
    if reply.has_error():
        return reply
    cfg = party.run_config(tuple(sorted(context.run_config.items())))
    server_round, every = round_of(message)[0], cfg.checkpoint_every
    if cfg.rejoin_wait > 0 or (every > 0 and server_round % every == 0):
        save_state(state_dir(context, PartyRuntime(context)), server_round, context.state, every)
    return reply


def rejoin(message: Message, context: Context) -> Message:
    """Answer as to discovery (role, rows, row-id digest) with the round to continue from, once this
    party holds its state of that round on its own disk. Without secure aggregation it restores
    that state now; under it the party moves only at the set-up that follows, once every party
    signed the same round and history head (secure/agreement.py): a party alone never steps back."""
    rt = PartyRuntime(context)
    server_round = round_of(message)[0]
    records = load_state(state_dir(context, rt), server_round, rt.who)
    if not rt.cfg.masked:
        restore(context, records)
    elif ALIGNED_STATE in records and ALIGNED_STATE not in config_records(context.state):
        # a restarted party knows its rows only from its disk: which prepared block is its own moves no
        # model, and its discovery answer needs it
        context.state[ALIGNED_STATE] = records[ALIGNED_STATE]
    reply = party.info(message, context)
    config_records(reply.content)["info"]["round"] = server_round
    return reply


#: The party's handler of a rejoin: part of the training job (jobs/training.py).
# a check before the fresh session's set-up, carrying no values: outside any view
HANDLERS = handlers({msgs.REJOIN: Handles(msgs.Kind.QUERY, rejoin, in_view=False)})


# -- the server's hook ------------------------------------------------------------------
class Rejoin(RoundHook):
    """Keep the server's state after every round; when a party drops out, wait ``wait`` seconds for it
    to come back, have every party restore the last completed round, and run the next one again."""

    needs = ("recovery",)  # it copies and restores the server's state and rebinds a returning party

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self.saved: tuple[int, dict] | None = None  # (last completed round, the server's state after it)
        self.rejoins: list[dict] = []  # one entry per party that came back: partition, round run again, seconds

    def end(self, server: Recovery, grid: Grid, server_round: int, timeout: float) -> None:
        """The round is complete (every hook before this one has ended it): keep the server's state."""
        self.saved = (server_round, server.snapshot())

    def recover(self, server: Recovery, grid: Grid, exc: BaseException, timeout: float) -> int | None:
        """A party left the federation: return to the last completed round and bring it back (or refuse,
        saying why); the round after it runs next."""
        if not isinstance(exc, PartyUnavailable) or self.saved is None:
            return None
        gone = {nid: node for nid, node in server.nodes.items() if nid in exc.node_ids}
        if not gone:
            return None
        last, snapshot = self.saved
        names = ", ".join(str(n) for n in gone.values())
        log(WARNING, "FairVFL: %s dropped out in round %d; waiting up to reliability.rejoin-timeout=%g s for it to "
            "come back (restart its SuperNode with the same node config); training continues from round %d, the "
            "last completed", names, last + 1, self.wait, last)
        started = time.monotonic()
        server.restore(snapshot)
        back = self._wait(server, grid, gone, last, exc, timeout)
        staying = [nid for nid in server.nodes if nid not in gone]
        for reply in server.exchange(grid, [_message(nid, last) for nid in staying], timeout):
            _check_round(server.node_of(reply, "when the run continued"), reply, last)
        for old, node in back.items():
            server.rebind(old, node)
            self.rejoins.append({"partition": node.partition_id, "round": last + 1,
                                 "seconds": time.monotonic() - started})
        log(INFO, "FairVFL: %s back after %.1f s; every party restored round %d from its own disk; round %d runs "
            "again", ", ".join(str(n) for n in back.values()), time.monotonic() - started, last, last + 1)
        return last + 1

    def summary(self) -> dict:
        """Each party that dropped out and came back: its partition, the round run again, the seconds it took."""
        return {"rejoins": self.rejoins} if self.rejoins else {}

    def _wait(self, server: Recovery, grid: Grid, gone: dict[int, Node], last: int, exc: BaseException,
              timeout: float) -> dict[int, Node]:
        """The nodes that took the place of ``gone`` (old node id -> node), each restored to round ``last``."""
        want = {node.partition_id: old for old, node in gone.items()}
        # a returning SuperNode has a new node id; the old one may still be listed for a while (a crash)
        seen = set(server.nodes)
        back: dict[int, Node] = {}
        deadline = time.monotonic() + self.wait
        while want:
            fresh = joined_nodes(grid, seen)
            if not fresh:
                if time.monotonic() >= deadline:
                    missing = ", ".join(str(gone[old]) for old in want.values())
                    raise FederationError(
                        f"{missing} dropped out in round {last + 1} ({exc}) and did not come back within "
                        f"reliability.rejoin-timeout={self.wait:g} s; the run stops after round {last}, its last "
                        "completed round. Restart that party's SuperNode with the same node config sooner, or "
                        "raise reliability.rejoin-timeout") from None
                time.sleep(POLL_SECONDS)
                continue
            seen.update(fresh)
            for reply in server.exchange_unnamed(grid, [_message(nid, last) for nid in fresh], timeout):
                node = server.node_of(reply, "when it came back")
                old = want.pop(node.partition_id, None)
                if old is None or gone[old].role != node.role:
                    raise FederationError(f"{node} joined the federation while the run waited for "
                                          f"{', '.join(str(gone[o]) for o in want.values()) or 'no other party'}: "
                                          "one node per party; refused")
                _check_round(node, reply, last)
                back[old] = node
        return back


def _message(node_id: int, server_round: int) -> Message:
    return Message(RecordDict({msgs.ROUND: msgs.round_config(server_round, False)}), dst_node_id=node_id,
                   message_type=msgs.REJOIN, group_id=f"rejoin-{server_round}")


def _check_round(node: Node, reply: Message, last: int) -> None:
    got = config_records(reply.content)["info"].get("round")
    if got != last:
        raise FederationError(f"{node} restored round {got}, the run's last completed round is {last}: its state "
                              "on disk is not this run's; refused")
