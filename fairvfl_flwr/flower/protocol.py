"""The wire protocol: how a message type declares what it is, and the records messages carry.

A message type is named and declared where its handler lives, with its kind (:class:`Kind`):
an algorithm's in its module (``algorithms/``, through ``flower/party.Handles``), a job's in
its job (``jobs/``), a feature's in the feature. Every mod asks :func:`kind_of`,
:func:`in_rounds` or :func:`in_view`, never a type's name, so a new job or algorithm brings
its own types and no mod changes. ``python -m fairvfl_flwr.config`` lists every registered
type; docs/algorithm.md, "Who holds what", says what each carries.

The names that stay here are those more than one layer sends or reads: discovery
(``query.info``, which every algorithm's server starts with and secure aggregation rides on),
a rejoin's check (``query.rejoin``: the rejoin feature answers it, and a resumed run's
checkpoint sends it), encrypted ν's two legs (``train.passive_enc`` / ``train.passive_unmask``:
the CKKS feature answers them, and an algorithm's server builds the second) and the training
algorithms' own (the transcripts and the attack tools read their payloads). Their kinds are
still declared with their handlers.

FairVFL's rounds, one message per party a round:

============== ===================== ==========================================
message type    from server            reply
============== ===================== ==========================================
query.info      (nothing)              role, partition id, row counts, id digest
query.init      round config           partial logits u_k (train, test)
train.active    z, λ, round config     new u_k, steps taken, ‖θ_k‖²
train.passive   ν, round config        new u_k, steps taken, ‖θ_k‖²
============== ===================== ==========================================

Under ``optimizer = "newton"`` (algorithms/newton.py, docs/newton.md) a round is one message
per party too, and a party applies last round's step lengths α_k when the next one arrives:

==================== ============================ ========================================
message type          from server                  reply
==================== ============================ ========================================
query.newtoninit      round config                 partial logits u_k (train, test)
train.newton_active   z, λ, α_k, round config      X_k s_k; θ_k·d_j; d_iᵀd_j; test: X_test θ_k
train.newton_passive  ν, α_k, round config         and X_test d_j; ‖θ_k‖², steps
train.newton_apply    α_k, round config            partial logits u_k (train, test)
==================== ============================ ========================================

``train.newton_apply`` follows the last round only: the parties take their last step, so
the server's final scores and the saved blocks are the same model. Gauss–Newton blocks (MLP
parties) send the same messages: each round's also names the round whose directions its α_k
applies to (``base``), and the reply holds the party's partial logits after that step beside
the images of its next directions.

A passive party's ``train.passive`` message holds the array ``nu`` and the config
``round``/``evaluate`` and nothing else: no labels, groups, summed logits or λ. The
tests inspect real messages to hold this line.
"""

from __future__ import annotations

import enum

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from fairvfl_flwr.flower.arrays import record_of, to_array, to_numpy
from fairvfl_flwr.flower.records import array_records

class Kind(enum.Enum):
    """What a message is to a party, declared with its type: every mod asks this, never a name."""

    SETUP = "set-up"  # outside the rounds: discovery, key agreement, alignment, a scoring job's set-up
    START = "start"  # round 0: the party's model afresh (answered only before anything else in a run)
    STEP = "step"  # a round's message whose reply follows a step on θ (a re-send: rebuilt from θ)
    ROUND = "round"  # a round's message whose reply the guard keeps (a re-send: the kept reply)
    FINAL = "final"  # after the last round: the last step applied; no run continues from its state
    QUERY = "query"  # outside the rounds, about the model or the run: save, score, rejoin


#: The kinds of a round's messages: the guard, the state store, transcripts and delays act on these.
IN_ROUNDS = frozenset({Kind.START, Kind.STEP, Kind.ROUND, Kind.FINAL})
_KINDS: dict[str, Kind] = {}
_OUTSIDE_VIEW: set[str] = set()
_LEGS: set[str] = set()


def declare(message_type: str, kind: Kind, *, in_view: bool = True, leg: bool = False) -> str:
    """Declare ``message_type``'s kind (where its handler is declared: its module, imported wherever
    the handler runs, a simulation worker included); returns the type.

    ``in_view``: False for a message that carries no value a round's sum depends on (a set-up, a
    check, digests), which secure aggregation leaves outside the round's view (secure/view.py).
    ``leg``: a later leg of a round its party's first message opened (it carries sums computed for
    that party alone): it continues the round's view, as an encrypted-ν second leg does."""
    held = _KINDS.setdefault(message_type, kind)
    if held is not kind:
        raise ValueError(f"message type {message_type!r} is declared {held.value!r} already")
    if not in_view:
        _OUTSIDE_VIEW.add(message_type)
    if leg:
        _LEGS.add(message_type)
    return message_type


def kind_of(message_type: str) -> Kind | None:
    """The declared kind of ``message_type`` (None: undeclared, which no mod acts on)."""
    return _KINDS.get(message_type)


def in_rounds(message_type: str) -> bool:
    """Whether ``message_type`` is one of a round's messages (start, step, round or final)."""
    return kind_of(message_type) in IN_ROUNDS


def in_view(message_type: str) -> bool:
    """Whether secure aggregation binds ``message_type`` to the round's view (see :func:`declare`)."""
    return message_type not in _OUTSIDE_VIEW


#: Discovery, which every algorithm's server starts with (flower/party.py answers it).
INFO = "query.info"
# FairVFL's rounds (algorithms/fairvfl.py)
INIT = "query.init"
TRAIN_ACTIVE = "train.active"
TRAIN_PASSIVE = "train.passive"
# encrypted ν (features/ckks.py): the ciphertext, then the masked slot sums
TRAIN_PASSIVE_ENC = "train.passive_enc"
TRAIN_PASSIVE_UNMASK = "train.passive_unmask"
SPLIT_INIT = "query.splitinit"  # split learning (algorithms/split.py)
SPLIT_TRAIN = "train.split"
NEWTON_INIT = "query.newtoninit"  # block Newton (algorithms/newton.py)
NEWTON_ACTIVE = "train.newton_active"
NEWTON_PASSIVE = "train.newton_passive"
# after the last round: apply the last step lengths, reply the logits
NEWTON_APPLY = "train.newton_apply"
# after a party dropped out: every party checks it holds its state of a round on its own disk
# (features/rejoin.py answers it; a resumed run's checkpoint sends it too)
REJOIN = "query.rejoin"

PAYLOAD = "payload"  # ArrayRecord the server sends
ROUND = "round"  # ConfigRecord: round number, whether to return test logits
LOGITS = "logits"  # ArrayRecord a party replies with
DIRECTIONS = "directions"  # ArrayRecord of a Newton reply: dir (X_k s_k), a, gram[, test, test-dirs]
STATS = "stats"  # MetricRecord a party replies with
MASKED_SUM = "masked-sum"  # payload key of an encrypted-ν second leg: the party's masked slot sums

ROLE_ACTIVE = "active"
ROLE_PASSIVE = "passive"


def second_leg(message_type: str, payload) -> bool:
    """Whether a training message is the second leg of an encrypted-ν round: it carries the
    party's masked slot sums (``MASKED_SUM``) instead of ν; its first leg held the ciphertext."""
    return kind_of(message_type) in IN_ROUNDS and payload is not None and MASKED_SUM in payload


def continues_view(message_type: str, payload) -> bool:
    """Whether a message continues the view its round's first exchange established (secure/view.py)
    instead of being a part of its own: an encrypted-ν second leg, or a type declared a ``leg``."""
    return second_leg(message_type, payload) or message_type in _LEGS


def array_record(**arrays: np.ndarray) -> ArrayRecord:
    """An ArrayRecord of the named arrays (made contiguous: Flower serialises the buffer as it is)."""
    return record_of({k: to_array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def round_config(server_round: int, evaluate: bool) -> ConfigRecord:
    """The round's ConfigRecord every training message carries: its number and whether the parties also
    return test logits."""
    return ConfigRecord({"round": int(server_round), "evaluate": bool(evaluate)})


def active_content(z: np.ndarray, lam: np.ndarray, server_round: int, evaluate: bool, dtype) -> RecordDict:
    """An active party's training message: z on the wire dtype and λ in float64 (λ sets the constraint
    terms of its Q steps)."""
    return RecordDict(
        {PAYLOAD: array_record(z=z.astype(dtype), lam=lam.astype(np.float64)), ROUND: round_config(server_round, evaluate)}
    )


def passive_content(nu: np.ndarray, server_round: int, evaluate: bool, dtype) -> RecordDict:
    """A passive party's training message: ν only, on the wire dtype."""
    return RecordDict({PAYLOAD: array_record(nu=nu.astype(dtype)), ROUND: round_config(server_round, evaluate)})


def newton_content(server_round: int, evaluate: bool, alpha: np.ndarray, dtype, base: int | None = None,
                   **arrays: np.ndarray) -> RecordDict:
    """A Newton round's message: α_k (float64: a handful of step lengths) and z, λ or ν.
    ``base``: Gauss–Newton blocks only, the round whose directions α_k applies to (0: none)."""
    payload = {k: (v.astype(np.float64) if k == "lam" else v.astype(dtype)) for k, v in arrays.items()}
    if base is not None:
        payload["base"] = np.array([base], dtype=np.int64)
    return RecordDict({PAYLOAD: array_record(alpha=np.asarray(alpha, dtype=np.float64), **payload),
                       ROUND: round_config(server_round, evaluate)})


def directions_reply(arrays: dict[str, np.ndarray], sq_norm: float, steps: int,
                     logits: dict[str, np.ndarray] | None = None) -> RecordDict:
    """A party's Newton reply: its new direction's logits, θ_kᵀD and DᵀD for the server's search
    (D: the direction and its kept moves), ‖θ_k‖² and the steps it took. ``logits``: a
    Gauss–Newton block's partial logits after the round's step (``train``, and ``test`` on
    evaluation rounds), as a logits reply holds them."""
    content = RecordDict({DIRECTIONS: array_record(**arrays),
                          STATS: MetricRecord({"sq-norm": float(sq_norm), "steps": int(steps)})})
    if logits is not None:
        array_records(content)[LOGITS] = array_record(**logits)
    return content


def init_content(evaluate: bool) -> RecordDict:
    """The start message (round 0): parties reply with their initial logits, test logits when ``evaluate``."""
    return RecordDict({ROUND: round_config(0, evaluate)})


def logits_reply(u_train: np.ndarray, u_test: np.ndarray | None, sq_norm: float, steps: int) -> RecordDict:
    """A party's reply to a training or start message: its partial logits (training rows, test rows in
    evaluation rounds), ‖θ_k‖² and the steps it took."""
    arrays = {"train": u_train} if u_test is None else {"train": u_train, "test": u_test}
    return RecordDict(
        {LOGITS: array_record(**arrays), STATS: MetricRecord({"sq-norm": float(sq_norm), "steps": int(steps)})}
    )


def read_array(content: RecordDict, record: str, key: str) -> np.ndarray:
    """The numpy array ``key`` of the ArrayRecord ``record`` in ``content``."""
    return to_numpy(array_records(content)[record][key])


def blob_array(blob: bytes) -> Array:
    """Raw bytes (a key, a tag, a signature) as an Array of uint8, for an ArrayRecord."""
    return to_array(np.frombuffer(blob, dtype=np.uint8).copy())


def array_blob(array: Array) -> bytes:
    """The raw bytes an Array of uint8 carries (the inverse of ``blob_array``)."""
    return to_numpy(array).tobytes()
