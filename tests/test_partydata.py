"""Party files from --node-config (deployment) and the packaged data (simulation), one code path.

Fast: the real ClientApp and ServerApp strategy over the in-process grid, with the
node configs that ``python -m fairvfl_flwr.tools.export`` prints.
"""

import os
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.data import partydata
from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.core.errors import ConfigError
from fairvfl_flwr.data.tables import DataError
from fairvfl_flwr.tools.export import export, instructions
from fairvfl_flwr.tools.export import main as export_main
from fairvfl_flwr.tools.keys import main as keys_main
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.flower.errors import FederationError

BASE = {"dataset": "crime", "num-server-rounds": 4, "eval-every": 2, "epsilon": 0.05}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    return out, export(RunConfig.from_flower(BASE), out, demo_keys=True)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(partydata.CACHE_ENV, str(tmp_path / "cache"))
    partydata.load_party.cache_clear()


@pytest.fixture(scope="module")
def simulated(exported, tmp_path_factory):
    """The simulation with the deployment's privacy setting (the export turns secure aggregation
    on): its summary, which the tests that compare party files against it only read."""
    _, manifest = exported
    key = "privacy.secure-aggregation"
    tmp = tmp_path_factory.mktemp("sim")
    with pytest.MonkeyPatch.context() as mp:  # its own cache, as every test here has
        mp.setenv(partydata.CACHE_ENV, str(tmp / "cache"))
        partydata.load_party.cache_clear()
        summary, _ = run_inprocess({**BASE, key: manifest["run_config"][key], "output-dir": str(tmp / "runs")})
    partydata.load_party.cache_clear()
    return summary


def _deployed(manifest, tmp_path, node_configs=None, tap=None):
    rc = RunConfig.from_flower({**BASE, **manifest["run_config"], "output-dir": str(tmp_path / "dep")}).to_flower()
    grid = InProcessGrid(client_app, rc, len(manifest["node_configs"]),
                         node_configs=node_configs or manifest["node_configs"], tap=tap)
    return run_server(grid, rc)


def test_party_files_give_the_same_run_as_simulation(exported, simulated, tmp_path):
    out, manifest = exported
    dep, folder = _deployed(manifest, tmp_path)
    for key in ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn"):
        assert dep[key] == simulated[key], key  # bit-for-bit: the CSVs round-trip float64 exactly
    hist = json.loads((folder / "history.json").read_text())
    assert len(hist) == BASE["num-server-rounds"] + 1


def test_export_files_hold_only_what_each_party_may_know(exported):
    out, manifest = exported
    active = pd.read_csv(out / "party0.csv", nrows=3)
    passive = pd.read_csv(out / "party3.csv", nrows=3)
    assert {"crime", "black_share"} <= set(active.columns)
    assert not {"crime", "black_share"} & set(passive.columns)
    assert list(passive.columns[:2]) == ["row_id", "split"]
    labels = pd.read_csv(out / "server_labels.csv", nrows=3)
    assert list(labels.columns) == ["row_id", "split", "y", "group", "protected"]
    assert [n["role"] for n in manifest["node_configs"]] == ["active"] + ["passive"] * 5


def test_rows_are_matched_by_id_not_file_order(exported, simulated, tmp_path):
    out, manifest = exported
    shuffled = tmp_path / "party2.csv"
    pd.read_csv(out / "party2.csv").sample(frac=1, random_state=1).to_csv(shuffled, index=False)
    nodes = [dict(n) for n in manifest["node_configs"]]
    nodes[2]["data-path"] = str(shuffled)
    dep, _ = _deployed(manifest, tmp_path, nodes)
    assert dep["train_loss"] == simulated["train_loss"]


def test_misaligned_party_is_refused_before_round_1_naming_it(exported, tmp_path):
    out, manifest = exported
    bad = tmp_path / "party3.csv"
    df = pd.read_csv(out / "party3.csv")
    df.drop(index=5).to_csv(bad, index=False)  # one training row missing
    nodes = [dict(n) for n in manifest["node_configs"]]
    nodes[3]["data-path"] = str(bad)
    sent = []
    with pytest.raises(FederationError, match=r"partition 3, passive\) is not aligned.*Refused before round 1"):
        _deployed(manifest, tmp_path, nodes, tap=lambda m: sent.append(m.metadata.message_type))
    assert not [t for t in sent if t.startswith("train")]


def test_shifted_ids_are_refused(exported, tmp_path):
    out, manifest = exported
    bad = tmp_path / "party1.csv"
    df = pd.read_csv(out / "party1.csv")
    df["row_id"] = df["row_id"] + 1  # same count, different rows
    df.to_csv(bad, index=False)
    nodes = [dict(n) for n in manifest["node_configs"]]
    nodes[1]["data-path"] = str(bad)
    with pytest.raises(FederationError, match=r"partition 1, passive\) is not aligned"):
        _deployed(manifest, tmp_path, nodes)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"role": "boss"}, r"party 1 .*role='boss'"),
        ({"partition-id": 9}, r"partition-id=9 is outside"),
        ({"data-path": "/nonexistent/p.csv"}, r"party 1 \(passive, /nonexistent/p.csv\): data file .* not found"),
        ({"id-column": "rid"}, r"party 1 .*id column 'rid' not found"),
    ],
)
def test_bad_node_config_names_the_party(exported, tmp_path, change, message):
    out, manifest = exported
    nodes = [dict(n) for n in manifest["node_configs"]]
    nodes[1].update(change)
    with pytest.raises(FederationError, match=message):
        _deployed(manifest, tmp_path, nodes)


def test_active_party_needs_its_label_settings(exported, tmp_path):
    out, manifest = exported
    nodes = [dict(n) for n in manifest["node_configs"]]
    del nodes[0]["sensitive-column"]
    with pytest.raises(FederationError, match=r"party 0 .*needs sensitive-column"):
        _deployed(manifest, tmp_path, nodes)
    nodes[0].update(manifest["node_configs"][0], **{"group-a": "high"})
    with pytest.raises(FederationError, match=r"sensitive column 'black_share' holds values other than group-a='high'"):
        _deployed(manifest, tmp_path, nodes)


def test_text_feature_column_is_refused_with_its_name(tmp_path):
    path = tmp_path / "p.csv"
    pd.DataFrame({"row_id": [1, 2], "split": ["train", "test"], "colour": ["red", "blue"]}).to_csv(path, index=False)
    spec = partydata.PartySpec(partition_id=1, role="passive", data_path=str(path))
    with pytest.raises(DataError, match=r"\['colour'\] are not"):
        partydata.load_party_file(spec)


def test_parsed_file_is_cached_by_content_hash(exported, tmp_path):
    out, manifest = exported
    spec = partydata.party_spec(manifest["node_configs"][1], 6, 1)
    first = partydata.load_party_file(spec)
    entries = list((tmp_path / "cache").glob("*.npz"))
    assert len(entries) == 1
    again = partydata.load_party_file(spec)
    np.testing.assert_array_equal(first.X_train, again.X_train)
    assert again.ids_digest == first.ids_digest and again.feature_names == first.feature_names
    # another file (other content) gets its own entry
    partydata.load_party_file(partydata.party_spec(manifest["node_configs"][2], 6, 1))
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 2
    active = partydata.load_party_file(partydata.party_spec(manifest["node_configs"][0], 6, 1))
    cached = partydata.load_party_file(partydata.party_spec(manifest["node_configs"][0], 6, 1))
    np.testing.assert_array_equal(active.y_train, cached.y_train)
    np.testing.assert_array_equal(active.s_train, cached.s_train)


def test_file_is_hashed_once_per_version_and_again_after_an_edit(tmp_path, monkeypatch):
    path = tmp_path / "p.csv"
    pd.DataFrame({"row_id": [1, 2, 3], "split": ["train", "train", "test"], "age": [30, 40, 50]}).to_csv(path, index=False)
    spec = partydata.PartySpec(partition_id=1, role="passive", data_path=str(path))
    reads = []
    real = partydata.file_digest
    monkeypatch.setattr(partydata, "file_digest", lambda p: reads.append(p) or real(p))
    first = partydata.load_party_file(spec)
    partydata.load_party_file(spec)
    assert len(reads) == 1  # the second message loads the parsed arrays without reading the CSV
    # an edit in place, same size, same mtime: the ctime still changes, so the new bytes are parsed
    st = path.stat()
    path.write_text(path.read_text().replace("40", "41"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    edited = partydata.load_party_file(spec)
    assert len(reads) == 2
    assert first.X_train[1, 0] == 40 and edited.X_train[1, 0] == 41


def test_bad_server_label_file_is_named(tmp_path):
    path = tmp_path / "labels.csv"
    pd.DataFrame({"row_id": [1], "split": ["train"], "y": [3], "group": ["a"], "protected": [1]}).to_csv(path, index=False)
    cfg = RunConfig.from_flower({**BASE, "server-labels": str(path), "output-dir": str(tmp_path)})
    with pytest.raises(DataError, match=r"labels.csv: column 'y' must hold 1 or -1"):
        partydata.server_labels_for(cfg)
    cfg = cfg.replace(server_labels=str(tmp_path / "missing.csv"))
    with pytest.raises(DataError, match="server-labels: file .*missing.csv not found"):
        partydata.server_labels_for(cfg)


def test_export_cli_own_csv_prints_supernode_lines(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n = 200
    own = pd.DataFrame({
        "id": [f"r{i:03d}" for i in range(n)],
        "age": rng.integers(18, 80, n),
        "city": rng.choice(["north", "south"], n),
        "score": rng.normal(size=n),
        "hours": rng.normal(size=n),
        "sex": rng.choice(["F", "M"], n),
        "income": rng.choice(["high", "low"], n),
    })
    own.to_csv(tmp_path / "own.csv", index=False)
    out = tmp_path / "parties"
    code = export_main(["--csv", str(tmp_path / "own.csv"), "--label", "income", "--positive", "high",
                        "--sensitive", "sex", "--group-a", "F", "--group-b", "M", "--id-column", "id",
                        "--parties", "3", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert printed.count("FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.05 flower-supernode --insecure --superlink 127.0.0.1:9092") == 3
    assert "flower-superlink --insecure --port 9092 --disable-runtime-dependency-installation" in printed
    assert f'data-path="{out / "party0.csv"}"' in printed and 'label-column="income"' in printed
    assert "flwr run . <connection>" in printed and "server-labels=" in printed
    assert "privacy.secure-aggregation=true' --stream" in printed  # on by default in a deployment
    manifest = json.loads((out / "manifest.json").read_text())
    assert "--enable-supernode-auth" in instructions(manifest, tls=True)
    # a SuperLink other machines reach listens beyond 127.0.0.1 (Flower's default)
    assert "flower-superlink --insecure --host 0.0.0.0 --port 9092" in instructions({**manifest, "superlink":
                                                                                  "link.example.org:9092"})
    assert not (out / "identities").exists()  # no private key was written here
    # each party makes its own key where the printed line says, the peers file pins them all
    for k, node in enumerate(manifest["node_configs"]):
        assert f"fairvfl-keys new --out {node['identity-key']}" in printed
        assert keys_main(["new", "--out", node["identity-key"]]) == 0
        assert oct(Path(node["identity-key"]).stat().st_mode & 0o777) == "0o600"
    pins = [f"{k}={n['identity-key']}.pub" for k, n in enumerate(manifest["node_configs"])]
    assert keys_main(["peers", *pins, "--out", manifest["node_configs"][0]["peers"]]) == 0
    # the exported own table runs over the node configs, equal to the simulation of the CSV
    sim_cfg = {"dataset": "csv", "csv.path": str(tmp_path / "own.csv"), "csv.label": "income", "csv.positive": "high",
               "csv.sensitive": "sex", "csv.group-a": "F", "csv.group-b": "M", "csv.id-column": "id",
               "num-parties": 3, "num-server-rounds": 3, "eval-every": 3, "privacy.secure-aggregation": True}
    sim, _ = run_inprocess({**sim_cfg, "output-dir": str(tmp_path / "sim")})
    rc = RunConfig.from_flower({"num-server-rounds": 3, "eval-every": 3, **manifest["run_config"],
                                "output-dir": str(tmp_path / "dep")}).to_flower()
    dep, _ = run_server(InProcessGrid(client_app, rc, 3, node_configs=manifest["node_configs"]), rc)
    assert dep["train_loss"] == sim["train_loss"] and dep["test_acc"] == sim["test_acc"]


def test_export_turns_secure_aggregation_off_only_when_asked(tmp_path, capsys):
    assert export_main(["--dataset", "crime", "--parties", "3", "--out", str(tmp_path / "a"),
                        "--no-secure-aggregation"]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["run_config"]["privacy.secure-aggregation"] is False
    assert "privacy.secure-aggregation=false' --stream" in printed and "rebuild" in printed
    # a resumed run and a scoring job of an exported deployment stay masked
    deployed = export(RunConfig(dataset="crime", num_parties=3), tmp_path / "b", demo_keys=True)["run_config"]
    assert RunConfig.from_flower({**deployed, "reliability.resume-from": str(tmp_path)}).masked
    assert RunConfig.from_flower({**deployed, "mode": "score", "score.model-from": str(tmp_path)}).masked


def test_export_cli_bad_input_is_one_line(tmp_path, capsys):
    code = export_main(["--dataset", "crime", "--parties", "500", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("export: ") and "Traceback" not in err
