"""Missing-value markers are found, not assumed: a text column's ``?``, ``NA``, ``unknown``, ...
refuse a party's table until the party declares them missing (node config ``missing-values``) or
real categories (``real-categories``), in the pre-flight and in the run before training."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.data.own_table import likely_markers
from fairvfl_flwr.secure import identity
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.tools import preflight

ROWS = 400
CONTRACT_MARKED, PAYMENT_MARKED = 23, 17


def telco_tables(folder) -> list[dict]:
    """A telco's two parties: the label owner (churn, sex, tenure) and the billing side, whose
    text columns contract and payment hold ``?`` where the value was never recorded. Their node
    configs (deployed: own tables, identity keys)."""
    rng = np.random.default_rng(4)
    ids = [f"T{i:05d}" for i in range(ROWS)]
    tenure = rng.integers(1, 72, ROWS)
    contract = rng.choice(["Month-to-month", "One year", "Two year"], ROWS).astype(object)
    payment = rng.choice(["Electronic check", "Mailed check", "Card"], ROWS).astype(object)
    churn = np.where(rng.random(ROWS) < np.where(contract == "Month-to-month", 0.55, 0.15), "Yes", "No")
    contract[rng.choice(ROWS, CONTRACT_MARKED, replace=False)] = "?"
    payment[rng.choice(ROWS, PAYMENT_MARKED, replace=False)] = " ?"  # spaces around a marker are stripped
    pd.DataFrame({"customer": ids, "churn": churn, "sex": rng.choice(["Female", "Male"], ROWS),
                  "tenure": tenure}).to_csv(folder / "owner.csv", index=False)
    pd.DataFrame({"account": ids, "contract": contract, "payment": payment,
                  "monthly": rng.normal(70, 20, ROWS).round(2)}).to_csv(folder / "billing.csv", index=False)
    keys = identity.generate_identities(folder / "identities", 2)
    owner = {"partition-id": 0, "role": "active", "table-path": str(folder / "owner.csv"), "id-column": "customer",
             "label-column": "churn", "label-positive": "Yes", "sensitive-column": "sex", "group-a": "Female",
             "group-b": "Male", "protected-label": 1, "cache-dir": str(folder / "cache0"), **keys[0]}
    billing = {"partition-id": 1, "role": "passive", "table-path": str(folder / "billing.csv"), "id-column": "account",
               "cache-dir": str(folder / "cache1"), **keys[1]}
    return [owner, billing]


def _text(node: dict) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in node.items())


def _train(folder, nodes: list[dict], **extra):
    rc = RunConfig.from_flower({"num-parties": 2, "tables.own": True, "num-server-rounds": 4, "eval-every": 4,
                                "tables.name": "telco", "output-dir": str(folder / "runs"), **extra}).to_flower()
    return run_server(InProcessGrid(client_app, rc, 2, node_configs=nodes), rc)


def _categories(node: dict) -> dict[str, list[str]]:
    """The categories the billing party's saved block was trained on, from its own disk."""
    blocks = sorted(Path(node["cache-dir"]).glob("models/*/partition-1/block.json"))
    assert len(blocks) == 1, blocks
    return json.loads(blocks[0].read_text())["preprocessing"]["categories"]


def test_preflight_names_every_text_column_holding_a_marker_with_its_count_in_one_run(tmp_path):
    _, billing = telco_tables(tmp_path)
    report = preflight.run(_text(billing))
    markers = [p.text for p in report.problems if p.kind == "undeclared marker"]
    assert len(markers) == 2 and len(report.problems) == 2, report.text()
    assert markers[0].startswith(f"column 'contract' holds values that usually mean missing: '?' in "
                                 f"{CONTRACT_MARKED} cells"), markers[0]
    assert markers[1].startswith(f"column 'payment' holds values that usually mean missing: '?' in "
                                 f"{PAYMENT_MARKED} cells"), markers[1]
    assert 'missing-values="?"' in markers[0] and 'real-categories="contract:?"' in markers[0]
    # declared missing, they need a fill rule like any missing value; with one the table passes
    declared = _text({**billing, "missing-values": "?"})
    assert {p.kind for p in preflight.run(declared).problems} == {"missing values without a rule"}
    assert preflight.run(declared, "tables.missing='contract=mode,payment=mode'").ok
    assert preflight.run(_text({**billing, "real-categories": "contract:?,payment:?"})).ok


@pytest.mark.parametrize("cell, found", [
    ("Unknown", "Unknown"), ("N/a", "N/a"), ("   ", ""), ("-", "-"), ("null", None), ("Month", None)])
def test_the_likely_markers_in_any_case_and_a_cell_of_spaces(cell, found):
    """``null`` is missing already (pandas reads it so); a real value is no marker."""
    col = pd.read_csv(io.StringIO(f"c\nyes\n{cell}\nno\n"), skip_blank_lines=False)["c"]
    assert list(likely_markers(col)) == ([] if found is None else [found])
    assert not likely_markers(col, {"x" if found is None else found})  # declared a real category: not a marker


def test_the_run_refuses_undeclared_markers_before_training_and_trains_once_they_are_declared(tmp_path):
    nodes = telco_tables(tmp_path)
    with pytest.raises(FederationError, match=r"party 1: 2 problems\b"):
        _train(tmp_path, nodes)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())

    missing = [nodes[0], {**nodes[1], "missing-values": "?"}]
    summary, _ = _train(tmp_path, missing, **{"tables.missing": "contract=mode,payment=mode"})
    assert np.isfinite(summary["train_loss"])
    categories = _categories(missing[1])
    assert "?" not in categories["contract"] and "?" not in categories["payment"], categories

    # the same table with '?' declared a real value trains it as a category: the check above could fail
    real = [nodes[0], {**nodes[1], "real-categories": "contract:?,payment:?", "cache-dir": str(tmp_path / "real")}]
    _train(tmp_path / "again", real)
    assert "?" in _categories(real[1])["contract"]
