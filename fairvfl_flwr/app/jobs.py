"""Every job of the app, registered once: the ServerApp's dispatch, the ClientApp's handlers,
the protocol's message list and the run config's modes derive from this registration
(flower/jobs.py).

A new job is its module (its message types, party handlers, server entry and modes: a
:class:`~fairvfl_flwr.flower.jobs.Job`) plus its entry in :data:`JOBS`
(docs/architecture.md, "Adding a job").
"""

from __future__ import annotations

from fairvfl_flwr.app import training
from fairvfl_flwr.flower.jobs import Job, register
from fairvfl_flwr.jobs import alignment, group_release, key_agreement, saving, scoring

#: The app's jobs: training (its modes fairvfl, fairvfl-scores, split), the scoring job
#: (mode score), and the jobs that run inside them.
JOBS: tuple[Job, ...] = (training.JOB, scoring.JOB, alignment.JOB, saving.JOB, group_release.JOB, key_agreement.JOB)
register(*JOBS)
