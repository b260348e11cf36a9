"""What one party does with what it receives (SPEC.md steps 4 and 5).

A party owns its feature block and its model; nothing here sends θ anywhere. The
ClientApp builds a party for each message from its cached data and the model state
kept in ``context.state``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .models import gradient_step
from .objective import Groups, masked_weights


@dataclass
class Party:
    """A party's features and model, and one gradient step from upstream weights ν."""

    model: nn.Module
    X_train: torch.Tensor
    X_test: torch.Tensor
    lr: float  # 1/η
    mu: float

    def logits(self, split: str = "train") -> np.ndarray:
        x = self.X_train if split == "train" else self.X_test
        with torch.no_grad():
            return self.model(x).numpy()

    def step(self, nu: np.ndarray) -> None:
        """θ ← θ − (1/η)(J_kᵀν + μθ): backpropagate ν as the upstream gradient of u_k."""
        u = self.model(self.X_train)
        u.backward(torch.as_tensor(nu, dtype=u.dtype))
        gradient_step(self.model, self.lr, self.mu)


@dataclass
class ActiveParty(Party):
    """A party that also holds y and s, and takes several steps per round."""

    y: np.ndarray | None = None
    groups: Groups | None = None

    def local_steps(self, z: np.ndarray, lam: np.ndarray, steps: int) -> int:
        """Q steps on z̃ = z − u_k(old) + u_k(new): the other parties' logits stay stale."""
        u_old = self.logits("train")
        others = z - u_old
        for _ in range(steps):
            u = self.model(self.X_train)
            nu = masked_weights(self.y, others + u.detach().numpy(), lam, self.groups)
            u.backward(torch.as_tensor(nu, dtype=u.dtype))
            gradient_step(self.model, self.lr, self.mu)
        return steps
