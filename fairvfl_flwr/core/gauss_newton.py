"""A Gauss–Newton block for a non-linear party (``model = "mlp"`` under ``optimizer = "newton"``).

Where a linear party's logits change by X_k d for a step d of θ_k, a non-linear party's
change *to first order* by J_k d, J_k = ∂u_k/∂θ_k (n × P). The party sends those images
J_k d_j exactly where a linear party sends X_k d_j, and the server's subspace search runs
unchanged on them (core/newton.py); the server then asks for the party's true new logits,
because u_k is not linear in θ_k across a step (algorithms/newton.py, docs/newton.md).

J_k is never formed (n × P floats for P of a few hundred): it is applied by forward-mode
(J v, :meth:`GaussNewton.images`) and reverse-mode (Jᵀ w) products, and the block's
direction solves the Gauss–Newton system (Jᵀ diag(h) J + μI) s = −(Jᵀν + μθ) by a few
conjugate-gradient steps (:meth:`GaussNewton.direction`): the linear party's
``block_direction`` with X_k replaced by J_k, the curvature h the same (PSD: h ≥ 0).

Numpy only, on the arrays of the torch MLP's ``state_dict`` (:class:`ReluNet`): a deployed
party answers each message in a fresh process, and importing torch (with the modules
``torch.func`` pulls in) costs several times what a Gauss–Newton round computes
(bench/party_cost.py). Both products reuse the activations of one forward pass at θ_k.
"""

from __future__ import annotations

import re

import numpy as np

#: Conjugate-gradient steps per direction. Each costs one forward- and one reverse-mode pass
#: over the party's rows; the search over the direction and the last moves makes up for a
#: direction that is not the exact Gauss–Newton one (the moves act as conjugate directions).
CG_STEPS = 10

#: Rows × directions per block of the forward-mode product (:meth:`GaussNewton.images`).
ROW_BLOCK = 16384

#: The keys of core/models.MLPModel's state_dict: its Linear layers ``net.<i>`` (ReLU between them).
LAYER_KEY = re.compile(r"net\.(\d+)\.(weight|bias)")


class ReluNet:
    """An MLP party's block as numpy arrays: the Linear layers of ``core/models.MLPModel`` with
    ReLU between them and a scalar output, read from and written as that model's ``state_dict``
    (so a party's kept state is the same whichever holds it). It evaluates the network and
    sets θ_k; it takes no gradient steps (those are the torch block's)."""

    def __init__(self, state: dict[str, np.ndarray]) -> None:
        found = {}
        for key, value in state.items():
            match = LAYER_KEY.fullmatch(key)
            if match is None:
                raise ValueError(f"an MLP block's state has Linear layers 'net.<i>.weight'/'.bias' only; got {key!r} "
                                 "(a step rule's state belongs to the torch block)")
            found[(int(match[1]), match[2] == "bias")] = np.array(value)  # a copy: θ_k changes here
        if not found:
            raise ValueError("an MLP block's state holds no layer")
        self.names = [f"net.{i}.{'bias' if bias else 'weight'}" for i, bias in sorted(found)]
        self.params = [found[k] for k in sorted(found)]
        self.layers = [(found[(i, False)], found.get((i, True))) for i in sorted({i for i, _ in found})]
        self.dtype = self.params[0].dtype

    def forward(self, x: np.ndarray) -> np.ndarray:
        """u_k on the rows of ``x``."""
        return self._activations(np.asarray(x, dtype=self.dtype))[-1][:, 0]

    def _activations(self, x: np.ndarray) -> list[np.ndarray]:
        """Each layer's input, then the output (n × 1): ReLU after every layer but the last."""
        acts = [x]
        for i, (w, b) in enumerate(self.layers):
            a = acts[-1] @ w.T
            if b is not None:
                a = a + b
            acts.append(a if i == len(self.layers) - 1 else np.maximum(a, 0))
        return acts

    def weights(self) -> dict[str, np.ndarray]:
        """θ_k by ``state_dict`` key (copies)."""
        return {name: p.copy() for name, p in zip(self.names, self.params, strict=True)}

    def state_dict(self) -> dict[str, np.ndarray]:
        """What the party keeps between rounds: θ_k (no step rule's state)."""
        return self.weights()

    def sq_norm(self) -> float:
        """‖θ_k‖², the party's share of the regulariser the server adds to F."""
        return float(sum(float(np.sum(p.astype(np.float64) ** 2)) for p in self.params))

    def gauss_newton(self, x: np.ndarray) -> GaussNewton:
        """This block as a function of its flat θ_k on rows ``x`` (docs/newton.md)."""
        return GaussNewton(self, x)


class GaussNewton:
    """One party's network seen as a function of its flat parameter vector θ_k on rows ``x``:
    θ_k in ``state_dict`` order, and the products of its Jacobian there."""

    def __init__(self, net: ReluNet, x: np.ndarray) -> None:
        self.net = net
        self.x = np.ascontiguousarray(x, dtype=net.dtype)
        self._at_theta()

    def _at_theta(self) -> None:
        """The forward pass at the current θ_k, which every product until the next :meth:`set_flat` reuses."""
        self.acts = self.net._activations(self.x)
        # where each hidden ReLU passes its input, as 1.0 / 0.0: a product with a boolean mask
        # converts the mask again at every product
        self.active = [(a > 0).astype(a.dtype) for a in self.acts[1:-1]]

    def logits(self) -> np.ndarray:
        """u_k at the current θ_k on the rows ``x`` (float64)."""
        return self.acts[-1][:, 0].astype(np.float64)

    def flat(self) -> np.ndarray:
        """θ_k as one float64 vector, in ``state_dict`` order."""
        return np.concatenate([p.reshape(-1) for p in self.net.params]).astype(np.float64)

    def set_flat(self, theta: np.ndarray) -> None:
        """θ_k from one vector (the inverse of :meth:`flat`)."""
        for p, part in zip(self.net.params, self._split(np.asarray(theta)), strict=True):
            p[...] = part
        self._at_theta()

    def _split(self, flat: np.ndarray) -> list[np.ndarray]:
        """``flat`` (P, or P × w) cut into the parameters' shapes (each with the trailing w)."""
        out, at = [], 0
        for p in self.net.params:
            out.append(flat[at:at + p.size].reshape(p.shape + flat.shape[1:]))
            at += p.size
        if at != flat.shape[0]:
            raise ValueError(f"θ_k has {at} entries, got a vector of {flat.shape[0]}")
        return out

    def _jvp(self, directions: np.ndarray) -> np.ndarray:
        """J_k D for the columns of D (P × w), in the network's dtype: n × w. By blocks of rows:
        a block's n × w × width temporaries stay in cache, where all rows' would be tens of MB
        that a fresh process first has to fault in."""
        n = self.x.shape[0]
        step = max(1, ROW_BLOCK // max(1, directions.shape[1]))
        parts = self._split(directions.astype(self.net.dtype, copy=False))
        return np.concatenate([self._jvp_rows(parts, directions.shape[1], slice(at, at + step))
                               for at in range(0, n, step)]) if n else np.zeros((0, directions.shape[1]))

    def _jvp_rows(self, parts: list[np.ndarray], w: int, rows: slice) -> np.ndarray:
        parts = iter(parts)
        tangent = None  # rows × w × width: the change of the layer's input (none for the features)
        last = len(self.net.layers) - 1
        for i, (weight, bias) in enumerate(self.net.layers):
            dw = next(parts)  # out × in × w
            out, inp = weight.shape
            moved = (self.acts[i][rows] @ dw.transpose(2, 0, 1).reshape(w * out, inp).T).reshape(-1, w, out)
            if tangent is not None:  # one product over every row and direction, not n small ones
                moved += (tangent.reshape(-1, inp) @ weight.T).reshape(-1, w, out)
            if bias is not None:
                moved += next(parts).T  # w × out
            tangent = moved if i == last else moved * self.active[i][rows, None, :]
        return tangent[:, :, 0]

    def vjp(self, g: np.ndarray) -> np.ndarray:
        """J_kᵀ g for one value per row: P, in the network's dtype."""
        grads = []
        upstream = g.astype(self.net.dtype, copy=False)[:, None]  # n × out: the gradient of the layer's output
        for i in range(len(self.net.layers) - 1, -1, -1):
            weight, bias = self.net.layers[i]
            layer = [(upstream.T @ self.acts[i]).reshape(-1)]
            if bias is not None:
                layer.append(upstream.sum(axis=0))
            grads = layer + grads
            if i:
                upstream = (upstream @ weight) * self.active[i - 1]
        return np.concatenate(grads)

    def images(self, directions: np.ndarray) -> np.ndarray:
        """J_k d_j for each column d_j of ``directions`` (P × w): n × w, float64."""
        directions = np.asarray(directions, dtype=np.float64)
        if directions.shape[1] == 0:
            return np.zeros((self.x.shape[0], 0))
        return self._jvp(directions).astype(np.float64)

    def direction(self, nu: np.ndarray | None, h: np.ndarray, mu: float, *, xt_nu: np.ndarray | None = None,
                  steps: int = CG_STEPS) -> np.ndarray:
        """s ≈ −(Jᵀ diag(h) J + μI)⁻¹ (Jᵀν + μθ) by ``steps`` conjugate-gradient steps from 0.

        CG from 0 takes the gradient first, so even one step is a descent direction of the
        Gauss–Newton model (μ > 0 or h > 0 on the rows that move); more steps bend it toward
        the block's Newton direction. ``xt_nu``: Jᵀν where the party holds that but not ν."""
        dtype = self.net.dtype
        theta = self.flat().astype(dtype)
        hh = np.asarray(h, dtype=np.float64).astype(dtype)

        def hess(v: np.ndarray) -> np.ndarray:
            return self.vjp(hh * self._jvp(v[:, None])[:, 0]) + mu * v

        grad = (np.asarray(xt_nu, dtype=np.float64).astype(dtype) if xt_nu is not None
                else self.vjp(np.asarray(nu, dtype=np.float64))) + mu * theta
        s = np.zeros_like(theta)
        r = -grad
        p = r.copy()
        rr = float(r @ r)
        stop = 1e-20 * max(rr, 1e-300)
        for _ in range(steps):
            hp = hess(p)
            curv = float(p @ hp)
            if not curv > 0:
                break
            step = rr / curv
            s = s + step * p
            r = r - step * hp
            new = float(r @ r)
            if new <= stop:
                break
            p = r + (new / rr) * p
            rr = new
        if not s.any():  # no curvature along the gradient (h = 0 and μ = 0): the gradient step
            s = r
        return s.astype(np.float64)
