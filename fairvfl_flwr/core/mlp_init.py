"""The seeded initial θ of ``core/models.MLPModel``, drawn in numpy bit for bit as torch draws it.

A Gauss–Newton party (core/gauss_newton.py) holds its MLP as numpy arrays; only its first
θ came from torch, and a deployed party answers each message in a fresh process, where
importing torch costs more CPU than the message's work (bench/party_cost.py). So the first
θ is drawn here the way torch 2.13's CPU generator draws it under ``core/models.seeded``:

* the generator is MT19937 seeded with the low 32 bits of the seed (``manual_seed``), the
  stream numpy's legacy ``RandomState`` draws;
* ``nn.Linear`` draws its weight, then its bias, layer by layer, each
  ``uniform_(-b, b)``: weight b = √3 · √(2 / (1 + 5)) / √fan_in (``kaiming_uniform_``
  with a = √5), bias b = 1 / √fan_in;
* a float32 ``uniform_(lo, hi)`` takes the low 24 bits of one 32-bit word w and returns
  float32((w mod 2^24) · 2^-24 · (hi' − lo') + lo') in double, lo' and hi' the bounds
  rounded to float32 first.

The torch model is created in float32 and cast (``build_model``); so are these arrays.
tests/test_gauss_newton.py checks the arrays against ``build_model`` for several seeds and
shapes: a torch whose generator draws otherwise fails it rather than changing a run.
"""

from __future__ import annotations

import math

import numpy as np


def generator(seed: int) -> np.random.RandomState:
    """MT19937 seeded as C++'s ``std::mt19937(seed)``, torch's CPU generator: numpy's legacy
    ``RandomState`` seeds an integer that way, and its stream is frozen by numpy's policy."""
    return np.random.RandomState(int(seed) & 0xFFFFFFFF)


def uniform32(gen: np.random.RandomState, shape: tuple[int, ...], low: float, high: float) -> np.ndarray:
    """torch's float32 ``uniform_(low, high)`` on the CPU, from ``gen``'s next 32-bit words."""
    lo, hi = float(np.float32(low)), float(np.float32(high))
    words = gen.randint(0, 1 << 32, size=math.prod(shape), dtype=np.uint32)  # the full range: the raw words
    x = (words & np.uint32((1 << 24) - 1)).astype(np.float64) * 2.0 ** -24
    return (x * (hi - lo) + lo).astype(np.float32).reshape(shape)


def mlp_state(in_features: int, hidden: int, bias: bool, seed: int, dtype: str = "float64") -> dict[str, np.ndarray]:
    """``build_model("mlp", in_features, hidden=hidden, bias=bias, seed=seed, dtype=dtype).state_dict()``
    as numpy arrays, without torch: Linear(in, hidden), Linear(hidden, hidden), Linear(hidden, 1, bias)."""
    gen = generator(seed)
    state = {}
    for index, (fan_in, fan_out, has_bias) in zip((0, 2, 4), ((in_features, hidden, True), (hidden, hidden, True),
                                                             (hidden, 1, bias))):
        bound = math.sqrt(3.0) * (math.sqrt(2.0 / (1 + math.sqrt(5) ** 2)) / math.sqrt(fan_in))  # torch's arithmetic
        state[f"net.{index}.weight"] = uniform32(gen, (fan_out, fan_in), -bound, bound).astype(dtype)
        if has_bias:
            b = 1 / math.sqrt(fan_in)
            state[f"net.{index}.bias"] = uniform32(gen, (fan_out,), -b, b).astype(dtype)
    return state
