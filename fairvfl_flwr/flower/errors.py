"""Errors of the Flower runtime: what the server raises when the federation fails the run,
and which errors are the run's own refusals (not bugs) on either side."""

from __future__ import annotations

from fairvfl_flwr.config.node import NodeConfigError
from fairvfl_flwr.core.errors import ConfigError
from fairvfl_flwr.data.model_files import BlockError
from fairvfl_flwr.data.tables import DataError


class FederationError(RuntimeError):
    """The federation does not fit the run (wrong nodes, roles, rows) or a party failed."""


class PartyUnavailable(FederationError):
    """A party did not answer within round-timeout, after round-retries re-sends.

    ``node_ids``: the nodes that stayed away (a feature that waits for them to come back reads them).
    """

    def __init__(self, message: str, node_ids: frozenset[int] = frozenset()) -> None:
        super().__init__(message)
        self.node_ids = frozenset(node_ids)


#: The run's own refusals: their messages name the problem, the party and the fix, so they are
#: reported as one paragraph; any other exception is a bug and keeps its traceback.
REFUSALS: tuple[type[BaseException], ...] = (ConfigError, NodeConfigError, DataError, FederationError, BlockError)

#: How a party's error reply marks a refusal (its reason: this, then the paragraph). Flower
#: writes a raised exception as "<class '...'>:<'...'>" with a traceback in the party's log;
#: the marker lets the server tell a refusal from a party's crash.
REFUSED = "FairVFL refusal: "


def is_refusal(exc: BaseException | None) -> bool:
    """Whether ``exc`` is one of the run's own refusals (not a bug)."""
    return isinstance(exc, REFUSALS)


def one_paragraph(text: str) -> str:
    """``text`` on one line, its runs of white space (a report's line breaks) as single spaces."""
    return " ".join(str(text).split())


def party_failed(who: str, reason: str) -> FederationError:
    """The server's error for a party's error reply: a refusal by its own words, anything else
    as Flower reported it (a crash: the party's log holds its traceback)."""
    if reason.startswith(REFUSED):
        return FederationError(f"{who} refused: {reason[len(REFUSED):]}")
    return FederationError(f"{who} failed: {reason}")
