"""A lying server against the registry's encrypted groups: how many rows' groups it isolates per round.

The server of jobs/encrypted_groups.py chooses the plaintext it multiplies each encrypted
group indicator by; the registry cannot see it. A lying server therefore asks for sums that
isolate rows instead of the gaps' sums:

* ``one-hot``: one row per sum (weight 1 on it, 0 elsewhere): the sum is 1[g_i] plus noise;
* ``packed``: b rows per sum at weights w·2^j (j = 0..b−1), each in a slot of its own, and no
  mask: the sum's binary digits above w are the b rows' indicators. w is the attacker's
  margin over the registry's noise (4σ, or 1 without noise), and the largest weight must
  stay within the slot bound the registry checks (2^17), or within CKKS's capacity where it
  does not check.

:func:`attack` spends one round's budget on such sums (each ciphertext carries two: its real
and imaginary part) and scores the decoded groups against the truth; the registry answers
with its real handler (through whatever grid the caller built). bench/registry_isolation.py
runs it with and without the registry's defences and writes the results page.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairvfl_flwr.features import ckks
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.jobs.encrypted_groups import SLOT_BOUND, GroupSums

#: The packed attack's margin: its smallest weight, in the registry's noise deviations.
MARGIN = 4.0


@dataclass(frozen=True)
class Outcome:
    """One round of a lying server's sums: the rows it aimed at, how many it decoded right, and the
    sums it got before the registry refused (``refused``: its reason, or "")."""

    strategy: str
    rows_per_sum: int
    sums: int
    attempted: int
    correct: int
    refused: str

    @property
    def accuracy(self) -> float:
        """The share of the attempted rows whose group the server decoded right."""
        return self.correct / self.attempted if self.attempted else float("nan")


def packed_weights(rows_per_sum: int, noise: float) -> np.ndarray:
    """The weights of a packed sum: the margin over the noise times 2^j."""
    base = MARGIN * noise if noise > 0 else 1.0
    return base * 2.0 ** np.arange(rows_per_sum)


def attack(oracle: GroupSums, truth: np.ndarray, rows_per_sum: int, sums: int, *, noise: float,
           server_round: int, group: int = 0, first_row: int = 0, per_request: int = 8) -> Outcome:
    """Ask for ``sums`` sums of round ``server_round`` (``per_request`` ciphertexts a message, two
    sums each), each over ``rows_per_sum`` rows not asked about before (from ``first_row``), and
    decode whether each row is in ``group``. ``noise``: the registry's declared deviation, which
    the attacker sizes its weights by. Stops at the registry's first refusal."""
    n = len(truth)
    G = len(oracle.names)
    weights = packed_weights(rows_per_sum, noise)
    base = weights[0]
    attempted = correct = got = 0
    row = first_row
    refused = ""
    cts = -(-sums // 2)
    for start in range(0, cts, per_request):
        batch = min(per_request, cts - start)
        P = np.zeros((2 * batch, G, n))
        aimed = []
        for k in range(2 * batch):
            rows = np.arange(row, min(row + rows_per_sum, n))
            row += len(rows)
            # one row a slot: row j of the sum sits in slot j of the chunk of its own row index
            P[k, group, rows] = weights[: len(rows)]
            aimed.append(rows)
        masks = np.zeros((batch, ckks.SLOTS), dtype=complex)
        try:
            totals = oracle.ask(oracle.products("train", P, masks), server_round)
        except FederationError as exc:
            refused = str(exc)
            break
        got += len(totals)
        for total, rows in zip(totals, aimed):
            digits = int(np.rint(total / base))
            bits = np.array([(digits >> j) & 1 for j in range(len(rows))], dtype=np.int64)
            attempted += len(rows)
            correct += int(np.sum(bits == (truth[rows] == group)))
        if row >= n:
            break
    return Outcome("one-hot" if rows_per_sum == 1 else "packed", rows_per_sum, got, attempted, correct, refused)


def capacity(noise: float, slot_bound: float = SLOT_BOUND) -> int:
    """The most rows a packed sum can aim at: weights from the margin over the noise (1 without
    noise) to the slot bound."""
    base = MARGIN * noise if noise > 0 else 1.0
    # strictly below the bound: CKKS's error on a slot at the bound would carry it over
    return max(int(np.ceil(np.log2(slot_bound / base))), 1)
