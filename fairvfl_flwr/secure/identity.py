"""Identity keys: each party's Ed25519 key made on its own machine, every peer's pinned, their fingerprints.

Every party has a long-term Ed25519 identity key made on its own machine (node config
``identity-key``, a PEM file) and every party's public identity key, pinned out of band
(node config ``peers``, a JSON file partition id -> hex, that the operator distributes with
the party files; :func:`generate_identities` writes both, the export tool uses it). It signs
its key of every secure-aggregation set-up (secure/agreement.py) and every list of a private
alignment (jobs/alignment.py) with it, and checks its peers' against the pinned keys.
Without identity files (simulation with the packaged data) keys derived from the partition
id stand in: anyone can derive them, so they show the protocol working and authenticate
nothing; a party with a ``data-path`` and no ``identity-key`` is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from flwr.app import Context

from fairvfl_flwr.config.node import NodeConfig, NodeConfigError
from fairvfl_flwr.flower.party import PartyRuntime

IDENTITY_KEY = "identity-key"  # node config: this party's Ed25519 private key (PEM file)
PEERS = "peers"  # node config: JSON file, partition id -> every party's Ed25519 public key (hex)
#: Node config: true lets a deployed party *without identity keys* answer unmasked rounds. It
#: authenticates nothing less: such a node cannot sign, so it takes no part in a masked run or a
#: private alignment, and a node that holds identity keys refuses unmasked jobs whatever it says.
ALLOW_UNMASKED = "allow-unmasked"
KEY_TOOL = "`fairvfl-keys new` (this party's key) and `fairvfl-keys peers` (the pinned peers file)"
DEMO_IDENTITY = b"fairvfl-flwr demo identity key"  # simulation without identity files: public, proves nothing


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


def partition(context: Context) -> int:
    """This party's partition id, which it signs its keys with (node config ``partition-id``)."""
    node = NodeConfig.of(context)
    if "partition-id" not in node.given:
        raise NodeConfigError("privacy.secure-aggregation: node config has no partition-id to sign its key with")
    return node.partition_id


def demo_key(partition_id: int) -> Ed25519PrivateKey:
    """The demo identity of a partition: public (anyone can derive it), simulation only."""
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
        return demo_key(partition(context))
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
        return {j: demo_key(j).public_key() for j in range(num_parties)}
    try:
        parties = {int(j): v for j, v in json.loads(Path(path).read_text()).items()}
    except (OSError, ValueError, AttributeError) as err:
        raise NodeConfigError(f"node config {PEERS}={path}: not a JSON object of partition id -> Ed25519 public key "
                              f"hex ({err})") from err
    keys = {j: public_key(v, f"node config {PEERS}={path}, party {j}") for j, v in parties.items()}
    missing = sorted(set(range(num_parties)) - set(keys))
    if missing:
        raise NodeConfigError(f"node config {PEERS}={path}: no identity key for parties {missing}")
    # The pinned file is the federation: a run without one of its parties is refused. Otherwise a
    # server runs the same rounds twice, with every party and without one, and the difference of the
    # two masked sums is that party's own reply, exactly (tests/test_keys.py).
    extra = sorted(set(keys) - set(range(num_parties)))
    if extra:
        raise NodeConfigError(f"the run names num-parties={num_parties}, but node config {PEERS}={path} pins "
                              f"{len(keys)} parties: a run without parties {extra} is refused (a server that runs "
                              "the federation with and without a party reads that party's reply off the difference "
                              "of the two sums); to train without them, pin only the parties that take part")
    return keys


def check_own_pin(context: Context, identities: dict[int, Ed25519PublicKey], own: int, who: str) -> None:
    """The peers file's key for this party must be its own identity key: otherwise the file (or
    identity-key) is wrong, which would otherwise surface as some other party's bad signature."""
    raw = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    if identities[own].public_bytes(*raw) != identity(context).public_key().public_bytes(*raw):
        raise NodeConfigError(f"{who}: node config {PEERS}={NodeConfig.of(context).peers} pins another key for this "
                              f"party (partition {own}) than its own {IDENTITY_KEY}: the peers file is not this "
                              f"federation's, or {IDENTITY_KEY} is not this party's key; refusing the run")


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
