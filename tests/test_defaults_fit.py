"""The defaults fit every packaged table and the README's federation, and every setting the
config layer refuses reaches the user as one paragraph, before any message is sent."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import fairvfl_flwr.app.server  # noqa: F401  (installs the refusal filter, as the ServerApp's process does)
from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.refusals import is_refusal
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.config.run import BY_FIELD
from fairvfl_flwr.config.sections import refused_combinations
from fairvfl_flwr.data.tables import DATASETS, load_dataset
from fairvfl_flwr.flower.inprocess import InProcessGrid

from .test_refusals import flower_log

KINDS = ("deo", "demographic-parity", "equalized-odds")
#: Adult's tables (48,842 rows, up to ten groups) take most of the minutes; the fast loop runs the rest.
SLOW_TABLES = {"adult", "adult-race", "adult-sex-race"}


def _cases():
    for name in DATASETS:
        marks = [pytest.mark.slow] if name in SLOW_TABLES else []
        for kind in KINDS:
            yield pytest.param(name, kind, id=f"{name}-{kind}", marks=marks)


@pytest.mark.parametrize("dataset, constraint", _cases())
def test_every_packaged_table_runs_under_the_defaults_with_six_parties(dataset, constraint, tmp_path, caplog):
    """The README's federation (num-supernodes=6, num-parties=6) on every packaged table and
    constraint kind: each party holds a column, and the run ends with its summary."""
    caplog.set_level(logging.INFO, logger="flwr")
    summary, folder = run_inprocess({"dataset": dataset, "constraint": constraint, "num-parties": 6,
                                     "num-server-rounds": 3, "output-dir": str(tmp_path)})
    ds = load_dataset(dataset, 0, False)
    columns = summary["party_columns"]
    assert len(columns) == 6 and min(columns) >= 1 and sum(columns) == ds.n_features
    assert json.loads((folder / "summary.json").read_text())["rounds"] == summary["rounds"] == 3
    assert np.isfinite(summary["train_max_gap"]) and 0 < summary["test_acc"] <= 1
    fitted = [r.getMessage() for r in caplog.records if "active-columns: the dataset's default" in r.getMessage()]
    if ds.default_active_columns > ds.n_features - 5:  # compas-race: race is no longer an input
        assert len(fitted) == 1 and f"holds {ds.n_features - 5} columns" in fitted[0]
        assert columns[0] == ds.n_features - 5
    else:
        assert not fitted and columns[0] == ds.default_active_columns


class CountingGrid(InProcessGrid):
    """The in-process grid, counting what the server sends."""

    sent = 0

    def push_messages(self, messages):
        messages = list(messages)
        self.sent += len(messages)
        return super().push_messages(messages)


def _refused(run_config: dict, tmp_path, *names: str) -> str:
    """Run ``run_config`` through the ServerApp's job; it must be refused before any message,
    as a ConfigError whose log is one paragraph naming ``names``."""
    grid = CountingGrid(client_app, {}, 6)
    with pytest.raises(ConfigError) as info:
        run_inprocess({**run_config, "output-dir": str(tmp_path)}, quiet=True, grid=grid)
    assert grid.sent == 0
    exc = info.value
    assert is_refusal(exc)
    text = flower_log(exc)
    assert "Traceback" not in text and text.count("\n") == 1, text
    assert text.startswith("FairVFL refused the run: run config ")
    for name in names:
        assert name in text, (name, text)
    return text


ON = {"batch_size": 64, "max_staleness": 1, "secure_nu": "ckks", "checkpoint_every": 5, "resume_from": "/tmp/r",
      "record_view": "/tmp/v", "model": "mlp", "validation_fraction": 0.2, "server_labels": "/tmp/labels.csv",
      "mode": "split", "nu_noise": 1.0, "transcript_dir": "/tmp/t", "secure_aggregation": "true", "optimizer": "newton",
      "local_time_budget": 1.0, "label_dp_epsilon": 1.0, "rejoin_timeout": 10.0, "groups_holder": "registry",
      "sensitive_as_input": True, "groups_release": "ckks"}
OTHER_VALUES = {"mode": ("split", "score"), "optimizer": ("adagrad",), "model": ("linear",)}
REFUSED = refused_combinations()  # config/sections.REFUSED and the registered algorithms' refusals


@pytest.mark.parametrize("row", range(len(REFUSED)),
                         ids=[f"{a}-{b}" for a, _, b, _, _ in REFUSED])
def test_every_refused_combination_reaches_the_user_as_one_paragraph(row, tmp_path):
    """REFUSED and every registered algorithm's refusals (sections.refused_combinations), through
    the ServerApp's job from Flower's run config."""
    pytest.importorskip("tenseal")  # secure-nu='ckks' alone is refused without it
    field, on, other, other_on, _ = REFUSED[row]
    values = {name: next(v for v in (ON[name], *OTHER_VALUES.get(name, ())) if is_on(RunConfig(**{name: v})))
              for name, is_on in ((field, on), (other, other_on))}
    if values.get("optimizer") == "adagrad":
        values.setdefault("model", "mlp")
    if values.get("mode") == "score":
        values["score_model_from"] = "/tmp/run"
    flower = {BY_FIELD[f].key: v for f, v in values.items()}
    _refused({"dataset": "crime", **flower}, tmp_path, BY_FIELD[field].key, BY_FIELD[other].key, "not supported with")


#: A value each declared rule or choice list refuses, tried in order.
BAD_VALUES = (-1, 0, 10**9, "no-such-value", -0.5, 1.5, -2)


def _bad_value(s):
    for value in BAD_VALUES:
        try:
            cfg = RunConfig(**{s.field: s.type(value)})
        except (TypeError, ValueError):
            continue
        if s.refusal(cfg) is not None:
            return s.type(value)
    return None


CHECKED = [s for s in RunConfig.settings() if s.rule is not None or s.choices]


@pytest.mark.parametrize("setting", CHECKED, ids=[s.key for s in CHECKED])
def test_every_declared_rule_reaches_the_user_as_one_paragraph(setting, tmp_path):
    value = _bad_value(setting)
    assert value is not None, f"no value of {BAD_VALUES} breaks {setting.key}'s rule: add one"
    _refused({setting.key: value}, tmp_path, f"{setting.key}=")


@pytest.mark.parametrize("run_config, names", [
    ({"dataset": "csv"}, ["csv.path=", "required when dataset='csv'"]),
    ({"dataset": "csv", "csv.path": "t.csv", "csv.label": "y", "csv.positive": "1", "csv.sensitive": "s",
      "csv.group-a": "a"}, ["csv.group-b=", "give both group values"]),
    ({"mode": "score"}, ["score.model-from=", "mode='score' needs"]),
    ({"score.round": 3}, ["score.round=3", "read only with mode='score'"]),
    ({"staleness.straggler-delays": "2=x"}, ["straggler-delays item '2=x'"]),
    ({"preset": "papers"}, ["preset='papers'", "choose one of"]),
    ({"num-server-round": 5}, ["num-server-round=5", "unknown key", "num-server-rounds"]),
    ({"num-server-rounds": "many"}, ["num-server-rounds='many'", "expected int"]),
    ({"mode": "scores"}, ["mode='scores'", "choose one of"]),
])
def test_every_conditional_refusal_reaches_the_user_as_one_paragraph(run_config, names, tmp_path):
    _refused(run_config, tmp_path, *names)


@pytest.mark.parametrize("run_config, names", [
    ({"dataset": "compas-race", "active-columns": 20},
     ["dataset 'compas-race' (24 feature columns", "active-columns=20 leaves 4 columns for 5 passive parties",
      "set active-columns to at most 19", "or num-parties to at most 5", "sensitive-as-input=false"]),
    ({"dataset": "compas", "num-parties": 30, "num-active": 1},
     ["num-parties=30 is larger than the number of feature columns (24)", "set num-parties to at most 24"]),
    ({"dataset": "crime", "num-active": 3, "active-columns": 2},
     ["active-columns=2 leaves an active party without columns", "at least 3"]),
])
def test_a_split_that_cannot_fit_is_refused_before_round_0_with_its_fix(run_config, names, tmp_path):
    _refused(run_config, tmp_path, *names)
