"""A refused run ends as one paragraph in its log, with its status failed.

Flower marks a run ``finished:failed`` when the ServerApp raises, and logs the exception
with its traceback (``flwr-serverapp``, and the simulation engine, log "ServerApp raised an
exception" with ``exc_info``). A refusal is not a bug: the run's own errors (a bad
setting, a bad table, a federation that does not fit the run) already say what is wrong,
at which party, and what to change. So the ServerApp still raises them (the status stays
failed, its details hold the message), and this filter on Flower's logger turns that one
log record into the paragraph, without the traceback. Any other exception keeps its
traceback: it is a bug to report.
"""

from __future__ import annotations

import logging

from fairvfl_flwr.config import ConfigError
from fairvfl_flwr.data.model_files import BlockError
from fairvfl_flwr.data.tables import DataError
from fairvfl_flwr.flower.errors import FederationError

#: The run's own refusals: their messages name the problem, the party and the fix.
REFUSALS: tuple[type[BaseException], ...] = (ConfigError, DataError, FederationError, BlockError)
FLOWER_LOGGER = "flwr"


def is_refusal(exc: BaseException | None) -> bool:
    """Whether ``exc`` is one of the run's own refusals (not a bug)."""
    return isinstance(exc, REFUSALS)


def paragraph(exc: BaseException) -> str:
    """The refusal as one paragraph: what, which party, what to change (the message), and what it means."""
    text = " ".join(str(exc).split())
    return (f"FairVFL refused the run: {text}. The run's status is failed; change what the message names and "
            "submit the run again (a party's own log, its SuperNode's output, holds what only that party may see).")


class RefusalFilter(logging.Filter):
    """Rewrite Flower's "ServerApp raised an exception" record of a refusal into its paragraph."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if is_refusal(exc):
            record.msg, record.args = "%s", (paragraph(exc),)
            record.exc_info, record.exc_text = None, None
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Put the filter on Flower's logger once (the ServerApp's process)."""
    logger = logger or logging.getLogger(FLOWER_LOGGER)
    if not any(isinstance(f, RefusalFilter) for f in logger.filters):
        logger.addFilter(RefusalFilter())
