"""The node configuration (config/node.py): every key declared once, one reader, unknown keys refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fairvfl_flwr.config import node
from fairvfl_flwr.config.__main__ import generated
from fairvfl_flwr.config.node import NodeConfig, NodeConfigError
from fairvfl_flwr.data.partydata import party_spec

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fairvfl_flwr"


def test_a_misspelt_key_is_refused_naming_the_key_it_meant():
    with pytest.raises(NodeConfigError, match=r"node config missing-value='\?': unknown key \(did you mean "
                                              r"'missing-values'\?\)"):
        NodeConfig.from_flower({"partition-id": 0, "missing-value": "?"})
    # the run's own reader refuses it too, before the node reads any table
    with pytest.raises(NodeConfigError, match="did you mean 'table-path'"):
        party_spec({"partition-id": 0, "table_path": "/data/t.csv"}, 2, 1)


@pytest.mark.parametrize("key, value, why", [
    ("partition-id", "two", "expected int"),
    ("protected-label", 2, "give 1 .* or -1"),
    ("role", "boss", 'give role="active" or role="passive"'),
    ("delay-seconds", -0.5, "must be >= 0 seconds"),
    ("allow-unmasked", "perhaps", "expected bool"),
])
def test_a_bad_value_is_refused_naming_its_key(key, value, why):
    with pytest.raises(NodeConfigError, match=f"node config {key}=.*{why}"):
        NodeConfig.from_flower({"partition-id": 1, key: value})


def test_values_are_typed_as_declared_and_the_given_keys_kept():
    # Flower's Ray simulation hands partition-id as text; a SuperNode's TOML gives numbers and booleans
    cfg = NodeConfig.from_flower({"partition-id": "2", "num-partitions": 4, "role": " Passive ",
                                  "allow-unmasked": "true", "delay-seconds": 1})
    assert (cfg.partition_id, cfg.num_partitions, cfg.role, cfg.allow_unmasked, cfg.delay_seconds) == (
        2, 4, "passive", True, 1.0)
    assert cfg.given == {"partition-id", "num-partitions", "role", "allow-unmasked", "delay-seconds"}
    assert not cfg.deployed and NodeConfig.from_flower({"score-path": "s.csv"}).data_keys == ("score-path",)
    assert NodeConfig.from_flower({"partition-id": 2}) is NodeConfig.from_flower({"partition-id": 2})  # cached


def test_one_default_party_folder(monkeypatch, tmp_path):
    """Parsed tables, state and models of a node without cache-dir all go under one folder."""
    from fairvfl_flwr.data import model_files
    from fairvfl_flwr.data.partydata import cache_dir

    monkeypatch.setenv(node.CACHE_ENV, str(tmp_path / "env"))
    cfg = NodeConfig.from_flower({"partition-id": 1, "role": "passive", "table-path": "/t.csv"})
    assert cfg.folder == tmp_path / "env" == cache_dir(party_spec(cfg, 2, 1))
    assert model_files.block_folder(cfg, "", "7", 1) == tmp_path / "env" / "models" / "7" / "partition-1"
    own = NodeConfig.from_flower({"partition-id": 1, "cache-dir": str(tmp_path / "own")})
    assert own.folder == tmp_path / "own"
    monkeypatch.delenv(node.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert NodeConfig.from_flower({}).folder == tmp_path / "xdg" / "fairvfl-flwr"


def test_every_declared_key_is_in_the_generated_deploy_table():
    """docs/deploy.md's node-config table is generated from the declarations (python -m
    fairvfl_flwr.config --write): a key added, removed or reworded without it fails here."""
    deploy = ROOT / "docs" / "deploy.md"
    texts = generated(ROOT)
    assert deploy in texts and deploy.read_text() == texts[deploy], \
        "docs/deploy.md's node config table drifted: python -m fairvfl_flwr.config --write"
    table = deploy.read_text().split(node.DOCS_BEGIN)[1].split(node.DOCS_END)[0]
    assert re.findall(r"^\| `([a-z-]+)` \|", table, re.M) == [s.key for s in NodeConfig.settings()]


#: A read of Flower's node config other than through NodeConfig: the attribute, or a mapping named so.
RAW_READ = re.compile(r"\b(?:context|ctx)\.node_config\b|(?<![\w.])node_config\s*(?:\.get\(|\[|\.items\(|\.keys\()"
                      r"|\bin\s+(?:\w+\.)?node_config\b")


def test_no_module_reads_the_node_config_but_its_reader():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "config" / "node.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if RAW_READ.search(code):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "read the node config through NodeConfig.of(context) / NodeConfig.from_flower:\n" + "\n".join(found)


def test_the_raw_read_pattern_finds_what_it_should():
    """The grep above must find the forms a raw read takes, or it guards nothing."""
    for line in ('x = context.node_config.get("peers")', 'if "delay-seconds" in node_config:',
                 'node_config["partition-id"]', "n = self.context.node_config"):
        assert RAW_READ.search(line), line
    for line in ("NodeConfig.of(context)", "node_configs=[...]", "def f(node_config: Mapping):",
                 "for k, v in active_node_config(cfg, ds).items()", "run(args.node_config)"):
        assert not RAW_READ.search(line), line
