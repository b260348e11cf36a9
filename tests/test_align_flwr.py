"""Own tables through `flwr run` (simulation): alignment and local preparation over the
real runtime give the in-process grid's run, and a scoring job that names only the mode,
the model and the files scores each party's raw rows as the in-process grid does."""

import json

import pandas as pd
import pytest

from fairvfl_flwr.app.run import run_inprocess
from .test_align import ID, adult_raw, own_config, write_own_tables

pytest.importorskip("private_set_intersection")

#: Few rounds: a `flwr run` costs its runtime's start-up; alignment and preparation run before round 1.
FAST = {"num-server-rounds": 3, "eval-every": 3}
METRICS = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn")


def _only_run(folder):
    (run,) = [p for p in folder.iterdir() if p.is_dir()]
    return run


@pytest.fixture(scope="module")
def trained(tmp_path_factory, simulation_superlink):
    """4 parties, each with its own raw Adult table (a different 85-95 % of 3,000 ids,
    shuffled, its own columns), trained through `flwr run` and in-process; both tests read
    the same two runs. Returns the folder, the tables, each party's ids, the flwr run's
    folder, and the in-process run's summary and folder."""
    tmp = tmp_path_factory.mktemp("own-tables")
    tables = tmp / "tables"
    tables.mkdir()
    held = write_own_tables(adult_raw(), tables)
    simulation_superlink.run(own_config(tables, **FAST, **{"output-dir": str(tmp / "flwr")}), num_supernodes=4,
                             timeout=300)
    same, folder = run_inprocess(own_config(tables, **FAST, **{"output-dir": str(tmp / "inproc")}), quiet=True)
    return tmp, tables, held, _only_run(tmp / "flwr"), same, folder


@pytest.mark.slow  # its module's `flwr run` fixture
def test_flwr_run_with_own_tables_matches_inprocess(trained):
    """Aligned, prepared and trained through `flwr run`: the in-process grid's run."""
    *_, flwr_run, same, _ = trained
    summary = json.loads((flwr_run / "summary.json").read_text())
    for key in METRICS:
        assert same[key] == pytest.approx(summary[key], rel=1e-9, abs=1e-12), key


@pytest.mark.slow  # a second `flwr run`: the scoring job over the real runtime
def test_flwr_run_scores_own_tables_with_the_settings_of_the_models_manifest(trained, simulation_superlink, tmp_path):
    """The scoring job's run config names only the mode, the model and the files; the
    parties' run config is the job's, so the settings travel in its messages."""
    _, tables, held, flwr_run, _, folder = trained
    fresh = sorted(set.intersection(*held))[:300]  # rows whose categories training saw
    for k in range(4):  # each party's score file: its own columns, no label, shuffled, 10 rows fewer each
        df = pd.read_csv(tables / f"party{k}.csv").set_index(ID).loc[fresh[10 * k:]]
        df.drop(columns=["income", "sex"], errors="ignore").sample(frac=1, random_state=k).reset_index().to_csv(
            tmp_path / f"score{k}.csv", index=False)
    job = {"mode": "score", "score.path": str(tmp_path / "score{partition}.csv")}
    simulation_superlink.run({**job, "score.model-from": str(flwr_run), "output-dir": str(tmp_path / "flwr-score")},
                             num_supernodes=4, timeout=300)
    _, ref = run_inprocess({**job, "score.model-from": str(folder), "output-dir": str(tmp_path / "inproc-score")},
                           quiet=True)
    got, want = (pd.read_csv(f / "predictions.csv", dtype={"id": str})
                 for f in (_only_run(tmp_path / "flwr-score"), ref))
    assert got["id"].tolist() == want["id"].tolist() and sorted(got["id"]) == sorted(fresh[30:])
    assert got["probability"].to_numpy() == pytest.approx(want["probability"].to_numpy(), rel=1e-6, abs=1e-9)
