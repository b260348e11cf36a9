"""The seeded initial θ of ``core/models.MLPModel``, drawn in numpy bit for bit as torch draws it.

A Gauss–Newton party (core/gauss_newton.py) holds its MLP as numpy arrays; only its first
θ came from torch, and a deployed party answers each message in a fresh process, where
importing torch costs more CPU than the message's work (bench/party_cost.py). So the first
θ is drawn here the way torch 2.13's CPU generator draws it under ``core/models.seeded``:

* the generator is MT19937 seeded with the low 32 bits of the seed (``manual_seed``);
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

_N, _M = 624, 397
_UPPER, _LOWER = 0x80000000, 0x7FFFFFFF
_MATRIX = np.uint32(0x9908B0DF)


class MT19937:
    """The 32-bit Mersenne Twister, seeded as C++'s ``std::mt19937(seed)`` (and torch's CPU generator)."""

    def __init__(self, seed: int) -> None:
        state = [int(seed) & 0xFFFFFFFF]
        for i in range(1, _N):
            prev = state[-1]
            state.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
        self.state = np.array(state, dtype=np.uint32)
        self.words = np.zeros(0, dtype=np.uint32)

    def _twist(self) -> None:
        mt = self.state
        for i in range(_N):  # in place and in order: later entries read earlier ones' new values
            y = (int(mt[i]) & _UPPER) | (int(mt[(i + 1) % _N]) & _LOWER)
            mt[i] = np.uint32(int(mt[(i + _M) % _N]) ^ (y >> 1) ^ (int(_MATRIX) if y & 1 else 0))
        y = mt.copy()
        y ^= y >> np.uint32(11)
        y ^= (y << np.uint32(7)) & np.uint32(0x9D2C5680)
        y ^= (y << np.uint32(15)) & np.uint32(0xEFC60000)
        y ^= y >> np.uint32(18)
        self.words = np.concatenate([self.words, y])

    def draw(self, count: int) -> np.ndarray:
        """The next ``count`` 32-bit outputs."""
        while self.words.size < count:
            self._twist()
        out, self.words = self.words[:count], self.words[count:]
        return out


def uniform32(gen: MT19937, shape: tuple[int, ...], low: float, high: float) -> np.ndarray:
    """torch's float32 ``uniform_(low, high)`` on the CPU, from ``gen``'s next words."""
    lo, hi = float(np.float32(low)), float(np.float32(high))
    x = (gen.draw(math.prod(shape)) & np.uint32((1 << 24) - 1)).astype(np.float64) * 2.0 ** -24
    return (x * (hi - lo) + lo).astype(np.float32).reshape(shape)


def mlp_state(in_features: int, hidden: int, bias: bool, seed: int, dtype: str = "float64") -> dict[str, np.ndarray]:
    """``build_model("mlp", in_features, hidden=hidden, bias=bias, seed=seed, dtype=dtype).state_dict()``
    as numpy arrays, without torch: Linear(in, hidden), Linear(hidden, hidden), Linear(hidden, 1, bias)."""
    gen = MT19937(seed)
    state = {}
    for index, (fan_in, fan_out, has_bias) in zip((0, 2, 4), ((in_features, hidden, True), (hidden, hidden, True),
                                                             (hidden, 1, bias))):
        bound = math.sqrt(3.0) * (math.sqrt(2.0 / (1 + math.sqrt(5) ** 2)) / math.sqrt(fan_in))  # torch's arithmetic
        state[f"net.{index}.weight"] = uniform32(gen, (fan_out, fan_in), -bound, bound).astype(dtype)
        if has_bias:
            b = 1 / math.sqrt(fan_in)
            state[f"net.{index}.bias"] = uniform32(gen, (fan_out,), -b, b).astype(dtype)
    return state
