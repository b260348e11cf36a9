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

from fairvfl_flwr.core.errors import ConfigError


class PartitionError(ConfigError):
    """The requested split cannot be made; the message says why and which setting to change.

    A ConfigError: the run is refused before its first message, as a bad setting is."""


def fit_active_columns(
    n_features: int, num_parties: int, num_active: int, requested: int, default: int | None
) -> tuple[int | None, str | None]:
    """The active parties' column count for this federation, and a note when the dataset's
    default had to give way.

    ``requested`` (run config ``active-columns``, 0: unset) is kept as asked, and
    :func:`split_columns` refuses it when it cannot fit. ``default`` is the dataset's (the
    paper's split for six parties); with more parties, or a table that lost a column (a
    sensitive attribute that is no longer an input), it would leave a passive party
    without columns, so it shrinks to what leaves each passive party one.
    """
    if requested or default is None:
        return requested or default, None
    room = n_features - (num_parties - num_active)
    if default <= room or room < num_active:  # fits, or nothing does (split_columns says which setting)
        return default, None
    return room, (f"active-columns: the dataset's default {default} would leave {n_features - default} of its "
                  f"{n_features} feature columns for {num_parties - num_active} passive parties, so the active "
                  f"part{'ies hold' if num_active > 1 else 'y holds'} {room} columns and each passive party at "
                  "least one (set active-columns to choose)")


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
            f"every party needs at least one column; set num-parties to at most {n_features}"
        )
    num_passive = num_parties - num_active
    if not active_columns:
        active_columns = max(num_active, round(n_features * num_active / num_parties))
    if active_columns < num_active:
        raise PartitionError(f"active-columns={active_columns} leaves an active party without columns "
                             f"(num-active={num_active}); set active-columns to at least {num_active}, "
                             "or to 0 for the dataset's default")
    if n_features - active_columns < num_passive:
        raise PartitionError(
            f"active-columns={active_columns} leaves {n_features - active_columns} columns "
            f"for {num_passive} passive parties; each needs at least one: set active-columns to at most "
            f"{n_features - num_passive} (0: the dataset's default, fitted to num-parties) "
            f"or num-parties to at most {num_active + n_features - active_columns}"
        )
    if num_passive == 0 and active_columns != n_features:
        active_columns = n_features
    cols = np.arange(n_features)
    active = np.array_split(cols[:active_columns], num_active)
    passive = np.array_split(cols[active_columns:], num_passive) if num_passive else []
    return [*active, *passive]
