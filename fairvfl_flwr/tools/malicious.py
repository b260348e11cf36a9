"""A malicious server against the real ClientApps: the in-process grid is its wire.

The real ServerApp runs; :class:`LyingGrid` rewrites what it sends before the parties get
it (:meth:`LyingGrid.tamper`) and then covers its tracks: each message's view of the round
(secure/view.py) lists the part that message carries, so every party's own check
passes whatever it was sent. The server also ignores its own cancellation check and keeps
every sum it decodes (:func:`decoded_sums`). What the parties do about it is theirs.

:func:`isolate` is the attack of a server that wants one passive party's Gram matrix
under secure aggregation: a probe ν to that party, ν = 0 to the others (or the real ν to
the target only), and the active party z = 1000·y, λ = 0, which makes its step zero. Were
the masks not bound to one view, the decoded sum would be the target's own logits.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
from flwr.app import ConfigRecord, Message, RecordDict

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.algorithms.newton import NEWTON
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config.algorithms import resolve
from fairvfl_flwr.config.run import RunConfig
from fairvfl_flwr.data import psi
from fairvfl_flwr.data.partydata import party_spec
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.data.tables import normalise_ids, packaged_file
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.arrays import to_numpy
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.flower.party import MODEL_STATE, party_data
from fairvfl_flwr.secure import agreement, identity, ring, view
from fairvfl_flwr.secure.nonces import mask_round
from fairvfl_flwr.jobs import alignment
from fairvfl_flwr.tools import attacks
from fairvfl_flwr.tools.export import export
from fairvfl_flwr.flower.records import array_records, config_records


#: A round's training messages (what the real ServerApp sends after round 0).
_TRAINING = (msgs.Kind.STEP, msgs.Kind.ROUND)


class LyingGrid(InProcessGrid):
    """The server's wire: :meth:`tamper` rewrites each outgoing message, :meth:`reseal`
    makes its view agree with what it carries; every reply is kept as it arrived."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.received: list[tuple[Message, dict]] = []  # (reply, {record: {key: array as it arrived}})

    def tamper(self, msg: Message) -> None:
        """What the server changes in a message before it goes out (nothing here)."""

    def push_messages(self, messages):
        messages = list(messages)
        for msg in messages:
            self.tamper(msg)
        self.reseal(messages)
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        got = list(super().pull_messages(message_ids))
        for r in got:
            arrays = {} if r.has_error() else {name: {k: to_numpy(a).copy() for k, a in rec.items()}
                                               for name, rec in array_records(r.content).items()}
            self.received.append((r, arrays))
        return got

    def role(self, node_id: int) -> str:
        active = int(self.contexts[node_id].run_config.get("num-active", 1))
        return msgs.ROLE_ACTIVE if self.node_ids.index(node_id) < active else msgs.ROLE_PASSIVE

    def reseal(self, messages: list[Message]) -> None:
        """Each message's view lists the part that message carries (the first such
        message's digest for the other parts): every party's own check passes."""
        bound = [m for m in messages if view.VIEW in config_records(m.content)]
        digests = {}
        for m in bound:
            mtype, role = m.metadata.message_type, self.role(m.metadata.dst_node_id)
            digests[id(m)] = (view.part_name(mtype, role), view.content_digest(m.content, mtype, role))
        common: dict[str, str] = {}
        for name, digest in digests.values():
            common.setdefault(name, digest)
        for m in bound:
            name, digest = digests[id(m)]
            rc = config_records(m.content).get(msgs.ROUND)
            r = int(rc["round"]) if rc is not None else int(config_records(m.content)[view.VIEW]["round"])
            parts = {**common, name: digest}
            config_records(m.content)[view.VIEW] = ConfigRecord(
                {"round": r, "parts": [f"{k}={v}" for k, v in sorted(parts.items())]})

    def replies(self, mtype: str | None = None) -> list[Message]:
        return [r for r, _ in self.received if mtype is None or r.metadata.message_type == mtype]

    def values(self, *names: str) -> list[np.ndarray]:
        """Every array the server received in records ``names``."""
        return [a for _, arrays in self.received for name in names for a in arrays.get(name, {}).values()]


class IsolateParty(LyingGrid):
    """ν to ``target`` only (a seeded probe, or with ``probe=False`` the real ν), ν = 0 to the
    other passive parties; the active party z = 1000·y and λ = 0. ``target=None``: the same
    probe to every passive party (a consistent broadcast, which one view allows)."""

    def __init__(self, *a, target: int | None, y: np.ndarray, probe: bool = True, seed: int = 0, **kw) -> None:
        super().__init__(*a, **kw)
        self.target_node = None if target is None else self.node_ids[target]
        self.y, self.probe, self.rng = y, probe, np.random.default_rng([seed, 0x6E75])
        self.sent: dict[int, np.ndarray] = {}  # round -> the ν the target got

    def tamper(self, msg: Message) -> None:
        mtype, rc = msg.metadata.message_type, config_records(msg.content).get(msgs.ROUND)
        payload = array_records(msg.content).get(msgs.PAYLOAD)
        if rc is None or payload is None:
            return
        t = int(rc["round"])
        if mtype == msgs.TRAIN_ACTIVE:
            z, lam = to_numpy(payload["z"]), to_numpy(payload["lam"])
            array_records(msg.content)[msgs.PAYLOAD] = msgs.array_record(
                z=(1000.0 * self.y).astype(z.dtype), lam=np.zeros_like(lam))
        elif mtype == msgs.TRAIN_PASSIVE:
            nu = to_numpy(payload["nu"])
            if self.target_node in (None, msg.metadata.dst_node_id):
                if t not in self.sent:
                    self.sent[t] = (self.rng.standard_normal(len(nu)) / len(nu)).astype(nu.dtype) if self.probe else nu
                new = self.sent[t]
            else:
                new = np.zeros_like(nu)
            array_records(msg.content)[msgs.PAYLOAD] = msgs.array_record(nu=new)


@contextlib.contextmanager
def decoded_sums() -> Iterator[dict[int, np.ndarray]]:
    """The server skips its cancellation check and keeps each round's decoded training sum."""
    sums: dict[int, np.ndarray] = {}

    def keep(total: np.ndarray, limit: float, masks: str) -> np.ndarray:
        if masks.startswith("round ") and "the train logits" in masks:
            sums[int(masks.split()[1].rstrip(":"))] = np.array(total)
        return np.abs(total) if "sq-norm" in masks else total  # ‖θ‖² must look like one to go on

    with mock.patch.object(ring, "cancelled", keep):
        yield sums


@dataclass
class Isolation:
    """What the isolation attack got: the Gram error of the target (1.0: guessing), the
    round the parties refused in (None: they never did) and their reasons."""

    gram_error: float
    rounds_decoded: int
    refused_round: int | None
    reasons: list[str] = field(default_factory=list)
    noise: float = 0.0  # median |decoded sum| of the last round decoded (a true sum is O(1))


def isolate(run_config: dict, target: int | None, probe: bool = True, seed: int = 0,
            identities: list[dict] | None = None) -> Isolation:
    """Run the attack with the real ClientApps; score the target's Gram matrix from the sums
    decoded (``target=None``: the passive parties' summed Gram matrix Σ_k X_k X_kᵀ).
    ``identities``: each party's node-config key entries (default: the simulation's)."""
    cfg = RunConfig.from_flower(run_config)
    ds = load_data(cfg)
    k = cfg.num_parties
    ids = identities or [{} for _ in range(k)]
    grid = IsolateParty(client_app, cfg.to_flower(), k, target=target, y=ds.y_train.astype(np.float64), probe=probe,
                        seed=seed, node_configs=[{"partition-id": i, "num-partitions": k, **ids[i]} for i in range(k)])
    with decoded_sums() as sums:
        try:
            run_server(grid, cfg.to_flower())
        except FederationError:
            pass
    refused = [r for r in grid.replies() if r.has_error()]
    refused_round = min((int(r.metadata.group_id.split("-")[0]) for r in refused
                         if r.metadata.group_id.split("-")[0].isdigit()), default=None)
    blocks = [party_data(cfg, party_spec({"partition-id": j}, k, cfg.num_active)).X_train.astype(np.float64)
              for j in ([target] if target is not None else range(cfg.num_active, k))]
    X = np.concatenate(blocks, axis=1)  # X Xᵀ = Σ_k X_k X_kᵀ
    nu = {t: v.astype(np.float64) for t, v in grid.sent.items()}
    rows = attacks.score_rows(len(X), cfg.seed)
    try:
        est = attacks.gram_attack(sums, nu, cfg.eta, cfg.mu_value(len(X)), X.shape[1])
        err = attacks.gram_error(est, X, rows)
    except ValueError:  # fewer than two rounds decoded: nothing to fit
        err = 1.0
    last = max(sums) if sums else 0
    return Isolation(gram_error=min(err, 1e9), rounds_decoded=len(sums), refused_round=refused_round,
                     reasons=[r.error.reason for r in refused],
                     noise=float(np.median(np.abs(sums[last]))) if sums else 0.0)


class ResendChanged(LyingGrid):
    """Re-sends every passive party's request of round ``again`` with another ν (twice the
    real one), its view covering it; keeps the answers."""

    def __init__(self, *a, again: int = 3, **kw) -> None:
        super().__init__(*a, **kw)
        self.again, self.answers = again, []

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for msg in messages:
            if msg.metadata.group_id == str(self.again) and msg.metadata.message_type == msgs.TRAIN_PASSIVE:
                nu = to_numpy(array_records(msg.content)[msgs.PAYLOAD]["nu"])
                twin = Message(RecordDict(dict(msg.content)), dst_node_id=msg.metadata.dst_node_id,
                               message_type=msg.metadata.message_type, group_id=msg.metadata.group_id)
                array_records(twin.content)[msgs.PAYLOAD] = msgs.array_record(nu=nu * 2)
                self.reseal([twin])
                self.answers.append(self._answer(twin))
        return ids


# -- a server that plays the protocol by hand: sessions, rejoins, restarts, replays ------------
class Takeover(Exception):
    """Raised on the wire when the real ServerApp is about to send round ``stop_at``: from
    there the malicious server plays by hand (:class:`HandServer`) on the same parties."""


class Hijack(LyingGrid):
    """The real ServerApp's honest rounds 0 .. ``stop_at`` − 1, each message kept as sent; the
    first message of round ``stop_at`` never leaves (:class:`Takeover`). Later pushes (the
    hand-played server's) go out as they are: no tampering, no resealing."""

    def __init__(self, *a, stop_at: int | None = None, **kw) -> None:
        super().__init__(*a, **kw)
        self.stop_at, self.by_hand = stop_at, stop_at is None
        self.sent: list[Message] = []
        self.honest_replies = 0  # how many of the replies received the real ServerApp's rounds got

    def push_messages(self, messages):
        messages = list(messages)
        if not self.by_hand and any(msgs.kind_of(m.metadata.message_type) in _TRAINING
                                    and m.metadata.group_id == str(self.stop_at) for m in messages):
            self.by_hand, self.honest_replies = True, len(self.received)
            raise Takeover(f"round {self.stop_at}")
        self.sent += messages
        return InProcessGrid.push_messages(self, messages)

    def honest(self, server_round: int, node_id: int) -> Message:
        """The training message the real ServerApp sent ``node_id`` in ``server_round`` (its first leg)."""
        return next(m for m in self.sent if m.metadata.dst_node_id == node_id
                    and m.metadata.group_id == str(server_round)
                    and msgs.kind_of(m.metadata.message_type) in _TRAINING)

    def honest_sum(self, server_round: int, record: str = msgs.LOGITS, key: str = "train") -> np.ndarray:
        """The sum the real ServerApp decoded in ``server_round`` (from the masked words it received)."""
        words = [arrays[record][key] for r, arrays in self.received[:self.honest_replies] if not r.has_error()
                 and r.metadata.group_id == str(server_round) and record in arrays]
        if len(words) != len(self.node_ids):
            raise ValueError(f"round {server_round}: {len(words)} of {len(self.node_ids)} replies carry {record}")
        return ring.decode(np.sum(words, axis=0, dtype=np.uint64))


#: Records of an honest message that belong to its exchange, not to what it asks: a replay drops them.
EXCHANGE_RECORDS = (view.VIEW, view.CONFIRM, view.RELAY)


def replayed(msg: Message, **payload: np.ndarray) -> Message:
    """``msg`` again, without its exchange's records; ``payload``: arrays that replace its payload's."""
    content = RecordDict({name: record for name, record in msg.content.items() if name not in EXCHANGE_RECORDS})
    if payload:
        old = {k: to_numpy(a) for k, a in array_records(content)[msgs.PAYLOAD].items()}
        array_records(content)[msgs.PAYLOAD] = msgs.array_record(**{**old, **payload})
    return Message(content, dst_node_id=msg.metadata.dst_node_id, message_type=msg.metadata.message_type,
                   group_id=msg.metadata.group_id)


class HandServer:
    """A malicious server that sends what it likes, when it likes, to whom it likes, with the
    protocol's own pieces: each set-up a signed session (secure/agreement.py's request and relay), each
    exchange bound to the session's view (:class:`~fairvfl_flwr.secure.view.ServerViews`, which also
    relays the parties' confirmations). It keeps every refusal it gets and decodes what
    it can (:meth:`decode`: None where the masks did not cancel)."""

    def __init__(self, grid: InProcessGrid) -> None:
        self.grid = grid
        self.views: view.ServerViews | None = None
        self.refusals: list[str] = []  # every error reply's reason, in order
        self.refused_by: set[int] = set()  # the partitions that sent them

    def role(self, node_id: int) -> str:
        active = int(self.grid.contexts[node_id].run_config.get("num-active", 1))
        return msgs.ROLE_ACTIVE if self.grid.node_ids.index(node_id) < active else msgs.ROLE_PASSIVE

    def pid(self, node_id: int) -> int:
        return self.grid.node_ids.index(node_id)

    def send(self, messages: list[Message]) -> list[Message]:
        """Push ``messages``; every reply, in their order (a refusal is an error reply, kept)."""
        by_id = dict(zip(self.grid.push_messages(messages), range(len(messages))))
        replies = sorted(self.grid.pull_messages(list(by_id)), key=lambda r: by_id[r.metadata.reply_to_message_id])
        for r in replies:
            if r.has_error():
                self.refusals.append(r.error.reason)
                self.refused_by.add(self.pid(r.metadata.src_node_id))
        return replies

    def session(self, to: list[int] | None = None, **request) -> bool:
        """A fresh signed set-up of every party; ``request``: more of the key request (e.g.
        ``rollback=r``), to the node ids ``to`` only (default: every party), the others get the
        plain one. False where any party refused it (the server then holds no session)."""
        session = agreement.new_session()
        nodes = self.grid.node_ids
        parties = [(nid, self.pid(nid), f"party {self.pid(nid)}") for nid in nodes]
        asks = [Message(RecordDict({"secagg": ConfigRecord({**agreement.key_request(session),
                                                            **(request if to is None or nid in to else {})})}),
                        dst_node_id=nid, message_type=agreement.SAKEYS, group_id="secagg") for nid in nodes]
        replies = self.send(asks)
        self.views = None
        if any(r.has_error() for r in replies):
            return False
        before = len(self.refusals)
        try:
            agreement.relay_keys(parties, agreement.signed_keys(parties, replies, session), self.send)
        except FederationError as exc:
            self.refusals.append(str(exc))
            return False
        if len(self.refusals) > before:
            return False
        self.views = view.ServerViews(session)
        return True

    def exchange(self, messages: list[Message]) -> list[Message]:
        """Bound messages under the session's view, with the confirmations to relay; the replies.
        Where the messages give one role different values (which the server's own views refuse
        to list) each message's view lists its own part and the first message's of every other
        part, so each party's own check passes."""
        if self.views is not None:
            try:
                self.views.attach(messages, self.role, self.pid, mask_round)
            except FederationError:
                self._attach_each(messages)
        replies = self.send(messages)
        if self.views is not None:
            self.views.collect([r for r in replies if not r.has_error()], self.pid)
        return replies

    def _attach_each(self, messages: list[Message]) -> None:
        bound = [m for m in messages if msgs.in_view(m.metadata.message_type)]
        named = []
        for m in bound:
            mtype, role = m.metadata.message_type, self.role(m.metadata.dst_node_id)
            named.append((m, view.part_name(mtype, role), view.content_digest(m.content, mtype, role)))
        common: dict[str, str] = {}
        for _, name, digest in named:
            common.setdefault(name, digest)
        for m, name, digest in named:
            parts = {**common, name: digest}
            tags = self.views.relay.get(self.pid(m.metadata.dst_node_id), {})
            config_records(m.content)[view.VIEW] = ConfigRecord(
                {"round": mask_round(m), "parts": [f"{k}={v}" for k, v in sorted(parts.items())]})
            config_records(m.content)[view.CONFIRM] = ConfigRecord({f"t-{j}": t for j, t in sorted(tags.items())})

    def rejoin(self, node_ids: list[int], server_round: int) -> list[Message]:
        """``query.rejoin`` of ``server_round`` to ``node_ids`` only."""
        return self.send([rejoin_message(nid, server_round) for nid in node_ids])

    @staticmethod
    def decode(replies: list[Message], record: str = msgs.LOGITS, key: str = "train") -> np.ndarray | None:
        """The decoded sum of every reply's ``record``/``key`` words; None: a refusal, or masks that
        did not cancel (decoded, such a sum is uniform over the ring)."""
        if not replies or any(r.has_error() or record not in array_records(r.content) for r in replies):
            return None
        words = [to_numpy(array_records(r.content)[record][key]) for r in replies]
        total = ring.decode(np.sum(words, axis=0, dtype=np.uint64))
        return total if np.all(np.abs(total) < ring.LIMIT / 2) else None


def rejoin_message(node_id: int, server_round: int) -> Message:
    """What the server's rejoin hook sends a party (features/rejoin.py)."""
    return Message(RecordDict({msgs.ROUND: msgs.round_config(server_round, False)}), dst_node_id=node_id,
                   message_type=msgs.REJOIN, group_id=f"rejoin-{server_round}")


@dataclass
class Breach:
    """What a hand-played attack on one party got: the Gram error of its block (1.0: nothing,
    as guessing 0), how many of its probes' sums decoded, and every refusal's reason."""

    role: str
    gram_error: float
    probes: int
    decoded: int
    refusals: list[str] = field(default_factory=list)
    refused_by: set[int] = field(default_factory=set)
    logits_error: float | None = None  # the init role: the target's real partial logits, read off two sums
    repeated: int = 0  # decoded sums identical to one the server already held (nothing new)

    @property
    def refused(self) -> bool:
        """Refused and nothing learned: no probe's sum decoded."""
        return bool(self.refusals) and self.decoded == 0

    def summary(self, target: int = 2) -> str:
        """One line for the audit page: refused (by whom, the first reason), or what was learned."""
        got = f"party {target}'s Gram error {self.gram_error:.3g}, {self.decoded} of {self.probes} probe sums decoded"
        if self.decoded and self.repeated == self.decoded:
            got = f"party {target}'s Gram error {self.gram_error:.3g}: each of the {self.decoded} sums decoded is one " \
                "the server already held"
        if self.logits_error is not None:
            got += f"; its partial logits' error {self.logits_error:.3g}"
        if not self.refusals:
            return got
        by = f"{len(self.refused_by)} part{'y' if len(self.refused_by) == 1 else 'ies'}"
        why = f"refused by {by} ({_first_words(self.refusals[0])})"
        return f"{why}; {got}" if self.refused else f"{got}; {why}"


def _first_words(reason: str, words: int = 16) -> str:
    """A refusal's reason without the exception's class name and the party's node id, cut to ``words`` words."""
    text = reason.split(": ", 1)[1] if reason.split(": ", 1)[0].isidentifier() else reason
    text = re.sub(r"^party (\d+) \([^)]*\)", r"party \1", text)
    cut = text.split()
    return " ".join(cut[:words]) + (" …" if len(cut) > words else "")


def take_over(run_config: dict, stop_at: int, folder: Path, identities: list[dict] | None = None) -> Hijack:
    """Run the real ServerApp honestly up to round ``stop_at`` − 1 (parties keeping their rejoin
    state under ``folder``); the grid it ran on, now the hand-played server's."""
    cfg = RunConfig.from_flower(run_config)
    k = cfg.num_parties
    ids = identities or [{} for _ in range(k)]
    rc = RunConfig.from_flower({**run_config, "num-server-rounds": stop_at + 2, "stop-tolerance": 0.0,
                                "reliability.rejoin-timeout": 30.0, "output-dir": str(folder / "runs")}).to_flower()
    grid = Hijack(client_app, rc, k, stop_at=stop_at,
                  node_configs=[{"partition-id": i, "num-partitions": k, "state-dir": str(folder / "state"), **ids[i]}
                                for i in range(k)])
    try:
        run_server(grid, rc)
    except Takeover:
        pass
    if not grid.by_hand:
        raise RuntimeError(f"the run ended before round {stop_at}")
    return grid


def probe_vectors(n: int, count: int, seed: int, newton: bool = False) -> list[np.ndarray]:
    """``count`` probes ν (float32 on the wire, so float32 here). ``newton``: every |ν_i| is 0 or
    at least 1/n, where a passive party's curvature |ν|(1 − n|ν|) is zero and its direction
    linear in ν; gradient descent: Gaussian."""
    rng = np.random.default_rng([seed, 0x70726F6265])
    out = []
    for _ in range(count):
        if newton:
            v = rng.choice([-1.0, 1.0], n) * (1.0 + rng.random(n)) / n * (rng.random(n) < 0.2)
        else:
            v = rng.standard_normal(n) / np.sqrt(n)
        out.append(v.astype(np.float32))
    return out


def fit_exact(R: np.ndarray, V: np.ndarray, rank: int) -> attacks.GramEstimate:
    """Ĝ with Ĝ V = R from exact equations (one column each), on R's leading ``rank`` directions
    (the target's column count, which discovery tells the server)."""
    basis, _, _ = np.linalg.svd(R, full_matrices=False)
    basis = basis[:, :min(rank, R.shape[1])]
    core = (basis.T @ R) @ np.linalg.pinv(basis.T @ V)
    return attacks.GramEstimate(basis, (core + core.T) / 2, R.shape[1])


def _target_block(cfg: RunConfig, target: int) -> np.ndarray:
    spec = party_spec({"partition-id": target}, cfg.num_parties, cfg.num_active)
    return party_data(cfg, spec).X_train.astype(np.float64)


def _score(cfg: RunConfig, target: int, R: list[np.ndarray], V: list[np.ndarray]) -> float:
    """The target's Gram error from equations G v = r (1.0 with none)."""
    X = _target_block(cfg, target)
    if not R:
        return 1.0
    est = fit_exact(np.stack(R, axis=1), np.stack(V, axis=1).astype(np.float64), X.shape[1])
    return min(attacks.gram_error(est, X, attacks.score_rows(len(X), cfg.seed)), 1e9)


def replay_round(server: HandServer, grid: Hijack, server_round: int, nu: np.ndarray,
                  **passive: np.ndarray) -> list[Message]:
    """Round ``server_round`` again under one view: every passive party's honest message with ν
    replaced by ``nu`` (and any other array of ``passive``: one part for the role), the active
    party's as it was."""
    out = []
    for nid in grid.node_ids:
        msg = grid.honest(server_round, nid)
        out.append(replayed(msg) if server.role(nid) == msgs.ROLE_ACTIVE else replayed(msg, nu=nu, **passive))
    return server.exchange(out)


def rejoin_replay(run_config: dict, folder: Path, target: int = 2, probes: int | None = None, stop_at: int = 4,
                  identities: list[dict] | None = None, seed: int = 0) -> Breach:
    """Isolate ``target`` across sessions: after round P − 1 (P = ``stop_at``), per probe,
    ``query.rejoin(P − 2)`` to the target alone (it restores round P − 2 from its disk), a
    fresh signed session, then round P − 1 again with one consistent view: the same probe ν
    to every passive party. A party that kept its reply of round P − 1 answers the "re-send"
    from it; only the target steps, so each decoded sum minus the honest one of round P − 1
    is that party's step alone: (1/η) G_T (ν_P−1 − ν). Gradient descent or block Newton
    (Newton: the honest round P − 1 is not linear in ν, so the first probe is ν = 0, the
    reference, and its probes keep the passive curvature zero). ``probes``: default the
    target's column count (discovery gives it), one equation each."""
    cfg = RunConfig.from_flower(run_config)
    newton = resolve(cfg).algorithm is NEWTON
    grid = take_over(run_config, stop_at, folder, identities)
    server, last = HandServer(grid), stop_at - 1
    target_node = grid.node_ids[target]
    n = len(to_numpy(grid.honest(last, target_node).content.array_records[msgs.PAYLOAD]["nu"]))
    count = probes or _target_block(cfg, target).shape[1]
    record, key, scale = (msgs.DIRECTIONS, "dir", cfg.mu_value(n)) if newton else (msgs.LOGITS, "train", cfg.eta)
    nus = probe_vectors(n, count + newton, seed, newton)
    if newton:
        nus[0] = np.zeros(n, dtype=np.float32)
        reference, ref_nu = None, None
    else:
        reference = grid.honest_sum(last)
        ref_nu = to_numpy(grid.honest(last, target_node).content.array_records[msgs.PAYLOAD]["nu"])
    R, V, decoded = [], [], 0
    for nu in nus:
        server.rejoin([target_node], last - 1)
        if not server.session():
            continue
        total = server.decode(replay_round(server, grid, last, nu), record, key)
        if total is None:
            continue
        decoded += 1
        if reference is None:
            reference, ref_nu = total, nu
            continue
        R.append(scale * (reference - total))
        V.append(nu.astype(np.float64) - ref_nu.astype(np.float64))
    role = (("block Newton: " if newton else "")
            + f"query.rejoin to party {target} alone, a fresh session, round {last} replayed")
    return Breach(role, _score(cfg, target, R, V), len(nus), decoded, server.refusals, server.refused_by)


def rejoin_resend(run_config: dict, folder: Path, target: int = 2, probes: int | None = None, stop_at: int = 4,
                  identities: list[dict] | None = None, seed: int = 0) -> Breach:
    """One party's step, twice, on a byte-identical re-send: per probe, round t (from P =
    ``stop_at`` on) with the same probe ν to every passive party (one view, the active party
    its honest message of round P − 1 renumbered); then ``query.rejoin`` of round t to the
    target alone, a fresh session and round t again, byte for byte, to every party. A party that forgot on the
    rejoin which message it answered steps again; the others answer their kept replies, so
    the second sum minus the first is that party's second step alone,
    −(μ/η) u_T − (1/η) G_T ν: G_T ν up to a term μ/η smaller. Gradient descent."""
    cfg = RunConfig.from_flower(run_config)
    grid = take_over(run_config, stop_at, folder, identities)
    server = HandServer(grid)
    target_node = grid.node_ids[target]
    X = _target_block(cfg, target)
    n = len(X)
    nus = probe_vectors(n, probes or X.shape[1], seed)
    R, V, decoded, repeated = [], [], 0, 0
    server.session()
    for t, nu in enumerate(nus, start=stop_at):
        messages = []
        for nid in grid.node_ids:
            passive = {} if server.role(nid) == msgs.ROLE_ACTIVE else {"nu": nu}
            msg = replayed(grid.honest(stop_at - 1, nid), **passive)
            config_records(msg.content)[msgs.ROUND] = msgs.round_config(t, False)
            messages.append(Message(msg.content, dst_node_id=nid, message_type=msg.metadata.message_type,
                                    group_id=str(t)))
        first = server.decode(server.exchange(messages))
        server.rejoin([target_node], t)
        server.session()  # a fresh session: new pair keys, no nonce used yet
        again = server.decode(server.exchange([replayed(m) for m in messages]))
        if first is None or again is None:
            continue
        decoded += 1
        repeated += int(np.array_equal(first, again))
        R.append(cfg.eta * (first - again))
        V.append(nu.astype(np.float64))
    return Breach(f"round t to every party, query.rejoin of round t to party {target} alone, a fresh session, round t "
                  "again byte for byte", _score(cfg, target, R, V), len(nus), decoded, server.refusals,
                  server.refused_by, repeated=repeated)


def init_replay(run_config: dict, folder: Path, target: int = 2, probes: int | None = None, stop_at: int = 4,
                identities: list[dict] | None = None, seed: int = 0) -> Breach:
    """Restart ``target`` alone: per probe, a fresh session with the start message (round 0) to
    the target only (its θ back to the seeded start, zero for a linear block), then another
    fresh session and round P − 1 again with the same probe ν to every passive party; the
    others answer their kept replies. The first probe is ν = 0: that sum is everyone's but the
    target's, so under gradient descent the honest sum of round P − 1 minus it is the
    target's real partial logits; each later one gives G_T ν (times 1/η; block Newton: 1/μ,
    with no step lengths, as the restarted target holds no directions, and probes that keep
    its curvature zero)."""
    cfg = RunConfig.from_flower(run_config)
    newton = resolve(cfg).algorithm is NEWTON
    grid = take_over(run_config, stop_at, folder, identities)
    server, last = HandServer(grid), stop_at - 1
    target_node = grid.node_ids[target]
    X = _target_block(cfg, target)
    n = len(X)
    nus = [np.zeros(n, dtype=np.float32), *probe_vectors(n, probes or X.shape[1], seed, newton)]
    if newton:
        record, key, scale = msgs.DIRECTIONS, "dir", cfg.mu_value(n)
        start, extra = msgs.NEWTON_INIT, {"alpha": np.zeros(0)}
    else:
        record, key, scale, start, extra = msgs.LOGITS, "train", cfg.eta, msgs.INIT, {}
    weight = to_numpy(array_records(grid.contexts[target_node].state)[MODEL_STATE]["weight"])
    real = (X @ weight.astype(np.float64).reshape(-1)).astype(np.float32).astype(np.float64)  # for scoring only
    honest, base = grid.honest_sum(last, record, key), None
    R, V, decoded, logits_error = [], [], 0, None
    init = Message(RecordDict({msgs.ROUND: msgs.round_config(0, False)}), dst_node_id=target_node,
                   message_type=start, group_id="0")
    for nu in nus:
        server.session()
        server.exchange([replayed(init)])  # a refusal does not stop the server trying the rest
        if not server.session():
            continue
        total = server.decode(replay_round(server, grid, last, nu, **extra), record, key)
        if total is None:
            continue
        decoded += 1
        if base is None:
            base = total
            if not newton:
                logits_error = min(float(np.linalg.norm(honest - base - real) / np.linalg.norm(real)), 1e9)
            continue
        R.append(scale * (base - total))
        V.append(nu.astype(np.float64))
    role = ("block Newton: " if newton else "") + f"{start} (round 0) to party {target} alone in a fresh session, " \
        f"round {last} replayed"
    return Breach(role, _score(cfg, target, R, V), len(nus), decoded, server.refusals, server.refused_by,
                  logits_error=logits_error)


class DictionaryTest(LyingGrid):
    """Stands in for the label owner at the alignment's raise step: every other party gets ids
    of the server's choosing, blinded under the server's own key (the label owner's signature
    copied over). Were it raised, comparing with the party's blinded list would tell the
    server which of its ids the party holds."""

    def __init__(self, *a, chosen: np.ndarray, **kw) -> None:
        super().__init__(*a, **kw)
        self.blinded = psi.blind_step(normalise_ids(chosen), shuffle=False)[0]

    def tamper(self, msg: Message) -> None:
        if msg.metadata.message_type == alignment.ALIGN_RAISE:
            fields = config_records(msg.content)[alignment.STEP]
            config_records(msg.content)[alignment.STEP] = ConfigRecord({**fields, "blinded": self.blinded})


def _own_tables(folder: Path, rows: int = 2000) -> tuple[dict, np.ndarray]:
    """Four parties' own tables cut from Adult (90 % of the ids each, their own columns); the
    run config that aligns them, and the ids."""
    parties = (["age", "sex", "income"], ["fnlwgt"], ["capital-gain"], ["hours-per-week"])
    df = pd.read_csv(packaged_file("adult.csv.gz")).iloc[:rows][["row_id", *sum(parties, [])]].copy()
    df["customer"] = [f"C{i:06d}" for i in df["row_id"]]
    folder.mkdir(parents=True, exist_ok=True)
    for k, cols in enumerate(parties):
        df[["customer", *cols]].sample(frac=0.9, random_state=k).to_csv(folder / f"party{k}.csv", index=False)
    rc = RunConfig.from_flower({"dataset": "adult", "num-parties": 4, "num-active": 1, "optimizer": "gd",
                                "num-server-rounds": 2, "tables.own": True, "tables.reuse-alignment": False,
                                "tables.path": str(folder / "party{partition}.csv"), "tables.id-column": "customer",
                                "output-dir": str(folder / "runs")}).to_flower()
    return rc, df["customer"].to_numpy()


def _config(dataset: str, rounds: int, folder: str, **extra) -> dict:
    return RunConfig.from_flower({**RunConfig().to_flower(), "optimizer": "gd", "dataset": dataset,
                                  "num-server-rounds": rounds, "stop-tolerance": 0.0, "output-dir": folder,
                                  "privacy.secure-aggregation": True, **extra}).to_flower()


def _refused(replies: list[Message], what: str) -> str:
    refused = [r for r in replies if r.has_error()]
    return f"refused by {len({r.metadata.src_node_id for r in refused})} parties ({what})" if refused else "not refused"


def across_sessions(dataset: str, folder: Path, target: int = 2) -> list[dict]:
    """The hand-played roles that step one party away from the others across sessions (a
    rejoin, a restart, a rejoin between a round and its re-send), with pinned identity keys,
    under gradient descent and block Newton; each with its result line, whether it was refused
    with nothing decoded, and the target's Gram error."""
    out = []
    roles_of = {"gd": ("gradient descent", (rejoin_replay, init_replay, rejoin_resend)),
                "newton": ("block Newton", (rejoin_replay, init_replay))}
    how = {rejoin_replay: f"query.rejoin of round 2 to party {target} alone, a fresh session, round 3 again with one "
                          "probe ν to every passive party",
           init_replay: f"the start message (round 0) to party {target} alone in a fresh session, round 3 again with "
                        "one probe ν to every passive party",
           rejoin_resend: "round t with one probe ν to every passive party, query.rejoin of round t to party "
                          f"{target} alone, a fresh session, round t again byte for byte"}
    for optimizer, (method, attacks_) in roles_of.items():
        rc = _config(dataset, 10, str(folder / "runs"), optimizer=optimizer)
        ids = identity.generate_identities(folder / "identities", rc["num-parties"])
        for attack in attacks_:
            got = attack(rc, folder / f"{optimizer}-{attack.__name__}", target=target, identities=ids)
            out.append({"role": f"{how[attack]} ({method}, one probe per column of the party)", "result": got.summary(target),
                        "refused": got.refused, "gram_error": got.gram_error})
    return out


def roles(dataset: str, rounds: int, folder: Path) -> list[dict]:
    """Every malicious-server role against the real ClientApps: what it got ("refused", or the figure)."""
    out = []
    rc = _config(dataset, rounds, str(folder / "runs"))
    for probe, role in ((True, "a probe ν to party 2 only, ν = 0 to the others"),
                        (False, "the real ν to party 2 only, ν = 0 to the others")):
        r = isolate(rc, 2, probe=probe)
        out.append({"role": role, "result": (f"refused in round {r.refused_round} by {len(r.reasons)} parties; "
                                             f"party 2's Gram error {r.gram_error:.3g}") if r.refused_round
                    else f"party 2's Gram error {r.gram_error:.3g}"})
    both = isolate(rc, None)
    out.append({"role": "the same probe ν to every passive party (one consistent view)",
                "result": f"the passive parties' summed Gram matrix, error {both.gram_error:.3g} after {rounds} rounds"})
    k = rc["num-parties"]
    grid = ResendChanged(client_app, rc, k)
    run_server(grid, rc)
    out.append({"role": "a re-sent round with changed ν", "result": _refused(grid.answers, "a second view of round 3")})
    out += across_sessions(dataset, folder / "sessions")
    manifest = export(RunConfig.from_flower({**rc, "num-server-rounds": 2}), folder / "parties", demo_keys=True)
    deployed = manifest["node_configs"]
    cases = (
        ("forged demo keys (deployed nodes without their own keys)",
         [{n: v for n, v in node.items() if n not in (identity.IDENTITY_KEY, identity.PEERS)} for node in deployed], {}),
        ("an unmasked run config against deployed nodes", deployed, {"privacy.secure-aggregation": False}),
    )
    for role, nodes, extra in cases:
        run = RunConfig.from_flower({"num-server-rounds": 2, **manifest["run_config"], **extra,
                                     "output-dir": str(folder / "deployed")}).to_flower()
        grid = LyingGrid(client_app, run, k, node_configs=nodes)
        try:
            run_server(grid, run)
        except FederationError:
            pass
        got = [a for a in grid.values(msgs.LOGITS, msgs.DIRECTIONS)]
        out.append({"role": role, "result": _refused(grid.replies(), "before any value left them")
                    + ("" if not got else f"; {len(got)} arrays reached the server")})
    own, ids = _own_tables(folder / "own")
    grid = DictionaryTest(client_app, own, 4, chosen=ids[:1000])
    try:
        run_server(grid, own)
    except FederationError:
        pass
    raised = [r for r in grid.replies(alignment.ALIGN_RAISE) if not r.has_error()]
    out.append({"role": "alignment: a raise request with 1,000 ids of the server's choice (Adult)",
                "result": _refused(grid.replies(alignment.ALIGN_RAISE), "alignment step 'raise'")
                + ("" if not raised else f"; {len(raised)} parties raised them")})
    return out


def main(argv: list[str] | None = None) -> None:
    """Print what the isolation attack and a consistent crafted broadcast give the server."""
    import argparse
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="crime,compas")
    p.add_argument("--rounds", default="10,30,100")
    args = p.parse_args(argv)
    print("| dataset | rounds | probe ν to party 2 only | real ν to party 2 only | the same probe ν to every passive party: Σ_k X_k X_kᵀ |")
    print("|---|---:|---|---|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for dataset in args.datasets.split(","):
            for rounds in map(int, args.rounds.split(",")):
                rc = _config(dataset, rounds, tmp)
                cells = []
                for probe in (True, False):
                    r = isolate(rc, 2, probe=probe)
                    cells.append(f"refused in round {r.refused_round} by {len(r.reasons)} parties; Gram error "
                                 f"{r.gram_error:.3g}" if r.refused_round else f"Gram error {r.gram_error:.3g}")
                both = isolate(rc, None)
                print(f"| {dataset} | {rounds} | {cells[0]} | {cells[1]} | {both.gram_error:.3g} |")


if __name__ == "__main__":
    main()
