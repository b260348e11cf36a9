"""Several groups: the constraint object's gaps, weights and refusals with G >= 3, checked
against a central computation, and runs that reach every gap on the data's groups."""

import itertools
import json

import numpy as np
import pytest

from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.core.constraints import (CONSTRAINTS, KINDS, ConstraintSet, GroupSizeError, from_labels, gaps_per_row,
                                          register)
from fairvfl_flwr.core.metrics import fairness_metrics
from fairvfl_flwr.features import labeldp
from fairvfl_flwr.core.constraints.measures import logistic_loss, loss_derivative, sigmoid
from fairvfl_flwr.data.partydata import server_labels_for
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.data.tables import load_csv
from fairvfl_flwr.core.newton import smooth_part
from fairvfl_flwr.features.labeldp import smallest_group

from .test_constraints import federated_equals_centralised


def group_rows(seed=0, n=600, G=4):
    """Labels, G groups and scores drawn at random (the ν and gap checks of several groups)."""
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(n) < 0.45, 1.0, -1.0)
    s = rng.integers(0, G, size=n)
    z = rng.normal(scale=2.0, size=n)
    return y, s, z, rng


def shrunk(s, keep, into=0):
    """``s`` with group k cut to its first ``keep[k]`` rows, the rest moved to group ``into``."""
    s = s.copy()
    for k, n in keep.items():
        s[np.flatnonzero(s == k)[n:]] = into
    return s


def positives(y, s, names):
    """Each group's rows with label +1 (the rows DEO constrains), by name."""
    return {g: int(((y == 1) & (s == k)).sum()) for k, g in enumerate(names)}


def _central_nu(y, s, z, lam, protected, kind, measure, form):
    """ν from the definition: ∂/∂z of (1/n)Σ l_i + Σ_c d_c D_c, the gaps written out by group."""
    n, G = len(y), int(s.max()) + 1
    subsets = {"deo": [y == protected], "equalized-odds": [y == protected, y == -protected],
               "demographic-parity": [np.ones(n, dtype=bool)]}[kind]
    slope = loss_derivative(y, z) if measure == "loss" else sigmoid(z) * (1 - sigmoid(z))
    nu = loss_derivative(y, z) / n
    k = 0
    for rows in subsets:
        pairs = (itertools.combinations(range(G), 2) if form == "pairwise" else ((g, None) for g in range(G)))
        for g, h in pairs:
            d = lam[2 * k] - lam[2 * k + 1]
            a = rows & (s == g)
            b = rows & (s == h) if h is not None else rows
            nu = nu + d * slope * (a / a.sum() - b / b.sum())
            k += 1
    return nu, k


@pytest.mark.parametrize("form", ["pairwise", "overall"])
@pytest.mark.parametrize("measure", ["loss", "rate"])
@pytest.mark.parametrize("kind", CONSTRAINTS)
def test_nu_with_four_groups_matches_a_central_computation(kind, measure, form):
    y, s, z, rng = group_rows()
    constraint = from_labels(y, s, -1, kind, measure, form=form)
    lam = rng.uniform(0, 0.5, size=constraint.num_multipliers)
    want, gaps = _central_nu(y, s, z, lam, -1, kind, measure, form)
    assert len(constraint.gap_list) == gaps  # pairwise: 6 per subset, overall: 4
    np.testing.assert_allclose(constraint.masked_weights(y, z, lam), want, rtol=1e-12, atol=1e-15)
    # and ν is the gradient of the smooth part in z (what the parties' steps rely on)
    e = 1e-6 * rng.normal(size=len(z))
    fd = smooth_part(constraint, y, z + e, lam) - smooth_part(constraint, y, z - e, lam)
    assert fd == pytest.approx(2 * e @ want, rel=1e-6)


def test_pairwise_gaps_of_g_groups_and_the_overall_form():
    y, s, z, _ = group_rows(G=3)
    q = logistic_loss(y, z)
    pw = from_labels(y, s, 1, "deo", form="pairwise", names=("x", "y", "z"))
    ov = from_labels(y, s, 1, "deo", form="overall", names=("x", "y", "z"))
    rows = y == 1
    mean = [q[rows & (s == g)].mean() for g in range(3)]
    np.testing.assert_allclose(pw.gaps(y, z), [mean[0] - mean[1], mean[0] - mean[2], mean[1] - mean[2]])
    np.testing.assert_allclose(ov.gaps(y, z), [m - q[rows].mean() for m in mean])
    assert [c.name for c in pw.gap_list] == ["y=+1: x vs y", "y=+1: x vs z", "y=+1: y vs z"]
    assert (gaps_per_row(pw), gaps_per_row(ov)) == (2, 4)


def test_two_groups_pairwise_is_the_papers_gap_and_overall_is_scaled():
    y, s, z, _ = group_rows(G=2)
    boolean = from_labels(y, s == 0, 1, "deo")
    coded = from_labels(y, s, 1, "deo")
    assert np.array_equal(boolean.gaps(y, z), coded.gaps(y, z)) and coded.gap_list[0].name == "y=+1: 0 vs 1"
    # group a against all rows = the pairwise gap times b's share of the subset
    ov = from_labels(y, s, 1, "deo", form="overall")
    rows = y == 1
    share_b = (rows & (s == 1)).sum() / rows.sum()
    assert ov.gaps(y, z)[0] == pytest.approx(coded.gaps(y, z)[0] * share_b)


def test_a_too_small_group_is_refused_naming_it_and_its_count_unless_pooled():
    y, s, z, _ = group_rows(n=900, G=3)
    s = shrunk(s, {2: 20})  # group 'c' keeps 20 rows, some with each label
    names = ("a", "b", "c")
    count = positives(y, s, names)["c"]
    with pytest.raises(GroupSizeError, match=rf"min-group-size = 30 training rows.*'c' has {count} in 'y=\+1'"):
        from_labels(y, s, 1, "deo", names=names, min_group_size=30)
    assert issubclass(GroupSizeError, ConfigError)
    pooled = from_labels(y, s, 1, "deo", names=names, min_group_size=30, pool_small_groups=True)
    # one small group: merged with the next smallest until the merged group is big enough
    assert pooled.groups.names == ("a", "b + c") and len(pooled.gap_list) == 1
    assert smallest_group(pooled) >= 30
    said = pooled.pooling.describe()
    as_read = from_labels(y, s, 1, "deo", names=tuple(np.array(names)), min_group_size=30,
                          pool_small_groups=True)
    assert as_read.pooling.describe() == said  # names as a table's values (numpy strings) read the same
    assert said.startswith(f"pooled 2 groups into one, 'b + c' has {pooled.gap_list[0].size_b} in 'y=+1': "
                           f"'c' has {count} in 'y=+1', below min-group-size = 30 training rows"), said
    assert "'b' has " in said and "joined as the next smallest" in said


def test_a_pooled_group_still_too_small_is_refused_naming_each_member():
    """Pooling cannot help when nothing is left to pool with: the refusal names the pooled group
    and each of its members with its count."""
    y, s, _, _ = group_rows(n=900, G=3)
    s = shrunk(s, {1: 20, 2: 12})
    counts = positives(y, s, "abc")
    with pytest.raises(GroupSizeError) as err:
        from_labels(y, s, 1, "deo", names=tuple("abc"), min_group_size=30, pool_small_groups=True)
    said = str(err.value)
    assert f"'b + c' has {counts['b'] + counts['c']} in 'y=+1' (pooled from 'b' has {counts['b']} in 'y=+1', " \
           f"'c' has {counts['c']} in 'y=+1'; no group is left to pool with)" in said, said
    assert "set pool-small-groups" not in said


def test_a_refusal_names_every_small_group_with_its_count():
    y, s, _, _ = group_rows(n=900, G=4)
    s = shrunk(shrunk(s, {2: 25}), {3: 12}, into=1)
    counts = positives(y, s, "abcd")
    with pytest.raises(GroupSizeError) as err:
        from_labels(y, s, 1, "deo", names=tuple("abcd"), min_group_size=30)
    assert str(err.value).startswith("2 group(s)")
    assert f"'c' has {counts['c']} in 'y=+1'" in str(err.value) and f"'d' has {counts['d']} in 'y=+1'" in str(err.value)


@pytest.mark.parametrize("dataset,constraint", [("compas-race", "deo"), ("compas-race", "equalized-odds"),
                                                ("compas-race", "demographic-parity"), ("adult-sex-race", "deo")])
def test_pooled_groups_are_decided_on_the_whole_table_the_same_for_every_seed(dataset, constraint):
    """COMPAS's six races, Adult's sex × race: under the defaults the small groups are pooled,
    and which follows the table's counts, not a seed's split."""
    pooled = set()
    for seed in range(3):
        cfg = RunConfig.from_flower({"dataset": dataset, "seed": seed, "constraint": constraint})
        built = server_labels_for(cfg).constraint_for(cfg.constraint, cfg.measure)
        pooled.add((built.groups.names, built.pooling.describe()))
    assert len(pooled) == 1, pooled
    assert " + " in pooled.pop()[0][-1]


def test_pool_small_groups_false_refuses_naming_every_small_group():
    cfg = RunConfig.from_flower({"dataset": "adult-sex-race", "pool-small-groups": False})
    with pytest.raises(GroupSizeError, match=r"^2 group\(s\) with fewer than min-group-size = 30 rows of the table .*"
                       r"'Female & Other' has 9 in 'y=\+1', 'Female & Amer-Indian-Eskimo' has 14 in 'y=\+1'.*"
                       r"set pool-small-groups = true"):
        server_labels_for(cfg).constraint_for(cfg.constraint, cfg.measure)


def test_under_the_defaults_small_groups_are_pooled_and_logged_by_name_before_round_1(run_app, tmp_path, caplog):
    caplog.set_level("INFO", logger="flwr")
    run = run_app({"dataset": "compas-race", "num-parties": 3, "num-server-rounds": 1, "eval-every": 1,
                   "output-dir": str(tmp_path)})
    said = [r.getMessage() for r in caplog.records]
    pooled = [i for i, m in enumerate(said) if m.startswith("FairVFL: pooled")]
    round_1 = next(i for i, m in enumerate(said) if m.startswith("[round 1]"))
    assert len(pooled) == 1 and pooled[0] < round_1, said
    assert said[pooled[0]].startswith(
        "FairVFL: pooled 3 groups into one, 'Asian + Native American + Other' has 248 in 'y=-1': 'Asian' has 23 in "
        "'y=-1' and 'Native American' has 6 in 'y=-1', below min-group-size = 30 rows of the table"), said[pooled[0]]
    assert "'Other' has 219 in 'y=-1' joined as the next smallest" in said[pooled[0]]
    assert "y=-1: African-American vs Asian + Native American + Other" in run.history[-1]["gaps"]
    card = (run.folder / "model-card.md").read_text()
    assert "- pooled 3 groups into one, 'Asian + Native American + Other' has 248 in 'y=-1'" in card


def test_label_dp_sensitivity_bounds_a_flip_with_several_groups():
    y, s, z, rng = group_rows(n=400, G=3)
    for form in ("pairwise", "overall"):
        constraint = from_labels(y, s, 1, "equalized-odds", form=form)
        m, bound_lam = smallest_group(constraint) - 1, 0.6
        bound = labeldp.label_sensitivity(constraint, bound_lam, m)
        worst = 0.0
        for _ in range(10):
            lam = np.zeros(constraint.num_multipliers)
            lam[rng.integers(0, 2, size=len(constraint.gap_list)) + 2 * np.arange(len(constraint.gap_list))] = bound_lam
            nu = constraint.masked_weights(y, z, lam)
            for j in rng.choice(len(y), size=10, replace=False):
                y2 = y.copy()
                y2[j] = -y2[j]
                g2 = from_labels(y2, s, 1, "equalized-odds", form=form)
                worst = max(worst, float(np.linalg.norm(g2.masked_weights(y2, z, lam) - nu)))
        assert 0 < worst <= bound


def test_metrics_with_several_groups_give_pairwise_and_overall_gaps():
    y = np.array([1, 1, -1, -1, 1, -1, 1, -1, 1, -1])
    s = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
    z = np.array([1, -1, 1, -1, 1, -1, -1, -1, -1, 1.0])
    m = fairness_metrics(y, s, z)
    # FNR: group 0 1/2, group 1 0, group 2 1; FPR: 1/2, 0, 1/2; overall FNR 3/5, FPR 2/5
    assert (m["dfn"], m["dfp"]) == pytest.approx((1.0, 0.5))
    assert (m["dfn_overall"], m["dfp_overall"]) == pytest.approx((0.6, 0.4))
    assert fairness_metrics(y, s == 0, z).keys() == {"acc", "dfp", "dfn", "dp_diff", "eo_diff"}  # two groups: no overall gaps


def test_every_kind_is_registered_by_its_name():
    assert tuple(KINDS) == tuple(CONSTRAINTS) and all(KINDS[k].kind == k for k in KINDS)
    with pytest.raises(ValueError, match="unknown constraint 'parity'"):
        from_labels(np.ones(4), np.array([0, 1, 0, 1]), 1, "parity")


def test_a_csv_with_several_sensitive_columns_makes_every_combination_a_group(tmp_path):
    rng = np.random.default_rng(0)
    n = 400
    path = tmp_path / "t.csv"
    sex, race = rng.choice(["F", "M"], n), rng.choice(["p", "q", "r"], n)
    rows = ["x1,x2,sex,race,label"] + [f"{rng.normal():.3f},{rng.normal():.3f},{a},{b},{rng.choice(['yes', 'no'])}"
                                       for a, b in zip(sex, race)]
    path.write_text("\n".join(rows) + "\n")
    ds = load_csv(path, label_column="label", positive_value="yes", sensitive_column="sex,race", group_a="",
                  group_b="")
    assert ds.group_names == ("F & p", "F & q", "F & r", "M & p", "M & q", "M & r")
    assert ds.feature_names == ["x1", "x2"]  # no sensitive column becomes a feature
    codes = np.concatenate([ds.s_train, ds.s_test])
    assert sorted(np.bincount(codes)) == sorted(np.unique([f"{a} & {b}" for a, b in zip(sex, race)],
                                                          return_counts=True)[1])
    cfg = RunConfig.from_flower({"dataset": "csv", "csv.path": str(path), "csv.label": "label",
                                 "csv.positive": "yes", "csv.sensitive": "sex,race"})
    assert cfg.optimizer_in_use == "newton"  # as with two groups: the group count does not decide
    with pytest.raises(ConfigError, match="csv.group-b"):
        RunConfig.from_flower({"dataset": "csv", "csv.path": str(path), "csv.label": "label",
                               "csv.positive": "yes", "csv.sensitive": "sex", "csv.group-a": "F"})


class OtherLabel(ConstraintSet):
    """A kind defined here, as docs/architecture.md shows: the groups' gap on the rows of the
    label that is not the protected one."""

    kind = "other-label"
    label_subsets = 1

    @classmethod
    def subsets(cls, y, protected_label):
        return [(f"y={-protected_label:+d}", y == -protected_label)]


@pytest.fixture
def other_label():
    """:class:`OtherLabel` registered for one test, then removed from the registry."""
    register(OtherLabel)
    try:
        yield OtherLabel
    finally:
        del KINDS[OtherLabel.kind]


def test_a_new_kind_is_one_subclass_and_its_registration(other_label):
    y, s, z, rng = group_rows(G=3)
    constraint = from_labels(y, s, 1, "other-label", "rate")
    eo = from_labels(y, s, 1, "equalized-odds", "rate")
    np.testing.assert_array_equal(constraint.gaps(y, z), eo.gaps(y, z)[3:])  # EO's second subset, 3 pairs
    lam = rng.uniform(0, 0.5, size=constraint.num_multipliers)
    want, _ = _central_nu(y, s, z, np.concatenate([np.zeros(6), lam]), 1, "equalized-odds", "rate", "pairwise")
    np.testing.assert_allclose(constraint.masked_weights(y, z, lam), want, rtol=1e-12, atol=1e-15)
    assert labeldp.label_sensitivity(constraint, 0.5, 10) > 0
    with pytest.raises(ValueError, match="taken"):
        register(OtherLabel)


def test_a_new_kind_trains_through_the_app_with_nothing_else_changed(other_label, out_dir, run_app):
    """The run config accepts the registered name, and the ServerApp and ClientApps train with
    it exactly as the centralised descent–ascent on its gap; the history names that gap."""
    assert "other-label" in CONSTRAINTS and RunConfig(constraint="other-label").measure == "loss"
    run = federated_equals_centralised("other-label", "loss", out_dir, run_app)
    other = -load_data(RunConfig(dataset="crime", seed=4)).protected_label
    (name,) = run.history[-1]["gaps"]  # two groups: one gap, on the other label's rows
    assert name.startswith(f"y={other:+d}")


def _ends_within_epsilon(run_app, tmp_path, **cfg):
    run = run_app({"num-parties": 3, "eval-every": 500, "pool-small-groups": True, "output-dir": str(tmp_path), **cfg})
    last = run.history[-1]
    assert len(last["gaps"]) > 1  # several groups: one gap per pair
    assert max(abs(g) for g in last["gaps"].values()) <= 0.01 + 0.002, last["gaps"]
    return run, last


@pytest.mark.slow  # a run to the stop rule; the fast loop checks several groups' gaps, weights and metrics above
def test_compas_with_every_race_pooled_meets_every_gap_with_the_defaults(run_app, tmp_path):
    run, last = _ends_within_epsilon(run_app, tmp_path, dataset="compas-race")
    assert len(last["gaps"]) == 6  # African-American, Caucasian, Hispanic and the pooled small races
    assert last["round"] < 1000  # the stop rule ended it at the target


@pytest.mark.slow
def test_adult_sex_by_race_meets_every_gap_with_the_defaults(run_app, tmp_path):
    _ends_within_epsilon(run_app, tmp_path, dataset="adult-sex-race")


def test_the_report_and_the_core_metrics_agree_with_three_groups():
    pytest.importorskip("fairlearn")
    from fairvfl_flwr.tools.report import report

    rng = np.random.default_rng(5)
    n = 900
    y = rng.random(n) < 0.4
    codes = rng.integers(0, 3, size=n)
    decision = rng.random(n) < np.array([0.3, 0.45, 0.6])[codes]
    rep = report(y, decision, np.array(["p", "q", "r"])[codes], replicates=0)
    core = fairness_metrics(np.where(y, 1, -1), codes, np.where(decision, 1.0, -1.0))
    assert len(rep["groups"]) == 3
    for k in ("dfp", "dfn", "dfp_overall", "dfn_overall"):
        assert rep["gaps"][k] == pytest.approx(core[k])


@pytest.mark.parametrize("extra", [
    {"privacy.label-dp-epsilon": 8.0, "privacy.label-dp-lambda-bound": 0.5},
    {"privacy.secure-aggregation": True},
    {"batching.batch-size": 2000},
    {"constraint": "equalized-odds", "constraint-measure": "rate", "constraint-form": "overall"},
], ids=["label-dp", "secure-aggregation", "batching", "eo-rate-overall"])
def test_features_run_with_several_groups(run_app, tmp_path, extra):
    """Label DP, secure aggregation and batches need nothing of a constraint but its object."""
    run = run_app({"dataset": "compas-race", "pool-small-groups": True, "num-parties": 3, "num-server-rounds": 4,
                   "eval-every": 4, "output-dir": str(tmp_path), **extra})
    last = run.history[-1]
    groups = 4  # the pooled COMPAS races
    per_subset = groups * (groups - 1) // 2 if extra.get("constraint-form", "pairwise") == "pairwise" else groups
    subsets = 2 if extra.get("constraint") == "equalized-odds" else 1
    assert len(last["gaps"]) == subsets * per_subset and len(last["lambdas"]) == 2 * len(last["gaps"])
    assert np.isfinite(last["loss"]) and last["round"] == 4
