"""Keep the server's final scores (``mode = "fairvfl-scores"`` and ``"split"``).

The post-processing baselines (FedBCD + EO / + CEO, tools/compare.py) start from the
server's summed logits z on the training and test rows after the last round: the
server is where scores, labels and groups meet, so that is where they run. The hook
writes them to ``scores.npz`` in the run folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fairvfl_flwr.flower.hooks import RoundHook, ServerView

SCORES = "scores.npz"


class KeepScores(RoundHook):
    """Remember z on the training and test rows at the last round."""

    def __init__(self) -> None:
        self.z_train: np.ndarray | None = None
        self.z_test: np.ndarray | None = None

    def record(self, server: ServerView, server_round: int, row: dict) -> None:
        """Keep z on the training and test rows of the last round."""
        if server_round == server.last_round:
            self.z_train = server.z("train")
            if server.u_test:
                self.z_test = server.z("test")

    def save(self, folder: Path) -> Path:
        """Write the kept scores to ``scores.npz`` in the run folder (the post-processing baselines start from them)."""
        path = Path(folder) / SCORES
        np.savez(path, z_train=self.z_train, z_test=self.z_test)
        return path


def load_scores(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """The final scores a run saved: z on the training rows and on the test rows."""
    with np.load(Path(folder) / SCORES) as f:
        return f["z_train"], f["z_test"]
