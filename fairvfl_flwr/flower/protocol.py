"""The wire protocol: message types and the records each one carries.

Who receives what (docs/algorithm.md, "Who holds what"):

============== ===================== ==========================================
message type    from server            reply
============== ===================== ==========================================
query.info      (nothing)              role, partition id, row counts, id digest
query.init      round config           partial logits u_k (train, test)
train.active    z, λ, round config     new u_k, steps taken, ‖θ_k‖²
train.passive   ν, round config        new u_k, steps taken, ‖θ_k‖²
============== ===================== ==========================================

Saving the model adds ``query.save`` (the reply holds digests, never θ_k) and the scoring
job (``mode = "score"``) ``query.scoreinfo`` / ``query.score`` (partial logits of a chunk of
rows to score, with their ids; no labels or groups anywhere); docs/scoring.md.

Features and the split-learning baseline add their own types (encrypted ν:
``train.passive_enc`` / ``train.passive_unmask``, features/ckks.py; split learning:
``query.splitinit`` / ``train.split``, algorithms/split.py). All names live here, so the
wire contract is one table and no feature imports another to learn a name.

A passive party's ``train.passive`` message holds the array ``nu`` and the config
``round``/``evaluate`` and nothing else: no labels, groups, summed logits or λ. The
tests inspect real messages to hold this line.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

INFO = "query.info"
INIT = "query.init"
TRAIN_ACTIVE = "train.active"
TRAIN_PASSIVE = "train.passive"
TRAIN_PASSIVE_ENC = "train.passive_enc"  # encrypted ν, first leg
TRAIN_PASSIVE_UNMASK = "train.passive_unmask"  # encrypted ν, second leg
SECAGG_KEYS = "query.sakeys"  # secure aggregation set-up: each party's X25519 public key
SECAGG_PEERS = "query.sapeers"  # secure aggregation set-up: every party's public key to all
SPLIT_INIT = "query.splitinit"
SPLIT_TRAIN = "train.split"
SAVE = "query.save"  # after the last round: each party saves its block on its own disk, replies its digest
SCORE_INFO = "query.scoreinfo"  # scoring job: which block and how many rows to score (digests only)
SCORE = "query.score"  # scoring job: partial logits of a chunk of rows, with their ids

PAYLOAD = "payload"  # ArrayRecord the server sends
ROUND = "round"  # ConfigRecord: round number, whether to return test logits
LOGITS = "logits"  # ArrayRecord a party replies with
STATS = "stats"  # MetricRecord a party replies with

ROLE_ACTIVE = "active"
ROLE_PASSIVE = "passive"


def array_record(**arrays: np.ndarray) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def round_config(server_round: int, evaluate: bool) -> ConfigRecord:
    return ConfigRecord({"round": int(server_round), "evaluate": bool(evaluate)})


def active_content(z: np.ndarray, lam: np.ndarray, server_round: int, evaluate: bool, dtype) -> RecordDict:
    return RecordDict(
        {PAYLOAD: array_record(z=z.astype(dtype), lam=lam.astype(np.float64)), ROUND: round_config(server_round, evaluate)}
    )


def passive_content(nu: np.ndarray, server_round: int, evaluate: bool, dtype) -> RecordDict:
    return RecordDict({PAYLOAD: array_record(nu=nu.astype(dtype)), ROUND: round_config(server_round, evaluate)})


def init_content(evaluate: bool) -> RecordDict:
    return RecordDict({ROUND: round_config(0, evaluate)})


def logits_reply(u_train: np.ndarray, u_test: np.ndarray | None, sq_norm: float, steps: int) -> RecordDict:
    arrays = {"train": u_train} if u_test is None else {"train": u_train, "test": u_test}
    return RecordDict(
        {LOGITS: array_record(**arrays), STATS: MetricRecord({"sq-norm": float(sq_norm), "steps": int(steps)})}
    )


def read_array(content: RecordDict, record: str, key: str) -> np.ndarray:
    return content.array_records[record][key].numpy()
