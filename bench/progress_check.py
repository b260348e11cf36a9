"""A job's logged time left held against what happened (bench/align.py's page records it).

:class:`Estimates` collects the log lines of one job that carry an estimate
(``fairvfl_flwr.flower.progress.RECORD``: when it was made, the seconds it said were left).
:func:`ratios` then takes, at shares of the job's seconds, the latest of them less the
seconds since it was made, as a reader of the log would, and divides it by the seconds that
were in fact left: 1 is exact, 2 says twice as long as it took.
"""

from __future__ import annotations

import logging

from fairvfl_flwr.flower.progress import RECORD

SHARES = (0.25, 0.5, 0.75)


class Estimates(logging.Handler):
    """The estimates logged for job ``what`` while the ``with`` block runs: (clock time, seconds left)."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what, self.seen = what, []

    def emit(self, record: logging.LogRecord) -> None:
        said = getattr(record, RECORD, None)
        if said and said["what"] == self.what:
            self.seen.append((said["at"], said["left"]))

    def __enter__(self) -> "Estimates":
        logging.getLogger("flwr").addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("flwr").removeHandler(self)


def ratios(seen: list[tuple[float, float]], started: float, ended: float, shares=SHARES) -> dict[str, float | None]:
    """For each share of the job's seconds (``started`` to ``ended``, the clock of ``seen``), the
    time left the log said then over the time that was left (None: nothing said yet)."""
    out: dict[str, float | None] = {}
    for share in shares:
        now = started + share * (ended - started)
        said = [(at, left) for at, left in seen if at <= now]
        at, left = max(said) if said else (None, None)
        out[f"left at {share:.0%} / actual"] = None if at is None else round(max(0.0, left - (now - at)) / (ended - now), 2)
    return out
