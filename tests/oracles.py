"""The problem a run config describes, as the one-process references take it."""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.core.objective import Groups
from fairvfl_flwr.data.problem import constraint_groups, load_data, party_columns
from fairvfl_flwr.data.tables import FairDataset


def party_problem(cfg: RunConfig) -> tuple[FairDataset, list[np.ndarray], Groups]:
    """The dataset, each party's training block (its columns, contiguous) and the constraint groups."""
    ds = load_data(cfg)
    blocks = [np.ascontiguousarray(ds.X_train[:, c]) for c in party_columns(cfg, ds)]
    groups = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label)
    return ds, blocks, groups
