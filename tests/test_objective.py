"""The key identity (docs/algorithm.md, Gradient identity): J_kᵀν + μθ_k equals autograd's ∇_{θ_k} f̃ on the whole problem."""

import numpy as np
import pytest
import torch

from fairvfl_flwr.core.constraints import from_labels
from fairvfl_flwr.core.models import build_model
from fairvfl_flwr.core.constraints.measures import loss_derivative, logistic_loss
from fairvfl_flwr.core.reference import lagrangian
from fairvfl_flwr.core.step import dual_step


def _problem(model: str, seed: int):
    rng = np.random.default_rng(seed)
    n, widths = 120, [4, 3, 5]
    blocks = [torch.from_numpy(rng.normal(size=(n, m))) for m in widths]
    y = rng.choice([-1.0, 1.0], size=n)
    s = rng.random(n) < 0.4
    models = [build_model(model, m, bias=k == 0 or model == "mlp", seed=seed + k) for k, m in enumerate(widths)]
    with torch.no_grad():  # move away from θ = 0 so every term matters
        for m in models:
            for p in m.parameters():
                p.add_(torch.from_numpy(rng.normal(scale=0.3, size=tuple(p.shape))))
    return blocks, y, s, models


def assert_gradient_identity(model: str, seed: int, kind: str = "deo", measure: str = "loss") -> None:
    """J_kᵀν + μθ_k equals autograd's ∇_{θ_k} f̃ on the centralised Lagrangian, every party k."""
    blocks, y, s, models = _problem(model, seed)
    constraint = from_labels(y, s, protected_label=1, kind=kind, measure=measure)
    lam = np.random.default_rng(seed).uniform(0, 2, size=constraint.num_multipliers)
    mu, eps, c = 2 / len(y), 0.01, 1e-3

    f = lagrangian(models, blocks, y, constraint, lam, eps, c, mu)
    f.backward()
    expected = [[p.grad.clone() for p in m.parameters()] for m in models]
    for m in models:
        m.zero_grad()

    with torch.no_grad():
        z = sum(m(x) for m, x in zip(models, blocks)).numpy()
    nu = constraint.masked_weights(y, z, lam)
    for k, (m, x) in enumerate(zip(models, blocks)):
        m(x).backward(torch.from_numpy(nu))
        for p, g in zip(m.parameters(), expected[k]):
            got = p.grad + mu * p.detach()
            assert torch.allclose(got, g, atol=1e-8, rtol=0), (k, (got - g).abs().max())


@pytest.mark.parametrize("model", ["linear", "mlp"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_passive_update_equals_autograd_gradient(model, seed):
    assert_gradient_identity(model, seed)


def test_loss_derivative_matches_finite_difference_and_is_stable():
    y = np.array([1.0, -1.0, 1.0, -1.0])
    z = np.array([0.3, -2.0, 5.0, 1.5])
    h = 1e-6
    fd = (logistic_loss(y, z + h) - logistic_loss(y, z - h)) / (2 * h)
    assert np.allclose(loss_derivative(y, z), fd, atol=1e-8)
    big = loss_derivative(np.array([1.0, -1.0]), np.array([-1e4, 1e4]))
    assert np.all(np.isfinite(big)) and np.allclose(big, [-1.0, 1.0])


def test_dual_step_projects_onto_nonnegative_orthant():
    lam = dual_step(np.zeros(2), gap=0.2, epsilon=0.05, beta=0.1, c=0.0)
    assert lam == pytest.approx([0.015, 0.0])  # λ2's ascent direction -D-ε < 0 is clipped
    lam = dual_step(np.array([0.5, 0.0]), gap=-0.2, epsilon=0.05, beta=1.0, c=0.0)
    assert lam == pytest.approx([0.25, 0.15])


def test_groups_refuse_empty_protected_group():
    with pytest.raises(ValueError, match="protected label"):
        from_labels(np.array([1, 1, -1]), np.array([True, True, False]), protected_label=1)
