"""Per-party models: u_k = g_k(θ_k, X^k), one scalar partial logit per row.

``linear``: θ_kᵀx (plus an intercept on active parties). ``mlp``: two hidden layers
with ReLU and a scalar output. Both are plain ``torch.nn.Module`` objects so that the
passive update J_kᵀν is one ``backward`` of ``(ν · u).sum()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

# A party's work is a few mat-vecs per round; torch's thread pool only adds spin-wait
# contention when several parties (Ray actors, or a sweep beside a run) share the cores.
torch.set_num_threads(1)

MODELS = ("linear", "mlp")
DTYPES = {"float64": torch.float64, "float32": torch.float32}


class LinearModel(nn.Module):
    """θᵀx (+ b): initialised at zero, as in the paper."""

    def __init__(self, in_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(in_features))
        self.bias = nn.Parameter(torch.zeros(())) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """u = xᵀθ (+ b) for every row of ``x``: the party's partial logits."""
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
        """The network's scalar output per row of ``x`` (the trailing unit dimension dropped)."""
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


class AdaGrad:
    """Per-coordinate adaptive steps (Duchi, Hazan and Singer) on the gradient of f̃, kept by the party.

    θ ← θ − lr·g/(√(Σ g²) + eps), the sum over this party's own steps, with g = J_kᵀν + μθ_k
    as for :func:`gradient_step` (μ is the objective's regulariser, not a decoupled decay).
    ``lr`` is the run's 1/η. Every step moves each coordinate by at most lr, whatever the
    scale of ν, and the steps shrink as the squared gradients add up: at a fixed λ this
    converges to a stationary point of f̃ for any lr (docs/adagrad.md, What is proved).
    The sums never leave the node. Same arithmetic as ``torch.optim.Adagrad`` (its defaults).
    """

    name = "adagrad"  # the step rule an algorithm names (config/algorithms.Algorithm.step_rule)
    eps = 1e-10

    def __init__(self) -> None:
        self.t = 0
        self.sums: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def step(self, model: nn.Module, lr: float, mu: float) -> None:
        """One AdaGrad step of every parameter of ``model`` from the gradient already in ``.grad``
        (then cleared), adding g² to the party's sums first."""
        self.t += 1
        for name, p in model.named_parameters():
            g = p.grad + mu * p
            total = self.sums.get(name)
            total = g * g if total is None else total + g * g
            self.sums[name] = total
            p -= lr * g / (total.sqrt() + self.eps)
            p.grad = None

    def state_dict(self) -> dict[str, np.ndarray]:
        """The step count and the sums of squared gradients as numpy arrays, for the party's checkpoint
        (they never leave the node)."""
        state = {"t": np.asarray(self.t, dtype=np.int64)}
        state.update({f"sum.{k}": v.numpy().copy() for k, v in self.sums.items()})
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from a :meth:`state_dict` (a resumed run steps exactly as the uninterrupted one)."""
        self.t = int(np.asarray(state["t"]))
        self.sums = {k[4:]: torch.from_numpy(np.array(v)) for k, v in state.items() if k.startswith("sum.")}


#: The step rules a torch block may take instead of the paper's gradient step, by name.
STEP_RULES = {rule.name: rule for rule in (AdaGrad,)}
#: Where a block's :meth:`TorchBlock.state_dict` keeps its step rule's state, beside θ.
STEP_STATE = "step."


def squared_norm(model: nn.Module) -> float:
    """‖θ_k‖² over every parameter of ``model``: the party's term of the μ regulariser in F."""
    return float(sum((p.detach() ** 2).sum() for p in model.parameters()))


class TorchBlock:
    """A torch model behind the block interface the parties use (``core.linear.LinearBlock``):
    numpy in, numpy out; the step backpropagates ν as the upstream gradient of u_k.

    ``rule``: None for the paper's gradient step, or a step rule of :data:`STEP_RULES` (AdaGrad)
    whose state (its sums of squared gradients) the block's :meth:`state_dict` carries beside θ."""

    def __init__(self, model: nn.Module, rule: AdaGrad | None = None) -> None:
        self.model = model
        self.rule = rule
        self.dtype = next(model.parameters()).dtype

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(self.dtype)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """u_k = g_k(θ_k, x) as numpy, without building a graph."""
        with torch.no_grad():
            return self.model(self._tensor(x)).numpy()

    def step(self, x: np.ndarray, nu: np.ndarray, lr: float, mu: float) -> None:
        """One local step: backpropagate ν as the upstream gradient of u_k (J_kᵀν), then the gradient
        or AdaGrad step with the regulariser μ."""
        self._step(self.model(self._tensor(x)), nu, lr, mu)

    def step_on(self, x: np.ndarray, weights: Callable[[np.ndarray], np.ndarray], lr: float, mu: float) -> None:
        """:meth:`step` with ν = ``weights(u)`` of this block's own u on ``x`` (an active party's local
        step): one forward pass gives both u and the graph that ν is backpropagated through."""
        u = self.model(self._tensor(x))
        self._step(u, weights(u.detach().numpy()), lr, mu)

    def _step(self, u: torch.Tensor, nu: np.ndarray, lr: float, mu: float) -> None:
        u.backward(torch.as_tensor(nu, dtype=u.dtype))
        if self.rule is None:
            gradient_step(self.model, lr, mu)
        else:
            self.rule.step(self.model, lr, mu)

    def weights(self) -> dict[str, np.ndarray]:
        """θ_k as numpy arrays (copies: a checkpoint must not change with later steps): a saved block."""
        return {k: v.detach().numpy().copy() for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        """θ_k and its step rule's state (keys under :data:`STEP_STATE`): what the party keeps
        from one round to the next, never sent."""
        rule = {} if self.rule is None else {STEP_STATE + k: v for k, v in self.rule.state_dict().items()}
        return {**self.weights(), **rule}

    def load_state_dict(self, state: dict) -> None:
        """Set θ_k, and the step rule's state where ``state`` holds it, from a :meth:`state_dict`
        (a round's state, a checkpoint) or :meth:`weights` (a saved block)."""
        rule = {k[len(STEP_STATE):]: v for k, v in state.items() if k.startswith(STEP_STATE)}
        self.model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()
                                    if not k.startswith(STEP_STATE)})
        if rule and self.rule is None:
            raise ValueError("this state holds a step rule's state, but the block takes the paper's gradient step")
        if rule:
            self.rule.load_state_dict(rule)

    def sq_norm(self) -> float:
        """‖θ_k‖², the party's share of the regulariser the server adds to F."""
        return squared_norm(self.model)
