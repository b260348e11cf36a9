"""The problem a run config defines: which table, which split, who holds which columns.

Every role (server, active and passive parties) derives its view from the same
config and seed, so the split and the partition agree without being sent anywhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairvfl_flwr.core.constraints import (ConstraintSet, GroupSizeError, SensitiveGroups, constrained_codes,
                                           from_labels, kind_named)
from fairvfl_flwr.core.constraints.cells import EncryptedConstraint, GroupCells
from fairvfl_flwr.core.constraints.release import RandomizedResponse, ReleaseMargin
from fairvfl_flwr.core.metrics import RAW_METRICS, constrained_metrics, estimated_metrics, summed_metrics
from fairvfl_flwr.config.run import RunConfig
from fairvfl_flwr.data.partition import PartitionError, fit_active_columns, split_columns
from fairvfl_flwr.data.tables import FairDataset, ids_digest, load_csv, load_dataset


def load_data(cfg: RunConfig) -> FairDataset:
    """The run's table and split; with ``validation-fraction`` > 0 the validation split
    replaces the test rows (see :func:`hold_out_validation`)."""
    ds = _load_table(cfg)
    if cfg.validation_fraction > 0:
        ds = hold_out_validation(ds, cfg.validation_fraction, cfg.seed)
    return ds


def hold_out_validation(ds: FairDataset, fraction: float, seed: int) -> FairDataset:
    """Carve a seeded share of the training rows out as a validation split.

    The returned dataset trains on the remaining training rows and evaluates on the
    validation rows (they take the place of the test rows, which are not used at all),
    so a run's ACC/DFP/DFN are validation numbers and ε can be chosen without looking
    at the test set. Every role derives the same split from (fraction, seed). The
    features keep the standardisation of the full training split (feature means and
    deviations only; no labels leak).
    """
    n = len(ds.y_train)
    n_val = int(round(fraction * n))
    if not 0 < n_val < n:
        raise ValueError(f"validation-fraction={fraction} of {n} training rows leaves no rows on one side")
    perm = np.random.default_rng([seed, 0x5EED]).permutation(n)
    val, tr = np.sort(perm[:n_val]), np.sort(perm[n_val:])
    return dataclasses.replace(
        ds,
        X_train=ds.X_train[tr], y_train=ds.y_train[tr], s_train=ds.s_train[tr], ids_train=ds.ids_train[tr],
        X_test=ds.X_train[val], y_test=ds.y_train[val], s_test=ds.s_train[val], ids_test=ds.ids_train[val],
        extra={**ds.extra, "evaluation": "validation", "validation_rows": n_val},
    )


def group_options(cfg: RunConfig) -> dict:
    """How the run's constraint treats several groups (constraint-form, min-group-size, pool-small-groups)."""
    return {"form": cfg.constraint_form, "min_group_size": cfg.min_group_size,
            "pool_small_groups": cfg.pool_small_groups}


def constraint_groups(cfg: RunConfig, y: np.ndarray, s: np.ndarray, protected_label: int,
                      names: tuple[str, ...] | None = None,
                      whole: tuple[np.ndarray, np.ndarray] | None = None) -> ConstraintSet:
    """The run's constraint object (``constraint`` key; DEO by default) on rows (y, s);
    ``whole``: the labels and groups of every row, on which small groups are decided."""
    return from_labels(y, s, protected_label, cfg.constraint, cfg.measure, names=names,
                       whole=whole, **group_options(cfg))


def whole_table(y_train, s_train, y_test, s_test) -> tuple[np.ndarray, np.ndarray] | None:
    """Labels and groups of every row (training, then test): what pooling is decided on,
    the same for every seed's split. None where the test labels are not at hand."""
    if y_test is None or s_test is None:
        return None
    return np.concatenate([np.asarray(y_train), np.asarray(y_test)]), np.concatenate([s_train, s_test])


def _load_table(cfg: RunConfig) -> FairDataset:
    if cfg.dataset == "csv":
        return load_csv(
            cfg.csv_path,
            label_column=cfg.csv_label,
            positive_value=cfg.csv_positive,
            sensitive_column=cfg.csv_sensitive,
            group_a=cfg.csv_group_a,  # both empty: every value of the sensitive column(s) is a group
            group_b=cfg.csv_group_b,
            protected_label=cfg.csv_protected_label,
            id_column=cfg.csv_id_column or None,
            train_fraction=cfg.csv_train_fraction,
            seed=cfg.seed,
            sensitive_as_input=cfg.sensitive_as_input,
        )
    return load_dataset(cfg.dataset, cfg.seed, cfg.sensitive_as_input)


def party_columns(cfg: RunConfig, ds: FairDataset) -> list[np.ndarray]:
    """Each party's column indices into the dataset's features: the active parties' share first
    (``active-columns`` or the dataset's default, fitted to the federation: :func:`columns_note`),
    the rest split evenly. A split that cannot be made is a :class:`PartitionError` (a ConfigError)
    naming the table's column count and the setting to change."""
    active, _ = fit_active_columns(ds.n_features, cfg.num_parties, cfg.num_active, cfg.active_columns,
                                   ds.default_active_columns)
    try:
        return split_columns(ds.n_features, cfg.num_parties, cfg.num_active, active)
    except PartitionError as exc:
        raise PartitionError(f"run config for dataset {ds.name!r} ({ds.n_features} feature columns"
                             f"{_inputs_note(ds)}): {exc}") from None


def columns_note(cfg: RunConfig, ds: FairDataset) -> str | None:
    """What the log says once when the dataset's default active columns gave way to the federation."""
    return fit_active_columns(ds.n_features, cfg.num_parties, cfg.num_active, cfg.active_columns,
                              ds.default_active_columns)[1]


def _inputs_note(ds: FairDataset) -> str:
    left_out = ds.extra.get("sensitive-left-out")
    return (f"; the sensitive attribute's {len(left_out)} column(s) are not inputs: sensitive-as-input=false"
            if left_out else "")


def is_active(cfg: RunConfig, partition_id: int) -> bool:
    """Whether partition ``partition_id`` is an active party (holds labels and groups): the first ``num-active`` are."""
    return partition_id < cfg.num_active


@dataclass(frozen=True)
class ServerLabels:
    """What the server holds: labels and groups of the training and test rows, no features.

    Where a registry holds the groups (``release``), ``s_train`` and ``s_test`` are its noisy
    release of them, and every group figure the server computes is corrected for the
    release's known flip rates (core/constraints/release.py).
    """

    y_train: np.ndarray
    s_train: np.ndarray
    y_test: np.ndarray
    s_test: np.ndarray
    protected_label: int
    ids_digest: str
    group_names: tuple[str, ...] | None = None
    #: constraint-form, min-group-size, pool-small-groups (:func:`group_options`); none: two groups as given
    options: dict | None = None
    #: how the groups were released to the server (None: the server holds them as they are)
    release: RandomizedResponse | None = None
    #: the bound the run puts on the release's error of every gap (``groups.release-margin``; None: none)
    margin: ReleaseMargin | None = None
    #: a registry's encrypted groups (jobs/encrypted_groups.GroupSums): the server holds no row's
    #: group (``s_train``, ``s_test`` are -1), only sums over them through this oracle
    sums: Any = None

    @property
    def weights(self):
        """The released groups' membership weights (m × G), or None where the groups are exact."""
        return None if self.release is None else self.release.correction()

    def sensitive(self, split: str) -> SensitiveGroups:
        """The groups of ``split`` ("train" or "test") as the server holds them (released: with weights)."""
        s = self.s_train if split == "train" else self.s_test
        return SensitiveGroups.of(s, self.group_names, self.weights)

    def metrics(self, split: str, z: np.ndarray, constraint: ConstraintSet) -> dict[str, float]:
        """ACC, DFP, DFN and fairlearn's differences of sign(z) on ``split``'s rows over the groups
        ``constraint`` holds (pooled ones merged), with the data's own groups' beside them
        (``*_raw``) where pooling made them differ (core/metrics.constrained_metrics); from a
        released column, the corrected estimates (core/metrics.estimated_metrics)."""
        y, s = (self.y_train, self.s_train) if split == "train" else (self.y_test, self.s_test)
        if self.sums is not None:
            return summed_metrics(y, z, lambda V: self.sums.by_group(split, V, self.sums.round))
        pooled = constraint.pooling is not None
        if self.release is None:
            return constrained_metrics(y, s, z, constrained_codes(constraint, s, self.group_names) if pooled else None)
        # the constraint's groups (pooled: merged weights) of these rows' released values
        groups = (self.sensitive(split) if constraint.groups is None
                  else dataclasses.replace(constraint.groups, codes=np.asarray(s, dtype=np.int64)))
        out = estimated_metrics(y, np.column_stack([groups.weight(g) for g in range(len(groups))]), z)
        if pooled:
            raw = self.sensitive(split)
            out.update({f"{k}_raw": v for k, v in estimated_metrics(
                y, np.column_stack([raw.weight(g) for g in range(len(raw))]), z).items() if k in RAW_METRICS})
        return out

    @property
    def constraint(self) -> ConstraintSet:
        """The DEO constraint; :meth:`constraint_for` gives the run's kind."""
        return self.constraint_for("deo")

    def constraint_for(self, kind: str, measure: str = "loss") -> ConstraintSet:
        """The run's constraint on the training rows: of kind ``kind``, on ``measure``, with the run's
        group options (form, small groups); through a registry's encrypted groups, its sizes and sums;
        on a noisy release with a margin, each gap's release spread after the gaps."""
        if self.sums is not None:
            return encrypted_constraint(self, kind, measure)
        constraint = from_labels(self.y_train, self.s_train, self.protected_label, kind, measure,
                                 whole=whole_table(self.y_train, self.s_train, self.y_test, self.s_test),
                                 names=self.group_names, weights=self.weights, **(self.options or {}))
        return constraint if self.margin is None else self.margin.apply(constraint, self.release)


def encrypted_constraint(labels: ServerLabels, kind: str, measure: str) -> EncryptedConstraint:
    """The constraint a server that reaches the groups only through the registry's sums holds:
    the subsets' group sizes asked once, the gaps through the oracle at its current round. Small
    groups were pooled (or refused) when the registry's indicators arrived, on every row's counts
    (jobs/encrypted_groups.encrypted_labels), as a label owner's run decides them."""
    sums, options = labels.sums, labels.options or {}
    cells = GroupCells.build(kind_named(kind), labels.y_train, labels.protected_label, sums.names,
                             lambda masks: sums.sizes("train", masks, sums.round), measure,
                             form=options.get("form", "pairwise"))
    empty = [gap.name for gap in cells.gap_list if min(gap.size_a, gap.size_b) <= 0]
    if empty:
        raise GroupSizeError(f"{len(empty)} gap(s) with an empty side among the training rows ({kind}): "
                             + ", ".join(repr(name) for name in empty))
    return EncryptedConstraint(cells, lambda P: sums.mixed("train", P, sums.round), pooling=sums.pooling,
                               room=sums.room, told=sums.told)


def server_labels(cfg: RunConfig, ds: FairDataset | None = None) -> ServerLabels:
    """What the server of ``cfg``'s run holds, taken from the dataset: labels, groups, the training
    ids' digest, the group options."""
    ds = ds or load_data(cfg)
    return ServerLabels(
        y_train=ds.y_train, s_train=ds.s_train, y_test=ds.y_test, s_test=ds.s_test,
        protected_label=ds.protected_label, ids_digest=ids_digest(ds.ids_train),
        group_names=tuple(ds.group_names), options=group_options(cfg),
    )


def party_problem(cfg: RunConfig) -> tuple[FairDataset, list[np.ndarray], ConstraintSet]:
    """The dataset, each party's training block (its columns, contiguous) and the constraint:
    the problem a run config describes, as the one-process references (core/reference.py) take it."""
    ds = load_data(cfg)
    blocks = [np.ascontiguousarray(ds.X_train[:, c]) for c in party_columns(cfg, ds)]
    constraint = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label,
                               whole=whole_table(ds.y_train, ds.s_train, ds.y_test, ds.s_test))
    return ds, blocks, constraint
