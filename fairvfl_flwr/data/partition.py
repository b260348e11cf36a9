"""Vertical partition: which feature columns each party holds.

Parties ``0 .. num_active-1`` are active, the rest passive. The active parties hold the
first ``active_columns`` columns (split evenly among them), the passive parties the
remaining columns in contiguous, near-equal blocks, so that each organisation holds a
coherent block of attributes (as in the paper's setup). The split depends only on its
arguments: every party and the server compute the same one independently.

flwr-datasets' ``VerticalSizePartitioner`` does the same job on Hugging Face
``Dataset`` objects; it would add ``datasets``/``pyarrow`` to every SuperNode for ~20
lines of index arithmetic, so the split is written here.
"""

from __future__ import annotations

import numpy as np


class PartitionError(ValueError):
    """The requested split cannot be made; the message says why."""


def split_columns(
    n_features: int, num_parties: int, num_active: int = 1, active_columns: int | None = None
) -> list[np.ndarray]:
    """Column indices of each party, active parties first.

    Parameters
    ----------
    n_features : int
        Number of feature columns in the table.
    num_parties : int
        K, the number of parties (active + passive).
    num_active : int
        Number of active parties (hold labels and groups).
    active_columns : int, optional
        Columns held by the active parties together. ``None`` or ``0``: an even share,
        ``round(n_features * num_active / num_parties)``.
    """
    if num_parties < 1:
        raise PartitionError(f"num-parties must be at least 1, got {num_parties}")
    if not 1 <= num_active <= num_parties:
        raise PartitionError(f"num-active must be between 1 and num-parties ({num_parties}), got {num_active}")
    if num_parties > n_features:
        raise PartitionError(
            f"num-parties={num_parties} is larger than the number of feature columns ({n_features}): "
            "every party needs at least one column"
        )
    num_passive = num_parties - num_active
    if not active_columns:
        active_columns = max(num_active, round(n_features * num_active / num_parties))
    if active_columns < num_active:
        raise PartitionError(f"active-columns={active_columns} leaves an active party without columns")
    if n_features - active_columns < num_passive:
        raise PartitionError(
            f"active-columns={active_columns} leaves {n_features - active_columns} columns "
            f"for {num_passive} passive parties; each needs at least one"
        )
    if num_passive == 0 and active_columns != n_features:
        active_columns = n_features
    cols = np.arange(n_features)
    active = np.array_split(cols[:active_columns], num_active)
    passive = np.array_split(cols[active_columns:], num_passive) if num_passive else []
    return [*active, *passive]
