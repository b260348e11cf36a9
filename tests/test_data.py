"""Datasets as in the paper (docs/algorithm.md, Datasets), the CSV loader and its refusals."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.data.datasets import build
from fairvfl_flwr.data.tables import DataError, load_csv, load_dataset
from fairvfl_flwr.data.partition import PartitionError, split_columns

PAPER = {
    # name: (train, test, features, active columns)
    "adult": (40_000, 5_222, 104, 19),
    "compas": (4_800, 478, 26, 16),
    "crime": (1_200, 793, 99, 49),  # the shipped UCI table has 1,993 rows (paper: 1,994)
}

# Group sizes on the training rows with seed 0 (group a, group b, |N^a|, |N^b|).
GROUPS = {
    "adult": (13_003, 26_997, 1_471, 8_419),
    "compas": (2_880, 1_920, 1_375, 1_170),
    "crime": (582, 618, 368, 579),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_datasets_have_paper_shapes(name):
    ds = load_dataset(name, seed=0, sensitive_as_input=True)  # the paper's columns
    n_train, n_test, m, active = PAPER[name]
    assert ds.X_train.shape == (n_train, m)
    assert ds.X_test.shape == (n_test, m)
    assert ds.default_active_columns == active
    assert set(np.unique(ds.y_train)) == {-1, 1}
    s = ds.summary()["train"]
    assert (s["group_a"], s["group_b"], s["protected_a"], s["protected_b"]) == GROUPS[name]
    # standardised with training statistics only
    nonconst = ds.X_train.std(axis=0) > 0
    assert np.allclose(ds.X_train.mean(axis=0), 0, atol=1e-9)
    assert np.allclose(ds.X_train.std(axis=0)[nonconst], 1, atol=1e-9)
    assert not np.allclose(ds.X_test.mean(axis=0), 0, atol=1e-3)
    assert not set(ds.ids_train) & set(ds.ids_test)


def test_total_group_sizes_match_the_sources():
    adult = load_dataset("adult")
    assert int(adult.s_train.sum() + adult.s_test.sum()) == 14_695  # women in UCI Adult (no missing)
    compas = load_dataset("compas")
    assert int(compas.s_train.sum() + compas.s_test.sum()) == 3_175  # African-American after ProPublica filters
    crime = load_dataset("crime")
    assert int((crime.y_train == 1).sum() + (crime.y_test == 1).sum()) == 413  # ViolentCrimesPerPop > 0.375


def test_split_is_seeded():
    a, b, c = load_dataset("crime", 0), load_dataset("crime", 0), load_dataset("crime", 1)
    assert np.array_equal(a.ids_train, b.ids_train)
    assert not np.array_equal(a.ids_train, c.ids_train)


def _table(tmp_path, n=200, **over):
    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {
            "id": np.arange(n),
            "x1": rng.normal(size=n),
            "x2": rng.normal(size=n),
            "colour": rng.choice(["red", "blue"], size=n),
            "label": rng.choice(["yes", "no"], size=n),
            "sex": rng.choice(["F", "M"], size=n),
        }
    )
    for k, v in over.items():
        df[k] = v
    path = tmp_path / "table.csv"
    df.to_csv(path, index=False)
    return path


ARGS = dict(label_column="label", positive_value="yes", sensitive_column="sex", group_a="F", group_b="M")


def test_csv_loader_one_hot_encodes_and_splits(tmp_path):
    ds = load_csv(_table(tmp_path), id_column="id", **ARGS)
    assert ds.feature_names == ["x1", "x2", "colour_blue", "colour_red"]
    assert len(ds.y_train) == 160 and len(ds.y_test) == 40


@pytest.mark.parametrize(
    "change, args, message",
    [
        ({}, {"label_column": "outcome"}, "label column 'outcome' not found"),
        ({}, {"sensitive_column": "gender"}, "sensitive column 'gender' not found"),
        ({"label": ["yes", "no", "maybe", "no"] * 50}, {}, "exactly two values, found 3"),
        ({"sex": ["F", "M", "X", "M"] * 50}, {}, r"values other than 'F' and 'M': \['X'\]"),
        ({"x1": [np.nan] + [0.0] * 199}, {}, r"missing values \(NaN\) in feature columns \{'x1': 1\}"),
        ({}, {"positive_value": "true"}, "never equals the positive value 'true'"),
        ({"label": ["yes"] * 100 + ["no"] * 100, "sex": ["F"] * 100 + ["M"] * 100}, {},
         "group 'M' of 'sex' has no training rows with the protected label"),
    ],
)
def test_csv_loader_refuses_bad_input(tmp_path, change, args, message):
    path = _table(tmp_path, **change)
    with pytest.raises(DataError, match=message) as err:
        load_csv(path, **{**ARGS, **args})
    assert str(path) in str(err.value)


def test_csv_loader_names_missing_file(tmp_path):
    with pytest.raises(DataError, match="nowhere.csv: file not found"):
        load_csv(tmp_path / "nowhere.csv", **ARGS)


def test_unknown_dataset_is_named():
    with pytest.raises(DataError, match="unknown dataset 'mnist'"):
        load_dataset("mnist")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"dataset": "mnist"}, "dataset='mnist': unknown dataset"),
        ({"model": "cnn"}, "model='cnn': unknown model"),
        ({"epsilon": -0.1}, "epsilon=-0.1"),
        ({"local-steps": 0}, "local-steps=0"),
        ({"num-active": 7}, "num-active=7"),
        ({"mu": "two"}, "mu='two'"),
        ({"eta": "fast"}, "eta='fast': expected float"),
        ({"dataset": "csv"}, "csv.path='': required"),
        ({"validation-fraction": 0.2, "server-labels": "/srv/labels.csv"}, "not supported with server-labels"),
    ],
)
def test_config_refuses_bad_values(changes, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_flower({**RunConfig().to_flower(), **changes})


def test_config_reads_flower_values_and_mu():
    cfg = RunConfig.from_flower({"epsilon": 0.05, "fairness": False, "mu": "2/n", "num-server-rounds": 10})
    assert cfg.epsilon == 0.05 and cfg.fairness is False and cfg.num_server_rounds == 10
    assert cfg.mu_value(40_000) == pytest.approx(5e-5)
    assert RunConfig(mu="0.01").mu_value(10) == 0.01


def test_partition_is_paper_split():
    cols = split_columns(104, 6, 1, 19)
    assert [len(c) for c in cols] == [19, 17, 17, 17, 17, 17]
    assert np.array_equal(np.concatenate(cols), np.arange(104))
    assert [len(c) for c in split_columns(26, 6, 1, 16)] == [16, 2, 2, 2, 2, 2]
    assert [len(c) for c in split_columns(99, 6, 1, 49)] == [49, 10, 10, 10, 10, 10]
    assert [len(c) for c in split_columns(10, 4, 2, 4)] == [2, 2, 3, 3]


@pytest.mark.parametrize(
    "args, message",
    [
        ((26, 30, 1, None), "num-parties=30 is larger than the number of feature columns"),
        ((26, 6, 1, 25), "leaves 1 columns for 5 passive parties"),
        ((26, 6, 0, None), "num-active must be between 1"),
    ],
)
def test_partition_refuses_impossible_splits(args, message):
    with pytest.raises(PartitionError, match=message):
        split_columns(*args)


# -- the packaged tables, rebuilt from the raw ones (where the raw tables are at hand) ---------
RAW = Path(__file__).resolve().parents[2] / "shared" / "data"  # build.py's default, ../shared/data
needs_raw = pytest.mark.skipif(not (RAW / "crime.csv.gz").exists(), reason=f"no raw tables in {RAW}")


@needs_raw
@pytest.mark.parametrize("name", ["compas", "crime"])
def test_the_packaged_table_is_what_build_makes_of_the_raw_one(name):
    built = build.BUILDERS[name](RAW)
    shipped = pd.read_csv(build.HERE / f"{name}.csv.gz").drop(columns="row_id")
    assert list(built.columns) == list(shipped.columns) and len(built) == len(shipped)
    numeric = built.select_dtypes("number").columns
    np.testing.assert_allclose(built[numeric].to_numpy(float), shipped[numeric].to_numpy(float), rtol=1e-5, atol=1e-12)
    other = built.columns.difference(numeric)
    assert len(other) and (built[other].astype(str).to_numpy() == shipped[other].astype(str).to_numpy()).all()


@needs_raw
@pytest.mark.slow  # writes all three tables, Adult's 45,222 rows included
def test_build_rewrites_the_packaged_files_byte_for_byte(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["build", "--raw", str(RAW), "--out", str(tmp_path)])
    build.main()
    for name in build.BUILDERS:
        assert (tmp_path / f"{name}.csv.gz").read_bytes() == (build.HERE / f"{name}.csv.gz").read_bytes(), name
