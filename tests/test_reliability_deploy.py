"""Faults on the real deployment runtime: a SuperNode stops mid-run, is restarted, the run resumes.

A loopback SuperLink and 6 SuperNodes (exported Crime party files, each party with its own
state-dir, i.e. its own disk; masked, as an export's run config is). Party 3's SuperNode is stopped (SIGTERM to its process
group: the SuperNode and its ClientApp processes) as soon as the server has written a
checkpoint; the run must end as failed, with the party named, history and checkpoint on
disk. Then that SuperNode is started again (it gets a new node id) and ``reliability.resume-from``
continues the run: the final metrics equal an uninterrupted run with the same seed
(the in-process run; test_deploy.py shows deployment equals it).
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from fairvfl_flwr.features.checkpoint import SERVER_FILE, load_server
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.tools.export import export
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.tools.cli import config_text
from fairvfl_flwr.tools.localfed import BIN, HOST, LocalFederation, free_port

# The longest fault test (two federations, a kill and a restart): left out of the default run.
pytestmark = [pytest.mark.slow, pytest.mark.deploy_long]

ROUNDS = 2
VICTIM = 3
# round-timeout: longer than one deployed round on a busy 2-core machine; a stopped SuperNode
# is reported unavailable by Flower at once, so the run does not wait this long.
TIMEOUT = float(os.environ.get("FAIRVFL_TEST_ROUND_TIMEOUT", "90"))
BASE = {"dataset": "crime", "num-server-rounds": ROUNDS, "eval-every": ROUNDS, "epsilon": 0.05, "optimizer": "gd",
        "reliability.checkpoint-every": 1, "reliability.round-timeout": TIMEOUT, "reliability.round-retries": 1}
KEYS = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn", "rounds")
ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05"}


def _run_folder(out: Path) -> Path | None:
    runs = [p for p in out.iterdir() if p.is_dir()] if out.exists() else []
    return runs[0] if runs else None


def _checkpoint_round(out: Path) -> int:
    folder = _run_folder(out)
    if folder is None or not (folder / SERVER_FILE).exists():
        return -1
    try:
        return int(load_server(folder)[0]["round"])
    except Exception:  # noqa: BLE001  (being replaced right now: read again)
        return -1


def test_killed_party_stops_the_run_then_restart_and_resume_equals_uninterrupted(tmp_path):
    started = time.monotonic()
    parties = tmp_path / "parties"
    manifest = export(RunConfig.from_flower(BASE), parties, demo_keys=True)
    nodes = [{**cfg, "state-dir": str(tmp_path / f"party{i}-disk")} for i, cfg in enumerate(manifest["node_configs"])]
    # rejoin-timeout 0: the run stops when the party goes, and resume-from continues it
    run_config = {**BASE, **manifest["run_config"], "reliability.rejoin-timeout": 0.0,
                  "output-dir": str(tmp_path / "runs")}
    reference, _ = run_inprocess({**run_config, "reliability.checkpoint-every": 0, "output-dir": str(tmp_path / "reference")})

    env = {**ENV, "FAIRVFL_CACHE_DIR": str(tmp_path / "party-cache")}
    with LocalFederation(tmp_path / "fed", nodes, env=env) as fed:
        run_id = fed.submit(run_config)
        deadline = time.monotonic() + 300
        while _checkpoint_round(tmp_path / "runs") < 1:
            assert time.monotonic() < deadline, fed.logs(run_id)[-3000:]
            time.sleep(0.2)
        entry = next(e for e in fed.procs if e[0] == f"supernode{VICTIM}")
        os.killpg(entry[1].pid, signal.SIGTERM)  # the party's machine goes down mid-run
        killed_at = time.monotonic()
        entry[1].wait(timeout=30)
        fed.procs.remove(entry)  # stopped on purpose: not an error for wait_nodes()
        entry[2].close()
        status = fed.wait(run_id, timeout=TIMEOUT * 3 + 120)
        stopped_after = time.monotonic() - killed_at
        logs = fed.logs(run_id)
        assert status.startswith("finished") and status != "finished:completed", logs[-3000:]
        assert f"(partition {VICTIM}, passive) left the federation" in logs, logs[-3000:]
        assert "run stopped after round" in logs, logs[-3000:]
        folder = _run_folder(tmp_path / "runs")
        r = load_server(folder)[0]["round"]
        assert 1 <= r < ROUNDS
        history = json.loads((folder / "history.json").read_text())
        assert history[0]["round"] == 0 and history[-1]["round"] >= r
        assert f'reliability.resume-from="{folder}"' in logs

        # the party comes back (same node config and disk, new node id) and the run resumes
        fed._spawn(
            f"supernode{VICTIM}-again",
            [str(BIN / "flower-supernode"), "--superlink", f"{HOST}:{fed.port}", "--port", str(free_port()),
             "--node-config", config_text(nodes[VICTIM]), "--insecure"],
            env={**fed.env, "FLWR_HOME": str(fed.home / f"node{VICTIM}-again")},
        )
        fed.wait_nodes(len(nodes), timeout=120)
        run_id2, status2 = fed.run({**run_config, "reliability.resume-from": str(folder)}, timeout=300)
        assert status2 == "finished:completed", fed.logs(run_id2)[-3000:]
        assert f"resuming from round {r}" in fed.logs(run_id2)

    summary = json.loads((folder / "summary.json").read_text())
    for key in KEYS:
        assert summary[key] == pytest.approx(reference[key], rel=1e-9, abs=1e-12), key
    history = json.loads((folder / "history.json").read_text())
    assert [row["round"] for row in history] == list(range(ROUNDS + 1))
    print(f"\nkilled after checkpoint round {r}; run stopped {stopped_after:.1f} s later; "
          f"max |diff| vs uninterrupted: {max(abs(summary[k] - reference[k]) for k in KEYS):.3g}; "
          f"test took {time.monotonic() - started:.0f} s")
