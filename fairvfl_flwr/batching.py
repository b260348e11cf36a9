"""Mini-batch rounds: which rows round t uses, from a seed every party already shares.

``batch_rows(seed, t, n, b)`` is a pure function of the run seed, the round number and
the sizes, so the server and every party derive the same rows without any index list
on the wire. ``b = 0`` (or b >= n) means the full batch (all rows, in order).

With a batch B_t the round's multipliers and ν use only the rows of B_t: the server
sends ν (passive) or z (active) for B_t only, i.e. b floats instead of n, and each
party's step costs O(b × its columns); evaluation still uses all rows.
"""

from __future__ import annotations

import numpy as np


def batch_rows(seed: int, server_round: int, n: int, batch_size: int) -> np.ndarray | None:
    """Sorted row indices of round ``server_round``'s batch, or None for the full batch."""
    if batch_size <= 0 or batch_size >= n:
        return None
    rng = np.random.default_rng([int(seed), int(server_round), 0xBA7C])
    # sampled without replacement; sorted for cache-friendly gathers
    rows = rng.choice(n, size=batch_size, replace=False, shuffle=False)
    rows.sort()
    return rows
