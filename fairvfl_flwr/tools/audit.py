"""Leakage audit: what each role (server, active party, passive party) learns, measured.

::

    python -m fairvfl_flwr.tools.audit --datasets adult,compas,crime --rounds 300 --out results/audit
    python -m fairvfl_flwr.tools.audit --datasets adult --noise 0,1,4,16    # with the nu-noise defence
    python -m fairvfl_flwr.tools.audit --datasets crime --secure-aggregation  # masked partial logits
    python -m fairvfl_flwr.tools.audit --datasets crime,compas --rounds 30 --malicious  # a server that lies
    python -m fairvfl_flwr.tools.audit --datasets crime --optimizer newton --set stop-tolerance=0 --rounds 30
    python -m fairvfl_flwr.tools.audit --datasets compas --optimizer newton --set stop-tolerance=0 --rounds 40 \
        --set privacy.label-dp-epsilon=2 --repeats 6 --out results/audit-labeldp-eps2-compas --results docs/results
    python -m fairvfl_flwr.tools.audit --datasets crime,compas,adult --optimizer newton --set stop-tolerance=0 \
        --rounds 40 --set eval-every=1 --out results/audit-eval-newton   # the evaluation replies, every round

For each dataset the command trains FairVFL (in-process grid, real ClientApp) with
``privacy.transcript-dir`` on, so every role keeps what it received on its own side
(features/transcripts.py), then attacks each transcript and scores the attacks against
the truth, which no attacker sees:

* **passive party 1, labels**: ``ŷ_i = −sign(ν_i)``. Since ν_i = w_i ∂l/∂z_i and
  ∂l/∂z_i = −y_i σ(−y_i z_i), the sign gives the label wherever the row weight w_i is
  positive. In round 1, z = 0 and λ = 0, so ν_i = −y_i / (2n) exactly. Scored as accuracy
  on round 1's ν and on the last recorded round's (where a large λ can make a group's
  weight negative), next to the majority-class baseline; on the mean of the first 10
  rounds' ν, which strips zero-mean noise (the ``privacy.nu-noise`` defence) off; and,
  under that noise, after redrawing it from the run's seed (every party holds the run config).
  ``label_attack_best``: the strongest of the attackers of tools/attacks.label_attacks (the
  ones above, sign sums and scaled sums of ν up to a chosen round, a logistic regression on
  every round's ν), scored on rows its rule was not fitted on, with which attacker
  (``label_attack_best_by``) and the last round it used (``label_attack_best_round``);
  ``label_attack_gap`` = it − the majority. Every round is recorded for it
  (``privacy.record-first`` = the number of rounds).
* **passive party 1, groups** of the protected-label rows: ν_i(t) = w_g(t) o_i(t) with
  one weight per group g ∈ {N^a, N^b, rest} that moves with λ1 − λ2. The attacker takes
  the per-round log-ratios log|ν_i(t)/ν_i(t−1)|, centres them per round, and projects
  each row on the first principal component: rows of the same group share the weight's
  moves. Scored as AUC against the true group (max(AUC, 1 − AUC): the attacker learns
  the partition, not which side is called "a"), next to 0.5 for guessing.
* **the server, features**: each linear passive party's Gram matrix X_k X_kᵀ from the
  u_k it received and the ν it sent (tools/attacks.py); relative Frobenius error on 200
  seeded rows, next to 1.0 for guessing 0. The median over the passive parties; ``_col``:
  scored on the column space of the party's features (rank-deficient blocks count).
* **the server, test rows** (``server_test_gram_error_col``): each linear passive party's
  test-row Gram matrix from its evaluation replies (test logits, Newton's test directions)
  and the server's training-Gram estimate; needs as many evaluation rounds as the party has
  columns (``--set eval-every=1``).
* **the active party, features**: Σ_passive X_k X_kᵀ from z minus its own logits, with
  ν recomputed from its own y, s and the λ it receives; the same score.
* **server + active party, features**: the same sum with the ν the server sent (noise
  included) and the z it decoded, which secure aggregation does not hide from it.
* **the server, any model** (linear or MLP): distances between people in a party's
  feature space from the distances between their logit trajectories across rounds;
  Spearman rank correlation with the true distances, next to the same score on shuffled
  rows. The active party's version ranks the passive sum's trajectory S(t) against the
  passive parties' joined columns.
* **server + active party under secure aggregation**: the active party's pair keys peeled
  off each passive party's masked words (tools/attacks.peel_masks), then the server's
  attacks on what is left: the party's logits with one passive party, words still masked
  by the passive parties' mutual keys with two or more.

Under ``optimizer = "newton"`` (``--optimizer newton`` or ``--set "optimizer='newton'"``; the
transcript holds directions, so the attacks follow it, not the flag) the server's Gram attack
uses the Newton equation X_k X_kᵀ(h̃ ⊙ X_k s_k + ν) = −μ(X_k s_k + X_k θ_k) on each reply
(tools/attacks.newton_gram_attack) and its trajectory attack the logits it tracks with the
replies; the coalition sums the server's per-party estimates; the active party's attack is
the trajectory one on S(t) (its gradient-descent identity does not hold for Newton steps);
the passive attacks are unchanged (ν is computed as for gradient descent; its α_k are at most
1 + newton-memory floats per round with nothing per row).
Any other run-config key: ``--set key=value`` (flwr run's ``--run-config`` syntax).
"""
from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config.run import RunConfig
from fairvfl_flwr.data.partydata import party_spec, server_labels_for
from fairvfl_flwr.data.problem import constraint_groups, is_active, load_data, whole_table
from fairvfl_flwr.flower.arrays import to_numpy
from fairvfl_flwr.secure import agreement
from fairvfl_flwr.features import transcripts
from fairvfl_flwr.features.checkpoint import labels_fingerprint
from fairvfl_flwr.features.noise import NuNoise
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.flower.party import party_data
from fairvfl_flwr.algorithms.newton import ENCRYPTED_NU_CURVATURE, NEWTON, PASSIVE_CURVATURE
from fairvfl_flwr.tools import attacks, malicious
from fairvfl_flwr.tools.cli import RunConfigArgError, parse_run_config
from fairvfl_flwr.tools.results import publish, this_command


def _ranks(score: np.ndarray) -> np.ndarray:
    """1-based ranks, ties averaged."""
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    _, inv, counts = np.unique(score, return_inverse=True, return_counts=True)
    return (np.bincount(inv, weights=ranks) / counts)[inv]


def auc(score: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve (Mann–Whitney, ties averaged)."""
    score, positive = np.asarray(score, float), np.asarray(positive, bool)
    n_pos, n_neg = positive.sum(), (~positive).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((_ranks(score)[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def chance_auc(score: np.ndarray, positive: np.ndarray, quantile: float = 0.95, draws: int = 1000) -> float:
    """The ``quantile`` of max(AUC, 1 − AUC) when the groups are shuffled: what a score with no
    information about them reaches by chance on this many rows (a seeded draw, so the audit
    is reproducible). On a few hundred rows it is well above 0.5."""
    score, positive = np.asarray(score, float), np.asarray(positive, bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = _ranks(score)
    rng = np.random.default_rng(0)
    sums = np.array([ranks[rng.permutation(len(ranks))[:n_pos]].sum() for _ in range(draws)])
    a = (sums - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return float(np.quantile(np.maximum(a, 1 - a), quantile))


def label_attack(nu: np.ndarray) -> np.ndarray:
    """ŷ = −sign(ν) (ν = 0 guessed positive)."""
    return np.where(nu <= 0, 1, -1)


def group_scores(nus: np.ndarray) -> np.ndarray:
    """One score per row from the co-movement of |ν_i| across recorded rounds."""
    mag = np.log(np.abs(nus.astype(np.float64)) + 1e-300)
    steps = np.diff(mag, axis=0)  # rounds-1 × rows
    steps -= np.median(steps, axis=1, keepdims=True)  # remove moves all rows share
    steps = steps[np.isfinite(steps).all(axis=1)]
    # First principal component across rows (SVD of the small rounds × rows matrix).
    _, _, vt = np.linalg.svd(steps - steps.mean(axis=1, keepdims=True), full_matrices=False)
    return vt[0]


def passive_attacks(rounds: np.ndarray, nus: np.ndarray, y: np.ndarray, s: np.ndarray, protected_label: int,
                    early: int = 10, seed: int = 0) -> dict:
    """The label and group attacks on one passive party's ν (rounds × rows), scored; the
    averaging attack uses rounds 1..``early``; ``label_attack_best``: the strongest of the
    attackers of tools/attacks.label_attacks (``seed``: its split of the rows)."""
    # The first recorded round is the worst case for the defender: z = 0 and λ = 0 in
    # round 1, so ν_i = −y_i / (2n).
    y_first = label_attack(nus[0])
    y_last = label_attack(nus[-1])
    # Noise is fresh every round while ∂l/∂z moves slowly: averaging the early rounds
    # (λ still small, so every weight is positive) strips zero-mean noise off ν.
    y_avg = label_attack(nus[(rounds >= 1) & (rounds <= early)].mean(axis=0))
    # The attacker restricts the group attack to rows it believes carry the protected label.
    chosen = y_first == protected_label
    score = group_scores(nus)
    truth_rows = chosen & (y == protected_label)
    a = auc(score[truth_rows], s[truth_rows])
    strongest = attacks.label_attacks(rounds, nus, y, seed, early)
    return {
        "rounds_recorded": int(len(rounds)),
        "view": "plaintext",
        "label_attack_acc": float((y_first == y).mean()),
        "label_attack_acc_last": float((y_last == y).mean()),
        "label_attack_acc_avg": float((y_avg == y).mean()),
        "label_attack_acc_signsum": float((label_attack(np.sign(nus).sum(axis=0)) == y).mean()),
        "label_attack_best": strongest["best"], "label_attack_best_by": strongest["best_by"],
        "label_attack_best_round": strongest["best_round"], "label_attackers": strongest["attackers"],
        "label_attack_gap": strongest["best"] - strongest["baseline"],
        "label_baseline_acc": float(max((y == 1).mean(), (y == -1).mean())),
        "group_attack_auc": float(max(a, 1 - a)),
        "group_attack_auc_chance": chance_auc(score[truth_rows], s[truth_rows]),
        "group_rows_scored": int(truth_rows.sum()),
    }


def passive_from_transcript(folder: str | Path, pid: int, y: np.ndarray, s: np.ndarray, protected_label: int,
                            noise: NuNoise | None = None, seed: int = 0) -> dict:
    """The passive attacks on party ``pid``'s transcript; with ``noise``, also the attacker
    that regenerates the seeded ν noise (its seed is the run's, which every party holds)."""
    party = [r for r in transcripts.load(folder, pid) if int(r["round"]) >= 1]
    if not any("nu" in r for r in party):  # encrypted ν: ciphertext only, nothing per row to attack
        nan = float("nan")
        return {"rounds_recorded": len(party), "view": "ciphertext", "label_attack_acc": nan,
                "label_attack_acc_last": nan, "label_attack_acc_avg": nan, "label_attack_best": nan,
                "label_baseline_acc": float(max((y == 1).mean(), (y == -1).mean())),
                "group_attack_auc": nan, "group_rows_scored": 0}
    rounds, nus = transcripts.stack(party, "nu")
    out = passive_attacks(rounds, nus.astype(np.float64), y, s, protected_label, seed=seed)
    if noise is not None:
        clean = nus[0].astype(np.float64) - noise.nu(None, int(rounds[0]), np.zeros(nus.shape[1]))
        out["label_attack_acc_seeded"] = float((label_attack(clean) == y).mean())
    return out


def medians(out: dict, prefix: str, scores: list[dict]) -> None:
    """``out[prefix + "_" + key]``: the median of a per-party score over the passive parties."""
    if scores:
        out[prefix] = scores
        for key in ("rho", "nn10", "rho_chance", "nn10_chance"):
            out[f"{prefix}_{key}"] = float(np.median([t[key] for t in scores]))


def gram_scores(out: dict, prefix: str, grams: list, X: dict, parties: list[int], rows: np.ndarray) -> None:
    """``<prefix>_gram_error(s)``: each party's estimate scored on all of G, and ``..._col`` on the
    column space of its features (tools/attacks.gram_error_col); the median over the parties."""
    for suffix, score in (("", attacks.gram_error), ("_col", attacks.gram_error_col)):
        errors = [score(g, X[k], rows) for g, k in zip(grams, parties)]
        out[f"{prefix}_gram_errors{suffix}"] = errors
        out[f"{prefix}_gram_error{suffix}"] = float(np.median(errors)) if errors else float("nan")


def eval_attack(out: dict, server: list[dict], grams: list, parties: list[int], cfg: RunConfig) -> None:
    """``server_test_gram_error_col``: the test rows' Gram matrix of each passive party from its
    evaluation replies and the server's training-Gram estimate (tools/attacks.eval_gram_attack),
    scored on the column space of its test features; the median over the parties, with the
    number of evaluation replies it had (``server_test_gram_pairs``). Absent when no reply
    carried test logits."""
    if not any(f"u-test-{k}" in r or f"test-dirs-{k}" in r for r in server for k in parties):
        return
    errors, pairs = [], 0
    for g, k in zip(grams, parties):
        train, test = attacks.eval_pairs(server, k)
        x_test = party_data(cfg, party_spec({"partition-id": k}, cfg.num_parties, cfg.num_active)).X_test
        est = attacks.eval_gram_attack(train, test, g)
        errors.append(attacks.gram_error_col(est, np.asarray(x_test, np.float64),
                                             attacks.score_rows(len(x_test), cfg.seed)))
        pairs = train.shape[1]
    if errors:
        out["server_test_gram_errors_col"] = errors
        out["server_test_gram_error_col"] = float(np.median(errors))
        out["server_test_gram_pairs"] = int(pairs)


def role_attacks(folder: str | Path, cfg: RunConfig, ds, coalition_keys: dict[int, bytes] | None = None) -> dict:
    """Every role's attack on its own transcript, scored against the truth (tools/attacks.py).

    ``coalition_keys``: the active party's pair keys under secure aggregation (other party →
    key), which the coalition server + active party holds: it peels them off each passive
    party's masked words and runs the server's attacks on what is left.
    """
    n = len(ds.y_train)
    mu, rows = cfg.mu_value(n), attacks.score_rows(n, cfg.seed)
    X = {k: party_data(cfg, party_spec({"partition-id": k}, cfg.num_parties, cfg.num_active)).X_train
         for k in range(cfg.num_parties)}
    passive = [k for k in range(cfg.num_parties) if not is_active(cfg, k)]
    out: dict = {}
    server = transcripts.load(folder, transcripts.SERVER)
    x_passive = np.concatenate([X[k] for k in passive], axis=1) if passive else None
    if any(key.startswith("dir-") for r in server for key in r):  # optimizer = "newton": the replies are directions
        out["optimizer"] = "newton"
        medians(out, "server_traj", [attacks.newton_trajectory_attack(server, k, X[k], rows, cfg.seed)
                                     for k in passive])
        # the curvature the passive parties used, which the server knows from the run config
        h = ENCRYPTED_NU_CURVATURE if cfg.secure_nu == "ckks" else PASSIVE_CURVATURE
        grams = [attacks.newton_server_gram_attack(server, k, mu, X[k].shape[1], curvature=h) for k in passive]
        gram_scores(out, "server", grams, X, passive, rows)
        eval_attack(out, server, grams, passive, cfg)
        ran = max(int(r["round"]) for r in server)
        # how fast it comes: the same attack on the first rounds only
        out["server_gram_error_by_rounds"] = {
            last: float(np.median([attacks.gram_error(attacks.newton_server_gram_attack(server, k, mu, X[k].shape[1],
                                                                                        last, h), X[k], rows)
                                   for k in passive]))
            for last in range(2, ran, 2)} if passive else {}
        if cfg.num_active == 1 and passive:
            sums = attacks.active_newton_sums(transcripts.load(folder, 0))
            ts = sorted(sums)
            medians(out, "active_traj", [attacks.trajectory_scores(np.stack([sums[t] for t in ts], axis=1),
                                                                   x_passive, rows, cfg.seed)])
            out["active_span_residual"], out["active_span_rank"] = attacks.span_residual(
                np.stack([sums[t] for t in ts], axis=1), x_passive)
            # the coalition holds every passive party's replies: the server's estimates, summed
            out["coalition_gram_error"] = attacks.gram_error(attacks.SumEstimate(grams), x_passive, rows)
            out["coalition_gram_error_col"] = attacks.gram_error_col(attacks.SumEstimate(grams), x_passive, rows)
        return out
    medians(out, "server_traj", [attacks.trajectory_attack(server, k, X[k], rows, cfg.seed) for k in passive])
    if cfg.model == "linear":
        grams = [attacks.server_gram_attack(server, k, cfg.eta, mu, X[k].shape[1]) for k in passive]
        gram_scores(out, "server", grams, X, passive, rows)
        eval_attack(out, server, grams, passive, cfg)
    if coalition_keys is not None:
        heads = {int(r["round"]): r["head"].tobytes() for r in transcripts.load(folder, 0) if "head" in r}
        peeled = {k: attacks.coalition_peeled(server, k, 0, coalition_keys, heads) for k in passive}
        medians(out, "coalition_traj", [attacks.trajectory_attack(peeled[k], k, X[k], rows, cfg.seed)
                                        for k in passive])
        if cfg.model == "linear":
            out["coalition_party_gram_errors"] = [
                attacks.gram_error(attacks.server_gram_attack(peeled[k], k, cfg.eta, mu, X[k].shape[1]), X[k], rows)
                for k in passive]
            out["coalition_party_gram_error"] = float(np.median(out["coalition_party_gram_errors"]))
    if cfg.num_active == 1 and passive:
        active = transcripts.load(folder, 0)
        sums = attacks.active_sums(active)
        ts = sorted(sums)
        medians(out, "active_traj", [attacks.trajectory_scores(np.stack([sums[t] for t in ts], axis=1),
                                                               x_passive, rows, cfg.seed)])
        if cfg.model == "linear":
            out["active_span_residual"], out["active_span_rank"] = attacks.span_residual(
                np.stack([sums[t] for t in ts], axis=1), x_passive)
            constraint = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label,
                                       whole=whole_table(ds.y_train, ds.s_train, ds.y_test, ds.s_test))
            # The noise's secret is the fingerprint of the labels, which the active party
            # holds as well (the server's labels are its labels): it can redraw the noise.
            secret = labels_fingerprint(server_labels_for(cfg, ds))
            noise = NuNoise(cfg.nu_noise, cfg.seed, secret) if cfg.nu_noise > 0 else None
            add = None if noise is None else (lambda t, v: noise.nu(None, t, v))
            est = attacks.active_gram_attack(active, ds.y_train.astype(np.float64), constraint, cfg.eta, mu, add,
                                             cfg.wire_dtype, x_passive.shape[1])
            out["active_gram_error"] = attacks.gram_error(est, x_passive, rows)
            out["active_gram_error_col"] = attacks.gram_error_col(est, x_passive, rows)
            both = attacks.coalition_gram_attack(server, active, cfg.eta, mu, x_passive.shape[1])
            out["coalition_gram_error"] = attacks.gram_error(both, x_passive, rows)
            out["coalition_gram_error_col"] = attacks.gram_error_col(both, x_passive, rows)
    return out


def active_pair_keys(grid: InProcessGrid, active: int = 0) -> dict[int, bytes] | None:
    """The pair keys the active party's node holds after a run under secure aggregation (None without it)."""
    record = grid.contexts[grid.node_ids[active]].state.array_records.get(agreement.KEYS_STATE)
    if record is None:
        return None
    return {int(k.split("-", 1)[1]): to_numpy(record[k]).tobytes() for k in record if k.startswith("k-")}


def run_audit(dataset: str, rounds: int, noise: float, seed: int = 0, overrides: dict | None = None) -> dict:
    """Train with transcripts on, then attack what each role received."""
    with tempfile.TemporaryDirectory() as tmp:
        changes = {  # the attacks model the paper's gradient steps
            "preset": "paper", "dataset": dataset, "num-server-rounds": rounds, "eval-every": rounds, "seed": seed,
            # every round: the accumulating attackers and the server's tracking need them all
            "privacy.transcript-dir": str(Path(tmp) / "transcripts"), "privacy.record-every": 10,
            "privacy.record-first": rounds, "privacy.nu-noise": noise,
            "output-dir": str(Path(tmp) / "runs"), **(overrides or {}),
        }
        cfg = RunConfig.from_flower({**RunConfig().to_flower(), **changes})
        grid = InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties)
        summary, _ = run_inprocess(cfg.to_flower(), quiet=True, grid=grid)
        ds = load_data(cfg)
        regen = NuNoise(cfg.nu_noise, cfg.seed) if cfg.nu_noise > 0 else None
        result = passive_from_transcript(cfg.transcript_dir, cfg.num_active, ds.y_train, ds.s_train,
                                         ds.protected_label, regen, cfg.seed)
        keys = active_pair_keys(grid) if cfg.masked and cfg.num_active == 1 else None
        result.update(role_attacks(cfg.transcript_dir, cfg, ds, keys))
    dp = summary.get("label_dp") or {}
    return {"dataset": dataset, "nu_noise": noise, "secure_nu": cfg.secure_nu,
            "label_dp_epsilon": dp.get("epsilon"), "label_dp_delta": dp.get("delta"),
            "label_dp_lambda_bound": dp.get("lambda_bound"), "label_dp_noise_std": dp.get("noise_std"),
            "secure_aggregation": cfg.masked, "model": cfg.model, "rounds": rounds,
            "rounds_run": summary["rounds"], "optimizer": cfg.optimizer_in_use,
            "num_parties": cfg.num_parties, "n_train": int(len(ds.y_train)),
            "test_acc": summary["test_acc"], "test_dfp": summary["test_dfp"], "test_dfn": summary["test_dfn"],
            "train_max_gap": summary["train_max_gap"], **result}


def table(rows: list[dict]) -> str:
    lines = [
        "| dataset | defence | label attack acc (round 1) | (last round) | (mean of rounds 1-10) | (noise redrawn from the seed) "
        "| strongest label attacker, held-out rows (which, last round used) "
        "| majority baseline | group attack AUC (guess: 0.5; chance's 95th percentile on these rows) | server: Gram error (guess: 1.0) "
        "| server: Gram error on the column space (guess: 1.0) | server: test rows' Gram error from evaluation replies, column space (replies) "
        "| active: Gram error of the passive sum "
        "| server + active: Gram error of the passive sum | server: distance rank corr. from logit trajectories (shuffled) "
        "| active: distance rank corr. of the passive sum's trajectories (shuffled) "
        "| server + active, secure aggregation: a passive party's Gram error after peeling the active party's masks "
        "| active: passive columns outside the span of S(t), rel. (guess: 1.0; span dim.) "
        "| test ACC % | DFP | DFN | train max gap |",
        "|" + "---|" * 22,
    ]

    def f(v) -> str:  # nan: nothing to attack (ciphertext only) or the attack does not apply (MLP)
        if v is None:
            return "–"
        return "n/a" if v != v else (f"{v:.3f}" if v < 100 else f"{v:.3g}")

    def span(r: dict) -> str:
        v = r.get("active_span_residual")
        return "–" if v is None else f"{v:.2g} ({r['active_span_rank']})"

    def chance(r: dict, ct: bool) -> str:
        v = r.get("group_attack_auc_chance")
        return "" if ct or v is None or v != v else f" ({v:.3f})"

    def best(r: dict) -> str:
        v = r.get("label_attack_best")
        if v is None or v != v:
            return f(v)
        return f"**{v:.3f}** ({r['label_attack_best_by']}, {r['label_attack_best_round']})"

    def test_gram(r: dict) -> str:
        v = r.get("server_test_gram_error_col")
        return "–" if v is None else f"{f(v)} ({r['server_test_gram_pairs']})"

    for r in rows:
        ct = r.get("view") == "ciphertext"  # the passive transcript holds no per-row plaintext

        def p(v, ct=ct) -> str:
            return "n/a (ciphertext)" if ct else f(v)

        defence = [f"nu-noise={r['nu_noise']:g}"] if r["nu_noise"] else []
        defence += ["secure-nu=ckks"] if r.get("secure_nu") == "ckks" else []
        defence += ["secure-aggregation"] if r.get("secure_aggregation") else []
        defence += [f"optimizer={NEWTON.name} ({r['rounds_run']} rounds)"] if r.get("optimizer") == NEWTON.name else []
        if r.get("label_dp_epsilon") is not None:
            defence += [f"label DP (ε={r['label_dp_epsilon']:.3g}, δ={r['label_dp_delta']:g}, "
                        f"λ ≤ {r['label_dp_lambda_bound']:g})"]
        lines.append(
            f"| {r['dataset']}{'' if r.get('num_parties', 6) == 6 else ', num-parties=' + str(r['num_parties'])} | "
            f"{', '.join(defence) or 'none'} | {p(r['label_attack_acc'])} | "
            f"{p(r['label_attack_acc_last'])} | {p(r['label_attack_acc_avg'])} | {f(r.get('label_attack_acc_seeded'))} | "
            f"{best(r)} | "
            f"{r['label_baseline_acc']:.3f} | {p(r['group_attack_auc'])}{chance(r, ct)} | {f(r.get('server_gram_error'))} | "
            f"{f(r.get('server_gram_error_col'))} | {test_gram(r)} | "
            f"{f(r.get('active_gram_error'))} | {f(r.get('coalition_gram_error'))} | "
            f"{f(r.get('server_traj_rho'))} ({f(r.get('server_traj_rho_chance'))}) | "
            f"{f(r.get('active_traj_rho'))} ({f(r.get('active_traj_rho_chance'))}) | {f(r.get('coalition_party_gram_error'))} | "
            f"{span(r)} | "
            f"{100 * r['test_acc']:.2f} | {r['test_dfp']:.3f} | "
            f"{r['test_dfn']:.3f} | {r['train_max_gap']:.4f} |"
        )
    return "\n".join(lines) + "\n"


#: What :func:`spread` summarises over repeated runs: (key, column label).
SPREAD = (("label_attack_best", "labels, strongest attacker"), ("label_attack_gap", "strongest − majority"),
          ("label_attack_acc", "labels, round 1"), ("label_attack_acc_avg", "labels, mean of rounds 1-10"),
          ("label_attack_acc_last", "labels, last round"), ("group_attack_auc", "groups AUC"),
          ("group_attack_auc_chance", "groups AUC by chance (95th pct.)"), ("test_acc", "test ACC"),
          ("train_max_gap", "train max gap"))


def spread(rows: list[dict], repeats: int) -> str:
    """Mean and extremes of each attack over the repeats of one (dataset, defence)."""
    if repeats < 2:
        return ""
    out = [f"\nOver {repeats} runs each: mean [min, max]\n", "| dataset | noise | " + " | ".join(t for _, t in SPREAD) + " |",
           "|" + "---|" * (2 + len(SPREAD))]
    for i in range(0, len(rows) - repeats + 1, repeats):
        group = rows[i:i + repeats]
        cells = []
        for key, _ in SPREAD:
            v = np.array([r.get(key, np.nan) for r in group], dtype=float)
            scale = 100.0 if key == "test_acc" else 1.0
            cells.append(f"{scale * v.mean():.4g} [{scale * v.min():.4g}, {scale * v.max():.4g}]")
        out.append(f"| {group[0]['dataset']} | {group[0]['nu_noise']:g} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


NOTES = """Every role's attacks on its own transcript of a real in-process run (the module docstring of
`fairvfl_flwr/tools/audit.py` defines each). The strongest label attacker is the best of
`tools/attacks.label_attacks` (one round, the mean of rounds 1-10, sign sums and scaled sums up to a
chosen round, a logistic regression on every round's ν), each fitted on half the rows with their labels
and scored on the other half, then the halves swapped: a score over all rows that no rule saw while
fitted, next to the majority class. Gram errors: relative Frobenius error on 200 seeded rows (guessing 0
scores 1.0); "column space": after projecting the estimate onto the column space of the party's features.
"""


def malicious_audit(a: argparse.Namespace) -> None:
    """The malicious server's roles for each dataset, as a table (audit.md) and audit.json."""
    a.out.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.perf_counter()
    lines = ["| dataset | malicious server | what it got |", "|---|---|---|"]
    for dataset in [d.strip() for d in a.datasets.split(",") if d.strip()]:
        with tempfile.TemporaryDirectory() as tmp:
            for r in malicious.roles(dataset, a.rounds, Path(tmp)):
                rows.append({"dataset": dataset, **r})
                lines.append(f"| {dataset} | {r['role']} | {r['result']} |")
                print(lines[-1], flush=True)
    (a.out / "audit.json").write_text(json.dumps(rows, indent=1) + "\n")
    (a.out / "audit.md").write_text("\n".join(lines) + "\n")
    if a.results is not None:
        name = a.out.name if a.out.name.startswith("audit") else f"audit-{a.out.name}"
        page = publish(name, this_command(), {"wall_seconds": time.perf_counter() - t0, "runs": rows},
                       "\n".join(lines), title=f"Malicious-server audit: {a.out.name}", notes="", out=a.results)
        print(f"published {page}")
    print(f"{len(rows)} roles in {time.perf_counter() - t0:.0f} s; results in {a.out.resolve()}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="fairvfl-audit",
                                description="Leakage audit of every role's transcript (see module docstring).")
    p.add_argument("--datasets", default="adult,compas,crime", help="comma list of datasets to audit")
    p.add_argument("--rounds", type=int, default=300, help="num-server-rounds of each audited run")
    p.add_argument("--noise", default="0", help="comma list of nu-noise levels (units of 1/n)")
    p.add_argument("--seed", type=int, default=0, help="the runs' seed")
    p.add_argument("--secure-nu", default="none", choices=["none", "ckks"], help="audit under encrypted ν (linear)")
    p.add_argument("--secure-aggregation", action="store_true", help="audit with masked partial logits")
    p.add_argument("--optimizer", choices=["gd", "newton", "auto"], default=None,
                   help="train with this optimizer (the run config's default otherwise); a Newton transcript is "
                        "attacked through its directions")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other run-config key in flwr run's --run-config syntax, e.g. --set num-parties=2 "
                        "--set \"model='mlp'\" (repeatable)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run each audit this many times: label DP draws fresh noise every run (a new server "
                        "secret), so one run is one draw; the table then ends with each attack's mean [min, max]")
    p.add_argument("--out", type=Path, default=Path("results/audit"), help="folder for audit.json and audit.md")
    p.add_argument("--results", type=Path, default=None, metavar="DIR",
                   help="also publish the table as DIR/<out folder's name>.md and .json (audit- put in front when the name "
                        "lacks it) with this command "
                        "(docs/results refreshes the docs' page)")
    p.add_argument("--malicious", action="store_true",
                   help="play a malicious server instead (tools/malicious.py): different ν per party, a consistent "
                        "crafted ν, a re-sent round with changed ν, one party stepped away from the others across "
                        "sessions (a rejoin, a restart, a rejoin between a round and its re-send; gradient descent and "
                        "block Newton), forged demo keys, an unmasked run against deployed nodes and a dictionary "
                        "test at alignment; each role reports 'refused' or the figure it learned")
    a = p.parse_args(argv)
    if a.malicious:
        malicious_audit(a)
        return
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    try:
        extra = parse_run_config(a.set)
    except RunConfigArgError as exc:
        p.error(str(exc))
    if a.optimizer is not None:
        extra.setdefault("optimizer", a.optimizer)
    a.out.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.perf_counter()
    for dataset in [d.strip() for d in a.datasets.split(",") if d.strip()]:
        for noise, _ in itertools.product([float(x) for x in a.noise.split(",")], range(a.repeats)):
            r = run_audit(dataset, a.rounds, noise, a.seed, {"privacy.secure-nu": a.secure_nu,
                                                            "privacy.secure-aggregation": a.secure_aggregation,
                                                            **extra})
            rows.append(r)
            print(f"{dataset} privacy.nu-noise={noise:g} privacy.secure-nu={a.secure_nu} "
                  f"privacy.secure-aggregation={a.secure_aggregation}: labels {r['label_attack_acc']:.3f}, strongest "
                  f"{r.get('label_attack_best', float('nan')):.3f} ({r.get('label_attack_best_by')}, round "
                  f"{r.get('label_attack_best_round')}) "
                  f"(baseline {r['label_baseline_acc']:.3f}), groups AUC {r['group_attack_auc']:.3f} "
                  f"(chance ≤ {r.get('group_attack_auc_chance', float('nan')):.3f}), "
                  f"server Gram error {r.get('server_gram_error', float('nan')):.3g}, "
                  f"active Gram error {r.get('active_gram_error', float('nan')):.3g}, "
                  f"coalition Gram error {r.get('coalition_gram_error', float('nan')):.3g}, "
                  f"trajectory rank corr. {r.get('server_traj_rho', float('nan')):.3f}, active trajectory rank corr. "
                  f"{r.get('active_traj_rho', float('nan')):.3f}, coalition peeled Gram error "
                  f"{r.get('coalition_party_gram_error', float('nan')):.3g}, {r['optimizer']} {r['rounds_run']} rounds, "
                  f"test ACC {100 * r['test_acc']:.2f}% "
                  f"[{time.perf_counter() - t0:.0f} s]", flush=True)
            (a.out / "audit.json").write_text(json.dumps(rows, indent=1) + "\n")
            (a.out / "audit.md").write_text(table(rows) + spread(rows, a.repeats))
    print(table(rows) + spread(rows, a.repeats))
    for r in rows:
        if r.get("server_gram_error_by_rounds"):
            print(f"{r['dataset']}: the server's Newton Gram error (median over the passive parties) from the first "
                  "rounds only: " + ", ".join(f"{t}: {e:.3g}" for t, e in r["server_gram_error_by_rounds"].items()))
    wall = time.perf_counter() - t0
    if a.results is not None:
        name = a.out.name if a.out.name.startswith("audit") else f"audit-{a.out.name}"
        page = publish(name, this_command(), {"wall_seconds": wall, "runs": rows},
                       table(rows) + spread(rows, a.repeats), title=f"Leakage audit: {a.out.name}",
                       notes=NOTES, out=a.results)
        print(f"published {page}")
    print(f"{len(rows)} audits in {wall:.0f} s; results in {a.out.resolve()}")


if __name__ == "__main__":
    main()
