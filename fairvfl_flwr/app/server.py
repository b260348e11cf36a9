"""The ServerApp: the job the run config's ``mode`` selects, from the job registry.

Every job of the app is registered once in app/jobs.py (training: jobs/training.py; the
scoring job, ``mode = "score"``: jobs/scoring.py); :func:`run_server` reads the selected
job's settings from the run config once and runs its server entry (flower/jobs.run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fairvfl_flwr.app import jobs as registration  # noqa: F401  (registers every job of the app)
from fairvfl_flwr.app import refusals
from fairvfl_flwr.app.quiet import quiet_third_party_warnings
from fairvfl_flwr.app.threads import limit_blas_threads
from fairvfl_flwr.features.timing import timed
from fairvfl_flwr.flower import jobs


def run_server(grid: Grid, run_config: Mapping[str, Any], run_id: int | str | None = None) -> tuple[dict, Path]:
    """Run the job ``run_config`` selects (its ``mode``) on ``grid``; return its summary and run folder."""
    return jobs.run(grid, run_config, run_id)


limit_blas_threads()  # the server's subspace search and ν: see app/threads.py
quiet_third_party_warnings()  # see app/quiet.py
refusals.install()  # a refusal ends the run failed, as one paragraph in its log (app/refusals.py)
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_server(timed(grid), context.run_config, getattr(grid.run, "run_id", None))  # timed: FAIRVFL_TIMING_LOG
