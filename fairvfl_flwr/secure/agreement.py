"""Key agreement: the signed set-up of a secure-aggregation session, the server's relay and each party's checks.

Set-up (:func:`agree_keys`: the round hook's before the first logits, features/secagg.py,
and a scoring job's before its first chunk; the two messages are a job of their own,
jobs/key_agreement.py):

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

A party signs ``SIGNED ‖ partition id ‖ session id ‖ X25519 key`` with its identity key
(secure/identity.py); on ``query.sapeers`` it checks every peer's signature against that
peer's pinned key and its own session id and refuses the run naming the peer if one fails,
so a server that substitutes keys (to strip the masks) stops the run before any logits
leave a party. Party i and j derive k_ij = HKDF-SHA256(X25519(sk_i, pk_j), salt = session id).

Sessions: a fresh session is a new key pair and pair keys, so nonces start afresh; the old
session's view awaiting confirmation ends with it, and what stands for it is the round and
history head every party signs into the set-up (flower/history.py): a party refuses a
session any peer entered at another round or head, so a session never moves one party
alone. A rollback (a rejoin's fresh session, a resumed run's first) is a set-up in which
every party signs the round and head it stored, and restores only once all signed the same.
A party keeps every session it has joined in this run (on its own disk too) and refuses one
it has already left: a replayed set-up never brings back old keys.
"""

from __future__ import annotations

import secrets
import struct
from logging import INFO as LOG_INFO

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore import log

from fairvfl_flwr.config.node import NodeConfigError
from fairvfl_flwr.flower import history, store
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.party import PartyRuntime
from fairvfl_flwr.secure import view
from fairvfl_flwr.secure.identity import (IDENTITY_KEY, PEERS, check_own_pin, demo_key, fingerprint, identity,
                                          partition, peer_keys)
from fairvfl_flwr.secure.nonces import NONCE_STATE
from fairvfl_flwr.flower.records import array_records, config_records

#: The set-up's two messages (jobs/key_agreement.py answers them): each party's signed X25519
#: public key, then every party's key to all.
SAKEYS = "query.sakeys"
SAPEERS = "query.sapeers"
KEYS_STATE = "fairvfl.secagg-keys"  # ArrayRecord on the party: its private key, then the pair keys
SESSION_STATE = "fairvfl.secagg-session"  # ConfigRecord on the party: the set-up its key pair belongs to
SESSIONS_STATE = "fairvfl.secagg-sessions"  # ConfigRecord on the party: every session it has joined in this run
INFO = b"fairvfl-flwr secure aggregation v1"
SIGNED = b"fairvfl-flwr secure aggregation key v2"  # prefix of what a party signs


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


def agree_keys(parties: list[tuple[int, int, str]], send, rollback: int | None = None) -> str:
    """Relay a key set-up: each party's signed X25519 key to every party; returns the session id.

    ``parties``: (node id, partition id, name) of each; ``send(messages)`` returns the
    replies in the order of ``messages``. A new session id per set-up: new pair keys.
    ``rollback``: every party moves back to its stored state of that round, once all signed it."""
    # A re-sent request of the same set-up gets the same key back (the first reply may arrive late).
    session = new_session()
    asks = [Message(RecordDict({"secagg": key_request(session, rollback)}), dst_node_id=nid,
                    message_type=SAKEYS, group_id="secagg") for nid, _, _ in parties]
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
        record = config_records(reply.content).get("secagg") or ConfigRecord()
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
    send([Message(RecordDict({"secagg": ConfigRecord(dict(public))}), dst_node_id=nid, message_type=SAPEERS,
                  group_id="secagg") for nid, _, _ in parties])


def _demo_signed(partition_id: int, session: str, key: bytes, signature: bytes, server_round: int,
                 head: bytes) -> bool:
    """Whether a party's signed key verifies under the demo identity of its partition."""
    try:
        demo_key(partition_id).public_key().verify(signature, signed_text(session, partition_id, key,
                                                                           server_round, head))
    except InvalidSignature:
        return False
    return True


def _private(context: Context) -> X25519PrivateKey:
    record = array_records(context.state).get(KEYS_STATE)
    if record is None or "private" not in record:
        raise NodeConfigError("privacy.secure-aggregation: this node has no key pair (it restarted after set-up?); "
                              "start the run again")
    return X25519PrivateKey.from_private_bytes(msgs.array_blob(record["private"]))


def signed_key(asked: ConfigRecord, context: Context) -> ConfigRecord:
    """This party's X25519 public key of the set-up ``asked`` names, signed with the round and
    history head it enters the session with (a new key pair for a new session, the held one for
    the same; a session it has left is refused). A rollback's set-up signs the round to restore
    and the head this party stored with it, and moves nothing yet (:func:`take_peers` does)."""
    session = str(asked["session"])
    own = partition(context)
    held = config_records(context.state).get(SESSION_STATE)
    joined = config_records(context.state).get(SESSIONS_STATE)
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
        config_records(context.state)[SESSIONS_STATE] = ConfigRecord({"sessions": [*joined, session]})
        # the old session's view awaits confirmations under keys that are gone: it ends with it (the
        # round and head every party signs below stand for them)
        config_records(context.state).pop(view.STATE, None)
        private = X25519PrivateKey.generate()
        raw = private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                    serialization.NoEncryption())
        array_records(context.state)[KEYS_STATE] = ArrayRecord({"private": msgs.blob_array(raw)})
        config_records(context.state)[SESSION_STATE] = ConfigRecord(
            {"session": session, "round": entering.round, "head": entering.head,
             "rollback": -1 if rollback is None else int(rollback), "moved": False})
        config_records(context.state).pop(NONCE_STATE, None)  # new pair keys: every nonce is fresh again
        held = config_records(context.state)[SESSION_STATE]
    public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    server_round, head = int(held["round"]), bytes(held["head"])
    signature = identity(context).sign(signed_text(session, own, public, server_round, head))
    return ConfigRecord({"public": public, "signature": signature, "round": server_round, "head": head})


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
    held = config_records(context.state).get(SESSION_STATE)
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
    check_own_pin(context, identities, own, rt.who)
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
        config_records(context.state)[SESSION_STATE] = ConfigRecord({**held, "moved": True})
        log(LOG_INFO, "%s: every party signed the move back to round %d (history head %s…); restored it from this "
            "party's own disk", rt.who, int(held["rollback"]), entered[1].hex()[:12])
    keys = {f"k-{j}": msgs.blob_array(pair_key(private, pk, own, j, session)) for j, pk in peers.items() if j != own}
    array_records(context.state)[KEYS_STATE] = ArrayRecord({**array_records(context.state)[KEYS_STATE], **keys})
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


def pair_keys(context: Context) -> dict[int, bytes]:
    """This party's pair keys of its current session (peer partition id -> key); empty before a set-up."""
    held = config_records(context.state).get(SESSION_STATE)
    cache_key = (context.run_id, context.node_id, None if held is None else str(held["session"]))
    keys = _PARSED.get(cache_key)
    if keys is None or len(keys) == 0:
        record = array_records(context.state).get(KEYS_STATE)
        keys = {int(k.split("-", 1)[1]): msgs.array_blob(v) for k, v in (record or {}).items() if k.startswith("k-")}
        if keys:
            _PARSED[cache_key] = keys
    return keys


