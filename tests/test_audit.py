"""The leakage audit finds the label and group leak of plain ν, and noise blunts it."""

import numpy as np
import pytest

from fairvfl_flwr.features import transcripts as tr
from fairvfl_flwr.tools.audit import auc, chance_auc, run_audit, spread


def test_auc_matches_definition():
    score = np.array([0.1, 0.4, 0.35, 0.8])
    pos = np.array([False, False, True, True])
    assert auc(score, pos) == pytest.approx(0.75)
    assert auc(np.array([1.0, 1.0]), np.array([True, False])) == pytest.approx(0.5)


def test_chance_auc_is_what_an_uninformative_score_reaches_on_that_many_rows():
    rng = np.random.default_rng(3)
    small = [chance_auc(rng.normal(size=400), rng.random(400) < 0.3) for _ in range(3)]
    large = chance_auc(rng.normal(size=40_000), rng.random(40_000) < 0.3)
    assert all(0.53 < c < 0.6 for c in small) and 0.5 < large < 0.51  # shrinks like 1/sqrt(rows)
    # about 5 % of uninformative scores on 400 rows land above it, an informative one far above
    hits = 0
    for _ in range(200):
        s, g = rng.normal(size=400), rng.random(400) < 0.3
        a = auc(s, g)
        hits += max(a, 1 - a) > small[0]
    assert 2 <= hits <= 20
    g = rng.random(400) < 0.3
    a = auc(g + rng.normal(scale=2.0, size=400), g)
    assert a > small[0]


def test_spread_summarises_each_defence_over_its_repeats():
    rows = [{"dataset": d, "nu_noise": 0.0, "label_attack_acc": a, "group_attack_auc": g, "test_acc": 0.8}
            for d, a, g in (("crime", 0.5, 0.52), ("crime", 0.6, 0.56), ("adult", 0.7, 0.5), ("adult", 0.9, 0.5))]
    text = spread(rows, 2)
    crime, adult = (line for line in text.splitlines() if line.startswith(("| crime", "| adult")))
    assert "0.55 [0.5, 0.6]" in crime and "0.54 [0.52, 0.56]" in crime and "80 [80, 80]" in crime
    assert "0.8 [0.7, 0.9]" in adult and "nan" in adult  # a key no run reported
    assert spread(rows, 1) == ""


def test_plain_nu_leaks_labels_and_groups():
    r = run_audit("crime", rounds=30, noise=0.0)
    assert r["label_attack_acc"] == 1.0  # round 1: ν = −y/(2n)
    assert r["label_attack_acc"] > r["label_baseline_acc"] + 0.15
    assert r["group_attack_auc"] > 0.9 > 0.6 > r["group_attack_auc_chance"] > 0.5


def test_noise_blunts_single_round_attack_but_not_averaging():
    r = run_audit("crime", rounds=30, noise=2.0)
    assert r["label_attack_acc"] < 0.75  # one noisy round: near chance
    assert r["group_attack_auc"] < 0.65
    assert r["label_attack_acc_avg"] > r["label_attack_acc"]  # averaging rounds strips the noise


def test_recording_is_opt_in_and_only_passive(tmp_path):
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.app.run import run_inprocess

    cfg = RunConfig(dataset="crime", num_server_rounds=13, record_view=str(tmp_path / "v"), record_every=12,
                    output_dir=str(tmp_path / "o"))
    run_inprocess(cfg.to_flower())
    parties = sorted(p.name for p in (tmp_path / "v").iterdir())
    assert parties == [f"party-{k}" for k in range(1, 6)]  # party 0 is active: no ν, no transcript; no server
    rounds, nus = tr.stack(tr.load(tmp_path / "v", 1), "nu")  # the one transcript format and rounds
    assert list(rounds) == list(range(1, 14))  # 1..10, then 12 with 11 and 13
    assert nus.shape == (13, 1200)
    both = cfg.replace(transcript_dir=str(tmp_path / "t"), output_dir=str(tmp_path / "o2"))
    run_inprocess(both.to_flower())
    for k in range(1, 6):  # a passive party writes the same file to both folders
        a, b = tr.load(tmp_path / "v", k), tr.load(tmp_path / "t", k)
        assert [sorted(r) for r in a] == [sorted(r) for r in b]


def test_evaluation_replies_give_the_server_the_test_rows_gram_matrix_unless_masked():
    r = run_audit("crime", rounds=30, noise=0.0, overrides={"eval-every": 1})
    assert r["label_attack_best"] == 1.0 and r["label_attack_best_round"] >= 1
    assert r["server_gram_error_col"] < 0.1
    assert r["server_test_gram_pairs"] == 31 and r["server_test_gram_error_col"] < 0.3  # guessing 0 scores 1.0
    s = run_audit("crime", rounds=30, noise=0.0, overrides={"eval-every": 1, "privacy.secure-aggregation": True})
    assert min(s["server_test_gram_errors_col"]) >= 0.9 and min(s["server_gram_errors_col"]) >= 0.9


@pytest.mark.slow
def test_the_strongest_label_attacker_finds_what_the_sign_attacks_miss_under_label_dp():
    """COMPAS under label DP at ε = 8 (Newton, 40 rounds): one round's sign is at chance, but
    accumulating ν over every round infers labels well above the majority class."""
    r = run_audit("compas", rounds=40, noise=0.0, overrides={"optimizer": "newton", "stop-tolerance": 0.0,
                                                             "privacy.label-dp-epsilon": 8.0,
                                                             "sensitive-as-input": True})  # as measured
    assert r["rounds_recorded"] == 40
    assert r["label_attack_acc"] < r["label_baseline_acc"] + 0.02
    assert r["label_attack_best"] > r["label_baseline_acc"] + 0.03
    assert r["label_attack_best_by"] in ("sign-sum", "scaled-sum", "logistic") and r["label_attack_best_round"] > 20
