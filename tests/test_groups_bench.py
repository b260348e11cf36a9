"""The pieces bench/groups.py compares with: fairlearn's moment per constraint kind and bound,
ThresholdOptimizer, test metrics on the constraint's (pooled) groups, the demographic-parity
difference, reading curves at common gaps; and one tiny run of the script itself."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.core.constraints import CONSTRAINTS
from fairvfl_flwr.core.metrics import positive_rate_gaps
from fairvfl_flwr.tools import baselines, tradeoff
from fairvfl_flwr.tools.baselines import EG_MOMENTS, group_metrics, regroup


def test_every_constraint_kind_has_its_fairlearn_moment():
    reductions = pytest.importorskip("fairlearn.reductions")
    assert set(EG_MOMENTS) == set(CONSTRAINTS)
    assert isinstance(baselines.eg_moment("deo"), reductions.TruePositiveRateParity)
    assert isinstance(baselines.eg_moment("equalized-odds"), reductions.EqualizedOdds)
    assert isinstance(baselines.eg_moment("demographic-parity"), reductions.DemographicParity)
    with pytest.raises(ValueError, match="'parity' has no fairlearn moment"):
        baselines.eg_moment("parity")


def test_the_positive_rate_gaps_are_the_demographic_parity_difference():
    codes = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
    pred = np.array([1, 1, 1, -1, -1, -1, 1, -1, -1, -1])
    # shares predicted +1: 3/4, 0, 1/4; overall 4/10
    gaps = positive_rate_gaps(codes, pred)
    assert gaps["dpd"] == pytest.approx(0.75) and gaps["dpd_overall"] == pytest.approx(0.4)
    fairlearn_metrics = pytest.importorskip("fairlearn.metrics")
    want = fairlearn_metrics.demographic_parity_difference(pred == 1, pred == 1, sensitive_features=codes)
    assert gaps["dpd"] == pytest.approx(want)


def test_group_metrics_read_a_boolean_column_as_two_groups():
    rng = np.random.default_rng(3)
    y, s = rng.choice([-1, 1], 200), rng.random(200) < 0.4
    pred = rng.choice([-1, 1], 200)
    two = group_metrics(y, s, pred)
    codes = group_metrics(y, np.where(s, 0, 1), pred)
    assert two == pytest.approx(codes)
    neg, pos, up = y == -1, y == 1, pred == 1
    assert two["dfp"] == pytest.approx(abs(up[neg & s].mean() - up[neg & ~s].mean()))
    assert two["dfn"] == pytest.approx(abs((~up)[pos & s].mean() - (~up)[pos & ~s].mean()))
    assert two["dpd"] == pytest.approx(abs(up[s].mean() - up[~s].mean()))
    assert two["acc"] == pytest.approx((pred == y).mean())


def test_test_rows_are_put_in_the_groups_the_constraint_pooled():
    raw_train = np.array([0, 1, 2, 3, 3, 2, 1, 0])
    pooled_train = np.array([0, 1, 2, 2, 2, 2, 1, 0])  # data groups 2 and 3 pooled into constraint group 2
    np.testing.assert_array_equal(regroup(raw_train, pooled_train, np.array([3, 0, 2, 1])), [2, 0, 2, 1])
    # a boolean column: True is group a (code 0), as SensitiveGroups reads it
    np.testing.assert_array_equal(regroup(np.array([True, False]), np.array([0, 1]), np.array([False, True])), [1, 0])
    with pytest.raises(ValueError, match="data group 1: its training rows must be in one constraint group"):
        regroup(np.array([0, 1, 1]), np.array([0, 1, 0]), np.array([1]))


def test_the_moment_decides_which_gap_exponentiated_gradient_closes_on_its_training_rows():
    pytest.importorskip("fairlearn")
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    n = 600
    s = rng.random(n) < 0.5
    x = rng.normal(size=(n, 3)) + np.where(s, 1.0, 0.0)[:, None]  # group a scores higher
    y = np.where(x[:, 0] + 0.5 * rng.normal(size=n) > 0.5, 1, -1)

    def fit(constraint, protected_label=1):
        return group_metrics(y, s, baselines.eg_predict(x, y, s, x, protected_label, constraint, seed=0))

    plain = group_metrics(y, s, LogisticRegression().fit(x, y).predict(x))
    assert plain["dfp"] > 0.1 and plain["dpd"] > 0.2
    assert fit("demographic-parity")["dpd"] < plain["dpd"] / 4
    assert fit("equalized-odds")["dfp"] < plain["dfp"] / 4
    # DEO is TPR parity on the protected label's rows: on y = -1 it closes the false-positive gap
    assert fit("deo", protected_label=-1)["dfp"] < plain["dfp"] / 4
    assert fit("deo", protected_label=1)["dfp"] > plain["dfp"] / 2


def test_a_difference_bound_reaches_fairlearns_moment():
    pytest.importorskip("fairlearn")
    assert baselines.eg_moment("equalized-odds", 0.05).eps == 0.05
    assert baselines.eg_moment("demographic-parity").eps == 0.01  # fairlearn's default
    with pytest.raises(ValueError, match="difference bound must be > 0"):
        baselines.eg_moment("demographic-parity", 0.0)


@pytest.mark.slow  # two ExponentiatedGradient fits
def test_a_tighter_bound_gives_exponentiated_gradient_a_smaller_gap():
    pytest.importorskip("fairlearn")
    x, y, s = _biased(300)
    loose, tight = (group_metrics(y, s, baselines.eg_predict(x, y, s, x, 1, "demographic-parity", bound=b, max_iter=10))
                    for b in (0.3, 0.01))
    assert tight["dp_diff"] < loose["dp_diff"] - 0.1


def test_threshold_optimizer_reads_the_group_of_every_row_it_predicts():
    pytest.importorskip("fairlearn")
    x, y, s = _biased(800)
    plain = group_metrics(y, s, baselines.plain_predict(x, y, x))
    post = group_metrics(y, s, baselines.threshold_predict(x, y, s, x, s, 1, "demographic-parity"))
    assert plain["dp_diff"] > 0.2 and post["dp_diff"] < plain["dp_diff"] / 3
    # the same rows told the other group: the thresholds follow the group, not the features
    swapped = group_metrics(y, s, baselines.threshold_predict(x, y, s, x, ~s, 1, "demographic-parity"))
    assert swapped["dp_diff"] > plain["dp_diff"]


def _biased(n):
    rng = np.random.default_rng(0)
    s = rng.random(n) < 0.5
    x = rng.normal(size=(n, 3)) + np.where(s, 1.0, 0.0)[:, None]  # group a scores higher
    y = np.where(x[:, 0] + 0.5 * rng.normal(size=n) > 0.5, 1, -1)
    return x, y, s


def test_a_curve_is_read_on_its_non_dominated_points_linearly_and_never_below_its_smallest_gap():
    # (gap, accuracy): (0.2, 0.79) and (0.4, 0.85) are dominated by (0.1, 0.80) and (0.3, 0.86);
    # (0.3, 0.84) is the same gap at a lower accuracy
    points = [(0.3, 0.84), (0.4, 0.85), (0.1, 0.80), (0.2, 0.79), (0.3, 0.86)]
    assert tradeoff.frontier(points) == [(0.1, 0.80), (0.3, 0.86)]
    assert tradeoff.accuracy_at_gap(points, 0.05) is None
    assert tradeoff.accuracy_at_gap(points, 0.1) == pytest.approx(0.80)
    assert tradeoff.accuracy_at_gap(points, 0.25) == pytest.approx(0.80 + 0.75 * 0.06)  # 3/4 of the way
    assert tradeoff.accuracy_at_gap(points, 0.5) == pytest.approx(0.86)  # flat beyond the largest gap
    other = [(0.2, 0.83), (0.5, 0.87)]
    assert tradeoff.matched_gaps([points, other]) == pytest.approx([0.1, 0.2, 0.3, 0.5])  # frontier gaps only
    assert tradeoff.matched_gaps([[(0.1234, 0.8), (0.4567, 0.9)], [(0.12341, 0.7)]]) == [0.1234, 0.12341, 0.4567]


def test_the_bench_compares_every_method_at_the_same_gaps():
    from bench import groups

    def point(method, setting, gap, acc):
        return {"row": "crime-eo", "seed": 0, "method": method, "setting": setting, "gap": gap, "acc": acc,
                "dp_diff": gap, "eo_diff": gap, "train_gap": gap / 2, "train_acc": acc + 0.01}

    rows = [point(groups.FAIRVFL, "ε=0.01", 0.1, 0.80), point(groups.FAIRVFL, "off", 0.3, 0.86),
            point(groups.EG, "bound=0.01", 0.2, 0.83), point(groups.EG, "off (plain LR)", 0.5, 0.87),
            point(groups.THRESHOLD, "thresholds per group", 0.25, 0.82)]
    rows += [{**r, "seed": 1, "acc": r["acc"] - 0.02} for r in rows]  # seed means: 0.01 lower
    summary = groups.summarise(rows)
    assert len(summary) == 5 and summary[0]["acc"] == pytest.approx(0.79) and summary[0]["seeds"] == [0, 1]
    at = {a["gap"]: a for a in groups.matched(summary, rows)}
    assert list(at) == pytest.approx([0.1, 0.2, 0.3, 0.5])
    assert at[0.1]["acc"][groups.EG] is None and at[0.1]["fairvfl_minus_eg"] is None
    assert at[0.1]["per_seed"] == [None, None]  # no seed's EG curve gets down to 0.1
    assert at[0.2]["acc"][groups.FAIRVFL] == pytest.approx(0.79 + 0.5 * 0.06)
    assert at[0.2]["fairvfl_minus_eg"] == pytest.approx(0.82 - 0.82)
    # per seed, EG's own point at 0.2 against FairVFL's curve of that seed at 0.2
    assert at[0.2]["per_seed"] == pytest.approx([0.83 - 0.83, 0.81 - 0.81])
    assert at[0.2]["point"] == "fairlearn EG: bound=0.01"
    assert at[0.3]["fairvfl_minus_eg"] == pytest.approx(0.85 - (0.82 + (0.86 - 0.82) / 3))
    assert at[0.5]["fairvfl_minus_eg"] == pytest.approx(0.85 - 0.86)  # FairVFL flat beyond its largest gap
    assert at[0.2]["acc"][groups.THRESHOLD] is None and at[0.3]["acc"][groups.THRESHOLD] == pytest.approx(0.81)
    assert at[0.3]["eg_apart"] == at[0.3]["acc"][groups.EG]  # no predictors' gaps: EG read at its own
    # the same reading of the training rows' curves (train_gap, train_acc): gaps halved, accuracies 1 pt up
    train = {a["gap"]: a for a in groups.matched(summary, rows, "train")}
    assert list(train) == pytest.approx([0.05, 0.1, 0.15, 0.25])
    assert train[0.15]["fairvfl_minus_eg"] == pytest.approx(at[0.3]["fairvfl_minus_eg"])
    (verdict,) = groups.verdicts(summary, list(at.values()), list(train.values()))
    assert verdict["train_worst"]["gap"] == pytest.approx(0.25)
    assert verdict["worst"]["gap"] == pytest.approx(0.5) and verdict["reading"] == "below"  # -1 pt on both seeds
    assert verdict["fairvfl_train_floor"] == (pytest.approx(0.05), "ε=0.01")
    assert verdict["eg_train_floor"] == (pytest.approx(0.1), "bound=0.01")
    page = groups.markdown(summary, list(at.values()), {"crime-eo": {"groups": ["a", "b"], "test_rows": {"a": 3, "b": 4},
                                                                      "seed": 0}}, None)
    table = [line for line in page.splitlines() if line.startswith("| crime-eo |")]
    assert len(table) == 5 and table[1].split(" | ")[3:5] == ["79.00%", "—"]  # the verdict line, then the gaps


def test_a_shortfall_is_read_against_the_seed_spread():
    from bench import groups

    def entry(diff, per_seed, apart=0.9):
        return {"row": "compas-dp", "gap": 0.1, "point": "FairVFL: ε=0.01", "acc": {groups.FAIRVFL: 0.6},
                "fairvfl_minus_eg": diff, "per_seed": per_seed, "eg_apart": apart}

    summary = [{"row": "compas-dp", "method": m, "setting": "x", "gap": 0.1, "train_gap": 0.05}
               for m in (groups.FAIRVFL, groups.EG)]
    readings = [groups.verdicts(summary, [entry(d, s)])[0]["reading"]
                for d, s in ((0.001, [0.01, -0.01]), (-0.01, [-0.03, 0.02, None]), (-0.01, [-0.03, -0.001]))]
    assert readings == ["at or above", "below, within the seed spread", "below"]
    assert groups.verdicts(summary, [entry(None, [None])])[0]["reading"] == "no common gap"
    # EG read at its predictors' own gaps is below FairVFL there (or never gets there): the shortfall is
    # what EG's draws cancel
    for apart in (0.55, None):
        assert groups.verdicts(summary, [entry(-0.01, [-0.03, -0.001], apart)])[0]["reading"] == (
            "below; at or above EG without its draws' cancelling")


def test_expected_metrics_score_a_randomised_classifier_by_its_expected_rates():
    rng = np.random.default_rng(5)
    y, codes = rng.choice([-1, 1], 300), rng.integers(0, 3, 300)
    hard = rng.choice([-1, 1], 300)
    # probabilities 0 or 1: the hard predictions' own figures
    got, want = baselines.expected_metrics(y, codes, hard > 0), group_metrics(y, codes, hard)
    assert got == pytest.approx({k: want[k] for k in ("acc", "dp_diff", "eo_diff")})
    # a coin on every row: accuracy 1/2 and every rate 1/2, so no gap
    assert baselines.expected_metrics(y, codes, np.full(300, 0.5)) == pytest.approx(
        {"acc": 0.5, "dp_diff": 0.0, "eo_diff": 0.0})
    # the mixture of two classifiers has the mixture's rates: opposite gaps cancel
    a, b = np.where(codes == 0, 1.0, 0.0), np.where(codes == 0, 0.0, 1.0)
    mixed = baselines.expected_metrics(y, codes, 0.5 * a + 0.5 * b)
    assert baselines.expected_metrics(y, codes, a)["dp_diff"] == pytest.approx(1.0) and mixed["dp_diff"] == 0.0


@pytest.mark.slow  # many draws of exponentiated gradient
def test_eg_expected_is_the_probability_its_draws_are_made_with():
    pytest.importorskip("fairlearn")
    x, y, s = _biased(400)
    for protected_label in (1, -1):
        eg = baselines._eg_fit(x, y, s, protected_label, "demographic-parity", 10, 0.02)
        (p,) = baselines.eg_expected(x, y, s, [x], protected_label, "demographic-parity", max_iter=10, bound=0.02)
        pmf = eg._pmf_predict(x)[:, 1]
        np.testing.assert_allclose(p, pmf if protected_label == 1 else 1 - pmf, atol=1e-12)
        draws = np.mean([baselines._from_target(eg.predict(x, random_state=k), protected_label) > 0
                         for k in range(200)], axis=0)
        assert np.abs(draws - p).max() < 0.15  # 200 draws scatter around it
    # each group within 0.02 of the overall rate: a pairwise gap within 0.04 (10 iterations: nearly)
    plain = group_metrics(y, s, baselines.plain_predict(x, y, x))
    assert baselines.expected_metrics(y, s, p)["dp_diff"] < 0.05 < plain["dp_diff"] / 4


@pytest.mark.slow  # FairVFL and fairlearn runs on Crime
def test_the_bench_scores_every_method_on_the_runs_own_split_and_groups(tmp_path):
    pytest.importorskip("fairlearn")
    from bench import groups

    groups.main(["--rows", "crime-eo", "--quick", "--rounds", "2", "--seeds", "0", "--out", str(tmp_path)])
    page = json.loads((tmp_path / "groups.json").read_text())
    settings = [(p["method"], p["setting"]) for p in page["points"]]
    assert settings == [(groups.FAIRVFL, "ε=0.01"), (groups.FAIRVFL, "ε=0.05"), (groups.FAIRVFL, "off"),
                        (groups.EG, "bound=0.01"), (groups.EG, "bound=0.05"), (groups.EG, "off (plain LR)"),
                        (groups.THRESHOLD, "thresholds per group")]
    assert len(page["matched"]) >= 1 and {a["row"] for a in page["matched"]} == {"crime-eo"}
    md = (tmp_path / "groups.md").read_text()
    assert md.count("| crime-eo |") == len(page["matched"]) + 1  # the matched gaps and the row's verdict
    # two groups: the bench's gap for FairVFL is the run's own test_eo_diff, its training gap the run's
    base = groups.run_config("crime-eo", 0, 2, {}, tmp_path)
    summary, _ = run_inprocess({**base, "epsilon": 0.01, "output-dir": str(tmp_path / "run")}, quiet=True)
    first = page["points"][0]
    assert first["rounds"] == summary["rounds"] == 2 and first["optimizer"] == RunConfig.from_flower(base).optimizer_in_use
    assert first["gap"] == pytest.approx(summary["test_eo_diff"]) and first["acc"] == pytest.approx(summary["test_acc"])
    assert first["train_gap"] == pytest.approx(summary["train_eo_diff"])
    # EG in expectation: a probability, not one draw, decides its figures
    eg = next(p for p in page["points"] if p["setting"] == "bound=0.01")
    assert 0 <= eg["train_gap"] <= 1 and 0 < eg["acc"] < 1
    assert eg["train_gap_apart"] >= eg["train_gap"] - 1e-12  # a mean of gaps is at least the mixture's gap


def test_a_run_of_some_rows_keeps_the_pages_other_rows_with_their_commit(tmp_path, capsys):
    from bench import groups

    settings = {"rounds": 30, "epsilons": [0.01], "bounds": [0.01], "seeds": [0], "overrides": {}}
    info = {"groups": ["a", "b"], "test_rows": {"a": 3, "b": 4}, "seed": 0}
    page = {"command": "python bench/groups.py --rows crime-eo,adult-dp", "commit": "abc1234", **settings,
            "groups": {"crime-eo": info, "adult-dp": info},
            "points": [{"row": "crime-eo", "method": groups.EG, "acc": 0.8}, {"row": "adult-dp", "method": groups.EG}]}
    previous = tmp_path / "groups.json"
    previous.write_text(json.dumps(page))
    points, kept = groups.kept_rows(previous, ["adult-dp", "own-csv-eo"], settings)
    assert points == [page["points"][0]]  # adult-dp is rerun: its old points go
    assert kept == {"crime-eo": {"command": page["command"], "commit": "abc1234", "seeds": [0], **info}}
    assert groups.kept_rows(tmp_path / "none.json", ["adult-dp"], settings) == ([], {})
    # other settings: the curves would not be comparable, so nothing is kept, and the run says so
    assert groups.kept_rows(previous, ["adult-dp"], {**settings, "rounds": 5}) == ([], {})
    assert "its rounds differ" in capsys.readouterr().out
    # another page's rows join (the own-csv row run elsewhere); a row on both comes from the last page
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**page, "command": "python bench/groups.py --rows own-csv-eo --out x", "commit": "def5678",
                                 "groups": {"own-csv-eo": info, "crime-eo": info},
                                 "points": [{"row": "own-csv-eo", "acc": 0.7}, {"row": "crime-eo", "acc": 0.1}]}))
    points, kept = groups.kept_pages([other, previous], ["adult-dp"], settings)
    assert sorted(kept) == ["crime-eo", "own-csv-eo"] and kept["crime-eo"]["commit"] == "abc1234"
    assert kept["own-csv-eo"]["commit"] == "def5678"
    assert sorted(p["acc"] for p in points) == [0.7, 0.8]
    # seeds run side by side: a page of seed 1 joins the row of seed 0, and the row names both runs
    seed1 = tmp_path / "seed1.json"
    seed1.write_text(json.dumps({**page, "seeds": [1], "command": "python bench/groups.py --seeds 1", "commit": "fff0000",
                                 "groups": {"crime-eo": {**info, "failed": [{"seed": 1, "setting": "ε=0.01",
                                                                             "reason": "diverged"}]}},
                                 "points": [{"row": "crime-eo", "seed": 1, "acc": 0.6}]}))
    both = {**settings, "seeds": [0, 1]}
    page0 = tmp_path / "seed0.json"
    page0.write_text(json.dumps({**page, "points": [{"row": "crime-eo", "seed": 0, "acc": 0.8}]}))
    points, both_kept = groups.kept_pages([page0, seed1], [], both)
    assert sorted((p["seed"], p["acc"]) for p in points if p["row"] == "crime-eo") == [(0, 0.8), (1, 0.6)]
    assert both_kept["crime-eo"]["also"] == [{"command": "python bench/groups.py --seeds 1", "commit": "fff0000",
                                         "seeds": [1]}]
    assert both_kept["crime-eo"]["failed"][0]["reason"] == "diverged"
    assert groups.kept_pages([seed1], [], settings) == ([], {})  # a seed the run does not hold
    one = [{"row": "crime-eo", "seed": 0, "method": groups.EG, "setting": "off (plain LR)",
            "gap": 0.2, "acc": 0.8, "dp_diff": 0.2, "eo_diff": 0.2, "train_gap": 0.1}]
    summary = groups.summarise(one)
    assert "From `python bench/groups.py --rows crime-eo,adult-dp` at commit abc1234." in groups.markdown(
        summary, groups.matched(summary, one), kept, None)
    # a run that stopped is named on its row with why, and its setting's mean says over how many seeds
    kept["crime-eo"]["failed"] = [{"seed": 1, "setting": "ε=0.001", "reason": "nu holds 86 non-finite value(s)"}]
    two = one + [{**one[0], "seed": 1}, {**one[0], "method": groups.FAIRVFL, "setting": "ε=0.001"}]
    page = groups.markdown(groups.summarise(two), groups.matched(groups.summarise(two), two), kept, None)
    assert "Seed 1, ε=0.001 failed, left out of its mean: nu holds 86 non-finite value(s)." in page
    assert "| FairVFL | ε=0.001 (1 of 2 seeds) |" in page
    assert "; seeds 1 from `python bench/groups.py --seeds 1` at commit fff0000." in groups.markdown(
        groups.summarise(one), groups.matched(groups.summarise(one), one), both_kept, None)


def test_keep_rebuilds_the_page_from_its_json_and_lists_every_rows_command(tmp_path, monkeypatch):
    """bench/groups.py --keep: a run of one row keeps the page's other rows, read again at each
    publish (a run of another row side by side into the same page adds its row, not overwrites
    it), and the notes name each row's command and commit; without --keep only its own rows. The
    page is written after every seed: a run stopped after some seeds leaves its row on those."""
    from bench import groups

    def fake_points(row, seed, epsilons, bounds, rounds, overrides, csv_folder):
        if row == "adult-dp" and seed == 1:
            raise KeyboardInterrupt
        point = {"row": row, "seed": seed, "gap": 0.1, "acc": 0.7, "train_gap": 0.05, "train_acc": 0.7}
        pts = [{**point, "method": groups.FAIRVFL, "setting": "ε=0.01"},
               {**point, "method": groups.EG, "setting": "bound=0.01", "acc": 0.69}]
        return pts, {"groups": ["a", "b"], "test_rows": {"a": 3, "b": 4}, "failed": []}

    monkeypatch.setattr(groups, "points", fake_points)
    args = ["--seeds", "0,1", "--epsilons", "0.01", "--bounds", "0.01", "--out", str(tmp_path)]
    groups.main(["--rows", "crime-eo", *args])
    page = json.loads((tmp_path / "groups.json").read_text())
    page["groups"]["crime-eo"]["commit"] = "abc1234"
    (tmp_path / "groups.json").write_text(json.dumps(page))
    with pytest.raises(KeyboardInterrupt):
        groups.main(["--rows", "adult-dp", *args, "--keep"])
    page = json.loads((tmp_path / "groups.json").read_text())
    assert list(page["groups"]) == ["crime-eo", "adult-dp"] and page["groups"]["crime-eo"]["commit"] == "abc1234"
    assert page["groups"]["adult-dp"]["seeds"] == [0] and page["groups"]["crime-eo"]["seeds"] == [0, 1]
    md = (tmp_path / "groups.md").read_text()
    assert "The rows were made by `" in md and " (at abc1234)`" in md
    assert "Seeds 0 only, of the page's 0, 1." in md and "Not yet run: adult-dp (seeds 1)." in md
    assert ("![test accuracy" in md) == (tmp_path / "groups.png").is_file()  # the plot the page shows is drawn
    groups.main(["--rows", "", *args, "--keep"])  # the page again, from its json alone
    page = json.loads((tmp_path / "groups.json").read_text())
    assert list(page["groups"]) == ["crime-eo", "adult-dp"] and page["groups"]["adult-dp"]["seeds"] == [0]
    assert "Not yet run" not in (tmp_path / "groups.md").read_text()
    groups.main(["--rows", "crime-eo", *args])
    assert list(json.loads((tmp_path / "groups.json").read_text())["groups"]) == ["crime-eo"]
    with pytest.raises(SystemExit):  # nothing to run and nothing to keep: refused, not an empty page
        groups.main(["--rows", "", *args])
