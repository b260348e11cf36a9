"""The run config: sections with dotted keys, unknown keys, the refusal table."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from flwr.common.config import flatten_dict

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.config.__main__ import generated
from fairvfl_flwr.config.run import BY_FIELD
from fairvfl_flwr.config.sections import refused_combinations
from fairvfl_flwr.config.settings import HELP_MAX, SECTIONS

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_config_is_exactly_the_defaults():
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    flat = flatten_dict(table)  # what Flower hands the apps
    assert flat == RunConfig().to_flower()
    assert RunConfig.from_flower(flat) == RunConfig()
    assert {k.split(".")[0] for k in flat if "." in k} == set(SECTIONS) - {""}


def test_pyproject_and_the_docs_are_what_the_declarations_generate():
    """Each setting is declared once; pyproject.toml's run config and docs/configuration.md's key
    tables are generated from it (python -m fairvfl_flwr.config --write), so a drift fails here."""
    for path, text in generated(ROOT).items():
        assert path.read_text() == text, f"{path.name} drifted from the declarations: python -m fairvfl_flwr.config --write"
    docs = (ROOT / "docs" / "configuration.md").read_text()
    for s in RunConfig.settings():
        assert f"| `{s.key}` |" in docs
        assert 0 < len(s.help) <= HELP_MAX and "\n" not in s.help


def test_a_declared_rule_refuses_with_the_key_and_its_reason():
    for s in RunConfig.settings():  # every default passes its own rule
        assert s.refusal(RunConfig()) is None, s.key
    with pytest.raises(ConfigError, match=r"run config num-active=7: must be between 1 and num-parties \(6\)"):
        RunConfig.from_flower({"num-active": 7})
    with pytest.raises(ConfigError, match=r"run config wire-dtype='float16': choose float32"):
        RunConfig.from_flower({"wire-dtype": "float16"})


def test_section_keys_set_the_flat_attributes():
    cfg = RunConfig.from_flower({"privacy.nu-noise": 2.0, "batching.batch-size": 64, "csv.path": "/x.csv",
                                 "split.embedding": 8, "reliability.round-retries": 3})
    assert (cfg.nu_noise, cfg.batch_size, cfg.csv_path, cfg.split_embedding, cfg.round_retries) == (2.0, 64, "/x.csv",
                                                                                                     8, 3)


def test_an_unknown_key_is_refused_in_process_as_by_flwr_run(tmp_path):
    with pytest.raises(ConfigError, match=r"run config num-server-round=5: unknown key \(did you mean 'num-server-rounds'\?\)"):
        run_inprocess({"dataset": "crime", "num-server-round": 5, "output-dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"run config nu-noise=2.0: unknown key \(did you mean 'privacy.nu-noise'\?\)"):
        RunConfig.from_flower({"nu-noise": 2.0})
    with pytest.raises(ConfigError, match=r"privacy.secure=.*unknown key"):
        RunConfig.from_flower({"privacy.secure": "ckks"})


@pytest.mark.parametrize("key, value, why", [
    ("privacy.nu-noise", -1.0, "must be >= 0"),
    ("privacy.secure-nu", "rsa", "choose 'none'"),
    ("reliability.round-timeout", 0.0, "must be > 0 seconds"),
    ("reliability.checkpoint-every", -2, "must be >= 0"),
    ("staleness.quorum", 9, "between 0"),
    ("staleness.straggler-delays", "2=x", "item '2=x': write partition=seconds"),
    ("batching.batch-size", -1, "must be >= 0 rows"),
    ("split.embedding", 0, "at least 1"),
    ("csv.train-fraction", 1.5, "between 0 and 1"),
])
def test_each_section_is_checked_and_names_its_dotted_key(key, value, why):
    base = {"dataset": "csv", "csv.path": "x.csv", "csv.label": "y", "csv.positive": "1", "csv.sensitive": "s",
            "csv.group-a": "a", "csv.group-b": "b"} if key.startswith("csv.") else {}
    with pytest.raises(ConfigError, match=rf"{key}.*{why}"):
        RunConfig.from_flower({**base, key: value})


ON = {"batch_size": 64, "max_staleness": 1, "secure_nu": "ckks", "checkpoint_every": 5, "resume_from": "/tmp/r",
      "record_view": "/tmp/v", "model": "mlp", "validation_fraction": 0.2, "server_labels": "/tmp/labels.csv",
      "mode": "split", "nu_noise": 1.0, "transcript_dir": "/tmp/t", "secure_aggregation": "true", "optimizer": "newton",
      "local_time_budget": 1.0, "label_dp_epsilon": 1.0, "rejoin_timeout": 10.0, "groups_holder": "registry",
      "tables_own": True, "sensitive_as_input": True, "groups_release": "ckks"}


OTHER_VALUES = {"mode": ("split", "score"), "optimizer": ("adagrad",), "model": ("linear",)}


REFUSED = refused_combinations()  # config/sections.REFUSED and the registered algorithms' refusals


@pytest.mark.parametrize("row", range(len(REFUSED)))
def test_every_refused_combination_names_both_keys(row):
    pytest.importorskip("tenseal")  # secure-nu='ckks' alone is refused without it
    field, on, other, other_on, _ = REFUSED[row]
    key, other_key = BY_FIELD[field].key, BY_FIELD[other].key
    # where ON's value is not the one the row refuses (another mode, optimizer or model): the one it does
    values = {name: next(v for v in (ON[name], *OTHER_VALUES.get(name, ())) if is_on(RunConfig(**{name: v})))
              for name, is_on in ((field, on), (other, other_on))}
    if values.get("optimizer") == "adagrad":  # its other refusals are of MLP runs (a linear model is refused first)
        values.setdefault("model", "mlp")
    if values.get("mode") == "score":
        values["score_model_from"] = "/tmp/run"
    assert on(RunConfig(**values)) and other_on(RunConfig(**values))
    with pytest.raises(ConfigError, match=rf"run config {key}=.*not supported with {other_key}="):
        RunConfig(dataset="crime", **values).validate()


def test_the_split_baseline_refuses_what_it_would_ignore():
    with pytest.raises(ConfigError, match=r"privacy.nu-noise=1.0: not supported with mode='split'"):
        RunConfig.from_flower({"mode": "split", "privacy.nu-noise": 1.0})


def test_the_job_is_told_by_its_mode_read_as_every_setting_is():
    assert RunConfig.mode_of({"mode": "score", "score.model-from": "x"}) == "score"
    assert RunConfig.mode_of({}) == "fairvfl" and RunConfig.mode_of({"mode": "split"}) == "split"
    with pytest.raises(ConfigError, match=r"mode='scores': choose one of"):
        RunConfig.mode_of({"mode": "scores"})
