"""The fairness report on a predictions file: fairlearn's MetricFrame per group, the gaps
and their bootstrap intervals, one PNG; bad input named."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fairvfl_flwr.core.bootstrap import bootstrap, cell_counts, from_counts
from fairvfl_flwr.core.metrics import fairness_metrics
from fairvfl_flwr.tools import report

pytest.importorskip("fairlearn")


def _data(n=4000, seed=0):
    rng = np.random.default_rng(seed)
    group = rng.choice(["a", "b"], n, p=[0.3, 0.7])
    y = rng.random(n) < np.where(group == "a", 0.3, 0.5)
    flip = rng.random(n) < np.where(group == "a", 0.25, 0.1)
    return y, y ^ flip, group


def test_cell_counts_give_metricframes_numbers_and_core_metrics_gaps():
    y, d, g = _data()
    rep = report.report(y, d, g, replicates=0)
    m = from_counts(cell_counts(y, g, d, ["a", "b"]))
    for j, name in enumerate(["a", "b"]):
        for key in ("accuracy", "tpr", "fpr", "selection_rate"):
            assert rep["groups"][name][key] == pytest.approx(m[key][j], abs=1e-12)
        assert rep["groups"][name]["count"] == m["count"][j]
    core = fairness_metrics(np.where(y, 1, -1), g == "a", np.where(d, 1.0, -1.0))
    assert rep["gaps"]["dfp"] == pytest.approx(core["dfp"], abs=1e-12)
    assert rep["gaps"]["dfn"] == pytest.approx(core["dfn"], abs=1e-12)
    assert rep["gaps"]["deo"] == max(rep["gaps"]["dfp"], rep["gaps"]["dfn"])
    assert rep["overall"]["accuracy"] == pytest.approx(core["acc"], abs=1e-12)


def test_count_bootstrap_matches_resampling_rows():
    """Drawing cell counts from a multinomial is the row bootstrap, at a cost independent of n."""
    y, d, g = _data(n=3000, seed=1)
    counts = cell_counts(y, g, d, ["a", "b"])
    fast = bootstrap(counts, replicates=2000, seed=0)
    rng = np.random.default_rng(5)
    rows = []
    for _ in range(2000):
        i = rng.integers(0, len(y), len(y))
        rows.append(from_counts(cell_counts(y[i], g[i], d[i], ["a", "b"]))["dfp"])
    lo, hi = np.percentile(rows, [2.5, 97.5])
    assert fast["dfp"][0] == pytest.approx(lo, abs=0.01) and fast["dfp"][1] == pytest.approx(hi, abs=0.01)
    assert fast == bootstrap(counts, replicates=2000, seed=0)  # seeded


def test_cli_writes_the_report_and_png(tmp_path, capsys):
    y, d, g = _data(n=1000)
    ids = np.arange(1000)
    pd.DataFrame({"id": ids, "probability": np.where(d, 0.8, 0.2), "decision": d.astype(int)}).to_csv(
        tmp_path / "predictions.csv", index=False)
    # outcomes for 900 rows only, shuffled; the server label file's columns
    labels = pd.DataFrame({"row_id": ids, "y": np.where(y, 1, -1), "group": g}).sample(frac=0.9, random_state=0)
    labels.to_csv(tmp_path / "labels.csv", index=False)
    assert report.main([str(tmp_path / "predictions.csv"), "--outcomes", str(tmp_path / "labels.csv"),
                        "--bootstrap", "200"]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["rows"] == 900 and rep["notes"] == ["100 of 1000 predictions have no outcome or group yet: left out"]
    keep = np.isin(ids, labels["row_id"])
    core = fairness_metrics(np.where(y[keep], 1, -1), g[keep] == "a", np.where(d[keep], 1.0, -1.0))
    assert rep["gaps"]["dfp"] == pytest.approx(core["dfp"]) and rep["gaps"]["dfn"] == pytest.approx(core["dfn"])
    for k in ("dfp", "dfn", "deo"):
        lo, hi = rep["intervals"][k]
        assert lo <= rep["gaps"][k] <= hi
    assert (tmp_path / "report.png").stat().st_size > 10_000
    assert pd.read_csv(tmp_path / "report-groups.csv")["group"].tolist() == ["a", "b"]
    assert "DFP" in capsys.readouterr().out


def test_cli_names_a_missing_column(tmp_path, capsys):
    pd.DataFrame({"id": [1, 2], "probability": [0.6, 0.4], "decision": [1, 0]}).to_csv(tmp_path / "p.csv", index=False)
    pd.DataFrame({"row_id": [1, 2], "outcome": [1, -1]}).to_csv(tmp_path / "o.csv", index=False)
    assert report.main([str(tmp_path / "p.csv"), "--outcomes", str(tmp_path / "o.csv")]) == 2
    assert f"outcomes file {tmp_path / 'o.csv'}: column 'y' not found" in capsys.readouterr().err
