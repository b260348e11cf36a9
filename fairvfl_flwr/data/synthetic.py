"""A seeded synthetic table with a planted group bias, for scaling benchmarks.

Every column is drawn from its own seed (``[seed, column]``), so a party can generate
*only its own block* in O(n × its columns) memory; the labels are accumulated one
column at a time (O(n) scratch). All roles therefore agree on the table without
anyone holding all of it.

The planted bias: group a (s = True, share ``group_share``) gets ``-bias`` on the
true logit, so an unconstrained model has a clear loss gap between the groups on the
protected-label rows (DEO well above 0.01), and column 0 is a proxy of s (it leaks the
group into the features, as real tables do).
"""

from __future__ import annotations

import numpy as np
from fairvfl_flwr.data.tables import FairDataset

#: Column 0 is shifted by this much in group a (the proxy feature).
PROXY_SHIFT = 0.8


def _group(n: int, seed: int, group_share: float) -> np.ndarray:
    return np.random.default_rng([seed, 0x6A]).random(n) < group_share


def _weights(n_features: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 0x77]).normal(scale=1.0 / np.sqrt(n_features), size=n_features)


def columns(n: int, cols, seed: int = 0, group_share: float = 0.4, dtype=np.float64) -> np.ndarray:
    """Feature columns ``cols`` of the n-row table (n × len(cols)), each from its own seed."""
    cols = list(cols)
    out = np.empty((n, len(cols)), dtype=dtype)
    s = _group(n, seed, group_share) if 0 in cols else None
    for j, c in enumerate(cols):
        x = np.random.default_rng([seed, 1000 + int(c)]).standard_normal(n)
        if c == 0:
            x += PROXY_SHIFT * s
        out[:, j] = x
    return out


def labels(n: int, n_features: int, seed: int = 0, bias: float = 1.0, group_share: float = 0.4,
           noise: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """(y in {-1, +1} as int8, s as bool): y = sign(x·w − bias·s + noise), built column by column."""
    s = _group(n, seed, group_share)
    w = _weights(n_features, seed)
    logit = np.random.default_rng([seed, 0x4E]).normal(scale=noise, size=n) - bias * s + 0.3
    for c in range(n_features):
        logit += w[c] * columns(n, [c], seed, group_share)[:, 0]
    return np.where(logit > 0, 1, -1).astype(np.int8), s


def split(n: int, test_fraction: float = 0.1) -> tuple[slice, slice]:
    """Rows [0, n_train) train, the rest test (the rows are i.i.d., so a prefix split is a random one)."""
    n_test = int(round(test_fraction * n))
    return slice(0, n - n_test), slice(n - n_test, n)


def make_dataset(n: int, n_features: int = 32, seed: int = 0, bias: float = 1.0, test_fraction: float = 0.1):
    """The whole table as a :class:`~fairvfl_flwr.data.tables.FairDataset` (protected label +1)."""

    X = columns(n, range(n_features), seed)
    y, s = labels(n, n_features, seed, bias)
    tr, te = split(n, test_fraction)
    ids = np.arange(n)
    return FairDataset(
        name="synthetic", feature_names=[f"x{c}" for c in range(n_features)],
        X_train=X[tr], y_train=y[tr], s_train=s[tr], ids_train=ids[tr],
        X_test=X[te], y_test=y[te], s_test=s[te], ids_test=ids[te],
        protected_label=1, group_names=("a", "b"), default_active_columns=n_features // 4,
        source=f"synthetic(n={n}, features={n_features}, seed={seed}, bias={bias})",
    )
