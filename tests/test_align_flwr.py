"""Own tables through `flwr run` (Ray simulation): alignment and local preparation over the
real runtime give the in-process grid's run."""

import json

import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.tools.flwr_engine import SimulationSuperLink
from .test_align import adult_raw, own_config, write_own_tables

pytestmark = pytest.mark.slow
pytest.importorskip("private_set_intersection")


def test_flwr_run_with_own_tables_matches_inprocess(tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    write_own_tables(adult_raw(), tables)
    link = SimulationSuperLink(tmp_path / "flwr-home")
    try:
        link.run(own_config(tables, **{"output-dir": str(tmp_path / "flwr")}), num_supernodes=4, timeout=600)
    finally:
        link.stop()
    (run,) = [p for p in (tmp_path / "flwr").iterdir() if p.is_dir()]
    summary = json.loads((run / "summary.json").read_text())
    same, _ = run_inprocess(own_config(tables, **{"output-dir": str(tmp_path / "inproc")}), quiet=True)
    for key in ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn"):
        assert same[key] == pytest.approx(summary[key], rel=1e-9, abs=1e-12), key
