"""Load, validate, split and standardise the tables FairVFL trains on.

Two entry points:

* :func:`load_dataset` for the three paper datasets that ship with the package
  (``adult``, ``compas``, ``crime``), set up as in the paper (docs/algorithm.md, Datasets);
* :func:`load_csv` for a user's own table: name the label column and its positive
  value, the sensitive column and its two group values, or one or several sensitive
  columns whose every value (combination) is a group.

Both return a :class:`FairDataset`: features standardised with statistics of the
training rows only, labels in {-1, +1}, group membership as a boolean (``True`` =
group *a*) for two named groups, else as group codes into ``group_names``, and the
protected label (the label value whose rows form N^a and N^b).
Every problem with the input is reported as a :class:`DataError` naming the file,
column or count at fault, before any training starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

if TYPE_CHECKING:  # pandas is imported where a table is parsed (import cost on every node)
    import pandas as pd

# pandas is imported where a table is parsed, not here (its import is paid per process): the ClientApp imports this
# module for ids_digest/DataError on every message's fresh process in deployment.

DATA_DIR = Path(__file__).resolve().parent / "datasets"
DATA_ENV = "FAIRVFL_DATA_DIR"


def _data_dirs() -> list[Path]:
    """Where the packaged tables may be.

    ``flwr run`` executes the apps from the FAB, which carries only ``*.py``/``*.toml``
    files, so next to this module there may be no data. Then the installed
    distribution (regular or editable) of ``fairvfl-flwr`` has it.
    """
    dirs = [Path(os.environ[DATA_ENV])] if os.environ.get(DATA_ENV) else []
    dirs.append(DATA_DIR)
    try:
        dist = importlib.metadata.distribution("fairvfl-flwr")
    except importlib.metadata.PackageNotFoundError:
        return dirs
    for f in dist.files or []:
        if f.name.endswith(".csv.gz") and "datasets" in f.parts:
            dirs.append(Path(dist.locate_file(f)).parent)
            break
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    if url.startswith("file://"):  # editable install: the source tree
        dirs.append(Path(urllib.parse.unquote(url[7:])) / "fairvfl_flwr" / "data" / "datasets")
    return dirs


def packaged_file(name: str) -> Path:
    """Path of a packaged table, searched in :func:`_data_dirs` order."""
    dirs = _data_dirs()
    for d in dirs:
        if (d / name).exists():
            return d / name
    raise DataError(
        f"packaged dataset file {name} not found in {', '.join(map(str, dirs))}; "
        f"install the package (pip install -e .) or set {DATA_ENV}"
    )


class DataError(ValueError):
    """The input table cannot be used as given; the message says why.

    ``local``: details that name the party's data (example ids, values), which stay on the
    party: the message shown locally carries them, :attr:`public` (what a refusal sends the
    server) does not."""

    def __init__(self, message: str, local: str = "") -> None:
        super().__init__(f"{message}, {local}" if local else message)
        self.public = f"{message} (examples in this party's own log)" if local else message


class Finding(NamedTuple):
    """One problem of a party's file, found by a check that both the pre-flight (which lists
    every one) and the run (which refuses on the first) call: ``kind`` a few generic words
    (no column, no value), ``text`` what a refusal says, ``local`` its examples (the party's
    own eyes only, as :class:`DataError`'s)."""

    kind: str
    text: str
    local: str = ""

    def error(self, where: str) -> DataError:
        """The refusal of this problem, naming ``where`` (party and file)."""
        return DataError(f"{where}: {self.text}", local=self.local)

    @property
    def full(self) -> str:
        """The text with its examples, as the party's own log shows it."""
        return f"{self.text}, {self.local}" if self.local else self.text


#: How many example values or rows a problem's text shows.
EXAMPLES = 3


def examples(values: Any) -> str:
    """The first few of ``values`` as Python literals, for a problem's text."""
    return ", ".join(repr(v.item() if isinstance(v, np.generic) else v) for v in list(values)[:EXAMPLES])


def row_numbers(positions: np.ndarray) -> str:
    """The first few rows as a person counts them in the file (1 = the first row after the header)."""
    return ", ".join(str(int(p) + 1) for p in positions[:EXAMPLES])


@dataclass(frozen=True)
class DatasetSpec:
    """How to read one table: which columns are label, group and features."""

    name: str
    path: Path
    label_column: str
    positive_value: str
    sensitive_column: str
    group_a: str
    group_b: str
    protected_label: int = 1
    n_train: int | None = None
    train_fraction: float = 0.8
    active_columns: int | None = None
    id_column: str | None = None
    feature_columns: tuple[str, ...] | None = None
    #: columns that are neither features nor used (another spec's sensitive column in the same file)
    unused_columns: tuple[str, ...] = ()
    #: columns the sensitive attribute is computed from (Crime's group is racepctblack > 0.06)
    derived_from: tuple[str, ...] = ()
    #: are the sensitive attribute's columns model inputs? (run config ``sensitive-as-input``)
    sensitive_as_input: bool = False


def _packaged(name: str, file: str, **kwargs) -> DatasetSpec:
    return DatasetSpec(name=name, path=Path(file), id_column="row_id", **kwargs)


#: The paper's datasets (docs/algorithm.md, Datasets): groups, protected label, split and active columns.
DATASETS: dict[str, DatasetSpec] = {
    "adult": _packaged(
        "adult", "adult.csv.gz",
        label_column="income", positive_value=">50K",
        sensitive_column="sex", group_a="Female", group_b="Male",
        protected_label=1, n_train=40_000, active_columns=19,
    ),
    "compas": _packaged(
        "compas", "compas.csv.gz",
        label_column="recidivist", positive_value="yes",
        sensitive_column="race", group_a="African-American", group_b="Caucasian",
        protected_label=-1, n_train=4_800, active_columns=16,
    ),
    "compas-race": _packaged(
        "compas-race", "compas-race.csv.gz",
        label_column="recidivist", positive_value="yes",
        sensitive_column="race", group_a="", group_b="",
        protected_label=-1, n_train=5_600, active_columns=20,
    ),
    "crime": _packaged(
        "crime", "crime.csv.gz",
        label_column="crime", positive_value="high",
        sensitive_column="black_share", group_a=">0.06", group_b="<=0.06",
        protected_label=-1, n_train=1_200, active_columns=49, derived_from=("racepctblack",),
    ),
}
# several groups (docs/fairness-constraints.md, "Several groups"): Adult's file with every value a group
DATASETS["adult-race"] = dataclasses.replace(DATASETS["adult"], name="adult-race", sensitive_column="race",
                                             group_a="", group_b="", unused_columns=("sex",))
DATASETS["adult-sex-race"] = dataclasses.replace(DATASETS["adult"], name="adult-sex-race",
                                                 sensitive_column="sex,race", group_a="", group_b="")


@dataclass
class FairDataset:
    """A train/test split ready for training (all arrays row-aligned).

    ``s_*`` is ``True`` for group *a* (two named groups), else each row's index into
    ``group_names``; ``y_*`` is in {-1, +1}; ``X_*`` is float64, standardised with the
    training rows' mean and standard deviation.
    """

    name: str
    feature_names: list[str]
    X_train: np.ndarray
    y_train: np.ndarray
    s_train: np.ndarray
    ids_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    s_test: np.ndarray
    ids_test: np.ndarray
    protected_label: int
    group_names: tuple[str, ...]
    default_active_columns: int | None = None
    source: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def n_features(self) -> int:
        """Feature columns of the prepared dataset, over all parties."""
        return self.X_train.shape[1]

    def summary(self) -> dict:
        """Row, group and label counts (what the tests and the README quote)."""
        def counts(y, s):
            prot = y == self.protected_label
            if s.dtype != bool:
                return {"rows": int(len(y)), "positive": int((y == 1).sum()),
                        "groups": {name: int((s == k).sum()) for k, name in enumerate(self.group_names)},
                        "protected": {name: int((prot & (s == k)).sum()) for k, name in enumerate(self.group_names)}}
            return {
                "rows": int(len(y)),
                "group_a": int(s.sum()),
                "group_b": int((~s).sum()),
                "positive": int((y == 1).sum()),
                "protected_a": int((prot & s).sum()),
                "protected_b": int((prot & ~s).sum()),
            }

        return {
            "name": self.name,
            "features": self.n_features,
            "sensitive-inputs": list(self.extra.get("sensitive-inputs", [])),
            "train": counts(self.y_train, self.s_train),
            "test": counts(self.y_test, self.s_test),
        }


def available_datasets() -> list[str]:
    """The packaged datasets' names, sorted (the run config's ``dataset`` values besides csv)."""
    return sorted(DATASETS)


def load_dataset(name: str, seed: int = 0, sensitive_as_input: bool = False) -> FairDataset:
    """Load one of the paper's datasets with the paper's split (seeded); its sensitive
    attribute's columns are features only with ``sensitive_as_input`` (the paper's recipe)."""
    if name not in DATASETS:
        raise DataError(
            f"unknown dataset {name!r}: choose one of {', '.join(available_datasets())}"
            " or give a CSV file with csv-path"
        )
    spec = DATASETS[name]
    return _load_spec_cached(dataclasses.replace(spec, path=packaged_file(spec.path.name),
                                                 sensitive_as_input=sensitive_as_input), seed)


def load_csv(
    path: str | Path,
    *,
    label_column: str,
    positive_value: str,
    sensitive_column: str,
    group_a: str,
    group_b: str,
    protected_label: int = 1,
    id_column: str | None = None,
    feature_columns: list[str] | None = None,
    train_fraction: float = 0.8,
    n_train: int | None = None,
    seed: int = 0,
    sensitive_as_input: bool = False,
) -> FairDataset:
    """Load a user's own CSV table.

    Non-numeric feature columns are one-hot encoded; the label and id columns never become
    features, the sensitive column(s) (and a one-hot copy of them, ``race_White``, ...) only
    with ``sensitive_as_input``.
    """
    spec = DatasetSpec(
        name=Path(path).name,
        path=Path(path),
        label_column=label_column,
        positive_value=str(positive_value),
        sensitive_column=sensitive_column,
        group_a=str(group_a),
        group_b=str(group_b),
        protected_label=protected_label,
        n_train=n_train,
        train_fraction=train_fraction,
        id_column=id_column,
        feature_columns=tuple(feature_columns) if feature_columns else None,
        sensitive_as_input=sensitive_as_input,
    )
    return _load_spec_cached(spec, seed)


@functools.lru_cache(maxsize=8)
def _load_spec_cached(spec: DatasetSpec, seed: int) -> FairDataset:
    # Parties and the server in one simulation process load the same table; cache it.
    return _load_spec(spec, seed)


def read_csv(path: str | Path, what: str = "") -> pd.DataFrame:
    """A CSV file as a DataFrame, or a DataError naming ``what`` (the setting or party) and the file."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        # under flwr run the working directory is the SuperLink's, rarely the user's shell's: say which
        tried = ("" if path.is_absolute() else
                 f" (looked for {path.resolve()}: relative to the working directory {Path.cwd()})")
        raise DataError((f"{what}: file {path} not found" if what else f"{path}: file not found") + tried)
    try:
        return pd.read_csv(path)
    except Exception as exc:  # pandas raises many types; the user needs the file name
        where = f"{what}: {path}" if what else f"{path}:"
        raise DataError(f"{where} cannot be read as CSV ({exc})") from exc


PARQUET = ".parquet"


#: How a node config declares cells holding only spaces as missing (an empty CSV cell already is).
BLANK = "<blank>"


def parse_markers(text: Any) -> tuple[str, ...]:
    """The declared missing-value markers: ``"?,NA"`` -> ``("?", "NA")`` (surrounding spaces
    dropped); :data:`BLANK` is the empty text, which a cell of spaces is once stripped."""
    items = text if isinstance(text, (tuple, list)) else str(text or "").split(",")
    out = []
    for m in map(str, items):
        m = m.strip()
        if m == BLANK:
            out.append("")
        elif m:
            out.append(m)
    return tuple(out)


def blank_markers(df: pd.DataFrame, markers: tuple[str, ...], keep_text: tuple[str, ...] = ()) -> dict[str, int]:
    """Make every cell equal to a declared marker missing, in place; cells per column blanked.

    A marker is compared with the cell's text, surrounding spaces stripped (``" ?"`` is
    ``"?"``); a marker that is a number also matches that number in a column of numbers
    (``-999``). A text column that holds only numbers once its markers are gone becomes a
    column of numbers, as if the markers had never been written, except ``keep_text`` (ids:
    ``"007"`` stays text)."""
    import pandas as pd

    counts: dict[str, int] = {}
    if not markers:
        return counts
    numbers = []
    for m in markers:
        try:
            numbers.append(float(m))
        except ValueError:
            pass
    for c in df.columns:
        col = df[c]
        if pd.api.types.is_numeric_dtype(col):
            hit = col.isin(numbers) if numbers else None
        else:
            hit = col.notna() & col.astype(str).str.strip().isin(markers)
        if hit is None or not hit.any():
            continue
        counts[str(c)] = int(hit.sum())
        col = col.mask(hit)
        if not pd.api.types.is_numeric_dtype(col) and c not in keep_text:
            as_num = pd.to_numeric(col, errors="coerce")
            if int(as_num.notna().sum()) == int(col.notna().sum()) and col.notna().any():
                col = as_num
        df[c] = col
    return counts


def read_party_file(path: str | Path, where: str, id_column: str | None, columns: list[str] | None = None,
                    missing_values: tuple[str, ...] = ()) -> pd.DataFrame:
    """A party's raw table or score file: Parquet by its suffix (needs a pandas Parquet engine,
    pyarrow), else CSV; ``id_column`` as text (see :func:`normalise_ids`); only ``columns``
    when given (a file may carry others); every cell equal to one of ``missing_values`` is
    missing (:func:`blank_markers`). A DataError names ``where`` (party and file)."""
    df = _read_party_file(path, where, id_column, columns)
    blank_markers(df, missing_values, keep_text=() if id_column is None else (id_column,))
    return df


def _read_party_file(path: str | Path, where: str, id_column: str | None, columns: list[str] | None
                     ) -> pd.DataFrame:
    import pandas as pd

    path = Path(path)
    if path.suffix.lower() == PARQUET:
        try:
            from pandas.compat._optional import import_optional_dependency  # the engine pandas would use

            import_optional_dependency("pyarrow")
        except ImportError:
            raise DataError(f"{where}: a Parquet file needs the pyarrow package, which is not installed here: "
                            "pip install pyarrow (or give the table as CSV)") from None
        try:
            if columns is not None:
                import pyarrow.parquet as pq

                names = set(pq.read_schema(path).names)
                columns = [c for c in dict.fromkeys(columns) if c in names]
            df = pd.read_parquet(path, engine="pyarrow", columns=columns)
        except Exception as exc:  # pyarrow raises many types; the user needs the file name
            raise DataError(f"{where}: cannot be read as Parquet ({exc})") from exc
        if id_column is not None and id_column in df.columns:  # Parquet keeps types: 7 or 7.0 is the CSV's "7"
            col = df[id_column]
            numbers = pd.api.types.is_numeric_dtype(col) and bool(col.notna().all())
            df[id_column] = as_text(col) if numbers else col.astype(str)
        return df
    try:
        names = None if columns is None else set(pd.read_csv(path, nrows=0).columns)
        return pd.read_csv(path, usecols=None if names is None else [c for c in dict.fromkeys(columns) if c in names],
                           dtype=None if id_column is None else {id_column: str})
    except Exception as exc:  # pandas raises many types; the user needs the file name
        raise DataError(f"{where}: cannot be read as CSV ({exc})") from exc


def as_text(col: pd.Series) -> pd.Series:
    """Values as strings, with integral floats written as integers (1.0 -> "1")."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(col) and np.all(np.mod(col.dropna(), 1) == 0):
        return col.astype("Int64").astype(str)
    return col.astype(str)


def norm_value(value: str) -> str:
    """A label or group value as text the way a CSV and a config both spell it: '1.0' and '1' are '1'."""
    try:
        f = float(value)
        return str(int(f)) if f.is_integer() else str(value)
    except ValueError:
        return str(value)


def _column(df: pd.DataFrame, column: str, path: Path, role: str) -> pd.Series:
    if column not in df.columns:
        shown = ", ".join(map(str, df.columns[:12]))
        raise DataError(f"{path}: {role} column {column!r} not found (columns: {shown}{'...' if df.shape[1] > 12 else ''})")
    col = df[column]
    if col.isna().any():
        raise DataError(f"{path}: {role} column {column!r} has {int(col.isna().sum())} missing values")
    return as_text(col)


def _label(df: pd.DataFrame, spec: DatasetSpec) -> np.ndarray:
    col = _column(df, spec.label_column, spec.path, "label")
    pos = norm_value(spec.positive_value)
    values = sorted(col.unique())
    if pos not in values:
        raise DataError(f"{spec.path}: label column {spec.label_column!r} never equals the positive value {pos!r} (values: {values[:5]})")
    if len(values) != 2:
        raise DataError(
            f"{spec.path}: label column {spec.label_column!r} must hold exactly two values, "
            f"found {len(values)}: {values[:6]}"
        )
    return np.where(col.to_numpy() == pos, 1, -1).astype(np.int8)


def sensitive_columns(spec: Any) -> list[str]:
    """The sensitive column names of a dataset or party spec (``"sex,race"``: two)."""
    return [c.strip() for c in spec.sensitive_column.split(",") if c.strip()]


def _sensitive(df: pd.DataFrame, column: str, path: Path) -> pd.Series:
    """A sensitive column as text; one stored one-hot (``race_White``, ``race_Black``, ...) is decoded."""
    import pandas as pd

    dummies = [c for c in df.columns if str(c).startswith(column + "_")]
    if column not in df.columns and dummies:
        block = df[dummies].to_numpy()
        if not np.all(block.sum(axis=1) == 1):
            raise DataError(f"{path}: sensitive column {column!r} is stored one-hot ({', '.join(dummies[:4])}, ...) "
                            f"but {int((block.sum(axis=1) != 1).sum())} rows have not exactly one of them set")
        return pd.Series(np.asarray([d[len(column) + 1:] for d in dummies])[block.argmax(axis=1)], index=df.index)
    return _column(df, column, path, "sensitive")


def _all_groups(df: pd.DataFrame, spec: DatasetSpec) -> tuple[np.ndarray, tuple[str, ...]]:
    """Every value (combination, over several sensitive columns) is a group: codes and names."""
    cols = sensitive_columns(spec)
    parts = [_sensitive(df, c, spec.path) for c in cols]
    key = parts[0] if len(parts) == 1 else parts[0].str.cat(parts[1:], sep=" & ")
    names = tuple(sorted(key.unique()))
    if len(names) < 2:
        raise DataError(f"{spec.path}: sensitive column(s) {', '.join(map(repr, cols))} hold only {list(names)}; "
                        f"a fairness constraint needs two groups or more")
    return np.searchsorted(np.asarray(names), key.to_numpy()).astype(np.int64), names


def _groups(df: pd.DataFrame, spec: DatasetSpec) -> np.ndarray:
    col = _column(df, spec.sensitive_column, spec.path, "sensitive")
    a, b = norm_value(spec.group_a), norm_value(spec.group_b)
    if a == b:
        raise DataError(f"{spec.path}: the two groups must differ, both are {a!r}")
    other = sorted(set(col.unique()) - {a, b})
    if other:
        raise DataError(
            f"{spec.path}: sensitive column {spec.sensitive_column!r} holds values other than "
            f"{a!r} and {b!r}: {other[:5]} ({int((~col.isin([a, b])).sum())} rows); filter them out first"
        )
    return (col == a).to_numpy()


def _load_spec(spec: DatasetSpec, seed: int) -> FairDataset:
    import pandas as pd

    path = spec.path
    df = read_csv(path)
    if spec.label_column in sensitive_columns(spec):
        raise DataError(f"{path}: label and sensitive column are both {spec.label_column!r}")
    if spec.protected_label not in (-1, 1):
        raise DataError(f"protected label must be +1 or -1, got {spec.protected_label!r}")

    y = _label(df, spec)
    named = bool(spec.group_a or spec.group_b)
    if named and len(sensitive_columns(spec)) > 1:
        raise DataError(f"{path}: group a and b name values of one sensitive column, not of "
                        f"{spec.sensitive_column!r}; leave them empty to take every combination as a group")
    s, group_names = (_groups(df, spec), (spec.group_a, spec.group_b)) if named else _all_groups(df, spec)

    if spec.id_column is not None:
        if spec.id_column not in df.columns:
            raise DataError(f"{path}: id column {spec.id_column!r} not found")
        ids = df[spec.id_column].to_numpy()
        if pd.Series(ids).duplicated().any():
            raise DataError(f"{path}: id column {spec.id_column!r} has duplicate ids")
    else:
        ids = np.arange(len(df))

    encodings = sensitive_encodings(list(df.columns), spec)
    reserved = {spec.label_column, *sensitive_columns(spec), spec.id_column, *spec.unused_columns}
    if not spec.sensitive_as_input:
        reserved |= set(encodings)
    elif not encodings:  # asked for, and the table has no copy of it: the sensitive column itself
        reserved -= set(sensitive_columns(spec))
        encodings = [c for c in sensitive_columns(spec) if c in df.columns]
    if spec.feature_columns is not None:
        missing = [c for c in spec.feature_columns if c not in df.columns]
        if missing:
            raise DataError(f"{path}: feature columns not found: {missing[:5]}")
        clash = [c for c in spec.feature_columns if c in reserved]
        if clash:
            raise DataError(f"{path}: {clash} cannot be both a feature and the label/sensitive/id column")
        features = df[list(spec.feature_columns)]
    else:
        features = df[[c for c in df.columns if c not in reserved]]
    if features.shape[1] == 0:
        raise DataError(f"{path}: no feature columns left after removing label, sensitive and id columns")
    nan_cols = features.columns[features.isna().any()].tolist()
    if nan_cols:
        counts = {c: int(features[c].isna().sum()) for c in nan_cols[:5]}
        raise DataError(f"{path}: missing values (NaN) in feature columns {counts}; impute or drop them first")
    categorical = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    categories = {c: [str(v) for v in pd.Categorical(features[c]).categories] for c in categorical}
    if categorical:
        features = pd.get_dummies(features, columns=categorical, dtype=float)
    X = features.to_numpy(dtype=np.float64)
    if not np.isfinite(X).all():
        raise DataError(f"{path}: feature values must be finite (found inf)")

    n = len(df)
    n_train = spec.n_train if spec.n_train is not None else int(round(spec.train_fraction * n))
    if not 0 < n_train < n:
        raise DataError(f"{path}: cannot take {n_train} training rows out of {n}")
    perm = np.random.default_rng(seed).permutation(n)
    tr, te = np.sort(perm[:n_train]), np.sort(perm[n_train:])

    mean = X[tr].mean(axis=0)
    std = X[tr].std(axis=0)
    std[std == 0] = 1.0  # constant columns stay constant (zero) instead of dividing by 0
    Xs = (X - mean) / std

    ds = FairDataset(
        name=spec.name,
        feature_names=[str(c) for c in features.columns],
        X_train=Xs[tr], y_train=y[tr], s_train=s[tr], ids_train=ids[tr],
        X_test=Xs[te], y_test=y[te], s_test=s[te], ids_test=ids[te],
        protected_label=spec.protected_label,
        group_names=group_names,
        default_active_columns=spec.active_columns,
        source=str(path),
        extra={"encoding": encoding_of([str(c) for c in features.columns], categories),
               "sensitive-inputs": [str(c) for c in encodings] if spec.sensitive_as_input else [],
               "sensitive-left-out": [] if spec.sensitive_as_input else [str(c) for c in encodings],
               "mean": mean.tolist(), "std": std.tolist(), "categories": categories, "id_column": spec.id_column},
    )
    if named:  # several groups: the constraint refuses small or empty ones (min-group-size)
        _check_groups(ds, spec)
    return ds


def sensitive_encodings(columns: list, spec: Any) -> list[str]:
    """The columns of a table that carry its sensitive attribute(s) besides the sensitive
    column itself: a one-hot copy (``race_White``, ``race_Black``, ... for ``race``) and the
    columns the groups are computed from (``derived_from``)."""
    names = sensitive_columns(spec)
    onehot = [str(c) for c in columns if any(str(c).startswith(f"{s}_") for s in names)]
    return onehot + [c for c in getattr(spec, "derived_from", ()) if c in columns]


def encoding_of(feature_names: list[str], categories: dict[str, list[str]]) -> list[tuple[str, str | None]]:
    """(raw column, category or None) of each feature: how a raw row becomes the feature vector
    (what a party saves with its block to score new rows, data/encoding.py)."""
    dummies = {f"{c}_{v}": (c, v) for c, values in categories.items() for v in values}
    return [dummies.get(name, (name, None)) for name in feature_names]


def _check_groups(ds: FairDataset, spec: DatasetSpec) -> None:
    prot = ds.y_train == ds.protected_label
    label = spec.positive_value if ds.protected_label == 1 else f"not {spec.positive_value}"
    for name, in_group in ((spec.group_a, ds.s_train), (spec.group_b, ~ds.s_train)):
        if not (prot & in_group).any():
            raise DataError(
                f"{spec.path}: group {name!r} of {spec.sensitive_column!r} has no training rows "
                f"with the protected label ({spec.label_column} {label}); DEO is undefined"
            )


def normalise_ids(values) -> np.ndarray:
    """The one id rule, for every table a party reads (its own table, its score file): an id
    is text, surrounding spaces stripped. ``" 007 "`` and ``"007"`` are one id, ``"7"``
    another: an id column is read as text, never as numbers, so leading zeros stay."""
    return np.char.strip(np.asarray(values, dtype=str))


def ids_digest(ids: np.ndarray) -> str:
    """A digest of an ordered id list: equal digests mean the same rows in the same order."""
    return hashlib.sha256(np.asarray(ids).astype(str).astype("U").tobytes()).hexdigest()[:16]
