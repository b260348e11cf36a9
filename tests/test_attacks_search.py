"""The audits that search: the strongest label attacker, Gram errors on the column space, the
test rows' Gram matrix from evaluation replies. Each is exact where the data hold it and at
chance on noise."""

import numpy as np

from fairvfl_flwr.tools import attacks


def _gd_party(X, X_test, rounds, eta=1.0, mu=0.01, seed=0):
    """A linear party's logits (float32 wire) on training and test rows under gradient steps."""
    rng = np.random.default_rng(seed)
    n = len(X)
    theta = np.zeros(X.shape[1])
    u, u_test, nu = {0: np.zeros(n)}, {}, {}
    for t in range(1, rounds + 1):
        nu[t] = rng.normal(size=n) / n
        theta = (1 - mu / eta) * theta - (1 / eta) * X.T @ nu[t]
        u[t] = (X @ theta).astype(np.float32).astype(np.float64)
        u_test[t] = (X_test @ theta).astype(np.float32).astype(np.float64)
    return u, u_test, nu


def _one_hot_block(n, seed):
    """Centred one-hot columns of a categorical feature (rank one less than its columns) and two numbers."""
    rng = np.random.default_rng(seed)
    cats = np.eye(5)[rng.integers(0, 5, n)]
    return np.column_stack([cats - cats.mean(axis=0), rng.normal(size=(n, 2))])


def test_column_space_score_ignores_only_what_lies_outside_the_features():
    rng = np.random.default_rng(1)
    X = _one_hot_block(300, 1)
    Q = attacks.column_basis(X)
    assert Q.shape[1] == X.shape[1] - 1  # the one-hot columns sum to zero
    rows = attacks.score_rows(300)
    exact = attacks.GramEstimate(Q, Q.T @ X @ X.T @ Q, 1)
    # an estimate exact on the column space, with a large spurious direction outside it
    off = rng.normal(size=300)
    off -= Q @ (Q.T @ off)
    off /= np.linalg.norm(off)
    spurious = attacks.GramEstimate(np.column_stack([Q, off]),
                                    np.block([[exact.core, np.zeros((Q.shape[1], 1))],
                                              [np.zeros((1, Q.shape[1])), np.full((1, 1), 1e3)]]), 1)
    assert attacks.gram_error_col(exact, X, rows) < 1e-12
    assert attacks.gram_error(spurious, X, rows) > 1.0  # the plain score calls it useless
    assert attacks.gram_error_col(spurious, X, rows) < 1e-12  # inner products of the features: exact
    # a wrong estimate inside the column space still counts in full
    wrong = attacks.GramEstimate(Q, 2 * exact.core, 1)
    assert attacks.gram_error_col(wrong, X, rows) > 0.99


def test_gram_attacks_are_exact_on_a_rank_deficient_block_and_at_chance_on_noise():
    rng = np.random.default_rng(2)
    X, X_test = _one_hot_block(400, 2), _one_hot_block(150, 3)
    u, u_test, nu = _gd_party(X, X_test, 30)
    rows, test_rows = attacks.score_rows(400), attacks.score_rows(150)
    est = attacks.gram_attack(u, nu, 1.0, 0.01, X.shape[1])
    assert attacks.gram_error_col(est, X, rows) < 1e-5
    noise = attacks.fit_gram(rng.normal(size=(400, 20)), rng.normal(size=(400, 20)), X.shape[1])
    assert attacks.gram_error_col(noise, X, rows) > 0.95
    # evaluation replies: the test rows' Gram matrix, once they span the features
    A = np.stack([u[t] for t in range(1, 31)], axis=1)
    B = np.stack([u_test[t] for t in range(1, 31)], axis=1)
    assert attacks.gram_error_col(attacks.eval_gram_attack(A, B, est), X_test, test_rows) < 1e-4
    few = attacks.eval_gram_attack(A[:, :2], B[:, :2], est)  # two replies: two directions of six
    assert attacks.gram_error_col(few, X_test, test_rows) > 0.1
    shuffled = attacks.eval_gram_attack(A, rng.normal(size=B.shape), est)
    assert attacks.gram_error_col(shuffled, X_test, test_rows) > 0.8


def test_eval_pairs_read_gradient_descent_replies_from_the_server_transcript():
    u = {t: np.full(4, float(t), np.float32) for t in range(3)}
    server = [{"round": np.int64(t), "u-2": u[t], **({"u-test-2": u[t][:3] * 2} if t else {})} for t in range(3)]
    train, test = attacks.eval_pairs(server, 2)
    assert train.shape == (4, 2) and np.array_equal(test, 2 * train[:3])
    try:
        attacks.eval_pairs(server, 1)
    except ValueError as exc:
        assert "party 1" in str(exc)
    else:
        raise AssertionError("a party without evaluation replies must be refused")


def test_best_threshold_falls_back_on_the_majority():
    y = np.array([1, 1, 1, -1])
    cut, acc = attacks.best_threshold(np.zeros(4), y)
    assert acc == 0.75 and cut == -np.inf  # one score for every row: guess the majority
    cut, acc = attacks.best_threshold(np.array([3.0, 2.0, 1.0, 0.0]), y)
    assert acc == 1.0 and 0 < cut < 1


def _nus(y, rounds, signal, seed):
    rng = np.random.default_rng(seed)
    n = len(y)
    return np.stack([-signal * y / (2 * n) + rng.normal(scale=1 / n, size=n) for _ in range(rounds)])


def test_accumulating_attackers_find_what_no_single_round_shows():
    y = np.where(np.random.default_rng(0).random(2000) < 0.55, 1, -1)
    rounds = np.arange(1, 41)
    weak = attacks.label_attacks(rounds, _nus(y, 40, 0.3, 1), y)
    single = weak["attackers"]["round"]["acc"]
    assert weak["best_by"] in ("sign-sum", "scaled-sum", "logistic") and weak["best_round"] >= 30
    assert weak["best"] > single + 0.05 and weak["best"] > weak["baseline"] + 0.1
    plain = attacks.label_attacks(rounds, _nus(y, 40, 50.0, 2), y)
    assert plain["best"] == 1.0


def test_label_attackers_stay_at_the_majority_on_noise():
    """Fitted on half the rows, scored on the other: a rule that learnt only noise does no better
    than the majority class (within the spread of 2,000 rows), and never far below it."""
    y = np.where(np.random.default_rng(0).random(2000) < 0.6, 1, -1)
    r = attacks.label_attacks(np.arange(1, 41), _nus(y, 40, 0.0, 3), y)
    assert abs(r["baseline"] - 0.6) < 0.03
    assert r["best"] - r["baseline"] < 0.02
    assert all(a["acc"] > r["baseline"] - 0.05 for a in r["attackers"].values())
