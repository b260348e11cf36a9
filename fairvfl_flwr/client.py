"""The ClientApp: one party of the federation.

A node learns its role and feature block from its node config (``partition-id``) and
the run config; its model θ_k lives in ``context.state`` between messages and is never
put in a reply. Replies carry partial logits and two scalars (‖θ_k‖² for the
objective's regulariser, and the number of local steps taken).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from . import messages as msgs
from . import batching, reliability, straggler, view
from .config import RunConfig
from .models import DTYPES, build_model, squared_norm
from .objective import Groups
from .parties import ActiveParty, Party
from .partydata import NodeConfigError, PartySpec, load_party, party_spec
from .problem import constraint_groups

MODEL_STATE = "fairvfl.model"

# A party's work is a few mat-vecs per round; torch's thread pool only adds spin-wait
# contention when several parties (Ray actors, or a sweep beside a run) share the cores.
# Measured on 2 cores: Adult, 6 parties, ~25 ms/round with 1 thread vs ~90+ ms with 2.
torch.set_num_threads(1)


@dataclass(frozen=True)
class PartyData:
    """One party's view of the table: its columns, and y/s only if it is active."""

    partition_id: int
    role: str
    X_train: torch.Tensor
    X_test: torch.Tensor
    ids_digest: str
    y: np.ndarray | None = None
    groups: Groups | None = None


@functools.lru_cache(maxsize=16)
def _party_data(cfg: RunConfig, spec: PartySpec) -> PartyData:
    # One path for deployment (the party's own file, from --node-config) and simulation
    # (partition-id: the packaged table, built as export would write it); see partydata.
    # Cached per process: in simulation a worker serves many rounds of the same run.
    ds = load_party(spec, None if spec.data_path else cfg)
    partition_id = spec.partition_id
    dtype = DTYPES[cfg.dtype]
    common = dict(
        partition_id=partition_id,
        X_train=torch.from_numpy(ds.X_train).to(dtype),
        X_test=torch.from_numpy(ds.X_test).to(dtype),
        ids_digest=ds.ids_digest,
    )
    if ds.role == msgs.ROLE_ACTIVE:
        groups = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label)
        return PartyData(role=msgs.ROLE_ACTIVE, y=ds.y_train.astype(np.float64), groups=groups, **common)
    return PartyData(role=msgs.ROLE_PASSIVE, **common)


@functools.lru_cache(maxsize=8)
def _config(items: tuple) -> RunConfig:
    # Parsed once per run and process: every message carries the same run config, and
    # parsing + validating ~70 keys twice per message (mod and handler) was ~0.4 ms each.
    # A bad config raises every time (lru_cache keeps no exceptions).
    return RunConfig.from_flower(dict(items))


def _setup(context: Context) -> tuple[RunConfig, PartyData]:
    cfg = _config(tuple(sorted(context.run_config.items())))
    return cfg, _party_data(cfg, party_spec(context.node_config, cfg.num_parties, cfg.num_active))


def _party(cfg: RunConfig, data: PartyData, context: Context) -> Party:
    """Rebuild the party from its data and the model state kept on this node."""
    model = build_model(
        cfg.model,
        data.X_train.shape[1],
        hidden=cfg.hidden,
        bias=data.role == msgs.ROLE_ACTIVE or cfg.model == "mlp",
        dtype=cfg.dtype,
        seed=cfg.seed * 1000 + data.partition_id,
    )
    state = context.state.array_records.get(MODEL_STATE)
    if state is not None:
        model.load_state_dict(state.to_torch_state_dict())
    mu = cfg.mu_value(data.X_train.shape[0])
    if data.role == msgs.ROLE_ACTIVE:
        return ActiveParty(model, data.X_train, data.X_test, cfg.lr, mu, y=data.y, groups=data.groups)
    return Party(model, data.X_train, data.X_test, cfg.lr, mu)


def _save(party: Party, context: Context) -> None:
    context.state.array_records[MODEL_STATE] = ArrayRecord(party.model.state_dict())


def _reply(
    message: Message, party: Party, steps: int, dtype: str | None = None, rows: np.ndarray | None = None
) -> Message:
    """New partial logits (in the run's wire-dtype when given), ‖θ_k‖² and the steps taken.

    ``rows``: training rows to return logits on (the next round's mini-batch,
    :func:`_next_rows`); None returns all of them.
    """
    evaluate = bool(message.content.config_records[msgs.ROUND]["evaluate"])
    u_test = party.logits("test") if evaluate else None
    u_train = party.logits("train", rows)
    if dtype is not None:
        u_train = u_train.astype(dtype)
        u_test = None if u_test is None else u_test.astype(dtype)
    content = msgs.logits_reply(u_train, u_test, squared_norm(party.model), steps)
    return Message(content, reply_to=message)


def _round(message: Message) -> tuple[int, bool]:
    rc = message.content.config_records[msgs.ROUND]
    return int(rc["round"]), bool(rc["evaluate"])


def _batch(cfg: RunConfig, message: Message, n: int) -> np.ndarray | None:
    """This round's training rows of ``n`` (batch-size, batching.py); None: all of them."""
    return batching.round_rows(cfg, _round(message)[0], n)


def _next_rows(cfg: RunConfig, message: Message, n: int) -> np.ndarray | None:
    """Rows the reply to ``message`` carries training logits on (batching.reply_rows)."""
    return batching.reply_rows(cfg, *_round(message), n)


app = ClientApp(mods=[reliability.client_mod, straggler.delay_mod])  # checks what arrives, θ checkpoints, resume
# (reliability.py); simulated stragglers hold their train replies back (straggler.py)


@app.query("info")
def info(message: Message, context: Context) -> Message:
    """Tell the server this node's role and row count (never its data)."""
    _, data = _setup(context)
    record = ConfigRecord(
        {
            "role": data.role,
            "partition-id": data.partition_id,
            "n-train": int(data.X_train.shape[0]),
            "n-test": int(data.X_test.shape[0]),
            "n-features": int(data.X_train.shape[1]),
            "ids-digest": data.ids_digest,
        }
    )
    return Message(RecordDict({"info": record}), reply_to=message)


@app.query("init")
def init(message: Message, context: Context) -> Message:
    """Start (or restart) this party's model and return its first partial logits."""
    cfg, data = _setup(context)
    context.state.array_records.pop(MODEL_STATE, None)
    if secure.CONTEXT_RECORD in message.content.array_records:  # secure-nu=ckks: public CKKS context, kept for the run
        context.state.array_records[secure.CONTEXT_RECORD] = message.content.array_records[secure.CONTEXT_RECORD]
    party = _party(cfg, data, context)
    _save(party, context)
    return _reply(message, party, steps=0, dtype=cfg.wire_dtype)


@app.train("active")
def train_active(message: Message, context: Context) -> Message:
    """Q local steps on z̃ (own logits fresh, the others' stale), SPEC.md step 5."""
    cfg, data = _setup(context)
    if data.role != msgs.ROLE_ACTIVE:
        raise NodeConfigError(f"partition {data.partition_id} is passive but got a train.active message")
    party = _party(cfg, data, context)
    z = msgs.read_array(message.content, msgs.PAYLOAD, "z").astype(np.float64)
    lam = msgs.read_array(message.content, msgs.PAYLOAD, "lam").astype(np.float64)
    steps = party.local_steps(z, lam, cfg.local_steps, cfg.local_time_budget,  # 1..Q steps; local-time-budget
                              rows=_batch(cfg, message, party.n_train))
    _save(party, context)
    return _reply(message, party, steps, dtype=cfg.wire_dtype, rows=_next_rows(cfg, message, party.n_train))


@app.train("passive")
def train_passive(message: Message, context: Context) -> Message:
    """One step from the masked weights ν, SPEC.md step 4."""
    cfg, data = _setup(context)
    party = _party(cfg, data, context)
    nu = msgs.read_array(message.content, msgs.PAYLOAD, "nu").astype(np.float64)
    if cfg.record_view:
        server_round = int(message.content.config_records[msgs.ROUND]["round"])
        view.record(cfg.record_view, data.partition_id, server_round, cfg.record_every, nu)
    party.step(nu, rows=_batch(cfg, message, party.n_train))
    _save(party, context)
    return _reply(message, party, steps=1, dtype=cfg.wire_dtype, rows=_next_rows(cfg, message, party.n_train))


from . import splitlearning  # noqa: E402,F401  (registers the split-learning baseline's handlers on `app`)
from . import secure, secure_client  # noqa: E402,F401  (secure-nu=ckks: train.passive_enc / train.passive_unmask)
