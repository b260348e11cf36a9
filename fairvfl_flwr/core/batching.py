"""Mini-batch rounds: which rows round t uses, from a seed every party already shares.

``batch_rows(seed, t, n, b)`` is a pure function of the run seed, the round number and
the sizes, so the server and every party derive the same rows without any index list
on the wire. ``b = 0`` (or b >= n) means the full batch (all rows, in order).

With a batch B_t (run config ``batch-size = b``) round t's multipliers and ν use only
the rows of B_t: the server sends ν (passive) or z (active) for B_t only, i.e. b floats
instead of n, and each party's step costs O(b × its columns). A party replies with its
new partial logits on B_{t+1} (:func:`reply_rows`), so the server holds fresh z on the
next round's rows; on an evaluation round it replies all rows instead (train metrics on
every training row), and the server takes B_{t+1} out of those.

The mini-batch Lagrangian of round t is f̃ with every mean taken over B_t: L over the b
rows, each gap D_c over A_c ∩ B_t and B_c ∩ B_t (``ConstraintSet.restrict``). A constraint
group with no row in some B_t would make D_c undefined; :func:`check_batches` refuses
such a batch size before round 1 (see its docstring for why it refuses rather than skips).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from fairvfl_flwr.core.constraints import ConstraintSet
from fairvfl_flwr.core.errors import ConfigError

# Above this chance that some round's batch misses a constraint group, every round's
# batch is drawn and checked before round 1.
NEGLIGIBLE = 1e-9


def batch_rows(seed: int, server_round: int, n: int, batch_size: int) -> np.ndarray | None:
    """Sorted row indices of round ``server_round``'s batch, or None for the full batch."""
    if batch_size <= 0 or batch_size >= n:
        return None
    # A copy: the cached array stays private to the cache.
    return _drawn_rows(int(seed), int(server_round), int(n), int(batch_size)).copy()


@functools.lru_cache(maxsize=8)
def _drawn_rows(seed: int, server_round: int, n: int, batch_size: int) -> np.ndarray:
    # Cached because one message needs a round's rows up to three times (the mod's length
    # check, the handler's step, the server's round), and drawing b of n rows
    # costs far more than a copy.
    rng = np.random.default_rng([seed, server_round, 0xBA7C])
    # sampled without replacement; sorted for cache-friendly gathers
    rows = rng.choice(n, size=batch_size, replace=False, shuffle=False)
    rows.sort()
    return rows


def effective_batch(batch_size: int, n: int) -> int:
    """The batch size a run really uses: 0 (full batch) when ``batch_size`` >= n."""
    return batch_size if 0 < batch_size < n else 0


def round_rows(cfg, server_round: int, n: int) -> np.ndarray | None:
    """Rows round ``server_round`` trains on under ``cfg`` (seed, batch-size); None: all rows."""
    return batch_rows(cfg.seed, server_round, n, cfg.batch_size)


def reply_rows(cfg, server_round: int, evaluate: bool, n: int) -> np.ndarray | None:
    """Rows of the training logits a party returns after round ``server_round``.

    The next round's batch, so that the server's dual step and ν of round t+1 see
    logits of the current θ; all rows (None) when the round is evaluated, where the
    server records L and DEO on every training row.
    """
    return None if evaluate else round_rows(cfg, server_round + 1, n)


def check_batches(constraint: ConstraintSet, seed: int, batch_size: int, rounds: int) -> None:
    """Refuse a batch size for which some round's batch misses a constraint group.

    Refusing (rather than skipping that constraint's gap in such a round) keeps every
    round an unbiased step on the same Lagrangian, and the server and the active party
    need no rule to agree on which constraints a round dropped. Because the batches are
    a pure function of the seed, the check is exact: when the chance of a miss is not
    negligible (``rounds × Σ_groups exp(−b·m/n)`` ≥ 1e-9, m a group's size), every
    round's batch is drawn and checked here, before any message is sent.

    Raises
    ------
    ConfigError
        Naming ``batching.batch-size``, the first round whose batch misses a group, and a batch
        size that keeps every group in every round with probability ≥ 99.9 %.
    """
    n = constraint.n
    if effective_batch(batch_size, n) == 0:
        return
    sizes = [(c.name, side, mask) for c in constraint.gap_list for side, mask in (("a", c.in_a), ("b", c.in_b))]
    smallest = min(int(mask.sum()) for _, _, mask in sizes)
    if rounds * len(sizes) * math.exp(-batch_size * smallest / n) < NEGLIGIBLE:
        return
    for t in range(1, rounds + 1):
        rows = batch_rows(seed, t, n, batch_size)
        for name, side, mask in sizes:
            if not mask[rows].any():
                safe = math.ceil(n / smallest * math.log(rounds * len(sizes) / 1e-3))
                raise ConfigError(
                    f"run config batching.batch-size={batch_size}: round {t}'s batch holds no row of group {side} in "
                    f"constraint {name!r} ({int(mask.sum())} of {n} training rows), so its gap is undefined; "
                    f"use batching.batch-size >= {min(safe, n)} (every group in every one of {rounds} rounds with "
                    f"probability >= 99.9 %) or 0 (full batch)"
                )
