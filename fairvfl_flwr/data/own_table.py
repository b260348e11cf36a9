"""Local preparation: a party's own raw table becomes its feature block, on its own side.

A party that brings its own table (run config ``tables.own``: a file, or a table or query in
its database, data/sources.py) reads it here, and after private alignment (data/psi.py) turns
the common rows into its block:

* **ids**: the id column is read as text and stripped of surrounding spaces (one rule,
  data/tables.py's :func:`normalise_ids`, which the score files follow too): ``" 007 "``
  and ``"007"`` are one id, ``"7"`` another. Missing
  and duplicate ids are refused, naming the party, file and an example;
* **types**: a column pandas reads as numbers is a number, anything else a category;
  ``tables.types`` overrides (``zip=category,score=number``);
* **missing values**: refused by default, naming file, column and row count; a rule
  named in ``tables.missing`` fills them (``mean``, ``median``, ``mode`` of the training
  rows, or ``value:<v>``), and what was filled is recorded;
* **encoding**: numbers standardised with the training rows' mean and deviation,
  categories one-hot over the values the aligned rows hold, numbers first then the
  categories' indicators (the joint-table path's order, data/tables.py), so the same rows
  with the same split give the same features.

The statistics never leave the party: they become its :class:`Preprocessing`, saved with
its block, which the scoring path applies to new rows.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fairvfl_flwr.data.encoding import Preprocessing
from fairvfl_flwr.data.sources import FileTable, SqlTable, as_source
from fairvfl_flwr.data.tables import BLANK, DataError, Finding, blank_markers, examples, normalise_ids, row_numbers

NUMBER, CATEGORY = "number", "category"
#: Text that usually means "missing" (compared stripped, in any case); "" is a cell of spaces.
LIKELY_MARKERS = ("?", "", "na", "n/a", "null", "unknown", "-")
FILL_RULES = ("mean", "median", "mode")


def id_pattern(value: str) -> str:
    """The shape of an id (digits → 9, letters → a), to show in an error without the id."""
    return re.sub(r"[A-Za-z]", "a", re.sub(r"[0-9]", "9", value))[:40]


@dataclass(frozen=True)
class RawTable:
    """A party's raw table as read: the frame, what its declared missing markers blanked, and
    its id column's problems (or its normalised ids when it has none)."""

    frame: Any  # callers must not change it: it is shared by every reader in this process
    blanked: dict  # column -> cells made missing by a declared marker
    id_problems: tuple[Finding, ...]
    ids: np.ndarray | None  # None when id_problems is not empty
    digest: str = ""  # a database table's SHA-256 of its rows as read (a file's: the source's digest)


def raw_table(source: FileTable | SqlTable | str | Path, id_column: str, who: str,
              missing_values: tuple[str, ...] = ()) -> RawTable:
    """A party's raw table or score file (a path, or the source of data/sources.py), every cell
    equal to one of ``missing_values`` made missing (tables.blank_markers); read once per
    process and version of the table, so that the pre-flight check and the alignment that
    follows it read it once. Refuses, naming ``who`` and the table, one that is missing or
    cannot be read."""
    source = as_source(source)
    stamp = source.stamp(who)
    if stamp is None:  # nothing tells a changed table from the one read before: read it again
        return _read_raw(source, id_column, who, tuple(missing_values))
    return _raw_table(source, id_column, who, stamp, tuple(missing_values))


@functools.lru_cache(maxsize=4)
def _raw_table(source: FileTable | SqlTable, id_column: str, who: str, stamp: Any,
               markers: tuple[str, ...]) -> RawTable:
    return _read_raw(source, id_column, who, markers)


def _read_raw(source: FileTable | SqlTable, id_column: str, who: str, markers: tuple[str, ...]) -> RawTable:
    df, digest = source.read(who, id_column)
    blanked = blank_markers(df, markers, keep_text=(id_column,))
    problems = tuple(id_findings(df, id_column))
    return RawTable(df, blanked, problems, None if problems else normalise_ids(df[id_column].to_numpy()), digest)


def clear_cache() -> None:
    """Forget the tables read in this process, as a fresh process would."""
    _raw_table.cache_clear()


def read_table(source: FileTable | SqlTable | str | Path, id_column: str, who: str,
               missing_values: tuple[str, ...] = ()) -> tuple[np.ndarray, Any]:
    """A party's raw table: its normalised ids and the frame (:func:`raw_table`; callers must
    not change the frame). Refuses, naming ``who`` and the table, the first of
    :func:`id_findings`."""
    raw = raw_table(source, id_column, who, missing_values)
    if raw.id_problems:
        raise raw.id_problems[0].error(f"{who}: {as_source(source).name}")
    return raw.ids, raw.frame


def table_digest(source: FileTable | SqlTable, id_column: str, who: str, missing_values: tuple[str, ...],
                 cache: Path) -> str:
    """The digest a kept alignment of the table is keyed by: a file's bytes (hashed once per
    version of the file), a database table's rows as :func:`raw_table` read them."""
    return source.digest(cache) or raw_table(source, id_column, who, missing_values).digest


def id_findings(df: Any, id_column: str) -> list[Finding]:
    """The id column's problems: not there, missing ids, duplicate ids once spaces are
    stripped (:func:`normalise_ids`)."""
    if id_column not in df.columns:
        more = "..." if df.shape[1] > 10 else ""
        return [Finding("id column not found", f"id column {id_column!r} not found (columns: "
                        f"{examples(map(str, df.columns[:10]))}{more}); set node config id-column")]
    found = []
    col = df[id_column]
    if col.isna().any():
        rows = np.flatnonzero(col.isna().to_numpy())
        found.append(Finding("missing ids", f"id column {id_column!r} has {len(rows)} missing ids",
                             f"rows {row_numbers(rows)}"))
    uniq, counts = np.unique(normalise_ids(col.dropna().to_numpy()), return_counts=True)
    dup = uniq[counts > 1]
    if len(dup):
        found.append(Finding("duplicate ids", f"id column {id_column!r} has {len(dup)} duplicate ids in "
                             f"{int(counts[counts > 1].sum())} rows (after stripping spaces); every row needs its "
                             "own id", f"e.g. {examples(dup)}"))
    return found


def number_like(col: Any) -> tuple[Any, Any]:
    """(the column as numbers, its non-missing cells that are not numbers)."""
    import pandas as pd

    as_num = pd.to_numeric(col, errors="coerce")
    return as_num, col[as_num.isna() & col.notna()]


def likely_markers(col: Any, real: set[str] = frozenset()) -> dict[str, np.ndarray]:
    """The values of a text column that usually mean a missing value (:data:`LIKELY_MARKERS`,
    as written once stripped) and the rows (positions) of each, except those declared real
    categories (``real``, compared in any case). A marker nobody declared would otherwise be
    trained as a category of its own."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(col):
        return {}
    text = col.astype(str).str.strip().where(col.notna())
    low = text.str.lower()
    real = {r.lower() for r in real}
    hit = low.isin(LIKELY_MARKERS) & ~low.isin(real) & col.notna()
    return {str(v): np.flatnonzero((text == v).to_numpy() & hit.to_numpy()) for v in pd.unique(text[hit])}


def marker_finding(column: str, found: dict[str, np.ndarray]) -> Finding | None:
    """The problem of :func:`likely_markers`'s ``found`` in ``column``: each marker with its
    count, and the two ways to declare it; None when nothing was found."""
    if not found:
        return None
    ordered = sorted(found.items(), key=lambda kv: -len(kv[1]))
    shown = ", ".join(f"{v!r} in {len(rows)} cells" for v, rows in ordered)
    markers = ",".join(BLANK if v == "" else v for v, _ in ordered)
    real = ",".join(f"{column}:{v}" for v, _ in ordered)
    return Finding("undeclared marker", f"column {column!r} holds values that usually mean missing: {shown}; if they "
                   f"do, declare them (node config missing-values=\"{markers}\") and name a rule in tables.missing "
                   f"(e.g. '{column}=mode'); if they are real categories, say so (node config real-categories="
                   f"\"{real}\")", "; ".join(f"{v!r} in rows {row_numbers(rows)}" for v, rows in ordered))


def parse_rules(text: str, key: str) -> dict[str, str]:
    """``"a=x,b=y"`` → ``{"a": "x", "b": "y"}``; ``key`` names the setting in an error."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in str(text).split(","))):
        name, sep, rule = item.partition("=")
        if not sep or not name.strip() or not rule.strip():
            raise DataError(f"{key}={text!r}: expected 'column=rule' items separated by commas, got {item!r}")
        out[name.strip()] = rule.strip()
    return out


def type_finding(column: str, declared: str) -> Finding | None:
    """Why a ``tables.types`` entry cannot be read, or None."""
    if declared in (NUMBER, CATEGORY):
        return None
    return Finding("a setting", f"tables.types: column {column!r}: {declared!r} is neither 'number' nor 'category'")


def fill_finding(column: str, rule: str, kind: str | None = None) -> Finding | None:
    """Why a ``tables.missing`` rule cannot fill ``column`` of type ``kind`` (None: the type is
    not known yet, only the rule's form is checked), or None."""
    if rule.startswith("value:"):
        value = rule[len("value:"):]
        if kind == NUMBER:
            try:
                float(value)
            except ValueError:
                return Finding("rule does not fit", f"tables.missing {column}={rule}: column {column!r} holds "
                               f"numbers, {value!r} is not one")
        return None
    if rule not in FILL_RULES:
        return Finding("a setting", f"tables.missing {column}={rule}: choose mean, median, mode or value:<v>")
    if kind == CATEGORY and rule != "mode":
        return Finding("rule does not fit", f"tables.missing {column}={rule}: column {column!r} holds categories; "
                       f"{rule} needs numbers (use {column}=mode or {column}=value:unknown)")
    return None


def _check_rules(types: dict[str, str], missing: dict[str, str]) -> None:
    for found in [*(type_finding(c, t) for c, t in types.items()), *(fill_finding(c, r) for c, r in missing.items())]:
        if found is not None:
            raise DataError(found.text)


@dataclass(frozen=True)
class Prepared:
    """A party's block on its aligned rows, and how it was made."""

    X_train: np.ndarray
    X_test: np.ndarray
    pre: Preprocessing
    record: tuple[dict, ...]  # per column: its type and what was done about missing values


def prepare_block(df: Any, columns: list[str], train_rows: np.ndarray, test_rows: np.ndarray,
                  types: str = "", missing: str = "", where: str = "") -> Prepared:
    """The block of ``df``'s ``columns`` on ``train_rows`` then ``test_rows`` (positions in
    ``df``, in the agreed order); statistics from the training rows only."""
    import pandas as pd

    type_rules, fill_rules = parse_rules(types, "tables.types"), parse_rules(missing, "tables.missing")
    _check_rules(type_rules, fill_rules)
    absent = [c for c in columns if c not in df.columns]
    if absent:
        raise DataError(f"{where}: column(s) {absent[:5]} not found (columns: {list(map(str, df.columns[:10]))})")
    if not columns:
        raise DataError(f"{where}: no feature columns")
    rows = np.concatenate([train_rows, test_rows])
    n_train = len(train_rows)
    frame = df.iloc[rows][columns].reset_index(drop=True)
    record: list[dict] = []
    fill: dict[str, Any] = {}  # column -> the value its missing values become
    kinds: dict[str, str] = {}
    for c in columns:
        col = frame[c]
        kind = type_rules.get(c, NUMBER if pd.api.types.is_numeric_dtype(col) else CATEGORY)
        if kind == NUMBER and not pd.api.types.is_numeric_dtype(col):
            as_num, bad = number_like(col)
            if len(bad):
                raise DataError(f"{where}: column {c!r} (tables.types number) holds {len(bad)} values that are not "
                                "numbers", local=f"e.g. {bad.iloc[:3].tolist()}")
            col = frame[c] = as_num
        kinds[c] = kind
        n_missing = int(col.isna().sum())
        entry: dict = {"column": c, "type": kind, "missing": n_missing}
        rule = fill_rules.get(c)
        if n_missing and rule is None:
            raise DataError(f"{where}: column {c!r} has {n_missing} missing values in the aligned rows; name a "
                            f"rule in tables.missing (e.g. '{c}=median' or '{c}=value:unknown') or fill them")
        if rule is not None:  # also with none missing here: rows scored later may miss values
            value = _fill_value(col.iloc[:n_train].dropna(), kind, rule, c, where)
            frame[c] = col.fillna(value)
            fill[c] = value
            entry.update(rule=rule, value=value)
        record.append(entry)
    numbers = [c for c in columns if kinds[c] == NUMBER]
    cats = [c for c in columns if kinds[c] == CATEGORY]
    text = {c: frame[c].astype(str).to_numpy() for c in cats}
    categories = {c: tuple(str(v) for v in pd.Categorical(text[c]).categories) for c in cats}
    features: list[str] = [*numbers]
    raw: list[str] = [*numbers]
    category: list[str | None] = [None] * len(numbers)
    for c in cats:
        for v in categories[c]:
            features.append(f"{c}_{v}")
            raw.append(c)
            category.append(v)
    X = np.empty((len(frame), len(features)), dtype=np.float64)
    for j, c in enumerate(numbers):
        X[:, j] = frame[c].to_numpy(dtype=np.float64)
    j = len(numbers)
    for c in cats:
        for v in categories[c]:
            X[:, j] = text[c] == v
            j += 1
    if not np.isfinite(X).all():
        raise DataError(f"{where}: feature values must be finite")
    mean = X[:n_train].mean(axis=0)
    std = X[:n_train].std(axis=0)
    std[std == 0] = 1.0  # a constant column stays constant (zero) instead of dividing by 0
    X = (X - mean) / std
    pre = Preprocessing(features=tuple(features), raw=tuple(raw), category=tuple(category),
                        mean=tuple(map(float, mean)), std=tuple(map(float, std)), categories=categories, fill=fill)
    return Prepared(X_train=np.ascontiguousarray(X[:n_train]), X_test=np.ascontiguousarray(X[n_train:]), pre=pre,
                    record=tuple(record))


def _fill_value(train: Any, kind: str, rule: str, column: str, where: str) -> Any:
    """The value missing entries of ``column`` become, from its training rows' values."""
    found = fill_finding(column, rule, kind)
    if found is not None:
        raise DataError(found.text)
    if rule.startswith("value:"):
        value: Any = rule[len("value:"):]
        return float(value) if kind == NUMBER else value
    if not len(train):
        raise DataError(f"{where}: column {column!r}: no training row has a value to compute {rule!r} from")
    value = train.mode().iloc[0] if rule == "mode" else (train.mean() if rule == "mean" else train.median())
    return value.item() if isinstance(value, np.generic) else value
