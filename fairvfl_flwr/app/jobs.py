"""Every job of the app, registered once: the ServerApp's dispatch, the ClientApp's handlers,
the protocol's message list and the run config's modes derive from this registration
(flower/jobs.py).

A new job is its module in ``jobs/`` (its message types, declared with their kinds and party
handlers, its server entry and modes: a :class:`~fairvfl_flwr.flower.jobs.Job`) plus its entry
in :data:`JOBS`
(docs/architecture.md, "Adding a job").
"""

from __future__ import annotations

from fairvfl_flwr.app.training import build_server
from fairvfl_flwr.flower.jobs import Job, register
from fairvfl_flwr.jobs import alignment, encrypted_groups, group_release, key_agreement, saving, scoring, training

#: The app's jobs: training (its modes fairvfl, fairvfl-scores, split; its server assembled with the
#: round features, app/training.py), the scoring job (mode score), and the jobs that run inside them.
JOBS: tuple[Job, ...] = (training.job(build_server), scoring.JOB, alignment.JOB, saving.JOB, group_release.JOB,
                         encrypted_groups.JOB, key_agreement.JOB)
register(*JOBS)
