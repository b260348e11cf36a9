"""A linear party's model in numpy: u = Xθ (+ b), and its gradient step.

The linear path needs no autograd: J_k = X_k, so J_kᵀν is one matrix-vector product.
Keeping it in numpy means a deployed linear party's process never imports torch, which
it would otherwise pay on every message (each message is a fresh process there).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class LinearBlock:
    """θᵀx (+ b), initialised at zero as in the paper; same update as ``models.gradient_step``."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None = None) -> None:
        self.weight = weight
        self.bias = bias

    @classmethod
    def zeros(cls, in_features: int, bias: bool, dtype: str = "float64") -> "LinearBlock":
        """A block of ``in_features`` weights (and an intercept when ``bias``) at zero, as the paper starts."""
        return cls(np.zeros(in_features, dtype=dtype), np.zeros((), dtype=dtype) if bias else None)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """u = xθ (+ b) for every row of ``x``."""
        u = x @ self.weight
        return u + self.bias if self.bias is not None else u

    def step(self, x: np.ndarray, nu: np.ndarray, lr: float, mu: float) -> None:
        """θ ← θ − lr (J_kᵀν + μθ) with J_k = x (and ∂u/∂b = 1)."""
        nu = np.asarray(nu, dtype=self.weight.dtype)
        self.apply_gradient(x.T @ nu, lr, mu, bias_grad=nu.sum() if self.bias is not None else None)

    def step_on(self, x: np.ndarray, weights: Callable[[np.ndarray], np.ndarray], lr: float, mu: float) -> None:
        """:meth:`step` with ν = ``weights(u)`` of this block's own u on ``x`` (an active party's local step)."""
        self.step(x, weights(self.forward(x)), lr, mu)

    def apply_gradient(self, grad: np.ndarray, lr: float, mu: float, bias_grad: float | None = None) -> None:
        """θ ← θ − lr (grad + μθ) for a gradient computed elsewhere (encrypted ν)."""
        self.weight = self.weight - lr * (np.asarray(grad, dtype=self.weight.dtype) + mu * self.weight)
        if self.bias is not None and bias_grad is not None:
            self.bias = self.bias - lr * (bias_grad + mu * self.bias)

    def state_dict(self) -> dict[str, np.ndarray]:
        """θ (and b) as arrays, for checkpoints and the saved block (a linear block's step keeps
        no state beyond θ)."""
        state = {"weight": self.weight}
        if self.bias is not None:
            state["bias"] = np.asarray(self.bias)
        return state

    def weights(self) -> dict[str, np.ndarray]:
        """θ (and b): the saved block, the same as :meth:`state_dict`."""
        return self.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Set θ (and b) from a :meth:`state_dict`, as copies in the block's dtype."""
        self.weight = np.asarray(state["weight"], dtype=self.weight.dtype).copy()
        if self.bias is not None:
            self.bias = np.asarray(state["bias"], dtype=self.weight.dtype).reshape(()).copy()

    def sq_norm(self) -> float:
        """‖θ‖² + b², the block's share of the μ regulariser in F."""
        return float((self.weight**2).sum() + (0.0 if self.bias is None else self.bias**2))
