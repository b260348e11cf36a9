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
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, jvp, vjp

#: Conjugate-gradient steps per direction. Each costs one forward- and one reverse-mode pass
#: over the party's rows; the search over the direction and the last moves makes up for a
#: direction that is not the exact Gauss–Newton one (the moves act as conjugate directions).
CG_STEPS = 10


class GaussNewton:
    """One party's torch model seen as a function of its flat parameter vector θ_k on rows ``x``."""

    def __init__(self, model: nn.Module, x: np.ndarray) -> None:
        self.model = model
        self.names = [n for n, _ in model.named_parameters()]
        self.shapes = [p.shape for _, p in model.named_parameters()]
        self.dtype = next(model.parameters()).dtype
        self.x = torch.from_numpy(np.ascontiguousarray(x)).to(self.dtype)

    def flat(self) -> np.ndarray:
        """θ_k as one float64 vector, in ``named_parameters`` order."""
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()]).to(torch.float64).numpy()

    def set_flat(self, theta: np.ndarray) -> None:
        """θ_k from one vector (the inverse of :meth:`flat`)."""
        with torch.no_grad():
            for p, part in zip(self.model.parameters(), self._split(torch.from_numpy(theta)), strict=True):
                p.copy_(part.to(self.dtype))

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        out, at = [], 0
        for shape in self.shapes:
            size = int(np.prod(shape)) if len(shape) else 1
            out.append(flat[at:at + size].reshape(shape))
            at += size
        return out

    def _fn(self, x: torch.Tensor):
        def f(flat: torch.Tensor) -> torch.Tensor:
            return functional_call(self.model, dict(zip(self.names, self._split(flat), strict=True)), (x,))
        return f

    def _theta(self) -> torch.Tensor:
        return torch.from_numpy(self.flat()).to(self.dtype)

    def images(self, directions: np.ndarray, x: np.ndarray | None = None) -> np.ndarray:
        """J_k d_j for each column d_j of ``directions`` (P × w): n × w, float64 (``x``: other rows)."""
        rows = self.x if x is None else torch.from_numpy(np.ascontiguousarray(x)).to(self.dtype)
        f, theta = self._fn(rows), self._theta()
        cols = [jvp(f, (theta,), (torch.from_numpy(np.ascontiguousarray(d)).to(self.dtype),))[1]
                for d in np.asarray(directions, dtype=np.float64).T]
        return torch.stack(cols, dim=1).to(torch.float64).numpy() if cols else np.zeros((rows.shape[0], 0))

    def direction(self, nu: np.ndarray | None, h: np.ndarray, mu: float, *, xt_nu: np.ndarray | None = None,
                  steps: int = CG_STEPS) -> np.ndarray:
        """s ≈ −(Jᵀ diag(h) J + μI)⁻¹ (Jᵀν + μθ) by ``steps`` conjugate-gradient steps from 0.

        CG from 0 takes the gradient first, so even one step is a descent direction of the
        Gauss–Newton model (μ > 0 or h > 0 on the rows that move); more steps bend it toward
        the block's Newton direction. ``xt_nu``: Jᵀν where the party holds that but not ν."""
        f, theta = self._fn(self.x), self._theta()
        _, pull = vjp(f, theta)
        hh = torch.from_numpy(np.asarray(h, dtype=np.float64)).to(self.dtype)

        def hess(v: torch.Tensor) -> torch.Tensor:
            jv = jvp(f, (theta,), (v,))[1]
            return pull(hh * jv)[0] + mu * v

        grad = (torch.from_numpy(np.asarray(xt_nu, dtype=np.float64)).to(self.dtype) if xt_nu is not None
                else pull(torch.from_numpy(np.asarray(nu, dtype=np.float64)).to(self.dtype))[0]) + mu * theta
        s = torch.zeros_like(theta)
        r = -grad
        p = r.clone()
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
        if not bool(s.any()):  # no curvature along the gradient (h = 0 and μ = 0): the gradient step
            s = r
        return s.to(torch.float64).numpy()
