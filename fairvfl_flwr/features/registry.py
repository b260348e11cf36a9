"""The label owner's row weights where a registry holds the groups (run config groups.holder = "registry").

The label owner then holds labels but no group column, so it cannot form the fairness term
of its local steps itself. The server, which holds the registry's noisy release of the
groups (jobs/group_release.py), puts the rows' signed weights w = 1/n + m at the message's λ
beside z and λ in every training message to an active party (``outgoing``); the party takes
its steps from them (``PartyRuntime.constraint``, core/constraints/release.RowWeights).
What w tells the label owner about a row's group is a function of the row's randomized
release, so no more than ε_S-local privacy allows (docs/privacy.md).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, Message

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.hooks import RoundHook, ServerView


def active_payloads(server: ServerView, messages: list[Message]):
    """(payload, λ) of every message to an active party whose payload carries λ: where a channel adds
    the rows' weights at that λ (this hook's, and the encrypted groups' as if in each group)."""
    for message in messages:
        node = server.nodes.get(message.metadata.dst_node_id)
        payload = message.content.array_records.get(msgs.PAYLOAD)
        if node is None or node.role != msgs.ROLE_ACTIVE or payload is None or "lam" not in payload:
            continue
        yield payload, payload["lam"].numpy().astype(np.float64)


class LabelOwnerWeights(RoundHook):
    """Adds ``weights`` (the rows' signed weights at the message's λ) to each active party's training message."""

    def outgoing(self, server: ServerView, messages: list[Message]) -> None:
        """Every message to an active party that carries λ gets the rows' weights at that λ."""
        for payload, lam in active_payloads(server, messages):
            w = server.constraint.signed_weights(lam).astype(server.wire_dtype)
            payload["weights"] = Array(np.ascontiguousarray(w))
