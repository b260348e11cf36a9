"""Secure aggregation of partial logits (run config ``privacy.secure-aggregation = true``).

Without it the server receives every party's partial logits u_k, and for a linear party
u_k(t) = (1 − μ/η) u_k(t−1) − (1/η) X_k X_kᵀ ν(t) with ν(t) computed by the server
itself: a few dozen rounds give it X_k X_kᵀ (the audit's server attack). With it every
party adds pairwise masks that cancel in the sum, so the server learns z = Σ_k u_k and,
per party, words indistinguishable from uniform noise.

This module is the feature: the server's round hook (:class:`SecureAggregation`: the key
set-up before the first logits, every round's masked replies summed) and the party's mod
(:func:`mask_mod`: every message checked against the round's view, every reply masked).
What they build on is the secure layer's: the identity keys (secure/identity.py), the key
agreement (secure/agreement.py; its own two messages are a job, jobs/key_agreement.py),
the fixed-point ring and its masks (secure/ring.py), the round's view the masks are bound
to (secure/view.py) and the party's nonce ledger (secure/nonces.py). Only the app's
assembly names this module (its hook in app/training.py, its mod in app/client.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid

from fairvfl_flwr.config.node import NodeConfig, NodeConfigError
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.arrays import to_numpy
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.hooks import RoundHook, ServerView
from fairvfl_flwr.flower.party import PartyRuntime, wire_role
from fairvfl_flwr.secure import agreement, ring, view
from fairvfl_flwr.secure.identity import check_deployment
from fairvfl_flwr.secure.nonces import Nonces, is_chunk, mask_round
from fairvfl_flwr.flower.records import array_records, config_records, metric_records

#: ConfigRecord of a masked reply: ‖θ_k‖², its 128-bit word as 16 bytes (two little-endian uint64, high
#: then low; its metric is then 0). One config value, not an array: see secure/view.RELAY.
SQ_NORM = "secagg-sq-norm"


class SecureAggregation(RoundHook):
    """Key set-up before the first logits; every round, the masked replies summed to z.

    The decoded z goes to the server's state as the first party's logits and zeros for
    the others: the server's z is exact, its per-party view is what it received (noise).
    Every message after the set-up carries the exchange's view and the confirmations the
    parties sent with their last masked replies (secure/view.py).
    """

    def __init__(self, resume: int | None = None) -> None:
        self.resume = resume  # a resumed run: its first set-up moves every party back to this round

    views: view.ServerViews | None = None
    asked: str | None = None  # the session whose keys the discovery messages asked for
    offered: dict[str, bytes] | None = None  # every party's signed key of that session, from its discovery reply
    relay: dict[str, bytes] | None = None  # those keys, to ride on the first bound messages (round 0)

    def discovered(self, server: ServerView, replies: list[Message]) -> None:
        """The parties' signed keys, asked for on the discovery messages: the set-up then needs one
        message more (the relay), not two."""
        if self.asked is None or self.views is not None:
            return
        by_node = {r.metadata.src_node_id: r for r in replies}
        self.offered = agreement.signed_keys(self.parties(server),
                                             [by_node[n.node_id] for n in server.ordered_nodes()], self.asked)

    def begin(self, server: ServerView, grid: Grid, timeout: float, rollback: int | None = None) -> None:
        """Agree the pairwise keys of every party before round 0; the run then starts at round 1.
        The keys the discovery replies brought ride on round 0's messages, under their view;
        otherwise (a rejoin's fresh session, every party moving back to round ``rollback``) the
        set-up is its own two messages."""
        rollback, self.resume = (self.resume if rollback is None else rollback), None
        if self.offered is not None and rollback is None:
            self.relay, session = self.offered, self.asked
        else:
            session = agreement.agree_keys(self.parties(server),
                                           lambda messages: server.exchange(grid, messages, timeout), rollback)
        self.offered = None  # a later set-up (a rejoin) is a fresh session
        self.views = view.ServerViews(session)
        return None

    @staticmethod
    def parties(server: ServerView) -> list[tuple[int, int, str]]:
        """(node id, partition id, name) of every party, in partition order."""
        return [(n.node_id, n.partition_id, str(n)) for n in server.ordered_nodes()]

    def rejoined(self, server: ServerView, grid: Grid, timeout: float, restored: int) -> None:
        """A party came back (its pair keys died with it): every party joins a fresh signed session
        that moves all of them back to round ``restored`` at once (each signs the history head it
        restores; none moves unless all signed the same); new pair keys and nonces."""
        self.begin(server, grid, timeout, rollback=restored)

    def outgoing(self, server: ServerView, messages: list[Message]) -> None:
        """Bind each outgoing message to the round's view (what every party was sent), so masks cancel
        only when all saw the same. Before the set-up, the discovery messages ask for every party's
        signed key of a fresh session."""
        if self.views is None:
            for message in messages:
                if message.metadata.message_type == msgs.INFO:
                    self.asked = self.asked or agreement.new_session()
                    config_records(message.content)["secagg"] = agreement.key_request(self.asked)
        else:
            bound = [m for m in messages if msgs.in_view(m.metadata.message_type)]
            if self.relay is not None and bound:  # every party checks every key before it acts on the message
                for message in bound:
                    config_records(message.content)[view.RELAY] = ConfigRecord(dict(self.relay))
                self.relay = None
            self.views.attach(messages, lambda nid: server.nodes[nid].role,
                              lambda nid: server.nodes[nid].partition_id, mask_round)

    def incoming(self, server: ServerView, grid: Grid, server_round: int, replies: list[Message],
                 timeout: float) -> list[Message]:
        """Each masked record summed over the parties: the first party's reply holds the sum,
        the others zeros (the server's z and the Newton search read only sums)."""
        first = server.ordered_nodes()[0].node_id
        if self.views is not None:
            self.views.collect(replies, lambda nid: server.nodes[nid].partition_id)
        for name, kind in ((msgs.LOGITS, ArrayRecord), (msgs.DIRECTIONS, ArrayRecord), (SQ_NORM, ConfigRecord)):
            carrying = [r for r in replies if isinstance(r.content.get(name), kind)]
            if not carrying:
                continue
            if len(carrying) != len(server.nodes):
                raise FederationError(f"round {server_round}: secure aggregation needs every party's reply, "
                                      f"got {len(carrying)} of {len(server.nodes)}")
            sums = self._sums(server, server_round, carrying, name)
            for reply in carrying:
                mine = reply.metadata.src_node_id == first
                if name == SQ_NORM:
                    del reply.content[SQ_NORM]
                    stats = metric_records(reply.content)[msgs.STATS]
                    metric_records(reply.content)[msgs.STATS] = MetricRecord(
                        {**stats, "sq-norm": float(sums["sq-norm"][0]) if mine else 0.0})
                else:
                    array_records(reply.content)[name] = msgs.array_record(
                        **{key: total if mine else np.zeros(len(total)) for key, total in sums.items()})
        return replies

    @staticmethod
    def _sums(server: ServerView, server_round: int, replies: list[Message], name: str) -> dict[str, np.ndarray]:
        """Decoded sums of every key of record ``name``, checked: uint64 words, equal lengths, masks cancelled."""
        words: dict[str, list[np.ndarray]] = {}
        for reply in replies:
            who = server.who(reply.metadata.src_node_id)
            record = reply.content[name]
            for key in record:
                w = ring.words(record[key])
                if w is None or w.dtype != np.uint64 or w.ndim != 1:
                    got = type(record[key]).__name__ if w is None else f"{w.dtype} {w.shape}"
                    raise FederationError(f"rejected a reply: {who}: {name} '{key}' is {got}, expected "
                                          "masked uint64 words (privacy.secure-aggregation)")
                if key in words and len(words[key][0]) != len(w):
                    raise FederationError(f"rejected a reply: {who}: {len(w)} words of {name} '{key}', others sent "
                                          f"{len(words[key][0])}")
                words.setdefault(key, []).append(w)
        if any(len(ws) != len(replies) for ws in words.values()):
            raise FederationError(f"rejected a reply: round {server_round}: the parties' {name} replies hold different "
                                  f"keys ({sorted(words)})")
        sums = {}
        for key, ws in words.items():
            if name == SQ_NORM or (name == msgs.DIRECTIONS and key in ring.WIDE_KEYS):
                total, limit = ring.decode_wide(ring.sum_wide(ws)), ring.WIDE_LIMIT / 2
            else:
                total, limit = ring.decode(np.sum(ws, axis=0, dtype=np.uint64)), ring.LIMIT / 2  # wraps mod 2^64
            what = f"{key} logits" if name == msgs.LOGITS else f"{name} '{key}'"
            sums[key] = ring.cancelled(total, limit, f"round {server_round}: the masks of the {what}")
        return sums


def _label(name: str, key: str, with_directions: bool = False) -> str:
    if name == msgs.LOGITS:
        # a Gauss-Newton round's logits: the last round's apply masks its logits in the same round
        return f"round-{key}" if with_directions else key
    return "dir" if key == "dir" else f"dir-{key}"


def mask_mod(message: Message, context: Context, call_next) -> Message:
    """ClientApp mod (outermost): check the message against the round's view
    (secure/view.py) before anything acts on it, then mask the logits and Newton
    directions of every reply that carries them, and its ‖θ_k‖², under pair keys bound to
    that view. New records replace the reply's: the guard may hold the plain ones to answer
    a re-sent message, which is then masked again to the same words."""
    runtime = functools.cache(lambda: PartyRuntime(context))  # built at most once, only where needed
    node = NodeConfig.of(context)
    if node.deployed or node.identity_key:
        check_deployment(context, runtime())
    held = config_records(context.state).get(agreement.SESSION_STATE)
    if held is None or not msgs.in_view(message.metadata.message_type):
        reply = call_next(message, context)
        asked = config_records(message.content).get("secagg")
        if message.metadata.message_type == msgs.INFO and asked is not None and not reply.has_error():
            config_records(reply.content)["secagg"] = agreement.signed_key(asked, context)  # the set-up's first leg
        return _mask_reply(message, context, reply, None, runtime)
    rt = runtime()
    if not rt.cfg.masked:
        return call_next(message, context)
    relay = config_records(message.content).get(view.RELAY)
    if relay is not None:  # the set-up's relay rode on this message: every key checked before anything else
        agreement.take_peers(relay, context, rt)
    keys = agreement.pair_keys(context)
    seen = view.accept(message, context.state, session=str(held["session"]), own=rt.spec.partition_id,
                       role=wire_role(rt.spec.role), who=rt.who, pair_keys=keys, mask_round=mask_round(message),
                       run_id=context.run_id)
    server_round, part, bound_view, head, awaiting = seen
    view.remember(context.state, server_round, part, bound_view, head, awaiting)  # what inner mods and a re-send see
    reply = call_next(message, context)
    if reply.has_error():
        return reply
    reply = _mask_reply(message, context, reply, head, runtime, keys)
    masked_now = view.CONFIRM in config_records(reply.content)
    view.remember(context.state, server_round, part, bound_view, head, awaiting or masked_now)
    return reply


def _mask_reply(message: Message, context: Context, reply: Message, head: bytes | None,
                runtime: Callable[[], PartyRuntime], raw: dict[int, bytes] | None = None) -> Message:
    """The reply with its logits and directions masked (pair keys bound to the history ``head``), and
    this party's confirmations of that head; unchanged if it carries neither or masking is off.
    ``runtime`` and ``raw`` (the pair keys) are the caller's, read once for the message."""
    if reply.has_error():
        return reply
    # a Gauss-Newton block's round reply carries both: the logits after its step and its next directions
    names = [n for n in (msgs.LOGITS, msgs.DIRECTIONS) if n in array_records(reply.content)]
    if not names:
        return reply
    rt = runtime()
    if not rt.cfg.masked:
        return reply
    raw = agreement.pair_keys(context) if raw is None else raw
    k = rt.cfg.num_parties
    if len(raw) != k - 1 or head is None:
        raise NodeConfigError(f"{rt.who}: privacy.secure-aggregation is on but this node holds {len(raw)} of "
                              f"{k - 1} pair keys (no set-up, or the node restarted); start the run again")
    keys = {j: view.bound_key(key, head) for j, key in raw.items()}
    own, mtype = rt.spec.partition_id, message.metadata.message_type
    server_round, chunk = mask_round(message), is_chunk(message)
    nonces = Nonces(context, rt.who, mtype, server_round)
    masked_records = {}
    for name in names:
        masked_record = masked_records[name] = {}
        for key, array in array_records(reply.content)[name].items():
            label, values = _label(name, key, msgs.DIRECTIONS in names), to_numpy(array)
            if chunk:
                if key != "logits":  # the chunk's ids: the rows the server asked for
                    masked_record[key] = values
                    continue
                label = "score"
            nonces.claim(label, values)
            if name == msgs.DIRECTIONS and key in ring.WIDE_KEYS:
                masked_record[key] = ring.masked_wide(values, own, keys, server_round, label, k, rt.who,
                                                      f"Newton '{key}'")
            else:
                what = "partial logit" if name == msgs.LOGITS else f"Newton '{key}' value"
                masked_record[key] = ring.masked(values.reshape(-1), own, keys, server_round, label, k, rt.who, what)
    stats = metric_records(reply.content).get(msgs.STATS)
    if stats is not None:
        label = "dir-sq-norm" if msgs.DIRECTIONS in names else "sq-norm"
        nonces.claim(label, np.array([stats["sq-norm"]]))
        words = ring.masked_wide(np.array([stats["sq-norm"]]), own, keys, server_round, label, k, rt.who, "‖θ_k‖²")
        config_records(reply.content)[SQ_NORM] = ConfigRecord({"sq-norm": words.astype("<u8").tobytes()})
        metric_records(reply.content)[msgs.STATS] = MetricRecord({**stats, "sq-norm": 0.0})
    nonces.save()  # only once every vector of the reply passed: a refused request uses up nothing
    for name, masked_record in masked_records.items():
        array_records(reply.content)[name] = msgs.array_record(**masked_record)
    config_records(reply.content)[view.CONFIRM] = view.confirmations(head, own, raw)
    return reply
