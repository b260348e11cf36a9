"""Secure aggregation of partial logits (run config ``privacy.secure-aggregation = true``).

Without it the server receives every party's partial logits u_k, and for a linear party
u_k(t) = (1 − μ/η) u_k(t−1) − (1/η) X_k X_kᵀ ν(t) with ν(t) computed by the server
itself: a few dozen rounds give it X_k X_kᵀ (the audit's server attack). With it every
party adds pairwise masks that cancel in the sum, so the server learns z = Σ_k u_k and,
per party, words indistinguishable from uniform noise.

Set-up (the server's :class:`SecureAggregation` hook, before the first logits):

============== ================================ =====================================
message type    from server                      reply
============== ================================ =====================================
query.sakeys    (nothing)                        a fresh X25519 public key
query.sapeers   every party's public key         (nothing): each pair now shares a key
============== ================================ =====================================

Party i and j derive k_ij = HKDF-SHA256(X25519(sk_i, pk_j)); the server relays the
public keys and never sees a shared secret (honest-but-curious server; an active server
could substitute keys, as in any relay without authenticated keys).

Every reply's logits (training and test, round 0 included) are encoded in fixed point,
q = round(u · 2^48) as 64-bit words, and party i sends q_i + Σ_{j>i} m_ij − Σ_{j<i} m_ji
mod 2^64, with m_ij = AES-256-CTR(k_ij, nonce = (round, split)) a pseudo-random word per
row. The masks cancel in Σ_i, which the server decodes to z exactly (the integer sum is
exact; every float32 with |u| ≥ 2^-25 is a whole number of 2^-48 steps). Masks depend on
the round and split only, so a re-sent message (the guard answers it from the same θ)
gets the identical masked reply: nothing new is revealed. A party that stays silent
makes the exchange re-send and then stop the run; no round is ever unmasked for a subset
of parties (there is no unmasking step at all).
"""

from __future__ import annotations

import secrets
import struct

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fairvfl_flwr.data.partydata import NodeConfigError
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.hooks import RoundHook
from fairvfl_flwr.flower.party import PartyRuntime, round_of

FRACTION_BITS = 48
SCALE = float(2**FRACTION_BITS)
LIMIT = 2.0 ** (63 - FRACTION_BITS)  # |z| must stay below this for the sum not to wrap
KEYS_STATE = "fairvfl.secagg-keys"  # ArrayRecord on the party: its private key, then the pair keys
SESSION_STATE = "fairvfl.secagg-session"  # ConfigRecord on the party: the set-up its key pair belongs to
SPLITS = {"train": 0, "test": 1}
INFO = b"fairvfl-flwr secure aggregation v1"


# -- encoding and masks (both sides) ----------------------------------------------------
def encode(u: np.ndarray, num_parties: int, who: str) -> np.ndarray:
    """Fixed point: round(u · 2^48) as uint64 words (two's complement)."""
    u = np.asarray(u, dtype=np.float64)
    bound = LIMIT / (2 * num_parties)  # a true sum stays below LIMIT / 2: the server can tell masks that failed to cancel
    if not np.all(np.abs(u) < bound):
        raise ValueError(f"{who}: a partial logit of magnitude {np.max(np.abs(u)):.4g} is beyond the secure-aggregation "
                         f"range ±{bound:.4g} (2^{62 - FRACTION_BITS} / num-parties); the run is diverging")
    return np.rint(u * SCALE).astype(np.int64).view(np.uint64)


def decode(words: np.ndarray) -> np.ndarray:
    return np.asarray(words, dtype=np.uint64).view(np.int64).astype(np.float64) / SCALE


def mask(key: bytes, server_round: int, split: str, rows: int) -> np.ndarray:
    """The pair's pseudo-random words for one round and split (AES-256-CTR keystream)."""
    nonce = struct.pack(">QII", server_round, SPLITS[split], 0)
    stream = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor().update(bytes(8 * rows))
    return np.frombuffer(stream, dtype=np.uint64)


def masked(u: np.ndarray, own: int, pair_keys: dict[int, bytes], server_round: int, split: str,
           num_parties: int, who: str) -> np.ndarray:
    """q_own + Σ_{j>own} m_{own,j} − Σ_{j<own} m_{j,own} (mod 2^64)."""
    out = encode(u, num_parties, who)
    for other, key in pair_keys.items():
        m = mask(key, server_round, split, len(out))
        out = out + m if other > own else out - m  # uint64: wraps mod 2^64
    return out


def pair_key(private: X25519PrivateKey, peer_public: bytes, a: int, b: int) -> bytes:
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    pair = struct.pack(">II", min(a, b), max(a, b))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=INFO + pair).derive(shared)


def _bytes(array: Array) -> bytes:
    return array.numpy().tobytes()


def _array(blob: bytes) -> Array:
    return Array(np.frombuffer(blob, dtype=np.uint8).copy())


# -- the server's side -----------------------------------------------------------------
class SecureAggregation(RoundHook):
    """Key set-up before the first logits; every round, the masked replies summed to z.

    The decoded z goes to the server's state as the first party's logits and zeros for
    the others: the server's z is exact, its per-party view is what it received (noise).
    """

    def begin(self, server, grid, timeout: float) -> None:
        order = server.ordered_nodes()
        # A re-sent request of the same set-up gets the same key back (the first reply may arrive late).
        session = ConfigRecord({"session": secrets.token_hex(16)})
        asks = [Message(RecordDict({"secagg": session}), dst_node_id=n.node_id, message_type=msgs.SECAGG_KEYS,
                        group_id="secagg") for n in order]
        public = {}
        for node, reply in zip(order, server.exchange(grid, asks, timeout)):
            record = reply.content.array_records.get("secagg")
            if record is None or "public" not in record or record["public"].numpy().size != 32:
                raise FederationError(f"{node} sent no X25519 public key for secure aggregation")
            public[f"pk-{node.partition_id}"] = record["public"]
        peers = [Message(RecordDict({"secagg": ArrayRecord(dict(public))}), dst_node_id=n.node_id,
                         message_type=msgs.SECAGG_PEERS, group_id="secagg") for n in order]
        server.exchange(grid, peers, timeout)
        return None

    def incoming(self, server, grid, server_round: int, replies: list[Message], timeout: float) -> list[Message]:
        with_logits = [r for r in replies if msgs.LOGITS in r.content.array_records]
        if not with_logits:
            return replies
        if len(with_logits) != len(server.nodes):
            raise FederationError(f"round {server_round}: secure aggregation needs every party's reply, "
                                  f"got {len(with_logits)} of {len(server.nodes)}")
        sums: dict[str, np.ndarray] = {}
        for reply in with_logits:
            who = server.who(reply.metadata.src_node_id)
            record = reply.content.array_records[msgs.LOGITS]
            for split in record:
                words = record[split].numpy()
                if words.dtype != np.uint64 or words.ndim != 1:
                    raise FederationError(f"rejected a reply: {who}: {split} logits are {words.dtype} "
                                          f"{words.shape}, expected masked uint64 words (privacy.secure-aggregation)")
                if split in sums and len(sums[split]) != len(words):
                    raise FederationError(f"rejected a reply: {who}: {len(words)} {split} rows, others sent "
                                          f"{len(sums[split])}")
                sums[split] = words.copy() if split not in sums else sums[split] + words
        for split, total in sums.items():
            if np.any(np.abs(decode(total)) >= LIMIT / 2):
                raise FederationError(f"round {server_round}: the masks of the {split} logits did not cancel (the "
                                      "parties' pair keys differ: a node restarted or a reply was altered); no party's "
                                      "logits were revealed; start the run again")
        first = server.ordered_nodes()[0].node_id
        for reply in with_logits:
            mine = reply.metadata.src_node_id == first
            reply.content.array_records[msgs.LOGITS] = msgs.array_record(
                **{split: decode(total) if mine else np.zeros(len(total)) for split, total in sums.items()})
        return replies


# -- the party's side ------------------------------------------------------------------
def _private(context: Context) -> X25519PrivateKey:
    record = context.state.array_records.get(KEYS_STATE)
    if record is None or "private" not in record:
        raise NodeConfigError("privacy.secure-aggregation: this node has no key pair (it restarted after set-up?); "
                              "start the run again")
    return X25519PrivateKey.from_private_bytes(_bytes(record["private"]))


def sakeys(message: Message, context: Context) -> Message:
    """A fresh key pair per set-up (the same one for a re-sent request); the private key stays here."""
    session = str(message.content.config_records["secagg"]["session"])
    held = context.state.config_records.get(SESSION_STATE)
    if held is not None and held["session"] == session:
        private = _private(context)
    else:
        private = X25519PrivateKey.generate()
        raw = private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                    serialization.NoEncryption())
        context.state.array_records[KEYS_STATE] = ArrayRecord({"private": _array(raw)})
        context.state.config_records[SESSION_STATE] = ConfigRecord({"session": session})
    public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return Message(RecordDict({"secagg": ArrayRecord({"public": _array(public)})}), reply_to=message)


def sapeers(message: Message, context: Context) -> Message:
    """Derive a shared key with every other party from the relayed public keys."""
    rt = PartyRuntime(context)
    own = rt.data.partition_id
    record = message.content.array_records["secagg"]
    peers = {int(k.split("-", 1)[1]): _bytes(v) for k, v in record.items()}
    if sorted(peers) != list(range(rt.cfg.num_parties)):
        raise NodeConfigError(f"{rt.who}: secure-aggregation set-up lists parties {sorted(peers)}, "
                              f"expected 0..{rt.cfg.num_parties - 1}")
    private = _private(context)
    keys = {f"k-{j}": _array(pair_key(private, pk, own, j)) for j, pk in peers.items() if j != own}
    context.state.array_records[KEYS_STATE] = ArrayRecord({**context.state.array_records[KEYS_STATE], **keys})
    return Message(RecordDict({"secagg": ConfigRecord({"ok": True})}), reply_to=message)


_PARSED: dict[tuple, dict[int, bytes]] = {}  # (run, node, set-up) -> pair keys: parsed once, not per reply


def _pair_keys(context: Context) -> dict[int, bytes]:
    held = context.state.config_records.get(SESSION_STATE)
    cache_key = (context.run_id, context.node_id, None if held is None else str(held["session"]))
    keys = _PARSED.get(cache_key)
    if keys is None or len(keys) == 0:
        record = context.state.array_records.get(KEYS_STATE)
        keys = {int(k.split("-", 1)[1]): _bytes(v) for k, v in (record or {}).items() if k.startswith("k-")}
        if keys:
            _PARSED[cache_key] = keys
    return keys


def mask_mod(message: Message, context: Context, call_next) -> Message:
    """ClientApp mod (outermost): mask the logits of every reply that carries them."""
    reply = call_next(message, context)
    if reply.has_error() or msgs.LOGITS not in reply.content.array_records:
        return reply
    rt = PartyRuntime(context)
    if not rt.cfg.secure_aggregation:
        return reply
    keys = _pair_keys(context)
    if len(keys) != rt.cfg.num_parties - 1:
        raise NodeConfigError(f"{rt.who}: privacy.secure-aggregation is on but this node holds {len(keys)} of "
                              f"{rt.cfg.num_parties - 1} pair keys (no set-up, or the node restarted); start the run again")
    server_round = round_of(message)[0]
    logits = reply.content.array_records[msgs.LOGITS]
    reply.content.array_records[msgs.LOGITS] = msgs.array_record(**{
        split: masked(logits[split].numpy(), rt.data.partition_id, keys, server_round, split, rt.cfg.num_parties,
                      rt.who)
        for split in logits
    })
    return reply


def register(app: ClientApp) -> None:
    """The set-up handlers (with :func:`mask_mod` listed first among the app's mods)."""
    app.query("sakeys")(sakeys)
    app.query("sapeers")(sapeers)
