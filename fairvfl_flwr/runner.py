"""One training job for the comparison: FairVFL/FedBCD or split learning, plus the scores.

Like ``server.run_server`` (same strategy class, same run folder), and in addition it
saves ``scores.npz`` in the run folder: the server's final summed logits ``z`` on the
training and test rows. Post-processing baselines (FedBCD + EO / + CEO) start from
these: the server is where scores, labels and groups meet, so that is where they run.

Run-config key ``mode`` picks the job:

* ``fairvfl`` (default): FairVFL, or FedBCD with ``fairness = false``;
* ``split``: split-learning VFL as in Flower's vertical-FL example (``splitlearning``).

Under ``flwr run``, ``server.py`` hands any ``mode`` other than its own default
(``fairvfl``, which runs ``run_server`` as before) to :func:`run_job`; the compare
command asks for ``mode = "fairvfl-scores"`` to get FairVFL with scores saved.
"""

from __future__ import annotations

from logging import INFO
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from flwr.serverapp import Grid
from flwr.supercore import log

from .config import ConfigError, RunConfig
from .problem import load_data, party_columns, server_labels
from .results import RunRecorder, format_summary, run_folder
from .strategy import FairVFL

MODES = ("fairvfl", "fairvfl-scores", "split")
SCORES = "scores.npz"


class _KeepsScores:
    """Mixin: remember the server's z on train and test rows at the last round."""

    z_train_final: np.ndarray | None = None
    z_test_final: np.ndarray | None = None

    def _record(self, server_round: int) -> dict:  # type: ignore[override]
        if server_round == self.cfg.num_server_rounds:
            self.z_train_final = self._z("train")
            if self.u_test:
                self.z_test_final = self._z("test")
        return super()._record(server_round)


class ScoringFairVFL(_KeepsScores, FairVFL):
    """FairVFL (or FedBCD) that keeps its final scores."""


def _server_labels(cfg: RunConfig, ds):
    """The server's labels, the way ``server.run_server`` gets them (deployment-aware if available)."""
    try:
        from .partydata import server_labels_for  # issue 3: label files and party files
    except ImportError:
        return server_labels(cfg, ds)
    return server_labels_for(cfg, ds)


def mode_of(run_config: Mapping[str, Any]) -> str:
    mode = str(run_config.get("mode", "fairvfl") or "fairvfl")
    if mode not in MODES:
        raise ConfigError(f"run config mode={mode!r}: choose one of {', '.join(MODES)}")
    return mode


def run_job(grid: Grid, run_config: Mapping[str, Any], run_id: int | str | None = None) -> tuple[dict, Path]:
    """Run one job on ``grid``; return (summary, run folder) with ``scores.npz`` written."""
    from .splitlearning import SplitVFL, split_settings  # registers nothing new: client.py imports it

    mode = mode_of(run_config)
    cfg = RunConfig.from_flower(run_config)
    ds = load_data(cfg)
    columns = party_columns(cfg, ds)
    labels = _server_labels(cfg, ds)
    extra: dict[str, Any] = {"mode": mode}
    if mode == "split":
        d, lr = split_settings(run_config, cfg)
        extra.update({"split-embedding": d, "split-lr": lr})
    folder = run_folder(cfg, run_id)
    recorder = RunRecorder(folder, cfg, extra={**extra, "party-columns": [len(c) for c in columns],
                                                "dataset-summary": ds.summary()})
    log(INFO, "FairVFL (%s): writing results to %s", mode, folder)
    if mode == "split":
        strategy: Any = type("ScoringSplitVFL", (_KeepsScores, SplitVFL), {})(
            cfg, labels, on_round=recorder.add, embedding=extra["split-embedding"], lr=extra["split-lr"])
    else:
        strategy = ScoringFairVFL(cfg, labels, on_round=recorder.add)
    strategy.start(grid)
    np.savez(folder / SCORES, z_train=strategy.z_train_final, z_test=strategy.z_test_final)
    summary = recorder.finish({**extra, "party_columns": [len(c) for c in columns],
                               "setup_seconds": strategy.setup_seconds})
    log(INFO, "%s", format_summary(summary, folder))
    return summary, folder


def run_job_inprocess(run_config: Mapping[str, Any], **grid_kwargs: Any) -> tuple[dict, Path]:
    """:func:`run_job` over an in-process grid (same ClientApp, no SuperLink)."""
    from .client import app as client_app
    from .inprocess import InProcessGrid

    mode_of(run_config)
    cfg = RunConfig.from_flower(run_config)
    grid = InProcessGrid(client_app, dict(run_config), cfg.num_parties, **grid_kwargs)
    return run_job(grid, run_config)


def load_scores(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(Path(folder) / SCORES) as f:
        return f["z_train"], f["z_test"]
