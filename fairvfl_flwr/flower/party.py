"""The party runtime: what every ClientApp handler and mod of this app builds on.

A node learns its role and feature block from its node config (``partition-id``, or a
deployed party file) and the run config; its model θ_k lives in ``context.state``
between messages and is never put in a reply. :class:`PartyRuntime` is the one public
way to get at a node's config, data, model and reply; handlers (``algorithms/``) and
mods (``features/``) use it instead of each other's helpers.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.config.algorithms import resolve
from fairvfl_flwr.config.node import NodeConfig
from fairvfl_flwr.config.scoring import ScoringJob
from fairvfl_flwr.core import batching
from fairvfl_flwr.core.constraints import ConstraintSet
from fairvfl_flwr.core.constraints.release import RowWeights
from fairvfl_flwr.core.blocks import as_dtype, build_block
from fairvfl_flwr.core.parties import ActiveParty, Party
from fairvfl_flwr.data.partydata import ROLE_REGISTRY, PartySpec, load_party, own_table_spec, party_spec
from fairvfl_flwr.data.problem import constraint_groups, whole_table
from fairvfl_flwr.flower import checks
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.arrays import record_of, to_array, to_numpy
from fairvfl_flwr.flower.records import array_records, config_records

MODEL_STATE = "fairvfl.model"
#: A passive party's gradient X_kᵀν where ν reached it encrypted: the encryption feature's
#: mod recovers it into the node's state before the training method's handler runs, which
#: takes it with :meth:`PartyRuntime.take_gradient`.
GRADIENT_STATE = "fairvfl.gradient"
#: tables.own: the key of the block this node prepared at alignment (jobs/alignment.py writes it).
ALIGNED_STATE = "fairvfl.aligned"
#: Secure aggregation: the view of the round this party accepted (secure/view.py writes
#: it before the message's handler runs; a transcript keeps its digest).
VIEW_STATE = "fairvfl.secagg-view"
#: tables.own, a scoring job: the ids of the party's score file that every party holds (its own ids).
SCORE_COMMON_STATE = "fairvfl.score-common"
#: A scoring job: the model's training settings its messages carry (jobs/scoring.py's mod keeps
#: them here), which this party's :class:`ScoringJob` adopts.
TRAINED_STATE = "fairvfl.trained-settings"


@dataclass(frozen=True)
class HeldGroups:
    """A registry's sensitive column: each training and test row's group code, the groups' names, and
    the rows' ids (``None`` in a block prepared before registries kept them)."""

    train: np.ndarray
    test: np.ndarray
    names: tuple[str, ...]
    ids_train: np.ndarray | None = None
    ids_test: np.ndarray | None = None


@dataclass(frozen=True)
class PartyData:
    """One party's view of the table: its columns, and y/s only if it is active (s: unless a
    registry holds the groups, which trains as a passive party with ``held``)."""

    partition_id: int
    role: str
    X_train: np.ndarray
    X_test: np.ndarray
    ids_digest: str
    y: np.ndarray | None = None
    constraint: ConstraintSet | None = None
    held: HeldGroups | None = None


def wire_role(role: str) -> str:
    """The role the protocol knows a party by (its ``query.info`` reply, the server's messages, the
    parts of secure aggregation's view): a registry trains as a passive party that holds the groups."""
    return msgs.ROLE_PASSIVE if role == ROLE_REGISTRY else role


@functools.lru_cache(maxsize=16)
def party_data(cfg: RunConfig, spec: PartySpec) -> PartyData:
    """One path for deployment (the party's own file) and simulation (the packaged table,
    built as export would write it). Cached per process: in simulation a worker serves
    many rounds of the same run."""
    ds = load_party(spec, None if spec.data_path else cfg)
    common = dict(
        partition_id=spec.partition_id,
        X_train=as_dtype(ds.X_train, cfg.dtype),
        X_test=as_dtype(ds.X_test, cfg.dtype),
        ids_digest=ds.ids_digest,
    )
    if ds.role == msgs.ROLE_ACTIVE:
        # a registry run's label owner holds no groups: the server sends its rows' weights
        constraint = None if ds.s_train is None else constraint_groups(
            cfg, ds.y_train, ds.s_train, ds.protected_label,
            whole=whole_table(ds.y_train, ds.s_train, ds.y_test, ds.s_test))
        return PartyData(role=msgs.ROLE_ACTIVE, y=ds.y_train.astype(np.float64), constraint=constraint, **common)
    if ds.role == ROLE_REGISTRY:
        held = HeldGroups(ds.s_train, ds.s_test, ds.group_names, ds.ids_train, ds.ids_test)
        return PartyData(role=wire_role(ds.role), held=held, **common)
    return PartyData(role=msgs.ROLE_PASSIVE, **common)


@functools.lru_cache(maxsize=8)
def run_config(items: tuple) -> RunConfig:
    """Parsed once per run and process: every message carries the same run config.
    A bad config raises every time (lru_cache keeps no exceptions)."""
    return RunConfig.from_flower(dict(items))


@functools.lru_cache(maxsize=8)
def _scoring_job(items: tuple, trained: tuple, where: str) -> ScoringJob:
    return ScoringJob.adopting(dict(items), dict(trained), where)


def scoring_job(context: Context) -> ScoringJob | None:
    """This party's scoring job: its own run config with the training settings the job's
    messages carry (kept in ``TRAINED_STATE``), parsed once per run and process; None
    outside a scoring job. A key its own run config sets otherwise is refused, naming it."""
    kept = config_records(context.state).get(TRAINED_STATE)
    if kept is None:
        return None
    where = f"{NodeConfig.of(context).where} (node {context.node_id})"
    return _scoring_job(tuple(sorted(context.run_config.items())), tuple(sorted(kept.items())), where)


def round_of(message: Message) -> tuple[int, bool]:
    """(round number, evaluate?) of a server message."""
    rc = config_records(message.content)[msgs.ROUND]
    return int(rc["round"]), bool(rc["evaluate"])


class PartyRuntime:
    """A node's config, data and model for one message."""

    def __init__(self, context: Context) -> None:
        self.context = context
        #: the run's settings: a scoring job's with its model's training settings adopted
        self.job = scoring_job(context)
        self.cfg = self.job.cfg if self.job is not None else run_config(tuple(sorted(context.run_config.items())))
        #: this node's config (config/node.py: every key typed and checked; an unknown one refused)
        self.node = NodeConfig.of(context)
        self.spec = party_spec(self.node, self.cfg.num_parties, self.cfg.num_active, registry=self.cfg.registry)
        if self.cfg.tables_own:
            kept = config_records(context.state).get(ALIGNED_STATE)
            self.spec = dataclasses.replace(own_table_spec(self.spec, self.cfg), aligned=str(kept["key"]) if kept else "")

    @functools.cached_property
    def data(self) -> PartyData:
        """Loaded when first asked for: a mod that only reads the config needs no table (and
        a scoring job's node holds no aligned training block)."""
        return party_data(self.cfg, self.spec)

    @property
    def who(self) -> str:
        """The party as its log and errors name it: partition, role and node."""
        return f"party {self.spec.partition_id} ({self.spec.role}, node {self.context.node_id})"

    @property
    def n_train(self) -> int:
        """The party's training rows."""
        return int(self.data.X_train.shape[0])

    def constraint(self, message: Message) -> ConstraintSet | RowWeights | None:
        """The constraint an active party's steps take: its own groups', or where it holds none (a
        registry holds them) the rows' weights the server sent with ``message`` (checked: one
        finite value per training row). None for a passive party."""
        if self.data.constraint is not None or self.data.role != msgs.ROLE_ACTIVE:
            return self.data.constraint
        w = checks.check_payload(message.content, self.who, {"weights": (self.n_train, False)})["weights"]
        lam = array_records(message.content)[msgs.PAYLOAD].get("lam")  # its values are checked by the handler
        return RowWeights(w.astype(np.float64), self.cfg.measure, 0 if lam is None else int(to_numpy(lam).size))

    def party(self, constraint: ConstraintSet | RowWeights | None = None, steps: bool = True) -> Party:
        """Rebuild the party from its data and the model state kept on this node (an active party's
        constraint: ``constraint``, default its own groups'). ``steps=False``: the handler takes
        no gradient step with the block, only evaluates it and sets θ (core/blocks.build_block)."""
        cfg, data = self.cfg, self.data
        block = build_block(
            cfg.model,
            data.X_train.shape[1],
            hidden=cfg.hidden,
            bias=data.role == msgs.ROLE_ACTIVE or cfg.model == "mlp",
            dtype=cfg.dtype,
            seed=cfg.seed * 1000 + data.partition_id,
            step_rule=resolve(cfg).algorithm.step_rule,
            state=self.model_state(),
            steps=steps,
        )
        mu = cfg.mu_value(data.X_train.shape[0])
        if data.role == msgs.ROLE_ACTIVE:
            return ActiveParty(block, data.X_train, data.X_test, cfg.lr, mu, y=data.y,
                               constraint=constraint if constraint is not None else data.constraint)
        return Party(block, data.X_train, data.X_test, cfg.lr, mu)

    def save(self, party: Party) -> None:
        """Keep the party's block (θ and its step rule's state: its ``state_dict``) in the node's
        state for its next message."""
        self.load_model_state(party.block.state_dict())

    def reset(self) -> None:
        """Forget the model: the next :meth:`party` starts from the seeded initial θ (and its step
        rule from a fresh state)."""
        array_records(self.context.state).pop(MODEL_STATE, None)

    def load_model_state(self, state: dict) -> None:
        """Keep a block's ``state_dict`` (numpy arrays by name) in the node's state for the next message."""
        self._keep(MODEL_STATE, state)

    def model_state(self) -> dict[str, np.ndarray] | None:
        """The block's ``state_dict`` as kept in the node's state (θ and its step rule's state), or
        None before the first step."""
        return self._kept(MODEL_STATE)

    def _keep(self, name: str, state: dict) -> None:
        array_records(self.context.state)[name] = record_of(
            {k: to_array(np.asarray(v, order="C")) for k, v in state.items()})

    def _kept(self, name: str) -> dict[str, np.ndarray] | None:
        record = array_records(self.context.state).get(name)
        return None if record is None else {k: to_numpy(v) for k, v in record.items()}

    def take_gradient(self) -> np.ndarray | None:
        """X_kᵀν left in the node's state for this message (see ``GRADIENT_STATE``), or None."""
        record = array_records(self.context.state).pop(GRADIENT_STATE, None)
        return None if record is None else to_numpy(record["gradient"])

    def rows(self, message: Message) -> np.ndarray | None:
        """This round's training rows (mini-batch); None: all of them."""
        return batching.round_rows(self.cfg, round_of(message)[0], self.n_train)

    def next_rows(self, message: Message) -> np.ndarray | None:
        """Rows the reply to ``message`` carries training logits on (the next round's batch)."""
        return batching.reply_rows(self.cfg, *round_of(message), self.n_train)

    def reply(self, message: Message, party: Party, steps: int) -> Message:
        """New partial logits in the run's wire dtype, ‖θ_k‖² and the steps taken."""
        evaluate = round_of(message)[1]
        dtype = self.cfg.wire_dtype
        u_train = party.logits("train", self.next_rows(message)).astype(dtype)
        u_test = party.logits("test").astype(dtype) if evaluate else None
        return Message(msgs.logits_reply(u_train, u_test, party.block.sq_norm(), steps), reply_to=message)


def info(message: Message, context: Context) -> Message:
    """Tell the server this node's role and row count (never its data)."""
    rt = PartyRuntime(context)
    record = ConfigRecord(
        {
            "role": rt.data.role,
            "partition-id": rt.data.partition_id,
            "n-train": rt.n_train,
            "n-test": int(rt.data.X_test.shape[0]),
            "n-features": int(rt.data.X_train.shape[1]),
            "ids-digest": rt.data.ids_digest,
        }
    )
    if rt.data.held is not None:  # a registry: the server asks it for the groups' release (jobs/group_release.py)
        record["holds-groups"] = True
    return Message(RecordDict({"info": record}), reply_to=message)




# Records of a node's state that carry a run from one round to the next (θ, a step's own
# state, the aligned block's key, ...): a party that restarts restores them from its own
# disk (features/rejoin.py). Name -> whether a restore merges the record's lists with the
# node's (a record that only grows, such as the sessions a party has joined) or replaces it.
_ROUND_STATE: dict[str, bool] = {}


def mark_round_state(name: str, merge: bool = False) -> None:
    """Register ``name`` (a record of ``context.state``) as part of a party's state between rounds;
    ``merge``: a restore adds its list values to the node's instead of replacing the record."""
    _ROUND_STATE[name] = merge


def round_state() -> dict[str, bool]:
    """Every registered round-state record name, with its merge flag (see :func:`mark_round_state`)."""
    return dict(_ROUND_STATE)


@dataclass(frozen=True)
class Handles:
    """A party's handler of one message type, declared with what the type is (its kind,
    flower/protocol.Kind: what the guard, the state store, transcripts and delays do with it;
    ``in_view``: whether secure aggregation binds it to the round's view, flower/protocol.declare)
    and the records of the node's state it keeps from one round to the next (a party that
    restarts restores them, flower/store.py; ``merges``: kept records that only grow, whose
    restore adds to the node's lists instead of replacing them)."""

    kind: msgs.Kind
    run: Callable[[Message, Context], Message]
    keeps: tuple[str, ...] = ()
    merges: tuple[str, ...] = ()
    in_view: bool = True
    leg: bool = False  # a later leg of a round: it continues the round's view (flower/protocol.declare)


def handlers(declared: Mapping[str, Handles]) -> dict[str, Callable[[Message, Context], Message]]:
    """The handlers of ``declared`` by message type, each type's kind and kept records declared
    (where the handlers' module is imported: a simulation worker that runs them declares them too).
    Every algorithm and job declares its handlers so."""
    for message_type, handles in declared.items():
        msgs.declare(message_type, handles.kind, in_view=handles.in_view, leg=handles.leg)
        for name in handles.keeps:
            mark_round_state(name)
        for name in handles.merges:
            mark_round_state(name, merge=True)
    return {message_type: handles.run for message_type, handles in declared.items()}


#: Discovery (``query.info``), which every algorithm's server starts with: part of the training job
#: (jobs/training.py). It carries the secure-aggregation set-up's first leg, outside any view.
HANDLERS = handlers({msgs.INFO: Handles(msgs.Kind.SETUP, info, in_view=False)})


# Records that describe the last message a party answered (the guard's copy of its reply):
# they belong to that message's round, so a party whose state moves to another round drops
# them (flower/store.py) instead of answering from them.
_ANSWER_RECORDS: list[str] = []


def mark_answer_record(prefix: str) -> None:
    """Register records of ``context.state`` named ``prefix…`` as about the last message answered: a
    restore of another round drops them."""
    _ANSWER_RECORDS.append(prefix)


def answer_records() -> tuple[str, ...]:
    """Every registered prefix of :func:`mark_answer_record`."""
    return tuple(_ANSWER_RECORDS)
