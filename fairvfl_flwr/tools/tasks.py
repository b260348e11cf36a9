"""Run a list of tasks, training runs of the app and other steps, with one progress line per task.

The runner behind fairvfl-sweep, fairvfl-epsweep and fairvfl-compare. A training run
goes through the real ServerApp strategy and ClientApp: over the in-process grid
(``engine="inprocess"``, the default) or submitted with ``flwr run`` to a private
simulation SuperLink (``engine="flwr"``, Ray; :mod:`fairvfl_flwr.tools.flwr_engine`).
``tests/test_simulation.py`` checks that both give the same numbers.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.tools.flwr_engine import SimulationSuperLink
from fairvfl_flwr.tools.tables import hms

ENGINES = ("inprocess", "flwr")

# rough seconds per 1000 in-process rounds on 2 cores (measured): weights for the ETA only
SECONDS_PER_1000_ROUNDS = {("adult", "linear"): 30, ("adult", "mlp"): 90, ("compas", "linear"): 10,
                           ("compas", "mlp"): 25, ("crime", "linear"): 12, ("crime", "mlp"): 20}


def run_cost(run_config: dict) -> float:
    """Expected seconds of one training run, from its dataset, model and rounds (unknown data: 20 s per 1000)."""
    defaults = RunConfig()
    rounds = int(run_config.get("num-server-rounds", defaults.num_server_rounds))
    key = (run_config.get("dataset", defaults.dataset), run_config.get("model", defaults.model))
    return SECONDS_PER_1000_ROUNDS.get(key, 20) * rounds / 1000


@dataclass
class Task:
    """One training run (``run_config``) or any other step (``work``, called with no arguments)."""

    run_config: dict | None = None
    work: Callable[[], Any] | None = None
    cost: float | None = None  # relative run time for the ETA; default: run_cost, or 1 for ``work``
    data: Any = None  # the caller's own description of the task

    def __post_init__(self) -> None:
        if (self.run_config is None) == (self.work is None):
            raise ValueError("a task is a run config or a work step, exactly one of the two")
        if self.cost is None:
            self.cost = run_cost(self.run_config) if self.run_config is not None else 1.0


@dataclass
class Done:
    """A finished task: its run folder and summary (a training run) or what ``work`` returned."""

    task: Task
    seconds: float
    folder: Path | None = None
    summary: dict | None = None
    value: Any = None


class Engine:
    """Runs one training run and returns its run folder."""

    def __init__(self, kind: str, home: Path, quiet: bool = True, link: SimulationSuperLink | None = None) -> None:
        if kind not in ENGINES:
            raise ValueError(f"engine {kind!r}: choose from {', '.join(ENGINES)}")
        self.kind, self.quiet = kind, quiet
        self.own_link = kind == "flwr" and link is None
        # the runs share one Ray head: a run's numbers do not depend on it, its start-up is paid once
        self.link = SimulationSuperLink(home, shared_ray=True) if self.own_link else link if kind == "flwr" else None

    def run(self, run_config: dict) -> Path:
        if self.link is None:
            _, folder = run_inprocess(run_config, quiet=self.quiet)
            return Path(folder)
        # give the run its own output-dir so that its folder is the only one there
        out_dir = Path(run_config.get("output-dir", RunConfig().output_dir)) / \
            f"flwr-{time.strftime('%Y%m%d-%H%M%S')}-{time.perf_counter_ns()}"
        cfg = {**run_config, "output-dir": str(out_dir)}
        self.link.run(cfg, num_supernodes=int(cfg.get("num-parties", RunConfig().num_parties)))
        folders = [p for p in out_dir.iterdir() if p.is_dir()]
        if len(folders) != 1:
            raise RuntimeError(f"expected one run folder in {out_dir}, found {folders}")
        return folders[0]

    def close(self) -> None:
        if self.own_link:
            self.link.stop()


class Progress:
    """One line per finished task: a bar, elapsed time and ETA (weighted by task cost), and a note."""

    def __init__(self, tasks: Sequence[Task], stream: TextIO | None = None) -> None:
        self.total = sum(j.cost for j in tasks) or 1.0
        self.n = len(tasks)
        self.done_cost, self.done = 0.0, 0
        self.t0 = time.perf_counter()
        self.stream = stream or sys.stderr

    def update(self, task: Task, note: str) -> None:
        self.done += 1
        self.done_cost += task.cost
        elapsed = time.perf_counter() - self.t0
        frac = self.done_cost / self.total
        eta = elapsed / frac * (1 - frac) if frac > 0 else float("nan")
        width = 28
        filled = int(round(width * frac))
        print(f"[{'#' * filled}{'-' * (width - filled)}] {self.done}/{self.n} {hms(elapsed)} elapsed, "
              f"ETA {hms(eta)} | {note}", file=self.stream, flush=True)


def run_tasks(tasks: Sequence[Task], on_done: Callable[[Done], str], *, engine: str = "inprocess",
             home: Path | None = None, quiet: bool = True, stream: TextIO | None = None,
             link: SimulationSuperLink | None = None) -> None:
    """Run ``tasks`` in order; after each, ``on_done`` keeps its results and returns the progress note.

    ``engine`` runs the training runs; ``home`` is the flwr engine's SuperLink folder
    (default: a ``flwr-home`` folder in the current one), or ``link`` a SuperLink already
    running, which the flwr engine uses and leaves running. ``quiet`` keeps the runs' round
    logs off the terminal. Progress goes to ``stream`` (stderr).
    """
    progress = Progress(tasks, stream)
    eng = Engine(engine, home or Path("flwr-home"), quiet, link) if any(j.run_config is not None for j in tasks) else None
    try:
        for task in tasks:
            started = time.perf_counter()
            if task.run_config is not None:
                folder = eng.run(task.run_config)
                done = Done(task, time.perf_counter() - started, folder=folder,
                            summary=json.loads((folder / "summary.json").read_text()))
            else:
                value = task.work()
                done = Done(task, time.perf_counter() - started, value=value)
            progress.update(task, on_done(done))
    finally:
        if eng is not None:
            eng.close()
