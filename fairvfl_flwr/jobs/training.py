"""The training job: config → labels → server (algorithm + features) → rounds → run folder.

Its modes (run config ``mode``, :data:`MODES`):

* ``fairvfl`` (default): the algorithm ``optimizer`` names or ``auto`` picks
  (config/algorithms.resolve; FairVFL, or FedBCD with ``fairness = false``);
* ``fairvfl-scores``: the same, and the server's final scores go to ``scores.npz`` (the
  post-processing baselines of ``tools/compare.py`` start from them);
* an algorithm's own mode: ``split``, split-learning VFL as in Flower's vertical-FL example
  (``algorithms/split.py``), which keeps its scores too.

The job aligns the parties' own tables (jobs/alignment.py) or reads the server's labels,
has a registry release the groups where it holds them (jobs/group_release.py), runs the
server the app assembles (app/training.build_server: the run's algorithm and the hooks its
features need) and keeps its run folder. After the rounds the hooks add to the run's
summary and write their own files (flower/hooks.py ``summary``, ``files``): the kept scores,
and, for an algorithm that saves blocks, every party's block on its own disk and the
server's manifest and model card (jobs/saving.py). :func:`job` is the training job of the
registry: these modes, this server entry and the parties' handlers of discovery, encrypted
ν and a rejoin; each algorithm's handlers are routed as it is registered (flower/jobs.py).
"""

from __future__ import annotations

import functools
import time
from logging import ERROR, INFO
from pathlib import Path
from typing import Any, Callable

from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.config.algorithms import Algorithm, registered, resolve
from fairvfl_flwr.core.constraints.release import ENCRYPTED, RANDOMIZED_RESPONSE
from fairvfl_flwr.data.partydata import server_labels_for
from fairvfl_flwr.data.problem import ServerLabels, columns_note, load_data, party_columns
from fairvfl_flwr.features import ckks, rejoin
from fairvfl_flwr.features.checkpoint import load_resume
from fairvfl_flwr.flower import party
from fairvfl_flwr.flower.jobs import Job
from fairvfl_flwr.flower.results import RunRecorder, format_summary, run_folder
from fairvfl_flwr.flower.server import VFLServer
from fairvfl_flwr.jobs.alignment import align_tables
from fairvfl_flwr.jobs.encrypted_groups import encrypted_labels
from fairvfl_flwr.jobs.group_release import release_groups

#: How a registry releases the groups (run config ``groups.release``): the server's labels from it.
RELEASES: dict[str, Callable[[Grid, RunConfig, ServerLabels], ServerLabels]] = {
    RANDOMIZED_RESPONSE: release_groups, ENCRYPTED: encrypted_labels}
#: The run's server with its features' hooks: (cfg, labels, run folder, on_round=, resume=,
#: described=) -> a VFLServer (the app assembles it: app/training.build_server).
ServerBuilder = Callable[..., VFLServer]
#: The training job's own modes: whether each keeps the server's final scores (an algorithm's own
#: mode selects that algorithm, whose declaration says so).
MODES = {"fairvfl": False, "fairvfl-scores": True}


def keeps_scores(cfg: RunConfig, algorithm: Algorithm) -> bool:
    """Whether the run keeps the server's final scores: its algorithm does, or its mode asks."""
    return algorithm.keeps_scores or MODES.get(cfg.mode, False)


def run_training(grid: Grid, cfg: RunConfig, run_id: int | str | None = None, *,
                 build_server: ServerBuilder) -> tuple[dict, Path]:
    """Run one training job of ``cfg`` on ``grid`` with the server ``build_server`` assembles;
    return its summary and run folder.

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
    if cfg.registry:  # a registry holds the groups: the server continues with their release
        labels = RELEASES[cfg.groups_release](grid, cfg, labels)
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
    extra.update(server.hooks.summary())
    summary = recorder.finish(
        {**extra, "party_columns": [len(c) for c in columns], "setup_seconds": server.setup_seconds,
         # from the ServerApp's start (alignment, set-up) to the first training round's start
         "seconds_to_round_1": None if server.first_round_started is None else server.first_round_started - started,
         "batch_size": server.batch_size,  # 0: full batch (also when batch-size >= the training rows)
         **server.train_differences(), **server.fairness_groups()}
    )
    server.hooks.files(grid, folder, summary, cfg.round_timeout)
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


#: The parties' handlers of the training job: discovery, encrypted ν and a rejoin.
HANDLERS = {**party.HANDLERS, **ckks.HANDLERS, **rejoin.HANDLERS}


def job(build_server: ServerBuilder) -> Job:
    """The training job, its server assembled by ``build_server``: selected by its modes and the
    registered algorithms' own."""
    return Job("training", HANDLERS, run=functools.partial(run_training, build_server=build_server),
               modes=(*MODES, *(alg.mode for alg in registered() if alg.mode)))
