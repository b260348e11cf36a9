"""Checkpoints and resume: the server's state in its run folder, each party's on its own disk.

Server (``<run folder>/checkpoint.npz``, rewritten every ``reliability.checkpoint-every`` rounds by
write-then-rename): the round, the run config, a fingerprint of the server's labels and the
server's ``state_dict``: everything a round changes (λ, the history, the held logits or
their masked sums, the stop rule's count, an algorithm's own state such as block Newton's
step lengths and last moves), keyed by partition id (node ids change when a SuperNode
restarts). :class:`Checkpoints` is the round hook that writes it and, with
``reliability.resume-from``, restores it.

Parties: the same files a rejoin restores from (flower/store.py), written on the checkpoint
rounds, keyed by a hash of the settings that determine θ (:func:`~fairvfl_flwr.flower.store.run_key`),
so a resumed run, a new Flower run, finds them. A resume is a rejoin of every party at once:
without secure aggregation each party restores round r on ``query.rejoin``; under it the
key set-up that opens the resumed run is a rollback every party signs
(secure/agreement.py), so a resumed masked or block-Newton run continues bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import time
from logging import INFO
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.data.partydata import write_atomically
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.hooks import Recovery, RoundHook
from fairvfl_flwr.flower.store import OPERATIONAL, run_key
from fairvfl_flwr.flower.records import config_records

SERVER_FILE = "checkpoint.npz"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, damaged, or belongs to another run."""


def labels_fingerprint(labels: Any) -> str:
    """SHA-256 over the server's row-id digest, labels and groups."""
    h = hashlib.sha256(str(labels.ids_digest).encode())
    for a in (labels.y_train, labels.s_train, labels.y_test, labels.s_test):
        arr = np.ascontiguousarray(a)
        h.update(str(arr.dtype).encode() + str(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


# -- server ---------------------------------------------------------------------------
def save_server(folder: Path, meta: dict, state: dict) -> Path:
    """``meta``: JSON-able (round, config, fingerprint, ...); ``state``: the server's ``state_dict``,
    pickled: it holds the algorithm's own objects exactly (a resumed run continues bit for bit).
    The server's own file in its own run folder; only its operator's resume-from reads it back."""
    blob = np.frombuffer(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
    path = Path(folder) / SERVER_FILE
    def write(fh) -> None:
        np.savez(fh, meta=np.array(json.dumps(meta)), state=blob)
        fh.flush()
        os.fsync(fh.fileno())

    write_atomically(path, write)
    return path


def load_server(folder: Path | str) -> tuple[dict, dict]:
    """The server's checkpoint in ``folder``: its meta and state, refused naming the folder when
    there is none or it cannot be read."""
    path = Path(folder).expanduser() / SERVER_FILE
    if not path.exists():
        raise CheckpointError(f"reliability.resume-from={str(folder)!r}: no {SERVER_FILE} in that folder "
                              "(was the run started with reliability.checkpoint-every > 0?)")
    try:
        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(str(f["meta"]))
            state = pickle.loads(f["state"].tobytes())  # noqa: S301  (the server's own file, see save_server)
    except Exception as exc:  # noqa: BLE001  (a damaged file is reported, never half-used)
        raise CheckpointError(f"{path} cannot be read (written by another version, or damaged): {exc}") from exc
    return meta, state


# -- the server's hook ----------------------------------------------------------------
class Checkpoints(RoundHook):
    """Write the server's state every ``every`` rounds (and round 0); restore ``resume``.

    ``resume``: (meta, state) from :func:`load_resume`, or None; ``masked``: the run is under
    secure aggregation, whose signed set-up moves the parties back (secure/agreement.py); the
    others are sent ``query.rejoin``.
    """

    needs = ("recovery",)  # it saves the server's state and loads it back on resume

    def __init__(self, folder: Path, every: int, config: Mapping[str, Any], fingerprint: str,
                 resume: tuple[dict, dict] | None = None, masked: bool = False) -> None:
        self.folder = Path(folder)
        self.masked = masked
        self.every = every
        self.config = dict(config)
        self.fingerprint = fingerprint
        self.resume = resume
        self.last_checkpoint: int | None = int(resume[0]["round"]) if resume else None

    def begin(self, server: Recovery, grid: Grid, timeout: float) -> int | None:
        """On resume: every party returns to its state of the checkpoint's round from its own disk
        (unmasked: on ``query.rejoin``; masked: it already did, at the signed set-up), the server to
        its own; the run continues after that round."""
        if self.resume is None:
            return None
        meta, state = self.resume
        r = int(meta["round"])
        log(INFO, "FairVFL: resuming from round %d (%s): every party restores that round from its own disk",
            r, self.folder)
        missing = sorted(set(int(p) for p in meta["parties"]) - {n.partition_id for n in server.nodes.values()})
        if missing:
            raise CheckpointError(f"reliability.resume-from={str(self.folder)!r}: the checkpoint holds parties "
                                  f"{missing} that did not join this run")
        if not self.masked:
            messages = [Message(RecordDict({msgs.ROUND: msgs.round_config(r, False)}), dst_node_id=nid,
                                message_type=msgs.REJOIN, group_id=f"resume-{r}") for nid in server.nodes]
            for reply in server.exchange(grid, messages, timeout):
                got = config_records(reply.content)["info"].get("round")
                if got != r:
                    raise FederationError(f"{server.who(reply.metadata.src_node_id)} restored round {got}, the "
                                          f"checkpoint is of round {r}; refused")
        server.load_state_dict(state)
        self.last_checkpoint = r
        return r + 1

    def end(self, server: Recovery, grid: Grid, server_round: int, timeout: float) -> None:
        """Save the server's checkpoint every ``every`` rounds (the parties save theirs on the same rounds)."""
        if self.every > 0 and server_round % self.every == 0:
            self.save(server)

    def save(self, server: Recovery) -> None:
        """Write the server's state, the run config and the labels' fingerprint, so a resume can refuse
        another run's checkpoint."""
        state = server.state_dict()
        meta = {"round": int(state["round"]), "config": self.config, "fingerprint": self.fingerprint,
                "run-key": run_key(self.config), "saved-at": time.time(),
                "parties": sorted(n.partition_id for n in server.nodes.values())}
        save_server(self.folder, meta, state)
        self.last_checkpoint = meta["round"]

    def stopped(self, server: Recovery, exc: BaseException) -> str | None:
        """Where the last checkpoint is and how to continue from it, for the stop line."""
        if self.last_checkpoint is None:
            return None
        where = f"last checkpoint: round {self.last_checkpoint} in {self.folder / SERVER_FILE}"
        return f"{where}; continue with reliability.resume-from=\"{self.folder}\""


def load_resume(cfg, labels, folder: str | Path) -> tuple[dict, dict]:
    """Read ``reliability.resume-from`` and check it fits this run (same θ-relevant config and labels)."""
    meta, state = load_server(folder)
    where = f"reliability.resume-from={str(folder)!r}"
    old, new = meta["config"], cfg.to_flower()
    for key in sorted(set(old) | set(new)):
        if key in OPERATIONAL:
            continue
        if old.get(key) != new.get(key):
            raise CheckpointError(
                f"{where}: run config {key}={new.get(key)!r} differs from the checkpoint's "
                f"{old.get(key)!r}; only {', '.join(sorted(OPERATIONAL))} may change when resuming"
            )
    if meta["fingerprint"] != labels_fingerprint(labels):
        raise CheckpointError(f"{where}: the server's labels differ from the checkpointed run's")
    if int(meta["round"]) >= cfg.num_server_rounds:
        raise CheckpointError(
            f"{where}: the checkpoint is at round {meta['round']}, "
            f"num-server-rounds={cfg.num_server_rounds} leaves nothing to run"
        )
    return meta, state
