"""The sensitive attribute is a model input only when a run asks (run config ``sensitive-as-input``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.data.partydata import PartySpec, ROLE_ACTIVE, reserved_columns
from fairvfl_flwr.data.tables import load_csv, load_dataset
from fairvfl_flwr.jobs.saving import sensitive_line


@pytest.mark.parametrize("name,columns", [
    ("adult", ["sex_Female", "sex_Male"]),
    ("compas", ["race_African-American", "race_Caucasian"]),
    ("compas-race", ["race_African-American", "race_Asian", "race_Caucasian", "race_Hispanic",
                     "race_Native American", "race_Other"]),
    ("crime", ["racepctblack"]),
    ("adult-sex-race", ["sex_Female", "sex_Male", "race_Amer-Indian-Eskimo", "race_Asian-Pac-Islander",
                        "race_Black", "race_Other", "race_White"]),
])
def test_packaged_datasets_leave_the_sensitive_columns_out_unless_asked(name, columns):
    without, paper = load_dataset(name), load_dataset(name, sensitive_as_input=True)
    assert not set(columns) & set(without.feature_names)
    assert set(columns) <= set(paper.feature_names)
    assert paper.n_features == without.n_features + len(columns)
    assert sorted(paper.summary()["sensitive-inputs"]) == sorted(columns)
    assert without.summary()["sensitive-inputs"] == []
    np.testing.assert_array_equal(paper.y_train, without.y_train)  # the same rows, split and groups
    np.testing.assert_array_equal(paper.s_test, without.s_test)


def test_adult_by_race_keeps_sex_as_a_feature():
    ds = load_dataset("adult-race")  # race is the sensitive attribute, sex an ordinary column
    assert "sex_Female" in ds.feature_names and not any(c.startswith("race_") for c in ds.feature_names)


def _table(tmp_path, onehot: bool):
    rng = np.random.default_rng(0)
    n = 200
    race = rng.choice(["A", "B", "C"], size=n)
    df = pd.DataFrame({"x": rng.normal(size=n), "job": rng.choice(["p", "q"], size=n),
                       "y": rng.choice(["yes", "no"], size=n)})
    if onehot:  # stored one-hot only: the loader decodes it into groups
        for v in "ABC":
            df[f"race_{v}"] = (race == v).astype(int)
    else:
        df["race"] = race
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("onehot", [False, True])
def test_an_own_csv_leaves_its_sensitive_column_out_unless_asked(tmp_path, onehot):
    path = _table(tmp_path, onehot)
    kw = dict(label_column="y", positive_value="yes", sensitive_column="race", group_a="", group_b="")
    without, asked = load_csv(path, **kw), load_csv(path, **kw, sensitive_as_input=True)
    assert without.feature_names == ["x", "job_p", "job_q"]
    assert asked.feature_names == ["x", *(["race_A", "race_B", "race_C"] if onehot else []), "job_p", "job_q",
                                   *([] if onehot else ["race_A", "race_B", "race_C"])]
    assert len(without.group_names) == len(asked.group_names) == 3


def test_an_own_table_reserves_the_sensitive_column_and_its_one_hot_copy():
    df = pd.DataFrame(columns=["id", "y", "sex", "sex_F", "sex_M", "age"])
    spec = PartySpec(partition_id=0, role=ROLE_ACTIVE, table_path="t.csv", id_column="id", label_column="y",
                     label_positive="1", sensitive_column="sex")
    assert reserved_columns(df, spec) == {"id", "y", "sex", "sex_F", "sex_M"}
    assert reserved_columns(df, spec, sensitive_as_input=True) == {"id", "y"}


def test_the_paper_preset_keeps_the_papers_recipe_and_the_card_says_which():
    assert RunConfig().sensitive_as_input is False
    assert RunConfig.from_flower({"preset": "paper"}).sensitive_as_input is True
    assert "not a model input" in sensitive_line({"sensitive-as-input": False}, {})
    line = sensitive_line({"sensitive-as-input": True}, {"sensitive-inputs": ["sex_Female", "sex_Male"]})
    assert "a model input" in line and "`sex_Female`" in line
