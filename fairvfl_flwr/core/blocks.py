"""One party's model as a block: ``forward(x)``, ``step(x, ν, lr, μ)``, ``state_dict``.

Linear blocks are numpy (``core/linear.py``); the MLP is a torch model behind the same
interface (``core/models.py``), imported only when a run asks for it, so that the
linear path never loads torch.
"""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.linear import LinearBlock


def build_block(kind: str, in_features: int, *, hidden: int = 16, bias: bool = False, dtype: str = "float64",
                seed: int = 0, optimizer: str = "gd"):
    """Create one party's block, deterministically from ``seed`` (linear: zeros).

    ``optimizer``: ``gd`` (the paper's step) or ``adagrad`` (MLP only: per-coordinate
    adaptive steps with sums of squared gradients the party keeps, ``core/models.AdaGrad``).
    """
    if kind == "linear":
        if optimizer == "adagrad":
            raise ValueError("optimizer 'adagrad' is for MLP blocks; a linear block takes gradient or Newton steps")
        return LinearBlock.zeros(in_features, bias, dtype)
    from fairvfl_flwr.core.models import AdaGrad, TorchBlock, build_model  # torch, only for the MLP

    model = build_model(kind, in_features, hidden=hidden, bias=bias, dtype=dtype, seed=seed)
    return TorchBlock(model, AdaGrad() if optimizer == "adagrad" else None)


def as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Features in the run's model dtype (no copy when they already are)."""
    return np.ascontiguousarray(x, dtype=dtype)
