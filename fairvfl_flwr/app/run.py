"""Run a job in this process: the real ServerApp job and ClientApp over an in-process grid.

For tests (fast, inspectable messages) and for tools that run many jobs (sweeps,
the comparison) that would take hours on Ray; ``flwr run`` runs the same code.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any, Mapping

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.flower import jobs
from fairvfl_flwr.flower.inprocess import InProcessGrid


def run_inprocess(run_config: Mapping[str, Any], *, quiet: bool = False, grid: InProcessGrid | None = None,
                  **grid_kwargs: Any) -> tuple[dict, Path]:
    """Run the ServerApp's job over an :class:`InProcessGrid`; return (summary, folder).

    ``run_config`` is checked as ``flwr run`` checks it (an unknown key is refused), and read
    once by the job its ``mode`` selects (flower/jobs.py), whose parties the grid holds.
    ``quiet`` silences the per-round log and the final table (for sweeps that print
    their own progress line per run). ``grid``: run on this grid (built for the same run
    config) instead of a new one, e.g. to read a node's state afterwards.
    """
    job = jobs.selected(run_config)
    settings = job.read(run_config)
    grid = grid or InProcessGrid(client_app, settings.to_flower(), settings.num_parties, **grid_kwargs)
    if not quiet:
        return job.run(grid, settings, None)
    flwr_logger = logging.getLogger("flwr")
    # a filter, not setLevel: Flower code run inside the job may reset the logger's level
    flwr_logger.addFilter(_warnings_only)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return job.run(grid, settings, None)
    finally:
        flwr_logger.removeFilter(_warnings_only)


def _warnings_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING
