"""Opt-in recording of what a passive party receives, on the party's own side.

With run config ``record-view = "<dir>"`` every passive party writes the ν it was sent
to ``<dir>/party-<partition id>/nu-r<round>.npy`` (float32) for rounds 1..10 and every
``record-every``-th round after. Nothing is sent anywhere: this is the honest-but-
curious party's own transcript, the input of ``python -m fairvfl_flwr.audit``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

EARLY_ROUNDS = 10


def should_record(server_round: int, every: int) -> bool:
    return 1 <= server_round <= EARLY_ROUNDS or (every > 0 and server_round % every == 0)


def record(folder: str, partition_id: int, server_round: int, every: int, nu: np.ndarray) -> None:
    if not folder or not should_record(server_round, every):
        return
    out = Path(folder) / f"party-{partition_id}"
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / f"nu-r{server_round:06d}.npy", nu.astype(np.float32))


def record_ciphertext(folder: str, partition_id: int, server_round: int, every: int, blobs: list[bytes]) -> None:
    """Under secure-nu='ckks' a passive party receives only ciphertexts: record those bytes."""
    if not folder or not should_record(server_round, every):
        return
    out = Path(folder) / f"party-{partition_id}"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"nu-ct-r{server_round:06d}.bin").write_bytes(b"".join(blobs))


def has_plaintext(folder: str | Path, partition_id: int) -> bool:
    return any((Path(folder) / f"party-{partition_id}").glob("nu-r*.npy"))


def load(folder: str | Path, partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, ν matrix rounds × rows) recorded by one party, in round order."""
    files = sorted((Path(folder) / f"party-{partition_id}").glob("nu-r*.npy"))
    if not files:
        raise FileNotFoundError(f"no recorded view in {Path(folder) / f'party-{partition_id}'}")
    rounds = np.array([int(re.search(r"r(\d+)", f.stem).group(1)) for f in files])
    return rounds, np.stack([np.load(f) for f in files])
