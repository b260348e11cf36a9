"""One history per run: a party moves only along the chain every party holds.

Secure aggregation binds each round's masks to the round's view (secure/view.py), so
parties sent different values in one round produce a sum that does not decode. A view
alone says nothing of what came *before* the round: a server that steps one party back
(a restart, a fresh session, a re-sent start message) and then sends every party the same
message has one party answer from an older state and the others from the current one, and
two such sums give that party's own step. So every party keeps the same chain:

    head_t = SHA-256(tag ‖ head_{t−1} ‖ round ‖ the round's part digests)

one link per exchange (the view's parts: what every role was sent, which every party
checks for its own part). The chain leaves the session out, so a fresh key set-up at the
same round keeps the head, and the head is what the set-up signs:

* masks and view confirmations are bound to the head (secure/view.bound_key), so two
  parties whose histories differ anywhere produce masks that never cancel;
* a message of a round and part already answered is answered again only when it is
  byte-identical to the one answered (a re-send, by content), in any session; any other
  message of an earlier round, or of a part already answered, is refused;
* a start message (``query.init``) is refused once the party answered anything;
* each key set-up carries every party's signed (round, head), and a party refuses a set-up
  in which any peer's differs (secure/agreement.py); a rollback is one such set-up in which
  every party signs the round and head it restores from its own disk, and none moves
  before all have signed (flower/store.py holds the states).

Cost: one SHA-256 per message over the view's digests; a 32-byte head travels in the
set-up only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from dataclasses import dataclass

from flwr.app import ConfigRecord, RecordDict

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.party import mark_round_state
from fairvfl_flwr.flower.records import config_records

STATE = "fairvfl.history"  # ConfigRecord on the party: its chain's round, head and last exchange
GENESIS_TAG = b"fairvfl-flwr history genesis v1"
LINK_TAG = b"fairvfl-flwr history link v1"
#: ``History.part`` after a restore: the restored round is closed, nothing of it is answered again.
CLOSED = "*"


def genesis(run_id: int) -> bytes:
    """The head before any exchange of run ``run_id`` (every party of the run computes it alike)."""
    return hashlib.sha256(GENESIS_TAG + struct.pack(">Q", int(run_id) % 2**64)).digest()


def link(head: bytes, server_round: int, parts: dict[str, str]) -> bytes:
    """The head after an exchange of ``server_round`` whose parts' digests are ``parts``."""
    h = hashlib.sha256(LINK_TAG + head + struct.pack(">q", int(server_round)))
    for name in sorted(parts):
        h.update(f"{name}={parts[name]}\n".encode())
    return h.digest()


@dataclass(frozen=True)
class History:
    """A party's place in the run's chain.

    ``round``: the latest round it answered (−1: none); ``head``: the chain after it;
    ``part`` and ``digest``: the last exchange's part and the digest of the message answered
    (a re-send must match it); ``answered``: the parts answered in ``round``; ``block``: the key of
    the aligned block the party answered its first exchange with (its rows: they may not change
    under a history, since no peer would see it)."""

    round: int
    head: bytes
    part: str = ""
    digest: str = ""
    answered: tuple[str, ...] = ()
    block: str = ""

    @classmethod
    def held(cls, state: RecordDict, run_id: int) -> "History":
        """The party's history as its node state holds it (the genesis of ``run_id`` before any exchange)."""
        record = config_records(state).get(STATE)
        if record is None:
            return cls(-1, genesis(run_id))
        return cls(int(record["round"]), bytes.fromhex(str(record["head"])), str(record["part"]),
                   str(record["digest"]), tuple(str(p) for p in record["answered"]), str(record.get("block", "")))

    def save(self, state: RecordDict) -> None:
        """Keep this history in the node state (a restore brings it back with the round's state)."""
        config_records(state)[STATE] = ConfigRecord({"round": self.round, "head": self.head.hex(), "part": self.part,
                                                    "digest": self.digest, "answered": list(self.answered),
                                                    "block": self.block})

    def closed(self) -> "History":
        """This history as restored from disk: its round is over, no message of it is answered again
        (the party's reply to it, and the guard's copy, are not part of the state kept)."""
        return dataclasses.replace(self, part=CLOSED, digest="", answered=(CLOSED,))

    def advance(self, message_type: str, server_round: int, part: str, digest: str, parts: dict[str, str],
                who: str, block: str = "") -> tuple["History", bool]:
        """The history after answering ``message_type`` of ``server_round`` (own part ``part``,
        its digest ``digest``; every part's digest ``parts``; ``block``: the key of the aligned
        block it holds now), and whether it is a re-send of the last exchange. Anything that would
        move the party back, answer a round twice or answer from other rows is refused."""
        if self.round >= 0 and block != self.block:
            raise FederationError(
                f"{who}: {message_type} of round {server_round}: this party's aligned block changed since its "
                "history began (a new alignment mid-run); its replies would be of other rows than its peers "
                "expect; refused")
        if server_round == self.round and part == self.part:
            if digest != self.digest:
                raise FederationError(
                    f"{who}: {message_type} of round {server_round} differs from the {part} message this party "
                    f"answered in that round (history head {self.head.hex()[:12]}…); only a byte-identical re-send "
                    "is answered again, in any session; refused")
            return self, True
        if msgs.kind_of(message_type) is msgs.Kind.START and self.round >= 0:
            raise FederationError(
                f"{who}: {message_type} after this party answered round {self.round}: a party never starts over "
                "alone (a rollback is one set-up every party signs); refused")
        if server_round < self.round or (server_round == self.round and (part in self.answered
                                                                         or CLOSED in self.answered)):
            raise FederationError(
                f"{who}: {message_type} of round {server_round} after this party answered round {self.round} "
                f"(history head {self.head.hex()[:12]}…): a party's history never moves back outside a rollback "
                "every party signs; refused")
        answered = (*self.answered, part) if server_round == self.round else (part,)
        return History(server_round, link(self.head, server_round, parts), part, digest, answered, block), False


mark_round_state(STATE)  # a restored party continues from the head of the round it restored
