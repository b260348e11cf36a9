"""Encrypted ν for linear models (run config ``privacy.secure-nu = "ckks"``), both sides.

With plain ν a passive party reads labels off sign(ν_i) (see ``tools/audit.py``). Here ν
reaches passive parties only as CKKS ciphertexts (Microsoft SEAL through TenSEAL's
``sealapi`` binding), and the server, which holds the secret key, only ever decrypts
gradients hidden under the party's random mask:

================== ================================ =====================================
message type        from server                      reply
================== ================================ =====================================
query.init          + ``ckks``: the CKKS parameters  (as before) partial logits
                    (no key of any kind)
train.passive_enc   Enc(n·ν) in 4096-row chunks      Enc(n·ν ⊙ (X_k[:, 2p] + i·X_k[:, 2p+1]) + r_p),
                                                     one ciphertext per pair of columns
second leg          Σ_slots of each decrypted        gradient descent (train.passive_unmask):
                    masked vector (real and          new u_k; Newton (train.newton_passive,
                    imaginary part: m floats)        with α_k): the block direction
================== ================================ =====================================

Why this shape (costs in docs/privacy.md, Encrypted ν). The party multiplies each encrypted
chunk by its columns' slice and adds across chunks: plaintext products and additions
only, no rotations, hence no Galois, relinearisation or even public keys (ν is encrypted
with the secret key; the parties get the parameters only). Its columns are encoded
once per process and kept (``_encoded_block``): TenSEAL's ``ckks_vector * list`` encodes
the plaintext again for every product, and the encoding (an FFT and an NTT per prime)
cost more than the product itself. Two columns share one product: CKKS slots are
complex, so the plaintext is X[:, 2p] + i·X[:, 2p+1] and the real and imaginary parts of
the slot sum are the two columns' sums, which halves the products, the masks and the
ciphertexts sent back. Products are summed before the one rescale per pair. The party
masks every slot with its own uniform random number (real and imaginary part) and
returns one ciphertext per pair; the server decrypts and sums the slots. The server
thus sees n·(X_kᵀν)_j + Σ_s r_{j,s} and per-slot values under fresh masks, never the
gradient; the party sees ν only encrypted and, after unmasking, its own gradient X_kᵀν
(m numbers a round, the same as in the plain protocol).

Parameters: N = 8192, coefficient moduli 60/40/60 bits (160 ≤ 218: 128-bit security per
the HomomorphicEncryption.org standard, which SEAL checks when the context is built),
scale 2^40. ν is scaled by n before encryption (ν ~ 1/n; CKKS error is absolute, ~1e-9
here) and the gradient divided by n after: relative error ~1e-9 at n = 40,000.

SEAL objects travel as SEAL's own serialisation; the binding saves and loads through a
path only, so each goes through a scratch file (in /dev/shm where it exists).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import threading
import weakref

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict

from flwr.serverapp import Grid

from fairvfl_flwr.core.newton import in_row_space
from fairvfl_flwr.data.partydata import NodeConfigError
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.arrays import to_array, to_numpy
from fairvfl_flwr.flower.hooks import RoundHook, ServerView
from fairvfl_flwr.flower.party import GRADIENT_STATE, MODEL_STATE, Handles, PartyRuntime, handlers
from fairvfl_flwr.flower.records import array_records, config_records

TRAIN_PASSIVE_ENC = msgs.TRAIN_PASSIVE_ENC
TRAIN_PASSIVE_UNMASK = msgs.TRAIN_PASSIVE_UNMASK
MASK_STATE = "fairvfl.ckks-mask"
CONTEXT_RECORD = "ckks"  # ArrayRecord: {"context": uint8 bytes of the parameters: N and the primes, uint64}
MASKED_RECORD = "masked"  # ArrayRecord a party replies with: {"pair-<p>": uint8 ciphertext bytes}
MASKED_SUM = msgs.MASKED_SUM  # the second leg's payload key: 2 floats per pair of columns
#: A first leg's ConfigRecord saying ν came as 2^log2 · n·ν (a registry's encrypted groups: the
#: server fills the slots' range so that the registry's noise on the sums is small against them);
#: without it, n·ν. The party divides its gradient back.
NU_SCALE = "nu-scale"
#: The largest exponent a first leg may name.
MAX_NU_LOG2 = 30

POLY_MODULUS_DEGREE = 8192
SLOTS = POLY_MODULUS_DEGREE // 2  # 4096 rows per ciphertext
COEFF_MOD_BIT_SIZES = (60, 40, 60)  # one plaintext multiplication, then one rescale
SCALE = 2.0**40
MASK_BOUND = 2.0**16  # |mask| per slot and part; |n ν_i x_ij| summed over chunks stays << this


def seal_api():
    """TenSEAL's SEAL binding (``tenseal.sealapi``), or an ImportError that says which extra installs it."""
    try:
        import tenseal.sealapi as seal
    except ImportError as exc:  # pragma: no cover - config.validate refuses first
        raise ImportError("privacy.secure-nu='ckks' needs TenSEAL: pip install 'fairvfl-flwr[privacy]'") from exc
    return seal


def to_bytes_array(blob: bytes) -> Array:
    """SEAL's serialised bytes as a uint8 Array, the form a RecordDict carries them in."""
    return to_array(np.frombuffer(blob, dtype=np.uint8).copy())


def from_bytes_array(array: Array) -> bytes:
    """The serialised bytes back from a uint8 Array (:func:`to_bytes_array`)."""
    return to_numpy(array).tobytes()


def chunks(n_rows: int) -> int:
    """Ciphertexts needed for ``n_rows`` rows, SLOTS rows each."""
    return -(-n_rows // SLOTS)


def pairs(n_columns: int) -> int:
    """Column pairs of a party with ``n_columns`` columns: two columns share one complex slot."""
    return -(-n_columns // 2)


# -- SEAL objects as bytes ----------------------------------------------------------------
_SCRATCH: list[str] = []


def _scratch_path() -> str:
    if not _SCRATCH:
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        _SCRATCH.append(tempfile.mkdtemp(prefix="fairvfl-ckks-", dir=shm))
        atexit.register(shutil.rmtree, _SCRATCH[0], True)
    return os.path.join(_SCRATCH[0], f"{os.getpid()}-{threading.get_ident()}")


def dump_seal(obj) -> bytes:
    """A SEAL object (ciphertext, key) in SEAL's own serialisation."""
    path = _scratch_path()
    obj.save(path)
    try:
        with open(path, "rb") as f:
            return f.read()
    finally:  # nothing left in memory-backed /dev/shm should the process die before atexit
        os.remove(path)


def load_seal(ctx, blob: bytes, make, what: str):
    """The SEAL object ``make()`` (a Ciphertext, a SecretKey) loaded from ``blob`` for the context
    ``ctx``; bytes that are not one for these parameters are refused naming ``what``."""
    path = _scratch_path()
    with open(path, "wb") as f:
        f.write(blob)
    obj = make()
    try:
        obj.load(ctx, path)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"{what} is not a CKKS {type(obj).__name__} for these parameters: {exc}") from None
    finally:
        os.remove(path)
    return obj


def load_ciphertext(ctx, blob: bytes, what: str):
    """A ciphertext from SEAL's serialisation (:func:`load_seal`)."""
    return load_seal(ctx, blob, seal_api().Ciphertext, what)


@functools.lru_cache(maxsize=4)
def seal_context(params: bytes):
    """(SEAL context, encoder, evaluator) of the parameters a server ships: built once per process."""
    seal = seal_api()
    values = np.frombuffer(params, dtype="<u8")
    if len(values) < 2:
        raise ValueError(f"the CKKS parameters hold {len(values)} numbers (expected N and the primes)")
    parms = seal.EncryptionParameters(seal.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(int(values[0]))
    parms.set_coeff_modulus([seal.Modulus(int(q)) for q in values[1:]])
    ctx = seal.SEALContext(parms, True, seal.SEC_LEVEL_TYPE.TC128)
    if not ctx.parameters_set():
        raise ValueError(f"CKKS parameters refused (128-bit security required): {ctx.parameters_error_message()}")
    return ctx, seal.CKKSEncoder(ctx), seal.Evaluator(ctx)


def parameters(bit_sizes: tuple[int, ...] = COEFF_MOD_BIT_SIZES) -> bytes:
    """N and the coefficient primes (of ``bit_sizes``): all a party needs (it holds no key)."""
    seal = seal_api()
    primes = [q.value() for q in seal.CoeffModulus.Create(POLY_MODULUS_DEGREE, list(bit_sizes))]
    return np.array([POLY_MODULUS_DEGREE, *primes], dtype="<u8").tobytes()


# -- the passive party's side (no key) -----------------------------------------------------
# X_k's column pairs encoded as plaintexts, per block and parameters: a party encodes its
# columns once, not every round (a process that serves many rounds keeps them).
_ENCODED: dict[int, tuple[weakref.ref, tuple, list]] = {}


def _encoded_block(params: bytes, X: np.ndarray, level=None) -> list:
    """plaintexts[c][p] = encode(X[chunk c, 2p] + i·X[chunk c, 2p+1]) at ``level`` (a parms_id:
    ν's ciphertexts' own; default the fresh level, where the server's ν is encrypted)."""
    seal = seal_api()
    ctx, encoder, _ = seal_context(params)
    level = ctx.first_parms_id() if level is None else level
    key, held = id(X), (params, tuple(level))
    hit = _ENCODED.get(key)
    if hit is not None and hit[0]() is X and hit[1] == held:
        return hit[2]
    n, m = X.shape
    padded = np.zeros((chunks(n) * SLOTS, 2 * pairs(m)))
    padded[:n, :m] = X
    cplx = padded[:, 0::2] + 1j * padded[:, 1::2]  # column pair p as one complex column
    plain = []
    for c in range(chunks(n)):
        rows = cplx[c * SLOTS:(c + 1) * SLOTS]
        row = []
        for p in range(pairs(m)):
            pt = seal.Plaintext()
            encoder.encode(rows[:, p].tolist(), level, SCALE, pt)
            row.append(pt)
        plain.append(row)
    _ENCODED[key] = (weakref.ref(X, lambda _, key=key: _ENCODED.pop(key, None)), held, plain)
    return plain


def masked_column_sums(params: bytes, nu_chunks: list[bytes], X: np.ndarray, rng: np.random.Generator):
    """Enc(n·ν ⊙ (X[:, 2p] + i·X[:, 2p+1]) + r_p) for every column pair p, and the mask sums
    (real and imaginary part of Σ_s r_{p,s} for each p: 2·pairs floats, kept by the party).

    ``X`` is the party's n × m block; rows are padded with zeros to whole chunks.
    """
    seal = seal_api()
    ctx, encoder, evaluator = seal_context(params)
    n, m = X.shape
    if len(nu_chunks) != chunks(n):
        raise ValueError(f"got {len(nu_chunks)} ciphertext chunks for {n} rows (expected {chunks(n)})")
    encs = [load_ciphertext(ctx, blob, f"ν chunk {c}") for c, blob in enumerate(nu_chunks)]
    # ν may come rescaled once already (a registry's groups, jobs/encrypted_groups.py): its level
    plain = _encoded_block(params, X, encs[0].parms_id() if encs else None)
    masks = (rng.uniform(-MASK_BOUND, MASK_BOUND, size=(pairs(m), SLOTS))
             + 1j * rng.uniform(-MASK_BOUND, MASK_BOUND, size=(pairs(m), SLOTS)))
    out = []
    for p in range(pairs(m)):
        acc = seal.Ciphertext()
        evaluator.multiply_plain(encs[0], plain[0][p], acc)
        part = seal.Ciphertext()
        for c in range(1, len(encs)):
            evaluator.multiply_plain(encs[c], plain[c][p], part)
            evaluator.add_inplace(acc, part)
        evaluator.rescale_to_next_inplace(acc)
        mask = seal.Plaintext()
        encoder.encode(masks[p].tolist(), acc.parms_id(), acc.scale, mask)
        evaluator.add_plain_inplace(acc, mask)
        out.append(dump_seal(acc))
    sums = masks.sum(axis=1)
    return out, np.column_stack([sums.real, sums.imag]).reshape(-1)


def unmask(masked: np.ndarray, mask_sums: np.ndarray, n_rows: int, n_columns: int) -> np.ndarray:
    """X_kᵀν from the server's slot sums: remove the masks, keep the m columns, divide by n."""
    if masked.shape != mask_sums.shape:
        raise ValueError(f"got {masked.shape[0]} masked sums for {mask_sums.shape[0]} masks")
    return (masked - mask_sums)[:n_columns] / n_rows


# -- the server's side (holds the secret key) ---------------------------------------
class CkksServer:
    """Key owner: encrypts ν once a round, decrypts masked column vectors, runs leg 2."""

    def __init__(self, n_rows: int) -> None:
        seal = seal_api()
        self.n = n_rows
        self.public = parameters()
        ctx, self.encoder, _ = seal_context(self.public)
        self.ctx = ctx
        secret = seal.KeyGenerator(ctx).secret_key()
        self.encryptor = seal.Encryptor(ctx, secret)  # symmetric: parties need no public key
        self.decryptor = seal.Decryptor(ctx, secret)
        self._round: int | None = None
        self._nu_record: ArrayRecord | None = None
        self.bytes_sent = 0  # ciphertext + parameter bytes to passive parties (for cost reports)
        self.bytes_received = 0

    def shipseal_context(self, messages: list[Message], passive: set[int]) -> None:
        """Attach the CKKS parameters (no key) to the init message of passive parties."""
        for m in messages:
            if m.metadata.dst_node_id in passive:
                array_records(m.content)[CONTEXT_RECORD] = ArrayRecord({"context": to_bytes_array(self.public)})
                self.bytes_sent += len(self.public)

    def encrypt(self, values: np.ndarray) -> bytes:
        """Enc(values) (at most 4096), seeded: the ciphertext's random half travels as a seed."""
        seal = seal_api()
        pt = seal.Plaintext()
        self.encoder.encode(np.asarray(values, dtype=np.float64).tolist(), SCALE, pt)
        return dump_seal(self.encryptor.encrypt_symmetric(pt))

    def passive_content(self, nu: np.ndarray, server_round: int, evaluate: bool) -> RecordDict:
        """Enc(n·ν) in 4096-row chunks, encrypted once per round for all passive parties."""
        if self._round != server_round:
            scaled = np.zeros(chunks(self.n) * SLOTS)
            scaled[: self.n] = np.asarray(nu, dtype=np.float64) * self.n
            blobs = [self.encrypt(scaled[c * SLOTS:(c + 1) * SLOTS]) for c in range(chunks(self.n))]
            self._nu_record = ArrayRecord({f"nu-ct-{c}": to_bytes_array(b) for c, b in enumerate(blobs)})
            self._round = server_round
        self.bytes_sent += sum(to_numpy(a).nbytes for a in self._nu_record.values())
        return RecordDict({msgs.PAYLOAD: self._nu_record, msgs.ROUND: msgs.round_config(server_round, evaluate)})

    def masked_sums(self, reply: Message) -> np.ndarray:
        """Decrypt each masked pair vector and sum its slots: n·g_j + Σ_s r_{j,s}, two per pair."""
        seal = seal_api()
        record = array_records(reply.content)[MASKED_RECORD]
        keys = sorted(record, key=lambda k: int(k.split("-")[1]))
        out = []
        for k in keys:
            blob = from_bytes_array(record[k])
            self.bytes_received += len(blob)
            pt = seal.Plaintext()
            self.decryptor.decrypt(load_ciphertext(self.ctx, blob, f"masked ciphertext {k!r}"), pt)
            total = complex(np.sum(self.encoder.decode_complex(pt)))
            out += [total.real, total.imag]
        return np.array(out)

    def second_leg(self, server: ServerView, grid: Grid, replies: list[Message], server_round: int,
                   timeout: float) -> list[Message]:
        """Turn passive parties' masked gradients into the training method's second message."""
        done, follow_up = [], []
        for reply in replies:
            if reply.metadata.message_type != TRAIN_PASSIVE_ENC:
                done.append(reply)
                continue
            nid = reply.metadata.src_node_id
            content, kind = server.masked_gradient_message(nid, server_round, {MASKED_SUM: self.masked_sums(reply)})
            follow_up.append(Message(content, dst_node_id=nid, message_type=kind, group_id=str(server_round)))
        return done + (server.exchange(grid, follow_up, timeout) if follow_up else [])


def passive_nodes(nodes: dict) -> set[int]:
    """The node ids of the passive parties, the only ones that receive encrypted ν."""
    return {nid for nid, node in nodes.items() if node.role == msgs.ROLE_PASSIVE}


class CkksChannel(RoundHook):
    """The server's ν channel for encrypted ν: the parameters with the init message, Enc(ν)
    instead of ν, and the second leg of every round (its message comes from the training
    method: ``VFLServer.masked_gradient_message``)."""

    def __init__(self, n_rows: int) -> None:
        self.server = CkksServer(n_rows)

    def init_messages(self, server: ServerView, messages: list[Message]) -> None:
        """Attach the CKKS parameters (N and the primes, no key) to each passive party's start message."""
        self.server.shipseal_context(messages, passive_nodes(server.nodes))

    def passive_message(self, server: ServerView, server_round: int, nu: np.ndarray,
                        evaluate: bool) -> tuple[RecordDict, str]:
        """Enc(n·ν) in place of ν for a passive party, under its own message type."""
        return self.server.passive_content(nu, server_round, evaluate), TRAIN_PASSIVE_ENC

    def incoming(self, server: ServerView, grid: Grid, server_round: int, replies: list[Message],
                 timeout: float) -> list[Message]:
        """Decrypt the passive parties' masked slot sums and send each its second leg; return every
        round's final reply."""
        return self.server.second_leg(server, grid, replies, server_round, timeout)


# -- the passive party's side -----------------------------------------------------------
def _parameters(context: Context) -> bytes:
    record = array_records(context.state).get(CONTEXT_RECORD)
    if record is None:
        raise NodeConfigError("privacy.secure-nu='ckks' but this node got no CKKS parameters with its init message")
    return from_bytes_array(record["context"])


def ckks_mod(message: Message, context: Context, call_next) -> Message:
    """Keep the CKKS parameters an init message carries, for the rest of the run; and before
    a second-leg message (masked slot sums in its payload), remove this round's masks and
    leave X_kᵀν in the node's state (``GRADIENT_STATE``) for the training method's handler."""
    mtype = message.metadata.message_type
    arrays = array_records(message.content)
    if msgs.kind_of(mtype) is msgs.Kind.START and CONTEXT_RECORD in arrays:
        array_records(context.state)[CONTEXT_RECORD] = arrays[CONTEXT_RECORD]
    elif msgs.second_leg(mtype, arrays.get(msgs.PAYLOAD, {})):
        rt = PartyRuntime(context)
        state = array_records(context.state).pop(MASK_STATE, None)
        if state is None:
            raise NodeConfigError(f"{rt.who}: {mtype} carries masked sums without a preceding {TRAIN_PASSIVE_ENC}")
        masked = to_numpy(arrays[msgs.PAYLOAD][MASKED_SUM]).astype(np.float64)
        if not np.all(np.isfinite(masked)):
            raise NodeConfigError(f"{rt.who}: the masked sums of {mtype} are not all finite")
        g = unmask(masked, to_numpy(state["mask-sums"]), rt.n_train, rt.data.X_train.shape[1])
        if "scale" in state:  # ν came scaled up (NU_SCALE): a registry's sums, each with its noise
            g = g / float(to_numpy(state["scale"])[0])
            # X_kᵀν has no part along X_k's null space (collinear columns), so the noise's part there
            # is noise alone, which a Newton step would take at 1/μ
            g = in_row_space(np.asarray(rt.data.X_train, dtype=np.float64), g)
        array_records(context.state)[GRADIENT_STATE] = ArrayRecord({"gradient": to_array(g)})
    return call_next(message, context)


def train_passive_enc(message: Message, context: Context) -> Message:
    """From Enc(n·ν): one masked ciphertext per column pair; keep the mask sums; reply masked."""
    rt = PartyRuntime(context)
    if rt.data.role != msgs.ROLE_PASSIVE:
        raise NodeConfigError(f"partition {rt.data.partition_id} is active but got a {TRAIN_PASSIVE_ENC} message")
    record = array_records(message.content)[msgs.PAYLOAD]
    keys = sorted(record, key=lambda k: int(k.rsplit("-", 1)[1]))
    blobs = [from_bytes_array(record[k]) for k in keys]
    rng = np.random.default_rng()  # fresh OS entropy: the server must not predict the mask
    # the cached block itself (not a converted copy), so that its encoding is kept across rounds
    cts, mask_sums = masked_column_sums(_parameters(context), blobs, rt.data.X_train, rng)
    said = config_records(message.content).get(NU_SCALE)
    log2 = said.get("log2") if said is not None else 0
    if not isinstance(log2, int) or isinstance(log2, bool) or not 0 <= log2 <= MAX_NU_LOG2:
        raise NodeConfigError(f"{rt.who}: {TRAIN_PASSIVE_ENC} names ν's scale 2^{log2!r}: an integer power 0..."
                              f"{MAX_NU_LOG2} is expected")
    array_records(context.state)[MASK_STATE] = ArrayRecord({"mask-sums": to_array(mask_sums),
                                                           "scale": to_array(np.array([2.0**log2]))})
    content = RecordDict({MASKED_RECORD: ArrayRecord({f"pair-{p}": to_bytes_array(c) for p, c in enumerate(cts)})})
    return Message(content, reply_to=message)


def train_passive_unmask(message: Message, context: Context) -> Message:
    """Gradient descent's second leg: g = X_kᵀν (unmasked by :func:`ckks_mod`), one step, new logits."""
    rt = PartyRuntime(context)
    g = rt.take_gradient()
    if g is None:
        raise NodeConfigError(f"{rt.who}: {TRAIN_PASSIVE_UNMASK} without masked sums to unmask")
    party = rt.party()
    if rt.cfg.model != "linear" or party.block.bias is not None:
        raise NodeConfigError("privacy.secure-nu='ckks' supports linear passive models without intercept only")
    party.block.apply_gradient(g, rt.cfg.lr, party.mu)
    rt.save(party)
    return rt.reply(message, party, steps=1)


#: The passive party's handlers for encrypted ν (with :func:`ckks_mod`): part of the training job (jobs/training.py).
# the first leg's reply (the ciphertext's product) is kept for a re-send; the second steps θ, so a
# re-send rebuilds it from θ
HANDLERS = handlers({msgs.TRAIN_PASSIVE_ENC: Handles(msgs.Kind.ROUND, train_passive_enc),
                     msgs.TRAIN_PASSIVE_UNMASK: Handles(msgs.Kind.STEP, train_passive_unmask, keeps=(MODEL_STATE,))})
