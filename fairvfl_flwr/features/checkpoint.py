"""Checkpoints and resume: the server's state in its run folder, each party's θ on its own disk.

Server (``<run folder>/checkpoint.npz``, rewritten every ``reliability.checkpoint-every`` rounds by
write-then-rename): round, multipliers λ, the history so far, the run config, a
fingerprint of the server's labels, and the last partial logits u_k of every party
(keyed by partition id: node ids change when a SuperNode restarts), with ‖θ_k‖² and
step counts: the server's ``state_dict``, everything it needs to continue exactly.
:class:`Checkpoints` is the round hook that writes it and, with
``reliability.resume-from``, restores it; :func:`checkpoint_mod` is the parties' side.

Party (``<reliability.checkpoint-dir>/<run key>/partition-<k>/round-<r>.npz``, same schedule, the
last :data:`KEEP` kept): its model's state dict. θ never leaves the party. The run key
is a hash of the settings that determine θ (every run-config key except the
operational ones in :data:`OPERATIONAL`), so a resumed run finds the files of the run it
continues without the server telling the parties anything beyond a round number.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from logging import INFO
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.data.partydata import CACHE_ENV
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.hooks import RoundHook, ServerView
from fairvfl_flwr.flower.party import PartyRuntime, is_step_type

SERVER_FILE = "checkpoint.npz"
KEEP = 3  # party checkpoints kept per partition (the server's latest is always among them)
# Keys that do not change θ_r: they may differ between a run and its resumption.
OPERATIONAL = frozenset({
    "num-server-rounds", "reliability.round-timeout", "reliability.round-retries", "reliability.checkpoint-every",
    "reliability.checkpoint-dir", "reliability.resume-from", "reliability.rejoin-timeout", "output-dir", "eval-every", "privacy.record-view",
    "privacy.record-every", "privacy.record-first", "privacy.transcript-dir", "server-labels", "csv.path",
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
    """The server's checkpoint in ``folder``: its state and each partition's training logits, refused
    naming the folder when there is none or it cannot be read."""
    path = Path(folder).expanduser() / SERVER_FILE
    if not path.exists():
        raise CheckpointError(f"reliability.resume-from={str(folder)!r}: no {SERVER_FILE} in that folder "
                              "(was the run started with reliability.checkpoint-every > 0?)")
    try:
        with np.load(path) as f:
            state = json.loads(str(f["meta"]))
            u_train = {int(k.rsplit("_", 1)[1]): f[k].copy() for k in f.files if k.startswith("u_train_")}
    except Exception as exc:  # noqa: BLE001  (a damaged file is reported, never half-used)
        raise CheckpointError(f"{path} cannot be read: {exc}") from exc
    return state, u_train


# -- party ----------------------------------------------------------------------------
def party_dir(node_config: Mapping[str, Any], cfg: RunConfig, partition_id: int) -> Path:
    """Where this party keeps θ: node-config ``checkpoint-dir`` (its own disk), else the
    run config's ``reliability.checkpoint-dir``, else ``<cache>/checkpoints``."""
    root = str(node_config.get("checkpoint-dir", "") or cfg.checkpoint_dir or "")
    if not root:
        base = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fairvfl-flwr"
        root = str(Path(base) / "checkpoints")
    return Path(root).expanduser() / run_key(cfg.to_flower()) / f"partition-{partition_id}"


def save_party(folder: Path, server_round: int, model_state: Mapping[str, Any],
               optimizer_state: Mapping[str, Any] | None = None) -> Path:
    """θ_r of one party (arrays by parameter name) in ``round-<r>.npz``, with the state its
    step continues from (``optimizer = "adagrad"``: the sums of squared gradients), if any;
    keeps the KEEP latest."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"round-{server_round:08d}.npz"
    arrays = {f"param.{k}": np.asarray(v) for k, v in model_state.items()}
    arrays.update({f"optim.{k}": np.asarray(v) for k, v in (optimizer_state or {}).items()})
    _atomic(path, lambda fh: np.savez(fh, round=np.array(server_round), **arrays))
    # Keep the KEEP latest rounds up to this one; later rounds are left over from a run that got
    # further before it stopped (this run rewrites them when it gets there).
    for old in folder.glob("round-*.npz"):
        r = int(old.stem.split("-")[1])
        if r > server_round:
            old.unlink(missing_ok=True)
    for old in sorted(folder.glob("round-*.npz"))[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def load_party(folder: Path, server_round: int, who: str, part: str = "param") -> dict[str, np.ndarray]:
    """θ_r of one party (``part = "param"``) or the state its step continues from (``"optim"``,
    empty where the step keeps none)."""
    path = folder / f"round-{server_round:08d}.npz"
    if not path.exists():
        have = sorted(p.stem for p in folder.glob("round-*.npz")) if folder.exists() else []
        raise CheckpointError(f"{who} has no checkpoint of round {server_round} in {folder} (has: {have or 'none'})")
    prefix = f"{part}."
    with np.load(path) as f:
        return {k[len(prefix):]: f[k].copy() for k in f.files if k.startswith(prefix)}


# -- the server's hook ----------------------------------------------------------------
class Checkpoints(RoundHook):
    """Write the server's state every ``every`` rounds (and round 0); restore ``resume``.

    ``resume``: (state, u_train by partition) from :func:`load_resume`, or None; ``masked``: the run is
    under secure aggregation (its stop note then says how the checkpoint scores instead).
    """

    def __init__(self, folder: Path, every: int, config: Mapping[str, Any], fingerprint: str,
                 resume: tuple[dict, dict] | None = None, masked: bool = False) -> None:
        self.folder = Path(folder)
        self.masked = masked  # the run's replies are masked (RunConfig.masked): it cannot be resumed
        self.every = every
        self.config = dict(config)
        self.fingerprint = fingerprint
        self.resume = resume
        self.last_checkpoint: int | None = int(resume[0]["round"]) if resume else None

    def begin(self, server: ServerView, grid: Grid, timeout: float) -> int | None:
        """On resume: restart every party from its checkpoint, check that each restored model gives the
        logits the server saved, and continue after that round."""
        if self.resume is None:
            return None
        state, u_train = self.resume
        r = int(state["round"])
        log(INFO, "FairVFL: resuming from round %d (%s)", r, self.folder)
        messages = [
            Message(RecordDict({msgs.ROUND: msgs.round_config(r, False)}), dst_node_id=nid,
                    message_type=msgs.INIT, group_id=f"resume-{r}")
            for nid in server.nodes
        ]
        for reply in server.exchange_init(grid, messages, timeout):
            nid = reply.metadata.src_node_id
            pid = server.nodes[nid].partition_id
            server.fold(reply)
            got, want = server.u_train[nid], u_train.get(pid)
            if want is None or want.shape != got.shape or not np.allclose(got, want, rtol=1e-6, atol=1e-9):
                raise CheckpointError(
                    f"{server.who(nid)}: its restored model of round {r} does not give the partial logits "
                    "the server saved for that round (a checkpoint of another run or data?); refused"
                )
        server.load_state_dict({**state, "u_train": u_train})
        self.last_checkpoint = r
        return r + 1

    def end(self, server: ServerView, grid: Grid, server_round: int, timeout: float) -> None:
        """Save the server's checkpoint every ``every`` rounds (the parties save theirs on the same rounds)."""
        if self.every > 0 and server_round % self.every == 0:
            self.save(server)

    def save(self, server: ServerView) -> None:
        """Write the server's state, the run config and the labels' fingerprint, so a resume can refuse
        another run's checkpoint."""
        state = server.state_dict()
        u_train = state.pop("u_train")
        state.update({"config": self.config, "fingerprint": self.fingerprint, "run-key": run_key(self.config),
                      "saved-at": time.time()})
        save_server(self.folder, state, u_train)
        self.last_checkpoint = int(state["round"])

    def stopped(self, server: ServerView, exc: BaseException) -> str | None:
        """Where the last checkpoint is and how to use it (resume, or score it under secure
        aggregation), for the stop line."""
        if self.last_checkpoint is None:
            return None
        where = f"last checkpoint: round {self.last_checkpoint} in {self.folder / SERVER_FILE}"
        if self.masked:  # config.sections refuses to resume a masked run
            return (f"{where}; a run under privacy.secure-aggregation cannot be resumed (start it afresh), "
                    f"but the checkpoint scores (masked, as trained): mode='score' "
                    f"score.model-from=\"{self.folder}\" score.round={self.last_checkpoint}")
        return f"{where}; continue with reliability.resume-from=\"{self.folder}\""


def load_resume(cfg, labels, folder: str | Path) -> tuple[dict, dict]:
    """Read ``reliability.resume-from`` and check it fits this run (same θ-relevant config and labels)."""
    state, u_train = load_server(folder)
    where = f"reliability.resume-from={str(folder)!r}"
    old, new = state["config"], cfg.to_flower()
    for key in sorted(set(old) | set(new)):
        if key in OPERATIONAL:
            continue
        if old.get(key) != new.get(key):
            raise CheckpointError(
                f"{where}: run config {key}={new.get(key)!r} differs from the checkpoint's "
                f"{old.get(key)!r}; only {', '.join(sorted(OPERATIONAL))} may change when resuming"
            )
    if state["fingerprint"] != labels_fingerprint(labels):
        raise CheckpointError(f"{where}: the server's labels differ from the checkpointed run's")
    if int(state["round"]) >= cfg.num_server_rounds:
        raise CheckpointError(
            f"{where}: the checkpoint is at round {state['round']}, "
            f"num-server-rounds={cfg.num_server_rounds} leaves nothing to run"
        )
    return state, u_train


# -- the parties' mod -----------------------------------------------------------------
def checkpoint_mod(message: Message, context, call_next) -> Message:
    """Save θ after round 0 and every ``checkpoint-every``-th step; on a resumed
    ``query.init`` (round r > 0) load θ_r from this party's own disk and reply with its logits."""
    mtype = message.metadata.message_type
    if mtype != msgs.INIT and not is_step_type(mtype):
        return call_next(message, context)
    reply = call_next(message, context)
    if reply.has_error():
        return reply
    rt = PartyRuntime(context)
    server_round = int(message.content.config_records[msgs.ROUND]["round"])
    if mtype == msgs.INIT and server_round > 0:  # resume: θ_r from this party's own disk
        folder = party_dir(context.node_config, rt.cfg, rt.data.partition_id)
        rt.load_model_state(load_party(folder, server_round, rt.who))
        if rt.cfg.optimizer_in_use == "adagrad":
            optimizer = load_party(folder, server_round, rt.who, "optim")
            if not optimizer:  # fresh sums would restart with full-length steps: not the run it continues
                raise CheckpointError(f"{rt.who}: the checkpoint of round {server_round} in {folder} holds no "
                                      "AdaGrad sums; resume it with the optimizer it was trained with")
            rt.load_optimizer_state(optimizer)
        return rt.reply(message, rt.party(), steps=0)
    every = rt.cfg.checkpoint_every
    if every > 0 and server_round % every == 0:
        state = rt.model_state()
        if state is not None:
            folder = party_dir(context.node_config, rt.cfg, rt.data.partition_id)
            save_party(folder, server_round, state, rt.optimizer_state())
    return reply
