"""Deployment on loopback: a real flower-superlink and 3 flower-supernode processes.

Each SuperNode gets an exported party CSV through --node-config, exactly as the export
command prints it; the ServerApp reads the server label file from the run config.
`flwr run` exits 0 even when the run fails, so success is the run's status
(`finished:completed`) plus the run's own result files, and the numbers must equal the
simulation's for the same seed and rounds. Every process is stopped by the fixtures.
"""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.tools.export import export
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.tools.cli import config_text
from fairvfl_flwr.tools.localfed import BIN, HOST, LocalFederation, free_port
from fairvfl_flwr.tools.tls import make_security

pytestmark = pytest.mark.slow

ROUNDS = 2
# Three parties (the label owner and two passive ones: each masks with two peers): every message
# starts a ClientApp process per party, and nothing a deployment adds depends on their number.
BASE = {"dataset": "crime", "num-parties": 3, "num-server-rounds": ROUNDS, "eval-every": ROUNDS, "epsilon": 0.05}
KEYS = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("parties")
    return out, export(RunConfig.from_flower(BASE), out, demo_keys=True)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory, exported):
    """The same run config in simulation: the export's, secure aggregation included (on by
    default in a deployment), without the server's label file (the simulation's server reads
    the dataset)."""
    _, manifest = exported
    assert manifest["run_config"]["privacy.secure-aggregation"] is True
    deployed = {k: v for k, v in manifest["run_config"].items() if k != "server-labels"}
    summary, _ = run_inprocess({**BASE, **deployed, "output-dir": str(tmp_path_factory.mktemp("sim"))})
    return summary


def _federation(home: Path, manifest: dict, security=None) -> LocalFederation:
    # Flower's default 1 s task poll, as docs/deploy.md advises for SuperNodes that share a small
    # machine: polling at 0.05 s costs CPU that the suite's other worker needs (docs/testing.md).
    env = {"FAIRVFL_CACHE_DIR": str(home / "party-cache")}
    return LocalFederation(home, manifest["node_configs"], security=security, env=env)


def _run(fed: LocalFederation, manifest: dict, out: Path) -> tuple[str, str]:
    return fed.run({**BASE, **manifest["run_config"], "output-dir": str(out)}, timeout=480)


def _result(out: Path) -> tuple[dict, list]:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return json.loads((run / "summary.json").read_text()), json.loads((run / "history.json").read_text())


@pytest.fixture(scope="module")
def federation(tmp_path_factory, exported):
    _, manifest = exported
    with _federation(tmp_path_factory.mktemp("fed"), manifest) as fed:
        yield fed


def test_deployed_run_completes_and_equals_simulation(federation, exported, simulated, tmp_path, monkeypatch):
    _, manifest = exported
    cli_calls = []
    cli = federation.flwr
    monkeypatch.setattr(federation, "flwr", lambda *args, **kw: (cli_calls.append(args[0]), cli(*args, **kw))[1])
    run_id, status = _run(federation, manifest, tmp_path)
    assert status == "finished:completed", federation.logs(run_id)[-3000:]
    # the harness asked the Control API for the status: no `flwr ls` interpreter per poll
    assert cli_calls == ["run"], cli_calls
    summary, history = _result(tmp_path)
    assert summary["rounds"] == ROUNDS and len(history) == ROUNDS + 1
    for key in KEYS:
        assert summary[key] == simulated[key], key
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert json.loads((run / "config.json").read_text())["dataset-summary"] is None  # the server held no table


def test_misaligned_party_file_is_refused_before_round_1(federation, exported, tmp_path):
    out, manifest = exported
    path = out / "party2.csv"
    backup = tmp_path / "party2.orig.csv"
    shutil.copy(path, backup)
    try:
        df = pd.read_csv(path)
        df.drop(index=7).to_csv(path, index=False)  # the party lost one row
        run_id, status = _run(federation, manifest, tmp_path / "out")
        logs = federation.logs(run_id)
    finally:
        shutil.copy(backup, path)
    assert status != "finished:completed"
    assert "partition 2, passive) is not aligned" in logs and "Refused before round 1" in logs, logs[-3000:]
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert not (run / "history.json").exists()  # no round was recorded


@pytest.mark.deploy_long
def test_tls_and_node_authentication(tmp_path, exported, simulated):
    _, manifest = exported
    security = make_security(tmp_path / "secrets", parties=len(manifest["node_configs"]))
    with _federation(tmp_path / "fed", manifest, security) as fed:
        run_id, status = _run(fed, manifest, tmp_path / "out")
        assert status == "finished:completed", fed.logs(run_id)[-3000:]
        assert fed.status(run_id) == (status, True)  # the Control API over TLS, not the CLI
    summary, _ = _result(tmp_path / "out")
    for key in KEYS:
        assert summary[key] == simulated[key], key


@pytest.mark.deploy_long
def test_unregistered_supernode_is_rejected(tmp_path, exported):
    """With authentication on, a SuperNode whose key was not registered never joins."""
    _, manifest = exported
    security = make_security(tmp_path / "secrets", parties=2)
    security.node_keys = security.node_keys[:1]  # only party 0's key is registered
    fed = LocalFederation(tmp_path / "fed", manifest["node_configs"][:1], security=security)
    try:
        fed.start(timeout=60)
        log = open(tmp_path / "intruder.log", "w")
        intruder = subprocess.Popen(
            [str(BIN / "flower-supernode"), "--superlink", f"{HOST}:{fed.port}", "--port", str(free_port()),
             "--root-certificates", str(security.ca_cert), "--auth-supernode-private-key",
             str(tmp_path / "secrets" / "keys" / "party1"),
             "--node-config", config_text(manifest["node_configs"][1])],
            env={**fed.env, "FLWR_HOME": str(tmp_path / "intruder")}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            time.sleep(15)  # long enough to join if it could (a registered node joins within seconds)
            nodes = json.loads(fed.flwr("supernode", "list", "local", "--format", "json"))["nodes"]
            assert sum(str(n.get("status", "")).lower() == "online" for n in nodes) == 1
        finally:
            os.killpg(intruder.pid, signal.SIGKILL)
            intruder.wait()
            log.close()
    finally:
        fed.stop()
