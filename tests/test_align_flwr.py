"""Own tables through `flwr run` (simulation): alignment and local preparation over the
real runtime give the in-process grid's run, and a scoring job that names only the mode,
the model and the files scores each party's raw rows as the in-process grid does."""

import json

import pandas as pd
import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.tools.flwr_engine import SimulationSuperLink
from .test_align import ID, adult_raw, own_config, write_own_tables

pytest.importorskip("private_set_intersection")

#: Few rounds: a `flwr run` costs its runtime's start-up; alignment and preparation run before round 1.
FAST = {"num-server-rounds": 3, "eval-every": 3}
METRICS = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn")


def _tables(tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    held = write_own_tables(adult_raw(), tables)
    return tables, held


def _only_run(folder):
    (run,) = [p for p in folder.iterdir() if p.is_dir()]
    return run


def test_flwr_run_with_own_tables_matches_inprocess(tmp_path):
    """4 parties, each with its own raw Adult table (a different 85-95 % of 3,000 ids,
    shuffled, its own columns): aligned, prepared and trained through `flwr run`."""
    tables, _ = _tables(tmp_path)
    with SimulationSuperLink(tmp_path / "flwr-home") as link:
        link.run(own_config(tables, **FAST, **{"output-dir": str(tmp_path / "flwr")}), num_supernodes=4, timeout=300)
    summary = json.loads((_only_run(tmp_path / "flwr") / "summary.json").read_text())
    same, _ = run_inprocess(own_config(tables, **FAST, **{"output-dir": str(tmp_path / "inproc")}), quiet=True)
    for key in METRICS:
        assert same[key] == pytest.approx(summary[key], rel=1e-9, abs=1e-12), key


@pytest.mark.slow  # a second `flwr run`: the scoring job over the real runtime
def test_flwr_run_scores_own_tables_with_the_settings_of_the_models_manifest(tmp_path):
    """The scoring job's run config names only the mode, the model and the files; the
    parties' run config is the job's, so the settings travel in its messages."""
    tables, held = _tables(tmp_path)
    fresh = sorted(set.intersection(*held))[:300]  # rows whose categories training saw
    for k in range(4):  # each party's score file: its own columns, no label, shuffled, 10 rows fewer each
        df = pd.read_csv(tables / f"party{k}.csv").set_index(ID).loc[fresh[10 * k:]]
        df.drop(columns=["income", "sex"], errors="ignore").sample(frac=1, random_state=k).reset_index().to_csv(
            tables / f"score{k}.csv", index=False)
    job = {"mode": "score", "score.path": str(tables / "score{partition}.csv")}
    with SimulationSuperLink(tmp_path / "flwr-home") as link:
        link.run(own_config(tables, **FAST, **{"output-dir": str(tmp_path / "flwr")}), num_supernodes=4, timeout=300)
        link.run({**job, "score.model-from": str(_only_run(tmp_path / "flwr")),
                  "output-dir": str(tmp_path / "flwr-score")}, num_supernodes=4, timeout=300)
    _, folder = run_inprocess(own_config(tables, **FAST, **{"output-dir": str(tmp_path / "inproc")}), quiet=True)
    _, ref = run_inprocess({**job, "score.model-from": str(folder), "output-dir": str(tmp_path / "inproc-score")},
                           quiet=True)
    got, want = (pd.read_csv(f / "predictions.csv", dtype={"id": str}) for f in (_only_run(tmp_path / "flwr-score"), ref))
    assert got["id"].tolist() == want["id"].tolist() and sorted(got["id"]) == sorted(fresh[30:])
    assert got["probability"].to_numpy() == pytest.approx(want["probability"].to_numpy(), rel=1e-6, abs=1e-9)
