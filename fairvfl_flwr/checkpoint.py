"""Checkpoint files: the server's state in its run folder, each party's θ on its own disk.

Server (``<run folder>/checkpoint.npz``, rewritten every ``checkpoint-every`` rounds by
write-then-rename): round, multipliers λ, the history so far, the run config, a
fingerprint of the server's labels, and the last partial logits u_k of every party
(keyed by partition id: node ids change when a SuperNode restarts), with ‖θ_k‖² and
step counts. That is everything the strategy needs to continue exactly.

Party (``<checkpoint-dir>/<run key>/partition-<k>/round-<r>.pt``, same schedule, the
last :data:`KEEP` kept): its model's state dict. θ never leaves the party. The run key
is a hash of the settings that determine θ (every run-config key except the
operational ones in :data:`OPERATIONAL`), so a resumed run finds the files of the run it
continues without the server telling the parties anything beyond a round number.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

SERVER_FILE = "checkpoint.npz"
KEEP = 3  # party checkpoints kept per partition (the server's latest is always among them)
# Keys that do not change θ_r: they may differ between a run and its resumption.
OPERATIONAL = frozenset({
    "num-server-rounds", "round-timeout", "round-retries", "checkpoint-every", "checkpoint-dir",
    "resume-from", "output-dir", "eval-every", "record-view", "record-every", "server-labels", "csv-path",
})


class CheckpointError(RuntimeError):
    """A checkpoint is missing, damaged, or belongs to another run."""


def run_key(run_config: Mapping[str, Any]) -> str:
    """Hash of every θ-relevant run-config key (server and parties compute the same)."""
    items = {k: v for k, v in sorted(run_config.items()) if k not in OPERATIONAL}
    return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()[:16]


def labels_fingerprint(labels: Any) -> str:
    """SHA-256 over the server's row-id digest, labels and groups."""
    h = hashlib.sha256(str(labels.ids_digest).encode())
    for a in (labels.y_train, labels.s_train, labels.y_test, labels.s_test):
        arr = np.ascontiguousarray(a)
        h.update(str(arr.dtype).encode() + str(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# -- server ---------------------------------------------------------------------------
def save_server(folder: Path, state: dict, u_train: Mapping[int, np.ndarray]) -> Path:
    """``state``: JSON-able dict (round, lambda, history, config, ...); u_train by partition."""
    arrays = {f"u_train_{pid}": np.asarray(u, dtype=np.float64) for pid, u in u_train.items()}
    meta = np.array(json.dumps(state))
    path = Path(folder) / SERVER_FILE
    _atomic(path, lambda fh: np.savez(fh, meta=meta, **arrays))
    return path


def load_server(folder: Path | str) -> tuple[dict, dict[int, np.ndarray]]:
    path = Path(folder).expanduser() / SERVER_FILE
    if not path.exists():
        raise CheckpointError(f"resume-from={str(folder)!r}: no {SERVER_FILE} in that folder "
                              "(was the run started with checkpoint-every > 0?)")
    try:
        with np.load(path) as f:
            state = json.loads(str(f["meta"]))
            u_train = {int(k.rsplit("_", 1)[1]): f[k].copy() for k in f.files if k.startswith("u_train_")}
    except Exception as exc:  # noqa: BLE001  (a damaged file is reported, never half-used)
        raise CheckpointError(f"{path} cannot be read: {exc}") from exc
    return state, u_train


# -- party ----------------------------------------------------------------------------
def party_dir(node_config: Mapping[str, Any], run_config: Mapping[str, Any], partition_id: int) -> Path:
    """Where this party keeps θ: node-config ``checkpoint-dir`` (its own disk), else the
    run config's, else ``<cache>/checkpoints``."""
    root = str(node_config.get("checkpoint-dir", "") or run_config.get("checkpoint-dir", "") or "")
    if not root:
        from .partydata import CACHE_ENV

        base = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fairvfl-flwr"
        root = str(Path(base) / "checkpoints")
    return Path(root).expanduser() / run_key(run_config) / f"partition-{partition_id}"


def save_party(folder: Path, server_round: int, model_state: dict) -> Path:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"round-{server_round:08d}.pt"
    _atomic(path, lambda fh: torch.save({"round": server_round, "model": model_state}, fh))
    # Keep the KEEP latest rounds up to this one; later rounds are left over from a run that got
    # further before it stopped (this run rewrites them when it gets there).
    for old in folder.glob("round-*.pt"):
        r = int(old.stem.split("-")[1])
        if r > server_round:
            old.unlink(missing_ok=True)
    for old in sorted(folder.glob("round-*.pt"))[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def load_party(folder: Path, server_round: int, who: str) -> dict:
    import torch

    path = folder / f"round-{server_round:08d}.pt"
    if not path.exists():
        have = sorted(p.stem for p in folder.glob("round-*.pt")) if folder.exists() else []
        raise CheckpointError(f"{who} has no checkpoint of round {server_round} in {folder} (has: {have or 'none'})")
    return torch.load(path, weights_only=True)["model"]
