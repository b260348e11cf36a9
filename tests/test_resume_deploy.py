"""The ServerApp's process dies mid-training on a loopback deployment; the run resumes bit for bit.

A real SuperLink and 4 SuperNodes, each with its own raw table, identity key and state
folder (node config ``state-dir``: its disk), masked (secure aggregation), block Newton,
checkpoints every round. Once the server has checkpointed round 2 its ``flwr-serverapp``
process is killed (SIGKILL: a crash, nothing flushed). A second ``flwr run`` with
``reliability.resume-from`` continues it: every party returns to its stored state of the
checkpoint's round at the resumed run's first key set-up, a rollback every party signs
(secure/agreement.py), and the run ends with the model of an undisturbed run on the same
tables, bit for bit (the in-process run: test_align_deploy.py shows a deployment equals it).
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.features.checkpoint import SERVER_FILE, load_server
from fairvfl_flwr.tools.localfed import LocalFederation

from .test_align import BASE, own_config
from .test_rejoin_deploy import own_federation

# A deployed run, a crash and a second deployed run: minutes on a 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.deploy_long]
pytest.importorskip("private_set_intersection")

ROUNDS = 5
KILL_AFTER = 2  # the server's checkpoint round when its process is killed
RUN = {"num-server-rounds": ROUNDS, "eval-every": ROUNDS, "optimizer": "newton", "stop-tolerance": 0.0,
       "privacy.secure-aggregation": True, "reliability.round-timeout": 90.0, "reliability.checkpoint-every": 1}
KEYS = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn", "rounds")


def _checkpoint_round(out: Path) -> int:
    runs = [p for p in out.iterdir() if p.is_dir()] if out.exists() else []
    if not runs or not (runs[0] / SERVER_FILE).exists():
        return -1
    try:
        return int(load_server(runs[0])[0]["round"])
    except Exception:  # noqa: BLE001  (being replaced right now: read again)
        return -1


def _serverapps(superlink_pid: int) -> list[int]:
    """The ``flwr-serverapp`` processes descended from the SuperLink (through its SuperExec)."""

    def parent(pid: int) -> int:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])

    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:2]
            if not any(os.path.basename(a) == b"flwr-serverapp" for a in argv):
                continue
            pid = int(entry.name)
            while pid > 1 and pid != superlink_pid:
                pid = parent(pid)
            if pid == superlink_pid:
                pids.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def test_the_serverapp_dies_mid_training_and_the_resumed_run_ends_as_an_undisturbed_one(tmp_path):
    started = time.monotonic()
    tables, nodes, env = own_federation(tmp_path)
    out = tmp_path / "dep"
    run_config = {**BASE, **RUN, "tables.own": True, "output-dir": str(out)}
    with LocalFederation(tmp_path / "fed", nodes, env=env) as fed:
        run_id = fed.submit(run_config)
        deadline = time.monotonic() + 600
        while _checkpoint_round(out) < KILL_AFTER:
            assert time.monotonic() < deadline, fed.logs(run_id)[-3000:]
            time.sleep(0.2)
        superlink = next(e for e in fed.procs if e[0] == "superlink")
        victims = _serverapps(superlink[1].pid)
        assert victims, "no flwr-serverapp process found under the SuperLink"
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        (folder,) = [p for p in out.iterdir() if p.is_dir()]
        crashed_at = int(load_server(folder)[0]["round"])
        assert KILL_AFTER <= crashed_at < ROUNDS
        assert not (folder / "summary.json").exists()  # the first run never finished
        run_id2, status = fed.run({**run_config, "reliability.resume-from": str(folder)}, timeout=900)
        logs = fed.logs(run_id2)
    assert status == "finished:completed", logs[-4000:]
    assert f"resuming from round {crashed_at}" in logs, logs[-4000:]
    deployed = json.loads((folder / "summary.json").read_text())
    history = json.loads((folder / "history.json").read_text())
    assert [row["round"] for row in history] == list(range(ROUNDS + 1))
    undisturbed_rc = own_config(tables, **{**RUN, "reliability.checkpoint-every": 0, "output-dir": str(tmp_path / "sim")})
    undisturbed, sim = run_inprocess(undisturbed_rc, quiet=True)
    for key in KEYS:
        assert deployed[key] == undisturbed[key], key
    reference = json.loads((sim / "history.json").read_text())
    assert [(r["loss"], r["max_gap"]) for r in history] == [(r["loss"], r["max_gap"]) for r in reference]
    print(f"\nServerApp killed after checkpoint round {crashed_at}; resumed to round {ROUNDS}; "
          f"test took {time.monotonic() - started:.0f} s")
