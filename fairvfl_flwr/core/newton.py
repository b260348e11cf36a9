"""Block Newton steps with a server-side subspace line search (``optimizer = "newton"``).

Pure numpy, linear parties (docs/algorithm.md, notation). For a fixed λ the primal part
of f̃ is, up to terms constant in θ,

    F(θ) = φ(z) + Σ_k (μ/2)‖θ_k‖²,   φ(z) = (1/n) Σ_i l_i(z_i) + Σ_i m_i q_i(z_i),

with ∂φ/∂z = ν (``ConstraintSet.masked_weights``) and a diagonal Hessian in z,
φ''_i (:func:`curvature`). One round:

1. Server: ν as for gradient descent, at the multipliers the last round's constrained
   search returned (:class:`ConstrainedSearch`; a kind that opts into :class:`ClippedNewton`
   takes its dual step first, :func:`dual_newton_step`).
2. Party k (θ_k with the bias as its last entry for an active party, X_k with a column of
   ones appended): a block Newton direction on a PSD model,
   ``s_k = −(X_kᵀ diag(h) X_k + μI)⁻¹ (X_kᵀν + μθ_k)`` (:func:`block_direction`). Its
   directions d_j are s_k and its last moves (the "memory"); it replies ``Δu_j = X_k d_j``,
   ``a_j = θ_k·d_j`` and the Gram matrix of its d_j.
3. Server: the step lengths α minimising F(θ + Σ_j α_j d_j) over the subspace all parties'
   directions span, every gap within ε there, and that problem's multipliers
   (:func:`search_step`): damped Newton in α with an Armijo backtracking on the exact F, which
   the server can evaluate from z, Δu, a and the Gram matrices alone (for a clipped-rule kind
   at the round's λ, then the subspace's sensitivity of the gaps to λ,
   :func:`subspace_gap_jacobian`, for its next dual step). Each party then sets
   θ_k ← θ_k + Σ_{j∈k} α_j d_j (in the app: on the next message). docs/newton.md.

Why this is safe by construction: every accepted α satisfies the Armijo condition on the
true F (not on a model), and α = 0 is always admissible, so F at fixed λ never increases,
whatever K, the data or how correlated the blocks are. Simultaneous undamped block steps
(α_k = 1) diverge when blocks are correlated; the subspace search shrinks α exactly as
much as the correlation requires and no constant is tuned.

Curvature. For the loss measure φ''_i = w_i σ(z_i)(1 − σ(z_i)) with the signed row weight
w_i = 1/n + m_i, which is negative for rows of a group whose weight λ pushes below zero;
φ is then not convex in z there. :func:`curvature` clips φ'' at 0 (a PSD model), so every
direction is a descent direction; the line search works on the true, unclipped F.
(The clipped dual step keeps every w_i >= 0 on the loss measure, ``ConstraintSet.weight_bounds``, so
there the clip only guards the rate measure and rounding; the constrained search's multipliers may
take a weight below 0, and the search's Armijo test on the true F still holds every step.)
Variants of what the passive parties use for h (``curvature``):

* ``exact``: the server sends h with ν. Reveals more than ν (see :func:`curvature`).
* ``nu``: the party derives h from ν alone, as if every row had weight 1/n:
  σ(−y_i z_i) = n|ν_i| there, so h̃_i = |ν_i|(1 − n|ν_i|), clipped at 0 (exact on the rows
  outside the constrained groups, which are most rows).
* ``const``: h̃_i = 1/(4n), the bound on σ'/n: a fixed preconditioner.

The active party knows y, s, λ and z, so it always uses the exact h.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairvfl_flwr.core.constraints import ConstraintSet, as_multipliers, gap_weights, gaps_per_row
from fairvfl_flwr.core.constraints.cells import GapModel
from fairvfl_flwr.core.constraints.measures import logistic_loss, loss_derivative, sigmoid
from fairvfl_flwr.core.constraints.release import RowWeights
from fairvfl_flwr.core.step import dual_step

CURVATURES = ("exact", "nu", "const")
ARMIJO = 1e-4


def smooth_part(constraint: ConstraintSet, y: np.ndarray, z: np.ndarray, lam: np.ndarray) -> float:
    """φ(z) = (1/n)Σ l_i + Σ_i m_i q_i: the z-dependent part of f̃ at λ (its gradient in z is ν)."""
    return float(logistic_loss(y, z).mean() + constraint.constraint_term(lam, constraint.q.values(y, z)))


def curvature(constraint: ConstraintSet | RowWeights, y: np.ndarray, z: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """φ''(z_i) clipped at 0: the PSD per-row curvature of f̃ in z (from the signed row weights
    alone, so a label owner that receives them takes it too: core/constraints/release.RowWeights).

    Loss measure: max(w_i, 0) σ'(z_i); rate measure: max(σ'/n + m_i σ'(1 − 2σ), 0).
    Sent to a passive party (``curvature = "exact"``), h_i with ν_i gives w_i = ν_i²/(|ν_i| − h_i)
    on the loss measure: the row's group weight, hence its group among the constrained
    rows once λ ≠ 0, and σ(z_i)(1 − σ(z_i)), hence |z_i|.
    """
    return constraint.q.curvature(y, z, constraint.signed_weights(lam), constraint.n)


def gap_directions(constraint: ConstraintSet, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """n × C: column c is ∂D_c/∂z = dq/dz ⊙ (1_A/|A| − 1_B/|B|) (also ∂ν/∂(λ_c+ − λ_c−))."""
    return constraint.q.slope(y, z)[:, None] * gap_weights(constraint)


def party_curvature(nu: np.ndarray | None, n: int, kind: str) -> np.ndarray:
    """What a passive party uses for h without receiving it (``nu``, ``const``; ``const``
    needs no ν: a party that gets only X_kᵀν, as under encrypted ν, can use it)."""
    if kind == "nu":
        a = np.abs(nu)
        return np.maximum(a * (1.0 - n * a), 0.0)
    if kind == "const":
        return np.full(n, 0.25 / n)
    raise ValueError(f"party curvature {kind!r}: choose nu or const (exact comes from the server)")


def loss_curvature(z: np.ndarray, n: int) -> np.ndarray:
    """σ'(z_i)/n: the logistic loss's own curvature, every row at weight 1/n (a label owner that
    holds no row's group weight: a registry's encrypted groups)."""
    p = sigmoid(np.asarray(z, dtype=np.float64))
    return p * (1.0 - p) / n


def with_bias(x: np.ndarray) -> np.ndarray:
    """An active party's block with its intercept column."""
    return np.hstack([x, np.ones((x.shape[0], 1), dtype=x.dtype)])


def block_direction(x: np.ndarray, nu: np.ndarray | None, h: np.ndarray, theta: np.ndarray, mu: float,
                    xt_nu: np.ndarray | None = None) -> np.ndarray:
    """s = −(xᵀ diag(h) x + μI)⁻¹ (xᵀν + μθ): the Newton direction on one block (PSD model).

    ``x`` (n × m) and ``theta`` (m) include the intercept column for an active party.
    ``xt_nu``: xᵀν where the party holds that product but not ν (encrypted ν); ``nu`` is then unused.
    """
    hess = (x * h[:, None]).T @ x
    hess[np.diag_indices_from(hess)] += mu
    grad = (x.T @ nu if xt_nu is None else xt_nu) + mu * theta
    try:
        return -np.linalg.solve(hess, grad)
    except np.linalg.LinAlgError:  # μ = 0 and a rank-deficient block
        return -np.linalg.lstsq(hess, grad, rcond=None)[0]


def null_space(gram: np.ndarray) -> np.ndarray:
    """An orthonormal basis (columns) of the null space of ``gram`` = xᵀx: its eigenvectors whose
    eigenvalue is below :data:`NULL_SPACE` of the largest."""
    w, v = np.linalg.eigh(gram)
    return v[:, w <= NULL_SPACE * max(float(w[-1]), np.finfo(float).tiny)]


def in_row_space(x: np.ndarray, gradient: np.ndarray) -> np.ndarray:
    """``gradient`` less its part along the null space of ``x`` (n × m): where a block's columns are
    collinear (one-hot blocks of two features each sum to 1), xᵀν has no part there, so a part the
    registry's noise put there is noise alone, which the block's Newton direction would amplify by 1/μ."""
    null = null_space(x.T @ x)
    return gradient - null @ (null.T @ gradient) if null.shape[1] else gradient


#: The share of the largest eigenvalue of xᵀx below which a direction counts as x's null space
#: (:func:`null_space`): collinear columns give about 1e-16 of it, a block's smallest true eigenvalue
#: far more, and so do a search's directions, where a party's memory moves repeat its new direction.
NULL_SPACE = 1e-10


#: The pseudo-inverse's cut-off for the search, by the dtype the directions' logits X_k d_j
#: travelled in. float32 rounds each entry to 6e-8 relative, so a combination of nearly
#: collinear directions with a tiny curvature is not resolved by them; inverting it anyway
#: turns rounding into step lengths of 1e4 to 1e7, and the parties' exact moves (float64)
#: then drift from the logits the server tracks. 1e-6 of the largest curvature of the
#: unit-diagonal scaling is an empirical cut (docs/newton.md, "Precision of the search": it
#: removes the drift, and 7 of 9 benchmark runs take the same rounds with it as with the
#: float64 cut); float64 keeps the exact method's.
WIRE_RCOND = {"float32": 1e-6, "float64": 1e-12}


def solve_psd(H: np.ndarray, rhs: np.ndarray, rcond: float = 1e-12) -> np.ndarray:
    """H⁺ rhs for the search's PSD H; above the exact cut-off, on the unit-diagonal scaling
    of H, so that only near-collinear combinations are cut, not directions of small scale."""
    if rcond <= 1e-12:
        return np.linalg.pinv(H, rcond=rcond, hermitian=True) @ rhs
    d = np.sqrt(np.maximum(np.diag(H), np.finfo(float).tiny))
    scaled = np.linalg.pinv(H / np.outer(d, d), rcond=rcond, hermitian=True)
    d = d.reshape(-1, *([1] * (rhs.ndim - 1)))  # a vector or the columns of a matrix
    return scaled @ (rhs / d) / d


class RowwiseSpace:
    """φ and the gaps on the span of the directions' logits Δu, row by row from the constraint: where
    the server holds every row's group (or its release), each trial point z + Δu α is evaluated exactly.
    A gap that is not linear in the rows' values (a release's spread) takes its slope at each trial
    point (ConstraintSet.linearised), so the search's gradient, curvature and gaps' slopes are those
    of the value it tests its steps on."""

    def __init__(self, constraint: ConstraintSet, y: np.ndarray, z: np.ndarray, du: np.ndarray) -> None:
        self.constraint, self.y, self.z, self.du = constraint, y, z, du
        self.cols = gap_weights(constraint)
        self._point: tuple[bytes, ConstraintSet, np.ndarray] | None = None  # the last trial point's

    def at(self, al: np.ndarray) -> tuple[ConstraintSet, np.ndarray]:
        """The constraint with its slopes at z + Δu α (itself where every gap is linear), and its
        n × C columns ∂w/∂d (:func:`gap_weights`)."""
        if self.constraint.linear:
            return self.constraint, self.cols
        key = np.asarray(al, dtype=np.float64).tobytes()
        if self._point is None or self._point[0] != key:
            at = self.constraint.linearised(self.y, self.z + self.du @ al)
            self._point = (key, at, gap_weights(at))
        return self._point[1], self._point[2]

    def value(self, al: np.ndarray, lam: np.ndarray) -> float:
        """φ(z + Δu α) at λ (:func:`smooth_part`)."""
        return smooth_part(self.at(al)[0], self.y, self.z + self.du @ al, lam)

    def gradient(self, al: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """Δuᵀν at z + Δu α: φ's gradient in α."""
        return self.du.T @ self.at(al)[0].masked_weights(self.y, self.z + self.du @ al, lam)

    def curvature(self, al: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """Δuᵀ diag(h) Δu with h the PSD per-row curvature (:func:`curvature`), plus, for a gap that is
        not linear in q and whose multiplier pushes it down (d_c > 0), d_c times its own curvature
        (its ``bend``: without it the search's Newton steps overshoot a release's spread many times)."""
        at, z = self.at(al)[0], self.z + self.du @ al
        H = (self.du * curvature(at, self.y, z, lam)[:, None]).T @ self.du
        if at.linear:
            return H
        d = np.asarray(lam, dtype=np.float64)[0::2] - np.asarray(lam, dtype=np.float64)[1::2]
        q, dq = at.q.values(self.y, z), at.q.slope(self.y, z)[:, None] * self.du
        for c, gap in enumerate(at.gap_list):
            if not gap.linear and d[c] > 0:
                H = H + d[c] * gap.bend(q, dq)
        return H

    def gaps(self, al: np.ndarray) -> np.ndarray:
        """Every D_c at z + Δu α."""
        return self.constraint.gaps(self.y, self.z + self.du @ al)

    def slopes(self, al: np.ndarray) -> np.ndarray:
        """V = Δuᵀ ∂D/∂z at z + Δu α (J × C): the gaps' gradients in α."""
        return self.du.T @ (self.constraint.q.slope(self.y, self.z + self.du @ al)[:, None] * self.at(al)[1])

    def retry(self, alpha: np.ndarray, lam: np.ndarray | None = None, bound: float = 0.0,
              held: np.ndarray | None = None) -> None:
        """Every trial point was evaluated exactly: the search's step stands."""
        return None

    def at_step(self, alpha: np.ndarray) -> tuple["RowwiseSpace", np.ndarray]:
        """This view and the step: it evaluates the step's point exactly."""
        return self, alpha

    def done(self) -> None:
        """Nothing to tell: the constraint was asked row by row."""


class ModelledSpace:
    """φ and the gaps on the span of Δu where the server reaches the groups only through sums (a
    registry's encrypted groups): the loss part of φ exactly from the labels and logits, each gap
    from its Taylor model D_c(α) = D_c + V_cᵀα + αᵀW_cα/2 at α = 0, whose coefficients the
    constraint asks the registry for (:class:`GapModel`, one request). For linear parties
    z + Δu α is exact, so only the measure q is expanded. The constraint's part of φ at λ is
    Σ_c d_c D_c(α) (d_c = λ_c+ − λ_c−); its curvature Σ_c d_c W_c enters the search's PSD model
    clipped to its non-negative eigenvalues (none without W: the linear model). :meth:`retry`
    checks the search's step against the true gaps and corrects the model along it where it
    does not hold."""

    def __init__(self, model: GapModel, y: np.ndarray, z: np.ndarray, du: np.ndarray, constraint=None) -> None:
        self.y, self.z, self.du = y, z, du
        self.n = len(y)
        self.constraint = constraint  # asked for the true gaps at a step (:meth:`retry`); None: never
        self.gram = du.T @ du
        null = null_space(self.gram)
        self.span = np.eye(len(self.gram)) - null @ null.T  # the projection onto the span of Δu's rows
        self.model = self.on_span(model)
        self.delta = 0.0  # the damping of the last search (:meth:`retry`)
        self.tries = 0
        self.missed = np.inf  # the model's largest error at the last step it missed

    def on_span(self, model: GapModel) -> GapModel:
        """``model`` without what it says along Δu's null space: a true slope or curvature there is 0
        (V = Δuᵀ ∂D/∂z, W = Δuᵀ diag(∂²D/∂z²) Δu), so whatever the registry's sums put there is their
        noise, and a search on it would move α without bound along directions that change no logit,
        to a point where the model's gaps meet the bound and the true ones, at the loss's optimum,
        do not."""
        P = self.span
        W = None if model.W is None else np.einsum("jk,ckl,lm->cjm", P, model.W, P)
        return GapModel(model.D, P @ model.V, W, model.sums)

    @staticmethod
    def _d(lam: np.ndarray) -> np.ndarray:
        lam = np.asarray(lam, dtype=np.float64)
        return lam[0::2] - lam[1::2]

    def value(self, al: np.ndarray, lam: np.ndarray) -> float:
        """The mean logistic loss at z + Δu α plus Σ_c d_c D_c(α)."""
        return float(logistic_loss(self.y, self.z + self.du @ al).mean() + self._d(lam) @ self.gaps(al))

    def gradient(self, al: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """Δuᵀ o/n + V(α) d."""
        return self.du.T @ (loss_derivative(self.y, self.z + self.du @ al) / self.n) + self.slopes(al) @ self._d(lam)

    def curvature(self, al: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """Δuᵀ diag(σ'/n) Δu, plus Σ_c d_c W_c's non-negative part where the model has W."""
        H = (self.du * loss_curvature(self.z + self.du @ al, self.n)[:, None]).T @ self.du
        if self.model.W is not None:
            w, v = np.linalg.eigh(np.tensordot(self._d(lam), self.model.W, axes=1))
            H = H + (v * np.maximum(w, 0.0)) @ v.T
        return H

    def gaps(self, al: np.ndarray) -> np.ndarray:
        """D(α) from the model."""
        m = self.model
        out = m.D + m.V.T @ al
        if m.W is not None:
            out = out + 0.5 * np.einsum("j,cjk,k->c", al, m.W, al)
        return out

    def slopes(self, al: np.ndarray) -> np.ndarray:
        """V(α) = V + W α (J × C)."""
        m = self.model
        return m.V if m.W is None else m.V + np.einsum("cjk,k->jc", m.W, al)

    def retry(self, alpha: np.ndarray, lam: np.ndarray | None = None, bound: float = 0.0,
              held: np.ndarray | None = None) -> np.ndarray | None:
        """None where the search's step ``alpha`` stands; else the damping to search again with (a
        J × J matrix, zero for none).

        The step stands where the model holds there against the true gaps (one sum per gap, asked
        of the constraint's oracle): a search that holds the gaps within ``bound`` (``lam`` None:
        the constrained search) needs every true gap within :data:`MODEL_TOLERANCE` of the larger
        of the bound and its modelled value (an error that brings a free gap nearer 0 costs
        nothing), and, where the round's budget also holds the gaps' slopes at the step, every
        gap the search ``held`` at its bound (C booleans: its multiplier is positive) within the
        tolerance of its modelled value on both sides: a held gap that the model's error leaves
        short of its bound is loss the step gave up, and a search at the round's first model
        stops short so round after round where the rates curve between z and the step;
        a search at fixed multipliers ``lam`` needs the model's error in φ, Σ_c d_c e_c,
        to cost at most half the decrease of φ the model predicts (a trust-region ratio: the
        gaps' error matters there only through φ, and a long step of the first rounds stands).
        It stands too where no sums are left this round for the check, or after
        :data:`MODEL_TRIES` searches. Else, for the constrained search where the round's budget
        holds them (C (1 + J) sums, with room for the next check), the model takes the true slopes
        at the step: each W_c gains the symmetric rank-two (PSB) update in the logits' metric
        that makes its slopes there the true ones, W_c α = V_c(α) − V_c, unchanged in value and
        slope at 0 (the search without the gaps' Hessian otherwise meets the bound on a linear
        model of a curved gap, and converges only linearly onto the constrained step). Then the
        model takes the true gaps at the step as a secant along it (each W_c gains 2 e_c ggᵀ/(αᵀg)²
        for its error e_c, g = ΔuᵀΔu α, so the model is exact there and unchanged in value and slope
        at 0, and a step along Δu's null space, which moves no logit, changes no modelled gap), and
        the search runs again; on the value secant alone, where the model's error did not at least
        halve since the last miss, also damped by the Levenberg–Marquardt term δ ΔuᵀΔu/n (δ = 1/4,
        then 4 times the last: the loss's own curvature is at most 1/(4n) a row), which shortens
        the step toward where the model holds."""
        c = self.constraint
        self.tries += 1
        if c is None or self.tries >= MODEL_TRIES or not np.any(alpha):
            return None
        C, J = len(self.model.D), len(alpha)
        room = None if c.room is None else c.room()
        if room is not None and room < C:
            return None
        true = c.gaps(self.y, self.z + self.du @ alpha)
        error = true - self.gaps(alpha)
        # the slopes at the step, for the constrained search, where the round's sums hold them and the next check
        slopes = (lam is None and getattr(c, "temperature", 1.0) >= SLOPES_TEMPERATURE
                  and (room is None or room >= C * (3 + J)))
        if lam is None:
            modelled = self.gaps(alpha)
            holds = float(np.max(np.abs(modelled + error) - np.maximum(bound, np.abs(modelled)))) <= MODEL_TOLERANCE
            if slopes and held is not None and np.any(held):
                holds = holds and float(np.max(np.abs(error[np.asarray(held, dtype=bool)]))) <= MODEL_TOLERANCE
        else:
            predicted = self.value(np.zeros(J), lam) - self.value(alpha, lam)
            holds = float(self._d(lam) @ error) <= 0.5 * max(predicted, 0.0)
        if holds:
            return None
        m = self.model
        W = np.zeros((C, J, J)) if m.W is None else m.W
        g = self.gram @ alpha  # the secant in the logits' metric: a step along Δu's null space changes no gap
        gg = float(alpha @ g)
        if slopes:
            there = c.taylor(self.y, self.z + self.du @ alpha, self.du, hessian=False, say=False)
            r = self.span @ there.V - self.slopes(alpha)  # J × C: what W α misses of the slopes' change
            W = (W + (np.einsum("jc,k->cjk", r, g) + np.einsum("j,kc->cjk", g, r)) / gg
                 - np.einsum("c,jk->cjk", alpha @ r, np.outer(g, g)) / gg ** 2)
            self.model = m = GapModel(m.D, m.V, W, m.sums)
            error = true - self.gaps(alpha)
        self.model = GapModel(m.D, m.V, W + 2.0 * error[:, None, None] * np.outer(g, g)[None] / gg ** 2, m.sums)
        size = float(np.max(np.abs(error)))
        # the value secants alone do not close in on the step: shorten it (with the true slopes there the model
        # holds the step's value and, but for the secant's small residual, its slopes: a damped search would
        # only stop short of the bound)
        if size > 0.5 * self.missed and not slopes:
            self.delta = max(4.0 * self.delta, 0.25)
        self.missed = size
        return self.delta * self.gram / self.n  # zero: undamped

    def at_step(self, alpha: np.ndarray) -> tuple["ModelledSpace", np.ndarray]:
        """A view based at the step's point z + Δu α, and the step there (0), for what the next dual
        step reads there (:func:`subspace_gap_jacobian`): the true gaps and slopes at that point where
        the round's budget holds them (C (1 + J) sums), with this model's W; else this view and α."""
        c = self.constraint
        C, J = len(self.model.D), len(alpha)
        room = None if c is None or c.room is None else c.room()
        if c is None or not np.any(alpha) or (room is not None and room < C * (1 + J)):
            return self, alpha
        z = self.z + self.du @ alpha
        there = c.taylor(self.y, z, self.du, hessian=False, say=False)
        return ModelledSpace(GapModel(there.D, there.V, self.model.W, there.sums), self.y, z, self.du, c), np.zeros(J)

    def done(self) -> None:
        """The search of the round has ended: the constraint is told (what its oracle asks after it is the rest of
        the round's)."""
        told = getattr(self.constraint, "told", None)
        if told is not None:
            told(None, self.du.shape[1])


def in_subspace(constraint: ConstraintSet, y: np.ndarray, z: np.ndarray, du: np.ndarray
                ) -> "RowwiseSpace | ModelledSpace":
    """The search's view of φ and the gaps on the span of ``du``: row by row (:class:`RowwiseSpace`),
    or, for a constraint that reaches its groups only through sums and so offers a Taylor model
    of its gaps (``taylor``: core/constraints/cells.EncryptedConstraint), that model
    (:class:`ModelledSpace`), asked for once here."""
    taylor = getattr(constraint, "taylor", None)
    if taylor is None:
        return RowwiseSpace(constraint, y, z, du)
    C, J = len(constraint.gap_list), du.shape[1]
    # the Hessian only where the round's budget also holds the checks and the true slopes at the step
    return ModelledSpace(taylor(y, z, du, reserve=C * (MODEL_TRIES + 1 + J)), y, z, du, constraint)


#: How far a Taylor model's gaps may end from the true ones at the search's step (a tenth of the
#: stop rule's slack on ε, core/stopping.py) before the search runs again on a corrected model.
MODEL_TOLERANCE = 1e-4
#: The most searches one round runs on one Taylor model (each check of a step is one sum a gap).
MODEL_TRIES = 8
#: The sharpest rates whose gaps a missed step corrects with the true slopes there (:meth:`ModelledSpace.retry`):
#: at τ = 1/16 σ(z/τ) is near a step at the threshold, and a model corrected so missed its next step by 0.03 to 0.2
#: (COMPAS equalized odds, its hard-gap target on), where at τ = 1/4 it closed in within a search or two.
SLOPES_TEMPERATURE = 0.25


def subspace_step(
    y: np.ndarray,
    z: np.ndarray,
    du: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    lam: np.ndarray,
    constraint: ConstraintSet,
    mu: float,
    *,
    iters: int = 20,
    tol: float = 1e-12,
    rcond: float = 1e-12,
    prox: np.ndarray | None = None,
    space: RowwiseSpace | ModelledSpace | None = None,
) -> np.ndarray:
    """α ∈ R^J minimising F(α) = φ(z + Δu α) + μ (a·α + αᵀBα/2) (the μ-term's change).

    J directions d_j (each within one party's block): ``du`` is n × J (column j: the
    logits' change X_k d_j), ``a_j = θ_k·d_j`` and ``b`` the Gram matrix B_ij = d_i·d_j
    (0 across parties), or its diagonal when each party has one direction. Damped Newton on
    the PSD model (Δuᵀ diag(h) Δu + μB) with Armijo backtracking on the true F, so
    F(α) <= F(0) always; stops when the predicted decrease is below ``tol`` · (1 + |F|).
    ``prox``: a PSD J × J matrix P whose αᵀPα/2 is added to what is minimised (:func:`damping`).
    ``space``: φ on the span of Δu (:func:`in_subspace`, built here when not given).
    """
    du = np.asarray(du, dtype=np.float64).reshape(len(z), -1)
    space = in_subspace(constraint, y, z, du) if space is None else space
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    B = np.diag(b) if b.ndim == 1 else b
    alpha = np.zeros(du.shape[1])
    damp = _Prox(prox)

    def value(al: np.ndarray) -> float:
        return space.value(al, lam) + mu * float(a @ al + 0.5 * al @ B @ al) + damp.value(al)

    f = value(alpha)
    for _ in range(iters):
        g = space.gradient(alpha, lam) + mu * (a + B @ alpha) + damp.grad(alpha)
        H = space.curvature(alpha, lam) + mu * B + damp.hess()
        p = -solve_psd(H, g, rcond)
        slope = float(g @ p)
        if not slope < -tol * (1.0 + abs(f)):
            break
        t = 1.0
        while True:
            f_new = value(alpha + t * p)
            if f_new <= f + ARMIJO * t * slope:
                break
            t *= 0.5
            if t < 1e-10:
                return alpha
        alpha, f = alpha + t * p, f_new
    return alpha


def damping(du: np.ndarray, gram: np.ndarray, sq_norm: float, delta: float) -> np.ndarray:
    """The Levenberg–Marquardt term of a search over non-linear blocks:
    P = δ (ΔuᵀΔu / n + B / ‖θ‖²), so that αᵀPα/2 charges the step δ/2 times its mean square
    change of the logits plus its squared change of θ relative to ‖θ‖². The logit term is what
    the linearisation gets wrong; the θ term holds the step where the images are small (a
    flat stretch of the network, where a long step in θ moves the logits little to first order
    and a lot beyond it). The loss's own curvature in z is at most 1/(4n) per row, so δ = 1/4
    already halves a step the model would take in full; δ → 0 is the plain search. Both terms
    are invariant to how a party scaled its directions."""
    du = np.asarray(du, dtype=np.float64)
    b = np.asarray(gram, dtype=np.float64)
    B = np.diag(b) if b.ndim == 1 else b
    return delta * ((du.T @ du) / du.shape[0] + B / max(sq_norm, 1.0))


class _Prox:
    """αᵀPα/2, its gradient and Hessian, or exact zeros without P (the plain search unchanged)."""

    def __init__(self, prox: np.ndarray | None) -> None:
        self.p = None if prox is None else np.asarray(prox, dtype=np.float64)

    def value(self, al: np.ndarray) -> float:
        return 0.0 if self.p is None else 0.5 * float(al @ self.p @ al)

    def grad(self, al: np.ndarray) -> np.ndarray | float:
        return 0.0 if self.p is None else self.p @ al

    def hess(self) -> np.ndarray | float:
        return 0.0 if self.p is None else self.p


def kept_directions(constraint: ConstraintSet, directions: int, priority: np.ndarray | None = None
                    ) -> np.ndarray | None:
    """The directions a search on a model of the gaps keeps where the round's budget of sums
    (``constraint.room``) holds the linear model over only some of them: the first of
    ``priority`` (default: in order) that fit with one check of the step, C (2 + J) sums;
    None where every direction fits (or the constraint is evaluated row by row)."""
    room = getattr(constraint, "room", None)
    room = None if room is None else room()
    if room is None:
        return None
    C = len(constraint.gap_list)
    fit = room // C - 2
    if fit >= directions or fit < 1:  # all fit, or none: the model refuses, naming the budget
        return None
    order = np.arange(directions) if priority is None else np.asarray(priority)
    return np.sort(order[:fit])


def search_step(y: np.ndarray, z: np.ndarray, du: np.ndarray, a: np.ndarray, b: np.ndarray, lam: np.ndarray,
                constraint: ConstraintSet, mu: float, *, epsilon: float, fairness: bool = True, rcond: float = 1e-12,
                priority: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The server's search of one round: (α, λ, J). Where the constraint's dual rule searches
    (:class:`ConstrainedSearch`) the step lengths and λ of :func:`constrained_step`,
    and no J; else :func:`subspace_step` at the given λ, and the subspace's gap sensitivity
    :func:`subspace_gap_jacobian` for the next dual step. On a model of the gaps whose budget
    holds only some directions (:func:`kept_directions`, in the order of ``priority``), the
    search runs on those and the others' step lengths are 0."""
    du = np.asarray(du, dtype=np.float64).reshape(len(z), -1)
    keep = kept_directions(constraint, du.shape[1], priority)
    if keep is not None:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        B = np.diag(b) if b.ndim == 1 else b
        kept, lam, jac = search_step(y, z, du[:, keep], a[keep], B[np.ix_(keep, keep)], lam, constraint, mu,
                                     epsilon=epsilon, fairness=fairness, rcond=rcond)
        alpha = np.zeros(du.shape[1])
        alpha[keep] = kept
        return alpha, lam, jac
    space = in_subspace(constraint, y, z, du)  # where it is a model of the gaps, asked for once a round
    searches = fairness and rule_for(constraint).searches
    prox = None
    while True:
        if searches:
            alpha, new = held_step(y, z, du, a, b, lam, constraint, mu, epsilon=epsilon, rcond=rcond, space=space,
                                   prox=prox)
        else:
            alpha, new = subspace_step(y, z, du, a, b, lam, constraint, mu, rcond=rcond, space=space, prox=prox), lam
        # a model of the gaps that does not hold at the step: corrected, and searched again
        # the constrained search's multipliers name the gaps it held at their bound
        held = ((new[0::2] > 0) | (new[1::2] > 0)) if searches else None
        retried = space.retry(alpha, None if searches else lam, epsilon, held)
        if retried is None:
            break
        prox = retried if np.any(retried) else None
    jac = None
    if not searches:  # the gaps' sensitivity at the step, for the next dual step
        there, at = space.at_step(alpha)
        jac = subspace_gap_jacobian(y, z + du @ alpha, du, b, lam, constraint, mu, rcond=rcond, space=there, at=at)
    space.done()
    return alpha, new, jac


#: A multiplier of the constrained search above this means the subspace holds no point with every gap
#: within the bound: the augmented Lagrangian's penalty grew without end (where the search meets its bound
#: the multipliers are of order 1: COMPAS and COMPAS race, DP and EO at ε = 0.02, seeds 0-2, at most 1.01).
LAM_MAX = 1e4


def held_step(y: np.ndarray, z: np.ndarray, du: np.ndarray, a: np.ndarray, b: np.ndarray, lam: np.ndarray,
              constraint: ConstraintSet, mu: float, *, epsilon: float, rcond: float = 1e-12,
              space: RowwiseSpace | ModelledSpace | None = None, prox: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """(α, λ): :func:`constrained_step` at ``epsilon``, or where the subspace holds no point
    with every gap within it (its multipliers past :data:`LAM_MAX`, or a step that is not finite),
    at the bound halfway from ``epsilon`` to the largest gap now, then at that gap (α = 0 holds it).

    A bound is out of one round's reach right after the stop rule sharpened the rates
    (core/stopping.py): the same logits' smooth gaps jump toward the hard ones, 0.001 to 0.042 on
    COMPAS race at τ = 1/16. Searched at the bound regardless, the penalty and the multipliers
    grew by ten orders a round until the next round's ν overflowed the wire; halving the
    distance each round brings the gaps to the bound with multipliers of order 1."""
    du = np.asarray(du, dtype=np.float64).reshape(len(z), -1)
    space = in_subspace(constraint, y, z, du) if space is None else space
    now = float(np.max(np.abs(space.gaps(np.zeros(du.shape[1])))))
    for bound in dict.fromkeys((epsilon, epsilon + 0.5 * max(now - epsilon, 0.0), max(now, epsilon))):
        alpha, new = constrained_step(y, z, du, a, b, lam, constraint, mu, epsilon=bound, rcond=rcond, space=space,
                                      prox=prox)
        if np.all(np.isfinite(alpha)) and np.all(np.abs(new) <= LAM_MAX):
            return alpha, new
    return subspace_step(y, z, du, a, b, lam, constraint, mu, rcond=rcond, space=space, prox=prox), lam


def constrained_step(
    y: np.ndarray,
    z: np.ndarray,
    du: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    lam: np.ndarray,
    constraint: ConstraintSet,
    mu: float,
    *,
    epsilon: float,
    rcond: float = 1e-12,
    outer: int = 40,
    feasible: float = 1e-5,
    prox: np.ndarray | None = None,
    space: RowwiseSpace | ModelledSpace | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(α, λ): the step lengths minimising L(θ + Σ_j α_j d_j) = (1/n) Σ l_i + μ-term subject to
    every |D_c| <= ε *on the subspace*, and that problem's multipliers.

    The server can evaluate every gap at z + Δu α as it evaluates F, so instead of holding λ
    fixed for the search and stepping it afterwards, it solves the constrained problem in the
    ≤ 5K step lengths: an augmented Lagrangian (multipliers λ̃ = max(0, λ + ρ g) for the
    inequalities g = ±D − ε <= 0), each inner problem by :func:`subspace_step`'s damped
    Newton with Armijo on the true augmented value (its Gauss–Newton term ρ V Vᵀ for the
    gaps in play), warm-started at the last round's λ. ρ grows ×10 while the largest
    violation does not fall to a quarter. The result's gaps are within ε + ``feasible`` when
    the subspace holds such a point (α = 0 does whenever the last round's did), and λ is
    what the next round's ν and directions use. Nothing here asks the row weights to stay
    >= 0: the augmented value is bounded below whatever λ̃ does to them. ``prox``: as for
    :func:`subspace_step`, a damping term on the step (it shrinks the step, not the constraint).
    ``space``: φ and the gaps on the span of Δu (:func:`in_subspace`, built here when not given).
    """
    du = np.asarray(du, dtype=np.float64).reshape(len(z), -1)
    space = in_subspace(constraint, y, z, du) if space is None else space
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    B = np.diag(b) if b.ndim == 1 else b
    lam = np.maximum(as_multipliers(lam, len(constraint.gap_list)), 0.0)
    zero = np.zeros_like(lam)
    rho = 1.0 / max(epsilon, 1e-6)
    alpha = np.zeros(du.shape[1])
    damp = _Prox(prox)

    def violation(g: np.ndarray) -> float:
        return float(max(np.max(np.abs(g)) - epsilon, 0.0))

    def g_of(gaps: np.ndarray) -> np.ndarray:
        out = np.empty(2 * len(gaps))
        out[0::2], out[1::2] = gaps - epsilon, -gaps - epsilon
        return out

    def value(al: np.ndarray, lm: np.ndarray, r: float) -> float:
        pen = np.maximum(lm + r * g_of(space.gaps(al)), 0.0)
        return (space.value(al, zero) + mu * float(a @ al + 0.5 * al @ B @ al)
                + float(pen @ pen - lm @ lm) / (2.0 * r) + damp.value(al))

    last = violation(space.gaps(alpha))
    for _ in range(outer):
        f = value(alpha, lam, rho)
        for _ in range(20):
            g = g_of(space.gaps(alpha))
            tilde = np.maximum(lam + rho * g, 0.0)
            grad = space.gradient(alpha, tilde) + mu * (a + B @ alpha) + damp.grad(alpha)
            V = space.slopes(alpha)  # Δuᵀ ∂D/∂z, J × C
            play = (tilde[0::2] > 0) | (tilde[1::2] > 0)
            H = space.curvature(alpha, tilde) + mu * B + rho * V[:, play] @ V[:, play].T + damp.hess()
            p = -solve_psd(H, grad, rcond)
            slope = float(grad @ p)
            if not slope < -1e-14 * (1.0 + abs(f)):
                break
            t = 1.0
            while True:
                f_new = value(alpha + t * p, lam, rho)
                if f_new <= f + ARMIJO * t * slope:
                    break
                t *= 0.5
                if t < 1e-10:
                    break
            if t < 1e-10:
                break
            alpha, f = alpha + t * p, f_new
        gaps = space.gaps(alpha)
        new = np.maximum(lam + rho * g_of(gaps), 0.0)
        moved, lam = float(np.abs(new - lam).max()), new
        now = violation(gaps)
        if now <= feasible and moved <= 1e-3 * (1.0 + float(lam.max())):
            break
        if not lam.max() <= LAM_MAX:  # out of the subspace's reach (held_step's test): more rounds only grow it
            break
        if now > 0.25 * last:
            rho *= 10.0
        last = now
    return alpha, lam


def subspace_gap_jacobian(
    y: np.ndarray, z: np.ndarray, du: np.ndarray, b: np.ndarray, lam: np.ndarray, constraint: ConstraintSet, mu: float,
    rcond: float = 1e-12, *, space: RowwiseSpace | ModelledSpace | None = None, at: np.ndarray | None = None,
) -> np.ndarray:
    """J = dD/dd (C × C, d_c = λ_c+ − λ_c−) at the subspace optimum z, by implicit differentiation.

    At the minimiser α* of F over the parties' directions, dα*/dd = −H_α⁻¹ V with
    V = Δuᵀ ∂D/∂z, so J = −Vᵀ H_α⁻¹ V (negative semidefinite). It is the sensitivity of the
    gaps to the multipliers when θ may move only within the subspace, so |J| is at most
    the full problem's (the H-projection onto a subspace shrinks the quadratic form).
    ``space`` with ``at``: the search's view of the span (:func:`in_subspace`), based at z − Δu·at.
    """
    du = np.asarray(du, dtype=np.float64).reshape(len(z), -1)
    b = np.asarray(b, dtype=np.float64)
    B = np.diag(b) if b.ndim == 1 else b
    if space is None:
        space, at = RowwiseSpace(constraint, y, z, du), np.zeros(du.shape[1])
    H = space.curvature(at, lam) + mu * B
    V = space.slopes(at)
    return -V.T @ solve_psd(H, V, rcond)


def server_step(lam, y, z, constraint, jac, previous, *, epsilon, beta, c, fairness=True):
    """Block Newton's server step: ν at λ, the last constrained search's multipliers, or for a
    clipped-rule kind at the λ of its dual Newton step (gradient descent's is
    ``core.step.server_step``). Returns ``(λ, ν, previous)``, where ``previous`` is what the
    next dual step compares against."""
    if fairness and rule_for(constraint).searches:
        # λ is the last search's: no gaps to take (a registry decrypts every gap it is asked for)
        lam = as_multipliers(lam, len(constraint.gap_list))
    elif fairness:
        gaps = constraint.gaps(y, z)
        d = lam[0::2] - lam[1::2]
        lam = dual_newton_step(lam, gaps, jac, constraint, epsilon=epsilon, beta=beta, c=c, previous=previous)
        previous = (d, gaps)
    return lam, constraint.masked_weights(y, z, lam), previous


#: Earlier moves searched along with each new direction. Without them the primal converges
#: only linearly on correlated blocks; two left the DEO oscillating around ε for ten more
#: rounds on Adult, four settle it (docs/newton.md, "How many moves").
MEMORY = 4
#: ... and combined moves where the step lengths are shared (secure aggregation): the
#: search then has 1 + m dimensions instead of K(1 + m), and the parties send the new
#: direction only (the server keeps the combined moves' change of z), so more memory is
#: cheap; it takes Adult to the target in 5-8 rounds where four moves needed 15.
SHARED_MEMORY = 16


class CentralisedNewton:
    """The centralised counterpart: all columns and the intercept in one θ, the full Hessian.

    Each round: the server step (:func:`server_step`), the Newton direction on the whole
    problem's PSD model, and the search over it and the last ``memory`` moves. With
    one party (the active one, exact curvature) the federated method is this, to float
    tolerance: the yardstick of tests/test_newton.py.
    """

    def __init__(self, x, y, constraint: ConstraintSet, *, epsilon, beta, c, mu, memory=MEMORY, fairness=True):
        self.x = with_bias(np.asarray(x, dtype=np.float64))  # intercept last, as an active party's
        self.y, self.constraint = np.asarray(y, dtype=np.float64), constraint
        self.epsilon, self.beta, self.c, self.mu, self.memory, self.fairness = epsilon, beta, c, mu, memory, fairness
        self.theta = np.zeros(self.x.shape[1])
        self.lam = np.zeros(constraint.num_multipliers)
        self.jac: np.ndarray | None = None
        self.previous: tuple[np.ndarray, np.ndarray] | None = None
        self.moves: list[np.ndarray] = []

    def z(self) -> np.ndarray:
        """z = Xθ on the joined columns."""
        return self.x @ self.theta

    def round(self) -> None:
        """One round of the one-party reference: the dual step, the Newton direction on all columns and
        the search over it and the kept moves."""
        z = self.z()
        self.lam, nu, self.previous = server_step(self.lam, self.y, z, self.constraint, self.jac, self.previous,
                                                         epsilon=self.epsilon, beta=self.beta, c=self.c,
                                                         fairness=self.fairness)
        h = curvature(self.constraint, self.y, z, self.lam)
        hess = self.x.T @ (h[:, None] * self.x) + self.mu * np.eye(self.x.shape[1])
        dirs = [-np.linalg.solve(hess, self.x.T @ nu + self.mu * self.theta), *self.moves]
        D = np.column_stack(dirs)
        du = self.x @ D
        gram = D.T @ D
        alpha, self.lam, self.jac = search_step(self.y, z, du, self.theta @ D, gram, self.lam, self.constraint, self.mu,
                                                epsilon=self.epsilon, fairness=self.fairness)
        move = D @ alpha
        self.theta = self.theta + move
        self.moves = [move, *self.moves][: self.memory]


# -- the dual step ---------------------------------------------------------------------------
# Block Newton's dual step (``optimizer = "newton"``): one function, :func:`dual_newton_step`,
# and one small class per rule it may follow.
#
# The step works on d_c = λ_c+ − λ_c− (one multiplier of a pair is 0 at the optimum). The
# dual is concave in d with derivative r_c = D_c − ε sign(d_c) − c d_c (at d_c = 0: 0 if
# |D_c| <= ε, else the side D_c points to), and Newton moves d ← d − (J − cI)⁻¹ r, with J the
# gaps' sensitivity to d in the last round's subspace (:func:`subspace_gap_jacobian`).
# Before there is a J (round 1) the step is the paper's gradient step with β. Every rule keeps
# a step from crossing d_c = 0 (the dual's kink: the other multiplier takes over from there
# on the next round). Two rules:
#
# * :class:`ConstrainedSearch`: every built-in constraint (any number of groups, any kind, form
#   or measure, on the label owner's groups or a registry's encrypted ones:
#   core/constraints/cells.EncryptedConstraint): no dual step at all, because the server's
#   search solves for the step lengths and λ together (:func:`constrained_step`).
# * :class:`ClippedNewton`: a kind that declares ``newton_past_bound``, with two groups (the
#   rows of different gaps disjoint): d is clipped to ``ConstraintSet.weight_bounds`` (the loss
#   measure's row weights w = 1/n + A d stay >= 0), and a gap already at its bound steps past it
#   by gradient. Where the target needs weights below 0 that creeps (COMPAS deo: 85-95 rounds
#   against 8 for the constrained search; docs/newton.md, "The dual rule of two-group deo").
#
# :func:`rule_for` says which rule a constraint takes (its kind's ``newton_past_bound`` and
# how many gap sides a row sits on). The constraint object supplies the gaps' structure
# (weights, bounds, projection); the linear algebra lives here.
Previous = tuple[np.ndarray, np.ndarray]


def dual_newton_step(lam: np.ndarray, gaps: np.ndarray, jac: np.ndarray | None, constraint: ConstraintSet, *,
                     epsilon: float, beta: float, c: float, previous: Previous | None = None) -> np.ndarray:
    """The server's dual step under ``optimizer = "newton"``: the new λ from the gaps D_c at the
    current θ, the last round's subspace sensitivity ``jac`` (None in round 1: the gradient
    step with β) and ``previous`` = (d, gaps) at the last dual step, by :func:`rule_for`'s rule."""
    return rule_for(constraint).step(lam, gaps, jac, constraint, epsilon=epsilon, beta=beta, c=c, previous=previous)


def rule_for(constraint: ConstraintSet) -> "ClippedNewton | ConstrainedSearch":
    """The dual rule of ``constraint``: :class:`ClippedNewton` where its kind allows the step past
    the weight bound (``newton_past_bound``) and no row sits on two gaps' sides, else
    :class:`ConstrainedSearch`."""
    if constraint.newton_past_bound and gaps_per_row(constraint) <= 1:
        return ClippedNewton()
    return ConstrainedSearch()


def at_weight_bound(constraint: ConstraintSet, lam: np.ndarray) -> np.ndarray:
    """Per gap: does d_c sit at (or past) ``ConstraintSet.weight_bounds``? (None where the measure allows w < 0.)

    From there block Newton's dual step is the paper's projected gradient step with β,
    unclipped: where the constraint needs some rows' weights below 0 (Crime), λ moves past
    the bound by β(|D_c| − ε) per round, and back once the gap is met. Small steps, because
    past the bound f̃ is not convex in those rows' logits and the Newton step's sensitivity
    J, taken at weights >= 0, says nothing about how far the primal then moves.
    """
    if not constraint.q.needs_nonnegative_weights:
        return np.zeros(len(constraint.gap_list), dtype=bool)
    lo, hi = constraint.weight_bounds()
    d = np.asarray(lam, dtype=np.float64)[0::2] - np.asarray(lam, dtype=np.float64)[1::2]
    rel = 1e-9  # project puts d on the bound up to rounding
    return (d >= hi * (1 - rel)) | (d <= lo * (1 - rel))


def split(d: np.ndarray) -> np.ndarray:
    """The multipliers [λ_1+, λ_1−, ...] with λ_c+ − λ_c− = d_c and one of each pair 0."""
    out = np.empty(2 * len(d), dtype=np.float64)
    out[0::2], out[1::2] = np.maximum(d, 0.0), np.maximum(-d, 0.0)
    return out


def newton_residual(d: np.ndarray, gaps: np.ndarray, epsilon: float, c: float) -> tuple[np.ndarray, np.ndarray]:
    """The dual's derivative r in d, and which d_c are free to move (not resting at 0 inside ε)."""
    side = np.where(d != 0, np.sign(d), np.where(np.abs(gaps) > epsilon, np.sign(gaps), 0.0))
    return gaps - epsilon * side - c * d, ~((d == 0) & (side == 0))


def not_across_zero(d: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``new`` with every d_c that would change sign stopped at 0 (the dual's kink)."""
    return np.where((d != 0) & (np.sign(new) != np.sign(d)), 0.0, new)


@dataclass(frozen=True)
class ConstrainedSearch:
    """No dual step between rounds: the server's search solves for the step lengths and λ together
    (core/newton.constrained_step), so λ is already the one the next round's ν needs.

    The dual Newton steps of the other rules move λ on the subspace's sensitivity J, which
    underestimates how far a small group's gap moves (the step overshoots and the gaps
    oscillate), and must keep the loss measure's weights >= 0 (the target may need them
    below). Solving min L subject to every |D_c| <= ε on the ≤ 5K-dimensional subspace
    needs neither: the gaps are within ε from the first round on, and λ is that small
    problem's multiplier vector (docs/newton.md, "Several groups and coupled gaps").
    """

    #: the search returns λ (core/newton.search_step reads this)
    searches = True

    def step(self, lam: np.ndarray, gaps: np.ndarray, jac: np.ndarray | None, constraint: ConstraintSet, *,
             epsilon: float, beta: float, c: float, previous: Previous | None = None) -> np.ndarray:
        """λ as the last search left it (:func:`dual_newton_step`)."""
        return as_multipliers(lam, len(constraint.gap_list))


@dataclass(frozen=True)
class ClippedNewton:
    """Newton on the dual clipped to the weight bounds; past a bound, a short gradient step.

    A gap whose d_c already sits at :func:`at_weight_bound` takes the paper's
    projected gradient step with β, unclipped, moving d_c by at most ``past_bound_share`` of
    its bounds' width (:meth:`past_bound`). The others take :meth:`newton`.
    """

    #: the most a gradient step from a weight bound moves d_c, as a share of the bounds' width
    past_bound_share: float = 0.1
    #: λ comes from this dual step, not from the search
    searches = False

    def step(self, lam: np.ndarray, gaps: np.ndarray, jac: np.ndarray | None, constraint: ConstraintSet, *,
             epsilon: float, beta: float, c: float, previous: Previous | None = None) -> np.ndarray:
        """The new λ (:func:`dual_newton_step`)."""
        if jac is None:
            return constraint.project(dual_step(lam, gaps, epsilon, beta, c))
        new = self.newton(lam, gaps, jac, constraint, epsilon=epsilon, c=c, previous=previous)
        past = at_weight_bound(constraint, lam)
        if past.any():
            step = self.past_bound(lam, dual_step(lam, gaps, epsilon, beta, c), constraint)
            for k in np.flatnonzero(past):
                new[2 * k:2 * k + 2] = step[2 * k:2 * k + 2]
        return new

    def newton(self, lam: np.ndarray, gaps: np.ndarray, jac: np.ndarray, constraint: ConstraintSet, *,
               epsilon: float, c: float, previous: Previous | None = None) -> np.ndarray:
        """d ← d − (J − cI)⁻¹ r on the gaps not resting at 0, not across 0, then clipped to the
        weight bounds. J is the subspace's (negative semidefinite, a lower bound on the true
        magnitude), its diagonal made steeper where the secant slope observed since
        ``previous`` is (:func:`secant_correction`), so the step errs short."""
        lam = np.asarray(lam, dtype=np.float64)
        gaps = np.atleast_1d(np.asarray(gaps, dtype=np.float64))
        d = lam[0::2] - lam[1::2]
        jac = np.atleast_2d(np.asarray(jac, dtype=np.float64))
        steeper = secant_correction(d, gaps, jac, previous)
        r, free = newton_residual(d, gaps, epsilon, c)
        new = d.copy()
        if free.any():
            M = (jac + np.diag(steeper) - c * np.eye(len(d)))[np.ix_(free, free)]
            new[free] = d[free] - np.linalg.solve(M, r[free])
        return constraint.project(split(not_across_zero(d, new)))

    def past_bound(self, lam: np.ndarray, step: np.ndarray, constraint: ConstraintSet) -> np.ndarray:
        """The gradient ``step`` from a weight bound, moving each d_c by at most
        ``past_bound_share`` of its bounds' width. Past the bound some rows' weights are <= 0,
        so their loss is held only by μ: on a small group the gap can then grow far beyond ε,
        and β times that gap would carry d across both bounds, further each round. A moderate
        gap's step is returned as it is."""
        lo, hi = constraint.weight_bounds()
        d, d_new = lam[0::2] - lam[1::2], step[0::2] - step[1::2]
        limit = self.past_bound_share * (hi - lo)
        moved = np.clip(d_new - d, -limit, limit)
        if np.array_equal(moved, d_new - d):
            return step
        return split(d + moved)


def secant_correction(d: np.ndarray, gaps: np.ndarray, jac: np.ndarray, previous: Previous | None) -> np.ndarray:
    """What to add to J's diagonal so that it is as steep as the secant slope of each gap
    observed since ``previous = (d, gaps)`` (0 where the subspace's J is steeper already)."""
    slope = np.diag(jac)
    steeper = np.zeros(len(d))
    if previous is not None:
        d_prev, gaps_prev = (np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in previous)
        moved = np.abs(d - d_prev) > 0
        secant = np.where(moved, (gaps - gaps_prev) / np.where(moved, d - d_prev, 1.0), 0.0)
        steeper = np.minimum(secant - slope, 0.0)
    return steeper
