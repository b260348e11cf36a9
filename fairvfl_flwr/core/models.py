"""Per-party models: u_k = g_k(θ_k, X^k), one scalar partial logit per row.

``linear``: θ_kᵀx (plus an intercept on active parties). ``mlp``: two hidden layers
with ReLU and a scalar output. Both are plain ``torch.nn.Module`` objects so that the
passive update J_kᵀν is one ``backward`` of ``(ν · u).sum()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

MODELS = ("linear", "mlp")
DTYPES = {"float64": torch.float64, "float32": torch.float32}


class LinearModel(nn.Module):
    """θᵀx (+ b): initialised at zero, as in the paper."""

    def __init__(self, in_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(in_features))
        self.bias = nn.Parameter(torch.zeros(())) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x @ self.weight
        return u + self.bias if self.bias is not None else u


class MLPModel(nn.Module):
    """Two hidden ReLU layers, scalar output."""

    def __init__(self, in_features: int, hidden: int, bias: bool = True):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1, bias=bias),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch's CPU generator for a block and restore it afterwards.

    Not ``torch.manual_seed``: that also queues a seed call for every lazy accelerator
    backend (CUDA, XPU, MTIA), each with a formatted stack trace, and a
    list that grows with every message; these models only ever use the CPU generator.
    """
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        yield


def build_model(
    kind: str,
    in_features: int,
    *,
    hidden: int = 16,
    bias: bool = False,
    dtype: str = "float64",
    seed: int = 0,
) -> nn.Module:
    """Create one party's model, deterministically from ``seed``."""
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}: choose one of {', '.join(MODELS)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    with seeded(seed):
        model = LinearModel(in_features, bias) if kind == "linear" else MLPModel(in_features, hidden, bias)
    return model.to(DTYPES[dtype])


@torch.no_grad()
def gradient_step(model: nn.Module, lr: float, mu: float) -> None:
    """θ ← θ − lr (∇ + μθ), with ∇ already in ``.grad`` (docs/algorithm.md, One round, step 4)."""
    for p in model.parameters():
        p -= lr * (p.grad + mu * p)
        p.grad = None


def squared_norm(model: nn.Module) -> float:
    return float(sum((p.detach() ** 2).sum() for p in model.parameters()))
