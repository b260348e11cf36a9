"""Keep the server's final scores: the one hook that does (model cards, ``scores.npz``).

The server's summed logits z are where scores, labels and groups meet. :class:`KeepScores`
keeps z on the training rows after the last round and on the test rows of the last
evaluation (with its round): the model cards' bootstrap intervals read the test scores
(jobs/saving.py), and with ``write`` (``mode = "fairvfl-scores"`` and ``"split"``) the hook
writes both to ``scores.npz`` in the run folder, where the post-processing baselines
(FedBCD + EO / + CEO, tools/compare.py) start from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.serverapp import Grid

from fairvfl_flwr.flower.hooks import RoundHook, ServerView

SCORES = "scores.npz"


class KeepScores(RoundHook):
    """Remember z on the training rows at the last round and on the test rows at the last
    evaluation; ``write``: save them to ``scores.npz`` after the run."""

    def __init__(self, write: bool = False) -> None:
        self.write = write
        self.z_train: np.ndarray | None = None
        self.z_test: np.ndarray | None = None
        self.test_round: int | None = None  # the round z_test belongs to

    def record(self, server: ServerView, server_round: int, row: dict) -> None:
        """Keep z on the test rows of an evaluated round (every party's test logits held), and on the
        training rows of the last round."""
        if server.u_test and len(server.u_test) == len(server.nodes):
            self.z_test = server.z("test")
            self.test_round = server_round
        if server_round == server.last_round:
            self.z_train = server.z("train")

    def files(self, server: ServerView, grid: Grid, folder: Path, summary: Mapping[str, Any], timeout: float) -> None:
        """With ``write``: the kept scores in ``scores.npz`` in the run folder."""
        if self.write:
            self.save(folder)

    def save(self, folder: Path) -> Path:
        """Write the kept scores to ``scores.npz`` in ``folder`` (the post-processing baselines start from them)."""
        path = Path(folder) / SCORES
        np.savez(path, z_train=self.z_train, z_test=self.z_test)
        return path


def load_scores(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """The final scores a run saved: z on the training rows and on the test rows."""
    with np.load(Path(folder) / SCORES) as f:
        return f["z_train"], f["z_test"]
