"""Deployed means authenticated and masked; keys are made where they are used (fairvfl-keys)."""

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.secure import agreement, identity
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.tools.export import export
from fairvfl_flwr.tools.keys import main as keys_main
from fairvfl_flwr.tools.malicious import LyingGrid, decoded_sums


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("parties")
    return export(RunConfig(dataset="crime", num_parties=3), out, demo_keys=True)


class Recording(InProcessGrid):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.replies, self.dtypes = [], []

    def pull_messages(self, message_ids):
        got = list(super().pull_messages(message_ids))
        self.replies += got
        self.dtypes += [r.content.array_records[msgs.LOGITS]["train"].numpy().dtype for r in got
                        if not r.has_error() and msgs.LOGITS in r.content.array_records]  # as it arrived
        return got


def _run(manifest, tmp_path, nodes, **extra):
    rc = RunConfig.from_flower({"num-server-rounds": 2, **manifest["run_config"], "output-dir": str(tmp_path / "runs"),
                                **extra}).to_flower()
    grid = Recording(client_app, rc, len(nodes), node_configs=nodes)
    return grid, (lambda: run_server(grid, rc))


def _logits(grid):
    return [r for r in grid.replies if not r.has_error() and msgs.LOGITS in r.content.array_records]


@pytest.mark.parametrize("reads", ["data-path", "table-path", "score-path"])
def test_a_node_reading_its_own_data_without_keys_refuses_naming_the_settings_and_the_key_tool(exported, tmp_path,
                                                                                              reads):
    nodes = [{k: v for k, v in n.items() if k not in (identity.IDENTITY_KEY, identity.PEERS)}
             for n in exported["node_configs"]]
    if reads != "data-path":  # the check reads the node config only: the file need not be a table of that kind
        nodes[1][reads] = nodes[1]["data-path"]
    grid, run = _run(exported, tmp_path, nodes)
    with pytest.raises(FederationError) as err:
        run()
    why = str(err.value)
    assert "'identity-key'" in why and "'peers'" in why and "fairvfl-keys new" in why and "allow-unmasked=true" in why
    assert _logits(grid) == []


def test_an_unmasked_run_is_refused_by_every_deployed_party_before_any_logit_leaves(exported, tmp_path):
    grid, run = _run(exported, tmp_path, exported["node_configs"], **{"privacy.secure-aggregation": False})
    with pytest.raises(FederationError, match=r"not masked \(privacy.secure-aggregation=false\) and this node holds an identity key"):
        run()
    refused = [r for r in grid.replies if r.has_error()]
    assert len({r.metadata.src_node_id for r in refused}) == 3  # every party, at its first message
    assert all(r.metadata.message_type == msgs.INFO for r in refused)
    assert _logits(grid) == []


def test_a_node_that_allows_unmasked_runs_takes_part_and_a_masked_run_needs_no_setting(exported, tmp_path):
    # the waiver is for nodes without identity keys: a node that holds them refuses unmasked jobs
    nodes = [{**{k: v for k, v in n.items() if k not in ("identity-key", "peers")}, "allow-unmasked": True}
             for n in exported["node_configs"]]
    grid, run = _run(exported, tmp_path / "plain", nodes, **{"privacy.secure-aggregation": False})
    run()
    assert grid.dtypes and all(d.kind == "f" for d in grid.dtypes)
    grid, run = _run(exported, tmp_path / "masked", exported["node_configs"])
    run()
    assert grid.dtypes and all(d == np.uint64 for d in grid.dtypes)


def test_a_deployment_is_masked_unless_its_run_config_says_otherwise(exported, tmp_path):
    """privacy.secure-aggregation='auto' (the default): on where the parties read their own data."""
    auto = {k: v for k, v in exported["run_config"].items() if k != "privacy.secure-aggregation"}
    assert RunConfig.from_flower(auto).secure_aggregation == "auto"
    grid, run = _run({**exported, "run_config": auto}, tmp_path, exported["node_configs"])
    run()
    assert grid.dtypes and all(d == np.uint64 for d in grid.dtypes)
    assert RunConfig(tables_own=True).masked and not RunConfig().masked  # own tables yes; packaged tables no
    assert not RunConfig(tables_own=True, secure_aggregation="false").masked


def _first_sums(manifest, folder, nodes, **extra) -> dict:
    """One round of gradient descent over ``nodes``: the server's decoded training sum of each round."""
    grid, run = _run(manifest, folder, nodes, **{"num-server-rounds": 1, "optimizer": "gd", **extra})
    with decoded_sums() as sums:
        try:
            run()
        except FederationError:
            pass
    return sums, grid


def test_a_run_without_one_pinned_party_is_refused_so_two_runs_do_not_isolate_it(exported, tmp_path, monkeypatch):
    """The attack: the federation's round 1 once with every party and once without party 2
    (num-parties=2; each party's columns are its own file's, its start θ its seed's). The two
    masked sums differ by party 2's own partial logits, exactly. It can fail, and does: every
    party refuses a run that leaves out a party its pinned peers file holds, before any logit."""
    full, _ = _first_sums(exported, tmp_path / "full", exported["node_configs"])
    # the attack, with the parties' check taken out
    original = identity.peer_keys
    monkeypatch.setattr(identity, "peer_keys", lambda context, n: {j: k for j, k in original(
        context, len(exported["node_configs"])).items() if j < n})
    monkeypatch.setattr(agreement, "peer_keys", identity.peer_keys)
    without, _ = _first_sums(exported, tmp_path / "without", exported["node_configs"][:2], **{"num-parties": 2})
    plain = [{**{k: v for k, v in n.items() if k not in ("identity-key", "peers")}, "allow-unmasked": True}
             for n in exported["node_configs"]]
    grid, run = _run(exported, tmp_path / "plain", plain, **{"num-server-rounds": 1, "optimizer": "gd",
                                                              "privacy.secure-aggregation": False})
    run()
    party2 = [r.content.array_records[msgs.LOGITS]["train"].numpy() for r in _logits(grid)
              if r.metadata.src_node_id == grid.node_ids[2]]
    assert np.abs(party2[1]).max() > 1e-3  # a reply worth reading
    np.testing.assert_allclose(full[1] - without[1], party2[1], atol=1e-6)  # read off the difference
    # the parties' check: every one refuses, naming its peers file, and no logit reaches the server
    monkeypatch.undo()
    refused, grid = _first_sums(exported, tmp_path / "refused", exported["node_configs"][:2], **{"num-parties": 2})
    assert refused == {} and _logits(grid) == []
    reasons = [r.error.reason for r in grid.replies if r.has_error()]
    assert len(reasons) >= 1 and all("a run without parties [2] is refused" in why for why in reasons)


def test_demo_keys_are_refused_where_a_node_reads_its_own_data(exported, tmp_path):
    """allow-unmasked waives masking, never authentication: a masked run still needs its own key."""
    nodes = [{**{k: v for k, v in n.items() if k != identity.IDENTITY_KEY}, "allow-unmasked": True}
             for n in exported["node_configs"]]
    _, run = _run(exported, tmp_path, nodes)
    with pytest.raises(FederationError, match=r"names no 'identity-key'.*fairvfl-keys new"):
        run()


def test_the_logs_say_whether_a_run_is_authenticated_and_masked(exported, tmp_path, caplog):
    """The server's log says no party signed with a demo key, and each party's own log names the
    key it signed with (its fingerprint) and the pinned peers file it checked; a simulation says demo keys."""
    caplog.set_level(logging.INFO)
    _, run = _run(exported, tmp_path, exported["node_configs"])
    run()
    said = [r.getMessage() for r in caplog.records]
    assert sum("secure aggregation on" in m and "every party signed its key with its own identity key, none with a "
               "demo key" in m for m in said) == 1
    for k, node in enumerate(exported["node_configs"]):
        fp = identity.fingerprint(json.loads(Path(node[identity.PEERS]).read_text())[str(k)])
        assert any(m.startswith(f"party {k} (") and f"(fingerprint {fp})" in m and
                   f"verified against the pinned peers={node[identity.PEERS]}" in m for m in said), k
    caplog.clear()
    run_inprocess({"dataset": "crime", "num-parties": 3, "num-server-rounds": 1, "output-dir": str(tmp_path / "sim"),
                   "privacy.secure-aggregation": True})
    said = [r.getMessage() for r in caplog.records]
    assert any("parties 0, 1, 2 signed with the demo identity keys anyone can derive" in m for m in said)
    assert not any("verified against the pinned" in m for m in said)  # no peers file: nothing pinned to claim


def test_keys_new_where_it_cannot_write_says_so_without_a_traceback(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert keys_main(["new", "--out", str(tmp_path / "file" / "identity.key")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fairvfl-keys: ") and str(tmp_path / "file") in err and "Traceback" not in err


def test_keys_new_peers_and_fingerprints(tmp_path, capsys):
    publics = []
    for k in range(3):
        assert keys_main(["new", "--out", str(tmp_path / f"party{k}.key")]) == 0
        printed = capsys.readouterr().out
        public = printed.split("public key:")[1].split()[0]
        assert (tmp_path / f"party{k}.key.pub").read_text().strip() == public
        assert f"fingerprint: {identity.fingerprint(public)}" in printed
        assert (tmp_path / f"party{k}.key").stat().st_mode & 0o777 == 0o600
        publics.append(public)
    assert keys_main(["new", "--out", str(tmp_path / "party0.key")]) == 2  # never overwrites a pinned identity
    assert "exists" in capsys.readouterr().err
    assert keys_main(["peers", f"0={publics[0]}", f"1={tmp_path / 'party1.key.pub'}", f"2={publics[2]}",
                      "--out", str(tmp_path / "peers.json")]) == 0
    assert json.loads((tmp_path / "peers.json").read_text()) == {str(k): p for k, p in enumerate(publics)}
    capsys.readouterr()
    assert keys_main(["fingerprints", str(tmp_path / "peers.json")]) == 0
    assert capsys.readouterr().out.splitlines() == [f"party {k}: {identity.fingerprint(p)}" for k, p in enumerate(publics)]
    # a key that is not one, a party missing, one key twice: refused, naming it
    assert keys_main(["peers", "0=abcd", f"1={publics[1]}", "--out", str(tmp_path / "x.json")]) == 2
    assert "party 0" in capsys.readouterr().err
    assert keys_main(["peers", f"0={publics[0]}", f"2={publics[2]}", "--out", str(tmp_path / "x.json")]) == 2
    assert "0..K-1" in capsys.readouterr().err
    assert keys_main(["peers", f"0={publics[0]}", f"1={publics[0]}", "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


# -- refusals carry no data ------------------------------------------------------------
def test_a_duplicate_id_refusal_names_the_party_not_the_id(exported, tmp_path, caplog):
    caplog.set_level("INFO", logger="flwr")
    nodes = [dict(n) for n in exported["node_configs"]]
    table = pd.read_csv(nodes[2]["data-path"], dtype={"row_id": str})
    table.loc[7, "row_id"] = table.loc[3, "row_id"]
    nodes[2]["data-path"] = str(tmp_path / "party2.csv")
    table.to_csv(nodes[2]["data-path"], index=False)
    grid, run = _run(exported, tmp_path, nodes)
    with pytest.raises(FederationError, match=r"party2.csv.*duplicate ids \(examples in this party's own log\)") as err:
        run()
    dup = str(table.loc[3, "row_id"])
    seen = str(err.value) + "".join(r.error.reason for r in grid.replies if r.has_error())
    assert "e.g." not in seen
    assert any(f"duplicate ids, e.g. [{dup}]" in r.getMessage() for r in caplog.records)  # the party's own log


class HugeNu(LyingGrid):
    """A ν that drives party 2's logits far out of range in round 2."""

    def tamper(self, msg):
        rc = msg.content.config_records.get(msgs.ROUND)
        if (msg.metadata.message_type == msgs.TRAIN_PASSIVE and int(rc["round"]) == 2
                and msg.metadata.dst_node_id == self.node_ids[2]):
            nu = msg.content.array_records[msgs.PAYLOAD]["nu"].numpy()
            signs = np.where(np.arange(len(nu)) % 3 == 0, 1.0, -1.0)  # standardised columns sum to 0: not a constant
            msg.content.array_records[msgs.PAYLOAD] = msgs.array_record(nu=(3e8 * signs).astype(nu.dtype))


def test_a_refusal_of_an_out_of_range_logit_carries_no_magnitude(tmp_path, caplog):
    caplog.set_level("INFO", logger="flwr")
    rc = RunConfig.from_flower({**RunConfig().to_flower(), "optimizer": "gd", "dataset": "crime", "num-server-rounds": 3,
                                "privacy.secure-aggregation": True, "output-dir": str(tmp_path / "runs")}).to_flower()
    grid = HugeNu(client_app, rc, rc["num-parties"])
    with pytest.raises(FederationError, match=r"beyond the secure-aggregation range") as err:
        run_server(grid, rc)
    (refused,) = [r for r in grid.replies() if r.has_error()]
    assert "magnitude" not in refused.error.reason and "magnitude" not in str(err.value)
    assert any("of magnitude" in r.getMessage() for r in caplog.records)  # logged on the party only
