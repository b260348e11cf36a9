"""Opt-in recording of what a passive party receives, on the party's own side.

With run config ``privacy.record-view = "<dir>"`` every passive party writes the ν it was sent
to ``<dir>/party-<partition id>/nu-r<round>.npy`` (float32) for rounds 1..``privacy.record-first``
(default 10) and every
``privacy.record-every``-th round after. Nothing is sent anywhere: this is the honest-but-
curious party's own transcript, the input of ``python -m fairvfl_flwr.tools.audit``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from flwr.app import Message

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.party import PartyRuntime, round_of

EARLY_ROUNDS = 10


def should_record(server_round: int, every: int, first: int = EARLY_ROUNDS) -> bool:
    return 1 <= server_round <= first or (every > 0 and server_round % every == 0)


def record(folder: str, partition_id: int, server_round: int, every: int, nu: np.ndarray,
           first: int = EARLY_ROUNDS) -> None:
    if not folder or not should_record(server_round, every, first):
        return
    out = Path(folder) / f"party-{partition_id}"
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / f"nu-r{server_round:06d}.npy", nu.astype(np.float32))


def record_ciphertext(folder: str, partition_id: int, server_round: int, every: int, blobs: list[bytes],
                      first: int = EARLY_ROUNDS) -> None:
    """Under privacy.secure-nu='ckks' a passive party receives only ciphertexts: record those bytes."""
    if not folder or not should_record(server_round, every, first):
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


def record_mod(message: Message, context, call_next) -> Message:
    """ClientApp mod: write the passive party's transcript of what it received
    (plain ν, or the ciphertext under encrypted ν)."""
    reply = call_next(message, context)
    mtype = message.metadata.message_type
    if mtype not in (msgs.TRAIN_PASSIVE, msgs.TRAIN_PASSIVE_ENC, msgs.NEWTON_PASSIVE) or reply.has_error():
        return reply
    rt = PartyRuntime(context)
    if not rt.cfg.record_view:
        return reply
    server_round = round_of(message)[0]
    payload = message.content.array_records[msgs.PAYLOAD]
    if msgs.second_leg(mtype, payload):  # encrypted ν: its first leg was recorded
        return reply
    if mtype in (msgs.TRAIN_PASSIVE, msgs.NEWTON_PASSIVE):
        record(rt.cfg.record_view, rt.data.partition_id, server_round, rt.cfg.record_every, payload["nu"].numpy(),
               rt.cfg.record_first)
    else:  # the honest-but-curious transcript: ciphertext is all there is to record
        keys = sorted(payload, key=lambda k: int(k.rsplit("-", 1)[1]))
        blobs = [payload[k].numpy().tobytes() for k in keys]
        record_ciphertext(rt.cfg.record_view, rt.data.partition_id, server_round, rt.cfg.record_every, blobs,
                          rt.cfg.record_first)
    return reply
