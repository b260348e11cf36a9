"""Reply and payload validation: nothing malformed reaches λ, ν or a party's θ.

Server side (:func:`check_envelope`, :func:`check_logits_reply`): every reply must answer
a message the server sent, come from the node it was sent to, carry the same message
type, and hold float partial logits of the right length with finite values (and a
finite, non-negative ‖θ_k‖²). Party side (:func:`check_payload`): z, λ and ν must have
the party's row count / the run's multiplier count, a float dtype and finite values.
Every error names the node (or party) and what was wrong. The checks are pure
functions of arrays and metadata, so they are unit-tested without a Flower runtime.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.arrays import to_numpy
from fairvfl_flwr.flower.records import array_records, metric_records

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
LARGER_ETA = "use a smaller step (a larger eta; the step is 1/eta) or a smaller beta"


class ReplyError(RuntimeError):
    """A reply (server side) or payload (party side) was malformed; it was not used."""


class DivergenceError(RuntimeError):
    """The training objective or the multipliers became non-finite."""


def check_vector(arr: Any, name: str, rows: int, who: str, width: int = 1, nonneg: bool = False) -> np.ndarray:
    """``arr`` must be a float array of ``rows`` values (``rows`` × ``width``), all finite."""
    if not isinstance(arr, np.ndarray):
        raise ReplyError(f"{who}: {name} is a {type(arr).__name__}, not an array")
    if arr.dtype not in FLOAT_DTYPES:
        raise ReplyError(f"{who}: {name} has dtype {arr.dtype}, expected float32 or float64")
    expected = (rows,) if width == 1 else (rows, width)
    if arr.shape != expected and not (width > 1 and arr.ndim == 1 and arr.size == rows * width):
        raise ReplyError(f"{who}: {name} has shape {arr.shape}, expected {expected} (one value per row)")
    bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
    if bad:
        raise ReplyError(
            f"{who}: {name} holds {bad} non-finite value(s) (NaN/inf) of {arr.size}; rejected before use. "
            f"If this follows a growing loss the run is diverging: {LARGER_ETA}"
        )
    if nonneg and np.any(arr < 0):
        raise ReplyError(f"{who}: {name} has negative entries (multipliers are >= 0)")
    return arr


def check_envelope(reply: Any, sent: dict[str, Any], who: str) -> None:
    """The reply answers one of ``sent`` (message id → message), from its node, same type."""
    meta = reply.metadata
    msg = sent.get(meta.reply_to_message_id)
    if msg is None:
        raise ReplyError(f"{who}: reply to unknown message {meta.reply_to_message_id!r}")
    if meta.src_node_id != msg.metadata.dst_node_id:
        raise ReplyError(
            f"{who}: reply comes from node {meta.src_node_id}, but the message went to node {msg.metadata.dst_node_id}"
        )
    if meta.message_type != msg.metadata.message_type:
        raise ReplyError(f"{who}: reply has message type {meta.message_type!r}, expected {msg.metadata.message_type!r}")


def check_logits_reply(content: Any, who: str, n_train: int, n_test: int, width: int = 1) -> dict[str, np.ndarray]:
    """A train/init reply: ``logits`` {train[, test]} and ``stats`` {sq-norm, steps}."""
    if msgs.LOGITS not in array_records(content):
        raise ReplyError(f"{who}: reply holds no '{msgs.LOGITS}' arrays (got {sorted(array_records(content))})")
    if msgs.STATS not in metric_records(content):
        raise ReplyError(f"{who}: reply holds no '{msgs.STATS}' metrics")
    record = array_records(content)[msgs.LOGITS]
    if "train" not in record:
        raise ReplyError(f"{who}: reply holds no training logits")
    out = {"train": check_vector(to_numpy(record["train"]), "train logits", n_train, who, width)}
    if "test" in record:
        out["test"] = check_vector(to_numpy(record["test"]), "test logits", n_test, who, width)
    stats = metric_records(content)[msgs.STATS]
    sq = stats.get("sq-norm")
    if not isinstance(sq, (int, float)) or not math.isfinite(sq) or sq < 0:
        raise ReplyError(f"{who}: sq-norm={sq!r} is not a finite number >= 0. If the model is blowing up: {LARGER_ETA}")
    steps = stats.get("steps")
    if not isinstance(steps, (int, float)) or steps < 0:
        raise ReplyError(f"{who}: steps={steps!r} is not a count")
    return out


def check_payload(content: Any, who: str, expect: dict[str, tuple[int, bool]]) -> dict[str, np.ndarray]:
    """Party side: ``expect`` maps payload key → (length, non-negative?)."""
    if msgs.PAYLOAD not in array_records(content):
        raise ReplyError(f"{who}: message holds no '{msgs.PAYLOAD}' arrays")
    record = array_records(content)[msgs.PAYLOAD]
    out = {}
    for key, (rows, nonneg) in expect.items():
        if key not in record:
            raise ReplyError(f"{who}: message payload has no '{key}' (got {sorted(record)})")
        out[key] = check_vector(to_numpy(record[key]), key, rows, who, nonneg=nonneg)
    return out


def check_state(loss: float, lam: np.ndarray, server_round: int, z: np.ndarray | None = None) -> None:
    """Divergence guard: the objective, every multiplier and the summed logits z must be finite."""
    lam = np.asarray(lam, dtype=np.float64)
    bad_z = 0 if z is None else int(np.size(z) - np.count_nonzero(np.isfinite(z)))
    if not math.isfinite(loss) or not np.all(np.isfinite(lam)) or bad_z:
        raise DivergenceError(
            f"the run diverged at round {server_round}: L(theta)={loss!r}, lambda={lam.tolist()}"
            + (f", {bad_z} non-finite summed logits z" if bad_z else "") + "; "
            f"stopped, the last good checkpoint is kept. {LARGER_ETA[0].upper() + LARGER_ETA[1:]}"
        )
