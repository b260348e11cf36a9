"""Pre-flight: every problem of a party's own table found at once, on the party's own machine.

A run whose parties bring their own tables (``tables.own``) reads each table only after
the run has started; a refusal there names one problem and costs a retry. This check
reads the table once and lists every problem it finds, so that a party can fix them all
before the run (``fairvfl-preflight``, tools/preflight.py) and the run can refuse them all
before alignment (each party checks its own table in the first alignment step; only the
number of problems leaves the party, the details stay in its own log).

What is checked, for the table of a node config (``--node-config`` syntax):

* the id column: present, no missing ids, no duplicate ids;
* the declared missing markers (node config ``missing-values``, run config
  ``tables.missing-values``): how many cells each column loses to them;
* every feature column with missing values: the rule it needs in ``tables.missing``, by its
  type (a number: mean, median or a number; a category: mode or a value), and a rule that
  does not fit the type; a column of numbers with a few text values (an undeclared marker)
  and a ``tables.types`` number column holding text;
* the label owner's label column: exactly the two declared values (label-positive, and
  label-negative or the one other value); anything else with its count and example rows;
* its sensitive column(s): the declared groups only, and each group's rows in the subset the
  constraint compares (``min-group-size``);
* a score file (node config ``score-path``): its id column and ids, and with a saved block
  (``block.json``) every raw column the block needs, missing values without a fill rule and
  categories training never saw.

Each :class:`Problem` has a kind (a few generic words, no column and no value) and its text
(columns, counts, example values and rows: the party's own eyes only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fairvfl_flwr.core.constraints import ConstraintSet
from fairvfl_flwr.data.partydata import (ROLE_ACTIVE, PartySpec, describe_labels, group_columns, group_values,
                                         label_arrays, reserved_columns, unexpected_labels)
from fairvfl_flwr.data.own_table import CATEGORY, FILL_RULES, NUMBER, parse_rules
from fairvfl_flwr.data.encoding import Preprocessing
from fairvfl_flwr.data.tables import DataError, as_text, blank_markers, norm_value, normalise_ids, read_party_file

#: A column whose values are numbers but for this share of its cells is taken to hold an undeclared marker.
MOSTLY_NUMBERS = 0.9
EXAMPLES = 3


@dataclass(frozen=True)
class Problem:
    """One problem: ``kind`` may leave the party (no column, no value); ``text`` may not."""

    kind: str
    text: str


@dataclass
class Report:
    """Every problem of one party's files, and what the check saw (notes)."""

    who: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, kind: str, text: str) -> None:
        """Note one problem of the party's files (``kind`` may leave the party; ``text`` stays in its own log)."""
        self.problems.append(Problem(kind, text))

    @property
    def ok(self) -> bool:
        """True when the check found no problem."""
        return not self.problems

    def summary(self) -> str:
        """What may leave the party: its number of problems and their kinds, no column, no value."""
        if self.ok:
            return "no problems"
        kinds = sorted({p.kind for p in self.problems})
        n = len(self.problems)
        return f"{n} problem{'s' if n != 1 else ''} ({', '.join(kinds)})"

    def text(self) -> str:
        """The full report, for the party's own eyes."""
        head = f"{self.who}: {self.summary()}"
        lines = [head, *(f"  {i}. [{p.kind}] {p.text}" for i, p in enumerate(self.problems, 1))]
        if self.notes:
            lines += ["  seen:", *(f"  - {n}" for n in self.notes)]
        return "\n".join(lines)


@dataclass(frozen=True)
class Rules:
    """The run-config settings the check reads (defaults: the run config's)."""

    types: str = ""
    missing: str = ""
    min_group_size: int = 30
    pool_small_groups: bool = False
    constraint: str = "deo"

    @classmethod
    def of(cls, cfg: Any) -> "Rules":
        """The rules of a RunConfig."""
        return cls(types=cfg.tables_types, missing=cfg.tables_missing, min_group_size=cfg.min_group_size,
                   pool_small_groups=cfg.pool_small_groups, constraint=cfg.constraint)


def _examples(values: Any) -> str:
    return ", ".join(repr(v.item() if isinstance(v, np.generic) else v) for v in list(values)[:EXAMPLES])


def _rows(positions: np.ndarray) -> str:
    """Rows as a person counts them in the file (1 = the first row after the header)."""
    return ", ".join(str(int(p) + 1) for p in positions[:EXAMPLES])


def check_party(spec: PartySpec, rules: Rules = Rules(), score_path: str = "", block: str | Path = "") -> Report:
    """Every problem of the party's own table (``spec.table_path``) and, if given, of its
    score file against its saved ``block`` folder (module doc). Never raises on bad data."""
    report = Report(spec.name)
    try:
        type_rules, fill_rules = parse_rules(rules.types, "tables.types"), parse_rules(rules.missing, "tables.missing")
    except DataError as exc:
        report.add("a setting", str(exc))
        type_rules, fill_rules = {}, {}
    df = _read(report, spec.table_path, spec, "table")
    if df is not None:
        _check_ids(report, df, spec.id_column, "table")
        features = _feature_columns(report, df, spec)
        for c in features:
            _check_column(report, df[c], c, type_rules.get(c), fill_rules.get(c))
        if spec.role == ROLE_ACTIVE:
            _check_labels(report, df, spec, rules)
        report.notes.append(f"table: {len(df)} rows, {len(features)} feature columns "
                            f"({', '.join(map(str, features[:12]))}{'...' if len(features) > 12 else ''})")
    if score_path:
        _check_score_file(report, spec, score_path, block, df, fill_rules)
    return report


def _read(report: Report, path: str, spec: PartySpec, what: str) -> Any:
    """The file with the declared markers blanked (their counts noted), or None (a problem)."""
    p = Path(path).expanduser()
    if not p.is_file():
        report.add(f"{what} not found", f"{what} {p}: file not found")
        return None
    try:
        df = read_party_file(p, f"{spec.name}: {p}", spec.id_column)
    except DataError as exc:
        report.add(f"{what} unreadable", str(exc))
        return None
    blanked = blank_markers(df, spec.missing_values, keep_text=(spec.id_column,))
    if spec.missing_values:
        where = ", ".join(f"{c} {n}" for c, n in sorted(blanked.items(), key=lambda kv: -kv[1])[:10]) or "none"
        report.notes.append(f"{what}: missing markers {list(spec.missing_values)}: {sum(blanked.values())} cells "
                            f"blanked ({where})")
    return df


def _check_ids(report: Report, df: Any, id_column: str, what: str) -> None:
    if id_column not in df.columns:
        report.add("id column not found", f"{what}: id column {id_column!r} not found (columns: "
                   f"{_examples(map(str, df.columns[:10]))}...); set node config id-column")
        return
    col = df[id_column]
    if col.isna().any():
        rows = np.flatnonzero(col.isna().to_numpy())
        report.add("missing ids", f"{what}: id column {id_column!r} has {len(rows)} missing ids (rows {_rows(rows)})")
    ids = normalise_ids(col.dropna().to_numpy())
    uniq, counts = np.unique(ids, return_counts=True)
    dup = uniq[counts > 1]
    if len(dup):
        report.add("duplicate ids", f"{what}: id column {id_column!r} has {len(dup)} duplicate ids in "
                   f"{int(counts[counts > 1].sum())} rows (after stripping spaces), e.g. {_examples(dup)}; every "
                   "row needs its own id")


def _feature_columns(report: Report, df: Any, spec: PartySpec) -> list[str]:
    reserved = reserved_columns(df, spec)
    if spec.columns:
        absent = [c for c in spec.columns if c not in df.columns]
        if absent:
            report.add("columns not found", f"node config columns names {absent[:5]}, not in the table")
        clash = sorted(reserved & set(spec.columns))
        if clash:
            report.add("columns not allowed", f"node config columns names {clash}, its id, label or sensitive "
                       "column; those never become features")
        return [c for c in spec.columns if c in df.columns and c not in reserved]
    columns = [str(c) for c in df.columns if c not in reserved]
    if not columns:
        report.add("no feature columns", f"no feature columns besides {sorted(reserved)}")
    return columns


def _number_like(col: Any) -> tuple[Any, Any]:
    """(the column as numbers, its non-missing cells that are not numbers)."""
    import pandas as pd

    as_num = pd.to_numeric(col, errors="coerce")
    return as_num, col[as_num.isna() & col.notna()]


def _check_column(report: Report, col: Any, name: str, declared: str | None, rule: str | None) -> None:
    """A feature column: its type, the text among numbers, its missing values and their rule."""
    import pandas as pd

    if declared not in (None, NUMBER, CATEGORY):
        report.add("a setting", f"tables.types: column {name!r}: {declared!r} is neither 'number' nor 'category'")
        declared = None
    kind = declared or (NUMBER if pd.api.types.is_numeric_dtype(col) else CATEGORY)
    if not pd.api.types.is_numeric_dtype(col) and declared != CATEGORY:
        _, bad = _number_like(col)
        share = 1 - len(bad) / max(1, int(col.notna().sum()))
        if declared == NUMBER and len(bad):
            report.add("text in a number column", f"column {name!r} (tables.types number) holds {len(bad)} values "
                       f"that are not numbers, e.g. {_examples(pd.unique(bad))} (rows {_rows(np.flatnonzero(col.isin(bad)))})")
        elif share >= MOSTLY_NUMBERS and len(bad):
            values = pd.unique(bad.astype(str).str.strip())
            report.add("undeclared marker", f"column {name!r} holds numbers but {len(bad)} values are not: "
                       f"{_examples(values)}; if they mean missing, declare them (node config missing-values="
                       f"\"{','.join(map(str, values[:3]))}\"), else the whole column becomes a category "
                       f"(tables.types {name}=category says so)")
    n_missing = int(col.isna().sum())
    if rule is not None:
        if rule.startswith("value:"):
            if kind == NUMBER:
                try:
                    float(rule[len("value:"):])
                except ValueError:
                    report.add("rule does not fit", f"tables.missing {name}={rule}: column {name!r} holds numbers, "
                               f"{rule[len('value:'):]!r} is not one")
        elif rule not in FILL_RULES:
            report.add("a setting", f"tables.missing {name}={rule}: choose mean, median, mode or value:<v>")
        elif kind == CATEGORY and rule != "mode":
            report.add("rule does not fit", f"tables.missing {name}={rule}: column {name!r} holds categories; "
                       f"{rule} needs numbers (use {name}=mode or {name}=value:unknown)")
    elif n_missing:
        rows = np.flatnonzero(col.isna().to_numpy())
        fix = (f"'{name}=median' (or mean, or value:<a number>)" if kind == NUMBER
               else f"'{name}=mode' or '{name}=value:unknown'")
        report.add("missing values without a rule", f"column {name!r} ({kind}) has {n_missing} missing values "
                   f"(rows {_rows(rows)}); name a rule in tables.missing: {fix}")


def _check_labels(report: Report, df: Any, spec: PartySpec, rules: Rules) -> None:
    """The label owner's label and sensitive columns, and each group's size."""
    absent = [(role, c) for role, c in (("label", spec.label_column),
                                        *(("sensitive", c) for c in group_columns(df, spec))) if c not in df.columns]
    for role, c in absent:
        report.add(f"{role} column not found", f"{role} column {c!r} (node config {role}-column) not found")
    if absent:
        return
    # each problem is reported; the group sizes are counted on the rows without one
    valid = np.ones(len(df), dtype=bool)
    for role, c in (("label", spec.label_column), *(("sensitive", c) for c in group_columns(df, spec))):
        if df[c].isna().any():
            rows = np.flatnonzero(df[c].isna().to_numpy())
            report.add(f"missing {role} values", f"{role} column {c!r} has {len(rows)} missing values "
                       f"(rows {_rows(rows)}); fix or drop those rows")
            valid[rows] = False
    labels = as_text(df[spec.label_column]).to_numpy().astype(str)
    pos = norm_value(spec.label_positive)
    if not (labels == pos).any():
        report.add("label-positive never seen", f"label column {spec.label_column!r} never equals label-positive="
                   f"{pos!r} (values: {_examples(sorted(set(labels)))})")
        return
    extra = unexpected_labels(labels[valid], spec)
    if extra:
        report.add("unexpected label values", f"label column {spec.label_column!r} "
                   f"{describe_labels({v: np.flatnonzero(valid)[r] for v, r in extra.items()}, spec)}")
        if not spec.label_negative:  # undeclared: count the groups as if the most frequent other value were it
            del extra[max(extra, key=lambda v: len(extra[v]))]
        valid &= ~np.isin(labels, list(extra))
    if spec.group_a or spec.group_b:
        groups = as_text(df[spec.sensitive_column]).to_numpy().astype(str)
        a, b = norm_value(spec.group_a), norm_value(spec.group_b)
        odd = valid & ~np.isin(groups, [a, b])
        if odd.any():
            other = sorted(set(groups[odd]))
            report.add("unexpected group values", f"sensitive column {spec.sensitive_column!r} holds values "
                       f"other than group-a={a!r} and group-b={b!r}: {_examples(other)} ({int(odd.sum())} rows, "
                       f"e.g. rows {_rows(np.flatnonzero(odd))}); fix or drop those rows, or name neither group "
                       "(every value a group)")
            valid &= ~odd
    if not valid.any():
        return
    try:
        y, s = label_arrays(df[valid], spec, spec.name)
    except DataError as exc:  # anything the checks above did not foresee
        report.add("labels", str(exc))
        return
    _check_groups(report, df[valid], spec, rules, y, s)


def _described(label: str, rows: np.ndarray, y: np.ndarray, protected_label: int) -> str:
    """A kind's row subset in a data owner's words where it is a label's rows or all rows."""
    if np.array_equal(rows, y == protected_label):
        return "the protected label"
    if np.array_equal(rows, y == -protected_label):
        return "the other label"
    return "all rows" if rows.all() else label


def _check_groups(report: Report, df: Any, spec: PartySpec, rules: Rules, y: np.ndarray, s: np.ndarray) -> None:
    """Each group's rows in the subsets its constraint compares, against min-group-size."""
    if s.dtype == bool:
        names, codes = [norm_value(spec.group_a), norm_value(spec.group_b)], np.where(s, 0, 1)
    else:
        names, codes = sorted(set(group_values(df, spec))), s
    subsets = {_described(label, rows, y, spec.protected_label): rows
               for label, rows in ConstraintSet.kind_named(rules.constraint).subsets(y, spec.protected_label)}
    sizes = []
    for k, name in enumerate(names):
        counts = {what: int(((codes == k) & rows).sum()) for what, rows in subsets.items()}
        sizes.append(f"{str(name)}: {int((codes == k).sum())} rows, " + ", ".join(f"{n} with {w}" for w, n in counts.items()))
        small = {w: n for w, n in counts.items() if n < rules.min_group_size}
        if small and not rules.pool_small_groups:
            what = ", ".join(f"{n} rows with {w}" for w, n in small.items())
            report.add("group too small", f"group {str(name)!r} has {what}, fewer than min-group-size="
                       f"{rules.min_group_size} before alignment and the split (training keeps about "
                       "tables.train-fraction of the common rows); add rows, merge groups or set "
                       "pool-small-groups=true")
    report.notes.append("groups: " + "; ".join(sizes))


def _check_score_file(report: Report, spec: PartySpec, path: str, block: str | Path, table: Any,
                      fill_rules: dict[str, str]) -> None:
    """The score file: its ids, and the raw columns the saved block needs (or the table's)."""
    df = _read(report, path, spec, "score file")
    if df is None:
        return
    _check_ids(report, df, spec.id_column, "score file")
    if block:
        meta_path = Path(block).expanduser() / "block.json"
        try:
            pre = Preprocessing.from_dict(json.loads(meta_path.read_text())["preprocessing"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            report.add("saved block unreadable", f"saved block {meta_path}: cannot be read ({exc})")
            return
        needed = pre.raw_columns
        fill = pre.fill
        report.notes.append(f"score file: {len(df)} rows; the saved block needs {len(needed)} raw columns")
    elif table is not None:
        needed = _feature_columns(Report(""), table, spec)
        fill = fill_rules
        report.notes.append(f"score file: {len(df)} rows; checked against the table's columns (give the saved "
                            "block to check against what training used)")
    else:
        return
    absent = [c for c in needed if c not in df.columns]
    if absent:
        report.add("score file lacks columns", f"score file {path}: column(s) {absent[:8]} not found; the block "
                   f"needs {list(needed)[:12]}{'...' if len(needed) > 12 else ''}")
    for c in (c for c in needed if c in df.columns):
        n = int(df[c].isna().sum())
        if n and c not in fill:
            report.add("score file: missing values", f"score file {path}: column {c!r} has {n} missing values "
                       f"(rows {_rows(np.flatnonzero(df[c].isna().to_numpy()))}) and training named no rule for it")
        if block and c in pre.categories:
            values = df[c].dropna().astype(str)
            unseen = sorted(set(values) - set(pre.categories[c]))
            if unseen:
                report.add("score file: unseen categories", f"score file {path}: column {c!r} holds categories "
                           f"training never saw: {_examples(unseen)} ({int(values.isin(unseen).sum())} rows)")
