"""Errors of the Flower runtime: what the server raises when the federation fails the run."""

from __future__ import annotations


class FederationError(RuntimeError):
    """The federation does not fit the run (wrong nodes, roles, rows) or a party failed."""


class PartyUnavailable(FederationError):
    """A party did not answer within round-timeout, after round-retries re-sends.

    ``node_ids``: the nodes that stayed away (a feature that waits for them to come back reads them).
    """

    def __init__(self, message: str, node_ids: frozenset[int] = frozenset()) -> None:
        super().__init__(message)
        self.node_ids = frozenset(node_ids)
