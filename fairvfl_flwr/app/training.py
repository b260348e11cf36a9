"""The training job's assembly: the run's algorithm and the round features its config switches on.

This is the one place on the server side that reads feature flags: :func:`build_server`
looks the run's algorithm up in the registry (config/algorithms.resolve) and turns each
enabled feature into a round hook or a scheduler (:data:`ROUND_FEATURES`, in the order its
hooks run). The job itself (modes, data, rounds, run folder) is jobs/training.py, which
app/jobs.py registers with this assembly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fairvfl_flwr import algorithms  # noqa: F401  (registers every algorithm of the app)
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.config.algorithms import Algorithm, resolve
from fairvfl_flwr.data.problem import ServerLabels
from fairvfl_flwr.features.checkpoint import Checkpoints, labels_fingerprint
from fairvfl_flwr.features.ckks import CkksChannel
from fairvfl_flwr.features.final_logits import KeepScores
from fairvfl_flwr.features.guards import DivergenceGuard
from fairvfl_flwr.features.labeldp import LabelDP
from fairvfl_flwr.features.noise import NuNoise
from fairvfl_flwr.features.registry import LabelOwnerWeights, ReleaseError
from fairvfl_flwr.features.rejoin import Rejoin
from fairvfl_flwr.features.secagg import SecureAggregation
from fairvfl_flwr.features.staleness import StaleRounds, effective_quorum
from fairvfl_flwr.features.transcripts import ServerTranscript
from fairvfl_flwr.flower.hooks import RoundHook, in_order
from fairvfl_flwr.flower.server import VFLServer
from fairvfl_flwr.jobs import training
from fairvfl_flwr.jobs.encrypted_groups import RegistryChannel
from fairvfl_flwr.jobs.saving import SaveBlocks


@dataclass(frozen=True)
class RunSetup:
    """What a round feature may read to build its hook for a run."""

    cfg: RunConfig
    algorithm: Algorithm  # the run's (config/algorithms.resolve)
    labels: ServerLabels
    folder: Path  # the run folder
    resume: tuple[dict, dict] | None  # a checkpoint to continue from: (meta, state) of features/checkpoint.load_resume
    described: dict | None  # what the model cards say about the data (dataset summary, group names)
    scores: KeepScores | None  # the one hook that keeps the final scores, where the run keeps or saves them


def _label_dp(s: RunSetup) -> LabelDP | None:
    c = s.cfg
    if c.label_dp_epsilon <= 0:
        return None
    return LabelDP(s.labels.constraint_for(c.constraint, c.measure), epsilon=c.label_dp_epsilon, delta=c.label_dp_delta,
                   rounds=c.num_server_rounds, lambda_bound=c.label_dp_lambda_bound, min_group=c.label_dp_min_group,
                   fairness=c.fairness)


def _checkpoints(s: RunSetup) -> Checkpoints | None:
    if s.cfg.checkpoint_every <= 0 and s.resume is None:
        return None
    return Checkpoints(s.folder, s.cfg.checkpoint_every, s.cfg.to_flower(), labels_fingerprint(s.labels), s.resume,
                       masked=s.cfg.masked)


#: Every round feature, declared once, in the order its hook runs at every point
#: (flower/hooks.py): its hook class, and the hook a run needs (None: the run leaves it off).
#: A new round feature is its module plus one line here.
ROUND_FEATURES: tuple[tuple[type[RoundHook], Callable[[RunSetup], RoundHook | None]], ...] = (
    (DivergenceGuard, lambda s: DivergenceGuard()),  # first: nothing may checkpoint a diverged state
    # the first ν channel: it recomputes ν at the clipped λ, so noise added before it would be lost
    (LabelDP, _label_dp),
    # parties cannot redraw the noise: it is seeded by the labels too
    (NuNoise, lambda s: NuNoise(s.cfg.nu_noise, s.cfg.seed, labels_fingerprint(s.labels)) if s.cfg.nu_noise > 0
     else None),
    # encrypts ν as the channels before it left it; its second leg's replies are what hooks after it see
    (CkksChannel, lambda s: CkksChannel(len(s.labels.y_train)) if s.cfg.secure_nu == "ckks" else None),
    # ν under the registry's key, every party's gradient through it (exclusive with the CKKS channel above)
    (RegistryChannel, lambda s: RegistryChannel(s.labels.sums, len(s.labels.y_train)) if s.cfg.encrypted_groups
     else None),
    # the label owner's row weights where a registry holds the groups: in its messages before they are recorded
    (LabelOwnerWeights, lambda s: LabelOwnerWeights() if s.cfg.registry and not s.cfg.encrypted_groups else None),
    # beside the gaps the server estimates from a registry's release, the error the release adds to them
    (ReleaseError, lambda s: ReleaseError() if s.cfg.registry and not s.cfg.encrypted_groups else None),
    # after the ν channels (ν as sent), before secure aggregation (replies as received)
    (ServerTranscript, lambda s: ServerTranscript(s.cfg.transcript_dir, s.cfg.record_first, s.cfg.record_every)
     if s.cfg.transcript_dir else None),
    # before checkpoints: its key set-up runs in begin, before a resume's restart messages
    (SecureAggregation, lambda s: SecureAggregation(int(s.resume[0]["round"]) if s.resume else None)
     if s.cfg.masked else None),
    (Checkpoints, _checkpoints),
    (KeepScores, lambda s: s.scores),
    # after the guard and the kept scores: a checkpoint's block is of a sound θ, with its test scores
    (SaveBlocks, lambda s: SaveBlocks(s.folder, s.cfg.checkpoint_every, s.scores, s.described)
     if s.algorithm.saves_blocks else None),
    # last: its copy of the server's state is of a round every other hook has ended
    (Rejoin, lambda s: Rejoin(s.cfg.rejoin_wait) if s.cfg.rejoin_wait > 0 else None),
)
#: The order the server's hooks run in (ROUND_FEATURES' order): a hook class not listed is refused.
HOOK_ORDER: tuple[type[RoundHook], ...] = tuple(kind for kind, _ in ROUND_FEATURES)


def build_server(cfg: RunConfig, labels: ServerLabels, folder: Path, on_round: Callable[[dict], None] | None = None,
                 resume: tuple[dict, dict] | None = None, described: dict | None = None) -> VFLServer:
    """The run's server: its algorithm's (config/algorithms.resolve) with the hooks its features
    need (:data:`ROUND_FEATURES`), in their declared order.

    ``described``: what the model cards say about the data (dataset summary, group names).
    """
    algorithm = resolve(cfg).algorithm
    keeps = training.keeps_scores(cfg, algorithm)
    scores = KeepScores(write=keeps) if keeps or algorithm.saves_blocks else None
    setup = RunSetup(cfg, algorithm, labels, folder, resume, described, scores)
    hooks = [hook for _, make in ROUND_FEATURES if (hook := make(setup)) is not None]
    scheduler = StaleRounds(cfg.max_staleness, effective_quorum(cfg)) if cfg.max_staleness > 0 else None
    order = tuple(kind for kind, _ in ROUND_FEATURES)
    return setup.algorithm.server(cfg, labels, on_round=on_round, hooks=in_order(hooks, order), scheduler=scheduler)
