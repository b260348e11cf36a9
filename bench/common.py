"""Shared helpers of the bench scripts: the output folder, a markdown table, the numpy floor."""

from __future__ import annotations

import json
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one thread, as the ClientApp's torch
    os.environ.setdefault(_var, "1")
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fairvfl_flwr.core.objective import Groups, masked_weights  # noqa: E402
from fairvfl_flwr.core.newton import (  # noqa: E402
    MEMORY,
    block_direction,
    curvature,
    newton_server_step,
    party_curvature,
    subspace_gap_jacobian,
    subspace_step,
    with_bias,
)
from fairvfl_flwr.core.step import server_step  # noqa: E402

DEFAULT_OUT = REPO / "bench" / "results"


def machine() -> dict:
    return {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2), "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def ms_per_round(folder) -> float:
    """Milliseconds per round of the run in ``folder`` (its history's seconds), rounds 2..R:
    round 1 is left out (a party's first message does one-time work, e.g. loading data)."""
    (hist,) = Path(folder).glob("*/history.json")
    secs = [r["seconds"] for r in json.loads(hist.read_text())]  # secs[t]: after round t (round 0: set-up)
    return 1000 * (secs[-1] - secs[1]) / (len(secs) - 2)


def alternated(reps: int, rounds: int, tmp: str):
    """(rep, on, run folder, rounds) for a feature's cost against plain: off and on runs
    alternated ``reps`` times, so that load drifts hit both alike, after a 2-round warm-up
    pair (rep -1: loads the data; not to be counted)."""
    for rep in range(-1, reps):
        for on in (False, True):
            yield rep, on, Path(tmp) / f"{int(on)}-{rep}", 2 if rep < 0 else rounds


def table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def write(out: Path, name: str, payload: dict, markdown: str) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"bench": name, "machine": machine(), **payload}
    (out / f"{name}.json").write_text(json.dumps(payload, indent=1, default=float))
    (out / f"{name}.md").write_text(markdown + "\n")
    print(markdown)
    print(f"\n[{name}] written to {out}/{name}.json and .md")


def peak_rss_mib() -> float:
    """This process's peak resident memory (MiB).

    VmHWM, not ``getrusage``: Linux carries ru_maxrss over fork and exec, so a child
    started by a large parent (bench/run_all.py after the simulation benchmark: 617 MiB)
    reported the parent's peak instead of its own.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def dual_step(floor, z):
    """The server's step of a floor (docs/algorithm.md, One round, steps 2-3): new λ and ν."""
    return server_step(floor.lam, floor.y, z, floor.groups, epsilon=floor.epsilon, beta=floor.beta, c=floor.c,
                       fairness=floor.fairness)


class NumpyFloor:
    """FairVFL's round (docs/algorithm.md) for linear models in one process, plain numpy, no messages.

    Identical math to the federated run (the server's dual step and ν, passive steps from
    ν, the active party's Q steps on z̃); the floor every other mode is compared with.
    """

    def __init__(self, blocks, y, groups: Groups, *, epsilon, beta, c, mu, lr, Q, active=1, fairness=True):
        self.X = [np.ascontiguousarray(b) for b in blocks]
        self.y, self.groups = y.astype(np.float64), groups
        self.epsilon, self.beta, self.c, self.mu, self.lr, self.Q, self.active = epsilon, beta, c, mu, lr, Q, active
        self.fairness = fairness
        self.theta = [np.zeros(x.shape[1]) for x in self.X]
        self.bias = [0.0 if k < active else None for k in range(len(self.X))]
        self.lam = np.zeros(groups.num_multipliers)
        self.u = [self._u(k, x) for k, x in enumerate(self.X)]

    def _u(self, k, x):
        u = x @ self.theta[k]
        return u + self.bias[k] if self.bias[k] is not None else u

    def z(self):
        return np.sum(self.u, axis=0)

    def round(self):
        z = self.z()
        self.lam, nu = dual_step(self, z)
        for k, x in enumerate(self.X):
            if k < self.active:
                others = z - self.u[k]
                for _ in range(self.Q):
                    nu_k = masked_weights(self.y, others + self._u(k, x), self.lam, self.groups)
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

    def __init__(self, blocks, y, groups: Groups, *, curvature="nu", memory=MEMORY, dual="newton", **kw):
        super().__init__(blocks, y, groups, **kw)
        self.curvature, self.memory, self.dual = curvature, memory, dual
        self.jac, self.previous = None, None
        self.alphas: list[np.ndarray] = []
        self.moves: list[list] = [[] for _ in self.X]  # each party's last moves θ_k(t) − θ_k(t−1), newest first
        self.du_moves: list[list] = [[] for _ in self.X]

    def params(self, k):
        return np.append(self.theta[k], self.bias[k]) if k < self.active else self.theta[k]

    def round(self):
        z = self.z()
        if self.dual == "newton":
            self.lam, nu, self.previous = newton_server_step(self.lam, self.y, z, self.groups, self.jac,
                                                             self.previous, epsilon=self.epsilon, beta=self.beta,
                                                             c=self.c, fairness=self.fairness)
        else:
            self.lam, nu = dual_step(self, z)
        n = len(z)
        h_exact = curvature(self.y, z, self.lam, self.groups)
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
        alpha = subspace_step(self.y, z, du, a, B, self.lam, self.groups, self.mu)
        self.alphas.append(alpha)
        self.jac = subspace_gap_jacobian(self.y, z + du @ alpha, du, B, self.lam, self.groups, self.mu)
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
    """FairVFL's round for any block (``core/blocks.py``: linear, MLP; gd or adagrad) in one
    process: the server's dual step and ν, then the parties' own step code
    (``core/parties.py``), float64, no messages. The app's parties run the same code."""

    def __init__(self, blocks, y, groups: Groups, *, epsilon, beta, c, mu, lr, Q, active=1, fairness=True,
                 model="mlp", hidden=16, optimizer="gd", seed=0, test_blocks=None):
        from fairvfl_flwr.core.blocks import build_block
        from fairvfl_flwr.core.parties import ActiveParty, Party

        self.y, self.groups = y.astype(np.float64), groups
        self.epsilon, self.beta, self.c, self.Q, self.fairness, self.active = epsilon, beta, c, Q, fairness, active
        self.parties = []
        for k, x in enumerate(blocks):
            x = np.ascontiguousarray(x, dtype=np.float64)
            xt = np.ascontiguousarray(test_blocks[k] if test_blocks is not None else x[:1], dtype=np.float64)
            # as flower/party.PartyRuntime.party builds it: same seed, same bias rule
            block = build_block(model, x.shape[1], hidden=hidden, bias=k < active or model == "mlp",
                                seed=seed * 1000 + k, optimizer=optimizer)
            if k < active:
                self.parties.append(ActiveParty(block, x, xt, lr, mu, y=self.y, groups=groups))
            else:
                self.parties.append(Party(block, x, xt, lr, mu))
        self.lam = np.zeros(groups.num_multipliers)
        self.u = [p.logits() for p in self.parties]

    def z(self, split: str = "train"):
        return np.sum(self.u, axis=0) if split == "train" else np.sum([p.logits("test") for p in self.parties], axis=0)

    def sq_norm(self) -> float:
        return sum(p.block.sq_norm() for p in self.parties)

    def round(self):
        z = self.z()
        self.lam, nu = dual_step(self, z)
        for k, p in enumerate(self.parties):
            if k < self.active:
                p.local_steps(z, self.lam, self.Q)
            else:
                p.step(nu)
        self.u = [p.logits() for p in self.parties]


def adult_problem(cfg):
    """Blocks, labels and groups of the run config's problem (the parties' column split)."""
    from fairvfl_flwr.data.problem import constraint_groups, load_data, party_columns

    ds = load_data(cfg)
    cols = party_columns(cfg, ds)
    blocks = [np.ascontiguousarray(ds.X_train[:, c]) for c in cols]
    groups = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label)
    return ds, blocks, groups
