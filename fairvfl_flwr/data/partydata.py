"""What one party (or the server) holds, from a party file or from the packaged data.

One code path for both ways a node is started:

* **deployment**: the SuperNode's ``--node-config`` names the party's own CSV
  (``data-path``), its ``role`` and ``partition-id``, the ``id-column`` and, for the
  active party, the label and sensitive columns and their values;
* **simulation**: the node config has only ``partition-id``/``num-partitions``; the
  node builds in memory exactly the table :mod:`fairvfl_flwr.tools.export` would write for it.

Either way the table goes through :func:`parse_party_table`: rows are matched by row
id (sorted by id, not by file order), split by the ``split`` column, and the ids'
digest is what the server compares before round 1. The server's labels come the
same way from the server label file (run config ``server-labels``) or the packaged
data, through :func:`parse_label_table`.

Parsed party files are cached on the node's disk (its folder: ``cache-dir``, default
``~/.cache/fairvfl-flwr``) keyed by the file's SHA-256 (remembered per version of the
file: :func:`known_digest`) and the parse options: in
deployment every message runs in a fresh ``flwr-clientapp`` process, which then loads
one ``.npz`` instead of parsing the CSV with pandas.

This module imports neither torch nor pandas at import time.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping

import numpy as np

from fairvfl_flwr.config.node import CACHE_ENV, NodeConfig, NodeConfigError, party_folder  # noqa: F401  (CACHE_ENV, NodeConfigError: imported from here)
from fairvfl_flwr.data.problem import ServerLabels, group_options, load_data, party_columns
from fairvfl_flwr.data.tables import (BLANK, DATASETS, DataError, Finding, as_text, examples, norm_value, parse_markers,
                                      read_csv, row_numbers, sensitive_columns, sensitive_encodings)

ROLE_ACTIVE = "active"
ROLE_PASSIVE = "passive"
#: A party that holds the sensitive column (and features) instead of the label owner (run config
#: groups.holder = "registry"); it trains as a passive party.
ROLE_REGISTRY = "registry"
ID_COLUMN = "row_id"
SPLIT_COLUMN = "split"
TRAIN, TEST = "train", "test"
#: The server label file's columns (besides the id and split columns).
LABEL_Y, LABEL_GROUP, LABEL_PROTECTED = "y", "group", "protected"
CACHE_VERSION = 2


@dataclass(frozen=True)
class PartySpec:
    """Who this node is and how to read its file (from ``--node-config``)."""

    partition_id: int
    role: str
    data_path: str = ""  # empty: simulation (packaged data, built in memory)
    id_column: str = ID_COLUMN
    split_column: str = SPLIT_COLUMN
    label_column: str = ""
    label_positive: str = ""
    sensitive_column: str = ""
    group_a: str = ""
    group_b: str = ""
    protected_label: int = 0  # 0: not given (passive party)
    cache_dir: str = ""
    table_path: str = ""  # the party's own raw table (run config tables.own)
    columns: tuple[str, ...] = ()  # the raw table's columns it contributes; empty: all but id/label/sensitive
    aligned: str = ""  # key of its prepared block after private alignment (data/psi.py)
    missing_values: tuple[str, ...] = ()  # cells equal to one of these are missing (node config missing-values)
    label_negative: str = ""  # the label's other value; empty: whichever one other value the column holds
    #: (column, value) pairs that look like missing markers but are real categories (node config real-categories)
    real_categories: tuple[tuple[str, str], ...] = ()
    protected_columns: tuple[str, ...] = ()  # never features unless sensitive-as-input (node config protected-columns)
    table_sql: str = ""  # the party's own table in its database instead (data/sources.py): its URL, no password
    table_sql_query: str = ""  # the table's name or a SELECT query
    table_sql_password_env: str = ""  # the environment variable that holds the database's password

    @property
    def name(self) -> str:
        """The party as errors name it: partition, role and the file (or database) it reads."""
        path = self.data_path or self.table_path or self.table_sql
        where = f", {path}" if path else ""
        return f"party {self.partition_id} ({self.role}{where})"


@dataclass(frozen=True)
class PartyArrays:
    """A party's rows, sorted by row id: features, and y/s only for the active party."""

    partition_id: int
    role: str
    feature_names: tuple[str, ...]
    X_train: np.ndarray
    X_test: np.ndarray
    ids_digest: str
    n_train: int
    n_test: int
    y_train: np.ndarray | None = None  # ±1, float64
    s_train: np.ndarray | None = None  # True = group a
    protected_label: int = 0
    y_test: np.ndarray | None = None  # the test rows' labels and groups: small groups are decided on every row
    s_test: np.ndarray | None = None
    source: str = ""
    group_names: tuple[str, ...] = ()  # a registry's groups, in the order of its codes
    # a registry's row ids (as text): its randomized response is drawn per row id, alike in every run
    ids_train: np.ndarray | None = None
    ids_test: np.ndarray | None = None


# -- node config ------------------------------------------------------------------------
def party_spec(node_config: NodeConfig | Mapping[str, Any], num_parties: int, num_active: int,
               registry: bool = False) -> PartySpec:
    """Read and check this node's config (:class:`NodeConfig`): deployment (``data-path``,
    ``table-path``, ``table-sql``) or simulation."""
    node = NodeConfig.from_flower(node_config)
    if "partition-id" not in node.given:
        raise NodeConfigError(
            f"node config has no 'partition-id' (got keys {sorted(node.given)}); start the SuperNode with "
            "--node-config 'partition-id=<k> ...' (python -m fairvfl_flwr.tools.export prints the exact lines)"
        )
    pid = node.partition_id
    if "num-partitions" in node.given and node.num_partitions != num_parties:
        raise NodeConfigError(
            f"the federation has {node.num_partitions} SuperNodes but the run asks for num-parties={num_parties}; "
            f"start it with num-supernodes={num_parties}"
        )
    if not 0 <= pid < num_parties:
        raise NodeConfigError(f"partition-id={pid} is outside 0..{num_parties - 1} (num-parties={num_parties})")
    data_path, table_path = node.data_path, node.table_path
    own = table_path or node.table_sql  # the party's own raw table, in a file or in its database
    if data_path and own:
        raise NodeConfigError(f"party {pid}: node config names both data-path (an exported party file) and "
                              f"{'table-path' if table_path else 'table-sql'} (the party's own raw table); give one")
    if not data_path and not own:  # simulation: role from the partition
        # with groups.holder = "registry" the last partition holds the groups
        role = ROLE_ACTIVE if pid < num_active else ROLE_REGISTRY if registry and pid == num_parties - 1 else ROLE_PASSIVE
        return PartySpec(partition_id=pid, role=role)
    data_path = data_path or table_path or node.table_sql  # what the refusals below name
    role = node.role
    if role not in (ROLE_ACTIVE, ROLE_PASSIVE, ROLE_REGISTRY):
        raise NodeConfigError(
            f"party {pid} ({data_path}): node config role={role!r}; give role=\"active\" or role=\"passive\" (or "
            "role=\"registry\")"
        )
    kwargs: dict[str, Any] = {}
    if role == ROLE_REGISTRY:
        if not node.sensitive_column:
            raise NodeConfigError(f"party {pid} ({data_path}): a registry's node config needs sensitive-column")
        if bool(node.group_a) != bool(node.group_b):
            raise NodeConfigError(f"party {pid} ({data_path}): give both group-a and group-b (two groups) or "
                                  "neither (every value of sensitive-column is a group)")
        kwargs = dict(sensitive_column=node.sensitive_column, group_a=node.group_a, group_b=node.group_b)
    if role == ROLE_ACTIVE:
        # an own table may name no groups: every value (combination) of its sensitive column(s) is one
        optional = ("group-a", "group-b") if own else ()
        if registry:  # the run's groups are a registry's: the label owner names its label only
            if node.sensitive_column:
                raise NodeConfigError(f"party {pid} ({data_path}): run config groups.holder='registry': the label "
                                      f"owner holds no sensitive column; drop node config sensitive-column="
                                      f"{node.sensitive_column!r}")
            optional = ("sensitive-column", "group-a", "group-b")
        values = {"label-column": node.label_column, "label-positive": node.label_positive,
                  "sensitive-column": node.sensitive_column, "group-a": node.group_a, "group-b": node.group_b,
                  "protected-label": node.protected_label or ""}
        missing = [k for k, v in values.items() if str(v) == "" and k not in optional]
        if optional and bool(node.group_a) != bool(node.group_b):
            raise NodeConfigError(f"party {pid} ({data_path}): give both group-a and group-b (two groups) or "
                                  "neither (every value of sensitive-column is a group)")
        if missing:
            raise NodeConfigError(f"party {pid} ({data_path}): the active party's node config needs {', '.join(missing)}")
        kwargs = dict(
            label_column=node.label_column, label_positive=node.label_positive, label_negative=node.label_negative,
            sensitive_column=node.sensitive_column, group_a=node.group_a, group_b=node.group_b,
            protected_label=node.protected_label,
        )
    path = data_path if node.table_sql else str(Path(data_path).expanduser())
    columns = tuple(c.strip() for c in node.columns.split(",") if c.strip())
    return PartySpec(
        partition_id=pid, role=role, data_path="" if own else path, table_path=path if table_path else "",
        table_sql=node.table_sql, table_sql_query=node.table_sql_query,
        table_sql_password_env=node.table_sql_password_env,
        id_column=node.id_column, split_column=node.split_column, cache_dir=node.cache_dir, columns=columns,
        missing_values=parse_markers(node.missing_values),
        real_categories=real_categories(node.real_categories, f"party {pid} ({path})"),
        protected_columns=tuple(c.strip() for c in node.protected_columns.split(",") if c.strip()), **kwargs,
    )


def real_categories(text: str, who: str) -> tuple[tuple[str, str], ...]:
    """Node config ``real-categories``: ``"workclass:?,city:unknown"`` -> ``(("workclass", "?"),
    ("city", "unknown"))`` (``<blank>``: a cell of spaces); an item without its column is refused,
    naming ``who``."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        column, sep, value = item.partition(":")
        if not sep or not column.strip():
            raise NodeConfigError(f"{who}: node config real-categories={text!r}: item {item!r} is not "
                                  "'column:value'")
        out.append((column.strip(), "" if value.strip() == BLANK else value.strip()))
    return tuple(out)


def own_table_spec(spec: PartySpec, cfg) -> PartySpec:
    """The spec of a party that brings its own raw table (run config ``tables.own``).

    Deployment: the node config's ``table-path`` or ``table-sql``. Simulation: ``tables.path`` with
    ``{partition}`` replaced, ``tables.id-column``, and for the label owner the label and
    groups of the run's dataset (``csv.*`` with ``dataset = "csv"``)."""
    if spec.data_path:
        raise NodeConfigError(f"{spec.name}: run config tables.own=true reads the party's own raw table: give "
                              "node config table-path instead of data-path (an exported party file)")
    markers = spec.missing_values or parse_markers(getattr(cfg, "tables_missing_values", ""))
    if spec.table_path or spec.table_sql:
        return dataclasses.replace(spec, missing_values=markers)
    if not cfg.tables_path:
        raise NodeConfigError(f"party {spec.partition_id}: tables.own=true in simulation needs tables.path, e.g. "
                              "'tables/party{partition}.csv'")
    try:
        path = cfg.tables_path.format(partition=spec.partition_id)
    except (KeyError, IndexError, ValueError) as exc:
        raise NodeConfigError(f"tables.path={cfg.tables_path!r}: only {{partition}} may be replaced ({exc})") from None
    kwargs: dict[str, Any] = {}
    if spec.role in (ROLE_ACTIVE, ROLE_REGISTRY):
        if cfg.dataset == "csv":
            kwargs = dict(label_column=cfg.csv_label, label_positive=cfg.csv_positive,
                          sensitive_column=cfg.csv_sensitive, group_a=cfg.csv_group_a, group_b=cfg.csv_group_b,
                          protected_label=cfg.csv_protected_label)
        else:
            d = DATASETS[cfg.dataset]
            kwargs = dict(label_column=d.label_column, label_positive=d.positive_value,
                          sensitive_column=d.sensitive_column, group_a=d.group_a, group_b=d.group_b,
                          protected_label=d.protected_label)
        groups = {k: kwargs[k] for k in ("sensitive_column", "group_a", "group_b")}
        if spec.role == ROLE_REGISTRY:  # the groups without the label
            kwargs = groups
        elif getattr(cfg, "registry", False):  # the label without the groups
            kwargs.update(dict.fromkeys(groups, ""))
    return dataclasses.replace(spec, table_path=str(Path(path).expanduser()), id_column=cfg.tables_id_column,
                               missing_values=markers, **kwargs)


# -- tables -----------------------------------------------------------------------------
def _sorted_ids(ids: np.ndarray) -> np.ndarray:
    """Order of rows by id (numbers numerically, anything else as text)."""
    ids = np.asarray(ids)
    key = ids if np.issubdtype(ids.dtype, np.number) else ids.astype(str)
    return np.argsort(key, kind="stable")


def rows_digest(ids_train: np.ndarray, ids_test: np.ndarray) -> str:
    """Equal digests mean the same training and test rows in the same order."""
    h = hashlib.sha256()
    for part in (ids_train, ids_test):
        h.update(np.asarray(part).astype(str).astype("U").tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


def _text(values) -> np.ndarray:
    return as_text(values).to_numpy().astype(str)


def reserved_columns(df, spec: PartySpec, sensitive_as_input: bool = False) -> set[str]:
    """The columns of a party's raw table that are not its features: its id; for the label
    owner the label, and the sensitive column(s) with any one-hot copy of them
    (``race_White``, ...); for any party its declared protected columns (node config
    ``protected-columns``) with theirs; the last two unless ``sensitive_as_input`` (run
    config) makes them inputs."""
    reserved = {spec.id_column}
    if spec.role == ROLE_ACTIVE:
        reserved.add(spec.label_column)
    if spec.sensitive_column and spec.role in (ROLE_ACTIVE, ROLE_REGISTRY) and not sensitive_as_input:
        reserved |= {spec.sensitive_column, *group_columns(df, spec), *sensitive_encodings(list(df.columns), spec)}
    if spec.protected_columns and not sensitive_as_input:
        declared = dataclasses.replace(spec, sensitive_column=",".join(spec.protected_columns))
        reserved |= {*spec.protected_columns, *sensitive_encodings(list(df.columns), declared)}
    return reserved


def group_columns(df, spec: PartySpec) -> list[str]:
    """The columns of ``df`` that hold the groups: ``"sex,race"`` names two in an own table,
    but one column of that name where the table was written from a joint dataset (export,
    the packaged partitions), which holds the combinations' names already."""
    if spec.sensitive_column in df.columns:
        return [spec.sensitive_column]
    return sensitive_columns(spec)


def group_values(df, spec: PartySpec) -> np.ndarray:
    """Each row's group as text: its sensitive column's value, or with several sensitive
    columns (``"sex,race"``) their values joined by ``" & "`` (data/tables.py's names)."""
    parts = [_text(df[c]) for c in group_columns(df, spec)]
    return parts[0] if len(parts) == 1 else np.asarray([" & ".join(v) for v in zip(*parts)])


def unexpected_labels(labels: np.ndarray, spec: PartySpec) -> dict[str, np.ndarray]:
    """The label values beyond the two a label owner declares, and the rows (positions) of each:
    label-positive and label-negative; without label-negative, the one other value is the
    negative label, and with several others every one of them is unexpected."""
    pos = norm_value(spec.label_positive)
    values, inverse = np.unique(labels, return_inverse=True)
    allowed = {pos, norm_value(spec.label_negative)} if spec.label_negative else None
    others = [v for v in values if v != pos]
    if allowed is None and len(others) <= 1:
        return {}
    return {str(v): np.flatnonzero(inverse == i) for i, v in enumerate(values)
            if (v not in allowed if allowed is not None else v != pos)}


def describe_labels(extra: dict[str, np.ndarray], spec: PartySpec) -> str:
    """The refusal's text for :func:`unexpected_labels`: each value, its count and example rows."""
    shown = "; ".join(f"{v!r} in {len(rows)} rows (e.g. rows {row_numbers(rows)})"
                      for v, rows in sorted(extra.items(), key=lambda kv: -len(kv[1]))[:6])
    pos = norm_value(spec.label_positive)
    if spec.label_negative:
        return (f"holds values other than label-positive={pos!r} and label-negative="
                f"{norm_value(spec.label_negative)!r}: {shown}; fix or drop those rows")
    return (f"holds {len(extra) + 1} values, a label has two: label-positive={pos!r} and {shown}; name the "
            "negative one (node config label-negative) and fix or drop the rows of the others")


def label_findings(df, spec: PartySpec) -> tuple[list[Finding], np.ndarray]:
    """Every problem of the label owner's label and sensitive columns in ``df``, and the rows
    free of them (where the pre-flight counts the groups; the run refuses on the first).

    A column not there, missing values, a label that never equals label-positive, label
    values beyond the two (without label-negative, the most frequent other value is then
    taken as the negative one for the rows kept), group values beyond group-a and group-b."""
    found: list[Finding] = []
    groups_here = bool(spec.sensitive_column)  # a registry run's label owner holds none
    columns = (("label", spec.label_column), *(("sensitive", c) for c in (group_columns(df, spec) if groups_here else ())))
    for role, col in columns:
        if col not in df.columns:
            found.append(Finding(f"{role} column not found", f"{role} column {col!r} (node config {role}-column) "
                                 "not found"))
    valid = np.ones(len(df), dtype=bool)
    if found:
        return found, valid
    for role, col in columns:
        if df[col].isna().any():
            rows = np.flatnonzero(df[col].isna().to_numpy())
            found.append(Finding(f"missing {role} values", f"{role} column {col!r} has {len(rows)} missing values; "
                                 "fix or drop those rows", f"e.g. rows {row_numbers(rows)}"))
            valid[rows] = False
    labels = _text(df[spec.label_column])
    pos = norm_value(spec.label_positive)
    if not (labels == pos).any():
        found.append(Finding("label-positive never seen", f"label column {spec.label_column!r} never equals "
                             f"label-positive={pos!r} (values: {examples(sorted(set(labels)))})"))
        return found, valid & False
    extra = unexpected_labels(labels[valid], spec)
    if extra:  # a third value would silently count as negative
        found.append(Finding("unexpected label values", f"label column {spec.label_column!r} "
                             f"{describe_labels({v: np.flatnonzero(valid)[r] for v, r in extra.items()}, spec)}"))
        if not spec.label_negative:  # undeclared: the most frequent other value is taken as the negative one
            del extra[max(extra, key=lambda v: len(extra[v]))]
        valid &= ~np.isin(labels, list(extra))
    if groups_here and (spec.group_a or spec.group_b):
        groups = group_values(df, spec)
        a, b = norm_value(spec.group_a), norm_value(spec.group_b)
        odd = valid & ~np.isin(groups, [a, b])
        if odd.any():
            found.append(Finding("unexpected group values", f"sensitive column {spec.sensitive_column!r} holds "
                                 f"values other than group-a={a!r} and group-b={b!r}: "
                                 f"{examples(sorted(set(groups[odd])))} ({int(odd.sum())} rows); fix or drop those "
                                 "rows, or name neither group (every value a group)",
                                 f"e.g. rows {row_numbers(np.flatnonzero(odd))}"))
            valid &= ~odd
    return found, valid


def label_codes(df, spec: PartySpec) -> tuple[np.ndarray, np.ndarray | None]:
    """y (±1) and group of every row of ``df``, whose rows :func:`label_findings` kept: True =
    group a, or with neither group named, each value's (or combination's) index among the
    sorted values (the server label file's order); no groups where the party holds none."""
    y = np.where(_text(df[spec.label_column]) == norm_value(spec.label_positive), 1.0, -1.0)
    return y, (group_codes(df, spec)[0] if spec.sensitive_column else None)


def group_codes(df, spec: PartySpec) -> tuple[np.ndarray, tuple[str, ...]]:
    """Each row's group (True = group a, or each value's index among the sorted values) and the
    groups' names in that order."""
    groups = group_values(df, spec)
    if not (spec.group_a or spec.group_b):
        names = tuple(sorted(set(groups.tolist())))
        return np.searchsorted(np.asarray(names), groups).astype(np.int64), names
    return groups == norm_value(spec.group_a), (norm_value(spec.group_a), norm_value(spec.group_b))


def registry_groups(df, spec: PartySpec, where: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """A registry's groups of every row of ``df`` and their names; refuses, naming ``where``, a
    sensitive column not there, with missing values, or with a value beyond group-a and group-b."""
    columns = group_columns(df, spec)
    for col in columns:
        if col not in df.columns:
            raise DataError(f"{where}: sensitive column {col!r} (node config sensitive-column) not found")
        if df[col].isna().any():
            rows = np.flatnonzero(df[col].isna().to_numpy())
            raise DataError(f"{where}: sensitive column {col!r} has {len(rows)} missing values (e.g. rows "
                            f"{row_numbers(rows)}); fix or drop those rows")
    codes, names = group_codes(df, spec)
    if spec.group_a or spec.group_b:
        odd = ~np.isin(group_values(df, spec), names)
        if odd.any():
            raise DataError(f"{where}: sensitive column {spec.sensitive_column!r} holds values other than "
                            f"group-a={names[0]!r} and group-b={names[1]!r} in {int(odd.sum())} rows (e.g. rows "
                            f"{row_numbers(np.flatnonzero(odd))})")
    return codes, names


def label_arrays(df, spec: PartySpec, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The label owner's y and groups of every row of ``df`` (:func:`label_codes`); refuses,
    naming ``where``, the first of :func:`label_findings`."""
    found, _ = label_findings(df, spec)
    if found:
        raise found[0].error(where)
    return label_codes(df, spec)


def parse_party_table(df, spec: PartySpec, source: str) -> PartyArrays:
    """A party's table (a pandas DataFrame) → its sorted arrays; every problem names the file."""
    import pandas as pd

    where = f"{spec.name}: {source}"
    for role, col in (("id", spec.id_column), ("split", spec.split_column)):
        if col not in df.columns:
            shown = ", ".join(map(str, df.columns[:10]))
            raise DataError(f"{where}: {role} column {col!r} not found (columns: {shown}{'...' if df.shape[1] > 10 else ''})")
    ids = df[spec.id_column]
    if ids.isna().any():
        raise DataError(f"{where}: id column {spec.id_column!r} has {int(ids.isna().sum())} missing values")
    if ids.duplicated().any():
        dup = ids[ids.duplicated()].iloc[:3].tolist()
        raise DataError(f"{where}: id column {spec.id_column!r} has duplicate ids", local=f"e.g. {dup}")
    split = df[spec.split_column].astype(str).str.strip().str.lower()
    bad = sorted(set(split.unique()) - {TRAIN, TEST})  # its distinct values: a deployed party parses its table at every message
    if bad:
        raise DataError(f"{where}: split column {spec.split_column!r} must say 'train' or 'test', found {bad[:5]}")
    reserved = [spec.id_column, spec.split_column]
    y = s = None
    names: tuple[str, ...] = ()
    if spec.role == ROLE_ACTIVE:
        y, s = label_arrays(df, spec, where)
        reserved += [spec.label_column, spec.sensitive_column]
    elif spec.role == ROLE_REGISTRY:
        s, names = registry_groups(df, spec, where)
        reserved += [spec.sensitive_column]
    features = df[[c for c in df.columns if c not in reserved]]
    if features.shape[1] == 0:
        raise DataError(f"{where}: no feature columns besides {reserved}")
    text_cols = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    if text_cols:
        raise DataError(
            f"{where}: feature columns must be numbers, {text_cols[:5]} are not (export the table with "
            "python -m fairvfl_flwr.tools.export, which encodes and scales features)"
        )
    nan_cols = features.columns[features.isna().any()].tolist()
    if nan_cols:
        raise DataError(f"{where}: missing values in feature columns {nan_cols[:5]}")
    X = features.to_numpy(dtype=np.float64)
    if not np.isfinite(X).all():
        raise DataError(f"{where}: feature values must be finite")

    ids_arr = ids.to_numpy()
    is_train = (split == TRAIN).to_numpy()
    tr = np.flatnonzero(is_train)[_sorted_ids(ids_arr[is_train])]
    te = np.flatnonzero(~is_train)[_sorted_ids(ids_arr[~is_train])]
    if len(tr) == 0:
        raise DataError(f"{where}: no training rows (split column {spec.split_column!r})")
    return PartyArrays(
        partition_id=spec.partition_id, role=spec.role, feature_names=tuple(map(str, features.columns)),
        X_train=np.ascontiguousarray(X[tr]), X_test=np.ascontiguousarray(X[te]),
        ids_digest=rows_digest(ids_arr[tr], ids_arr[te]), n_train=len(tr), n_test=len(te),
        y_train=None if y is None else y[tr], s_train=None if s is None else s[tr],
        y_test=None if y is None else y[te], s_test=None if s is None else s[te],
        protected_label=spec.protected_label, source=source, group_names=names,
        **registry_ids(spec.role, ids_arr[tr], ids_arr[te]),
    )


# -- what export writes, built in memory for simulation -----------------------------------
def party_table(cfg, ds, partition_id: int):
    """The table of party ``partition_id`` as export writes it (row id, split, its columns)."""
    import pandas as pd

    cols = party_columns(cfg, ds)[partition_id]
    ids = np.concatenate([ds.ids_train, ds.ids_test])
    frame = {ID_COLUMN: ids, SPLIT_COLUMN: [TRAIN] * len(ds.ids_train) + [TEST] * len(ds.ids_test)}
    X = np.concatenate([ds.X_train[:, cols], ds.X_test[:, cols]])
    names = [ds.feature_names[c] for c in cols]
    label, sensitive = active_columns(cfg, ds)
    if partition_id < cfg.num_active:
        frame[label] = np.concatenate([ds.y_train, ds.y_test]).astype(int)
    if holds_groups(cfg, partition_id):
        frame[sensitive] = group_column(ds)
    clash = sorted(set(names) & set(frame))
    if clash:
        raise DataError(f"{ds.source}: feature columns {clash} clash with the row id/split/label/sensitive column names")
    df = pd.DataFrame(frame)
    return pd.concat([df, pd.DataFrame(X, columns=names)], axis=1)


def holds_groups(cfg, partition_id: int) -> bool:
    """Whether party ``partition_id`` of a simulated run holds the sensitive column: the label owner,
    or with groups.holder = "registry" the last party instead."""
    if getattr(cfg, "registry", False):
        return partition_id == cfg.num_parties - 1
    return partition_id < cfg.num_active


def active_columns(cfg, ds) -> tuple[str, str]:
    """Names of the label and sensitive columns in the active party's table."""

    if cfg.dataset == "csv" and cfg.csv_label:
        return cfg.csv_label, cfg.csv_sensitive
    spec = DATASETS.get(ds.name)
    if spec is not None:
        return spec.label_column, spec.sensitive_column
    return "label", "group"


def active_node_config(cfg, ds) -> dict:
    """The label/sensitive part of the active party's node config (export prints it)."""
    label, sensitive = active_columns(cfg, ds)
    s = ds.s_train
    a, b = ds.group_names if s.dtype == bool else ("", "")  # several groups: every value is one
    return {
        "label-column": label, "label-positive": "1", "sensitive-column": sensitive,
        "group-a": str(a), "group-b": str(b), "protected-label": int(ds.protected_label),
    }


def group_column(ds) -> np.ndarray:
    """Each row's group as the active party's table holds it (train rows, then test rows)."""
    s = np.concatenate([ds.s_train, ds.s_test])
    return np.where(s, *ds.group_names) if s.dtype == bool else np.asarray(ds.group_names)[s]


def label_table(ds):
    """The server's label file: row id, split, y (±1), group (a/b; with several groups each row's group
    name), protected (1 if y is the protected label)."""
    import pandas as pd

    y = np.concatenate([ds.y_train, ds.y_test]).astype(int)
    s = np.concatenate([ds.s_train, ds.s_test])
    return pd.DataFrame({
        ID_COLUMN: np.concatenate([ds.ids_train, ds.ids_test]),
        SPLIT_COLUMN: [TRAIN] * len(ds.ids_train) + [TEST] * len(ds.ids_test),
        LABEL_Y: y,
        LABEL_GROUP: np.where(s, "a", "b") if s.dtype == bool else np.asarray(ds.group_names)[s],
        LABEL_PROTECTED: (y == ds.protected_label).astype(int),
    })


def parse_label_table(df, source: str):
    """The server label table → :class:`~fairvfl_flwr.data.problem.ServerLabels` (rows sorted by id)."""

    need = [ID_COLUMN, SPLIT_COLUMN, LABEL_Y, LABEL_GROUP, LABEL_PROTECTED]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise DataError(f"server label file {source}: columns {missing} not found (expected {need})")
    if df[need].isna().any().any():
        raise DataError(f"server label file {source}: missing values")
    if df[ID_COLUMN].duplicated().any():
        raise DataError(f"server label file {source}: duplicate row ids")
    y = df[LABEL_Y].to_numpy()
    if not np.isin(y, (-1, 1)).all():
        raise DataError(f"server label file {source}: column {LABEL_Y!r} must hold 1 or -1")
    groups = df[LABEL_GROUP].astype(str).to_numpy()
    names = tuple(sorted(set(groups.tolist())))
    if len(names) < 2:
        raise DataError(f"server label file {source}: column {LABEL_GROUP!r} must hold two groups or more "
                        f"('a' and 'b', or group names), found {list(names)}")
    prot = df[LABEL_PROTECTED].to_numpy().astype(bool)
    protected = sorted(set(y[prot].tolist()))
    if len(protected) != 1 or set(y[~prot].tolist()) & set(protected):
        raise DataError(f"server label file {source}: column {LABEL_PROTECTED!r} must be 1 exactly for one label value")
    split = df[SPLIT_COLUMN].astype(str).str.strip().str.lower().to_numpy()
    if not np.isin(split, (TRAIN, TEST)).all():
        raise DataError(f"server label file {source}: split column must say 'train' or 'test'")
    ids = df[ID_COLUMN].to_numpy()
    is_train = split == TRAIN
    tr = np.flatnonzero(is_train)[_sorted_ids(ids[is_train])]
    te = np.flatnonzero(~is_train)[_sorted_ids(ids[~is_train])]
    two = names == ("a", "b")  # the paper's case: group a and group b
    s = groups == "a" if two else np.searchsorted(np.asarray(names), groups).astype(np.int64)
    return ServerLabels(
        y_train=y[tr].astype(np.int8), s_train=s[tr], y_test=y[te].astype(np.int8), s_test=s[te],
        protected_label=int(protected[0]), ids_digest=rows_digest(ids[tr], ids[te]),
        group_names=None if two else names,
    )


def server_labels_for(cfg, ds=None):
    """The server's labels: from the run config's ``server-labels`` file, else from the packaged data."""
    path = getattr(cfg, "server_labels", "")
    if path:
        labels = parse_label_table(read_csv(path, "server-labels"), str(path))
    else:
        ds = ds if ds is not None else load_data(cfg)
        labels = parse_label_table(label_table(ds), ds.source or ds.name)
        # the data's names, also for two groups (the label file says only a and b)
        labels = dataclasses.replace(labels, group_names=tuple(ds.group_names))
    return dataclasses.replace(labels, options=group_options(cfg))


# -- loading with the on-disk cache -------------------------------------------------------
def file_digest(path: Path) -> str:
    """SHA-256 of the file's bytes."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def known_digest(path: Path, cache: Path) -> str:
    """The file's SHA-256, read once per version of the file.

    A deployed party starts a fresh process per message, and hashing a 1M-row file costs
    more than loading its parsed arrays, so the digest is remembered under the file's
    identity: path, inode, size, mtime and ctime (in ns). An edit in place changes mtime
    and ctime, and ctime cannot be set back by a user, so a remembered digest never
    outlives the bytes it was computed from.
    """
    st = path.stat()
    stamp = f"{path.resolve()}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    entry = cache / "digests" / f"{hashlib.sha256(stamp.encode()).hexdigest()[:32]}.txt"
    try:
        known = entry.read_text().strip()
        if len(known) == 64:
            return known
    except OSError:
        pass
    digest = file_digest(path)
    try:
        write_atomically(entry, lambda fh: fh.write(digest.encode()))
    except OSError:
        pass  # a read-only cache only costs speed
    return digest


def cache_dir(spec: PartySpec) -> Path:
    """Where the party keeps its parsed tables: its own folder (config/node.party_folder: its node
    config's cache-dir, else FAIRVFL_CACHE_DIR, else the user's cache folder)."""
    return party_folder(spec.cache_dir)


def _cache_key(spec: PartySpec, file_hash: str) -> str:
    opts = dataclasses.asdict(spec)
    for k in ("data_path", "cache_dir"):
        opts.pop(k)
    blob = json.dumps({"v": CACHE_VERSION, "file": file_hash, "opts": opts}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def _save(arrays: PartyArrays, path: Path) -> None:
    meta = {k: getattr(arrays, k) for k in ("partition_id", "role", "feature_names", "ids_digest",
                                             "n_train", "n_test", "protected_label", "source", "group_names")}
    data = {"X_train": arrays.X_train, "X_test": arrays.X_test, "meta": np.array(json.dumps(meta))}
    for k in ("y_train", "s_train", "y_test", "s_test", "ids_train", "ids_test"):
        if getattr(arrays, k) is not None:
            data[k] = getattr(arrays, k)
    write_atomically(path, lambda fh: np.savez(fh, **data))


def registry_ids(role: str, train: np.ndarray, test: np.ndarray) -> dict[str, np.ndarray]:
    """A registry's row ids as text, for :class:`PartyArrays` (other parties keep none)."""
    if role != ROLE_REGISTRY:
        return {}
    return {"ids_train": np.asarray(train).astype(str), "ids_test": np.asarray(test).astype(str)}


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """A cache entry appears whole or not at all: another message's process may read it now."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as fh:
        write(fh)
    os.replace(tmp, path)


def _load(path: Path) -> PartyArrays:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        meta["feature_names"] = tuple(meta["feature_names"])
        meta["group_names"] = tuple(meta.get("group_names", ()))
        extra = {k: z[k] for k in ("y_train", "s_train", "y_test", "s_test", "ids_train", "ids_test") if k in z}
        return PartyArrays(X_train=z["X_train"], X_test=z["X_test"], **meta, **extra)


def load_party_file(spec: PartySpec) -> PartyArrays:
    """Parse the party file, or load it from the cache if this exact file was parsed before."""
    path = Path(spec.data_path)
    if not path.is_file():
        raise DataError(f"{spec.name}: data file {path} not found (node config data-path)")
    cache = cache_dir(spec)
    cached = cache / f"{_cache_key(spec, known_digest(path, cache))}.npz"
    if cached.exists():
        try:
            return _load(cached)
        except Exception:  # a damaged cache entry is rebuilt, never trusted
            pass
    arrays = parse_party_table(read_csv(path, spec.name), spec, str(path))
    try:
        _save(arrays, cached)
    except OSError:
        pass  # a read-only cache only costs speed
    return arrays


def aligned_files(spec: PartySpec, key: str) -> tuple[Path, Path]:
    """Where a party keeps its block prepared after alignment ``key``, and its preprocessing."""
    base = cache_dir(spec) / "aligned" / key
    return base.with_name(key + ".npz"), base.with_name(key + ".preprocessing.json")


def save_aligned(spec: PartySpec, key: str, arrays: PartyArrays, preprocessing: dict) -> None:
    """Keep the prepared block on the party's disk: every later message of the run (a fresh
    process in deployment) loads it instead of reading and preparing the raw table again."""
    npz, side = aligned_files(spec, key)
    write_atomically(side, lambda fh: fh.write(json.dumps(preprocessing, sort_keys=True).encode()))
    _save(arrays, npz)


@functools.lru_cache(maxsize=16)
def load_party(spec: PartySpec, cfg=None) -> PartyArrays:
    """This node's data: its file (deployment) or its slice of the packaged data (simulation).

    ``cfg`` (the RunConfig) is needed only for simulation; cached per process.
    """
    if spec.aligned:
        npz = aligned_files(spec, spec.aligned)[0]
        if not npz.is_file():
            raise DataError(f"{spec.name}: the block prepared at alignment ({npz}) is gone; restart the run")
        return _load(npz)
    if spec.table_path or spec.table_sql:
        raise DataError(f"{spec.name}: its own table is read only after private alignment, the run's first step")
    if spec.data_path:
        return load_party_file(spec)

    ds = load_data(cfg)
    table = party_table(cfg, ds, spec.partition_id)
    if spec.role in (ROLE_ACTIVE, ROLE_REGISTRY):
        given = {k.replace("-", "_"): v for k, v in active_node_config(cfg, ds).items()}
        if spec.role == ROLE_REGISTRY:  # the groups without the label
            given = {k: v for k, v in given.items() if k in ("sensitive_column", "group_a", "group_b")}
        elif not holds_groups(cfg, spec.partition_id):  # the label without the groups
            given.update(sensitive_column="", group_a="", group_b="")
        spec = dataclasses.replace(spec, **given)
    return parse_party_table(table, spec, f"{ds.name} (packaged, partition {spec.partition_id})")
