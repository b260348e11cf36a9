"""The masking ring: fixed-point words, pair masks that cancel in the sum, and the decoded sum.

Every reply's logits (training and test, round 0 included) are encoded in fixed point,
q = round(u · 2^48) as 64-bit words, and party i sends q_i + Σ_{j>i} m_ij − Σ_{j<i} m_ji
mod 2^64, with m_ij = AES-256-CTR(k_ij, nonce = (round, split)) a pseudo-random word per
row. The masks cancel in Σ_i, which the server decodes to z exactly (the integer sum is
exact; every float32 with |u| ≥ 2^-25 is a whole number of 2^-48 steps). Masks depend on
the round and split (and the session's keys), so a re-sent message (the guard answers it
from the same θ) gets the identical masked reply: nothing new is revealed. A party that stays silent
makes the exchange re-send and then stop the run; no round is ever unmasked for a subset
of parties (there is no unmasking step at all).

Each reply's ‖θ_k‖² (the μ-term of the objective) is masked too, in a 128-bit ring with 64
fraction bits (:func:`masked_wide`): the server learns Σ_k ‖θ_k‖² only.

Under block Newton (algorithms/newton.SharedNewtonVFL, "shared step lengths") a round's
reply is a party's ``directions`` instead of logits: X_k s_k (and on evaluation rounds
X_test θ_k, X_test D_k) in the 64-bit ring as the logits, and the small per-party
quantities a = θ_k·d_j and the Gram matrix d_iᵀd_j in the 128-bit ring (their scale is not
bounded as a logit's is, and near convergence they are tiny). Every vector a party masks
in a round has its own nonce label (:data:`SPLITS`), so no two vectors ever share a mask.
The server gets the sums over parties, which is all the shared-step search needs.
"""

from __future__ import annotations

import struct
from logging import ERROR

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from flwr.app import Array
from flwr.supercore import log

from fairvfl_flwr.flower.arrays import to_numpy
from fairvfl_flwr.flower.errors import FederationError

FRACTION_BITS = 48
SCALE = float(2**FRACTION_BITS)
LIMIT = 2.0 ** (63 - FRACTION_BITS)  # |z| must stay below this for the sum not to wrap
WIDE_FRACTION_BITS = 64
WIDE_LIMIT = 2.0 ** (127 - WIDE_FRACTION_BITS)  # the 128-bit ring's signed range, in value units
_WIDE_MOD = 1 << 128
#: Nonce label of every vector a party masks; one round's reply never uses a label twice,
#: and the Newton directions reply and the apply reply after it (same round) use distinct ones
#: (a Gauss–Newton round's reply also holds the logits after its step: ``round-train``, ``round-test``).
SPLITS = {"train": 0, "test": 1, "dir": 2, "dir-test": 3, "dir-test-dirs": 4, "dir-a": 5, "dir-gram": 6,
          "dir-sq-norm": 7, "sq-norm": 8, "score": 9, "round-train": 10, "round-test": 11}
#: Keys of a Newton directions reply summed in the 128-bit ring (float64, unbounded scale).
WIDE_KEYS = ("a", "gram")


def value_bound(num_parties: int) -> float:
    """The magnitude a party's value must stay below in the 64-bit ring (:func:`encode`): a true sum
    of ``num_parties`` such values stays below LIMIT / 2, so the server can tell masks that failed to cancel."""
    return LIMIT / (2 * num_parties)


def encode(u: np.ndarray, num_parties: int, who: str, what: str = "partial logit") -> np.ndarray:
    """Fixed point: round(u · 2^48) as uint64 words (two's complement)."""
    u = np.asarray(u, dtype=np.float64)
    bound = value_bound(num_parties)
    if not np.all(np.abs(u) < bound):  # the magnitude stays in this party's log: the server learns no value
        log(ERROR, "%s: a %s of magnitude %.4g is beyond the secure-aggregation range", who, what, np.max(np.abs(u)))
        raise ValueError(f"{who}: a {what} is beyond the secure-aggregation range ±{bound:.4g} "
                         f"(2^{62 - FRACTION_BITS} / num-parties); the run is diverging")
    return np.rint(u * SCALE).astype(np.int64).view(np.uint64)


def decode(words: np.ndarray) -> np.ndarray:
    """The fixed-point words of a sum back to floats (two's complement over 2^64, FRACTION_BITS after the point)."""
    return np.asarray(words, dtype=np.uint64).view(np.int64).astype(np.float64) / SCALE


def _keystream(key: bytes, server_round: int, split: str, nbytes: int) -> bytes:
    """The pair's AES-256-CTR keystream for one round and split (label): ``nbytes`` bytes."""
    nonce = struct.pack(">QII", server_round, SPLITS[split], 0)
    return Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor().update(bytes(nbytes))


def mask(key: bytes, server_round: int, split: str, rows: int) -> np.ndarray:
    """The pair's pseudo-random words for one round and split."""
    return np.frombuffer(_keystream(key, server_round, split, 8 * rows), dtype=np.uint64)


def masked(u: np.ndarray, own: int, pair_keys: dict[int, bytes], server_round: int, split: str,
           num_parties: int, who: str, what: str = "partial logit") -> np.ndarray:
    """q_own + Σ_{j>own} m_{own,j} − Σ_{j<own} m_{j,own} (mod 2^64)."""
    out = encode(u, num_parties, who, what)
    for other, key in pair_keys.items():
        m = mask(key, server_round, split, len(out))
        out = out + m if other > own else out - m  # uint64: wraps mod 2^64
    return out


def encode_wide(v: np.ndarray, num_parties: int, who: str, what: str) -> list[int]:
    """Fixed point in the 128-bit ring: round(v · 2^64) as Python ints (exact for every float64 ≥ 2^-11)."""
    v = np.asarray(v, dtype=np.float64).ravel()
    bound = WIDE_LIMIT / (2 * num_parties)
    if not np.all(np.abs(v) < bound):  # also refuses NaN; the values stay in this party's log
        log(ERROR, "%s: %s %r is not finite or beyond the secure-aggregation range", who, what, v.tolist())
        raise ValueError(f"{who}: {what} is not finite or beyond the secure-aggregation range ±{bound:.4g}")
    return [round(float(x) * 2.0**WIDE_FRACTION_BITS) % _WIDE_MOD for x in v]


def mask_wide(key: bytes, server_round: int, split: str, count: int) -> list[int]:
    """The pair's pseudo-random 128-bit words for one round and label."""
    stream = _keystream(key, server_round, split, 16 * count)
    return [int.from_bytes(stream[16 * i:16 * i + 16], "big") for i in range(count)]


def masked_wide(v: np.ndarray, own: int, pair_keys: dict[int, bytes], server_round: int, split: str,
                num_parties: int, who: str, what: str) -> np.ndarray:
    """:func:`masked` in the 128-bit ring; on the wire two uint64 words per value (high, low)."""
    out = encode_wide(v, num_parties, who, what)
    for other, key in pair_keys.items():
        m = mask_wide(key, server_round, split, len(out))
        sign = 1 if other > own else -1
        out = [(q + sign * w) % _WIDE_MOD for q, w in zip(out, m)]
    return np.array([[q >> 64, q & (2**64 - 1)] for q in out], dtype=np.uint64).reshape(-1)


def sum_wide(words: list[np.ndarray]) -> list[int]:
    """The 128-bit sum of several replies' words (each high, low per value)."""
    total = [0] * (len(words[0]) // 2)
    for w in words:
        pairs = np.asarray(w, dtype=np.uint64).reshape(-1, 2)
        total = [(t + (int(hi) << 64 | int(lo))) % _WIDE_MOD for t, (hi, lo) in zip(total, pairs)]
    return total


def decode_wide(total: list[int]) -> np.ndarray:
    """The 128-bit sums (Newton's inner products, ``WIDE_KEYS``) back to floats."""
    return np.array([(q - _WIDE_MOD if q >> 127 else q) / 2**WIDE_FRACTION_BITS for q in total], dtype=np.float64)


def grid_sum(values: list[np.ndarray], wide: bool = False) -> np.ndarray:
    """The sum a server decodes of these parties' values under secure aggregation, from plain
    values: each rounded to the ring's fixed-point grid (the 128-bit ring's for ``wide``), the
    integers summed exactly, decoded. A float sum differs from it in the last bits (values
    below the grid's step, float64 rounding), and a search whose decisions are discrete (a step
    taken back, the stop rule's bound moves) carries such a difference into another
    trajectory. Values beyond the ring's range, where a masked run stops: their float sum."""
    values = [np.asarray(v, dtype=np.float64) for v in values]
    bound = (WIDE_LIMIT if wide else LIMIT) / (2 * len(values))  # encode's and encode_wide's range
    if not all(np.all(np.abs(v) < bound) for v in values):
        return np.sum(values, axis=0)
    if wide:
        totals = [sum(round(float(x) * 2.0**WIDE_FRACTION_BITS) for x in column)
                  for column in zip(*(v.ravel() for v in values))]
        return decode_wide([t % _WIDE_MOD for t in totals]).reshape(values[0].shape)
    total = np.sum([np.rint(v * SCALE).astype(np.int64) for v in values], axis=0, dtype=np.int64)
    return decode(total.view(np.uint64))


def unmask_sum(words: list[np.ndarray], what: str) -> np.ndarray:
    """The decoded sum of several parties' masked 64-bit words; masks that did not cancel stop the run."""
    return cancelled(decode(np.sum(words, axis=0, dtype=np.uint64)), LIMIT / 2, f"{what}: the masks")  # mod 2^64


def cancelled(total: np.ndarray, limit: float, masks: str) -> np.ndarray:
    """``total`` when every value lies within ``limit``; else the masks named by ``masks`` did
    not cancel (a decoded sum of uncancelled masks is uniform over the whole range)."""
    if np.any(np.abs(total) >= limit):
        raise FederationError(f"{masks} did not cancel (the parties' pair keys differ: a node restarted or a reply "
                              "was altered); no party's values were revealed; start the run again")
    return total


def words(value) -> np.ndarray | None:
    """A reply's masked words: an array's, or a config value's bytes (secagg's ``SQ_NORM`` record); None if neither."""
    if isinstance(value, Array):
        return to_numpy(value)
    if isinstance(value, bytes) and len(value) % 8 == 0:
        return np.frombuffer(value, dtype="<u8").astype(np.uint64)
    return None
