"""Gaussian noise on ν (run config ``privacy.nu-noise``), a ν channel on the server.

ν + N(0, (nu-noise / n)²) per row: the scale of ν itself is about 1/n. A defence
against reading labels off sign(ν) (see the audit); no formal differential-privacy
guarantee is claimed. The noise is zero-mean, so it averages out in a passive party's
gradient X_kᵀν (its std there shrinks like 1/√n). Seeded by the run seed, the round and a
secret only the server holds (the fingerprint of its labels): a rerun draws the same
noise, but a passive party, which holds the run config and so the seed, cannot redraw it
and subtract it (with the run seed alone it could: the audit measures that attack).
"""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.flower.hooks import RoundHook, ServerView


class NuNoise(RoundHook):
    """Adds the noise to ν before any passive party receives it."""

    def __init__(self, scale: float, seed: int, secret: str = "") -> None:
        """``secret``: hex digits only the server knows; "" draws from the public seed alone."""
        self.scale = scale
        self.seed = seed
        self.secret = [int(secret, 16)] if secret else []

    def nu(self, server: ServerView | None, server_round: int, nu: np.ndarray) -> np.ndarray:
        """ν plus Gaussian noise of std nu-noise/n, drawn from the seed, the round (and the server's
        secret when set)."""
        rng = np.random.default_rng([self.seed, server_round, 0x6E75, *self.secret])
        return nu + rng.normal(scale=self.scale / len(nu), size=nu.shape)
