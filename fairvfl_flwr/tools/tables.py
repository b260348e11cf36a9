"""The tools' table cells and markdown tables: one format for a metric over seeds."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence


def mean_std(values: Iterable[float | None], *, scale: float = 1.0, digits: int = 3, unit: str = "") -> str:
    """One cell: the value of a single run, or mean ± std over several.

    Missing values (None, NaN: a metric a run did not report) are left out; with none
    left the cell says ``n/a``.
    """
    vals = [scale * v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}{unit}"
    return f"{statistics.mean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}{unit}"


def markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table's lines: the first column (names) left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def hms(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on; ``?`` when not known yet."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
