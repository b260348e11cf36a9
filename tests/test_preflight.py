"""The pre-flight check of a party's own table (data/preflight.py, fairvfl-preflight): every
planted problem reported in one run, declared missing markers treated as missing."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fairvfl_flwr.data.partydata import PartySpec, label_arrays
from fairvfl_flwr.data.own_table import prepare_block, read_table
from fairvfl_flwr.data.tables import DataError, blank_markers
from fairvfl_flwr.tools import preflight

ROWS = 300


def planted_table(folder) -> tuple[str, str, str]:
    """A label owner's table with planted problems, a score file lacking a column, and a saved
    block: (table, score file, block folder)."""
    rng = np.random.default_rng(0)
    ids = [f"C{i:04d}" for i in range(ROWS)]
    ids[7] = ids[3]  # a duplicate id
    ids[9] = ids[3]
    age = rng.integers(18, 80, ROWS).astype(str).astype(object)
    age[[5, 11, 40]] = "?"  # a declared marker in a column of numbers
    work = rng.choice(["Private", "State", "Self"], ROWS).astype(object)
    work[[2, 8]] = " ?"
    hours = rng.integers(10, 60, ROWS).astype(float)
    hours[[4, 6]] = np.nan  # missing without a rule
    income = rng.choice(["<=50K", ">50K"], ROWS).astype(object)
    income[[1, 20, 30, 50]] = ">50K."  # a third label value
    race = np.array(["White"] * 200 + ["Black"] * 95 + ["Other"] * 5, dtype=object)  # a tiny group
    table = folder / "bank.csv"
    pd.DataFrame({"customer": ids, "age": age, "workclass": work, "hours": hours, "income": income,
                  "race": race}).to_csv(table, index=False)
    clean = pd.DataFrame({"age": rng.integers(18, 80, 50), "workclass": rng.choice(["Private", "State"], 50),
                          "hours": rng.integers(10, 60, 50)})
    pre = prepare_block(clean, ["age", "workclass", "hours"], np.arange(40), np.arange(40, 50)).pre
    block = folder / "block"
    block.mkdir()
    (block / "block.json").write_text(json.dumps({"preprocessing": pre.to_dict()}))
    score = folder / "new.csv"
    pd.DataFrame({"customer": [f"N{i}" for i in range(20)], "age": rng.integers(18, 80, 20),
                  "workclass": ["Private"] * 20}).to_csv(score, index=False)  # no hours column
    return str(table), str(score), str(block)


def node_config(table: str, score: str) -> str:
    return (f'partition-id=0 role="active" table-path="{table}" id-column="customer" label-column="income" '
            f'label-positive=">50K" sensitive-column="race" protected-label=1 missing-values="?,NA" '
            f'score-path="{score}"')


def test_every_planted_problem_is_reported_in_one_run(tmp_path, capsys):
    table, score, block = planted_table(tmp_path)
    code = preflight.main(["--node-config", node_config(table, score), "--block", block,
                           "--run-config", "tables.missing='age=median' pool-small-groups=false"])
    out = capsys.readouterr().out
    assert code == 1
    kinds = {line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if line.strip()[:1].isdigit()}
    assert {"duplicate ids", "unexpected label values", "group too small", "missing values without a rule",
            "score file lacks columns"} <= kinds, out
    assert "'C0003'" in out  # the duplicate, for the party's own eyes
    assert "'>50K.' in 4 rows" in out and "e.g. rows 2, 21, 31" in out
    assert ("1 group(s) with fewer than min-group-size = 30 rows of the table in a constrained row set (deo): "
            "'Other' has 2 in 'y=+1'") in out and "set pool-small-groups = true" in out
    assert "column(s) ['hours'] not found" in out
    # the markers are missing values: age has a rule, workclass (a category) needs mode or a value, not a median
    assert "column 'workclass' (category) has 2 missing values" in out and "'workclass=mode'" in out
    assert "workclass=median" not in out
    assert "column 'hours' (number) has 2 missing values" in out and "'hours=median'" in out
    assert "column 'age'" not in out.split("seen:")[0]  # declared marker + a rule: no problem
    assert "5 cells blanked" in out


def test_a_clean_table_passes_and_an_undeclared_marker_is_named(tmp_path, capsys):
    table, score, _ = planted_table(tmp_path)
    df = pd.read_csv(table, dtype={"customer": str})
    df = df.drop_duplicates("customer")
    df["income"] = df["income"].replace(">50K.", ">50K")
    df = df[df["race"] != "Other"]
    df["workclass"] = df["workclass"].str.strip().replace("?", "Private")
    df["hours"] = df["hours"].fillna(40)
    df.to_csv(table, index=False)
    cfg = node_config(table, score).replace(' missing-values="?,NA"', "").replace(f' score-path="{score}"', "")
    assert preflight.main(["--node-config", cfg]) == 1
    out = capsys.readouterr().out
    assert "[undeclared marker] column 'age' holds numbers but 3 values are not: '?'" in out
    assert preflight.main(["--node-config", cfg + ' missing-values="?"', "--run-config",
                           "tables.missing='age=median'"]) == 0
    assert "no problems" in capsys.readouterr().out


def test_small_groups_are_pooled_by_default_and_named_with_their_counts(tmp_path):
    """Under the defaults the tiny group is pooled, not refused: the report names who was pooled
    into what, with counts; a pooled group still below the minimum is refused, naming every member."""
    table, _, _ = planted_table(tmp_path)
    cfg = node_config(table, "").replace(' score-path=""', "")
    report = preflight.run(cfg, "tables.missing='age=median'")
    assert "group too small" not in report.summary()
    note = next(n for n in report.notes if n.startswith("pooled"))
    assert note.startswith("pooled 2 groups into one, 'Black + Other' has 48 in 'y=+1': 'Other' has 2 in 'y=+1', "
                           "below min-group-size = 30"), note
    assert "'Black' has 46 in 'y=+1' joined as the next smallest" in note
    df = pd.read_csv(table, dtype={"customer": str})
    df.loc[df["race"] == "Black", "race"] = ["Black"] * 20 + ["White"] * 75  # now 'Black' is small too
    df.to_csv(table, index=False)
    refused = [p.text for p in preflight.run(cfg, "tables.missing='age=median'").problems if p.kind == "group too small"]
    assert len(refused) == 1, refused
    assert "'Black + Other' has " in refused[0] and "(pooled from 'Black' has " in refused[0], refused[0]
    assert "'Other' has 2 in 'y=+1'; no group is left to pool with" in refused[0]


def test_declared_markers_are_missing_in_training_too(tmp_path):
    table, _, _ = planted_table(tmp_path)
    pd.read_csv(table).drop_duplicates("customer").to_csv(table, index=False)
    ids, df = read_table(table, "customer", "party 0", ("?",))
    assert df["age"].dtype.kind == "f" and int(df["age"].isna().sum()) == 3  # a number column again
    assert int(df["workclass"].isna().sum()) == 2  # " ?" too
    frame = pd.DataFrame({"id": ["007", "?", "8"], "x": ["1", "-999", "2"]})
    assert blank_markers(frame, ("?", "-999"), keep_text=("id",)) == {"id": 1, "x": 1}
    assert frame["id"].tolist()[0] == "007" and frame["x"].dtype.kind == "f"


def test_a_third_label_value_is_refused_with_its_count_and_rows():
    spec = PartySpec(partition_id=0, role="active", label_column="y", label_positive="yes", sensitive_column="s",
                     group_a="a", group_b="b", protected_label=1)
    df = pd.DataFrame({"y": ["yes", "no", "yes.", "no", "yes."], "s": ["a", "b", "a", "b", "a"]})
    with pytest.raises(DataError, match=r"holds 3 values.*'yes\.' in 2 rows \(e\.g\. rows 3, 5\).*label-negative"):
        label_arrays(df, spec, "party 0")
    with pytest.raises(DataError, match=r"other than label-positive='yes' and label-negative='no'"):
        label_arrays(df, PartySpec(**{**spec.__dict__, "label_negative": "no"}), "party 0")
    y, _ = label_arrays(df[df["y"] != "yes."], spec, "party 0")
    assert y.tolist() == [1.0, -1.0, -1.0]
