"""The centralised problem: f̃_t(θ, λ) on all columns at once, in torch.

Not part of the federated protocol. It is the yardstick the federated code is tested
against (the gradient identity, and "Q = 1 equals centralised gradient descent-ascent")
and the single-process floor for benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from .models import gradient_step
from .objective import Groups, dual_step, loss_gap, logistic_loss


def lagrangian(
    models: Sequence[nn.Module],
    blocks: Sequence[torch.Tensor],
    y: np.ndarray,
    groups: Groups,
    lam: np.ndarray,
    epsilon: float,
    c: float,
    mu: float,
) -> torch.Tensor:
    """f̃ = L(θ) + λ1 (D − ε) − λ2 (D + ε) − (c/2)‖λ‖², differentiable in every θ_k."""
    z = sum(m(x) for m, x in zip(models, blocks))
    yt = torch.as_tensor(y, dtype=z.dtype)
    losses = nn.functional.softplus(-yt * z)  # log(1 + exp(-y z))
    reg = sum((p**2).sum() for m in models for p in m.parameters())
    L = losses.mean() + 0.5 * mu * reg
    ia, ib = torch.as_tensor(groups.in_a), torch.as_tensor(groups.in_b)
    D = losses[ia].mean() - losses[ib].mean()
    lam1, lam2 = float(lam[0]), float(lam[1])
    return L + lam1 * (D - epsilon) - lam2 * (D + epsilon) - 0.5 * c * (lam1**2 + lam2**2)


class CentralisedGDA:
    """Gradient descent on θ (all blocks) and projected ascent on λ, one process."""

    def __init__(self, models, blocks, y, groups, *, epsilon, beta, c, mu, lr, fairness=True):
        self.models, self.blocks, self.y, self.groups = list(models), list(blocks), y, groups
        self.epsilon, self.beta, self.c, self.mu, self.lr, self.fairness = epsilon, beta, c, mu, lr, fairness
        self.lam = np.zeros(2)
        self.lams: list[np.ndarray] = []

    def z(self) -> np.ndarray:
        with torch.no_grad():
            return sum(m(x) for m, x in zip(self.models, self.blocks)).numpy()

    def round(self) -> None:
        gap = loss_gap(logistic_loss(self.y, self.z()), self.groups)
        if self.fairness:
            self.lam = dual_step(self.lam, gap, self.epsilon, self.beta, self.c)
        self.lams.append(self.lam.copy())
        f = lagrangian(self.models, self.blocks, self.y, self.groups, self.lam, self.epsilon, self.c, 0.0)
        f.backward()
        for m in self.models:
            gradient_step(m, self.lr, self.mu)  # adds μθ itself, hence mu=0 above
