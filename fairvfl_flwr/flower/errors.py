"""Errors of the Flower runtime: what the server raises when the federation fails the run."""

from __future__ import annotations


class FederationError(RuntimeError):
    """The federation does not fit the run (wrong nodes, roles, rows) or a party failed."""


class PartyUnavailable(FederationError):
    """A party did not answer within round-timeout, after round-retries re-sends."""
