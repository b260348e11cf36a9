"""Attacks on the transcripts of every role (features/transcripts.py), scored against the truth.

Each attack uses only what its role receives and holds; the truth (features, labels,
groups) is used for scoring only. docs/privacy.md ("Threat table") has the numbers.

**Gram matrix from logits** (the server, and the active party on z). For a linear party
without intercept, one step is θ ← (1 − μ/η) θ − (1/η) X_kᵀν, so

    r(t) = η [(1 − μ/η) u_k(t−1) − u_k(t)] = X_k X_kᵀ ν(t)

for every pair of consecutive recorded rounds. The r(t) span (part of) the column space
of X_k: with U an orthonormal basis of the r(t) (SVD, rank from the noise floor) and
G = U M Uᵀ, M solves Uᵀ r(t) = M Uᵀ ν(t) by least squares. The estimate Ĝ gives every
inner product and distance between two people in that party's feature space, i.e. its
features up to a rotation. Scored by ‖Ĝ − G‖_F / ‖G‖_F on a seeded sample of rows
(1.0: no better than guessing 0). Directions of X_k that ν never excites are not
recovered; the score counts them as errors. For an MLP, u_k is not linear in the
features and this attack does not apply (the server still sees u_k per round).
The active party runs the same algebra on the passive parties' sum, z − u_active, with
ν(t) computed from its own y, s, the λ it receives and z: it recovers Σ_passive X_k X_kᵀ
(with one passive party, that party's Gram matrix).

**Scoring on the column space** (:func:`gram_error_col`). A block whose columns are linearly
dependent (centred one-hot columns sum to zero) has G = X_k X_kᵀ of rank below its number of
columns, and an estimate fitted with that many directions can carry a spurious one outside
col(X_k), with any eigenvalue: the plain score then calls an estimate useless that gives every
inner product of the features exactly. The column-space score is ‖P(Ĝ − G)P‖_F / ‖G‖_F with
P the orthogonal projection onto col(X_k) (G = PGP): the error of the inner products
⟨x_i, x_j⟩ the estimate gives along the directions the features have. It is what the
attacker can read, since it holds P too: the logits it collects span col(X_k) (the
column-space attack, :func:`span_residual`). 0: exact; guessing 0 scores 1.0, and an
estimate unrelated to X_k scores ≥ about 1.

**The test rows' Gram matrix from evaluation replies** (:func:`eval_gram_attack`). An
evaluation reply carries the same parameters applied to the training and the test rows
(gradient descent: u = X_k θ and u_test = X_test,k θ; Newton: X_k s and X_test,k s). With A =
X_k W and B = X_test,k W over the evaluation rounds and the server's estimate Ĝ of X_k X_kᵀ,
AᵀĜ⁺A = WᵀW, so B (AᵀĜ⁺A)⁺ Bᵀ = X_test,k X_test,kᵀ once W spans the features.

**Labels from ν** (:func:`label_attacks`, the passive party). The best of several attackers:
one round's sign, the mean of rounds 1–10, the sum of the signs or of the scaled ν up to a
round it chooses, and a logistic regression on every round's ν. Those that need labels to
choose a round, a threshold or weights get half the rows' labels (an attacker with some
labelled people) and are scored on the other half, then the halves swap; the score is
over all rows, next to the majority class, which an attacker can always reach.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairvfl_flwr.core.constraints import ConstraintSet
from fairvfl_flwr.core.newton import party_curvature
from fairvfl_flwr.secure.view import bound_key
from fairvfl_flwr.secure.ring import decode, mask

#: Singular values kept, relative to the largest: below it is the float32 wire's rounding (6e-8
#: relative per value), not a direction (the Newton equations' R, the column-space attack).
NEWTON_RTOL = 1e-5
#: Rows the Gram matrices are scored on (a seeded sample: the full n × n matrix is 13 GB on Adult).
SCORE_ROWS = 200


@dataclass
class GramEstimate:
    basis: np.ndarray  # n × r, orthonormal
    core: np.ndarray  # r × r, symmetric: Ĝ = basis · core · basisᵀ
    pairs: int  # consecutive round pairs used

    def rows(self, rows: np.ndarray) -> np.ndarray:
        b = self.basis[rows]
        return b @ self.core @ b.T


def as_logits(words: np.ndarray) -> np.ndarray:
    """A reply as the server reads it: floats, or masked words decoded as fixed point."""
    return decode(words) if words.dtype == np.uint64 else words.astype(np.float64)


def gram_attack(u: dict[int, np.ndarray], nu: dict[int, np.ndarray], eta: float, mu: float,
                max_rank: int | None = None) -> GramEstimate:
    """Ĝ = X_k X_kᵀ from logits u[t] (after round t) and the ν[t] each round t sent."""
    ts = sorted(t for t in nu if t in u and t - 1 in u)
    if len(ts) < 2:
        raise ValueError(f"the Gram attack needs consecutive recorded rounds; got {len(ts)} pairs")
    keep = 1.0 - mu / eta
    R = np.stack([eta * (keep * u[t - 1] - u[t]) for t in ts], axis=1)
    V = np.stack([nu[t] for t in ts], axis=1)
    return fit_gram(R, V, max_rank)


def fit_gram(R: np.ndarray, V: np.ndarray, max_rank: int | None = None) -> GramEstimate:
    """Ĝ with Ĝ V ≈ R (columns: one equation G v = r each), on the column space of R."""
    basis, s, _ = np.linalg.svd(R, full_matrices=False)
    if not np.all(np.isfinite(s)) or s[0] == 0:
        return GramEstimate(np.zeros((R.shape[0], 0)), np.zeros((0, 0)), R.shape[1])
    # Rank: singular values clear of the noise floor (the wire dtype's rounding of u).
    rank = int((s > 5 * np.median(s)).sum()) if len(s) > 4 else len(s)
    rank = max(1, min(rank, max_rank or rank, R.shape[1] - 1))
    basis = basis[:, :rank]
    core = (basis.T @ R) @ np.linalg.pinv(basis.T @ V)
    return GramEstimate(basis, (core + core.T) / 2, R.shape[1])


def score_rows(n: int, seed: int = 0, size: int = SCORE_ROWS) -> np.ndarray:
    return np.sort(np.random.default_rng([seed, 0x6772]).choice(n, size=min(size, n), replace=False))


def gram_error(estimate: GramEstimate, X: np.ndarray, rows: np.ndarray) -> float:
    """‖Ĝ − G‖_F / ‖G‖_F on ``rows`` × ``rows``, G = X Xᵀ."""
    truth = X[rows] @ X[rows].T
    with np.errstate(over="ignore", invalid="ignore"):
        err = float(np.linalg.norm(estimate.rows(rows) - truth) / np.linalg.norm(truth))
    return err if np.isfinite(err) else float("inf")


def column_basis(X: np.ndarray) -> np.ndarray:
    """An orthonormal basis of the column space of X (rank from float64 rounding)."""
    U, sv, _ = np.linalg.svd(np.asarray(X, np.float64), full_matrices=False)
    return U[:, sv > max(X.shape) * np.finfo(np.float64).eps * (sv[0] if len(sv) else 0.0)]


def gram_error_col(estimate, X: np.ndarray, rows: np.ndarray) -> float:
    """‖P(Ĝ − G)P‖_F / ‖G‖_F on ``rows`` × ``rows``, P the projection onto the column space of X
    (G = X Xᵀ = PGP): the error of the inner products Ĝ gives along the directions the party's
    features have. See the module docstring ("Scoring on the column space")."""
    Q = column_basis(X)
    PG = project_rows(estimate, Q, rows)
    truth = X[rows] @ X[rows].T
    with np.errstate(over="ignore", invalid="ignore"):
        err = float(np.linalg.norm(PG - truth) / np.linalg.norm(truth))
    return err if np.isfinite(err) else float("inf")


def project_rows(estimate, Q: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(QQᵀ Ĝ QQᵀ) on ``rows`` × ``rows``, for Ĝ = basis · core · basisᵀ (or a sum of such)."""
    if isinstance(estimate, SumEstimate):
        return sum(project_rows(p, Q, rows) for p in estimate.parts)
    inner = Q.T @ estimate.basis  # r_X × r
    return Q[rows] @ (inner @ estimate.core @ inner.T) @ Q[rows].T


def server_gram_attack(server_rounds: list[dict], pid: int, eta: float, mu: float,
                       max_rank: int | None = None) -> GramEstimate:
    """The server on one party: the logits it received and the ν it sent."""
    u = {int(r["round"]): as_logits(r[f"u-{pid}"]) for r in server_rounds if f"u-{pid}" in r}
    nu = {int(r["round"]): r["nu"].astype(np.float64) for r in server_rounds if "nu" in r}
    return gram_attack(u, nu, eta, mu, max_rank)


def active_nu(z: np.ndarray, lam: np.ndarray, y: np.ndarray, constraint: ConstraintSet, wire_dtype: str = "float32") -> np.ndarray:
    """ν as the server computed it, from what the active party holds (y, s) and receives (z, λ)."""
    return constraint.masked_weights(y, z.astype(np.float64), lam.astype(np.float64)).astype(wire_dtype).astype(np.float64)


def active_sums(active_rounds: list[dict]) -> dict[int, np.ndarray]:
    """The passive parties' summed logits after round t, S(t) = z(t + 1) − own u(t) (gradient descent)."""
    by_round = {int(r["round"]): r for r in active_rounds}
    return {t - 1: by_round[t]["z"].astype(np.float64) - by_round[t - 1]["own-u"].astype(np.float64)
            for t in by_round if "z" in by_round[t] and t - 1 in by_round and "own-u" in by_round[t - 1]}


def active_gram_attack(active_rounds: list[dict], y: np.ndarray, constraint: ConstraintSet, eta: float, mu: float,
                       noise=None, wire_dtype: str = "float32", max_rank: int | None = None) -> GramEstimate:
    """The active party on the passive parties' sum S = z − u_active.

    S(t) (after round t) = z(t + 1) − own u(t); ν(t) from z(t), λ(t). ``noise(t, ν)``:
    what the active party can add to match the ν passive parties got (e.g. the seeded
    ν noise, whose seed is in the run config every party holds).
    """
    by_round = {int(r["round"]): r for r in active_rounds}
    passive_sum = active_sums(active_rounds)
    nu = {}
    for t, r in by_round.items():
        if "z" in r:
            v = active_nu(r["z"], r["lam"], y, constraint, wire_dtype)
            nu[t] = v if noise is None else noise(t, v).astype(wire_dtype).astype(np.float64)
    return gram_attack(passive_sum, nu, eta, mu, max_rank)


# -- the coalition server + active party ---------------------------------------------------------
def coalition_gram_attack(server_rounds: list[dict], active_rounds: list[dict], eta: float, mu: float,
                          max_rank: int | None = None) -> GramEstimate:
    """Server and active party together on the passive parties' sum S = z − u_active.

    The server holds z (the sum it decoded, as sent to the active party) and ν exactly as
    sent, noise included (it drew the noise); the active party holds its own logits. So
    S(t) = z(t + 1) − own u(t) with the true ν(t): the active party's attack without having
    to recompute or redraw ν. Secure aggregation leaves it whole (z and the active party's
    own logits are not masked from the coalition); with one passive party S is that party's
    logits, so the coalition gets that party's Gram matrix.
    """
    server = {int(r["round"]): r for r in server_rounds}
    own = {int(r["round"]): r["own-u"].astype(np.float64) for r in active_rounds if "own-u" in r}
    passive_sum = {t - 1: server[t]["z"].astype(np.float64) - own[t - 1]
                   for t in server if "z" in server[t] and t - 1 in own}
    nu = {t: r["nu"].astype(np.float64) for t, r in server.items() if "nu" in r}
    return gram_attack(passive_sum, nu, eta, mu, max_rank)


# -- what the server learns from any party's logits (linear or MLP) -----------------------------
def ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    out = np.empty(len(x))
    out[order] = np.arange(len(x))
    return out


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float(ra @ rb / np.sqrt((ra @ ra) * (rb @ rb)))


def pair_distances(V: np.ndarray) -> np.ndarray:
    """Euclidean distances of every pair of rows of V (upper triangle, flattened)."""
    sq = (V * V).sum(axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * V @ V.T, 0.0)
    return np.sqrt(d2[np.triu_indices(len(V), k=1)])


def trajectory_attack(server_rounds: list[dict], pid: int, X: np.ndarray, rows: np.ndarray, seed: int = 0) -> dict:
    """The server on any party's model, linear or MLP: u_k(t) = f_k(X_k; θ_k(t)) for every row
    and round, and f_k(·; θ) is continuous, so two people close in that party's feature space
    have close logit trajectories. The attacker's distances are between the rows' centred
    trajectories (rows × recorded rounds); scored as the Spearman rank correlation with
    the true distances in X_k over the pairs of ``rows``, and the share of rows whose
    nearest neighbour by trajectory is among their 10 nearest in X_k (chance: 10/(rows−1)).
    The chance line: the same scores with the rows' trajectories shuffled.
    """
    traj = np.stack([as_logits(r[f"u-{pid}"]) for r in sorted(server_rounds, key=lambda r: int(r["round"]))
                     if f"u-{pid}" in r], axis=1)
    return trajectory_scores(traj, X, rows, seed)


def trajectory_scores(traj: np.ndarray, X: np.ndarray, rows: np.ndarray, seed: int = 0) -> dict:
    """The trajectory attack's scores for logit trajectories ``traj`` (all rows × rounds)."""
    traj = traj[rows]
    traj = traj - traj.mean(axis=0, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        traj = traj / max(float(np.abs(traj).max()), 1e-300)  # the scale is irrelevant to ranks; keeps squares finite
    truth = X[rows].astype(np.float64)
    d_true = pair_distances(truth)

    def score(t: np.ndarray) -> tuple[float, float]:
        d_att = pair_distances(t)
        k = len(rows)
        D_att, D_true = np.zeros((k, k)), np.zeros((k, k))
        iu = np.triu_indices(k, 1)
        D_att[iu], D_true[iu] = d_att, d_true
        D_att, D_true = D_att + D_att.T, D_true + D_true.T
        np.fill_diagonal(D_att, np.inf)
        np.fill_diagonal(D_true, np.inf)
        nearest = D_att.argmin(axis=1)
        true_10 = np.argsort(D_true, axis=1)[:, :10]
        hit = float(np.mean([nearest[i] in true_10[i] for i in range(k)]))
        return spearman(d_att, d_true), hit

    rho, hit = score(traj)
    shuffled = traj[np.random.default_rng([seed, 0x7368]).permutation(len(rows))]
    rho0, hit0 = score(shuffled)
    return {"rho": rho, "nn10": hit, "rho_chance": rho0, "nn10_chance": hit0, "rounds": int(traj.shape[1])}


# -- optimizer = "newton": what the directions give away -----------------------------------------
def span_residual(traj: np.ndarray, X: np.ndarray, rel_tol: float = NEWTON_RTOL) -> tuple[float, int]:
    """The column-space attack: a linear party's logits X θ(t) lie in the span of its columns
    for every θ, so the logit vectors an attacker collects over the rounds (``traj``: rows ×
    rounds) span part of col(X), whatever the training method. Returns ‖(I − QQᵀ)X‖_F / ‖X‖_F
    for Q an orthonormal basis of that span (directions above ``rel_tol`` of the largest
    singular value: below it is the wire's rounding), and the span's dimension. 0: the
    attacker holds X up to an unknown invertible m × m map (rows with the same features have
    the same coordinates); a random span of r ≪ n dimensions leaves ≈ √(1 − r/n) ≈ 1.
    """
    traj = np.asarray(traj, dtype=np.float64)
    U, sv, _ = np.linalg.svd(traj, full_matrices=False)
    if not len(sv) or sv[0] == 0:
        return 1.0, 0
    Q = U[:, sv > rel_tol * sv[0]]
    X = np.asarray(X, dtype=np.float64)
    outside = X - Q @ (Q.T @ X)
    return float(np.linalg.norm(outside) / np.linalg.norm(X)), int(Q.shape[1])


def newton_track(u0: np.ndarray, dirs: dict[int, np.ndarray], alphas: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """A party's logits X_k θ_k(t) when it computes round t's direction, for t = 1, 2, ...

    What the server does itself (algorithms/newton.py): round t's directions are [X_k s_k(t),
    the party's last moves], and the move is those columns times the α_k it computed;
    stops at the first round missing from ``dirs`` or ``alphas``.
    """
    u, moves, out = np.asarray(u0, np.float64), [], {}
    t = 1
    while t in dirs and t in alphas:
        out[t] = u
        al = np.asarray(alphas[t], np.float64)
        move = np.column_stack([dirs[t].astype(np.float64), *moves])[:, :len(al)] @ al
        u, moves, t = u + move, [move, *moves], t + 1
    return out


def newton_gram_attack(dirs: dict[int, np.ndarray], u: dict[int, np.ndarray], nu: dict[int, np.ndarray],
                       mu: float, max_rank: int | None = None, curvature: str = "nu") -> GramEstimate:
    """Ĝ = X_k X_kᵀ of a linear passive party from its Newton replies.

    The party's direction solves (X_kᵀHX_k + μI) s = −(X_kᵀν + μθ_k) with H = diag(h̃),
    h̃ = |ν|(1 − n|ν|) from ν alone (core/newton.party_curvature), so with v = X_k s (its
    reply) and u = X_k θ_k (which the server tracks):

        X_k X_kᵀ (h̃ ⊙ v + ν) = −μ (v + u),

    one exact equation G w = r per round, every term known to the server (it sent ν). The
    r span the column space of X_k one round at a time, so a party with m columns is rebuilt
    after about m rounds; before that, :func:`nystrom_gram` gives the part of G the rounds
    have reached (on random parties it beats :func:`fit_gram` there, and is exact a round earlier).
    ``curvature``: the h̃ the party used, ``"nu"`` or, under encrypted ν, ``"const"``
    (1/(4n)): the server knows which, and the equation is as exact with either.
    """
    ts = sorted(t for t in dirs if t in u and t in nu)
    if len(ts) < 2:
        raise ValueError(f"the Newton Gram attack needs two recorded rounds; got {len(ts)}")
    n = len(nu[ts[0]])
    W = np.stack([party_curvature(nu[t], n, curvature) * dirs[t] + nu[t] for t in ts], axis=1)
    R = np.stack([-mu * (dirs[t] + u[t]) for t in ts], axis=1)
    return nystrom_gram(R, W, max_rank)


def nystrom_gram(R: np.ndarray, W: np.ndarray, max_rank: int | None = None) -> GramEstimate:
    """Ĝ = R (WᵀR)⁺ Rᵀ from exact equations G W = R (G positive semi-definite): the Nyström
    approximation of G on the columns W, which is G itself once GW has G's rank.

    Every column is a new direction of X_k until the rounds cover its columns, so the rank
    is set by the wire's rounding (float32: 6e-8 relative), not by a median of the columns.
    """
    basis, s, _ = np.linalg.svd(R, full_matrices=False)
    if not np.all(np.isfinite(s)) or s[0] == 0:
        return GramEstimate(np.zeros((R.shape[0], 0)), np.zeros((0, 0)), R.shape[1])
    rank = max(1, min(int((s > NEWTON_RTOL * s[0]).sum()), max_rank or len(s)))
    basis = basis[:, :rank]
    inner = W.T @ R  # = WᵀGW: symmetric PSD up to rounding, of GW's rank (R's)
    vals, vecs = np.linalg.eigh((inner + inner.T) / 2)
    keep = np.argsort(vals)[::-1][:rank]
    keep = keep[vals[keep] > 0]
    pinv = (vecs[:, keep] / vals[keep]) @ vecs[:, keep].T
    core = (basis.T @ R) @ pinv @ (basis.T @ R).T
    return GramEstimate(basis, (core + core.T) / 2, R.shape[1])


def newton_server_rounds(server_rounds: list[dict], pid: int) -> tuple[dict, dict, dict]:
    """(X_k s_k per round, the tracked X_k θ_k per round, ν per round) of party ``pid``, as the server holds them."""
    by_round = {int(r["round"]): r for r in server_rounds}
    dirs = {t: as_logits(r[f"dir-{pid}"]) for t, r in by_round.items() if f"dir-{pid}" in r}
    alphas = {t: r[f"alpha-{pid}"] for t, r in by_round.items() if f"alpha-{pid}" in r}
    u = newton_track(as_logits(by_round[0][f"u-{pid}"]), dirs, alphas)
    nu = {t: r["nu"].astype(np.float64) for t, r in by_round.items() if "nu" in r}
    return dirs, u, nu


def newton_server_gram_attack(server_rounds: list[dict], pid: int, mu: float,
                              max_rank: int | None = None, last: int | None = None,
                              curvature: str = "nu") -> GramEstimate:
    """The server on one party under Newton: its replies, the α it computed and the ν it sent
    (``last``: the rounds up to that one only, as if training had stopped there)."""
    dirs, u, nu = newton_server_rounds(server_rounds, pid)
    if last is not None:
        dirs = {t: v for t, v in dirs.items() if t <= last}
    return newton_gram_attack(dirs, u, nu, mu, max_rank, curvature)


def newton_trajectory_attack(server_rounds: list[dict], pid: int, X: np.ndarray, rows: np.ndarray,
                             seed: int = 0) -> dict:
    """The trajectory attack on the logits the server tracks under Newton, with the replies X_k s_k."""
    dirs, u, _ = newton_server_rounds(server_rounds, pid)
    ts = sorted(u)
    return trajectory_scores(np.stack([u[t] for t in ts] + [dirs[t] for t in ts], axis=1), X, rows, seed)


def active_newton_sums(active_rounds: list[dict]) -> dict[int, np.ndarray]:
    """The passive parties' summed logits S(t) = z(t) − own u(t) as the active party holds them
    under Newton: its own logits tracked from its first logits, its own X_k s_k and the α it
    receives one round later (the last round's with ``train.newton_apply``)."""
    by_round = {int(r["round"]): r for r in active_rounds}
    dirs = {t: r["own-dir"].astype(np.float64) for t, r in by_round.items() if "own-dir" in r}
    alphas = {t - 1: r["alpha"] for t, r in by_round.items() if "alpha" in r and len(r["alpha"])}
    alphas.update({t: r["alpha-last"] for t, r in by_round.items() if "alpha-last" in r})
    own = newton_track(by_round[0]["own-u"].astype(np.float64), dirs, alphas)
    return {t: by_round[t]["z"].astype(np.float64) - own[t] for t in own if "z" in by_round.get(t, {})}


class SumEstimate:
    """The sum of several parties' estimates (scored as the Gram matrix of their joined columns)."""

    def __init__(self, parts: list) -> None:
        self.parts = parts

    def rows(self, rows: np.ndarray) -> np.ndarray:
        return sum(p.rows(rows) for p in self.parts)


# -- the coalition server + active party under secure aggregation ---------------------------------
def peel_masks(words: np.ndarray, pid: int, keys: dict[int, bytes], server_round: int,
               split: str = "train", head: bytes | None = None) -> np.ndarray:
    """Party ``pid``'s masked words with the masks of its pairs in ``keys`` (the pair's other
    party → key) removed; ``head``: the history head the round's masks are bound to
    (flower/history.py), which the holder of the keys computed itself.

    Party i sends q_i + Σ_{j>i} m_ij − Σ_{j<i} m_ji (secure/ring.py); a coalition holding
    k_ij for some j undoes those terms. With every pair key of the word (one passive party and
    the active party's keys) this is q_i: the party's logits in the clear.
    """
    out = np.asarray(words, dtype=np.uint64).copy()
    for other, key in keys.items():
        m = mask(key if head is None else bound_key(key, head), server_round, split, len(out))
        out = out + m if other < pid else out - m  # uint64: wraps mod 2^64
    return out


def coalition_peeled(server_rounds: list[dict], pid: int, holder: int, keys: dict[int, bytes],
                     heads: dict[int, bytes] | None = None) -> list[dict]:
    """The server's transcript with party ``pid``'s training words peeled by the key it shares
    with party ``holder`` (``keys``: the holder's pair keys, other party → key; ``heads``: the
    holder's history head of each round, from its transcript)."""
    pair = {holder: keys[pid]}
    out = []
    for r in server_rounds:
        r = dict(r)
        t = int(r["round"])
        if f"u-{pid}" in r and r[f"u-{pid}"].dtype == np.uint64:
            r[f"u-{pid}"] = decode(peel_masks(r[f"u-{pid}"], pid, pair, t, head=(heads or {}).get(t)))
        out.append(r)
    return out


# -- the passive party on labels: the strongest of several attackers -----------------------------
#: The label attackers of :func:`label_attacks`, in the order they are reported.
LABEL_ATTACKERS = ("round", "mean-1-10", "sign-sum", "scaled-sum", "logistic")


def split_halves(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two seeded halves of the rows (an attacker's labelled rows and the rows it is scored on)."""
    order = np.random.default_rng([seed, 0x6C61]).permutation(n)
    return np.sort(order[: n // 2]), np.sort(order[n // 2:])


def best_threshold(score: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(threshold, accuracy) of the rule ŷ = +1 where score > threshold that is most accurate
    on (score, y); ±inf thresholds (always guess one class) are among the candidates."""
    order = np.argsort(score, kind="mergesort")
    s, pos = score[order], (y[order] == 1).astype(np.float64)
    # cutting after the first i rows: those guessed −1, the rest +1
    right = np.concatenate([[0.0], np.cumsum(1 - pos)]) + (pos.sum() - np.concatenate([[0.0], np.cumsum(pos)]))
    distinct = np.concatenate([[True], s[1:] != s[:-1], [True]])  # cut only between different scores
    right[~distinct] = -1
    i = int(np.argmax(right))
    cut = -np.inf if i == 0 else (np.inf if i == len(s) else (s[i - 1] + s[i]) / 2)
    return float(cut), float(right[i] / len(s))


def logistic_fit(F: np.ndarray, y: np.ndarray, l2: float = 1.0, steps: int = 25) -> np.ndarray:
    """L2-regularised logistic regression by Newton's method (IRLS): weights of [F, 1] for P(y = 1)."""
    A = np.column_stack([F, np.ones(len(F))])
    t = (y == 1).astype(np.float64)
    w = np.zeros(A.shape[1])
    reg = l2 * np.eye(A.shape[1])
    reg[-1, -1] = 0.0  # the intercept is the prior: not shrunk
    for _ in range(steps):
        p = 1 / (1 + np.exp(-np.clip(A @ w, -30, 30)))
        grad = A.T @ (p - t) + reg @ w
        step = np.linalg.solve(A.T @ (A * (p * (1 - p))[:, None]) + reg + 1e-9 * np.eye(len(w)), grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w


def label_scores(rounds: np.ndarray, nus: np.ndarray, early: int = 10) -> dict[str, list[tuple[int, np.ndarray]]]:
    """Each unsupervised attacker's scores (high: y = +1), one vector per round it may stop at.

    ``round``: −ν of that round alone; ``mean-1-10``: −mean of rounds 1..``early`` (zero-mean
    noise averages out while the weights are still positive); ``sign-sum``: −Σ sign ν up to
    that round (each round one vote, whatever its scale); ``scaled-sum``: −Σ ν/std(ν) up to that
    round (each round's ν in units of its spread over rows, so late rounds with small ν count).
    """
    nus = np.asarray(nus, np.float64)
    spread = nus.std(axis=1, keepdims=True)
    scaled = nus / np.where(spread > 0, spread, 1.0)
    early_rows = (rounds >= 1) & (rounds <= early)
    return {
        "round": [(int(t), -v) for t, v in zip(rounds, nus)],
        "mean-1-10": [(int(rounds[early_rows].max()), -nus[early_rows].mean(axis=0))] if early_rows.any() else [],
        "sign-sum": [(int(t), -v) for t, v in zip(rounds, np.cumsum(np.sign(nus), axis=0))],
        "scaled-sum": [(int(t), -v) for t, v in zip(rounds, np.cumsum(scaled, axis=0))],
    }


def label_attacks(rounds: np.ndarray, nus: np.ndarray, y: np.ndarray, seed: int = 0, early: int = 10) -> dict:
    """The passive party's label attackers on its ν (recorded rounds × rows), each scored honestly.

    The attacker is granted the labels of half the rows (a seeded split) to choose its
    decision rule: for every scorer of :func:`label_scores`, the round to stop at and a
    threshold (so it can fall back on the majority class, and beats the bare sign wherever
    the prior helps); ``logistic``: a logistic regression on every recorded round's ν/std(ν).
    It is scored on the other half, then the halves swap roles, so every row is predicted by
    a rule fitted without it: the accuracy is over all rows, next to the majority class.
    Returns ``{"attackers": {name: {"acc", "round"}}, "best", "best_by", "best_round",
    "baseline"}``; ``round``: the last round the attacker used (when the two halves chose
    different ones, the later).
    """
    y = np.asarray(y)
    nus = np.asarray(nus, np.float64)
    halves = split_halves(len(y), seed)
    scorers = label_scores(rounds, nus, early)
    spread = nus.std(axis=1, keepdims=True)
    features = (nus / np.where(spread > 0, spread, 1.0)).T
    out: dict = {}
    for name in LABEL_ATTACKERS:
        guess, used = np.zeros(len(y)), 0
        for fit, held in (halves, halves[::-1]):
            if name == "logistic":
                w = logistic_fit(features[fit], y[fit])
                guess[held] = np.where(features[held] @ w[:-1] + w[-1] > 0, 1, -1)
                used = int(rounds.max())
                continue
            if not scorers[name]:
                break
            fits = [(best_threshold(score[fit], y[fit]), t, score) for t, score in scorers[name]]
            (cut, _), t, score = max(fits, key=lambda f: f[0][1])
            guess[held] = np.where(score[held] > cut, 1, -1)
            used = max(used, t)
        else:
            out[name] = {"acc": float((guess == y).mean()), "round": used}
    best = max(out, key=lambda k: out[k]["acc"])
    return {"attackers": out, "best": out[best]["acc"], "best_by": best, "best_round": out[best]["round"],
            "baseline": float(max((y == 1).mean(), (y == -1).mean()))}


# -- the server on evaluation replies: the test rows' Gram matrix --------------------------------
def eval_pairs(server_rounds: list[dict], pid: int) -> tuple[np.ndarray, np.ndarray]:
    """(X_k W, X_test,k W): the images of the same parameter vectors on the training rows and on
    the test rows, as the server holds them from party ``pid``'s evaluation replies.

    Gradient descent: a reply with test logits carries u = X_k θ and u_test = X_test,k θ of one θ.
    Newton: X_k s (``dir``) with X_test,k s (the first column of ``test-dirs``), and the logits the
    server tracks, X_k θ, with ``test`` = X_test,k θ.
    """
    by_round = {int(r["round"]): r for r in server_rounds}
    train, test = [], []
    if any(f"dir-{pid}" in r for r in server_rounds):
        _, tracked, _ = newton_server_rounds(server_rounds, pid)
        for t, r in sorted(by_round.items()):
            if f"test-dirs-{pid}" in r and f"dir-{pid}" in r:
                train.append(as_logits(r[f"dir-{pid}"]))
                dirs = as_logits(r[f"test-dirs-{pid}"])  # masked words arrive flat: rows × directions
                n_test = len(r[f"test-{pid}"]) if f"test-{pid}" in r else dirs.shape[0]
                test.append(dirs.reshape(n_test, -1)[:, 0])
                if t in tracked and f"test-{pid}" in r:
                    train.append(tracked[t])
                    test.append(as_logits(r[f"test-{pid}"]))
    else:
        for _, r in sorted(by_round.items()):
            if f"u-test-{pid}" in r and f"u-{pid}" in r:
                train.append(as_logits(r[f"u-{pid}"]))
                test.append(as_logits(r[f"u-test-{pid}"]))
    if not train:
        raise ValueError(f"no evaluation reply of party {pid} in the server's transcript")
    return np.stack(train, axis=1), np.stack(test, axis=1)


def eval_gram_attack(train: np.ndarray, test: np.ndarray, estimate: GramEstimate,
                     rel_tol: float = NEWTON_RTOL) -> GramEstimate:
    """Ĝ_test = X_test X_testᵀ from the pairs A = X W, B = X_test W (:func:`eval_pairs`) and the
    server's estimate Ĝ of the training Gram matrix G = X Xᵀ.

    AᵀG⁺A = Wᵀ Xᵀ(XXᵀ)⁺X W = WᵀW wherever X has full column rank on the span of W, so
    B (AᵀĜ⁺A)⁺ Bᵀ = X_test W (WᵀW)⁺ Wᵀ X_testᵀ, which is X_test X_testᵀ once W spans the
    features (as many independent evaluation replies as columns). W is ill-conditioned (θ
    moves little late in training): directions of A below ``rel_tol`` of its largest singular
    value are the wire's rounding and are dropped.
    """
    U, sv, Vt = np.linalg.svd(train, full_matrices=False)
    keep = sv > rel_tol * sv[0] if len(sv) and sv[0] > 0 else np.zeros(len(sv), bool)
    # recombine the parameter vectors into orthonormal images on the training rows: A T = U_keep
    T = Vt[keep].T / sv[keep]
    C = estimate.basis.T @ U[:, keep]  # the images in Ĝ's basis
    vals, vecs = np.linalg.eigh((estimate.core + estimate.core.T) / 2)
    big = vals > rel_tol * max(float(np.abs(vals).max(initial=0.0)), 1e-300)
    core_pinv = (vecs[:, big] / vals[big]) @ vecs[:, big].T
    K = C.T @ core_pinv @ C  # (AT)ᵀ Ĝ⁺ (AT) = TᵀWᵀW T
    kv, kvec = np.linalg.eigh((K + K.T) / 2)
    ok = kv > rel_tol ** 2 * max(float(kv.max(initial=0.0)), 1e-300)
    M = (kvec[:, ok] / kv[ok]) @ kvec[:, ok].T
    BT = test @ T
    basis, s, vt = np.linalg.svd(BT, full_matrices=False)
    core = (s[:, None] * vt) @ M @ (s[:, None] * vt).T
    return GramEstimate(basis, (core + core.T) / 2, int(train.shape[1]))
