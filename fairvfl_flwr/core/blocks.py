"""One party's model as a block: ``forward(x)``, ``step(x, ν, lr, μ)``, ``state_dict``, ``weights``.

Linear blocks are numpy (``core/linear.py``); the MLP is a torch model behind the same
interface (``core/models.py``), imported only when a run asks for it, so that the
linear path never loads torch. A party that only evaluates its MLP and sets its θ (block
Newton's Gauss–Newton rounds) holds it as numpy arrays (``core/gauss_newton.ReluNet``), its
seeded initial θ drawn as torch draws it (``core/mlp_init.py``), so it never loads torch.
"""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.gauss_newton import ReluNet
from fairvfl_flwr.core.linear import LinearBlock
from fairvfl_flwr.core.mlp_init import mlp_state


def build_block(kind: str, in_features: int, *, hidden: int = 16, bias: bool = False, dtype: str = "float64",
                seed: int = 0, step_rule: str = "", state: dict | None = None, steps: bool = True):
    """Create one party's block, deterministically from ``seed`` (linear: zeros), or from ``state``
    (its ``state_dict``) where given.

    ``step_rule``: "" (the paper's gradient step) or a step rule of ``core/models.STEP_RULES``
    (MLP only, e.g. AdaGrad: per-coordinate adaptive steps with sums of squared gradients the
    party keeps in the block's ``state_dict``). ``steps=False``: the caller takes no gradient
    step with the block (it evaluates it and sets θ), so an MLP with a ``state`` is numpy.
    """
    if kind == "linear":
        if step_rule:
            raise ValueError(f"step rule {step_rule!r} is for MLP blocks; a linear block takes gradient or Newton steps")
        block = LinearBlock.zeros(in_features, bias, dtype)
    elif not steps and not step_rule:  # no torch in the process: the seeded θ drawn as torch draws it
        return ReluNet(state if state is not None else mlp_state(in_features, hidden, bias, seed, dtype))
    else:
        from fairvfl_flwr.core.models import STEP_RULES, TorchBlock, build_model  # torch, only for the MLP

        model = build_model(kind, in_features, hidden=hidden, bias=bias, dtype=dtype, seed=seed)
        block = TorchBlock(model, STEP_RULES[step_rule]() if step_rule else None)
    if state is not None:
        block.load_state_dict(state)
    return block


def as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Features in the run's model dtype (no copy when they already are)."""
    return np.ascontiguousarray(x, dtype=dtype)
