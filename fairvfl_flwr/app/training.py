"""The training job's server side: config → labels → server (algorithm + features) → run folder.

This is the one place on the server side that reads feature flags: it looks the run's
algorithm up in the registry (config/algorithms.resolve) and turns each enabled feature
into a round hook or a scheduler (:data:`ROUND_FEATURES`). Its modes (run config ``mode``):

* ``fairvfl`` (default): the algorithm ``optimizer`` names or ``auto`` picks (FairVFL, or
  FedBCD with ``fairness = false``);
* ``fairvfl-scores``: the same, and the server's final scores go to ``scores.npz`` (the
  post-processing baselines of ``tools/compare.py`` start from them);
* an algorithm's own mode: ``split``, split-learning VFL as in Flower's vertical-FL example
  (``algorithms/split.py``), which keeps its scores too.

After the rounds of an algorithm that saves blocks, and at each of its checkpoints, every
party saves its block on its own disk and the server writes the manifest and model card
(``jobs/saving.py``). :data:`JOB` is the training job of the registry (app/jobs.py): these
modes, this server entry and the parties' handlers of discovery, encrypted ν and a rejoin;
each algorithm's handlers are routed as it is registered (flower/jobs.py).
"""

from __future__ import annotations

import time
from logging import ERROR, INFO
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr import algorithms  # noqa: F401  (registers every algorithm of the app)
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.config.algorithms import Algorithm, registered, resolve
from fairvfl_flwr.data.partydata import server_labels_for
from fairvfl_flwr.data.problem import ServerLabels, columns_note, load_data, party_columns
from fairvfl_flwr.jobs.alignment import align_tables
from fairvfl_flwr.jobs.group_release import release_groups
from fairvfl_flwr.features.checkpoint import Checkpoints, labels_fingerprint, load_resume
from fairvfl_flwr.features import ckks
from fairvfl_flwr.features.ckks import CkksChannel
from fairvfl_flwr.features.guards import DivergenceGuard
from fairvfl_flwr.features.labeldp import LabelDP
from fairvfl_flwr.features.noise import NuNoise
from fairvfl_flwr.features.registry import LabelOwnerWeights
from fairvfl_flwr.features import rejoin
from fairvfl_flwr.features.rejoin import Rejoin
from fairvfl_flwr.jobs.saving import CheckpointBlocks, FinalTest, save_blocks
from fairvfl_flwr.features.final_logits import KeepScores
from fairvfl_flwr.features.secagg import SecureAggregation
from fairvfl_flwr.features.staleness import StaleRounds, effective_quorum
from fairvfl_flwr.features.transcripts import ServerTranscript
from fairvfl_flwr.flower import party
from fairvfl_flwr.flower.hooks import RoundHook, in_order
from fairvfl_flwr.flower.jobs import Job
from fairvfl_flwr.flower.results import RunRecorder, format_summary, run_folder
from fairvfl_flwr.flower.server import VFLServer


@dataclass(frozen=True)
class RunSetup:
    """What a round feature may read to build its hook for a run."""

    cfg: RunConfig
    algorithm: Algorithm  # the run's (config/algorithms.resolve)
    labels: ServerLabels
    folder: Path  # the run folder
    resume: tuple[dict, dict] | None  # a checkpoint to continue from: (meta, state) of features/checkpoint.load_resume
    described: dict | None  # what the model cards say about the data (dataset summary, group names)


def _label_dp(s: RunSetup) -> LabelDP | None:
    c = s.cfg
    if c.label_dp_epsilon <= 0:
        return None
    return LabelDP(s.labels.groups_for(c.constraint, c.measure), epsilon=c.label_dp_epsilon, delta=c.label_dp_delta,
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
    # the label owner's row weights where a registry holds the groups: in its messages before they are recorded
    (LabelOwnerWeights, lambda s: LabelOwnerWeights() if s.cfg.registry else None),
    # after the ν channels (ν as sent), before secure aggregation (replies as received)
    (ServerTranscript, lambda s: ServerTranscript(s.cfg.transcript_dir, s.cfg.record_first, s.cfg.record_every)
     if s.cfg.transcript_dir else None),
    # before checkpoints: its key set-up runs in begin, before a resume's restart messages
    (SecureAggregation, lambda s: SecureAggregation(int(s.resume[0]["round"]) if s.resume else None)
     if s.cfg.masked else None),
    (Checkpoints, _checkpoints),
    (KeepScores, lambda s: KeepScores() if keeps_scores(s.cfg, s.algorithm) else None),
    (FinalTest, lambda s: FinalTest() if s.algorithm.saves_blocks else None),
    # after the guard and FinalTest: a checkpoint's block is of a sound θ, with its test scores
    (CheckpointBlocks, lambda s: CheckpointBlocks(s.folder, s.cfg.checkpoint_every, s.described)
     if s.algorithm.saves_blocks and s.cfg.checkpoint_every > 0 else None),
    # last: its copy of the server's state is of a round every other hook has ended
    (Rejoin, lambda s: Rejoin(s.cfg.rejoin_wait) if s.cfg.rejoin_wait > 0 else None),
)
#: The order the server's hooks run in (ROUND_FEATURES' order): a hook class not listed is refused.
HOOK_ORDER: tuple[type[RoundHook], ...] = tuple(kind for kind, _ in ROUND_FEATURES)
#: The training job's modes: whether each keeps the server's final scores (an algorithm's own
#: mode selects that algorithm, whose declaration says so).
MODES = {"fairvfl": False, "fairvfl-scores": True}


def keeps_scores(cfg: RunConfig, algorithm: Algorithm) -> bool:
    """Whether the run keeps the server's final scores: its algorithm does, or its mode asks."""
    return algorithm.keeps_scores or MODES.get(cfg.mode, False)


def build_server(cfg: RunConfig, labels: ServerLabels, folder: Path, on_round: Callable[[dict], None] | None = None,
                 resume: tuple[dict, dict] | None = None, described: dict | None = None) -> VFLServer:
    """The run's server: its algorithm's (config/algorithms.resolve) with the hooks its features
    need (:data:`ROUND_FEATURES`), in their declared order.

    ``described``: what the model cards say about the data (dataset summary, group names).
    """
    setup = RunSetup(cfg, resolve(cfg).algorithm, labels, folder, resume, described)
    hooks = [hook for _, make in ROUND_FEATURES if (hook := make(setup)) is not None]
    scheduler = StaleRounds(cfg.max_staleness, effective_quorum(cfg)) if cfg.max_staleness > 0 else None
    order = tuple(kind for kind, _ in ROUND_FEATURES)
    return setup.algorithm.server(cfg, labels, on_round=on_round, hooks=in_order(hooks, order), scheduler=scheduler)


def run_training(grid: Grid, cfg: RunConfig, run_id: int | str | None = None) -> tuple[dict, Path]:
    """Run one training job of ``cfg`` on ``grid``; return its summary and run folder.

    Every input is validated (config, data, partition) before the first message.
    """
    started = time.perf_counter()
    if cfg.tables_own:  # every party brings its own table: private alignment first, the label owner's labels
        ds, columns, labels = None, [], align_tables(grid, cfg)
    elif cfg.server_labels:  # deployment: the server holds only its label file, never a feature table
        ds, columns, labels = None, [], server_labels_for(cfg)
    else:
        ds = load_data(cfg)
        columns = party_columns(cfg, ds)  # validates num-parties / active-columns against the table
        labels = server_labels_for(cfg, ds)
        fitted = columns_note(cfg, ds)
        if fitted:  # every party fits the same split on its own; the server says it once
            log(INFO, "FairVFL: %s", fitted)
    if cfg.registry:  # a registry holds the groups: the server continues with their noisy release
        labels = release_groups(grid, cfg, labels)
    resume = load_resume(cfg, labels, cfg.resume_from) if cfg.resume_from else None
    folder = Path(cfg.resume_from).expanduser().resolve() if resume else run_folder(cfg, run_id)
    choice = resolve(cfg)
    extra: dict[str, Any] = {} if cfg.mode == "fairvfl" else {"mode": cfg.mode}
    if choice.algorithm.summary is not None:
        extra.update(choice.algorithm.summary(cfg))
    recorder = RunRecorder(folder, cfg, extra={**extra, "party-columns": [len(c) for c in columns],
                                               "dataset-summary": ds.summary() if ds else None})
    log(INFO, "FairVFL%s: writing results to %s%s", f" ({cfg.mode})" if extra else "", folder, _where(cfg.output_dir))
    if not choice.algorithm.mode:  # an algorithm its mode selects has no optimizer to report
        log(INFO, "FairVFL: optimizer=%r: %s", cfg.optimizer, choice.reason)
    names = ds.group_names if ds else labels.group_names  # a deployment's label file names several groups
    described = {"dataset-summary": ds.summary() if ds else None, "group-names": list(names) if names else None}
    server = build_server(cfg, labels, folder, on_round=recorder.add, resume=resume, described=described)
    if resume:
        recorder.rows = list(resume[1]["snapshot"]["history"])
    try:
        server.start(grid)
    except Exception as exc:  # a party stayed away, a bad reply, divergence: say so, keep the history
        _stopped(server, recorder, folder, exc)
        raise
    scores = server.hooks.find(KeepScores)
    if scores is not None:
        scores.save(folder)
    dp = server.hooks.find(LabelDP)
    if dp is not None:
        extra["label_dp"] = dp.summary()
    rejoined = server.hooks.find(Rejoin)
    if rejoined is not None and rejoined.rejoins:  # each party that dropped out and came back
        extra["rejoins"] = rejoined.rejoins
    summary = recorder.finish(
        {**extra, "party_columns": [len(c) for c in columns], "setup_seconds": server.setup_seconds,
         # from the ServerApp's start (alignment, set-up) to the first training round's start
         "seconds_to_round_1": None if server.first_round_started is None else server.first_round_started - started,
         "batch_size": server.batch_size,  # 0: full batch (also when batch-size >= the training rows)
         **server.train_differences(), **server.fairness_groups()}
    )
    if choice.algorithm.saves_blocks:
        save_blocks(server.view, grid, folder, {**summary, **described}, cfg.round_timeout)
    log(INFO, "%s", format_summary(summary, folder))
    return summary, folder


def _where(output_dir: str) -> str:
    """Why a relative output-dir landed where it did: under flwr run the ServerApp's working
    directory is the SuperLink's, not the shell's that ran flwr run (configuration.md#the-run-folder)."""
    if Path(output_dir).expanduser().is_absolute():
        return ""
    return f" (output-dir={output_dir!r} is relative: taken from the working directory {Path.cwd()})"


def _stopped(server: VFLServer, recorder: RunRecorder, folder: Path, exc: BaseException) -> None:
    """The run is stopping on ``exc``: say why and what is on disk, keep the history."""
    notes = server.hooks.stopped(exc)
    if not server.history:  # round 0 is the initial model: none yet, nothing this run trained to keep
        log(ERROR, "FairVFL: run stopped before round 1: %s | nothing trained in this run (run folder %s)%s", exc,
            folder, "".join(f" | {n}" for n in notes))
        return
    if recorder.rows:
        recorder.write_history()
    notes = notes or ["no checkpoint (set reliability.checkpoint-every > 0 to be able to resume)"]
    log(ERROR, "FairVFL: run stopped after round %s: %s | history so far in %s | %s", server.history[-1]["round"],
        exc, folder, " | ".join(notes))


#: The training job: selected by its modes and the registered algorithms' own; the parties'
#: handlers of discovery, encrypted ν and a rejoin (each algorithm's are routed as it is registered).
JOB = Job("training", {**party.HANDLERS, **ckks.HANDLERS, **rejoin.HANDLERS}, run=run_training,
          modes=(*MODES, *(alg.mode for alg in registered() if alg.mode)))
