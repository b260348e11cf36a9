"""A refused run ends as one paragraph in its log, with its status failed.

Flower marks a run ``finished:failed`` when the ServerApp raises, and logs the exception
with its traceback (``flwr-serverapp``, and the simulation engine, log "ServerApp raised an
exception" with ``exc_info``), then its exit banner ("Exit Code: 201", "An unhandled
exception occurred in the ServerApp", a help link). A refusal is not a bug: the run's own
errors (a bad setting, a bad table, a federation that does not fit the run) already say
what is wrong, at which party, and what to change; a party that dropped out is said to have
dropped out. So the ServerApp still raises them (the status stays failed, its details hold
the message, the process exits non-zero), and this filter on Flower's logger turns the
exception's record into the paragraph, without the traceback, and drops the banner that
follows it. Flower 1.42 has no other way to end a run failed: a ServerApp that returns
ends it completed, and any exception it raises reaches its runner, which logs the banner
through this same logger. Any other exception keeps its traceback and banner: it is a bug
to report.
"""

from __future__ import annotations

import logging

from flwr.supercore.exit import ExitCode

from fairvfl_flwr.flower.errors import REFUSALS, PartyUnavailable, is_refusal, one_paragraph

__all__ = ["REFUSALS", "RefusalFilter", "install", "is_refusal", "paragraph"]

FLOWER_LOGGER = "flwr"
#: The banners Flower logs after the ServerApp raised (flwr-serverapp; the simulation engine).
BANNERS = tuple(f"Exit Code: {code}\n" for code in (ExitCode.SERVERAPP_EXCEPTION, ExitCode.SIMULATION_EXCEPTION))
TAIL = ("The run's status is failed; {fix} (a party's own log, its SuperNode's output, holds what only that "
        "party may see).")


def paragraph(exc: BaseException) -> str:
    """The refusal as one paragraph: what, which party, what to change (the message), and what it means."""
    text = one_paragraph(str(exc))
    if isinstance(exc, PartyUnavailable):
        return (f"FairVFL stopped the run: a party dropped out: {text}. " + TAIL.format(
            fix="start that party's SuperNode again and submit the run again, or let the run wait for a party that "
                "restarts (run config reliability.rejoin-timeout)"))
    return f"FairVFL refused the run: {text}. " + TAIL.format(
        fix="change what the message names and submit the run again")


class RefusalFilter(logging.Filter):
    """Rewrite Flower's "ServerApp raised an exception" record of a refusal into its paragraph,
    and drop the exit banner that follows it."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = False

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if is_refusal(exc):
            record.msg, record.args = "%s", (paragraph(exc),)
            record.exc_info, record.exc_text = None, None
            self.refused = True
            return True
        if self.refused and str(record.msg).startswith(BANNERS):
            self.refused = False  # one banner per refusal: a later, unrelated exit keeps its own
            return False
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Put the filter on Flower's logger once (the ServerApp's process)."""
    logger = logger or logging.getLogger(FLOWER_LOGGER)
    if not any(isinstance(f, RefusalFilter) for f in logger.filters):
        logger.addFilter(RefusalFilter())
