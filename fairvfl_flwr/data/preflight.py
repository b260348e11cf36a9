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
* every text column (features, the sensitive columns): values that usually mean missing
  (``?``, a cell of spaces, ``NA``, ``N/A``, ``null``, ``unknown``, ``-``, in any case) that the
  party declared neither missing nor a real category (node config ``real-categories``), each
  with its count: found, not assumed, so that no marker is trained as a category;
* every feature column with missing values: the rule it needs in ``tables.missing``, by its
  type (a number: mean, median or a number; a category: mode or a value), and a rule that
  does not fit the type; a column of numbers with a few text values (an undeclared marker)
  and a ``tables.types`` number column holding text;
* the label owner's label column: exactly the two declared values (label-positive, and
  label-negative or the one other value); anything else with its count and example rows;
* its sensitive column(s): the declared groups only, and each group's rows in the subsets the
  constraint compares (``min-group-size``): the groups pooled into one (``pool-small-groups``,
  decided as the run decides it: core/constraints/pooling.pooled_members) with their counts, or every
  group that pooling does not fix, with its count;
* likely protected columns (race, sex, age, ... by name or values) the party did not declare in
  node config ``protected-columns``: suggested in the notes (declared ones are not model inputs);
* a score file (node config ``score-path``): its id column and ids, and with a saved block
  (``block.json``) every raw column the block needs, missing values without a fill rule and
  categories training never saw.

Each :class:`Problem` has a kind (a few generic words, no column and no value) and its text
(columns, counts, example values and rows: the party's own eyes only).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.core.constraints import GroupSizeError, SensitiveGroups, kind_named, pooled_members
from fairvfl_flwr.data.partydata import (ROLE_ACTIVE, ROLE_REGISTRY, PartySpec, group_columns, group_values,
                                         label_codes, label_findings, registry_groups, reserved_columns)
from fairvfl_flwr.data.own_table import (CATEGORY, NUMBER, fill_finding, likely_markers, marker_finding, number_like,
                                         parse_rules, raw_table, type_finding)
from fairvfl_flwr.data.encoding import Preprocessing
from fairvfl_flwr.data.sources import FileTable, SqlTable, as_source, table_source
from fairvfl_flwr.data.tables import DataError, Finding, examples, norm_value, row_numbers

#: The run config's defaults, which the check's rules default to.
_RUN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig)}
#: A column whose values are numbers but for this share of its cells is taken to hold an undeclared marker.
MOSTLY_NUMBERS = 0.9


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

    def found(self, findings: list[Finding], where: str = "") -> None:
        """Note the problems a shared check found (with their examples), each text after ``where``."""
        for f in findings:
            self.add(f.kind, f"{where}{f.full}")

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

    types: str = _RUN_DEFAULTS["tables_types"]
    missing: str = _RUN_DEFAULTS["tables_missing"]
    min_group_size: int = _RUN_DEFAULTS["min_group_size"]
    pool_small_groups: bool = _RUN_DEFAULTS["pool_small_groups"]
    constraint: str = _RUN_DEFAULTS["constraint"]

    @classmethod
    def of(cls, cfg: Any) -> "Rules":
        """The rules of a RunConfig."""
        return cls(types=cfg.tables_types, missing=cfg.tables_missing, min_group_size=cfg.min_group_size,
                   pool_small_groups=cfg.pool_small_groups, constraint=cfg.constraint)


def check_party(spec: PartySpec, rules: Rules = Rules(), score_path: str = "", block: str | Path = "") -> Report:
    """Every problem of the party's own table (its file or database table: data/sources.py)
    and, if given, of its score file against its saved ``block`` folder (module doc). Never
    raises on bad data."""
    report = Report(spec.name)
    try:
        type_rules, fill_rules = parse_rules(rules.types, "tables.types"), parse_rules(rules.missing, "tables.missing")
    except DataError as exc:
        report.add("a setting", str(exc))
        type_rules, fill_rules = {}, {}
    df = _read(report, table_source(spec), spec, "table")
    features = None
    if df is not None:
        features = _feature_columns(report, df, spec)
        text = []  # the text columns a marker may hide in, where no other check names it already
        for c in features:
            if not _check_column(report, df[c], c, type_rules.get(c), fill_rules.get(c)):
                text.append(c)
        if spec.role in (ROLE_ACTIVE, ROLE_REGISTRY) and spec.sensitive_column:
            text += [c for c in group_columns(df, spec) if c in df.columns]
        _check_markers(report, df, spec, text)
        _suggest_protected(report, df, spec)
        if spec.role == ROLE_ACTIVE:
            _check_labels(report, df, spec, rules)
        if spec.role == ROLE_REGISTRY:
            _check_registry(report, df, spec, rules)
        report.notes.append(f"table: {len(df)} rows, {len(features)} feature columns "
                            f"({', '.join(map(str, features[:12]))}{'...' if len(features) > 12 else ''})")
    if score_path:
        _check_score_file(report, spec, score_path, block, features, fill_rules)
    return report


def _read(report: Report, source: str | FileTable | SqlTable, spec: PartySpec, what: str) -> Any:
    """The table as the run reads it (own_table.raw_table: markers blanked, their counts noted,
    its id column's problems reported), or None (a problem)."""
    source = as_source(source)
    if source.missing:
        report.add(f"{what} not found", f"{what} {source.name}: file not found")
        return None
    try:
        raw = raw_table(source, spec.id_column, spec.name, spec.missing_values)
    except DataError as exc:
        report.add(f"{what} unreadable", str(exc))
        return None
    if spec.missing_values:
        where = ", ".join(f"{c} {n}" for c, n in sorted(raw.blanked.items(), key=lambda kv: -kv[1])[:10]) or "none"
        report.notes.append(f"{what}: missing markers {list(spec.missing_values)}: {sum(raw.blanked.values())} cells "
                            f"blanked ({where})")
    report.found(list(raw.id_problems), f"{what}: ")
    return raw.frame


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


#: Words that name a protected attribute (a column name's words are compared) ...
PROTECTED_NAMES = {"race": "race", "sex": "sex", "gender": "sex", "age": "age", "ethnicity": "ethnicity",
                   "ethnic": "ethnicity", "religion": "religion", "nationality": "nationality"}
#: ... and the values that give one away whatever the column is called.
PROTECTED_VALUES = {
    "sex": {"female", "male", "woman", "man", "women", "men", "non-binary"},
    "race": {"white", "black", "asian", "hispanic", "latino", "african-american", "caucasian",
             "amer-indian-eskimo", "asian-pac-islander", "native american"},
    "religion": {"christian", "muslim", "jewish", "hindu", "buddhist", "catholic", "protestant", "atheist"},
}


def likely_protected(df: Any) -> dict[str, str]:
    """The columns of ``df`` that likely hold a protected attribute, and why: a word of their name
    (race, sex, gender, age, ethnicity, religion, nationality), or values of which at least two
    distinct ones, covering half its cells, are those of sex, race or religion."""
    import pandas as pd

    out: dict[str, str] = {}
    for c in df.columns:
        words = [w for w in "".join(ch if ch.isalpha() else " " for ch in str(c).lower()).split()]
        named = next((PROTECTED_NAMES[w] for w in words if w in PROTECTED_NAMES), None)
        if named is not None:
            out[str(c)] = f"its name ({named})"
            continue
        col = df[c]
        if pd.api.types.is_numeric_dtype(col) or not col.notna().any():
            continue
        low = col.dropna().astype(str).str.strip().str.lower()
        for what, vocabulary in PROTECTED_VALUES.items():
            hit = low.isin(vocabulary)
            if len(set(low[hit])) >= 2 and hit.mean() >= 0.5:
                out[str(c)] = f"its values ({what}: {examples(sorted(set(col.dropna().astype(str).str.strip()[hit.values]))[:3])})"
                break
    return out


def _suggest_protected(report: Report, df: Any, spec: PartySpec) -> None:
    """Note the table's likely protected columns that the party did not declare (a suggestion:
    only the party knows which of its columns are protected), and a declared one not there."""
    declared = set(spec.protected_columns)
    if spec.role in (ROLE_ACTIVE, ROLE_REGISTRY) and spec.sensitive_column:
        declared |= set(group_columns(df, spec))
    absent = sorted(set(spec.protected_columns) - {str(c) for c in df.columns})
    if absent:
        report.add("columns not found", f"node config protected-columns names {absent[:5]}, not in the table")
    likely = {c: why for c, why in likely_protected(df).items() if c not in declared and c != spec.id_column}
    if likely:
        report.notes.append("likely protected columns, not declared: " + "; ".join(f"{c!r} by {why}" for c, why in
                            likely.items()) + "; declare them in node config protected-columns (they are then not "
                            "model inputs unless sensitive-as-input, and the model card lists them)")
    if spec.protected_columns:
        report.notes.append(f"protected columns, not model inputs: {', '.join(spec.protected_columns)}")


def _check_markers(report: Report, df: Any, spec: PartySpec, columns: list[str]) -> None:
    """Every text column among ``columns``: values that usually mean missing (own_table.likely_markers)
    that the party declared neither missing nor real categories; and a real category named for
    a column the table does not have."""
    real: dict[str, set[str]] = {}
    for column, value in spec.real_categories:
        real.setdefault(column, set()).add(value)
    absent = sorted(set(real) - {str(c) for c in df.columns})
    if absent:
        report.add("columns not found", f"node config real-categories names column(s) {absent[:5]}, not in the table")
    for c in columns:
        found = marker_finding(c, likely_markers(df[c], real.get(c, set())))
        if found is not None:
            report.found([found])


def _check_column(report: Report, col: Any, name: str, declared: str | None, rule: str | None) -> bool:
    """A feature column: its type, the text among numbers, its missing values and their rule.
    True when it named text the column should not hold (its markers are then named already)."""
    import pandas as pd

    if declared is not None and (bad_type := type_finding(name, declared)) is not None:
        report.found([bad_type])
        declared = None
    kind = declared or (NUMBER if pd.api.types.is_numeric_dtype(col) else CATEGORY)
    flagged = False
    if not pd.api.types.is_numeric_dtype(col) and declared != CATEGORY:
        _, bad = number_like(col)
        share = 1 - len(bad) / max(1, int(col.notna().sum()))
        flagged = bool(len(bad)) and (declared == NUMBER or share >= MOSTLY_NUMBERS)
        if declared == NUMBER and len(bad):
            report.add("text in a number column", f"column {name!r} (tables.types number) holds {len(bad)} values "
                       f"that are not numbers, e.g. {examples(pd.unique(bad))} (rows "
                       f"{row_numbers(np.flatnonzero(col.isin(bad)))})")
        elif share >= MOSTLY_NUMBERS and len(bad):
            values = pd.unique(bad.astype(str).str.strip())
            report.add("undeclared marker", f"column {name!r} holds numbers but {len(bad)} values are not: "
                       f"{examples(values)}; if they mean missing, declare them (node config missing-values="
                       f"\"{','.join(map(str, values[:3]))}\"), else the whole column becomes a category "
                       f"(tables.types {name}=category says so)")
    if rule is not None:
        report.found([f for f in [fill_finding(name, rule, kind)] if f is not None])
    elif col.isna().any():
        rows = np.flatnonzero(col.isna().to_numpy())
        fix = (f"'{name}=median' (or mean, or value:<a number>)" if kind == NUMBER
               else f"'{name}=mode' or '{name}=value:unknown'")
        report.add("missing values without a rule", f"column {name!r} ({kind}) has {len(rows)} missing values "
                   f"(rows {row_numbers(rows)}); name a rule in tables.missing: {fix}")
    return flagged


def _check_labels(report: Report, df: Any, spec: PartySpec, rules: Rules) -> None:
    """The label owner's label and sensitive columns (partydata.label_findings, as the run
    checks them), and each group's size on the rows free of those problems."""
    found, valid = label_findings(df, spec)
    report.found(found)
    if valid.any():
        y, s = label_codes(df[valid], spec)
        if s is not None:  # a registry run's label owner holds no groups
            _check_groups(report, df[valid], spec, rules, y, s)


def _check_registry(report: Report, df: Any, spec: PartySpec, rules: Rules) -> None:
    """A registry's sensitive column (partydata.registry_groups, as the run reads it), and each
    group's rows against min-group-size: the registry sees no labels, so the run's counts in
    the constrained row sets (which the server estimates from the release) can only be lower."""
    try:
        codes, names = registry_groups(df, spec, spec.name)
    except DataError as exc:
        report.add("sensitive column", str(exc))
        return
    codes = SensitiveGroups.of(codes, names).codes
    counts = np.bincount(codes, minlength=len(names))
    report.notes.append("groups: " + "; ".join(f"{name}: {int(c)} rows" for name, c in zip(names, counts)))
    small = [f"{name!r} has {int(c)}" for name, c in zip(names, counts) if c < rules.min_group_size]
    if small:
        report.notes.append(f"groups below min-group-size = {rules.min_group_size} rows in all: {', '.join(small)}; "
                            "the run pools them (pool-small-groups) or refuses")


def _described(label: str, rows: np.ndarray, y: np.ndarray, protected_label: int) -> str:
    """A kind's row subset in a data owner's words where it is a label's rows (with the run's
    name for it, which the pooling note and refusals use) or all rows."""
    if np.array_equal(rows, y == protected_label):
        return f"the protected label ({label})"
    if np.array_equal(rows, y == -protected_label):
        return f"the other label ({label})"
    return "all rows" if rows.all() else label


def _check_groups(report: Report, df: Any, spec: PartySpec, rules: Rules, y: np.ndarray, s: np.ndarray) -> None:
    """Each group's rows in the subsets its constraint compares, against min-group-size: the
    groups the run would pool (noted, with their counts), or every group pooling does not fix
    (one problem naming each with its count), decided as the run decides (on all rows)."""
    if s.dtype == bool:
        names, codes = [norm_value(spec.group_a), norm_value(spec.group_b)], np.where(s, 0, 1)
    else:
        names, codes = sorted(set(group_values(df, spec))), s
    kind = kind_named(rules.constraint)
    subsets = kind.subsets(y, spec.protected_label)
    described = {_described(label, rows, y, spec.protected_label): rows for label, rows in subsets}
    sizes = []
    for k, name in enumerate(names):
        counts = {what: int(((codes == k) & rows).sum()) for what, rows in described.items()}
        sizes.append(f"{str(name)}: {int((codes == k).sum())} rows, " + ", ".join(f"{n} with {w}" for w, n in counts.items()))
    report.notes.append("groups: " + "; ".join(sizes))
    where = ("counted on this table before alignment: the run counts the rows all parties hold, which can be "
             "fewer")
    try:
        pooled = pooled_members(SensitiveGroups(codes, tuple(map(str, names))), subsets, rules.min_group_size,
                                rules.pool_small_groups, kind.kind, whole_table=True)
    except GroupSizeError as exc:
        report.add("group too small", f"{exc} ({where}); or add rows, or merge groups in the table")
        return
    if pooled is not None:
        report.notes.append(f"{pooled[1].describe()} ({where})")


def _check_score_file(report: Report, spec: PartySpec, path: str, block: str | Path, features: list[str] | None,
                      fill_rules: dict[str, str]) -> None:
    """The score file: its ids, and the raw columns the saved block needs (or the table's
    feature columns, ``features``)."""
    df = _read(report, path, spec, "score file")
    if df is None:
        return
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
    elif features is not None:
        needed = features
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
                       f"(rows {row_numbers(np.flatnonzero(df[c].isna().to_numpy()))}) and training named no rule for it")
        if block and c in pre.categories:
            values = df[c].dropna().astype(str)
            unseen = sorted(set(values) - set(pre.categories[c]))
            if unseen:
                report.add("score file: unseen categories", f"score file {path}: column {c!r} holds categories "
                           f"training never saw: {examples(unseen)} ({int(values.isin(unseen).sum())} rows)")
