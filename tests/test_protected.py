"""Protected columns (node config protected-columns): never model inputs unless the run says
sensitive-as-input, listed on the party's model card; the pre-flight suggests likely ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from fairvfl_flwr.tools import preflight
from tests.test_markers import _text, _train, telco_tables

MARKERS = {"missing-values": "?"}
FILL = {"tables.missing": "contract=mode,payment=mode"}


def _with_race(folder) -> list[dict]:
    """The telco tables, the label owner's also holding race (which predicts churn: a model
    that may use it does)."""
    nodes = telco_tables(folder)
    owner = pd.read_csv(nodes[0]["table-path"])
    rng = np.random.default_rng(9)
    owner["race"] = np.where(owner["churn"].eq("Yes") ^ (rng.random(len(owner)) < 0.2), "Black", "White")
    owner.to_csv(nodes[0]["table-path"], index=False)
    return [nodes[0], {**nodes[1], **MARKERS}]


def _saved(node: dict) -> tuple[dict, str]:
    """The label owner's saved block metadata and its model card, from its own disk."""
    folder = next(Path(node["cache-dir"]).glob("models/*/partition-0"))
    return json.loads((folder / "block.json").read_text()), (folder / "card.md").read_text()


def test_a_declared_protected_column_is_not_an_input_and_the_card_says_so(tmp_path):
    nodes = _with_race(tmp_path)
    owner = {**nodes[0], "protected-columns": "race"}
    _train(tmp_path, [owner, nodes[1]], **FILL)
    meta, card = _saved(owner)
    assert "race" not in meta["preprocessing"]["raw"] and "sex" not in meta["preprocessing"]["raw"]
    assert meta["preprocessing"]["protected"] == {"sex": False, "race": False}
    assert "| sex | no |" in card and "| race | no |" in card, card

    # the run says the protected columns are inputs: race then is one, and the card says that too
    inputs = {**owner, "cache-dir": str(tmp_path / "inputs")}
    _train(tmp_path / "inputs", [inputs, nodes[1]], **FILL, **{"sensitive-as-input": True})
    meta, card = _saved(inputs)
    assert {"race", "sex"} <= set(meta["preprocessing"]["raw"])
    assert "| race | yes |" in card and "| sex | yes |" in card, card


def test_undeclared_race_is_an_input_and_the_preflight_suggests_it(tmp_path):
    nodes = _with_race(tmp_path)
    report = preflight.run(_text(nodes[0]))
    note = next(n for n in report.notes if n.startswith("likely protected columns"))
    assert "'race' by its name (race)" in note and "'tenure'" not in note and "'sex'" not in note, note
    renamed = pd.read_csv(nodes[0]["table-path"]).rename(columns={"race": "group_code"})
    renamed.to_csv(nodes[0]["table-path"], index=False)
    note = next(n for n in preflight.run(_text(nodes[0])).notes if n.startswith("likely protected columns"))
    assert "'group_code' by its values (race: 'Black', 'White')" in note, note
    assert not any(n.startswith("likely") for n in preflight.run(_text({**nodes[0],
                                                                          "protected-columns": "group_code"})).notes)
    _train(tmp_path, nodes, **FILL)
    meta, card = _saved(nodes[0])
    assert "group_code" in meta["preprocessing"]["raw"]  # not declared: the party's own choice
    assert "| sex | no |" in card and "group_code |" not in card.split("Weights")[0]
