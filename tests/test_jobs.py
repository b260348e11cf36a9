"""A new job is one module plus one registration (docs/architecture.md, "Adding a job"): the
module below declares its message type, its party handler, its server entry and the mode
that selects it; registering it is all the ServerApp's dispatch, the ClientApp's handlers,
the protocol's message list and the run config's modes need."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.flower import exchange, jobs
from fairvfl_flwr.flower.discovery import discover_nodes
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.party import Handles, PartyRuntime, handlers
from fairvfl_flwr.flower.results import run_folder


# -- the job's module: each party reports its aligned row counts ---------------------------
ROW_COUNTS = "query.rowcounts"
COUNTS = "counts"


def report_counts(message: Message, context) -> Message:
    """A party's rows (training and test) and the digest of their ids: counts, never a row."""
    rt = PartyRuntime(context)
    return Message(RecordDict({COUNTS: ConfigRecord({
        "partition-id": rt.data.partition_id, "role": rt.data.role, "n-train": rt.n_train,
        "n-test": int(rt.data.X_test.shape[0]), "ids-digest": rt.data.ids_digest})}), reply_to=message)


def count_rows(grid, cfg: RunConfig, run_id=None):
    """Ask every party for its row counts; refuse parties whose rows are not aligned; write row-counts.json."""
    nodes = discover_nodes(grid, cfg.num_parties, cfg.round_timeout, "the row count")
    asked = [Message(RecordDict(), dst_node_id=nid, message_type=ROW_COUNTS, group_id="rows") for nid in nodes]
    replies = exchange.exchange(grid, asked, cfg.round_timeout, cfg.round_retries, lambda nid: f"node {nid}")
    counts = {int(r.content.config_records[COUNTS]["partition-id"]): dict(r.content.config_records[COUNTS])
              for r in replies}
    if len({(c["n-train"], c["n-test"], c["ids-digest"]) for c in counts.values()}) != 1:
        raise FederationError(f"the parties' rows are not aligned: {counts}")
    folder = run_folder(cfg, run_id)
    summary = {"mode": cfg.mode, "parties": {str(k): counts[k] for k in sorted(counts)}}
    (folder / "row-counts.json").write_text(json.dumps(summary))
    return summary, folder


JOB = jobs.Job("row counts", handlers({ROW_COUNTS: Handles(msgs.Kind.QUERY, report_counts)}), run=count_rows,
               modes=("row-counts",))


# -- its registration, and the job run through the real ServerApp and ClientApp ------------------
@pytest.fixture
def row_counts_job():
    jobs.register(JOB)  # the one registration (the app's own jobs: app/jobs.py)
    yield JOB
    jobs.unregister(JOB.name)


def test_a_new_job_runs_through_the_server_app_and_client_app(row_counts_job, run_app, tmp_path):
    assert ROW_COUNTS in jobs.message_types() and jobs.selected({"mode": "row-counts"}) is JOB
    rc = {"dataset": "crime", "num-parties": 3, "mode": "row-counts", "output-dir": str(tmp_path)}
    seen = []
    run = run_app(rc, tap=lambda m: seen.append(m.metadata.message_type))
    ds = load_data(RunConfig.from_flower(rc))
    assert seen == [ROW_COUNTS] * 3  # the job's own messages only, each answered by the real ClientApp
    assert sorted(run.summary["parties"]) == ["0", "1", "2"]
    for pid, counts in run.summary["parties"].items():
        assert counts["n-train"] == len(ds.y_train) and counts["n-test"] == len(ds.y_test)
        assert counts["role"] == ("active" if pid == "0" else "passive")
    assert json.loads((run.folder / "row-counts.json").read_text()) == run.summary


def test_an_unregistered_job_is_no_mode_and_no_message_type_of_the_protocol(row_counts_job):
    jobs.unregister(JOB.name)
    try:
        assert ROW_COUNTS not in jobs.message_types()
        with pytest.raises(ConfigError, match=r"mode='row-counts': choose one of"):
            RunConfig.from_flower({"mode": "row-counts"})
    finally:
        jobs.register(JOB)  # the fixture unregisters it


def test_the_client_app_answers_where_no_job_was_registered(tmp_path):
    """Flower's simulation loads the ClientApp once and ships it to its workers: there the app
    answers from its own routing, though that process never imported app/jobs.py."""
    cloudpickle = pytest.importorskip("cloudpickle")
    from fairvfl_flwr.app.client import app as client_app

    (tmp_path / "app.pkl").write_bytes(cloudpickle.dumps(client_app))
    code = f"""
import pickle, sys
from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # as the in-process grid sets them
app = pickle.loads(open({str(tmp_path / "app.pkl")!r}, "rb").read())
from fairvfl_flwr.flower import jobs
assert jobs.registered() == () and "fairvfl_flwr.app.jobs" not in sys.modules
context = Context(run_id=1, node_id=7, node_config={{"partition-id": 1, "num-partitions": 3}}, state=RecordDict(),
                  run_config={{"dataset": "crime", "num-parties": 3}})
message = Message(RecordDict(), dst_node_id=7, message_type="query.info", group_id="0")
message.metadata.__dict__["_message_id"] = "m"
reply = app(message, context)
print(dict(reply.content.config_records["info"])["role"])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "passive"
