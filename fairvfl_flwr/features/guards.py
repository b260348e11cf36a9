"""Guards: the server's divergence check, and the parties' check of what arrives.

Server (:class:`DivergenceGuard`, a round hook): after every round the objective, every
multiplier and the summed logits must be finite, or the run stops naming the round
(before a checkpoint could save the diverged state: add this hook first).

Party (:func:`guard_mod`, a ClientApp mod): every message of a round (``protocol.IN_ROUNDS``)
must carry an integer round number; a re-sent message (same type, round
and content as the last one answered: a digest over every record but secure aggregation's
view, confirmations and key relay) is answered again instead of being processed twice, and a
message of the same type and round with other content is refused. For a step message
(``protocol.Kind.STEP``) the answer is rebuilt from the θ the party already has, so
nothing steps twice; for other messages the reply itself is kept. Either way the answer goes
out only if it is the reply already sent (its digest is kept). Every type answered in the
latest round is remembered, so no leg of a round of several legs runs twice.
The algorithm's own handlers check the payload (its length, dtype, finiteness).
"""

from __future__ import annotations

from logging import ERROR

import numpy as np
from flwr.app import ConfigRecord, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.data.tables import DataError
from fairvfl_flwr.flower import checks
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.secure import view
from fairvfl_flwr.flower.errors import REFUSALS, REFUSED, FederationError, one_paragraph
from fairvfl_flwr.flower.hooks import RoundHook, ServerView
from fairvfl_flwr.flower.party import PartyRuntime, mark_answer_record
from fairvfl_flwr.flower.records import config_records, metric_records

LAST = "fairvfl.last-reply"  # ConfigRecord: the latest round, and per type answered in it: digests, record names
LAST_PREFIX = "fairvfl.last-reply."
mark_answer_record(LAST)  # a copy of a round's reply: a party restored to another round drops it


class DivergenceGuard(RoundHook):
    """Stop the run at the first round whose objective, λ or z is not finite."""

    def end(self, server: ServerView, grid: Grid, server_round: int, timeout: float) -> None:
        """Refuse the round just recorded when its loss, λ or z is not finite, naming the round."""
        row = server.last_row
        with np.errstate(over="ignore", invalid="ignore"):
            z = server.z("train")
        checks.check_state(float(row["loss"]), server.lam, server_round, z)


def guard_mod(message: Message, context, call_next) -> Message:
    """Round-number check and duplicate suppression (see the module doc)."""
    mtype = message.metadata.message_type
    # the party starts afresh: nothing before it is re-sent. A rejoin is no restart here: a party
    # moves back only by a restore (flower/store.py), which drops the copy kept below itself.
    kind = msgs.kind_of(mtype)
    if kind not in msgs.IN_ROUNDS:
        return call_next(message, context)
    rc = config_records(message.content).get(msgs.ROUND)
    if rc is None or not isinstance(rc.get("round"), int):
        raise checks.ReplyError(f"{PartyRuntime(context).who}: {mtype} message without an integer round number")
    server_round = int(rc["round"])
    mtype = _leg(mtype, rc)
    digest = view.content_digest(message.content, mtype, "")
    last = config_records(context.state).get(LAST)
    if last is not None and last["round"] == server_round and mtype in last["types"]:
        if last[f"{mtype}|digest"] != digest:
            raise FederationError(f"{PartyRuntime(context).who}: {mtype} of round {server_round} differs from the one "
                                  "this party answered; only a byte-identical re-send is answered again; refused")
        return _again(message, context, last, kind is msgs.Kind.STEP)
    if kind is msgs.Kind.START:
        reply = call_next(message, context)
        _forget(context)
        return reply
    step = kind is msgs.Kind.STEP
    reply = call_next(message, context)
    if reply.has_error():
        return reply
    if last is not None and last["round"] != server_round:
        _forget(context)
        last = None
    # Keep a copy of the reply only where it cannot be rebuilt: logits would double the
    # state sent with every message. Every type answered in the round is remembered, not only
    # the last: a round of two legs re-sent leg by leg must not run its first leg again.
    names = [] if step else list(reply.content.keys())
    for name in names:
        context.state[f"{LAST_PREFIX}{mtype}|{name}"] = reply.content[name]
    stats = metric_records(reply.content).get(msgs.STATS)
    held = {} if last is None else dict(last)
    held.update({"round": server_round, "types": [*held.get("types", []), mtype], f"{mtype}|digest": digest,
                 f"{mtype}|names": names, f"{mtype}|reply": _reply_digest(reply),
                 f"{mtype}|steps": int(stats["steps"]) if stats else 0})
    config_records(context.state)[LAST] = ConfigRecord(held)
    return reply


def _leg(mtype: str, rc) -> str:
    """The name a message is kept under: its type, and where one round sends a type several times
    (a leg of the label owner's steps through the registry, jobs/encrypted_groups.py) the leg its
    round config names."""
    return f"{mtype}#{int(rc['leg'])}" if "leg" in rc else mtype


def _again(message: Message, context, last: ConfigRecord, step: bool) -> Message:
    """The answer to a re-sent message: the reply rebuilt from the θ the party holds (a step
    message: logits would double the state kept) or the one kept, only if it is the reply
    already sent: a party whose state moved since would otherwise reveal a new value."""
    mtype = _leg(message.metadata.message_type, config_records(message.content)[msgs.ROUND])
    if step:
        rt = PartyRuntime(context)
        reply = rt.reply(message, rt.party(), steps=int(last[f"{mtype}|steps"]))
    else:
        reply = Message(RecordDict({name: context.state[f"{LAST_PREFIX}{mtype}|{name}"]
                                    for name in last[f"{mtype}|names"]}), reply_to=message)
    if _reply_digest(reply) != last[f"{mtype}|reply"]:
        raise FederationError(f"{PartyRuntime(context).who}: the answer to a re-sent {mtype} of round "
                              f"{last['round']} would differ from the reply this party sent (its state moved since); "
                              "refused")
    return reply


def _reply_digest(reply: Message) -> str:
    """SHA-256 of a reply's values (its logits or directions and statistics): what a re-send must repeat."""
    return view.content_digest(reply.content, "reply", "")


def _forget(context) -> None:
    config_records(context.state).pop(LAST, None)
    for name in [n for n in context.state.keys() if n.startswith(LAST_PREFIX)]:
        context.state.pop(name, None)


def refusal_mod(message: Message, context, call_next) -> Message:
    """ClientApp mod (outermost but the timing log): a refusal (a bad node config, table or
    setting, a message that does not fit; :data:`REFUSALS`) is this party's answer, not a crash.
    It is logged here as one paragraph and answered as an error reply whose reason is that
    paragraph; raised, Flower would log its traceback and send "<class '...'>:<'...'>". A
    refusal that names the party's data (example ids or values, a ``DataError``'s ``local`` part) keeps
    them in this log only: the server receives why, never the data."""
    try:
        return call_next(message, context)
    except REFUSALS as exc:
        public = exc.public if isinstance(exc, DataError) else str(exc)
        log(ERROR, "FairVFL: this party refused the run (%s message): %s", message.metadata.message_type,
            one_paragraph(str(exc)))
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=REFUSED + one_paragraph(public)),
                       reply_to=message)
