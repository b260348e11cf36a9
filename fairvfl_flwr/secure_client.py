"""Encrypted ν (``secure-nu = "ckks"``), the passive party's side: two handlers.

``train.passive_enc``: from Enc(n·ν) compute Enc(n·ν ⊙ X_k[:, j] + r_j) per column,
keep Σ_s r_{j,s} in ``context.state``, reply with the masked ciphertexts.
``train.passive_unmask``: from the server's slot sums remove the mask, g = X_kᵀν,
step θ ← θ − (1/η)(g + μθ), reply with the new partial logits (as ``train.passive``).
The protocol and its costs: ``secure.py``. Registered on ``client.app``.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict

from . import messages as msgs
from . import secure, view
from .client import _party, _reply, _save, _setup, app
from .models import gradient_step
from .partydata import NodeConfigError

MASK_STATE = "fairvfl.ckks-mask"


def _public_context(context: Context) -> bytes:
    record = context.state.array_records.get(secure.CONTEXT_RECORD)
    if record is None:
        raise NodeConfigError("secure-nu='ckks' but this node got no CKKS context with query.init")
    return secure.from_bytes_array(record["context"])


@app.train("passive_enc")
def train_passive_enc(message: Message, context: Context) -> Message:
    cfg, data = _setup(context)
    if data.role != msgs.ROLE_PASSIVE:
        raise NodeConfigError(f"partition {data.partition_id} is active but got a {secure.TRAIN_PASSIVE_ENC} message")
    record = message.content.array_records[msgs.PAYLOAD]
    keys = sorted(record, key=lambda k: int(k.rsplit("-", 1)[1]))
    blobs = [secure.from_bytes_array(record[k]) for k in keys]
    if cfg.record_view:  # the honest-but-curious transcript: ciphertext is all there is to record
        server_round = int(message.content.config_records[msgs.ROUND]["round"])
        view.record_ciphertext(cfg.record_view, data.partition_id, server_round, cfg.record_every, blobs)
    rng = np.random.default_rng()  # fresh OS entropy: the server must not predict the mask
    X = data.X_train.numpy().astype(np.float64)
    cts, mask_sums = secure.masked_column_sums(_public_context(context), blobs, X, rng)
    context.state.array_records[MASK_STATE] = ArrayRecord({"mask-sums": Array(mask_sums)})
    content = RecordDict({secure.MASKED_RECORD: ArrayRecord({f"col-{j}": secure.to_bytes_array(c) for j, c in enumerate(cts)})})
    return Message(content, reply_to=message)


@app.train("passive_unmask")
def train_passive_unmask(message: Message, context: Context) -> Message:
    cfg, data = _setup(context)
    state = context.state.array_records.pop(MASK_STATE, None)
    if state is None:
        raise NodeConfigError(f"{secure.TRAIN_PASSIVE_UNMASK} without a preceding {secure.TRAIN_PASSIVE_ENC}")
    masked = msgs.read_array(message.content, msgs.PAYLOAD, "masked-sum").astype(np.float64)
    n = data.X_train.shape[0]
    g = (masked - state["mask-sums"].numpy()) / n  # X_kᵀν
    party = _party(cfg, data, context)
    if getattr(party.model, "bias", None) is not None or cfg.model != "linear":
        raise NodeConfigError("secure-nu='ckks' supports linear passive models without intercept only")
    party.model.weight.grad = torch.as_tensor(g, dtype=party.model.weight.dtype)
    gradient_step(party.model, cfg.lr, party.mu)
    _save(party, context)
    return _reply(message, party, steps=1)
