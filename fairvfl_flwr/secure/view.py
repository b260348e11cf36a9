"""One view of the round: secure aggregation's masks bound to what every party was sent.

Pair masks cancel in the server's sum only if every party masks with the same keys. A
server that sends a probe ν to one passive party and ν = 0 to the others would otherwise
decode that party's own step from the sum (its Gram matrix follows in a few rounds). Here
every party binds its masks to a digest of the whole exchange, which all parties compute
alike from what they can check:

* the server attaches to every message a ``secagg-view`` record: the round, and one digest
  per *part* of the exchange, a part being what one role receives under one message type
  (``train.passive/passive``: ν and the round config; ``train.active/active``: z, λ and the
  round config; ...). Every party of a role must receive the identical part;
* a party digests the message it received (SHA-256 over the message type, its role and
  every record's wire bytes except the view's own records: every value it acts on) and
  refuses the message unless the view lists exactly that digest for its part. The other
  parts' digests it takes from the view;
* view = SHA-256(session ‖ round ‖ every part name and digest); the party's history head
  links the view's parts to every exchange before them (flower/history.py), and the pair key
  of the round is SHA-256(k_ij ‖ head) (:func:`bound_key`). Parties that were sent different parts hold
  different views, their masks do not cancel, and the server decodes noise;
* each masked reply carries, for every peer j, HMAC(k_ij, sender ‖ head) (a
  *confirmation*); the server relays them with the next message. A party that masked a
  reply refuses any later message (but the identical re-send) unless every peer's
  confirmation of the same view comes with it, naming the peer whose view differed. The
  server cannot forge one: it holds no pair key.

A second leg of an encrypted-ν round (``protocol.second_leg``), or any later leg of a round
(a type declared a ``leg``: the label owner's steps through a registry's encrypted groups),
carries per-party masked sums, so it is no part of the view: it must carry the round's view
its first leg established (``protocol.continues_view``), and its reply is masked under that
view. One view per round and part: once a
party masked a reply, a second, different message of the same round and part (a re-sent
round with changed ν) is refused.

What a consistent view does not stop: a server that sends the *same* crafted ν to every
passive party learns the sum of their steps (docs/privacy.md, threat model).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections.abc import Callable, Iterable

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from fairvfl_flwr.flower import history
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.party import ALIGNED_STATE, VIEW_STATE
from fairvfl_flwr.flower.records import array_records, config_records

VIEW = "secagg-view"  # ConfigRecord on a server message: round, part digests
#: ConfigRecord on a training run's first bound messages: every party's signed key of the set-up
#: (secure/agreement.py: ``pk-<party>``, ``sig-<party>`` -> bytes; ``round-<party>``, ``head-<party>``:
#: the history it signed). Set-up, not content: a re-sent message's digest leaves it out. Config
#: records, not arrays, here and in the set-up's messages: Flower moves every array of a message
#: as objects of their own, in a request each at every hop.
RELAY = "secagg-peers"
#: ConfigRecord of confirmations, ``t-<party>`` -> 32 bytes (on a masked reply: to each peer; on a
#: message: from each peer). One record, not an array per peer: Flower moves every array of a
#: message as objects of their own, in a request each at every hop.
CONFIRM = "secagg-confirm"
STATE = VIEW_STATE  # ConfigRecord on the party: its view of the latest round, the one awaiting confirmation
DIGEST_TAG = b"fairvfl-flwr round part v1"
VIEW_TAG = b"fairvfl-flwr round view v1"
MASK_TAG = b"fairvfl-flwr view-bound pair key v1"
CONFIRM_TAG = b"fairvfl-flwr view confirmation v1"


def part_name(message_type: str, role: str) -> str:
    return f"{message_type}/{role}"


def _value(v):
    return v.hex() if isinstance(v, bytes) else [_value(x) for x in v] if isinstance(v, list) else v


def content_digest(content: RecordDict, message_type: str, role: str) -> str:
    """SHA-256 over everything a message carries but its view records: record names and
    kinds, array keys, dtypes, shapes and wire bytes, config and metric values."""
    h = hashlib.sha256(DIGEST_TAG + part_name(message_type, role).encode() + b"\0")
    for name in sorted(content.keys()):
        if name in (VIEW, CONFIRM, RELAY):
            continue
        record = content[name]
        if isinstance(record, ArrayRecord):
            h.update(b"A" + name.encode() + b"\0")
            for key in sorted(record.keys()):
                a: Array = record[key]
                h.update(json.dumps([key, a.dtype, list(a.shape), a.stype, len(a.data)]).encode())
                h.update(a.data)
        else:  # config and metric records: JSON of the values (bytes as hex)
            h.update(b"C" + name.encode() + b"\0")
            h.update(json.dumps({k: _value(v) for k, v in record.items()}, sort_keys=True).encode())
    return h.hexdigest()


def view_digest(session: str, server_round: int, parts: dict[str, str]) -> bytes:
    """The digest every party of the exchange computes alike."""
    h = hashlib.sha256(VIEW_TAG + session.encode() + b"\0" + struct.pack(">q", server_round))
    for name in sorted(parts):
        h.update(f"{name}={parts[name]}\n".encode())
    return h.digest()


def bound_key(pair_key: bytes, head: bytes) -> bytes:
    """The pair key of one history head (which links the round's view to every exchange before
    it): masks of different histories are independent."""
    return hashlib.sha256(MASK_TAG + pair_key + head).digest()


def confirmation(pair_key: bytes, sender: int, head: bytes) -> bytes:
    """Party ``sender``'s word to the pair's other party that it masked under history ``head``."""
    return hmac.new(pair_key, CONFIRM_TAG + struct.pack(">I", sender) + head, hashlib.sha256).digest()


# -- the server's side -----------------------------------------------------------------
class ServerViews:
    """What the server attaches to each message of a session, and the confirmations it relays."""

    def __init__(self, session: str) -> None:
        self.session = session
        self.current: dict[str, str] = {}  # the latest view's parts (a second leg repeats them)
        self.round = 0
        self.relay: dict[int, dict[int, bytes]] = {}  # receiver pid -> sender pid -> confirmation
        self.views: dict[int, bytes] = {}  # round -> the view of its first exchange (a transcript may keep it)

    def attach(self, messages: list[Message], role_of: Callable[[int], str], pid_of: Callable[[int], int],
               server_round: Callable[[Message], int | None]) -> None:
        """Add the exchange's view (and each receiver's confirmations) to ``messages``."""
        bound = [m for m in messages if msgs.in_view(m.metadata.message_type)]
        if not bound:
            return
        parts: dict[str, str] = {}
        rounds = set()
        for m in bound:
            mtype = m.metadata.message_type
            r = server_round(m)
            rounds.add(self.round if r is None else r)
            if msgs.continues_view(mtype, array_records(m.content).get(msgs.PAYLOAD)):
                continue
            name = part_name(mtype, role_of(m.metadata.dst_node_id))
            digest = content_digest(m.content, mtype, role_of(m.metadata.dst_node_id))
            if parts.setdefault(name, digest) != digest:  # the server's own code sends one role different values
                raise FederationError(f"round {r}: the {name} messages of one exchange differ between parties; "
                                      "secure aggregation binds every party to one view of the round")
        if len(rounds) != 1:
            raise FederationError(f"one exchange spans rounds {sorted(rounds)}")
        self.round = rounds.pop()
        if parts:
            self.current = parts
            self.views.setdefault(self.round, view_digest(self.session, self.round, parts))
        record = ConfigRecord({"round": self.round, "parts": [f"{k}={v}" for k, v in sorted(self.current.items())]})
        for m in bound:
            config_records(m.content)[VIEW] = record
            tags = self.relay.get(pid_of(m.metadata.dst_node_id), {})
            config_records(m.content)[CONFIRM] = ConfigRecord({f"t-{j}": t for j, t in sorted(tags.items())})

    def collect(self, replies: Iterable[Message], pid_of: Callable[[int], int]) -> None:
        """Take each masked reply's confirmations, to relay with the next message."""
        for reply in replies:
            record = config_records(reply.content).pop(CONFIRM, None)
            if record is None:
                continue
            sender = pid_of(reply.metadata.src_node_id)
            for key, tag in record.items():  # relayed as sent: the receiving party checks each
                self.relay.setdefault(int(key.split("-", 1)[1]), {})[sender] = tag


# -- the party's side ------------------------------------------------------------------
def accept(message: Message, state: RecordDict, *, session: str, own: int, role: str, who: str,
           pair_keys: dict[int, bytes], mask_round: int | None, run_id: int) -> tuple[int, str, bytes, bytes, bool]:
    """Check a message against the party's view and history; return (round, part, view, the
    history head its reply's masks are bound to, whether the party already masked under that
    head: the identical re-send of its last exchange, or a second leg).

    Refuses (``FederationError``) a message without a view, whose own part is not what it
    received, that the party's history refuses (flower/history.py: a second, different
    message of a round and part, an earlier round, a start after the start), or that lacks a
    peer's confirmation of the head the party last masked under. The history moves only once
    every check passed."""
    mtype = message.metadata.message_type
    record = config_records(message.content).get(VIEW)
    if record is None:
        raise FederationError(f"{who}: {mtype} carries no view of the round under secure aggregation; refused")
    try:
        server_round = int(record["round"])
        parts = dict(p.split("=", 1) for p in record["parts"])
    except (KeyError, ValueError, TypeError):
        raise FederationError(f"{who}: {mtype}: a malformed view of the round; refused") from None
    if mask_round is not None and mask_round != server_round:
        raise FederationError(f"{who}: {mtype} is round {mask_round} but its view says round {server_round}; refused")
    name = part_name(mtype, role)
    view = view_digest(session, server_round, parts)
    held = config_records(state).get(STATE)
    past = history.History.held(state, run_id)
    now = past
    if msgs.continues_view(mtype, array_records(message.content).get(msgs.PAYLOAD)):
        if held is None or int(held["round"]) != server_round or bytes.fromhex(str(held["view"])) != view:
            raise FederationError(f"{who}: {mtype} of round {server_round} does not continue the view this party "
                                  "holds of that round; refused (different messages to different parties)")
        name = str(held["part"])
    else:
        digest = content_digest(message.content, mtype, role)
        if parts.get(name) != digest:
            raise FederationError(f"{who}: the view of round {server_round} lists another {name} message than this "
                                  "party received; refused (the server sent different parties different values)")
        aligned = config_records(state).get(ALIGNED_STATE)
        block = "" if aligned is None else str(aligned["key"])
        now, _ = past.advance(mtype, server_round, name, digest, parts, who, block)
    pending = None if held is None or not held["pending"] else bytes.fromhex(str(held["pending"]))
    if pending is not None and pending != now.head:
        confirm_peers(message, pending, who, pair_keys, int(held["round"]))
    now.save(state)
    return server_round, name, view, now.head, pending is not None and pending == now.head


def confirm_peers(message: Message, pending: bytes, who: str, pair_keys: dict[int, bytes],
                  pending_round: int) -> None:
    """Every peer's confirmation of ``pending`` must come with ``message``."""
    record = config_records(message.content).get(CONFIRM)
    tags = {} if record is None else {int(k.split("-", 1)[1]): v for k, v in record.items()}
    for j in sorted(pair_keys):
        if j not in tags:
            raise FederationError(f"{who}: no confirmation from party {j} of the view of round {pending_round}; "
                                  "refused (the parties' views must match before another round)")
        tag = tags[j]
        if not isinstance(tag, bytes) or not hmac.compare_digest(tag, confirmation(pair_keys[j], j, pending)):
            raise FederationError(f"{who}: party {j}'s view of round {pending_round} differs from this party's "
                                  "(the server sent different values to different parties); refused")


def remember(state: RecordDict, server_round: int, name: str, view: bytes, head: bytes, awaiting: bool) -> None:
    """Keep the view this party answered under; ``awaiting``: a masked reply went out bound to
    the history ``head`` (or still awaits from before), so the next exchange needs the peers'
    confirmations of that head."""
    config_records(state)[STATE] = ConfigRecord({"round": server_round, "part": name, "view": view.hex(),
                                                "head": head.hex(), "pending": head.hex() if awaiting else ""})


def confirmations(head: bytes, own: int, pair_keys: dict[int, bytes]) -> ConfigRecord:
    """This party's confirmation of the history ``head`` it masked under, to each peer."""
    return ConfigRecord({f"t-{j}": confirmation(k, own, head) for j, k in sorted(pair_keys.items())})
