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

Saving the model adds ``query.save`` (the reply holds digests, never θ_k) and the scoring
job (``mode = "score"``) ``query.scoreinfo`` / ``query.score`` (partial logits of a chunk of
rows to score, with their ids; no labels or groups anywhere); docs/scoring.md. After a party
dropped out and came back, ``query.rejoin`` (a round config) has every party restore its state
of that round from its own disk and reply as to ``query.info`` (features/rejoin.py).

Features and the split-learning baseline add their own types (encrypted ν:
``train.passive_enc`` / ``train.passive_unmask``, features/ckks.py; split learning:
``query.splitinit`` / ``train.split``, algorithms/split.py). The app's names live here, so
the wire contract is one table and no feature imports another to learn a name; which job
answers each type, and so the list of every type a party answers, is the job registry's
(flower/jobs.py), where a new job declares its own.

A passive party's ``train.passive`` message holds the array ``nu`` and the config
``round``/``evaluate`` and nothing else: no labels, groups, summed logits or λ. The
tests inspect real messages to hold this line.

Where a registry holds the groups (run config ``groups.holder = "registry"``), the server
first asks it for their release (``query.groups_release``: ε_S asked; the reply holds each
training and test row's randomized group), and the label owner, which holds no groups,
finds ``weights`` (its rows' signed weights w = 1/n + m) beside z and λ in its training
messages (features/registry.py).
"""

from __future__ import annotations

import enum

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

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


def declare(message_type: str, kind: Kind) -> str:
    """Declare ``message_type``'s kind (where the type is named: its module, imported wherever its
    handler runs, a simulation worker included); returns the type, for a module constant."""
    held = _KINDS.setdefault(message_type, kind)
    if held is not kind:
        raise ValueError(f"message type {message_type!r} is declared {held.value!r} already")
    return message_type


def kind_of(message_type: str) -> Kind | None:
    """The declared kind of ``message_type`` (None: undeclared, which no mod acts on)."""
    return _KINDS.get(message_type)


def in_rounds(message_type: str) -> bool:
    """Whether ``message_type`` is one of a round's messages (start, step, round or final)."""
    return kind_of(message_type) in IN_ROUNDS


INFO = declare("query.info", Kind.SETUP)
# FairVFL's rounds: their kinds are declared with their handlers (algorithms/fairvfl.py), as every
# algorithm's are (flower/party.Handles)
INIT = "query.init"
TRAIN_ACTIVE = "train.active"
TRAIN_PASSIVE = "train.passive"
TRAIN_PASSIVE_ENC = declare("train.passive_enc", Kind.ROUND)  # encrypted ν, first leg
TRAIN_PASSIVE_UNMASK = declare("train.passive_unmask", Kind.STEP)  # encrypted ν, second leg
SECAGG_KEYS = declare("query.sakeys", Kind.SETUP)  # secure aggregation set-up: each party's X25519 public key
SECAGG_PEERS = declare("query.sapeers", Kind.SETUP)  # secure aggregation set-up: every party's public key to all
SPLIT_INIT = "query.splitinit"  # split learning (algorithms/split.py)
SPLIT_TRAIN = "train.split"
NEWTON_INIT = "query.newtoninit"  # block Newton (algorithms/newton.py)
NEWTON_ACTIVE = "train.newton_active"
NEWTON_PASSIVE = "train.newton_passive"
# after the last round: apply the last step lengths, reply the logits
NEWTON_APPLY = "train.newton_apply"
# after the last round: each party saves its block on its own disk, replies its digest
SAVE = declare("query.save", Kind.QUERY)
# scoring job: which block and how many rows to score (digests only)
SCORE_INFO = declare("query.scoreinfo", Kind.SETUP)
SCORE = declare("query.score", Kind.QUERY)  # scoring job: partial logits of a chunk of rows, with their ids
# tables.own: private alignment, one message type a step (blinded ids, counts; jobs/alignment.py)
ALIGN_SIZE = declare("query.align_size", Kind.SETUP)  # every party: its number of ids and their shape
ALIGN_BLIND = declare("query.align_blind", Kind.SETUP)  # every party: its ids blinded with its own key
ALIGN_RAISE = declare("query.align_raise", Kind.SETUP)  # every other party: the leader's blinded ids raised to its key
# the leader, as few times as a byte budget allows: which of its ids each party holds; the last also the
# common rows (training: their split and labels)
ALIGN_INTERSECT = declare("query.align_intersect", Kind.SETUP)
ALIGN_FINISH = declare("query.align_finish", Kind.SETUP)  # every other party: its common rows
# instead of the PSI, every party: take up the alignment it kept of these tables
ALIGN_REUSE = declare("query.align_reuse", Kind.SETUP)
# after a party dropped out: every party checks it holds its state of a round on its own disk
REJOIN = declare("query.rejoin", Kind.QUERY)
# groups.holder = "registry": the registry releases every row's group, noisy, once per run (jobs/group_release.py)
GROUPS_RELEASE = declare("query.groups_release", Kind.SETUP)
ALIGN_STEPS = (ALIGN_SIZE, ALIGN_BLIND, ALIGN_RAISE, ALIGN_INTERSECT, ALIGN_FINISH, ALIGN_REUSE)

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


def array_record(**arrays: np.ndarray) -> ArrayRecord:
    """An ArrayRecord of the named arrays (made contiguous: Flower serialises the buffer as it is)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


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
        content.array_records[LOGITS] = array_record(**logits)
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
    return content.array_records[record][key].numpy()


def blob_array(blob: bytes) -> Array:
    """Raw bytes (a key, a tag, a signature) as an Array of uint8, for an ArrayRecord."""
    return Array(np.frombuffer(blob, dtype=np.uint8).copy())


def array_blob(array: Array) -> bytes:
    """The raw bytes an Array of uint8 carries (the inverse of ``blob_array``)."""
    return array.numpy().tobytes()
