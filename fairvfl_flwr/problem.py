"""The problem a run config defines: which table, which split, who holds which columns.

Every role (server, active and passive parties) derives its view from the same
config and seed, so the split and the partition agree without being sent anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import RunConfig
from .data import FairDataset, load_csv, load_dataset
from .objective import Groups
from .partition import split_columns


def load_data(cfg: RunConfig) -> FairDataset:
    if cfg.dataset == "csv":
        return load_csv(
            cfg.csv_path,
            label_column=cfg.csv_label,
            positive_value=cfg.csv_positive,
            sensitive_column=cfg.csv_sensitive,
            group_a=cfg.csv_group_a,
            group_b=cfg.csv_group_b,
            protected_label=cfg.csv_protected_label,
            id_column=cfg.csv_id_column or None,
            train_fraction=cfg.csv_train_fraction,
            seed=cfg.seed,
        )
    return load_dataset(cfg.dataset, cfg.seed)


def party_columns(cfg: RunConfig, ds: FairDataset) -> list[np.ndarray]:
    active = cfg.active_columns or ds.default_active_columns
    return split_columns(ds.n_features, cfg.num_parties, cfg.num_active, active)


def is_active(cfg: RunConfig, partition_id: int) -> bool:
    return partition_id < cfg.num_active


@dataclass(frozen=True)
class ServerLabels:
    """What the server holds: labels and groups of the training and test rows, no features."""

    y_train: np.ndarray
    s_train: np.ndarray
    y_test: np.ndarray
    s_test: np.ndarray
    protected_label: int
    ids_digest: str

    @property
    def groups(self) -> Groups:
        return Groups.from_labels(self.y_train, self.s_train, self.protected_label)


def server_labels(cfg: RunConfig, ds: FairDataset | None = None) -> ServerLabels:
    from .data import ids_digest

    ds = ds or load_data(cfg)
    return ServerLabels(
        y_train=ds.y_train, s_train=ds.s_train, y_test=ds.y_test, s_test=ds.s_test,
        protected_label=ds.protected_label, ids_digest=ids_digest(ds.ids_train),
    )
