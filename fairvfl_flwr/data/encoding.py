"""A party's preprocessing: how its raw rows become its feature block, and the rows it scores.

Training standardises every feature with the training rows' mean and standard deviation
and one-hot encodes text columns (data/tables.py). A party that scores new rows must
apply exactly that transformation to its own raw columns, so it saves it next to its
block (data/model_files.py): for each feature of its block, the raw column it comes from, the
category it indicates (one-hot) or none (a number), and the mean and deviation it was
scaled with; for each text column, the categories seen in training.

Where it comes from:

* simulation: the packaged table's statistics (``FairDataset.extra``), for the party's
  columns;
* deployment: the sidecar ``party<k>.preprocessing.json`` that ``tools/export.py``
  writes next to each party file; a party file without one already holds encoded,
  scaled features, and the rows it scores must too (identity preprocessing).

:func:`score_rows` reads the rows a party scores (its raw file, or in simulation the
packaged test rows) and refuses, naming the party, file and column, a missing column, a
value that is not a number, a category training never saw, and missing or duplicate ids.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fairvfl_flwr.config.node import NodeConfig
from fairvfl_flwr.data.partydata import (CACHE_VERSION, PartySpec, aligned_files, cache_dir, known_digest, load_party,
                                        write_atomically)
from fairvfl_flwr.data.tables import read_csv
from fairvfl_flwr.data.problem import load_data, party_columns
from fairvfl_flwr.data.tables import (DATASETS, DataError, FairDataset, ids_digest, normalise_ids, packaged_file,
                                     read_party_file)

SIDECAR_SUFFIX = ".preprocessing.json"


@dataclass(frozen=True)
class Preprocessing:
    """Raw columns → one party's feature block (float64, in block order)."""

    features: tuple[str, ...]  # the block's feature names
    raw: tuple[str, ...]  # raw column of each feature
    category: tuple[str | None, ...]  # the category a one-hot feature indicates; None: a number
    mean: tuple[float, ...]
    std: tuple[float, ...]
    categories: dict[str, tuple[str, ...]]  # every category training saw, per text column
    fill: dict[str, Any] = field(default_factory=dict)  # raw column -> what its missing values become
    #: the party's protected columns (its sensitive ones, node config protected-columns), each with
    #: whether it is a model input: the model card says so
    protected: tuple[str, ...] = ()

    @property
    def raw_columns(self) -> list[str]:
        """The raw columns the party needs, in first-use order."""
        return list(dict.fromkeys(self.raw))

    def to_dict(self) -> dict:
        """The preparation as JSON-ready lists, as a saved block's metadata and the sidecar file keep it."""
        return {"features": list(self.features), "raw": list(self.raw), "category": list(self.category),
                "mean": list(self.mean), "std": list(self.std),
                "categories": {k: list(v) for k, v in self.categories.items()},
                # only when set: a block saved without fill rules keeps its digest
                **({"fill": dict(self.fill)} if self.fill else {}),
                **({"protected": {c: c in self.raw for c in self.protected}} if self.protected else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "Preprocessing":
        """Read a :meth:`to_dict`, refusing one whose per-feature lists differ in length."""
        n = len(d["features"])
        if not all(len(d[k]) == n for k in ("raw", "category", "mean", "std")):
            raise DataError("preprocessing: features, raw, category, mean and std must have one entry per feature")
        return cls(features=tuple(d["features"]), raw=tuple(d["raw"]),
                   category=tuple(None if c is None else str(c) for c in d["category"]),
                   mean=tuple(float(v) for v in d["mean"]), std=tuple(float(v) for v in d["std"]),
                   categories={k: tuple(map(str, v)) for k, v in d.get("categories", {}).items()},
                   fill=dict(d.get("fill", {})), protected=tuple(d.get("protected", {})))

    def digest(self) -> str:
        """A short hash of the preparation: two parties or runs with the same digest prepare rows alike."""
        # which columns are protected does not change how rows are prepared
        what = {k: v for k, v in self.to_dict().items() if k != "protected"}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]

    def apply(self, df: Any, where: str, order: np.ndarray | None = None) -> np.ndarray:
        """The feature block of the rows of ``df`` (a pandas DataFrame of raw columns), in the
        row order ``order`` if given (built in place: one block-sized array, no sorted copy)."""
        import pandas as pd

        take = (lambda v: v) if order is None else (lambda v: v[order])

        missing = [c for c in self.raw_columns if c not in df.columns]
        if missing:
            raise DataError(f"{where}: column(s) {missing[:5]} not found; this party's block needs the raw columns "
                            f"{self.raw_columns[:12]}{'...' if len(self.raw_columns) > 12 else ''}")
        if self.fill:
            df = df.fillna({c: v for c, v in self.fill.items() if c in df.columns})
        for c in self.raw_columns:
            if df[c].isna().any():
                raise DataError(f"{where}: column {c!r} has {int(df[c].isna().sum())} missing values")
        text = {c: df[c].astype(str).to_numpy() for c in self.categories if c in self.raw_columns}
        for c, values in text.items():
            unseen = sorted(set(np.unique(values)) - set(self.categories[c]))
            if unseen:
                raise DataError(f"{where}: column {c!r} holds categories training never saw: {unseen[:5]} "
                                f"({int(np.isin(values, unseen).sum())} rows; seen: {list(self.categories[c])[:8]})")
        X = np.empty((len(df), len(self.features)), dtype=np.float64)
        numbers: dict[str, np.ndarray] = {}
        for j, (raw, cat) in enumerate(zip(self.raw, self.category)):
            if cat is not None:
                X[:, j] = take(text[raw] == cat)
                continue
            if raw not in numbers:
                if not pd.api.types.is_numeric_dtype(df[raw]):
                    bad = df[raw][pd.to_numeric(df[raw], errors="coerce").isna()].iloc[:3].tolist()
                    raise DataError(f"{where}: column {raw!r} must hold numbers, found {bad}")
                numbers[raw] = take(df[raw].to_numpy(dtype=np.float64))
            X[:, j] = numbers[raw]
        if not np.isfinite(X).all():
            raise DataError(f"{where}: feature values must be finite")
        X -= np.asarray(self.mean)  # in place: the same values as (X - mean) / std
        X /= np.asarray(self.std)
        return X


def identity(features: tuple[str, ...] | list[str]) -> Preprocessing:
    """A block whose raw columns are its features, already scaled (a party file without a sidecar)."""
    n = len(features)
    return Preprocessing(tuple(features), tuple(features), (None,) * n, (0.0,) * n, (1.0,) * n, {})


def for_columns(ds: FairDataset, cols: np.ndarray) -> Preprocessing:
    """The preprocessing of the dataset's feature columns ``cols`` (one party's block)."""
    if "encoding" not in ds.extra:  # a table built in memory (synthetic): its features are the raw columns
        return identity([ds.feature_names[c] for c in cols])
    enc, cats = ds.extra["encoding"], ds.extra["categories"]
    raw = [enc[c][0] for c in cols]
    return Preprocessing(
        features=tuple(ds.feature_names[c] for c in cols), raw=tuple(raw),
        category=tuple(enc[c][1] for c in cols),
        mean=tuple(float(ds.extra["mean"][c]) for c in cols), std=tuple(float(ds.extra["std"][c]) for c in cols),
        categories={r: tuple(cats[r]) for r in dict.fromkeys(raw) if r in cats},
    )


def sidecar_path(data_path: str | Path) -> Path:
    """Where export writes a party file's preprocessing (``party0.csv`` → ``party0.preprocessing.json``)."""
    p = Path(data_path)
    return p.with_name(p.name.removesuffix(".gz").removesuffix(".csv") + SIDECAR_SUFFIX)


def protected_columns(spec: PartySpec) -> tuple[str, ...]:
    """A party's protected columns: the label owner's sensitive column(s), then those its node
    config declares (``protected-columns``)."""
    own = tuple(c.strip() for c in spec.sensitive_column.split(",") if c.strip()) if spec.role == "active" else ()
    return tuple(dict.fromkeys((*own, *spec.protected_columns)))


def party_preprocessing(spec: PartySpec, cfg: Any) -> Preprocessing:
    """This party's preprocessing (see the module doc)."""
    if spec.aligned:  # prepared from the party's own table after alignment (data/own_table.py)
        side = aligned_files(spec, spec.aligned)[1]
        try:
            pre = Preprocessing.from_dict(json.loads(side.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{spec.name}: {side} cannot be read as preprocessing ({exc})") from None
        return dataclasses.replace(pre, protected=protected_columns(spec))
    if not spec.data_path:
        ds = load_data(cfg)
        return for_columns(ds, party_columns(cfg, ds)[spec.partition_id])
    names = load_party(spec).feature_names
    side = sidecar_path(spec.data_path)
    if not side.is_file():
        return identity(names)
    try:
        pre = Preprocessing.from_dict(json.loads(side.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{spec.name}: {side} cannot be read as preprocessing ({exc})") from None
    if tuple(pre.features) != tuple(names):
        raise DataError(f"{spec.name}: {side} describes features {list(pre.features)[:5]}..., the party file holds "
                        f"{list(names)[:5]}...; re-export the files")
    return pre


# -- the rows a party scores ----------------------------------------------------------------
def score_file(spec: PartySpec, node: NodeConfig, cfg: Any) -> tuple[str, str]:
    """(path, where it was named) of the file this party scores: a deployed party only the
    file its node config's ``score-path`` names; a simulated one run config ``score.path``."""
    if node.score_path or node.has_table:
        return node.score_path, "node config score-path"
    return cfg.score_path.replace("{partition}", str(spec.partition_id)), f"run config score.path={cfg.score_path!r}"


def common_score_rows(rows: "ScoreRows", common: np.ndarray) -> "ScoreRows":
    """The rows whose ids are among ``common`` (found by private alignment), in id order."""
    keep = np.flatnonzero(np.isin(np.char.strip(rows.ids.astype(str)), common))
    # a party's file order depends on its other ids (all digits or not): order the common ones alone
    keep = keep[_order(rows.ids[keep])]
    ids = rows.ids[keep]
    return ScoreRows(ids=ids, X=rows.X[keep], ids_digest=ids_digest(ids), source=rows.source)


@dataclass(frozen=True)
class ScoreRows:
    """A party's rows to score, sorted by id, as its feature block."""

    ids: np.ndarray  # sorted; text
    X: np.ndarray
    ids_digest: str
    source: str


def _order(ids: np.ndarray) -> np.ndarray:
    """Rows by id: numbers numerically; text ids made of digits by length then text (numeric
    order where there are no leading zeros), other text ids as text. Every party holding the
    same ids gets the same order."""
    if np.issubdtype(ids.dtype, np.number):
        return np.argsort(ids, kind="stable")
    text = ids.astype(str)
    if len(text) and np.char.isdigit(text).all():
        return np.lexsort((text, np.char.str_len(text)))
    return np.argsort(text, kind="stable")


def rows_from_frame(df: Any, id_column: str | None, pre: Preprocessing, where: str) -> ScoreRows:
    """Check the ids, apply the preprocessing, sort by id."""
    if id_column is None:  # a table without an id column: rows are known by their position in it
        ids = df.index.to_numpy()
    else:
        if id_column not in df.columns:
            raise DataError(f"{where}: id column {id_column!r} not found (columns: {list(map(str, df.columns[:10]))})")
        col = df[id_column]
        if col.isna().any():
            raise DataError(f"{where}: id column {id_column!r} has {int(col.isna().sum())} missing values")
        ids = col.to_numpy()
        if not np.issubdtype(ids.dtype, np.number):  # a file's ids: text, by the one id rule
            ids = normalise_ids(ids)
        uniq, counts = np.unique(ids, return_counts=True)
        if len(uniq) != len(ids):
            raise DataError(f"{where}: id column {id_column!r} has duplicate ids",
                            local=f"e.g. {uniq[counts > 1][:3].tolist()}")
    if len(df) == 0:
        raise DataError(f"{where}: no rows to score")
    order = _order(ids)
    X = pre.apply(df, where, order)
    sorted_ids = ids[order].astype(str)
    return ScoreRows(ids=sorted_ids, X=X, ids_digest=ids_digest(sorted_ids), source=where)


@functools.lru_cache(maxsize=2)
def packaged_test_frame(cfg: Any) -> tuple[Any, str | None, str]:
    """The raw rows of the run's test split (validation split with ``validation-fraction``)
    from the packaged table or ``csv.path``: (frame, id column, name). Cached: in simulation
    every party of the process reads the same table; callers must not change the frame."""
    ds = load_data(cfg)
    if cfg.dataset == "csv":
        path, id_column = Path(cfg.csv_path).expanduser(), (cfg.csv_id_column or None)
    else:
        path, id_column = packaged_file(DATASETS[cfg.dataset].path.name), DATASETS[cfg.dataset].id_column
    df = read_csv(path, f"{cfg.dataset} table")
    if id_column is None:
        df = df.iloc[np.sort(ds.ids_test)]
    else:
        df = df[df[id_column].isin(ds.ids_test)]
    split = "validation" if cfg.validation_fraction > 0 else "test"
    return df, id_column, f"{cfg.dataset} ({split} rows of {path.name})"


def read_columns(path: str, columns: list[str], where: str, id_column: str | None = None,
                 missing_values: tuple[str, ...] = ()) -> Any:
    """The file's columns among ``columns`` only (a score file may carry others, e.g. a label);
    ``id_column`` as text (tables.normalise_ids: "007" stays "007"); cells equal to one of
    ``missing_values`` missing, as in training. CSV, or Parquet by suffix."""
    return read_party_file(path, where, id_column, columns, missing_values)


def _disk_cached(spec: PartySpec, path: str, pre: Preprocessing, id_column: str) -> ScoreRows:
    """Parse a score file once per file content and preprocessing: in deployment every
    message may run in a fresh ClientApp process, and a job asks for its rows chunk by chunk."""
    content = known_digest(Path(path), cache_dir(spec))  # hashed once per version of the file
    markers = f"|{','.join(spec.missing_values)}" if spec.missing_values else ""
    key = hashlib.sha256(f"{content}|{pre.digest()}|{id_column}|ids-as-text|{CACHE_VERSION}{markers}".encode())
    cached = cache_dir(spec) / f"score-{key.hexdigest()[:32]}.npz"
    where = f"{spec.name}: score file {path}"
    if cached.exists():
        try:
            with np.load(cached, allow_pickle=False) as z:
                return ScoreRows(ids=z["ids"], X=z["X"], ids_digest=str(z["digest"]), source=where)
        except Exception:  # noqa: BLE001  (a damaged cache entry is rebuilt, never trusted)
            pass
    frame = read_columns(path, [id_column, *pre.raw_columns], where, id_column, spec.missing_values)
    rows = rows_from_frame(frame, id_column, pre, where)
    try:
        write_atomically(cached, lambda fh: np.savez(fh, ids=rows.ids, X=rows.X, digest=np.array(rows.ids_digest)))
    except OSError:
        pass  # a read-only cache only costs speed
    return rows


@functools.lru_cache(maxsize=8)
def _cached_rows(key: tuple, pre_json: str, spec: PartySpec, cfg: Any, path: str) -> ScoreRows:
    pre = Preprocessing.from_dict(json.loads(pre_json))
    if path:
        return _disk_cached(spec, path, pre, spec.id_column)
    df, idc, name = packaged_test_frame(cfg)
    return rows_from_frame(df, idc, pre, f"{spec.name}: {name}")


def score_rows(spec: PartySpec, cfg: Any, pre: Preprocessing, score_path: str = "",
               source: str = "node config score-path") -> ScoreRows:
    """The rows this party scores: its raw file ``score_path`` (deployment: node config
    ``score-path``; simulation: run config ``score.path``, named by ``source``), else in
    simulation the packaged test rows. Cached per process and file version, and a score
    file's parsed rows on the party's disk (node config ``cache-dir``)."""
    if not score_path and spec.data_path:
        raise DataError(f"{spec.name}: node config score-path is not set; give this party's file of rows to score "
                        "(its raw columns and the id column; run config score.path is read only by simulated parties)")
    key: tuple = ()
    if score_path:
        p = Path(score_path).expanduser()
        if not p.is_file():
            raise DataError(f"{spec.name}: score file {p} not found ({source})")
        st = os.stat(p)
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
        score_path = str(p)
    return _cached_rows(key, json.dumps(pre.to_dict(), sort_keys=True), spec, cfg, score_path)


def clear_cache() -> None:
    """Forget the rows parsed in this process (the disk cache stays), as a fresh process would."""
    _cached_rows.cache_clear()
