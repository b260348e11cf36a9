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
from fairvfl_flwr.core.step import server_step  # noqa: E402

DEFAULT_OUT = REPO / "bench" / "results"


def machine() -> dict:
    return {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2), "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}


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
        self.lam, nu = server_step(self.lam, self.y, z, self.groups, epsilon=self.epsilon, beta=self.beta, c=self.c,
                                   fairness=self.fairness)
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


def adult_problem(cfg):
    """Blocks, labels and groups of the run config's problem (the parties' column split)."""
    from fairvfl_flwr.data.problem import constraint_groups, load_data, party_columns

    ds = load_data(cfg)
    cols = party_columns(cfg, ds)
    blocks = [np.ascontiguousarray(ds.X_train[:, c]) for c in cols]
    groups = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label)
    return ds, blocks, groups
