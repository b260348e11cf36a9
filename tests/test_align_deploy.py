"""Own tables on a loopback deployment: a real flower-superlink and 3 flower-supernode
processes, each SuperNode naming its raw table and its own id column. The run aligns
(every message in a fresh ClientApp process: the PSI keys live in each node's state),
trains and saves; its numbers equal the in-process run on the same tables. A scoring job
that names only the mode and the model then aligns each party's fresh raw file (node config
score-path) and scores the rows all hold, as the in-process grid does. On the same federation,
a label owner's table with a third label value is refused in one paragraph that holds no value."""

import json
import shutil

import pandas as pd
import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.secure import identity
from fairvfl_flwr.tools.localfed import LocalFederation

from .test_align import BASE, ID, PARTY_COLUMNS, adult_raw, own_config, own_node, write_own_tables

MASKED = {"privacy.secure-aggregation": True}  # a deployed party refuses anything else
# Every deployed message is a fresh ClientApp process per party. Three parties (the label
# owner and two passive ones) and two rounds, both evaluated, carry each party's state (model,
# masks' keys, alignment) from one process to the next as four parties and twelve rounds would.
SMALL = {"num-parties": 3, "num-server-rounds": 2, "eval-every": 1}
THREE = [PARTY_COLUMNS[0], PARTY_COLUMNS[1], PARTY_COLUMNS[2] + PARTY_COLUMNS[3]]  # each party's columns

pytestmark = pytest.mark.slow
pytest.importorskip("private_set_intersection")

KEYS = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn")
ID_NAMES = ["customer", "kundennummer", "policy holder"]


@pytest.fixture(scope="module")
def own_federation(tmp_path_factory):
    """3 SuperNodes, each naming its own raw table under its own id column name and a fresh
    score file (node config score-path); deployed: signed and masked. Both tests run on it (a
    federation's start is a SuperLink and a SuperNode per party). Yields the federation, its
    folder, the tables in the in-process run's format and the ids the score files share."""
    tmp = tmp_path_factory.mktemp("own-deploy")
    tables = tmp / "tables"
    tables.mkdir()
    held = write_own_tables(adult_raw(), tables, columns=THREE)
    fresh = sorted(set.intersection(*held))[:300]  # rows whose categories training saw
    nodes = []
    identities = identity.generate_identities(tmp / "identities", len(ID_NAMES))  # deployed: signed and masked
    for k, id_name in enumerate(ID_NAMES):
        path = tmp / f"own{k}.csv"
        df = pd.read_csv(tables / f"party{k}.csv")
        df.rename(columns={ID: id_name}).to_csv(path, index=False)
        score = df.set_index(ID).loc[fresh[10 * k:]].drop(columns=["income", "sex"], errors="ignore")
        score.sample(frac=1, random_state=k).reset_index().to_csv(tables / f"score{k}.csv", index=False)
        score.sample(frac=1, random_state=k).reset_index().rename(columns={ID: id_name}).to_csv(
            tmp / f"score{k}.csv", index=False)
        nodes.append(own_node(k, path, id_name, **{"score-path": str(tmp / f"score{k}.csv")}, **identities[k]))
    env = {"FAIRVFL_CACHE_DIR": str(tmp / "party-cache")}
    with LocalFederation(tmp / "fed", nodes, env=env) as fed:
        yield fed, tmp, tables, fresh


def test_loopback_deployment_with_own_tables_equals_the_inprocess_run(own_federation, tmp_path):
    fed, _, tables, fresh = own_federation
    out = tmp_path / "dep"
    run_id, status = fed.run({**BASE, **SMALL, **MASKED, "tables.own": True, "output-dir": str(out)}, timeout=900)
    assert status == "finished:completed", fed.logs(run_id)[-3000:]
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    run_id, status = fed.run({"mode": "score", "score.model-from": str(run),
                              "output-dir": str(tmp_path / "dep-score")}, timeout=300)
    assert status == "finished:completed", fed.logs(run_id)[-3000:]
    deployed = json.loads((run / "summary.json").read_text())
    simulated, sim_run = run_inprocess(own_config(tables, **SMALL, **MASKED, **{"output-dir": str(tmp_path / "sim")}), quiet=True)
    for key in KEYS:
        assert deployed[key] == simulated[key], key
    assert (run / "model.json").is_file()
    _, sim_scored = run_inprocess({"mode": "score", "score.model-from": str(sim_run), "output-dir": str(tmp_path / "ss"),
                                   "score.path": str(tables / "score{partition}.csv")}, quiet=True)
    (scored,) = [p for p in (tmp_path / "dep-score").iterdir() if p.is_dir()]
    got, want = (pd.read_csv(f / "predictions.csv", dtype={"id": str}) for f in (scored, sim_scored))
    assert got["id"].tolist() == want["id"].tolist() and sorted(got["id"]) == sorted(fresh[10 * (len(ID_NAMES) - 1):])
    assert got["probability"].to_numpy() == pytest.approx(want["probability"].to_numpy(), rel=1e-6, abs=1e-9)


def test_a_deployed_run_with_a_third_label_value_fails_with_one_paragraph_and_no_value(own_federation, tmp_path):
    """The label owner's table gains a third label value (then gets its own back)."""
    fed, folder, _, _ = own_federation
    path = folder / "own0.csv"
    backup = tmp_path / "own0.orig.csv"
    shutil.copy(path, backup)
    out = tmp_path / "dep"
    try:
        df = pd.read_csv(path)
        df.loc[df.index[df["income"] == ">50K"][:37], "income"] = ">50K."
        df.to_csv(path, index=False)
        run_id, status = fed.run({**BASE, **SMALL, **MASKED, "tables.own": True, "output-dir": str(out)}, timeout=300)
        server_log = fed.logs(run_id)
        party_log = fed.log("supernode0")
    finally:
        shutil.copy(backup, path)
    assert status == "finished:failed", server_log[-3000:]
    refusal = [line for line in server_log.splitlines() if "FairVFL refused the run" in line]
    assert len(refusal) == 1 and "party 0: 1 problem" in refusal[0], server_log[-3000:]
    assert "Traceback" not in server_log and ">50K." not in server_log
    assert not any(i in server_log for i in df[ID_NAMES[0]].iloc[::50])
    assert "'>50K.' in 37 rows" in party_log  # the details stay with the party
    assert not out.exists() or not any(out.iterdir())
