"""Own tables on a loopback deployment: a real flower-superlink and 4 flower-supernode
processes, each SuperNode naming its raw table and its own id column. The run aligns
(every message in a fresh ClientApp process: the PSI keys live in each node's state),
trains and saves; its numbers equal the in-process run on the same tables."""

import json

import pandas as pd
import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.tools.localfed import LocalFederation

from .test_align import BASE, ID, adult_raw, own_config, write_own_tables

pytestmark = pytest.mark.slow
pytest.importorskip("private_set_intersection")

KEYS = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn")
ID_NAMES = ["customer", "client_no", "kundennummer", "policy holder"]


def test_loopback_deployment_with_own_tables_equals_the_inprocess_run(tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    write_own_tables(adult_raw(), tables)
    nodes = []
    for k, id_name in enumerate(ID_NAMES):
        path = tmp_path / f"own{k}.csv"
        pd.read_csv(tables / f"party{k}.csv").rename(columns={ID: id_name}).to_csv(path, index=False)
        node = {"partition-id": k, "table-path": str(path), "id-column": id_name,
                "role": "active" if k == 0 else "passive"}
        if k == 0:
            node.update({"label-column": "income", "label-positive": ">50K", "sensitive-column": "sex",
                         "group-a": "Female", "group-b": "Male", "protected-label": 1})
        nodes.append(node)
    env = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05", "FAIRVFL_CACHE_DIR": str(tmp_path / "party-cache")}
    out = tmp_path / "dep"
    with LocalFederation(tmp_path / "fed", nodes, env=env) as fed:
        run_id, status = fed.run({**BASE, "tables.own": True, "output-dir": str(out)}, timeout=480)
        assert status == "finished:completed", fed.logs(run_id)[-3000:]
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    deployed = json.loads((run / "summary.json").read_text())
    simulated, _ = run_inprocess(own_config(tables, **{"output-dir": str(tmp_path / "sim")}), quiet=True)
    for key in KEYS:
        assert deployed[key] == simulated[key], key
    assert (run / "model.json").is_file()
