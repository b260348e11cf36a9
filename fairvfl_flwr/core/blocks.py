"""One party's model as a block: ``forward(x)``, ``step(x, ν, lr, μ)``, ``state_dict``, ``weights``.

Linear blocks are numpy (``core/linear.py``); the MLP is a torch model behind the same
interface (``core/models.py``), imported only when a run asks for it, so that the
linear path never loads torch.
"""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.linear import LinearBlock


def build_block(kind: str, in_features: int, *, hidden: int = 16, bias: bool = False, dtype: str = "float64",
                seed: int = 0, step_rule: str = ""):
    """Create one party's block, deterministically from ``seed`` (linear: zeros).

    ``step_rule``: "" (the paper's gradient step) or a step rule of ``core/models.STEP_RULES``
    (MLP only, e.g. AdaGrad: per-coordinate adaptive steps with sums of squared gradients the
    party keeps in the block's ``state_dict``).
    """
    if kind == "linear":
        if step_rule:
            raise ValueError(f"step rule {step_rule!r} is for MLP blocks; a linear block takes gradient or Newton steps")
        return LinearBlock.zeros(in_features, bias, dtype)
    from fairvfl_flwr.core.models import STEP_RULES, TorchBlock, build_model  # torch, only for the MLP

    model = build_model(kind, in_features, hidden=hidden, bias=bias, dtype=dtype, seed=seed)
    return TorchBlock(model, STEP_RULES[step_rule]() if step_rule else None)


def as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Features in the run's model dtype (no copy when they already are)."""
    return np.ascontiguousarray(x, dtype=dtype)
