"""The nonce ledger: a party masks only rounds that advance, and each label of its latest round once.

A mask's nonce is (round, label) under k_ij, and the party itself keeps which it used
(:class:`Nonces`): it masks only rounds that advance, and in its latest round each label
once, or again for the bit-identical vector. A server relabelling a later round as an
earlier one (where θ = 0 made a reply its bare mask) is refused; a re-sent request gets its
identical masked reply. A scoring chunk's round is its first row (:func:`mask_round`).
"""

from __future__ import annotations

import hashlib

import numpy as np
from flwr.app import ConfigRecord, Context, Message

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.party import round_of
from fairvfl_flwr.flower.records import config_records

NONCE_STATE = "fairvfl.secagg-nonces"  # ConfigRecord on the party: the last round it masked, what it masked in it
#: The ConfigRecord a scoring chunk's message carries (jobs/scoring.py): its rows' ``start`` orders the chunks
#: as rounds order a run's sums.
CHUNK = "score"


def is_chunk(message: Message) -> bool:
    """Whether ``message`` asks for a scoring chunk (told by what it carries, not by its type)."""
    return CHUNK in config_records(message.content)


def mask_round(message: Message) -> int | None:
    """The round a reply to ``message`` is masked under: a scoring chunk's first row, else
    the round config's round (None: the message carries none)."""
    if is_chunk(message):
        return int(config_records(message.content)[CHUNK]["start"])
    return round_of(message)[0] if msgs.ROUND in config_records(message.content) else None


class Nonces:
    """The party's own nonce discipline: a mask's nonce is (round, label) under pair keys
    bound to the signed session, so the party accepts only rounds that advance, and in its
    latest round masks each label once, or again for the very same vector (a re-sent
    request, answered with the identical words). A server relabelling a later round as an
    earlier one is refused: no two vectors are ever masked under one nonce."""

    def __init__(self, context: Context, who: str, mtype: str, server_round: int) -> None:
        self.context, self.who, self.mtype, self.round = context, who, mtype, server_round
        held = config_records(context.state).get(NONCE_STATE)
        last = -1 if held is None else int(held["round"])
        if server_round < last:
            raise FederationError(f"{who}: {mtype} asks to mask round {server_round} after round {last}; rounds must "
                                  "advance under secure aggregation (a relabelled round would reuse a mask): refused")
        self.used = dict(u.split("=", 1) for u in held["used"]) if held is not None and server_round == last else {}

    def claim(self, label: str, values: np.ndarray) -> None:
        """Use the nonce of ``label`` in this round for ``values``: refused if it masked other values."""
        digest = hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()
        if self.used.get(label, digest) != digest:
            raise FederationError(f"{self.who}: {self.mtype} asks to mask a different '{label}' vector in round "
                                  f"{self.round}, whose nonce this party already used; refused (a relabelled or "
                                  "altered request)")
        self.used[label] = digest

    def save(self) -> None:
        """Keep what this reply used (once every vector of it passed) in the node state."""
        config_records(self.context.state)[NONCE_STATE] = ConfigRecord(
            {"round": self.round, "used": [f"{k}={v}" for k, v in self.used.items()]})
