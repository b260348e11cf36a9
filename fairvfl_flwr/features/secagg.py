"""Secure aggregation of partial logits (run config ``privacy.secure-aggregation = true``).

Without it the server receives every party's partial logits u_k, and for a linear party
u_k(t) = (1 − μ/η) u_k(t−1) − (1/η) X_k X_kᵀ ν(t) with ν(t) computed by the server
itself: a few dozen rounds give it X_k X_kᵀ (the audit's server attack). With it every
party adds pairwise masks that cancel in the sum, so the server learns z = Σ_k u_k and,
per party, words indistinguishable from uniform noise.

Set-up (:func:`agree_keys`: the :class:`SecureAggregation` hook before the first logits,
and a scoring job before its first chunk):

============== ================================ =====================================
message type    from server                      reply
============== ================================ =====================================
query.sakeys    a fresh session id               a fresh X25519 public key, signed
query.sapeers   every party's key and signature  (nothing): each pair now shares a key
============== ================================ =====================================

A training run adds no message for it: its discovery message (``query.info``) carries the
session id and the reply the signed key beside the party's role, and round 0's messages
carry every party's key and signature (record ``secagg-peers``, covered by the round's
view), which each party checks and turns into pair keys before it acts on anything else
in the message. A rejoin's fresh session and a scoring job use the two messages above.
What a party signs and checks is the same either way.

Every party has a long-term Ed25519 identity key made on its own machine (node config
``identity-key``, a PEM file) and every party's public identity key, pinned out of band
(node config ``peers``, a JSON file partition id -> hex, that the operator distributes with
the party files; :func:`generate_identities` writes both, the export tool uses it). A party
signs ``SIGNED ‖ partition id ‖ session id ‖ X25519 key``; on ``query.sapeers`` it checks
every peer's signature against that peer's pinned key and its own session id and refuses
the run naming the peer if one fails, so a server that substitutes keys (to strip the
masks) stops the run before any logits leave a party. Without identity files (simulation
with the packaged data) keys derived from the partition id stand in: anyone can derive
them, so they show the protocol working and authenticate nothing; a party with a
``data-path`` and no ``identity-key`` is refused. Party i and j derive
k_ij = HKDF-SHA256(X25519(sk_i, pk_j), salt = session id).

Nonces: a mask's nonce is (round, label) under k_ij, and the party itself keeps which it
used (:class:`_Nonces`): it masks only rounds that advance, and in its latest round each
label once, or again for the bit-identical vector. A server relabelling a later round as an
earlier one (where θ = 0 made a reply its bare mask) is refused; a re-sent request gets its
identical masked reply. A scoring chunk's round is its first row.

Sessions: a fresh session is a new key pair and pair keys, so nonces start afresh; the old
session's view awaiting confirmation ends with it, and what stands for it is the round and
history head every party signs into the set-up (flower/history.py): a party refuses a
session any peer entered at another round or head, so a session never moves one party
alone. A rollback (a rejoin's fresh session, a resumed run's first) is a set-up in which
every party signs the round and head it stored, and restores only once all signed the same.
A party keeps every session it has joined in this run (on its own disk too) and refuses one
it has already left: a replayed set-up never brings back old keys.

Every reply's logits (training and test, round 0 included) are encoded in fixed point,
q = round(u · 2^48) as 64-bit words, and party i sends q_i + Σ_{j>i} m_ij − Σ_{j<i} m_ji
mod 2^64, with m_ij = AES-256-CTR(k_ij, nonce = (round, split)) a pseudo-random word per
row. The masks cancel in Σ_i, which the server decodes to z exactly (the integer sum is
exact; every float32 with |u| ≥ 2^-25 is a whole number of 2^-48 steps). Masks depend on
the round and split (and the session's keys), so a re-sent message (the guard answers it
from the same θ) gets the identical masked reply: nothing new is revealed. A party that stays silent
makes the exchange re-send and then stop the run; no round is ever unmasked for a subset
of parties (there is no unmasking step at all).

Each reply's ‖θ_k‖² (the μ-term of the objective) is masked too, in a 128-bit ring with 64
fraction bits (:func:`masked_wide`): the server learns Σ_k ‖θ_k‖² only.

Under block Newton (algorithms/newton.SharedNewtonVFL, "shared step lengths") a round's
reply is a party's ``directions`` instead of logits: X_k s_k (and on evaluation rounds
X_test θ_k, X_test D_k) in the 64-bit ring as the logits, and the small per-party
quantities a = θ_k·d_j and the Gram matrix d_iᵀd_j in the 128-bit ring (their scale is not
bounded as a logit's is, and near convergence they are tiny). Every vector a party masks
in a round has its own nonce label (:data:`SPLITS`), so no two vectors ever share a mask.
The server gets the sums over parties, which is all the shared-step search needs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import secrets
import struct
from collections.abc import Callable
from logging import ERROR, INFO as LOG_INFO
from pathlib import Path

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.config.node import NodeConfig, NodeConfigError
from fairvfl_flwr.flower import history, roundview, store
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.jobs import Job
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.hooks import RoundHook, ServerView
from fairvfl_flwr.flower.party import PartyRuntime, mark_round_state, round_of

FRACTION_BITS = 48
SCALE = float(2**FRACTION_BITS)
LIMIT = 2.0 ** (63 - FRACTION_BITS)  # |z| must stay below this for the sum not to wrap
KEYS_STATE = "fairvfl.secagg-keys"  # ArrayRecord on the party: its private key, then the pair keys
SESSION_STATE = "fairvfl.secagg-session"  # ConfigRecord on the party: the set-up its key pair belongs to
NONCE_STATE = "fairvfl.secagg-nonces"  # ConfigRecord on the party: the last round it masked, what it masked in it
SESSIONS_STATE = "fairvfl.secagg-sessions"  # ConfigRecord on the party: every session it has joined in this run
IDENTITY_KEY = "identity-key"  # node config: this party's Ed25519 private key (PEM file)
PEERS = "peers"  # node config: JSON file, partition id -> every party's Ed25519 public key (hex)
#: Node config: true lets a deployed party *without identity keys* answer unmasked rounds. It
#: authenticates nothing less: such a node cannot sign, so it takes no part in a masked run or a
#: private alignment, and a node that holds identity keys refuses unmasked jobs whatever it says.
ALLOW_UNMASKED = "allow-unmasked"
KEY_TOOL = "`fairvfl-keys new` (this party's key) and `fairvfl-keys peers` (the pinned peers file)"
WIDE_FRACTION_BITS = 64
WIDE_LIMIT = 2.0 ** (127 - WIDE_FRACTION_BITS)  # the 128-bit ring's signed range, in value units
_WIDE_MOD = 1 << 128
#: Nonce label of every vector a party masks; one round's reply never uses a label twice,
#: and the Newton directions reply and the apply reply after it (same round) use distinct ones.
SPLITS = {"train": 0, "test": 1, "dir": 2, "dir-test": 3, "dir-test-dirs": 4, "dir-a": 5, "dir-gram": 6,
          "dir-sq-norm": 7, "sq-norm": 8, "score": 9}
#: Keys of a Newton directions reply summed in the 128-bit ring (float64, unbounded scale).
WIDE_KEYS = ("a", "gram")
#: ConfigRecord on a training run's first bound messages: every party's signed key (``pk-<party>``,
#: ``sig-<party>`` -> bytes; ``round-<party>``, ``head-<party>``: the history it signed). Config
#: records, not arrays, here and in the set-up's messages: Flower moves every array of a message
#: as objects of their own, in a request each at every hop.
RELAY = roundview.RELAY
#: ConfigRecord of a masked reply: ‖θ_k‖², its 128-bit word as 16 bytes (two little-endian uint64, high
#: then low; its metric is then 0). One config value, not an array: see :data:`RELAY`.
SQ_NORM = "secagg-sq-norm"
INFO = b"fairvfl-flwr secure aggregation v1"
SIGNED = b"fairvfl-flwr secure aggregation key v2"  # prefix of what a party signs
DEMO_IDENTITY = b"fairvfl-flwr demo identity key"  # simulation without identity files: public, proves nothing


# -- encoding and masks (both sides) ----------------------------------------------------
def encode(u: np.ndarray, num_parties: int, who: str, what: str = "partial logit") -> np.ndarray:
    """Fixed point: round(u · 2^48) as uint64 words (two's complement)."""
    u = np.asarray(u, dtype=np.float64)
    bound = LIMIT / (2 * num_parties)  # a true sum stays below LIMIT / 2: the server can tell masks that failed to cancel
    if not np.all(np.abs(u) < bound):  # the magnitude stays in this party's log: the server learns no value
        log(ERROR, "%s: a %s of magnitude %.4g is beyond the secure-aggregation range", who, what, np.max(np.abs(u)))
        raise ValueError(f"{who}: a {what} is beyond the secure-aggregation range ±{bound:.4g} "
                         f"(2^{62 - FRACTION_BITS} / num-parties); the run is diverging")
    return np.rint(u * SCALE).astype(np.int64).view(np.uint64)


def decode(words: np.ndarray) -> np.ndarray:
    """The fixed-point words of a sum back to floats (two's complement over 2^64, FRACTION_BITS after the point)."""
    return np.asarray(words, dtype=np.uint64).view(np.int64).astype(np.float64) / SCALE


def _keystream(key: bytes, server_round: int, split: str, nbytes: int) -> bytes:
    """The pair's AES-256-CTR keystream for one round and split (label): ``nbytes`` bytes."""
    nonce = struct.pack(">QII", server_round, SPLITS[split], 0)
    return Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor().update(bytes(nbytes))


def mask(key: bytes, server_round: int, split: str, rows: int) -> np.ndarray:
    """The pair's pseudo-random words for one round and split."""
    return np.frombuffer(_keystream(key, server_round, split, 8 * rows), dtype=np.uint64)


def masked(u: np.ndarray, own: int, pair_keys: dict[int, bytes], server_round: int, split: str,
           num_parties: int, who: str, what: str = "partial logit") -> np.ndarray:
    """q_own + Σ_{j>own} m_{own,j} − Σ_{j<own} m_{j,own} (mod 2^64)."""
    out = encode(u, num_parties, who, what)
    for other, key in pair_keys.items():
        m = mask(key, server_round, split, len(out))
        out = out + m if other > own else out - m  # uint64: wraps mod 2^64
    return out


def encode_wide(v: np.ndarray, num_parties: int, who: str, what: str) -> list[int]:
    """Fixed point in the 128-bit ring: round(v · 2^64) as Python ints (exact for every float64 ≥ 2^-11)."""
    v = np.asarray(v, dtype=np.float64).ravel()
    bound = WIDE_LIMIT / (2 * num_parties)
    if not np.all(np.abs(v) < bound):  # also refuses NaN; the values stay in this party's log
        log(ERROR, "%s: %s %r is not finite or beyond the secure-aggregation range", who, what, v.tolist())
        raise ValueError(f"{who}: {what} is not finite or beyond the secure-aggregation range ±{bound:.4g}")
    return [round(float(x) * 2.0**WIDE_FRACTION_BITS) % _WIDE_MOD for x in v]


def mask_wide(key: bytes, server_round: int, split: str, count: int) -> list[int]:
    """The pair's pseudo-random 128-bit words for one round and label."""
    stream = _keystream(key, server_round, split, 16 * count)
    return [int.from_bytes(stream[16 * i:16 * i + 16], "big") for i in range(count)]


def masked_wide(v: np.ndarray, own: int, pair_keys: dict[int, bytes], server_round: int, split: str,
                num_parties: int, who: str, what: str) -> np.ndarray:
    """:func:`masked` in the 128-bit ring; on the wire two uint64 words per value (high, low)."""
    out = encode_wide(v, num_parties, who, what)
    for other, key in pair_keys.items():
        m = mask_wide(key, server_round, split, len(out))
        sign = 1 if other > own else -1
        out = [(q + sign * w) % _WIDE_MOD for q, w in zip(out, m)]
    return np.array([[q >> 64, q & (2**64 - 1)] for q in out], dtype=np.uint64).reshape(-1)


def sum_wide(words: list[np.ndarray]) -> list[int]:
    """The 128-bit sum of several replies' words (each high, low per value)."""
    total = [0] * (len(words[0]) // 2)
    for w in words:
        pairs = np.asarray(w, dtype=np.uint64).reshape(-1, 2)
        total = [(t + (int(hi) << 64 | int(lo))) % _WIDE_MOD for t, (hi, lo) in zip(total, pairs)]
    return total


def decode_wide(total: list[int]) -> np.ndarray:
    """The 128-bit sums (Newton's inner products, ``WIDE_KEYS``) back to floats."""
    return np.array([(q - _WIDE_MOD if q >> 127 else q) / 2**WIDE_FRACTION_BITS for q in total], dtype=np.float64)


def pair_key(private: X25519PrivateKey, peer_public: bytes, a: int, b: int, session: str = "") -> bytes:
    """k_ab = HKDF-SHA256(X25519 secret, salt = the signed session id): a new set-up, new masks."""
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    pair = struct.pack(">II", min(a, b), max(a, b))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=session.encode() or None, info=INFO + pair).derive(shared)


def signed_text(session: str, partition_id: int, public: bytes, server_round: int, head: bytes) -> bytes:
    """What a party signs with its identity key: its ephemeral X25519 key for this set-up and party,
    and the round and history head it enters the session with (flower/history.py)."""
    return (SIGNED + struct.pack(">I", partition_id) + session.encode() + b"\0" + public
            + struct.pack(">q", server_round) + head)


def new_identity(path: Path) -> str:
    """Write a new Ed25519 identity (private key, PEM, file mode 0600) to ``path``, which must
    not exist; return its public key (hex), the one thing that leaves this machine."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:  # never readable by others
        f.write(pem)
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def public_key(hex_key: str, where: str) -> Ed25519PublicKey:
    """An Ed25519 public key from its hex, or an error naming ``where`` it came from."""
    try:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(str(hex_key).strip()))
    except ValueError as err:
        raise NodeConfigError(f"{where}: not an Ed25519 public key in hex (64 hex digits): {err}") from None


def fingerprint(hex_key: str) -> str:
    """A short fingerprint of a public identity key, to read aloud for an out-of-band check."""
    digest = hashlib.sha256(bytes.fromhex(str(hex_key).strip())).hexdigest()[:20]
    return " ".join(digest[i:i + 4] for i in range(0, 20, 4))


def generate_identities(folder: Path, num_parties: int) -> list[dict[str, str]]:
    """One Ed25519 identity per party written under ``folder`` (``party-<k>.key``, and
    ``peers.json`` with every public key), and each party's node-config entries naming them.
    Demo keys for tests and one-machine trials only: every private key in one folder. In a
    deployment each party runs ``fairvfl-keys new`` on its own machine (tools/keys.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    peers, configs = {}, []
    for k in range(num_parties):
        path = folder / f"party-{k}.key"
        path.unlink(missing_ok=True)
        peers[str(k)] = new_identity(path)
        configs.append({IDENTITY_KEY: str(path), PEERS: str(folder / "peers.json")})
    (folder / "peers.json").write_text(json.dumps(peers, indent=1) + "\n")
    return configs


# -- the server's side -----------------------------------------------------------------
def agree_keys(parties: list[tuple[int, int, str]], send, rollback: int | None = None) -> str:
    """Relay a key set-up: each party's signed X25519 key to every party; returns the session id.

    ``parties``: (node id, partition id, name) of each; ``send(messages)`` returns the
    replies in the order of ``messages``. A new session id per set-up: new pair keys.
    ``rollback``: every party moves back to its stored state of that round, once all signed it."""
    # A re-sent request of the same set-up gets the same key back (the first reply may arrive late).
    session = new_session()
    asks = [Message(RecordDict({"secagg": key_request(session, rollback)}), dst_node_id=nid,
                    message_type=msgs.SECAGG_KEYS, group_id="secagg") for nid, _, _ in parties]
    relay_keys(parties, signed_keys(parties, send(asks), session), send)
    return session


def new_session() -> str:
    """A fresh session id for one key set-up."""
    return secrets.token_hex(16)


def key_request(session: str, rollback: int | None = None) -> ConfigRecord:
    """What asks a party for its signed key of set-up ``session`` (on ``query.sakeys``, or on the
    run's discovery message, which then brings the keys back with the parties' roles);
    ``rollback``: the round every party is to restore, which each then signs instead of its own."""
    return ConfigRecord({"session": session} if rollback is None else {"session": session, "rollback": int(rollback)})


def signed_keys(parties: list[tuple[int, int, str]], replies: list[Message], session: str) -> dict[str, bytes]:
    """Each party's signed X25519 key of set-up ``session`` from its reply (in the order of
    ``parties``), keyed for the relay; the log says whether any party signed with a demo key."""
    public, demo = {}, []
    for (_, pid, name), reply in zip(parties, replies):
        record = reply.content.config_records.get("secagg") or ConfigRecord()
        key, signature, head = record.get("public"), record.get("signature"), record.get("head")
        server_round = record.get("round")
        if (not isinstance(key, bytes) or len(key) != 32 or not isinstance(signature, bytes)
                or not isinstance(head, bytes) or not isinstance(server_round, int)):
            raise FederationError(f"{name} sent no signed X25519 public key for secure aggregation")
        public[f"pk-{pid}"], public[f"sig-{pid}"] = key, signature
        public[f"round-{pid}"], public[f"head-{pid}"] = server_round, head
        if _demo_signed(pid, session, key, signature, server_round, head):
            demo.append(pid)
    # The operator's evidence that the deployment is authenticated: a demo key is public, so the
    # server can tell one apart (each party's own check against its pinned peers file is what counts).
    who = (f"parties {', '.join(map(str, demo))} signed with the demo identity keys anyone can derive "
           "(simulation only: a deployed party refuses them)" if demo else
           "every party signed its key with its own identity key, none with a demo key")
    log(LOG_INFO, "FairVFL: secure aggregation on: session %s…, %d parties; %s", session[:8], len(parties), who)
    return public


def relay_keys(parties: list[tuple[int, int, str]], public: dict[str, bytes], send) -> None:
    """Every party's signed key to every party (``query.sapeers``): each then checks them and derives its pair keys."""
    send([Message(RecordDict({"secagg": ConfigRecord(dict(public))}), dst_node_id=nid, message_type=msgs.SECAGG_PEERS,
                  group_id="secagg") for nid, _, _ in parties])


def _demo_signed(partition_id: int, session: str, key: bytes, signature: bytes, server_round: int,
                 head: bytes) -> bool:
    """Whether a party's signed key verifies under the demo identity of its partition."""
    try:
        _demo_key(partition_id).public_key().verify(signature, signed_text(session, partition_id, key,
                                                                           server_round, head))
    except InvalidSignature:
        return False
    return True


def mask_round(message: Message) -> int | None:
    """The round a reply to ``message`` is masked under: a scoring chunk's first row, else
    the round config's round (None: the message carries none)."""
    if message.metadata.message_type == msgs.SCORE:
        return int(message.content.config_records["score"]["start"])
    return round_of(message)[0] if msgs.ROUND in message.content.config_records else None


def unmask_sum(words: list[np.ndarray], what: str) -> np.ndarray:
    """The decoded sum of several parties' masked 64-bit words; masks that did not cancel stop the run."""
    return cancelled(decode(np.sum(words, axis=0, dtype=np.uint64)), LIMIT / 2, f"{what}: the masks")  # mod 2^64


def cancelled(total: np.ndarray, limit: float, masks: str) -> np.ndarray:
    """``total`` when every value lies within ``limit``; else the masks named by ``masks`` did
    not cancel (a decoded sum of uncancelled masks is uniform over the whole range)."""
    if np.any(np.abs(total) >= limit):
        raise FederationError(f"{masks} did not cancel (the parties' pair keys differ: a node restarted or a reply "
                              "was altered); no party's values were revealed; start the run again")
    return total


class SecureAggregation(RoundHook):
    """Key set-up before the first logits; every round, the masked replies summed to z.

    The decoded z goes to the server's state as the first party's logits and zeros for
    the others: the server's z is exact, its per-party view is what it received (noise).
    Every message after the set-up carries the exchange's view and the confirmations the
    parties sent with their last masked replies (flower/roundview.py).
    """

    def __init__(self, resume: int | None = None) -> None:
        self.resume = resume  # a resumed run: its first set-up moves every party back to this round

    views: roundview.ServerViews | None = None
    asked: str | None = None  # the session whose keys the discovery messages asked for
    offered: dict[str, bytes] | None = None  # every party's signed key of that session, from its discovery reply
    relay: dict[str, bytes] | None = None  # those keys, to ride on the first bound messages (round 0)

    def discovered(self, server: ServerView, replies: list[Message]) -> None:
        """The parties' signed keys, asked for on the discovery messages: the set-up then needs one
        message more (the relay), not two."""
        if self.asked is None or self.views is not None:
            return
        by_node = {r.metadata.src_node_id: r for r in replies}
        self.offered = signed_keys(self.parties(server), [by_node[n.node_id] for n in server.ordered_nodes()],
                                   self.asked)

    def begin(self, server: ServerView, grid: Grid, timeout: float, rollback: int | None = None) -> None:
        """Agree the pairwise keys of every party before round 0; the run then starts at round 1.
        The keys the discovery replies brought ride on round 0's messages, under their view;
        otherwise (a rejoin's fresh session, every party moving back to round ``rollback``) the
        set-up is its own two messages."""
        rollback, self.resume = (self.resume if rollback is None else rollback), None
        if self.offered is not None and rollback is None:
            self.relay, session = self.offered, self.asked
        else:
            session = agree_keys(self.parties(server), lambda messages: server.exchange(grid, messages, timeout),
                                 rollback)
        self.offered = None  # a later set-up (a rejoin) is a fresh session
        self.views = roundview.ServerViews(session)
        return None

    @staticmethod
    def parties(server: ServerView) -> list[tuple[int, int, str]]:
        """(node id, partition id, name) of every party, in partition order."""
        return [(n.node_id, n.partition_id, str(n)) for n in server.ordered_nodes()]

    def rejoined(self, server: ServerView, grid: Grid, timeout: float, restored: int) -> None:
        """A party came back (its pair keys died with it): every party joins a fresh signed session
        that moves all of them back to round ``restored`` at once (each signs the history head it
        restores; none moves unless all signed the same); new pair keys and nonces."""
        self.begin(server, grid, timeout, rollback=restored)

    def outgoing(self, server: ServerView, messages: list[Message]) -> None:
        """Bind each outgoing message to the round's view (what every party was sent), so masks cancel
        only when all saw the same. Before the set-up, the discovery messages ask for every party's
        signed key of a fresh session."""
        if self.views is None:
            for message in messages:
                if message.metadata.message_type == msgs.INFO:
                    self.asked = self.asked or new_session()
                    message.content.config_records["secagg"] = key_request(self.asked)
        else:
            bound = [m for m in messages if m.metadata.message_type not in roundview.UNBOUND]
            if self.relay is not None and bound:  # every party checks every key before it acts on the message
                for message in bound:
                    message.content.config_records[RELAY] = ConfigRecord(dict(self.relay))
                self.relay = None
            self.views.attach(messages, lambda nid: server.nodes[nid].role,
                              lambda nid: server.nodes[nid].partition_id, mask_round)

    def incoming(self, server: ServerView, grid: Grid, server_round: int, replies: list[Message],
                 timeout: float) -> list[Message]:
        """Each masked record summed over the parties: the first party's reply holds the sum,
        the others zeros (the server's z and the Newton search read only sums)."""
        first = server.ordered_nodes()[0].node_id
        if self.views is not None:
            self.views.collect(replies, lambda nid: server.nodes[nid].partition_id)
        for name, kind in ((msgs.LOGITS, ArrayRecord), (msgs.DIRECTIONS, ArrayRecord), (SQ_NORM, ConfigRecord)):
            carrying = [r for r in replies if isinstance(r.content.get(name), kind)]
            if not carrying:
                continue
            if len(carrying) != len(server.nodes):
                raise FederationError(f"round {server_round}: secure aggregation needs every party's reply, "
                                      f"got {len(carrying)} of {len(server.nodes)}")
            sums = self._sums(server, server_round, carrying, name)
            for reply in carrying:
                mine = reply.metadata.src_node_id == first
                if name == SQ_NORM:
                    del reply.content[SQ_NORM]
                    stats = reply.content.metric_records[msgs.STATS]
                    reply.content.metric_records[msgs.STATS] = MetricRecord(
                        {**stats, "sq-norm": float(sums["sq-norm"][0]) if mine else 0.0})
                else:
                    reply.content.array_records[name] = msgs.array_record(
                        **{key: total if mine else np.zeros(len(total)) for key, total in sums.items()})
        return replies

    @staticmethod
    def _sums(server: ServerView, server_round: int, replies: list[Message], name: str) -> dict[str, np.ndarray]:
        """Decoded sums of every key of record ``name``, checked: uint64 words, equal lengths, masks cancelled."""
        words: dict[str, list[np.ndarray]] = {}
        for reply in replies:
            who = server.who(reply.metadata.src_node_id)
            record = reply.content[name]
            for key in record:
                w = _words(record[key])
                if w is None or w.dtype != np.uint64 or w.ndim != 1:
                    got = type(record[key]).__name__ if w is None else f"{w.dtype} {w.shape}"
                    raise FederationError(f"rejected a reply: {who}: {name} '{key}' is {got}, expected "
                                          "masked uint64 words (privacy.secure-aggregation)")
                if key in words and len(words[key][0]) != len(w):
                    raise FederationError(f"rejected a reply: {who}: {len(w)} words of {name} '{key}', others sent "
                                          f"{len(words[key][0])}")
                words.setdefault(key, []).append(w)
        if any(len(ws) != len(replies) for ws in words.values()):
            raise FederationError(f"rejected a reply: round {server_round}: the parties' {name} replies hold different "
                                  f"keys ({sorted(words)})")
        sums = {}
        for key, ws in words.items():
            if name == SQ_NORM or (name == msgs.DIRECTIONS and key in WIDE_KEYS):
                total, limit = decode_wide(sum_wide(ws)), WIDE_LIMIT / 2
            else:
                total, limit = decode(np.sum(ws, axis=0, dtype=np.uint64)), LIMIT / 2  # wraps mod 2^64
            what = f"{key} logits" if name == msgs.LOGITS else f"{name} '{key}'"
            sums[key] = cancelled(total, limit, f"round {server_round}: the masks of the {what}")
        return sums


def _words(value) -> np.ndarray | None:
    """A reply's masked words: an array's, or a config value's bytes (:data:`SQ_NORM`); None if neither."""
    if isinstance(value, Array):
        return value.numpy()
    if isinstance(value, bytes) and len(value) % 8 == 0:
        return np.frombuffer(value, dtype="<u8").astype(np.uint64)
    return None


# -- the party's side ------------------------------------------------------------------
def _private(context: Context) -> X25519PrivateKey:
    record = context.state.array_records.get(KEYS_STATE)
    if record is None or "private" not in record:
        raise NodeConfigError("privacy.secure-aggregation: this node has no key pair (it restarted after set-up?); "
                              "start the run again")
    return X25519PrivateKey.from_private_bytes(msgs.array_blob(record["private"]))


def _partition(context: Context) -> int:
    node = NodeConfig.of(context)
    if "partition-id" not in node.given:
        raise NodeConfigError("privacy.secure-aggregation: node config has no partition-id to sign its key with")
    return node.partition_id


def _demo_key(partition_id: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(DEMO_IDENTITY + struct.pack(">I", partition_id)).digest())


def identity(context: Context) -> Ed25519PrivateKey:
    """This party's identity key: node config ``identity-key``; without one (simulation,
    packaged data) a key derived from the partition id, which anyone can derive. A deployed
    node without one has none to sign with, whatever it waives."""
    node = NodeConfig.of(context)
    path = node.identity_key
    if not path:
        if node.deployed or node.peers:
            raise NodeConfigError(f"privacy.secure-aggregation: node config names no '{IDENTITY_KEY}' (this party's "
                                  f"Ed25519 private key file) next to '{PEERS}' and its data; a deployment needs both "
                                  f"(make them with {KEY_TOOL}); {ALLOW_UNMASKED} allows unmasked rounds only")
        return _demo_key(_partition(context))
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError) as err:
        raise NodeConfigError(f"node config {IDENTITY_KEY}={path}: cannot read an Ed25519 private key ({err})") from err
    if not isinstance(key, Ed25519PrivateKey):
        raise NodeConfigError(f"node config {IDENTITY_KEY}={path}: not an Ed25519 private key")
    return key


def peer_keys(context: Context, num_parties: int) -> dict[int, Ed25519PublicKey]:
    """Every party's pinned identity key: node config ``peers`` (or the simulation's derived keys)."""
    node = NodeConfig.of(context)
    path = node.peers
    if not path:
        if node.identity_key:
            raise NodeConfigError(f"privacy.secure-aggregation: node config names '{IDENTITY_KEY}' but no '{PEERS}' "
                                  "file with every party's public identity key")
        return {j: _demo_key(j).public_key() for j in range(num_parties)}
    try:
        parties = {int(j): v for j, v in json.loads(Path(path).read_text()).items()}
    except (OSError, ValueError, AttributeError) as err:
        raise NodeConfigError(f"node config {PEERS}={path}: not a JSON object of partition id -> Ed25519 public key "
                              f"hex ({err})") from err
    keys = {j: public_key(v, f"node config {PEERS}={path}, party {j}") for j, v in parties.items()}
    missing = sorted(set(range(num_parties)) - set(keys))
    if missing:
        raise NodeConfigError(f"node config {PEERS}={path}: no identity key for parties {missing}")
    return keys


def _check_own_pin(context: Context, identities: dict[int, Ed25519PublicKey], own: int, who: str) -> None:
    """The peers file's key for this party must be its own identity key: otherwise the file (or
    identity-key) is wrong, which would otherwise surface as some other party's bad signature."""
    raw = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    if identities[own].public_bytes(*raw) != identity(context).public_key().public_bytes(*raw):
        raise NodeConfigError(f"{who}: node config {PEERS}={NodeConfig.of(context).peers} pins another key for this "
                              f"party (partition {own}) than its own {IDENTITY_KEY}: the peers file is not this "
                              f"federation's, or {IDENTITY_KEY} is not this party's key; refusing the run")


def sakeys(message: Message, context: Context) -> Message:
    """A fresh key pair per set-up (the same one for a re-sent request), its public half
    signed with this party's identity key; the private key stays here."""
    return Message(RecordDict({"secagg": signed_key(message.content.config_records["secagg"], context)}),
                   reply_to=message)


def signed_key(asked: ConfigRecord, context: Context) -> ConfigRecord:
    """This party's X25519 public key of the set-up ``asked`` names, signed with the round and
    history head it enters the session with (a new key pair for a new session, the held one for
    the same; a session it has left is refused). A rollback's set-up signs the round to restore
    and the head this party stored with it, and moves nothing yet (:func:`take_peers` does)."""
    session = str(asked["session"])
    own = _partition(context)
    held = context.state.config_records.get(SESSION_STATE)
    joined = context.state.config_records.get(SESSIONS_STATE)
    joined = [] if joined is None else [str(s) for s in joined["sessions"]]
    if held is not None and held["session"] == session:
        private = _private(context)
    elif session in joined:
        raise FederationError(f"party {own}: secure-aggregation session {session[:8]}… is one this party has already "
                              "left; a replayed session is refused (each set-up needs a fresh session)")
    else:
        rollback = asked.get("rollback")
        if rollback is None:
            entering = history.History.held(context.state, context.run_id)
        else:
            rt = PartyRuntime(context)
            entering = store.stored_history(store.load_state(store.state_dir(context, rt), int(rollback), rt.who),
                                            context)
            if entering.round != int(rollback):
                raise FederationError(f"{rt.who}: its stored state of round {rollback} holds no history of that round "
                                      "(saved without secure aggregation?); it cannot sign a rollback to it; refused")
        context.state.config_records[SESSIONS_STATE] = ConfigRecord({"sessions": [*joined, session]})
        # the old session's view awaits confirmations under keys that are gone: it ends with it (the
        # round and head every party signs below stand for them)
        context.state.config_records.pop(roundview.STATE, None)
        private = X25519PrivateKey.generate()
        raw = private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                    serialization.NoEncryption())
        context.state.array_records[KEYS_STATE] = ArrayRecord({"private": msgs.blob_array(raw)})
        context.state.config_records[SESSION_STATE] = ConfigRecord(
            {"session": session, "round": entering.round, "head": entering.head,
             "rollback": -1 if rollback is None else int(rollback), "moved": False})
        context.state.config_records.pop(NONCE_STATE, None)  # new pair keys: every nonce is fresh again
        held = context.state.config_records[SESSION_STATE]
    public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    server_round, head = int(held["round"]), bytes(held["head"])
    signature = identity(context).sign(signed_text(session, own, public, server_round, head))
    return ConfigRecord({"public": public, "signature": signature, "round": server_round, "head": head})


def sapeers(message: Message, context: Context) -> Message:
    """Check every peer's signed key against its pinned identity key, then derive a shared
    key with each; a key that fails refuses the run naming the peer."""
    take_peers(message.content.config_records.get("secagg", ConfigRecord()), context, PartyRuntime(context))
    return Message(RecordDict({"secagg": ConfigRecord({"ok": True})}), reply_to=message)


def take_peers(record: ConfigRecord, context: Context, rt: PartyRuntime) -> None:
    """Every party's signed key of this party's session (the relay: ``query.sapeers``, or the
    record riding on a training run's first bound message), each checked against its
    pinned identity key; then the pair keys. A key that fails refuses the run naming the peer."""
    own = rt.spec.partition_id
    # a key that is not bytes is no key (the set-up then lacks that party); nor is such a signature
    peers = {int(k.split("-", 1)[1]): v for k, v in record.items() if k.startswith("pk-") and isinstance(v, bytes)}
    signatures = {int(k.split("-", 1)[1]): v for k, v in record.items() if k.startswith("sig-") and isinstance(v, bytes)}
    rounds = {int(k.split("-", 1)[1]): v for k, v in record.items() if k.startswith("round-") and isinstance(v, int)}
    heads = {int(k.split("-", 1)[1]): v for k, v in record.items() if k.startswith("head-") and isinstance(v, bytes)}
    if sorted(peers) != list(range(rt.cfg.num_parties)):
        raise NodeConfigError(f"{rt.who}: secure-aggregation set-up lists parties {sorted(peers)}, "
                              f"expected 0..{rt.cfg.num_parties - 1}")
    held = context.state.config_records.get(SESSION_STATE)
    if held is None:
        raise NodeConfigError(f"{rt.who}: secure-aggregation peers arrived before this node's key set-up; "
                              "start the run again")
    session, private = str(held["session"]), _private(context)
    entered = (int(held["round"]), bytes(held["head"]))
    mine = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    if peers[own] != mine:
        raise FederationError(f"{rt.who}: the server relayed a key for this party that is not its own; "
                              "refusing the run (key substitution)")
    identities = peer_keys(context, rt.cfg.num_parties)
    _check_own_pin(context, identities, own, rt.who)
    failed = []
    for j, pk in peers.items():
        try:
            identities[j].verify(signatures.get(j, b""), signed_text(session, j, pk, rounds.get(j, -2),
                                                                     heads.get(j, b"")))
        except InvalidSignature:
            failed.append(j)
    if failed:
        others = len(peers) - 1
        hint = (f"no other party's key verifies against this party's node config {PEERS} file: check that it is "
                "this federation's (every party's current public identity key), " if len(failed) >= others > 1
                else "")
        whose = (f"party {failed[0]}'s key for this secure-aggregation set-up is not signed by party {failed[0]}'s"
                 if len(failed) == 1 else f"the keys of parties {', '.join(map(str, failed))} for this "
                 "secure-aggregation set-up are not signed by their")
        raise FederationError(f"{rt.who}: {whose} pinned identity key; {hint}refusing the run (a wrong peers entry, "
                              "key substitution or a different session)")
    check_histories(entered, rounds, heads, rt.who)
    if int(held["rollback"]) >= 0 and not held["moved"]:  # every party signed the same move: make it
        store.restore(context, store.load_state(store.state_dir(context, rt), int(held["rollback"]), rt.who))
        context.state.config_records[SESSION_STATE] = ConfigRecord({**held, "moved": True})
        log(LOG_INFO, "%s: every party signed the move back to round %d (history head %s…); restored it from this "
            "party's own disk", rt.who, int(held["rollback"]), entered[1].hex()[:12])
    keys = {f"k-{j}": msgs.blob_array(pair_key(private, pk, own, j, session)) for j, pk in peers.items() if j != own}
    context.state.array_records[KEYS_STATE] = ArrayRecord({**context.state.array_records[KEYS_STATE], **keys})
    if rt.node.peers:  # the party's own log: what it checked, for its operator
        raw = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        log(LOG_INFO, "%s: secure aggregation session %s…: signed with node config %s=%s (fingerprint %s); the keys "
            "of parties %s verified against the pinned %s=%s", rt.who, session[:8], IDENTITY_KEY,
            rt.node.identity_key, fingerprint(identities[own].public_bytes(*raw).hex()),
            ", ".join(map(str, sorted(peers))), PEERS, rt.node.peers)


def check_histories(entered: tuple[int, bytes], rounds: dict[int, int], heads: dict[int, bytes], who: str) -> None:
    """Every party signed the round and history head this party entered the session with, or the
    set-up is refused naming where the histories part: a new session never moves one party alone."""
    apart = sorted(j for j in heads if (rounds.get(j), heads[j]) != entered)
    if apart:
        j = apart[0]
        raise FederationError(
            f"{who}: party {j} entered this secure-aggregation session at round {rounds.get(j)} (history head "
            f"{heads[j].hex()[:12]}…), this party at round {entered[0]} ({entered[1].hex()[:12]}…): their histories "
            f"part{' (parties ' + ', '.join(map(str, apart)) + ')' if len(apart) > 1 else ''}; a session never "
            "moves one party alone, and a rollback is one every party signs; refused")


_PARSED: dict[tuple, dict[int, bytes]] = {}  # (run, node, set-up) -> pair keys: parsed once, not per reply


def _pair_keys(context: Context) -> dict[int, bytes]:
    held = context.state.config_records.get(SESSION_STATE)
    cache_key = (context.run_id, context.node_id, None if held is None else str(held["session"]))
    keys = _PARSED.get(cache_key)
    if keys is None or len(keys) == 0:
        record = context.state.array_records.get(KEYS_STATE)
        keys = {int(k.split("-", 1)[1]): msgs.array_blob(v) for k, v in (record or {}).items() if k.startswith("k-")}
        if keys:
            _PARSED[cache_key] = keys
    return keys


def _label(name: str, key: str) -> str:
    if name == msgs.LOGITS:
        return key
    return "dir" if key == "dir" else f"dir-{key}"


def check_deployment(context: Context, rt: PartyRuntime) -> None:
    """A deployed party is authenticated and masked, or refuses before any value leaves it:
    its node config names its identity key and the pinned peers file, and the run (or
    scoring job) is masked. ``allow-unmasked=true`` in a keyless node's config lets it answer
    unmasked jobs; a node that holds identity keys refuses them, whatever its data."""
    node = rt.node
    keyed = bool(node.identity_key)
    what = "scoring job" if rt.cfg.mode == "score" else "run"
    if keyed and not rt.cfg.masked:
        raise NodeConfigError(
            f"{rt.who}: this {what} is not masked (privacy.secure-aggregation=false) and this node holds an identity "
            f"key (node config {IDENTITY_KEY}): the server would receive its partial logits in the clear; refused "
            f"before any value left this party ({ALLOW_UNMASKED} does not apply to a node with keys). Submit it with "
            "privacy.secure-aggregation=true")
    if not node.deployed or node.allow_unmasked:
        return
    reads = ", ".join(node.data_keys)
    missing = [k for k, v in ((IDENTITY_KEY, node.identity_key), (PEERS, node.peers)) if not v]
    if missing:
        raise NodeConfigError(
            f"{rt.who}: this node reads its own data (node config {reads}) but its node config names no "
            f"{' and no '.join(repr(k) for k in missing)}: a deployed party signs with its own identity key and "
            f"checks every peer against a pinned peers file (demo keys exist only in simulation). Make them with "
            f"{KEY_TOOL} (docs/deploy.md, section 0), or set {ALLOW_UNMASKED}=true in this node's config to answer "
            "unmasked runs only; refused before any value left this party")
    if not rt.cfg.masked:
        raise NodeConfigError(
            f"{rt.who}: this {what} is not masked (privacy.secure-aggregation=false) and this node is deployed: the "
            "server would receive its partial logits in the clear; refused before any value left this party. Submit "
            f"it with privacy.secure-aggregation=true, or set {ALLOW_UNMASKED}=true in the config of a node without "
            f"identity keys to accept unmasked runs (keys: {KEY_TOOL})")


def mask_mod(message: Message, context: Context, call_next) -> Message:
    """ClientApp mod (outermost): check the message against the round's view
    (flower/roundview.py) before anything acts on it, then mask the logits or Newton
    directions of every reply that carries them, and its ‖θ_k‖², under pair keys bound to
    that view. New records replace the reply's: the guard may hold the plain ones to answer
    a re-sent message, which is then masked again to the same words."""
    runtime = functools.cache(lambda: PartyRuntime(context))  # built at most once, only where needed
    node = NodeConfig.of(context)
    if node.deployed or node.identity_key:
        check_deployment(context, runtime())
    held = context.state.config_records.get(SESSION_STATE)
    if held is None or message.metadata.message_type in roundview.UNBOUND:
        reply = call_next(message, context)
        asked = message.content.config_records.get("secagg")
        if message.metadata.message_type == msgs.INFO and asked is not None and not reply.has_error():
            reply.content.config_records["secagg"] = signed_key(asked, context)  # the set-up's first leg
        return _mask_reply(message, context, reply, None, runtime)
    rt = runtime()
    if not rt.cfg.masked:
        return call_next(message, context)
    relay = message.content.config_records.get(RELAY)
    if relay is not None:  # the set-up's relay rode on this message: every key checked before anything else
        take_peers(relay, context, rt)
    keys = _pair_keys(context)
    seen = roundview.accept(message, context.state, session=str(held["session"]), own=rt.spec.partition_id,
                            role=rt.spec.role, who=rt.who, pair_keys=keys, mask_round=mask_round(message),
                            run_id=context.run_id)
    server_round, part, view, head, awaiting = seen
    roundview.remember(context.state, server_round, part, view, head, awaiting)  # what inner mods and a re-send see
    reply = call_next(message, context)
    if reply.has_error():
        return reply
    reply = _mask_reply(message, context, reply, head, runtime, keys)
    masked_now = roundview.CONFIRM in reply.content.config_records
    roundview.remember(context.state, server_round, part, view, head, awaiting or masked_now)
    return reply


def _mask_reply(message: Message, context: Context, reply: Message, head: bytes | None,
                runtime: Callable[[], PartyRuntime], raw: dict[int, bytes] | None = None) -> Message:
    """The reply with its logits or directions masked (pair keys bound to the history ``head``), and
    this party's confirmations of that head; unchanged if it carries neither or masking is off.
    ``runtime`` and ``raw`` (the pair keys) are the caller's, read once for the message."""
    if reply.has_error():
        return reply
    name = next((n for n in (msgs.LOGITS, msgs.DIRECTIONS) if n in reply.content.array_records), None)
    if name is None:
        return reply
    rt = runtime()
    if not rt.cfg.masked:
        return reply
    raw = _pair_keys(context) if raw is None else raw
    k = rt.cfg.num_parties
    if len(raw) != k - 1 or head is None:
        raise NodeConfigError(f"{rt.who}: privacy.secure-aggregation is on but this node holds {len(raw)} of "
                              f"{k - 1} pair keys (no set-up, or the node restarted); start the run again")
    keys = {j: roundview.bound_key(key, head) for j, key in raw.items()}
    own, mtype = rt.spec.partition_id, message.metadata.message_type
    server_round = mask_round(message)
    nonces = _Nonces(context, rt.who, mtype, server_round)
    masked_record = {}
    for key, array in reply.content.array_records[name].items():
        label, values = _label(name, key), array.numpy()
        if mtype == msgs.SCORE:
            if key != "logits":  # the chunk's ids: the rows the server asked for
                masked_record[key] = values
                continue
            label = "score"
        nonces.claim(label, values)
        if name == msgs.DIRECTIONS and key in WIDE_KEYS:
            masked_record[key] = masked_wide(values, own, keys, server_round, label, k, rt.who, f"Newton '{key}'")
        else:
            what = "partial logit" if name == msgs.LOGITS else f"Newton '{key}' value"
            masked_record[key] = masked(values.reshape(-1), own, keys, server_round, label, k, rt.who, what)
    stats = reply.content.metric_records.get(msgs.STATS)
    if stats is not None:
        label = "dir-sq-norm" if name == msgs.DIRECTIONS else "sq-norm"
        nonces.claim(label, np.array([stats["sq-norm"]]))
        words = masked_wide(np.array([stats["sq-norm"]]), own, keys, server_round, label, k, rt.who, "‖θ_k‖²")
        reply.content.config_records[SQ_NORM] = ConfigRecord({"sq-norm": words.astype("<u8").tobytes()})
        reply.content.metric_records[msgs.STATS] = MetricRecord({**stats, "sq-norm": 0.0})
    nonces.save()  # only once every vector of the reply passed: a refused request uses up nothing
    reply.content.array_records[name] = msgs.array_record(**masked_record)
    reply.content.config_records[roundview.CONFIRM] = roundview.confirmations(head, own, raw)
    return reply


class _Nonces:
    """The party's own nonce discipline: a mask's nonce is (round, label) under pair keys
    bound to the signed session, so the party accepts only rounds that advance, and in its
    latest round masks each label once, or again for the very same vector (a re-sent
    request, answered with the identical words). A server relabelling a later round as an
    earlier one is refused: no two vectors are ever masked under one nonce."""

    def __init__(self, context: Context, who: str, mtype: str, server_round: int) -> None:
        self.context, self.who, self.mtype, self.round = context, who, mtype, server_round
        held = context.state.config_records.get(NONCE_STATE)
        last = -1 if held is None else int(held["round"])
        if server_round < last:
            raise FederationError(f"{who}: {mtype} asks to mask round {server_round} after round {last}; rounds must "
                                  "advance under secure aggregation (a relabelled round would reuse a mask): refused")
        self.used = dict(u.split("=", 1) for u in held["used"]) if held is not None and server_round == last else {}

    def claim(self, label: str, values: np.ndarray) -> None:
        digest = hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()
        if self.used.get(label, digest) != digest:
            raise FederationError(f"{self.who}: {self.mtype} asks to mask a different '{label}' vector in round "
                                  f"{self.round}, whose nonce this party already used; refused (a relabelled or "
                                  "altered request)")
        self.used[label] = digest

    def save(self) -> None:
        self.context.state.config_records[NONCE_STATE] = ConfigRecord(
            {"round": self.round, "used": [f"{k}={v}" for k, v in self.used.items()]})


mark_round_state(SESSIONS_STATE, merge=True)  # a restarted party still refuses the sessions it left


#: The key agreement (training's and the scoring job's set-up; :func:`mask_mod` listed first among the app's mods).
JOB = Job("key agreement", {msgs.SECAGG_KEYS: sakeys, msgs.SECAGG_PEERS: sapeers})
