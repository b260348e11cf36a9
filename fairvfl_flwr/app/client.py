"""The ClientApp: one party of the federation, assembled from the registered jobs' handlers
(app/jobs.py) and the features' mods.

Mods run outermost first: the timing log (off unless ``FAIRVFL_TIMING_LOG`` is set)
counts every other mod's time as the message's; a refusal that names the party's data is
logged on the party and sent without it; a scoring job's party keeps the training
settings its messages carry and builds its scoring job from them before any other mod
reads the run config (through PartyRuntime); secure aggregation masks every reply's
logits, the guard's re-sent answers included; the guard answers re-sent messages before
anything else runs; the rejoin mod keeps the party's state of a round on its own disk after
the step (every round when the run waits for a party that drops out, the checkpoint rounds
when it checkpoints: one store for both); the transcript mods record what a party
received; the straggler mod delays replies last, so a delay never changes state. Each
mod reads its own section of the run config and passes through when it is off.
"""

from __future__ import annotations

from flwr.clientapp import ClientApp

# first of the app's modules: it notes when the app's import began
from fairvfl_flwr.features import timing  # isort: skip
from fairvfl_flwr.app import jobs as registration  # noqa: F401  (registers every job of the app)
from fairvfl_flwr.app.quiet import quiet_third_party_warnings
from fairvfl_flwr.app.threads import limit_blas_threads
from fairvfl_flwr.features import ckks, rejoin, secagg
from fairvfl_flwr.features.guards import guard_mod, refusal_mod
from fairvfl_flwr.features.straggler import delay_mod
from fairvfl_flwr.features.transcripts import transcript_mod
from fairvfl_flwr.flower import jobs
from fairvfl_flwr.flower.party import MODEL_STATE
from fairvfl_flwr.jobs import encrypted_groups, scoring

__all__ = ["MODEL_STATE", "app"]

limit_blas_threads()  # before any party computes: see app/threads.py
quiet_third_party_warnings()  # see app/quiet.py

app = ClientApp(mods=[timing.timing_mod, refusal_mod, scoring.settings_mod, secagg.mask_mod, guard_mod, ckks.ckks_mod,
                      encrypted_groups.active_mod, rejoin.rejoin_mod, transcript_mod, delay_mod])
# Every registered job's message types routed to its handler (flower/jobs.py), also a job registered later.
jobs.attach(app)
timing.imported()
