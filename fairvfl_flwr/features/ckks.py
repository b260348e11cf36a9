"""Encrypted ν for linear models (run config ``privacy.secure-nu = "ckks"``), both sides.

With plain ν a passive party reads labels off sign(ν_i) (see ``tools/audit.py``). Here ν
reaches passive parties only as CKKS ciphertexts (TenSEAL), and the server, which holds
the secret key, only ever decrypts gradients hidden under the party's random mask:

============== ================================ =====================================
message type    from server                      reply
============== ================================ =====================================
query.init      + ``ckks``: public CKKS context  (as before) partial logits
train.passive_enc   Enc(n·ν) in 4096-row chunks  Enc(n·ν ⊙ X_k[:, j] + r_j), j = 1..m
train.passive_unmask  Σ_slots of each decrypted   new u_k, steps, ‖θ_k‖²
                      masked vector (m floats)
============== ================================ =====================================

Why this shape (costs in docs/privacy-defences.md): TenSEAL's
``ckks_vector.matmul(plain_matrix)`` rotates once per matrix row; per-column ``dot``
needs Galois keys (a large public context) and a dozen rotations per column and chunk.
Instead the party multiplies
each encrypted chunk by its column slice and adds across chunks (plaintext products
and additions only, no rotations, no Galois or relinearisation keys: a small public
context), masks every slot with its own uniform random number and returns one
ciphertext per column; the server decrypts and sums the slots. The server thus sees
n·(X_kᵀν)_j + Σ_s r_{j,s} and per-slot values under fresh masks, never the gradient;
the party sees ν only encrypted and, after unmasking, its own gradient X_kᵀν (m
numbers a round, the same as in the plain protocol).

ν is scaled by n before encryption (ν ~ 1/n; CKKS error is absolute, ~1e-9 here) and
the gradient divided by n after: relative error ~1e-7 at n = 40,000.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict

from flwr.clientapp import ClientApp

from fairvfl_flwr.data.partydata import NodeConfigError
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.hooks import RoundHook
from fairvfl_flwr.flower.party import PartyRuntime, mark_step_type

TRAIN_PASSIVE_ENC = msgs.TRAIN_PASSIVE_ENC
TRAIN_PASSIVE_UNMASK = msgs.TRAIN_PASSIVE_UNMASK
MASK_STATE = "fairvfl.ckks-mask"
CONTEXT_RECORD = "ckks"  # ArrayRecord: {"context": uint8 bytes of the public TenSEAL context}
MASKED_RECORD = "masked"  # ArrayRecord a party replies with: {"col-<j>": uint8 ciphertext bytes}

POLY_MODULUS_DEGREE = 8192
SLOTS = POLY_MODULUS_DEGREE // 2  # 4096 rows per ciphertext
COEFF_MOD_BIT_SIZES = (60, 40, 60)  # one plaintext multiplication
SCALE_BITS = 40
MASK_BOUND = 2.0**16  # |mask| per slot; |n ν_i x_ij| summed over chunks stays << this


def _tenseal():
    try:
        import tenseal as ts
    except ImportError as exc:  # pragma: no cover - config.validate refuses first
        raise ImportError("privacy.secure-nu='ckks' needs TenSEAL: pip install 'fairvfl-flwr[privacy]'") from exc
    return ts


def to_bytes_array(blob: bytes) -> Array:
    return Array(np.frombuffer(blob, dtype=np.uint8).copy())


def from_bytes_array(array: Array) -> bytes:
    return array.numpy().tobytes()


def chunks(n_rows: int) -> int:
    return -(-n_rows // SLOTS)


# -- the passive party's side (no secret key) ---------------------------------------
def masked_column_sums(public_context: bytes, nu_chunks: list[bytes], X: np.ndarray, rng: np.random.Generator):
    """Enc(n·ν ⊙ X[:, j] + r_j) for every column j, and Σ_s r_{j,s} (kept by the party).

    ``X`` is the party's n × m block; rows are padded with zeros to whole chunks.
    """
    ts = _tenseal()
    ctx = ts.context_from(public_context)
    if ctx.is_private():
        raise ValueError("a passive party must not hold the CKKS secret key")
    n, m = X.shape
    if len(nu_chunks) != chunks(n):
        raise ValueError(f"got {len(nu_chunks)} ciphertext chunks for {n} rows (expected {chunks(n)})")
    padded = np.zeros((len(nu_chunks) * SLOTS, m))
    padded[:n] = X
    encs = [ts.ckks_vector_from(ctx, c) for c in nu_chunks]
    masks = rng.uniform(-MASK_BOUND, MASK_BOUND, size=(m, SLOTS))
    out = []
    for j in range(m):
        acc = None
        for c, enc in enumerate(encs):
            part = enc * padded[c * SLOTS:(c + 1) * SLOTS, j]
            acc = part if acc is None else acc + part
        out.append((acc + masks[j]).serialize())
    return out, masks.sum(axis=1)


# -- the server's side (holds the secret key) ---------------------------------------
class CkksServer:
    """Key owner: encrypts ν once a round, decrypts masked column vectors, runs leg 2."""

    def __init__(self, n_rows: int) -> None:
        ts = _tenseal()
        self.n = n_rows
        self.ctx = ts.context(ts.SCHEME_TYPE.CKKS, POLY_MODULUS_DEGREE, coeff_mod_bit_sizes=list(COEFF_MOD_BIT_SIZES))
        self.ctx.global_scale = 2.0**SCALE_BITS
        self.public = self.ctx.serialize(
            save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
        )
        self._round: int | None = None
        self._nu_record: ArrayRecord | None = None
        self.bytes_sent = 0  # ciphertext + context bytes to passive parties (for cost reports)
        self.bytes_received = 0

    def ship_context(self, messages: list[Message], passive: set[int]) -> None:
        """Attach the public context (no secret key) to the query.init of passive parties."""
        for m in messages:
            if m.metadata.dst_node_id in passive:
                m.content.array_records[CONTEXT_RECORD] = ArrayRecord({"context": to_bytes_array(self.public)})
                self.bytes_sent += len(self.public)

    def passive_content(self, nu: np.ndarray, server_round: int, evaluate: bool) -> RecordDict:
        """Enc(n·ν) in 4096-row chunks, encrypted once per round for all passive parties."""
        if self._round != server_round:
            ts = _tenseal()
            scaled = np.zeros(chunks(self.n) * SLOTS)
            scaled[: self.n] = np.asarray(nu, dtype=np.float64) * self.n
            blobs = [ts.ckks_vector(self.ctx, scaled[c * SLOTS:(c + 1) * SLOTS]).serialize() for c in range(chunks(self.n))]
            self._nu_record = ArrayRecord({f"nu-ct-{c}": to_bytes_array(b) for c, b in enumerate(blobs)})
            self._round = server_round
        self.bytes_sent += sum(a.numpy().nbytes for a in self._nu_record.values())
        return RecordDict({msgs.PAYLOAD: self._nu_record, msgs.ROUND: msgs.round_config(server_round, evaluate)})

    def masked_sums(self, reply: Message) -> np.ndarray:
        """Decrypt each masked column vector and sum its slots: n·g_j + Σ_s r_{j,s}."""
        ts = _tenseal()
        record = reply.content.array_records[MASKED_RECORD]
        cols = sorted(record, key=lambda k: int(k.split("-")[1]))
        blobs = [from_bytes_array(record[k]) for k in cols]
        self.bytes_received += sum(map(len, blobs))
        return np.array([np.sum(ts.ckks_vector_from(self.ctx, b).decrypt()) for b in blobs])

    def second_leg(self, server, grid, replies: list[Message], server_round: int, timeout: float) -> list[Message]:
        """Turn passive parties' masked gradients into train.passive_unmask messages."""
        done, follow_up = [], []
        for reply in replies:
            if reply.metadata.message_type != TRAIN_PASSIVE_ENC:
                done.append(reply)
                continue
            content = RecordDict(
                {
                    msgs.PAYLOAD: ArrayRecord({"masked-sum": Array(self.masked_sums(reply))}),
                    msgs.ROUND: msgs.round_config(server_round, server.evaluates(server_round)),
                }
            )
            follow_up.append(
                Message(content, dst_node_id=reply.metadata.src_node_id, message_type=TRAIN_PASSIVE_UNMASK,
                        group_id=str(server_round))
            )
        return done + (server.exchange(grid, follow_up, timeout) if follow_up else [])


def passive_nodes(nodes: dict) -> set[int]:
    return {nid for nid, node in nodes.items() if node.role == msgs.ROLE_PASSIVE}


class CkksChannel(RoundHook):
    """The server's ν channel for encrypted ν: public context with ``query.init``,
    Enc(ν) instead of ν, and the second leg of every round."""

    def __init__(self, n_rows: int) -> None:
        self.server = CkksServer(n_rows)

    def init_messages(self, server, messages: list[Message]) -> None:
        self.server.ship_context(messages, passive_nodes(server.nodes))

    def passive_message(self, server, server_round: int, nu: np.ndarray, evaluate: bool):
        return self.server.passive_content(nu, server_round, evaluate), TRAIN_PASSIVE_ENC

    def incoming(self, server, grid, server_round: int, replies: list[Message], timeout: float) -> list[Message]:
        return self.server.second_leg(server, grid, replies, server_round, timeout)


# -- the passive party's side -----------------------------------------------------------
def _public_context(context: Context) -> bytes:
    record = context.state.array_records.get(CONTEXT_RECORD)
    if record is None:
        raise NodeConfigError("privacy.secure-nu='ckks' but this node got no CKKS context with query.init")
    return from_bytes_array(record["context"])


def keep_context_mod(message: Message, context: Context, call_next) -> Message:
    """Keep the public CKKS context a ``query.init`` carries, for the rest of the run."""
    if message.metadata.message_type == msgs.INIT and CONTEXT_RECORD in message.content.array_records:
        context.state.array_records[CONTEXT_RECORD] = message.content.array_records[CONTEXT_RECORD]
    return call_next(message, context)


def train_passive_enc(message: Message, context: Context) -> Message:
    """From Enc(n·ν): Enc(n·ν ⊙ X_k[:, j] + r_j) per column; keep Σ_s r_{j,s}; reply masked."""
    rt = PartyRuntime(context)
    if rt.data.role != msgs.ROLE_PASSIVE:
        raise NodeConfigError(f"partition {rt.data.partition_id} is active but got a {TRAIN_PASSIVE_ENC} message")
    record = message.content.array_records[msgs.PAYLOAD]
    keys = sorted(record, key=lambda k: int(k.rsplit("-", 1)[1]))
    blobs = [from_bytes_array(record[k]) for k in keys]
    rng = np.random.default_rng()  # fresh OS entropy: the server must not predict the mask
    X = rt.data.X_train.astype(np.float64)
    cts, mask_sums = masked_column_sums(_public_context(context), blobs, X, rng)
    context.state.array_records[MASK_STATE] = ArrayRecord({"mask-sums": Array(mask_sums)})
    content = RecordDict({MASKED_RECORD: ArrayRecord({f"col-{j}": to_bytes_array(c) for j, c in enumerate(cts)})})
    return Message(content, reply_to=message)


def train_passive_unmask(message: Message, context: Context) -> Message:
    """From the server's slot sums: remove the mask, g = X_kᵀν, one step, reply new logits."""
    rt = PartyRuntime(context)
    state = context.state.array_records.pop(MASK_STATE, None)
    if state is None:
        raise NodeConfigError(f"{TRAIN_PASSIVE_UNMASK} without a preceding {TRAIN_PASSIVE_ENC}")
    masked = msgs.read_array(message.content, msgs.PAYLOAD, "masked-sum").astype(np.float64)
    g = (masked - state["mask-sums"].numpy()) / rt.n_train  # X_kᵀν
    party = rt.party()
    if rt.cfg.model != "linear" or party.block.bias is not None:
        raise NodeConfigError("privacy.secure-nu='ckks' supports linear passive models without intercept only")
    party.block.apply_gradient(g, rt.cfg.lr, party.mu)
    rt.save(party)
    return rt.reply(message, party, steps=1)


def register(app: ClientApp) -> None:
    """The passive party's handlers for encrypted ν on ``app`` (with :func:`keep_context_mod`)."""
    app.train("passive_enc")(train_passive_enc)
    app.train("passive_unmask")(train_passive_unmask)
    mark_step_type(TRAIN_PASSIVE_UNMASK)
