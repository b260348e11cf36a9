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

from fairvfl_flwr.core.batching import batch_groups
from fairvfl_flwr.core.models import gradient_step
from fairvfl_flwr.core.objective import Groups
from fairvfl_flwr.core.step import server_step


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
    """f̃ = L(θ) + Σ_c [λ_c+ (D_c − ε) − λ_c− (D_c + ε)] − (c/2)‖λ‖², differentiable in every θ_k.

    For ``deo`` groups (one constraint) this is the paper's L + λ1 (D − ε) − λ2 (D + ε) − (c/2)‖λ‖².
    """
    z = sum(m(x) for m, x in zip(models, blocks))
    yt = torch.as_tensor(y, dtype=z.dtype)
    losses = nn.functional.softplus(-yt * z)  # log(1 + exp(-y z))
    reg = sum((p**2).sum() for m in models for p in m.parameters())
    L = losses.mean() + 0.5 * mu * reg
    lam = np.asarray(lam, dtype=np.float64)
    if lam.shape != (groups.num_multipliers,):
        raise ValueError(f"{len(groups.constraints)} constraint(s) need {groups.num_multipliers} multipliers")
    f = L - 0.5 * c * float((lam**2).sum())
    q = losses if groups.measure == "loss" else torch.sigmoid(z)
    for k, con in enumerate(groups.constraints):
        ia, ib = torch.as_tensor(con.in_a), torch.as_tensor(con.in_b)
        D = q[ia].mean() - q[ib].mean()
        f = f + float(lam[2 * k]) * (D - epsilon) - float(lam[2 * k + 1]) * (D + epsilon)
    return f


class CentralisedGDA:
    """Gradient descent on θ (all blocks) and projected ascent on λ, one process."""

    def __init__(self, models, blocks, y, groups, *, epsilon, beta, c, mu, lr, fairness=True):
        self.models, self.blocks, self.y, self.groups = list(models), list(blocks), y, groups
        self.epsilon, self.beta, self.c, self.mu, self.lr, self.fairness = epsilon, beta, c, mu, lr, fairness
        self.lam = np.zeros(groups.num_multipliers)
        self.lams: list[np.ndarray] = []

    def z(self, blocks: Sequence[torch.Tensor] | None = None) -> np.ndarray:
        with torch.no_grad():
            return sum(m(x) for m, x in zip(self.models, blocks or self.blocks)).numpy()

    def round(self, rows: np.ndarray | None = None) -> None:
        """One step of both; ``rows``: descend and ascend on the mini-batch f̃ of those rows only."""
        if rows is None:
            blocks, y, groups = self.blocks, self.y, self.groups
        else:
            index = torch.from_numpy(rows)
            blocks, y, groups = [x[index] for x in self.blocks], self.y[rows], batch_groups(self.groups, rows)
        self.lam, _ = server_step(self.lam, y, self.z(blocks), groups, epsilon=self.epsilon, beta=self.beta,
                                  c=self.c, fairness=self.fairness)
        self.lams.append(self.lam.copy())
        f = lagrangian(self.models, blocks, y, groups, self.lam, self.epsilon, self.c, 0.0)
        f.backward()
        for m in self.models:
            gradient_step(m, self.lr, self.mu)  # adds μθ itself, hence mu=0 above
