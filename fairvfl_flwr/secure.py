"""Encrypted ν for linear models (run config ``secure-nu = "ckks"``), the server's side.

With plain ν a passive party reads labels off sign(ν_i) (see ``audit.py``). Here ν
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

Why this shape (measured on this machine, n = 40,000, m = 17): TenSEAL's
``ckks_vector.matmul(plain_matrix)`` rotates once per matrix row and had not finished
one chunk set after 10 minutes; per-column ``dot`` needs Galois keys (a 34 MB public
context) and 12 rotations per column and chunk (~4 s). Instead the party multiplies
each encrypted chunk by its column slice and adds across chunks (plaintext products
and additions only, no rotations, no Galois or relinearisation keys: a 0.36 MB public
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
from flwr.app import Array, ArrayRecord, Message, RecordDict

from . import messages as msgs

TRAIN_PASSIVE_ENC = "train.passive_enc"
TRAIN_PASSIVE_UNMASK = "train.passive_unmask"
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
        raise ImportError("secure-nu='ckks' needs TenSEAL: pip install 'fairvfl-flwr[privacy]'") from exc
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

    def second_leg(self, strategy, grid, replies: list[Message], server_round: int, timeout: float) -> list[Message]:
        """Turn passive parties' masked gradients into train.passive_unmask messages."""
        done, follow_up = [], []
        for reply in replies:
            if reply.metadata.message_type != TRAIN_PASSIVE_ENC:
                done.append(reply)
                continue
            content = RecordDict(
                {
                    msgs.PAYLOAD: ArrayRecord({"masked-sum": Array(self.masked_sums(reply))}),
                    msgs.ROUND: msgs.round_config(server_round, strategy._evaluates(server_round)),
                }
            )
            follow_up.append(
                Message(content, dst_node_id=reply.metadata.src_node_id, message_type=TRAIN_PASSIVE_UNMASK,
                        group_id=str(server_round))
            )
        return done + (strategy.exchange(grid, follow_up, timeout) if follow_up else [])


def passive_nodes(nodes: dict) -> set[int]:
    return {nid for nid, node in nodes.items() if node.role == msgs.ROLE_PASSIVE}
