"""Local preparation: a party's own raw table becomes its feature block, on its own side.

A party that brings its own table (run config ``tables.own``) reads it here, and after
private alignment (data/psi.py) turns the common rows into its block:

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

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fairvfl_flwr.data.encoding import Preprocessing
from fairvfl_flwr.data.tables import DataError, normalise_ids, read_party_file

NUMBER, CATEGORY = "number", "category"
FILL_RULES = ("mean", "median", "mode")


def id_pattern(value: str) -> str:
    """The shape of an id (digits → 9, letters → a), to show in an error without the id."""
    return re.sub(r"[A-Za-z]", "a", re.sub(r"[0-9]", "9", value))[:40]


def read_table(path: str | Path, id_column: str, who: str, missing_values: tuple[str, ...] = ()
               ) -> tuple[np.ndarray, Any]:
    """A party's raw table (CSV, or Parquet by suffix): its normalised ids and the frame, every
    cell equal to one of ``missing_values`` made missing (tables.blank_markers).

    Refuses, naming ``who`` and the file: a missing file or id column, missing ids,
    duplicate ids (with an example)."""
    p = Path(path).expanduser()
    where = f"{who}: {p}"
    if not p.is_file():
        raise DataError(f"{where}: file not found")
    df = read_party_file(p, where, id_column, missing_values=missing_values)
    if id_column not in df.columns:
        shown = ", ".join(map(str, df.columns[:10]))
        raise DataError(f"{where}: id column {id_column!r} not found (columns: {shown}"
                        f"{'...' if df.shape[1] > 10 else ''})")
    col = df[id_column]
    if col.isna().any():
        raise DataError(f"{where}: id column {id_column!r} has {int(col.isna().sum())} missing ids")
    ids = normalise_ids(col.to_numpy())
    uniq, counts = np.unique(ids, return_counts=True)
    if len(uniq) != len(ids):
        dup = uniq[counts > 1]
        raise DataError(f"{where}: id column {id_column!r} has {len(dup)} duplicate ids (after stripping spaces); "
                        "every row needs its own id", local=f"e.g. {dup[:3].tolist()}")
    return ids, df


def parse_rules(text: str, key: str) -> dict[str, str]:
    """``"a=x,b=y"`` → ``{"a": "x", "b": "y"}``; ``key`` names the setting in an error."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in str(text).split(","))):
        name, sep, rule = item.partition("=")
        if not sep or not name.strip() or not rule.strip():
            raise DataError(f"{key}={text!r}: expected 'column=rule' items separated by commas, got {item!r}")
        out[name.strip()] = rule.strip()
    return out


def _check_rules(types: dict[str, str], missing: dict[str, str]) -> None:
    for c, t in types.items():
        if t not in (NUMBER, CATEGORY):
            raise DataError(f"tables.types: column {c!r}: {t!r} is neither 'number' nor 'category'")
    for c, r in missing.items():
        if r not in FILL_RULES and not r.startswith("value:"):
            raise DataError(f"tables.missing: column {c!r}: {r!r}; choose mean, median, mode or value:<v>")


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
            as_num = pd.to_numeric(col, errors="coerce")
            bad = col[as_num.isna() & col.notna()]
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
    if rule.startswith("value:"):
        value: Any = rule[len("value:"):]
        if kind == NUMBER:
            try:
                return float(value)
            except ValueError:
                raise DataError(f"tables.missing: column {column!r} holds numbers; {rule!r} is not one") from None
        return value
    if kind == CATEGORY and rule != "mode":
        raise DataError(f"tables.missing: column {column!r} holds categories; {rule!r} needs numbers "
                        "(use mode or value:<v>)")
    if not len(train):
        raise DataError(f"{where}: column {column!r}: no training row has a value to compute {rule!r} from")
    value = train.mode().iloc[0] if rule == "mode" else (train.mean() if rule == "mean" else train.median())
    return value.item() if isinstance(value, np.generic) else value
