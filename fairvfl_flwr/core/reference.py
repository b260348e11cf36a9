"""The centralised problem: f̃_t(θ, λ) on all columns at once, in torch.

Not part of the federated protocol. It is the yardstick the federated code is tested
against (the gradient identity, and "Q = 1 equals centralised gradient descent-ascent").
The floors (:class:`NumpyFloor`, :class:`NewtonFloor`, :class:`PartyFloor`) run the
federated round's math in one process without messages: the app is tested against them
round for round, and the benchmarks time them as the floor of every other mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fairvfl_flwr.core.constraints import ConstraintSet
from fairvfl_flwr.core.blocks import build_block
from fairvfl_flwr.core.models import gradient_step
from fairvfl_flwr.core import newton
from fairvfl_flwr.core.newton import (
    MEMORY,
    block_direction,
    curvature,
    party_curvature,
    search_step,
    with_bias,
)
from fairvfl_flwr.core.parties import ActiveParty, Party
from fairvfl_flwr.core.step import server_step


def lagrangian(
    models: Sequence[nn.Module],
    blocks: Sequence[torch.Tensor],
    y: np.ndarray,
    constraint: ConstraintSet,
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
    if lam.shape != (constraint.num_multipliers,):
        raise ValueError(f"{len(constraint.gap_list)} constraint(s) need {constraint.num_multipliers} multipliers")
    f = L - 0.5 * c * float((lam**2).sum())
    q = losses if constraint.measure == "loss" else torch.sigmoid(z)
    for k, con in enumerate(constraint.gap_list):
        ia, ib = torch.as_tensor(con.in_a), torch.as_tensor(con.in_b)
        D = q[ia].mean() - q[ib].mean()
        f = f + float(lam[2 * k]) * (D - epsilon) - float(lam[2 * k + 1]) * (D + epsilon)
    return f


class CentralisedGDA:
    """Gradient descent on θ (all blocks) and projected ascent on λ, one process."""

    def __init__(self, models, blocks, y, constraint, *, epsilon, beta, c, mu, lr, fairness=True):
        self.models, self.blocks, self.y, self.constraint = list(models), list(blocks), y, constraint
        self.epsilon, self.beta, self.c, self.mu, self.lr, self.fairness = epsilon, beta, c, mu, lr, fairness
        self.lam = np.zeros(constraint.num_multipliers)
        self.lams: list[np.ndarray] = []

    def z(self, blocks: Sequence[torch.Tensor] | None = None) -> np.ndarray:
        """z = Σ_k u_k over every block (or over ``blocks``, e.g. a mini-batch's rows), without a graph."""
        with torch.no_grad():
            return sum(m(x) for m, x in zip(self.models, blocks or self.blocks)).numpy()

    def round(self, rows: np.ndarray | None = None) -> None:
        """One step of both; ``rows``: descend and ascend on the mini-batch f̃ of those rows only."""
        if rows is None:
            blocks, y, constraint = self.blocks, self.y, self.constraint
        else:
            index = torch.from_numpy(rows)
            blocks, y, constraint = [x[index] for x in self.blocks], self.y[rows], self.constraint.restrict(rows)
        self.lam, _ = server_step(self.lam, y, self.z(blocks), constraint, epsilon=self.epsilon, beta=self.beta,
                                  c=self.c, fairness=self.fairness)
        self.lams.append(self.lam.copy())
        f = lagrangian(self.models, blocks, y, constraint, self.lam, self.epsilon, self.c, 0.0)
        f.backward()
        for m in self.models:
            gradient_step(m, self.lr, self.mu)  # adds μθ itself, hence mu=0 above


def _dual_step(floor, z):
    """The server's step of a floor (docs/algorithm.md, One round, steps 2-3): new λ and ν."""
    return server_step(floor.lam, floor.y, z, floor.constraint, epsilon=floor.epsilon, beta=floor.beta, c=floor.c,
                       fairness=floor.fairness)


class NumpyFloor:
    """FairVFL's round (docs/algorithm.md) for linear models in one process, plain numpy, no messages.

    Identical math to the federated run (the server's dual step and ν, passive steps from
    ν, the active party's Q steps on z̃); the floor every other mode is compared with.
    """

    def __init__(self, blocks, y, constraint: ConstraintSet, *, epsilon, beta, c, mu, lr, Q, active=1, fairness=True):
        self.X = [np.ascontiguousarray(b) for b in blocks]
        self.y, self.constraint = y.astype(np.float64), constraint
        self.epsilon, self.beta, self.c, self.mu, self.lr, self.Q, self.active = epsilon, beta, c, mu, lr, Q, active
        self.fairness = fairness
        self.theta = [np.zeros(x.shape[1]) for x in self.X]
        self.bias = [0.0 if k < active else None for k in range(len(self.X))]
        self.lam = np.zeros(constraint.num_multipliers)
        self.u = [self._u(k, x) for k, x in enumerate(self.X)]

    def _u(self, k, x):
        u = x @ self.theta[k]
        return u + self.bias[k] if self.bias[k] is not None else u

    def z(self):
        """z = Σ_k u_k, the scores the server sums from the parties' logits."""
        return np.sum(self.u, axis=0)

    def round(self):
        """One federated round in one process: the server's dual step and ν, the active parties' Q
        steps on z̃, one step per passive party from ν."""
        z = self.z()
        self.lam, nu = _dual_step(self, z)
        for k, x in enumerate(self.X):
            if k < self.active:
                others = z - self.u[k]
                for _ in range(self.Q):
                    nu_k = self.constraint.masked_weights(self.y, others + self._u(k, x), self.lam)
                    self.theta[k] -= self.lr * (x.T @ nu_k + self.mu * self.theta[k])
                    self.bias[k] -= self.lr * (nu_k.sum() + self.mu * self.bias[k])
            else:
                self.theta[k] -= self.lr * (x.T @ nu + self.mu * self.theta[k])
        self.u = [self._u(k, x) for k, x in enumerate(self.X)]


class NewtonFloor(NumpyFloor):
    """``optimizer = "newton"`` (fairvfl_flwr/core/newton.py) in one process, linear models.

    The server's dual step and ν as for gradient descent; each party's block Newton
    direction; the server's subspace line search over the K step lengths; each party
    moves by its α_k. ``curvature``: what the passive parties use for h (``exact``: sent by
    the server; ``nu``, ``const``: derived by the party). ``lr`` and ``Q`` are unused.
    """

    def __init__(self, blocks, y, constraint: ConstraintSet, *, curvature="nu", memory=MEMORY, **kw):
        super().__init__(blocks, y, constraint, **kw)
        self.curvature, self.memory = curvature, memory
        self.jac, self.previous = None, None
        self.alphas: list[np.ndarray] = []
        self.moves: list[list] = [[] for _ in self.X]  # each party's last moves θ_k(t) − θ_k(t−1), newest first
        self.du_moves: list[list] = [[] for _ in self.X]

    def params(self, k):
        """Party k's parameters as its Newton direction sees them: θ_k, with the intercept appended for
        an active party."""
        return np.append(self.theta[k], self.bias[k]) if k < self.active else self.theta[k]

    def round(self):
        """One block Newton round: the dual step, each party's direction and kept moves, the server's
        subspace search over their step lengths, then every party's move."""
        z = self.z()
        self.lam, nu, self.previous = newton.server_step(self.lam, self.y, z, self.constraint, self.jac, self.previous,
                                                         epsilon=self.epsilon, beta=self.beta, c=self.c,
                                                         fairness=self.fairness)
        n = len(z)
        h_exact = curvature(self.constraint, self.y, z, self.lam)
        h_party = h_exact if self.curvature == "exact" else party_curvature(nu, n, self.curvature)
        dirs, du, owner = [], [], []
        for k, x in enumerate(self.X):
            xk = with_bias(x) if k < self.active else x
            s = block_direction(xk, nu, h_exact if k < self.active else h_party, self.params(k), self.mu)
            dirs.append(s), du.append(xk @ s), owner.append(k)
            for mv, dmv in zip(self.moves[k], self.du_moves[k]):
                dirs.append(mv), du.append(dmv), owner.append(k)
        owner = np.array(owner)
        a = np.array([self.params(k) @ d for k, d in zip(owner, dirs)])
        B = np.array([[di @ dj if ki == kj else 0.0 for kj, dj in zip(owner, dirs)] for ki, di in zip(owner, dirs)])
        du = np.column_stack(du)
        alpha, self.lam, self.jac = search_step(self.y, z, du, a, B, self.lam, self.constraint, self.mu,
                                                epsilon=self.epsilon, fairness=self.fairness)
        self.alphas.append(alpha)
        for k, x in enumerate(self.X):
            sel = np.flatnonzero(owner == k)
            move = sum(alpha[j] * dirs[j] for j in sel)
            self.moves[k] = [move, *self.moves[k]][: self.memory]
            self.du_moves[k] = [du[:, sel] @ alpha[sel], *self.du_moves[k]][: self.memory]
            if k < self.active:
                self.theta[k] = self.theta[k] + move[:-1]
                self.bias[k] = self.bias[k] + move[-1]
            else:
                self.theta[k] = self.theta[k] + move
        self.u = [self._u(k, x) for k, x in enumerate(self.X)]


class PartyFloor:
    """FairVFL's round for any block (``core/blocks.py``: linear, MLP; a step rule or none) in one
    process: the server's dual step and ν, then the parties' own step code
    (``core/parties.py``), float64, no messages. The app's parties run the same code."""

    def __init__(self, blocks, y, constraint: ConstraintSet, *, epsilon, beta, c, mu, lr, Q, active=1, fairness=True,
                 model="mlp", hidden=16, step_rule="", seed=0, test_blocks=None):
        self.y, self.constraint = y.astype(np.float64), constraint
        self.epsilon, self.beta, self.c, self.Q, self.fairness, self.active = epsilon, beta, c, Q, fairness, active
        self.parties = []
        for k, x in enumerate(blocks):
            x = np.ascontiguousarray(x, dtype=np.float64)
            xt = np.ascontiguousarray(test_blocks[k] if test_blocks is not None else x[:1], dtype=np.float64)
            # as flower/party.PartyRuntime.party builds it: same seed, same bias rule
            block = build_block(model, x.shape[1], hidden=hidden, bias=k < active or model == "mlp",
                                seed=seed * 1000 + k, step_rule=step_rule)
            if k < active:
                self.parties.append(ActiveParty(block, x, xt, lr, mu, y=self.y, constraint=constraint))
            else:
                self.parties.append(Party(block, x, xt, lr, mu))
        self.lam = np.zeros(constraint.num_multipliers)
        self.u = [p.logits() for p in self.parties]

    def z(self, split: str = "train"):
        """z on the training rows, or on the test rows (``split = "test"``)."""
        return np.sum(self.u, axis=0) if split == "train" else np.sum([p.logits("test") for p in self.parties], axis=0)

    def sq_norm(self) -> float:
        """Σ_k ‖θ_k‖², the regulariser's argument in F."""
        return sum(p.block.sq_norm() for p in self.parties)

    def round(self):
        """One federated round with the parties' own step code: the dual step and ν, then each party's step."""
        z = self.z()
        self.lam, nu = _dual_step(self, z)
        for k, p in enumerate(self.parties):
            if k < self.active:
                p.local_steps(z, self.lam, self.Q)
            else:
                p.step(nu)
        self.u = [p.logits() for p in self.parties]
