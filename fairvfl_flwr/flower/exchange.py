"""Push a round's messages and collect every reply, with retries and envelope checks.

Flower's deployment ``Grid.send_and_receive`` sleeps 3 s between pulls; a VFL round
needs every party's reply before it can go on, so this loop pushes once and polls
``pull_messages`` every 10 ms at first, backing off to every 100 ms, for at most
``timeout`` seconds. A node that has not answered gets the message again (``retries``
more times); a node that stays away stops the run with :class:`PartyUnavailable` naming
it. Flower's own "node unavailable" error replies count as "no reply yet". Every reply is
checked (:func:`checks.check_envelope`) before anything else looks at it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from logging import WARNING

from flwr.app import Message
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.flower import checks
from fairvfl_flwr.flower.errors import FederationError, PartyUnavailable, party_failed

# An empty pull waits POLL_SECONDS, then half as long again after each further empty one, up to
# POLL_MAX_SECONDS: a reply that comes within milliseconds (simulation) is picked up at once, and
# a deployed party's seconds (a ClientApp process per message) cost a few dozen pulls, not
# hundreds, each of them a request that the SuperLink answers.
POLL_SECONDS = 0.01
POLL_MAX_SECONDS = 0.1
NODE_CHECK_SECONDS = 1.0  # how often a waiting exchange asks the grid which nodes are still online
# Flower's own error replies for a node that is gone or a message that expired: retry.
TRANSIENT_ERROR_CODES = {3, 4, 5}  # MESSAGE_UNAVAILABLE, REPLY_MESSAGE_UNAVAILABLE, NODE_UNAVAILABLE


def exchange(grid: Grid, messages: Iterable[Message], timeout: float, retries: int,
             who: Callable[[int], str], on_reply: Callable[[int], None] | None = None) -> list[Message]:
    """Push, poll (from every 10 ms to every 100 ms); re-send to silent nodes up to ``retries``
    times; check replies.

    ``who(node_id)`` names a node in log lines and errors; ``on_reply(node_id)`` is told of
    each node's reply as it comes (a job's progress). Returns the replies in the order of
    ``messages``.
    """
    messages = list(messages)
    by_node = {m.metadata.dst_node_id: m for m in messages}
    sent: dict[str, Message] = {}  # message id -> message (every attempt)
    outstanding: dict[str, int] = {}  # message id -> node, still waiting
    replies: dict[int, Message] = {}
    waiting = set(by_node)
    for attempt in range(retries + 1):
        if attempt:
            names = ", ".join(who(n) for n in sorted(waiting))
            log(WARNING, "FairVFL: no reply from %s (gone, or silent for reliability.round-timeout=%g s); re-sending (try %d of %d)",
                names, timeout, attempt + 1, retries + 1)
        batch = []
        for nid in sorted(waiting):
            m = by_node[nid]
            batch.append(m if attempt == 0 else Message(m.content, dst_node_id=nid, message_type=m.metadata.message_type,
                                                        group_id=m.metadata.group_id))
        gone: set[int] = set()  # nodes that cannot answer in this try: no use waiting for them
        for mid, m in zip(grid.push_messages(batch), batch):
            if mid:
                sent[mid] = m
                outstanding[mid] = m.metadata.dst_node_id
            else:  # the SuperLink refused it: the node has left the federation
                gone.add(m.metadata.dst_node_id)
                log(WARNING, "FairVFL: %s: the SuperLink refused the message (node not registered)",
                    who(m.metadata.dst_node_id))
        deadline = time.monotonic() + timeout
        next_check = time.monotonic() + NODE_CHECK_SECONDS
        pause = POLL_SECONDS
        while waiting and time.monotonic() < deadline and not waiting <= gone:
            if time.monotonic() >= next_check:  # a SuperNode that stopped is no longer listed online
                online = set(grid.get_node_ids())
                for nid in sorted(waiting - gone - online):
                    gone.add(nid)
                    log(WARNING, "FairVFL: %s is no longer online", who(nid))
                next_check = time.monotonic() + NODE_CHECK_SECONDS
            got = list(grid.pull_messages(list(outstanding)))
            for reply in got:
                mid = reply.metadata.reply_to_message_id
                nid = outstanding.pop(mid, None)
                if nid is None:
                    nid = sent[mid].metadata.dst_node_id if mid in sent else reply.metadata.src_node_id
                if reply.has_error():
                    if reply.error.code in TRANSIENT_ERROR_CODES:  # the node is gone for now: try again
                        if not any(n == nid for n in outstanding.values()):
                            gone.add(nid)
                            log(WARNING, "FairVFL: %s is unavailable: %s", who(nid), reply.error.reason)
                        continue
                    raise party_failed(who(nid), reply.error.reason)
                if nid in replies:
                    continue  # a late answer to an earlier try: the first one counts
                check_envelope(reply, sent, who(nid))
                replies[nid] = reply
                waiting.discard(nid)
                if on_reply is not None:
                    on_reply(nid)
            if got:
                pause = POLL_SECONDS
            elif waiting:
                time.sleep(pause)
                pause = min(pause * 1.5, POLL_MAX_SECONDS)
        if not waiting:
            break
    if waiting:
        names = ", ".join(who(n) for n in sorted(waiting))
        tries = f"{retries + 1} tr{'y' if retries == 0 else 'ies'}"
        if waiting <= gone:
            raise PartyUnavailable(f"{names} left the federation or is reported unavailable by Flower; no reply after {tries}",
                                   frozenset(waiting))
        raise PartyUnavailable(f"no reply within {timeout:g} s after {tries} from {names}", frozenset(waiting))
    return [replies[nid] for nid in by_node]


def check_envelope(reply: Message, sent: dict[str, Message], who: str) -> None:
    """:func:`checks.check_envelope`, raised as a :class:`FederationError`."""
    try:
        checks.check_envelope(reply, sent, who)
    except checks.ReplyError as exc:
        raise FederationError(f"rejected a reply: {exc}") from None
