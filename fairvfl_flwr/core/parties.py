"""What one party does with what it receives (docs/algorithm.md, One round, steps 4 and 5).

A party owns its feature block and its model; nothing here sends θ anywhere. The
ClientApp builds a party for each message from its cached data and the model state
kept in ``context.state``. The model is a block (``core/blocks.py``): numpy for linear
models, torch only for the MLP.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairvfl_flwr.core.constraints import ConstraintSet


@dataclass
class Party:
    """A party's features and model, and one gradient step from upstream weights ν."""

    block: Any  # LinearBlock or TorchBlock
    X_train: np.ndarray
    X_test: np.ndarray
    lr: float  # 1/η
    mu: float

    def logits(self, split: str = "train", rows: np.ndarray | None = None) -> np.ndarray:
        """Partial logits u_k on a split, or on the training ``rows`` only (a mini-batch)."""
        x = self.X_train if split == "train" else self.X_test
        return self.block.forward(self._rows(x, rows))

    def step(self, nu: np.ndarray, rows: np.ndarray | None = None) -> None:
        """θ ← θ − (1/η)(J_kᵀν + μθ): ν is the upstream gradient of u_k.

        ``rows``: the round's mini-batch, ν holds one value per batch row (core/batching.py).
        """
        self.block.step(self._rows(self.X_train, rows), nu, self.lr, self.mu)

    @property
    def n_train(self) -> int:
        """The party's training rows."""
        return int(self.X_train.shape[0])

    @staticmethod
    def _rows(x: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        return x if rows is None else x[rows]


@dataclass
class ActiveParty(Party):
    """A party that also holds y and s, and takes several steps per round."""

    y: np.ndarray | None = None
    constraint: ConstraintSet | None = None

    def local_steps(
        self, z: np.ndarray, lam: np.ndarray, steps: int, time_budget: float = 0.0, rows: np.ndarray | None = None
    ) -> int:
        """Up to Q steps on z̃ = z − u_k(old) + u_k(new): the other parties' logits stay stale.

        ``time_budget`` > 0 (seconds, run config ``staleness.local-time-budget``): take as many
        steps as fit in the budget, at least one and at most ``steps`` (= Q); a step is not
        begun when the mean step time so far says it would end past the budget. Returns the
        number of steps taken (the reply's ``steps`` metric). ``rows``: the round's
        mini-batch (``z`` then holds one value per batch row); ν, its 1/b weight and
        the group sizes are the batch's, as on the server (ConstraintSet.restrict).
        """
        started = time.perf_counter()
        x = self._rows(self.X_train, rows)
        y = self.y if rows is None else self.y[rows]
        constraint = self.constraint.restrict(rows)
        others = None  # z without this party's u_k, from the first step's forward pass

        def weights(u: np.ndarray) -> np.ndarray:
            nonlocal others
            if others is None:
                others = z - u
            return constraint.masked_weights(y, others + u, lam)

        taken = 0
        for _ in range(steps):
            self.block.step_on(x, weights, self.lr, self.mu)
            taken += 1
            if time_budget > 0:
                elapsed = time.perf_counter() - started
                if elapsed + elapsed / taken > time_budget:
                    break
        return taken
