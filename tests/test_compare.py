"""The comparison harness: baselines, table writer, the compare command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fairvfl_flwr.tools import compare
from fairvfl_flwr.tools.compare_methods import CENTRAL_NAME, SPLIT_NAME
from fairvfl_flwr.tools.compare_tables import table_markdown
from fairvfl_flwr.tools.paper import PAPER_EPSILONS, fairvfl_name, paper_tables
from fairvfl_flwr.data.tables import load_dataset
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.features.final_logits import load_scores


def _extras():
    pytest.importorskip("fairlearn", reason='needs pip install -e ".[baselines]"')
    pytest.importorskip("aif360", reason='needs pip install -e ".[baselines]"')
    pytest.importorskip("sklearn", reason='needs pip install -e ".[baselines]"')
    from fairvfl_flwr.tools import baselines

    return baselines


@pytest.fixture(scope="module")
def crime_fedbcd(tmp_path_factory):
    """A short FedBCD run on Crime with its saved scores."""
    out = tmp_path_factory.mktemp("fedbcd")
    summary, folder = run_inprocess({"dataset": "crime", "num-server-rounds": 100, "eval-every": 50,
                                         "fairness": False, "mode": "fairvfl-scores", "output-dir": str(out)})
    return summary, folder, load_dataset("crime", 0)


def test_scores_saved_by_the_server_reproduce_the_runs_metrics(crime_fedbcd):
    from fairvfl_flwr.tools.baselines import metrics_of

    summary, folder, ds = crime_fedbcd
    z_train, z_test = load_scores(folder)
    assert z_train.shape == ds.y_train.shape and z_test.shape == ds.y_test.shape
    m = metrics_of(ds.y_test, ds.s_test, np.where(z_test >= 0, 1, -1))
    assert m["acc"] == pytest.approx(summary["test_acc"])
    assert m["dfp"] == pytest.approx(summary["test_dfp"]) and m["dfn"] == pytest.approx(summary["test_dfn"])


def test_split_learning_baseline_learns_and_passive_parties_get_only_gradients(tmp_path):
    from fairvfl_flwr.app.client import app
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.flower.inprocess import InProcessGrid
    from fairvfl_flwr.app.server import run_server

    seen = []
    rc = {**RunConfig(dataset="crime", num_server_rounds=150, eval_every=50, output_dir=str(tmp_path)).to_flower(),
          "mode": "split"}
    grid = InProcessGrid(app, rc, 6, tap=seen.append)
    summary, folder = run_server(grid, rc)
    history = json.loads((folder / "history.json").read_text())
    assert summary["rounds"] == 150 and summary["mode"] == "split" and summary["split.embedding"] == 4
    assert history[-1]["loss"] < history[0]["loss"] - 0.2
    assert summary["test_acc"] > 0.8  # majority class is ~0.8 on Crime's test rows
    assert 0 <= summary["test_dfp"] <= 1 and 0 <= summary["test_dfn"] <= 1
    assert summary["lambda"] == [0.0, 0.0]
    train = [m for m in seen if m.metadata.message_type == "train.split"]
    assert len(train) == 150 * 6
    for m in train:
        assert set(m.content.array_records) == {"payload"} and set(m.content.array_records["payload"]) == {"grad"}
        assert m.content.array_records["payload"]["grad"].shape == (1200, 4)


def test_bad_mode_is_refused_by_name(tmp_path):
    from fairvfl_flwr.config import ConfigError

    with pytest.raises(ConfigError, match="mode='splt'"):
        run_inprocess({"dataset": "crime", "mode": "splt", "output-dir": str(tmp_path)})


def test_eo_postprocessing_reduces_the_equalized_odds_gap_where_it_was_fit(crime_fedbcd):
    b = _extras()
    _, folder, ds = crime_fedbcd
    z_train, z_test = load_scores(folder)
    r = b.eo_postprocess(z_train, ds.y_train, ds.s_train, z_test, ds.y_test, ds.s_test, seed=0)
    before = max(r["train_before"]["dfp"], r["train_before"]["dfn"])
    after = max(r["train"]["dfp"], r["train"]["dfn"])
    assert before > 0.1 and after < before / 2
    assert 0.6 < r["acc"] <= 1 and 0 <= r["dfp"] <= 1 and 0 <= r["dfn"] <= 1


def test_ceo_and_centralised_reference_return_sane_metrics(crime_fedbcd):
    b = _extras()
    _, folder, ds = crime_fedbcd
    z_train, z_test = load_scores(folder)
    ceo = b.ceo_postprocess(z_train, ds.y_train, ds.s_train, z_test, ds.y_test, ds.s_test, seed=0,
                            protected_label=ds.protected_label)
    assert 0.6 < ceo["acc"] <= 1 and 0 <= ceo["dfp"] <= 1 and 0 <= ceo["dfn"] <= 1
    assert ceo["cost_constraint"] == "fpr"  # Crime's protected label is -1: its errors are false positives
    ref = b.centralised_reference(ds.X_train, ds.y_train, ds.s_train, ds.X_test, ds.y_test, ds.s_test,
                                  ds.protected_label, seed=0, max_iter=20)
    assert 0.8 < ref["acc"] <= 1 and 0 <= ref["dfp"] <= 1 and 0 <= ref["dfn"] <= 1


def test_postprocessing_refuses_mismatched_inputs():
    b = _extras()
    with pytest.raises(ValueError, match="differ in length"):
        b.eo_postprocess(np.zeros(3), np.ones(3), np.ones(2), np.zeros(2), np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="labels must be in"):
        b.ceo_postprocess(np.zeros(3), np.array([0, 1, 1]), np.ones(3), np.zeros(3), np.ones(3), np.ones(3))


def _records():
    recs = []
    for seed, acc in ((0, 0.80), (1, 0.82)):
        for d in ("adult", "crime"):
            recs += [
                {"method": "FedBCD", "dataset": d, "model": "linear", "seed": seed, "engine": "inprocess",
                 "rounds": 1000, "acc": acc, "dfp": 0.1, "dfn": 0.2},
                {"method": fairvfl_name(0.01), "dataset": d, "model": "linear", "seed": seed,
                 "engine": "inprocess", "rounds": 1000, "acc": acc - 0.01, "dfp": 0.01, "dfn": 0.02},
                {"method": "FedBCD + EO", "dataset": d, "model": "linear", "seed": seed, "engine": "inprocess",
                 "rounds": 1000, "acc": acc - 0.05, "dfp": 0.0, "dfn": 0.01},
            ]
    return recs


def test_table_writer_uses_the_papers_layout():
    text = table_markdown(_records(), "linear", [0.01])
    measured, paper = text.split("the paper's numbers")
    lines = [l for l in measured.splitlines() if l.startswith("|")]
    assert lines[0] == "| Method | Adult ACC | Adult DFP | Adult DFN | Crime ACC | Crime DFP | Crime DFN |"
    assert [l.split("|")[1].strip() for l in lines[2:]] == ["FedBCD", "FedBCD + EO", "FairVFL(ε=1e-2)"]
    assert "| FedBCD | 81.00 ± 1.41% | 0.100 ± 0.000 | 0.200 ± 0.000 |" in measured
    assert "Mean ± std over 2 seeds (0, 1)" in measured
    plines = [l for l in paper.splitlines() if l.startswith("|")]
    assert plines[0] == lines[0]
    assert [l.split("|")[1].strip() for l in plines[2:]] == list(paper_tables()["linear"])
    assert "| FedBCD | 85.06% | 0.14 | 0.18 | 88.65% | 0.17 | 0.27 |" in paper


def test_constraint_set_rows_follow_the_fairvfl_rows_in_the_table():
    recs = [r for r in _records() if r["dataset"] == "adult"]
    for tag, constraint, measure in (("DP", "demographic-parity", "rate"), ("EO-loss", "equalized-odds", "loss"),
                                     ("EO", "equalized-odds", "rate")):
        recs.append({**recs[0], "method": fairvfl_name(0.01, tag), "epsilon": 0.01,
                     "config": {"constraint": constraint, "constraint-measure": measure}})
    lines = [l for l in table_markdown(recs, "linear", [0.01]).split("the paper's")[0].splitlines()
             if l.startswith("|")]
    assert [l.split("|")[1].strip() for l in lines[2:]] == [
        "FedBCD", "FedBCD + EO", "FairVFL(ε=1e-2)", "FairVFL-EO(ε=1e-2)", "FairVFL-EO-loss(ε=1e-2)",
        "FairVFL-DP(ε=1e-2)"]


def test_paper_tables_hold_every_cell_under_the_names_the_runs_get():
    for model in ("linear", "mlp"):
        table = paper_tables()[model]
        assert list(table) == ["FedBCD", "FedBCD + EO", "FedBCD + CEO", *[fairvfl_name(e) for e in PAPER_EPSILONS]]
        assert all(set(per) == {"adult", "compas", "crime"} for per in table.values())
    assert paper_tables()["mlp"]["FairVFL(ε=1e-3)"]["crime"] == (84.62, 0.01, 0.06)


def test_method_names_follow_the_paper():
    assert [fairvfl_name(e) for e in PAPER_EPSILONS] == [
        "FairVFL(ε=1e-3)", "FairVFL(ε=1e-2)", "FairVFL(ε=5e-2)", "FairVFL(ε=1e-1)", "FairVFL(ε=5e-1)"]
    assert fairvfl_name(0.025) == "FairVFL(ε=0.025)"


@pytest.mark.parametrize("args, message", [
    (["--methods", "fedbcd,magic"], "unknown method 'magic'"),
    (["--datasets", "adult,mnist"], "unknown dataset 'mnist'"),
    (["--models", "cnn"], "unknown model 'cnn'"),
    (["--epsilons", "0.1,abc"], "--epsilons"),
    (["--seeds", "x"], "--seeds"),
    (["--set", "epsilon=0.2"], "sets epsilon itself"),
    (["--set", "local-steps=0"], "local-steps=0"),
    (["--redo-post"], "add --resume"),
    (["--constraint-epsilons", "x"], "--constraint-epsilons"),
    (["--set", "constraint='equalized-odds'"], "sets constraint itself"),
    (["--set", "preset=fast"], "--set 'preset=fast': the text 'fast' needs quotes"),
])
def test_compare_refuses_bad_input_by_name(args, message, capsys, tmp_path):
    assert compare.main([*args, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow  # every output, plots included; the fast loop runs compare through its resume and redo tests
def test_compare_command_end_to_end_on_a_tiny_setting(tmp_path, capsys):
    _extras()
    out = tmp_path / "cmp"
    rc = compare.main(["--datasets", "crime", "--models", "linear", "--epsilons", "0.05", "--seeds", "1",
                       "--rounds", "20", "--set", "eval-every=10", "--central-iters", "10", "--out", str(out)])
    assert rc == 0
    for name in ("results.json", "results.csv", "table_linear.md", "convergence_linear.png",
                 "tradeoff_linear_crime.png"):
        assert (out / name).stat().st_size > 0, name
    runs = json.loads((out / "results.json").read_text())["runs"]
    methods = [r["method"] for r in runs]
    assert methods == ["FedBCD", "FedBCD + EO", "FedBCD + CEO", "FairVFL(ε=5e-2)", "FairVFL-EO(ε=1e-2)",
                       "FairVFL-DP(ε=1e-2)", SPLIT_NAME, CENTRAL_NAME]
    for r in runs:
        assert 0 < r["acc"] <= 1 and 0 <= r["dfp"] <= 1 and 0 <= r["dfn"] <= 1, r["method"]
        assert r["dataset"] == "crime" and r["seed"] == 0
    assert runs[3]["config"]["epsilon"] == 0.05 and runs[3]["rounds"] == 20
    assert runs[3]["config"]["constraint"] == "deo" and runs[3]["config"]["constraint-measure"] == "loss"
    for r, constraint in zip(runs[4:6], ("equalized-odds", "demographic-parity")):
        assert r["config"]["constraint"] == constraint and r["config"]["constraint-measure"] == "rate"
        assert r["config"]["epsilon"] == 0.01
    table = (out / "table_linear.md").read_text()
    for m in methods:
        assert f"| {m} |" in table
    err = capsys.readouterr().err
    assert "8/8" not in err and "ETA" in err and "6/6" in err  # one bar step per job (FedBCD carries EO, CEO)


def test_compare_resume_runs_only_missing_jobs(tmp_path, capsys):
    args = ["--datasets", "crime", "--models", "linear", "--seeds", "1", "--rounds", "5", "--methods",
            "fedbcd,fairvfl", "--out", str(tmp_path)]
    assert compare.main([*args, "--epsilons", "0.1"]) == 0
    first = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert compare.main([*args, "--epsilons", "0.1,0.5", "--resume"]) == 0
    assert "2 of 3 tasks done" in capsys.readouterr().err
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert runs[:2] == first and [r["method"] for r in runs[2:]] == ["FairVFL(ε=5e-1)"]


def test_compare_redo_post_recomputes_eo_and_ceo_from_saved_scores(tmp_path, capsys):
    _extras()
    args = ["--datasets", "crime", "--models", "linear", "--seeds", "1", "--rounds", "5", "--methods",
            "fedbcd,eo,ceo", "--out", str(tmp_path)]
    assert compare.main(args) == 0
    first = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert compare.main([*args, "--resume", "--redo-post"]) == 0
    assert "recomputed from the saved scores of 1 FedBCD runs" in capsys.readouterr().err
    again = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["method"] for r in again] == ["FedBCD", "FedBCD + EO", "FedBCD + CEO"]
    for a, b in zip(first, again):
        assert (a["acc"], a["dfp"], a["dfn"]) == (b["acc"], b["dfp"], b["dfn"])
    assert again[2]["config"]["cost_constraint"] == "fpr"


@pytest.mark.slow
def test_compare_engine_flwr_equals_inprocess_for_fedbcd_and_split_learning(simulation_superlink, tmp_path):
    """`--engine flwr` (real `flwr run`, Ray) gives the in-process numbers, for both new modes. The runs go
    to the session's SuperLink; test_tools_cli.py checks that the engine starts and stops its own."""
    kwargs = dict(datasets=["crime"], models=["linear"], epsilons=[0.05], seeds=[0], methods=["fedbcd", "split"],
                  overrides={"num-server-rounds": 10, "eval-every": 5, "num-parties": 3})  # equal at any size
    real = compare.run_compare(out=tmp_path / "flwr", engine="flwr", link=simulation_superlink, **kwargs)
    same = compare.run_compare(out=tmp_path / "inproc", engine="inprocess", **kwargs)
    assert [r["method"] for r in real] == [r["method"] for r in same] == ["FedBCD", SPLIT_NAME]
    for a, b in zip(real, same):
        assert a["engine"] == "flwr" and b["engine"] == "inprocess"
        for key in ("acc", "dfp", "dfn", "train_loss", "train_max_gap"):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), (a["method"], key)
    z_real, z_same = load_scores(real[0]["run_dir"]), load_scores(same[0]["run_dir"])
    np.testing.assert_allclose(z_real[1], z_same[1], rtol=1e-9)
