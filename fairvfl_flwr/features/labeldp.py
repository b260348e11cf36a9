"""Label differential privacy on ν (run config ``privacy.label-dp-*``), a ν channel on the server.

Each round the server adds Gaussian noise N(0, σ² I) to ν before any passive party
receives it, with σ = (noise multiplier) × Δ, Δ a bound on the L2 change of that round's
ν when one training label flips, and the noise multiplier chosen so that the run's
``num-server-rounds`` releases compose to the target (ε, δ) under Opacus's RDP
accountant. docs/privacy.md ("Label DP") states what this covers and what it does not.

The sensitivity, given the round's scores z and multipliers λ (loss measure, ν_i =
w_i o_i; rate measure, ν_i = o_i/n + m_i σ'(z_i)), with λ clipped to [0, Λ] so that
|λ_c+ − λ_c−| ≤ Λ, and m a public lower bound on every constraint group's size (of the
data and of any neighbour):

* row j itself: |w_i| ≤ W = 1/n + PΛ/m for every row, P the gap sides a row sits on
  (1 with two groups; G − 1 for G groups pairwise, G + 1 against the overall rate), and
  o_j(+1), o_j(−1) have opposite signs with |o_j(+1)| + |o_j(−1)| = 1, so |Δν_j| ≤ W;
  rate measure: |Δo_j|/n + |Δm_j| σ' ≤ 1/n + (2PΛ/m)/4;
* the other rows of a row set the flip enters or leaves (its size a becomes a ± 1): their
  weight moves by at most P_M Λ·|1/a − 1/(a±1)| ≤ P_M Λ/(a(a+1)) at the smaller size a ≥ m
  (P_M the gaps using that set), on at most a rows, times |o_i| ≤ 1 (rate: σ' ≤ 1/4), so by
  at most g P_M Λ/(√m (m + 1)) in L2 (g = 1, rate 1/4). Within one label subset the sets
  a flip changes add up to P (triangle inequality); the subsets a label decides (deo 1,
  equalized-odds 2, demographic-parity 0) hold disjoint rows, so k = subsets × P²;
* other rows' o_i do not depend on y_j (z is fixed).

So Δ = sqrt(r² + k g² Λ² / (m (m + 1)²)), r the row term (:func:`label_sensitivity`, from
what the constraint object and its measure say: the kind's ``label_subsets``, the gap
sides per row, the measure's ``row_bound`` and ``slope_bound``). tests/test_labeldp.py
checks it by flipping labels.

Noise keyed on a fresh random secret the server draws at start, not on the labels'
fingerprint (as ``privacy.nu-noise`` is): a DP adversary knows every label but one, so
it could compute both candidate fingerprints and redraw the noise for each.
"""

from __future__ import annotations

import importlib
import math
import secrets
from logging import INFO

import numpy as np
from flwr.supercore import log

from fairvfl_flwr.core.constraints import ConstraintSet, gaps_per_row
from fairvfl_flwr.core.constraints.measures import measure
from fairvfl_flwr.core.errors import ConfigError
from fairvfl_flwr.flower.hooks import RoundHook, ServerView

__all__ = ["HIGH_ORDERS", "LabelDP", "epsilon_spent", "flipped_masks", "label_sensitivity", "noise_multiplier_for",
           "sensitivity"]


def _accountants():
    """Opacus's accountants, imported on first use only: opacus imports torch, which a run
    without label DP (and every linear ClientApp) must not pay for."""
    return importlib.import_module("opacus.accountants"), importlib.import_module("opacus.accountants.utils")


def _alphas(acc) -> list[float]:
    # Opacus's default RDP orders stop at 63; at the large noise multipliers of many
    # full-batch rounds the best order is higher, and stopping early overstates ε.
    return [*acc.RDPAccountant.DEFAULT_ALPHAS, *HIGH_ORDERS]


#: RDP orders added to Opacus's defaults (see :func:`_alphas`).
HIGH_ORDERS = (80, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192)


def epsilon_spent(noise_multiplier: float, steps: int, delta: float, sample_rate: float = 1.0) -> float:
    """ε after ``steps`` Gaussian releases at ``noise_multiplier`` (Opacus's RDP accountant)."""
    if steps <= 0:
        return 0.0
    acc, _ = _accountants()
    accountant = acc.RDPAccountant()
    accountant.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    return float(accountant.get_epsilon(delta=delta, alphas=_alphas(acc)))


def noise_multiplier_for(epsilon: float, delta: float, steps: int, sample_rate: float = 1.0) -> float:
    """The smallest noise multiplier whose ``steps`` releases spend at most ``epsilon`` (Opacus's search)."""
    acc, utils = _accountants()
    return float(utils.get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate,
                                            steps=steps, accountant="rdp", alphas=_alphas(acc)))


def smallest_group(constraint: ConstraintSet) -> int:
    """The smallest row set any of the constraint's gaps compares: the data's bound on m."""
    return min(min(c.size_a, c.size_b) for c in constraint.gap_list)


def flipped_masks(constraint: ConstraintSet) -> int:
    """Σ over the subsets a label flip changes of (gap sides the row's group mask feeds)²:
    1 for DEO with two groups, 2 for equalized odds, 0 for demographic parity."""
    return constraint.label_subsets * gaps_per_row(constraint) ** 2


def label_sensitivity(constraint: ConstraintSet, lambda_bound: float, min_group: int) -> float:
    """Δ: the L2 bound on one round's change of ν when one training label flips, with
    |λ_c+ − λ_c−| <= ``lambda_bound`` and every gap side of at least ``min_group`` rows."""
    return sensitivity(constraint.n, lambda_bound, min_group, flipped_masks(constraint), constraint.measure,
                       gaps_per_row(constraint))


def sensitivity(n: int, lambda_bound: float, min_group: int, flipped_groups: int, measure_name: str = "loss",
                row_gaps: int = 1) -> float:
    """Δ = sqrt(r² + k g² Λ² / (m (m + 1)²)): r the flipped row's own bound (its weight sits on
    ``row_gaps`` gap sides of >= m rows), k = ``flipped_groups``, g the measure's max slope."""
    if min_group < 1:
        raise ValueError(f"the public lower bound on the group sizes must be >= 1, got {min_group}")
    m = float(min_group)
    q = measure(measure_name)
    row = q.row_bound(n, row_gaps * lambda_bound / m)
    return math.sqrt(row * row + flipped_groups * (q.slope_bound * lambda_bound) ** 2 / (m * (m + 1.0) ** 2))


class LabelDP(RoundHook):
    """Clips λ to [0, Λ], recomputes ν there, adds the calibrated noise; records the ε spent.

    ``min_group``: the public lower bound m on the group sizes; 0 takes the data's
    smallest group minus one (the group sizes are then treated as public).
    ``secret``: the noise key (tests); None draws 32 fresh bytes from the OS.
    """

    def __init__(self, constraint: ConstraintSet, *, epsilon: float, delta: float, rounds: int,
                 lambda_bound: float, min_group: int = 0, fairness: bool = True, secret: bytes | None = None) -> None:
        self.n = constraint.n
        self.epsilon, self.delta, self.rounds = float(epsilon), float(delta), int(rounds)
        self.lambda_bound = float(lambda_bound) if fairness else 0.0
        actual = smallest_group(constraint)
        if min_group > actual:
            raise ConfigError(f"run config privacy.label-dp-min-group={min_group}: the data's smallest constraint group has "
                             f"{actual} rows; set a bound <= {actual} (0: the data's smallest group - 1)")
        self.min_group = int(min_group) if min_group > 0 else actual - 1
        self.sensitivity = label_sensitivity(constraint, self.lambda_bound, self.min_group)
        self.noise_multiplier = noise_multiplier_for(self.epsilon, self.delta, self.rounds)
        self.sigma = self.noise_multiplier * self.sensitivity
        self.secret = secrets.token_bytes(32) if secret is None else bytes(secret)
        self.released = 0  # rounds whose ν went out with this noise
        log(INFO, "FairVFL: label DP, (%.3g, %.3g) over %d rounds: lambda clipped to [0, %g], groups >= %d rows, "
            "sensitivity %.3g, noise multiplier %.4g, noise std %.3g (n x std = %.3g)", self.epsilon, self.delta,
            self.rounds, self.lambda_bound, self.min_group, self.sensitivity, self.noise_multiplier, self.sigma,
            self.n * self.sigma)

    def noise(self, server_round: int, size: int) -> np.ndarray:
        """The Gaussian noise added to ν in ``server_round``: drawn from the server's secret and the
        round, so a re-sent or resumed round gets the same draw (one release per round)."""
        key = int.from_bytes(self.secret, "big")
        rng = np.random.default_rng(np.random.SeedSequence([key, server_round, 0x6C64]))
        return rng.normal(scale=self.sigma, size=size)

    def nu(self, server: ServerView, server_round: int, nu: np.ndarray) -> np.ndarray:
        """ν with the round's noise, after clipping λ to its public bound (ν's sensitivity, hence the
        guarantee, needs it)."""
        if np.any(server.lam > self.lambda_bound):
            # The bound on ν's sensitivity needs |λ_c+ − λ_c−| ≤ Λ; the clipped λ is the server's
            # λ from here on, so the dual ascent is projected onto [0, Λ].
            server.set_lambda(np.minimum(server.lam, self.lambda_bound))
            nu = server.constraint.masked_weights(server.labels.y_train, server.z("train"), server.lam)
        self.released = max(self.released, server_round)
        return nu + self.noise(server_round, len(nu))

    def spent(self, rounds: int | None = None) -> float:
        """ε of the first ``rounds`` releases (default: those released so far)."""
        return epsilon_spent(self.noise_multiplier, self.released if rounds is None else rounds, self.delta)

    def record(self, server: ServerView, server_round: int, row: dict) -> None:
        """The ε spent after ``server_round`` releases, in the history row (and the log in evaluation rounds)."""
        if server_round >= 1:
            row["dp_epsilon"] = self.spent(server_round)
            if server_round % server.cfg.eval_every == 0 or server_round == server.cfg.num_server_rounds:
                log(INFO, "[round %d] label DP: (epsilon, delta) = (%.4g, %.3g) spent on passive parties' nu",
                    server_round, row["dp_epsilon"], self.delta)

    def summary(self) -> dict:
        """The run's guarantee, under ``label_dp`` in summary.json."""
        return {"label_dp": {"epsilon": self.spent(), "delta": self.delta, "target_epsilon": self.epsilon,
                             "rounds": self.released, "noise_multiplier": self.noise_multiplier,
                             "sensitivity": self.sensitivity, "noise_std": self.sigma,
                             "lambda_bound": self.lambda_bound, "min_group": self.min_group,
                             "accountant": "opacus RDP"}}

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the noise secret and the releases made, with the settings they hold for."""
        return {"secret": self.secret.hex(), "released": self.released, "noise_multiplier": self.noise_multiplier,
                "sensitivity": self.sensitivity}

    def load_state_dict(self, state: dict) -> None:
        """Continue the releases from a checkpoint, refusing one made under another sensitivity or noise multiplier."""
        if not math.isclose(float(state["sensitivity"]), self.sensitivity) or not math.isclose(
                float(state["noise_multiplier"]), self.noise_multiplier):
            raise ValueError("label DP state of another setting (sensitivity or noise multiplier differ)")
        self.secret = bytes.fromhex(state["secret"])
        self.released = int(state["released"])
