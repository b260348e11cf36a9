"""Transcripts of what every role receives (run config ``privacy.transcript-dir``).

Each role writes what reaches it, on its own side, one ``.npz`` per recorded round; the
format is documented in docs/privacy.md ("Transcripts") and read by
``python -m fairvfl_flwr.tools.audit``:

* ``<dir>/server/r<round>.npz`` (:class:`ServerTranscript`, a round hook): ``u-<pid>``
  (every party's training logits as received: float at the wire dtype, or the masked
  uint64 words under ``privacy.secure-aggregation``), ``u-test-<pid>`` when the reply
  carried test logits, and what the server computed itself that round: ``nu`` (as sent to
  passive parties, after any ν channel such as noise, at the wire dtype), ``z`` (as sent
  to active parties) and ``lam`` (after the dual step). Round 0 holds the first logits only.
* ``<dir>/party-<pid>/r<round>.npz`` (:func:`transcript_mod`, a ClientApp mod): a passive
  party's ``nu`` (or ``nu-ct``, the ciphertext bytes under encrypted ν), an active party's
  ``z`` and ``lam``; both also keep ``own-u``, the training logits of their own reply
  (which they hold anyway, and which an attack on z needs).

Under ``optimizer = "newton"`` the server's file also holds each party's reply:
``dir-<pid>`` (X_k s_k, at the wire dtype), ``a-<pid>`` (θ_k·d_j) and ``gram-<pid>``
(d_iᵀd_j), and ``test-<pid>`` / ``test-dirs-<pid>`` on evaluation rounds (masked uint64 words
under secure aggregation), with what it
computed from them: ``alpha-<pid>``, the step lengths it sends party ``pid`` with its next
message (the round's hook ``end``, from ``VFLServer.computed``); the last round's file also
holds the applied logits ``u-<pid>`` (and ``u-test-<pid>``) of ``train.newton_apply``; a party's file
holds what it received, ``alpha`` (its step lengths of the round before) with ``nu`` or
``z`` and ``lam``, and ``own-dir`` (its own X_k s_k). The step lengths of the last round
(``train.newton_apply``) are added to that round's file as ``alpha-last``, with ``own-u``.
Gauss–Newton blocks (MLP parties) reply their logits with their directions every round, so
``u-<pid>`` and ``own-u`` are in every round's files, and a party's also hold ``base`` (and
``base-last``): the round of the directions its step lengths apply to.

Every file also holds ``round``. Rounds 0..``privacy.record-first`` are recorded, then
every ``privacy.record-every``-th round with the rounds just before and after it.
Nothing is sent anywhere.

``privacy.record-view = "<dir>"`` is the passive parties' part of the same recording: each
passive party writes its ``party-<pid>/r<round>.npz`` there, in the format above, and no
other role records (the server hook is not added). With both keys set, a passive party
writes its file to both folders.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.arrays import to_numpy
from fairvfl_flwr.flower.hooks import RoundHook, ServerView
from fairvfl_flwr.flower.party import VIEW_STATE, PartyRuntime, round_of
from fairvfl_flwr.flower.records import array_records, config_records

SERVER = "server"


def should_record(server_round: int, *, first: int, every: int) -> bool:
    """Rounds 0..first, then every ``every``-th round with its neighbours: attacks on the
    logits need consecutive rounds (on z, three), and rounds spread over the run see ν move more."""
    return 0 <= server_round <= first or (every > 0 and server_round % every in (every - 1, 0, 1 % every))


def role_dir(folder: str | Path, role: str | int) -> Path:
    """``server`` or ``party-<pid>`` under the transcript folder."""
    return Path(folder) / (SERVER if role == SERVER else f"party-{int(role)}")


def write(folder: str | Path, role: str | int, server_round: int, arrays: dict[str, np.ndarray]) -> Path:
    out = role_dir(folder, role)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"r{server_round:06d}.npz"
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, round=np.int64(server_round), **arrays)
    tmp.replace(path)  # a reader never sees half a file
    return path


def load(folder: str | Path, role: str | int) -> list[dict[str, np.ndarray]]:
    """Every recorded round of one role, in round order (each a dict of arrays)."""
    where = role_dir(folder, role)
    files = sorted(where.glob("r*.npz"), key=lambda f: int(re.search(r"r(\d+)", f.name).group(1)))
    if not files:
        raise FileNotFoundError(f"no transcript in {where} (run with privacy.transcript-dir set)")
    out = []
    for f in files:
        with np.load(f) as z:
            out.append({k: z[k] for k in z.files})
    return out


def stack(rounds: list[dict[str, np.ndarray]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(round numbers, values stacked round × ...) of the rounds that hold ``key``."""
    held = [r for r in rounds if key in r]
    if not held:
        raise KeyError(f"no recorded round holds {key!r}")
    return np.array([int(r["round"]) for r in held]), np.stack([r[key] for r in held])


class ServerTranscript(RoundHook):
    """What the server receives (every reply as it arrives) and computes, per round.

    Add it after the ν channels that change ν (so ``nu`` is what was sent) and before any
    hook that rewrites replies (so ``u-<pid>`` is what arrived).
    """

    def __init__(self, folder: str, first: int, every: int) -> None:
        self.folder, self.first, self.every = folder, first, every
        self.pending: dict[int, dict[str, np.ndarray]] = {}
        self.written: set[int] = set()  # rounds whose file this run already holds (a later write adds to it)

    def add(self, server_round: int, arrays: dict[str, np.ndarray]) -> None:
        """Write the round's file, keeping what an earlier write of the same round put there
        (a round can bring replies twice: Newton's last round also gets the applied logits)."""
        if server_round in self.written:
            with np.load(role_dir(self.folder, SERVER) / f"r{server_round:06d}.npz") as old:
                arrays = {**{k: old[k] for k in old.files if k != "round"}, **arrays}
        write(self.folder, SERVER, server_round, arrays)
        self.written.add(server_round)

    def nu(self, server: ServerView, server_round: int, nu: np.ndarray) -> np.ndarray:
        if should_record(server_round, first=self.first, every=self.every):
            self.pending[server_round] = {
                "nu": np.asarray(nu).astype(server.wire_dtype),
                "z": server.z("train").astype(server.wire_dtype),
                "lam": np.asarray(server.lam, dtype=np.float64).copy(),
            }
        return nu

    def incoming(self, server: ServerView, grid: Grid, server_round: int, replies: list[Message],
                 timeout: float) -> list[Message]:
        if not should_record(server_round, first=self.first, every=self.every):
            return replies
        arrays = self.pending.pop(server_round, {})
        for reply in replies:
            pid = server.nodes[reply.metadata.src_node_id].partition_id
            directions = array_records(reply.content).get(msgs.DIRECTIONS)
            if directions is not None:
                arrays.update({f"{key}-{pid}": to_numpy(directions[key]) for key in directions})
            record = array_records(reply.content).get(msgs.LOGITS)
            if record is None:
                continue
            arrays[f"u-{pid}"] = to_numpy(record["train"])
            if "test" in record:
                arrays[f"u-test-{pid}"] = to_numpy(record["test"])
        self.add(server_round, arrays)
        return replies

    def end(self, server: ServerView, grid: Grid, server_round: int, timeout: float) -> None:
        """What the algorithm computed for each party from the round's replies (Newton: the
        step lengths α_k it sends with the next message), once the round is folded."""
        computed = server.computed() if should_record(server_round, first=self.first, every=self.every) else {}
        arrays = {f"{key}-{server.nodes[nid].partition_id}": np.asarray(value)
                  for nid, values in computed.items() for key, value in values.items()}
        if arrays:
            self.add(server_round, arrays)


#: What a party's transcript keeps of a round message's payload: payload key -> transcript key.
#: A type not listed keeps every payload array under its own key (a second leg's masked sums
#: aside), so a new algorithm's messages are recorded as they arrived.
RECORDED: dict[str, dict[str, str]] = {
    msgs.TRAIN_PASSIVE: {"nu": "nu"},
    msgs.TRAIN_ACTIVE: {"z": "z", "lam": "lam"},
    msgs.NEWTON_ACTIVE: {"z": "z", "lam": "lam", "alpha": "alpha", "base": "base"},
    # encrypted ν: ν is absent from the second leg (its first leg recorded the ciphertext)
    msgs.NEWTON_PASSIVE: {"nu": "nu", "alpha": "alpha", "base": "base"},
    msgs.NEWTON_APPLY: {"alpha": "alpha-last", "base": "base-last"},
}


def transcript_mod(message: Message, context, call_next) -> Message:
    """ClientApp mod: a party's own transcript of what it received (and its own reply's logits)."""
    reply = call_next(message, context)
    mtype = message.metadata.message_type
    if reply.has_error() or not msgs.in_rounds(mtype):
        return reply
    rt = PartyRuntime(context)
    server_round = round_of(message)[0]
    folders = party_folders(rt.cfg, rt.data.role)
    if not folders or not should_record(server_round, first=rt.cfg.record_first, every=rt.cfg.record_every):
        return reply
    arrays: dict[str, np.ndarray] = {}
    payload = array_records(message.content).get(msgs.PAYLOAD)
    if mtype == msgs.TRAIN_PASSIVE_ENC:  # encrypted ν: the ciphertext is all there is
        keys = sorted(payload, key=lambda k: int(k.rsplit("-", 1)[1]))
        arrays["nu-ct"] = np.frombuffer(b"".join(to_numpy(payload[k]).tobytes() for k in keys), dtype=np.uint8)
    elif payload is not None:
        names = RECORDED.get(mtype)
        if names is None:  # any other round message (a new algorithm's): what it carried, by name
            names = {key: key for key in payload if key != msgs.MASKED_SUM}
        arrays.update({name: to_numpy(payload[key]) for key, name in names.items() if key in payload})
    view = config_records(context.state).get(VIEW_STATE)
    if view is not None and int(view["round"]) == server_round:  # secure aggregation: the history head the masks are bound to (a coalition peels with it)
        arrays["head"] = np.frombuffer(bytes.fromhex(str(view["head"])), dtype=np.uint8)
    logits = array_records(reply.content).get(msgs.LOGITS)
    if logits is not None:
        arrays["own-u"] = to_numpy(logits["train"])
    directions = array_records(reply.content).get(msgs.DIRECTIONS)
    if directions is not None:
        arrays["own-dir"] = to_numpy(directions["dir"])
    # CKKS second leg: keep the first leg's ν; a Newton apply: keep what the round's first message left
    merge = msgs.second_leg(mtype, payload) or mtype == msgs.NEWTON_APPLY
    for folder in folders if arrays else ():
        path = role_dir(folder, rt.data.partition_id) / f"r{server_round:06d}.npz"
        kept = {}
        if merge and path.exists():
            with np.load(path) as old:
                kept = {k: old[k] for k in old.files if k != "round"}
        write(folder, rt.data.partition_id, server_round, {**kept, **arrays})
    return reply


def party_folders(cfg, role: str) -> list[str]:
    """Where a party of ``role`` writes its transcript: ``privacy.transcript-dir`` (every role)
    and ``privacy.record-view`` (passive parties only)."""
    folders = [cfg.transcript_dir] if cfg.transcript_dir else []
    if cfg.record_view and role == msgs.ROLE_PASSIVE and cfg.record_view not in folders:
        folders.append(cfg.record_view)
    return folders
