"""A party's restart on a loopback deployment costs a round, not the run (features/rejoin.py).

A real SuperLink and 4 SuperNodes, each with its own raw table, its own identity key and
its own state folder (node config ``state-dir``: its disk), masked (secure aggregation),
block Newton. Mid-training a passive party's SuperNode is stopped (SIGTERM to its process
group: the SuperNode and its ClientApp processes) and started again at once with the same
node config; later the label owner's. The run completes, and ends with the same model as an
undisturbed run on the same tables, bit for bit (the in-process run: test_align_deploy.py
shows a deployment equals it).
"""

import json
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.secure import identity
from fairvfl_flwr.tools.cli import config_text
from fairvfl_flwr.tools.localfed import BIN, HOST, LocalFederation, free_port

from .test_align import BASE, ID, adult_raw, own_config, own_node, write_own_tables

# Two restarts over a deployed run of a few rounds: minutes on a 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.deploy_long]
pytest.importorskip("private_set_intersection")

ROUNDS = 6
RUN = {"num-server-rounds": ROUNDS, "eval-every": 3, "optimizer": "newton", "stop-tolerance": 0.0,
       "privacy.secure-aggregation": True, "reliability.round-timeout": 90.0, "reliability.rejoin-timeout": 120.0}
KEYS = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn", "rounds")
ID_NAMES = ["customer", "client_no", "kundennummer", "policy holder"]
KILLS = ((2, 2), (0, 4))  # (partition, the round it has completed when its SuperNode is stopped)


def _state_round(folder: Path) -> int:
    rounds = [int(p.stem.split("-")[1]) for p in folder.glob("run-*/partition-*/round-*.npz")]
    return max(rounds, default=-1)


def _restart(fed: LocalFederation, k: int, node: dict, attempt: int) -> None:
    entry = next(e for e in fed.procs if e[0].startswith(f"supernode{k}"))
    os.killpg(entry[1].pid, signal.SIGTERM)  # the party's machine goes down mid-run
    entry[1].wait(timeout=30)
    fed.procs.remove(entry)  # stopped on purpose: not an error for wait_nodes()
    entry[2].close()
    fed._spawn(f"supernode{k}-again{attempt}",
               [str(BIN / "flower-supernode"), "--superlink", f"{HOST}:{fed.port}", "--port", str(free_port()),
                "--node-config", config_text(node), "--insecure"],
               env={**fed.env, "FLWR_HOME": str(fed.home / f"node{k}-again{attempt}")})


def own_federation(tmp_path: Path) -> tuple[Path, list[dict], dict]:
    """Four organisations' own tables (Adult, each with its own id column name), each party's node
    config with its identity key and its own state folder, and the federation's environment."""
    tables = tmp_path / "tables"
    tables.mkdir()
    write_own_tables(adult_raw(), tables)
    identities = identity.generate_identities(tmp_path / "identities", len(ID_NAMES))
    nodes = []
    for k, id_name in enumerate(ID_NAMES):
        path = tmp_path / f"own{k}.csv"
        pd.read_csv(tables / f"party{k}.csv").rename(columns={ID: id_name}).to_csv(path, index=False)
        nodes.append(own_node(k, path, id_name, **{"state-dir": str(tmp_path / f"disk{k}")}, **identities[k]))
    env = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05", "FAIRVFL_CACHE_DIR": str(tmp_path / "party-cache")}
    return tables, nodes, env


def test_a_passive_party_and_the_label_owner_restart_mid_training_and_the_run_ends_undisturbed(tmp_path):
    started = time.monotonic()
    tables, nodes, env = own_federation(tmp_path)
    out = tmp_path / "dep"
    with LocalFederation(tmp_path / "fed", nodes, env=env) as fed:
        run_id = fed.submit({**BASE, **RUN, "tables.own": True, "output-dir": str(out)})
        for attempt, (k, after) in enumerate(KILLS):
            deadline = time.monotonic() + 600
            while _state_round(tmp_path / f"disk{k}") < after:
                assert time.monotonic() < deadline, fed.logs(run_id)[-3000:]
                time.sleep(0.2)
            _restart(fed, k, nodes[k], attempt)
        status = fed.wait(run_id, timeout=900)
        logs = fed.logs(run_id)
    assert status == "finished:completed", logs[-4000:]
    for k, _ in KILLS:
        role = "active" if k == 0 else "passive"
        assert f"(partition {k}, {role}) dropped out in round" in logs, logs[-4000:]
    assert logs.count("every party restored round") == len(KILLS), logs[-4000:]
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    deployed = json.loads((run / "summary.json").read_text())
    history = json.loads((run / "history.json").read_text())
    assert [row["round"] for row in history] == list(range(ROUNDS + 1))
    undisturbed, _ = run_inprocess(own_config(tables, **RUN, **{"output-dir": str(tmp_path / "sim")}), quiet=True)
    for key in KEYS:
        assert deployed[key] == undisturbed[key], key
    print(f"\ntwo restarts (partition 2 after round 2, the label owner after round 4); "
          f"test took {time.monotonic() - started:.0f} s")
