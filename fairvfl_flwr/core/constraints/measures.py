"""What a gap compares (run-config key ``constraint-measure``): per-row values q_i whose
group means the constraints hold within ε.

* ``loss`` (the paper): q_i = l_i, the logistic loss; then ν_i = w_i o_i with the signed row
  weight w_i = 1/n + m_i (core/objective.py);
* ``rate``: q_i = σ(z_i/τ), the soft positive prediction at temperature τ (1 unless sharpened), so a gap over label-y rows is a smooth
  true/false-positive-rate gap (the quantity DFN/DFP measure with a hard threshold); then
  ν_i = o_i/n + m_i σ'(z_i).

Each measure answers what the dual step, Newton and label DP ask of it, so no caller
branches on the measure's name.
"""

from __future__ import annotations

import numpy as np


def logistic_loss(y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Per-row ``log(1 + exp(-y z))``, computed without overflow."""
    return np.logaddexp(0.0, -y * z)


def loss_derivative(y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Per-row ``o_i = dl/dz_i = -y_i * sigmoid(-y_i z_i)``."""
    # sigmoid(m) = (1 + tanh(m/2)) / 2 stays finite for any m
    return -y * 0.5 * (1.0 + np.tanh(-0.5 * y * z))


def sigmoid(z: np.ndarray) -> np.ndarray:
    """σ(z) = 1 / (1 + exp(−z)), written with tanh so that it stays finite for any z."""
    return 0.5 * (1.0 + np.tanh(0.5 * z))


class Measure:
    """The per-row value q_i a gap compares, and what follows from it.

    Every gap is D_c = (1/|A_c|) Σ_{i∈A_c} q_i − (1/|B_c|) Σ_{i∈B_c} q_i; a measure gives q_i,
    its slope in z_i, ν and the curvature for the signed row weights, and label DP's bounds.
    """

    name = ""
    #: max |dq_i/dz_i| (label DP: how far one row's weight change moves ν)
    slope_bound = 1.0
    #: Does the primal need every row weight w_i >= 0? (For the loss, w_i < 0 makes f̃
    #: concave and unbounded below in those rows' logits; ConstraintSet.weight_bounds.)
    needs_nonnegative_weights = False

    def values(self, y: np.ndarray, z: np.ndarray, losses: np.ndarray | None = None) -> np.ndarray:
        """q_i at scores z (``losses``: the rows' logistic losses, when the caller has them)."""
        raise NotImplementedError

    #: Does :meth:`hard_values` give the hard prediction's values?
    hard = False

    def hard_values(self, y: np.ndarray, z: np.ndarray) -> np.ndarray | None:
        """q_i of the hard prediction, whose gaps are what fairlearn reports; None where the
        measure has none (a gap in mean loss is not a rate)."""
        return None

    def slope(self, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        """dq_i/dz_i."""
        raise NotImplementedError

    def bend(self, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        """d²q_i/dz_i² (a Taylor model of the gaps in z: core/constraints/cells.EncryptedConstraint.taylor)."""
        raise NotImplementedError

    def nu(self, y: np.ndarray, z: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
        """ν = ∂f̃/∂z from the signed row weights w = 1/n + m."""
        raise NotImplementedError

    def curvature(self, y: np.ndarray, z: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
        """φ''(z_i) clipped at 0 (ConstraintSet.curvature)."""
        raise NotImplementedError

    def row_bound(self, n: int, weight_bound: float) -> float:
        """Label DP: the bound on |Δν_j| of the flipped row j when |m_j| <= ``weight_bound``."""
        raise NotImplementedError


class Loss(Measure):
    """The paper's measure: q_i = l_i = log(1 + exp(−y_i z_i)), the row's logistic loss.

    dq_i/dz_i = o_i, so ν_i = w_i o_i with w_i = 1/n + m_i, and φ''_i = w_i σ'(z_i): rows
    whose weight is pushed below 0 make f̃ concave there, hence ``needs_nonnegative_weights``.
    """

    name = "loss"
    needs_nonnegative_weights = True

    def values(self, y, z, losses=None):
        """l_i = log(1 + exp(−y_i z_i)), or ``losses`` when the caller computed them already."""
        return logistic_loss(y, z) if losses is None else losses

    def slope(self, y, z):
        """dl_i/dz_i = o_i = −y_i σ(−y_i z_i)."""
        return loss_derivative(y, z)

    def bend(self, y, z):
        """d²l_i/dz_i² = σ'(z_i), whatever the label."""
        p = sigmoid(z)
        return p * (1.0 - p)

    def nu(self, y, z, w, n):
        """ν_i = w_i o_i: the row's weight times its loss slope."""
        return w * loss_derivative(y, z)

    def curvature(self, y, z, w, n):
        """max(w_i, 0) σ'(z_i): a row whose weight is pushed below 0 adds no curvature."""
        p = sigmoid(z)
        return np.maximum(w, 0.0) * (p * (1.0 - p))

    def row_bound(self, n, weight_bound):
        # o_j(+1) and o_j(−1) have opposite signs and |o_j(+1)| + |o_j(−1)| = 1
        """1/n + the weight bound: o_j changes by at most 1 when the label flips."""
        return 1.0 / n + weight_bound


class Rate(Measure):
    """q_i = σ(z_i / τ), the soft positive prediction: a gap over the rows of one label is a
    smooth true-positive (y = +1) or false-positive (y = −1) rate gap.

    The temperature τ (1 unless the stop rule sharpens it, core/stopping.py) sets how close the
    smooth rate is to the hard one 1[z ≥ 0]. dq_i/dz_i = σ'(z_i/τ)/τ <= 1/(4τ), so
    ν_i = o_i/n + m_i σ'(z_i/τ)/τ; the constraint term is bounded in z, so no weight bound is
    needed.
    """

    name = "rate"
    hard = True

    def __init__(self, temperature: float = 1.0) -> None:
        if not 0.0 < temperature <= 1.0:
            raise ValueError(f"a rate's temperature must be in (0, 1], got {temperature!r}")
        self.temperature = float(temperature)
        self.slope_bound = 0.25 / self.temperature  # σ' <= 1/4

    def values(self, y, z, losses=None):
        """q_i = σ(z_i/τ), whatever the label."""
        return sigmoid(z / self.temperature)

    def hard_values(self, y, z):
        """1[z_i ≥ 0]: the prediction core/metrics.predict makes (z = 0 counts as positive)."""
        return (np.asarray(z) >= 0).astype(np.float64)

    def slope(self, y, z):
        """σ'(z_i/τ)/τ, at most 1/(4τ)."""
        p = sigmoid(z / self.temperature)
        return p * (1.0 - p) / self.temperature

    def bend(self, y, z):
        """σ''(z_i/τ)/τ²."""
        p = sigmoid(z / self.temperature)
        return p * (1.0 - p) * (1.0 - 2.0 * p) / self.temperature ** 2

    def nu(self, y, z, w, n):
        """ν_i = o_i/n + m_i σ'(z_i/τ)/τ: the loss term's slope plus the multiplier weight's rate slope."""
        return loss_derivative(y, z) / n + (w - 1.0 / n) * self.slope(y, z)

    def curvature(self, y, z, w, n):
        """The second derivative of f̃ in z_i, o_i'/n + m_i σ''(z_i/τ)/τ², clipped at 0."""
        p0 = sigmoid(z)
        p = sigmoid(z / self.temperature)
        rate = p * (1.0 - p) * (1.0 - 2.0 * p) / self.temperature ** 2
        return np.maximum(p0 * (1.0 - p0) / n + (w - 1.0 / n) * rate, 0.0)

    def row_bound(self, n, weight_bound):
        # |Δo_j|/n + |Δm_j| σ'/τ, with m_j moving between ±weight_bound and σ' <= 1/4
        """1/n + the weight bound / (2τ): Δo_j/n plus |Δm_j| σ'/τ with σ' <= 1/4."""
        return 1.0 / n + weight_bound / (2.0 * self.temperature)


MEASURE_TYPES: dict[str, type[Measure]] = {m.name: m for m in (Loss, Rate)}
MEASURES = tuple(MEASURE_TYPES)


def measure(name: str, temperature: float = 1.0) -> Measure:
    """The measure named ``name`` (run config ``constraint-measure``), or a clear refusal; a rate
    at ``temperature`` (a measure without one takes none)."""
    if name not in MEASURE_TYPES:
        raise ValueError(f"unknown constraint measure {name!r}: choose one of {', '.join(MEASURES)}")
    return MEASURE_TYPES[name](temperature) if temperature != 1.0 else MEASURE_TYPES[name]()
