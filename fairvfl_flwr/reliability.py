"""Faults and resuming: retries, reply checks, divergence guard, checkpoints, resume.

Server side, hooked into :class:`~fairvfl_flwr.strategy.FairVFL`:

* :func:`exchange` pushes a round's messages and polls for replies every 10 ms for at
  most ``round-timeout`` seconds; a node that has not answered gets the message again
  (``round-retries`` more times); a node that stays away stops the run with a
  :class:`PartyUnavailable` error naming it (node id, partition, role). Flower's
  "node unavailable" error replies count as "no reply yet". Every reply is checked
  (:func:`validate.check_envelope`) before anything else looks at it.
* :class:`Reliability` starts the run (fresh, or from ``resume-from``), and after every
  round runs the divergence guard and writes the server checkpoint.

Party side, :func:`client_mod` (a Flower mod on ``client.app``): validates every z, λ, ν
a party receives, answers a re-sent message (same type and round) with the reply it
already gave instead of stepping twice, writes the party's θ checkpoint, and on a
resumed ``query.init`` (round r > 0) loads θ_r from the party's own disk.
"""

from __future__ import annotations

import time
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.supercore import log

from . import checkpoint as ckpt
from . import messages as msgs
from . import validate

if TYPE_CHECKING:  # pragma: no cover
    from .strategy import FairVFL

POLL_SECONDS = 0.01
NODE_CHECK_SECONDS = 1.0  # how often a waiting exchange asks the grid which nodes are still online
# Flower's own error replies for a node that is gone or a message that expired: retry.
TRANSIENT_ERROR_CODES = {3, 4, 5}  # MESSAGE_UNAVAILABLE, REPLY_MESSAGE_UNAVAILABLE, NODE_UNAVAILABLE


def _federation_error():
    from .strategy import FederationError

    return FederationError


def unavailable_error():
    """The exception class for a party that stays away (strategy.PartyUnavailable)."""
    from .strategy import PartyUnavailable

    return PartyUnavailable


# -- server: exchange with retries ---------------------------------------------------
def exchange(strategy: "FairVFL", grid, messages: Iterable[Message], timeout: float, retries: int,
             named: bool = True) -> list[Message]:
    """Push, poll every 10 ms; re-send to silent nodes up to ``retries`` times; check replies."""
    messages = list(messages)
    by_node = {m.metadata.dst_node_id: m for m in messages}
    sent: dict[str, Message] = {}  # message id -> message (every attempt)
    outstanding: dict[str, int] = {}  # message id -> node, still waiting
    replies: dict[int, Message] = {}
    waiting = set(by_node)
    for attempt in range(retries + 1):
        if attempt:
            names = ", ".join(strategy._who(n, named) for n in sorted(waiting))
            log(WARNING, "FairVFL: no reply from %s (gone, or silent for round-timeout=%g s); re-sending (try %d of %d)",
                names, timeout, attempt + 1, retries + 1)
        batch = []
        for nid in sorted(waiting):
            m = by_node[nid]
            batch.append(m if attempt == 0 else Message(m.content, dst_node_id=nid, message_type=m.metadata.message_type,
                                                        group_id=m.metadata.group_id))
        gone: set[int] = set()  # nodes that cannot answer in this try: no use waiting for them
        for mid, m in zip(grid.push_messages(batch), batch):
            if mid:
                sent[mid] = m
                outstanding[mid] = m.metadata.dst_node_id
            else:  # the SuperLink refused it: the node has left the federation
                gone.add(m.metadata.dst_node_id)
                log(WARNING, "FairVFL: %s: the SuperLink refused the message (node not registered)",
                    strategy._who(m.metadata.dst_node_id, named))
        deadline = time.monotonic() + timeout
        next_check = time.monotonic() + NODE_CHECK_SECONDS
        while waiting and time.monotonic() < deadline and not waiting <= gone:
            if time.monotonic() >= next_check:  # a SuperNode that stopped is no longer listed online
                online = set(grid.get_node_ids())
                for nid in sorted(waiting - gone - online):
                    gone.add(nid)
                    log(WARNING, "FairVFL: %s is no longer online", strategy._who(nid, named))
                next_check = time.monotonic() + NODE_CHECK_SECONDS
            got = list(grid.pull_messages(list(outstanding)))
            for reply in got:
                mid = reply.metadata.reply_to_message_id
                nid = outstanding.pop(mid, None)
                if nid is None:
                    nid = sent[mid].metadata.dst_node_id if mid in sent else reply.metadata.src_node_id
                who = strategy._who(nid, named)
                if reply.has_error():
                    if reply.error.code in TRANSIENT_ERROR_CODES:  # the node is gone for now: try again
                        if not any(n == nid for n in outstanding.values()):
                            gone.add(nid)
                            log(WARNING, "FairVFL: %s is unavailable: %s", who, reply.error.reason)
                        continue
                    raise _federation_error()(f"{who} failed: {reply.error.reason}")
                if nid in replies:
                    continue  # a late answer to an earlier try: the first one counts
                try:
                    validate.check_envelope(reply, sent, who)
                except validate.ReplyError as exc:
                    raise _federation_error()(f"rejected a reply: {exc}") from None
                replies[nid] = reply
                waiting.discard(nid)
            if waiting and not got:
                time.sleep(POLL_SECONDS)
        if not waiting:
            break
    if waiting:
        names = ", ".join(strategy._who(n, named) for n in sorted(waiting))
        tries = f"{retries + 1} tr{'y' if retries == 0 else 'ies'}"
        if waiting <= gone:
            raise unavailable_error()(
                f"{names} left the federation or is reported unavailable by Flower; no reply after {tries}"
            )
        raise unavailable_error()(f"no reply within {timeout:g} s after {tries} from {names}")
    return [replies[nid] for nid in by_node]


def checked_logits(strategy: "FairVFL", reply: Message, n_train: int | None = None) -> dict[str, np.ndarray]:
    """Validated partial logits of a train/init reply (or a FederationError naming the node).

    ``n_train``: training logits the reply must hold (a mini-batch's b); default all rows.
    """
    nid = reply.metadata.src_node_id
    who = strategy._who(nid, True)
    n_train = len(strategy.labels.y_train) if n_train is None else n_train
    try:
        return validate.check_logits_reply(reply.content, who, n_train,
                                           len(strategy.labels.y_test), width=getattr(strategy, "embedding", 1))
    except validate.ReplyError as exc:
        raise _federation_error()(f"rejected a reply: {exc}") from None


# -- server: start, rounds, checkpoints ------------------------------------------------
class Reliability:
    """The strategy's start/after-round hooks: resume, divergence guard, checkpoints."""

    def __init__(self, folder: Path | None = None, resume: tuple[dict, dict] | None = None,
                 fingerprint: str = "") -> None:
        self.folder = Path(folder) if folder else None
        self.resume = resume
        self.fingerprint = fingerprint
        self.last_checkpoint: int | None = int(resume[0]["round"]) if resume else None

    def begin(self, strategy: "FairVFL", grid, timeout: float) -> int:
        """Initialise (fresh run) or restore (resume); return the first round to run."""
        if self.resume is None:
            strategy.initialise(grid, timeout)
            self.after_round(strategy, 0)
            return 1
        return self._restore(strategy, grid, timeout)

    def after_round(self, strategy: "FairVFL", server_round: int) -> None:
        row = strategy.history[-1]
        with np.errstate(over="ignore", invalid="ignore"):
            z = strategy._z("train")
        validate.check_state(float(row["loss"]), strategy.lam, server_round, z)
        every = strategy.cfg.checkpoint_every
        if self.folder is not None and every > 0 and server_round % every == 0:
            self.save(strategy, server_round)

    def save(self, strategy: "FairVFL", server_round: int) -> None:
        nodes = strategy.nodes
        state = {
            "round": server_round,
            "lambda": [float(v) for v in strategy.lam],
            "history": strategy.history,
            "config": strategy.cfg.to_flower(),
            "fingerprint": self.fingerprint,
            "run-key": ckpt.run_key(strategy.cfg.to_flower()),
            "sq-norms": {str(nodes[n].partition_id): v for n, v in strategy.sq_norms.items()},
            "steps": {str(nodes[n].partition_id): v for n, v in strategy.steps.items()},
            "saved-at": time.time(),
        }
        ckpt.save_server(self.folder, state, {nodes[n].partition_id: u for n, u in strategy.u_train.items()})
        self.last_checkpoint = server_round

    def _restore(self, strategy: "FairVFL", grid, timeout: float) -> int:
        state, u_train = self.resume
        r = int(state["round"])
        log(INFO, "FairVFL: resuming from round %d (%s)", r, self.folder)
        by_pid = {node.partition_id: nid for nid, node in strategy.nodes.items()}
        messages = [
            Message(RecordDict({msgs.ROUND: msgs.round_config(r, False)}), dst_node_id=nid,
                    message_type=msgs.INIT, group_id=f"resume-{r}")
            for nid in strategy.nodes
        ]
        if strategy.ckks is not None:
            from . import secure

            strategy.ckks.ship_context(messages, secure.passive_nodes(strategy.nodes))
        for reply in strategy.exchange(grid, messages, timeout):
            nid = reply.metadata.src_node_id
            pid = strategy.nodes[nid].partition_id
            got = checked_logits(strategy, reply)["train"].astype(np.float64)
            want = u_train.get(pid)
            if want is None or want.shape != got.shape or not np.allclose(got, want, rtol=1e-6, atol=1e-9):
                raise ckpt.CheckpointError(
                    f"{strategy._who(nid, True)}: its restored model of round {r} does not give the partial logits "
                    "the server saved for that round (a checkpoint of another run or data?); refused"
                )
        strategy.lam = np.array(state["lambda"], dtype=np.float64)
        strategy.history = list(state["history"])
        for pid, nid in by_pid.items():
            strategy.u_train[nid] = u_train[pid]
            strategy.sq_norms[nid] = float(state["sq-norms"][str(pid)])
            strategy.steps[nid] = int(state["steps"][str(pid)])
        strategy.u_test.clear()
        from .objective import train_stats

        strategy.stats = train_stats(strategy.labels.y_train, strategy._z("train"), strategy.groups)
        self.last_checkpoint = r
        return r + 1


def load_resume(cfg, labels, folder: str | Path) -> tuple[dict, dict]:
    """Read ``resume-from`` and check it fits this run (same θ-relevant config and labels)."""
    state, u_train = ckpt.load_server(folder)
    old, new = state["config"], cfg.to_flower()
    for key in sorted(set(old) | set(new)):
        if key in ckpt.OPERATIONAL:
            continue
        if old.get(key) != new.get(key):
            raise ckpt.CheckpointError(
                f"resume-from={str(folder)!r}: run config {key}={new.get(key)!r} differs from the checkpoint's "
                f"{old.get(key)!r}; only {', '.join(sorted(ckpt.OPERATIONAL))} may change when resuming"
            )
    if state["fingerprint"] != ckpt.labels_fingerprint(labels):
        raise ckpt.CheckpointError(f"resume-from={str(folder)!r}: the server's labels differ from the checkpointed run's")
    if int(state["round"]) >= cfg.num_server_rounds:
        raise ckpt.CheckpointError(
            f"resume-from={str(folder)!r}: the checkpoint is at round {state['round']}, "
            f"num-server-rounds={cfg.num_server_rounds} leaves nothing to run"
        )
    return state, u_train


def stopped(strategy: "FairVFL", reliability: Reliability | None, recorder, folder: Path, exc: BaseException) -> None:
    """The run is stopping on ``exc``: say why and what is on disk, keep the history."""
    done = strategy.history[-1]["round"] if strategy.history else None
    recorder.write_history() if recorder.rows else None
    last = reliability.last_checkpoint if reliability else None
    where = (f"last checkpoint: round {last} in {folder / ckpt.SERVER_FILE}; continue with resume-from=\"{folder}\""
             if last is not None else "no checkpoint (set checkpoint-every > 0 to be able to resume)")
    log(ERROR, "FairVFL: run stopped after round %s: %s | history so far in %s | %s", done, exc, folder, where)


# -- party side -------------------------------------------------------------------------
LAST = "fairvfl.last-reply"  # ConfigRecord: type, round, record names of the last reply
LAST_PREFIX = "fairvfl.last-reply."


def _types():
    from . import secure

    train = {msgs.TRAIN_ACTIVE, msgs.TRAIN_PASSIVE, secure.TRAIN_PASSIVE_ENC, secure.TRAIN_PASSIVE_UNMASK}
    steps = {msgs.TRAIN_ACTIVE, msgs.TRAIN_PASSIVE, secure.TRAIN_PASSIVE_UNMASK}
    return train, steps


def client_mod(message: Message, context, call_next) -> Message:
    """Party-side checks, duplicate suppression, θ checkpoints and resume (see module doc)."""
    mtype = message.metadata.message_type
    train_types, step_types = _types()
    if mtype != msgs.INIT and mtype not in train_types:
        return call_next(message, context)
    from . import client

    cfg, data = client._setup(context)
    who = f"party {data.partition_id} ({data.role}, node {context.node_id})"
    rc = message.content.config_records.get(msgs.ROUND)
    if rc is None or not isinstance(rc.get("round"), int):
        raise validate.ReplyError(f"{who}: {mtype} message without an integer round number")
    server_round = int(rc["round"])
    if mtype == msgs.INIT:
        reply = call_next(message, context)
        if not reply.has_error() and server_round > 0:  # resume: θ_r from this party's own disk
            folder = ckpt.party_dir(context.node_config, cfg.to_flower(), data.partition_id)
            state = ckpt.load_party(folder, server_round, who)
            from flwr.app import ArrayRecord

            context.state.array_records[client.MODEL_STATE] = ArrayRecord(state)
            reply = _logits_reply(client, message, client._party(cfg, data, context), cfg)
        _forget(context)
        if not reply.has_error() and server_round == 0:
            _checkpoint(cfg, context, data, 0)
        return reply
    last = context.state.config_records.get(LAST)
    if last is not None and last["type"] == mtype and last["round"] == server_round:  # a re-send: answer again
        if mtype in step_types:  # the reply is the logits of the θ it already has: rebuild it, no step
            return _logits_reply(client, message, client._party(cfg, data, context), cfg, steps=int(last["steps"]))
        return Message(RecordDict({name: context.state[LAST_PREFIX + name] for name in last["names"]}), reply_to=message)
    _check_incoming(message, mtype, cfg, data, who)
    reply = call_next(message, context)
    if reply.has_error():
        return reply
    _forget(context)
    # Remember what was answered; keep a copy of the reply only where it cannot be rebuilt
    # (the CKKS leg's masked ciphertexts): logits would double the state sent with every message.
    names = [] if mtype in step_types else list(reply.content.keys())
    for name in names:
        context.state[LAST_PREFIX + name] = reply.content[name]
    steps = reply.content.metric_records[msgs.STATS]["steps"] if msgs.STATS in reply.content.metric_records else 0
    context.state.config_records[LAST] = ConfigRecord(
        {"type": mtype, "round": server_round, "names": names, "steps": int(steps)}
    )
    if mtype in step_types:
        _checkpoint(cfg, context, data, server_round)
    return reply


def _logits_reply(client, message: Message, party, cfg, steps: int = 0) -> Message:
    """The handlers' own reply (in the run's wire dtype where the app has one, on the rows
    the handlers would return: a re-sent mini-batch round gets the next batch's logits)."""
    import inspect

    params = inspect.signature(client._reply).parameters
    if "dtype" in params and hasattr(cfg, "wire_dtype"):
        kwargs = {"rows": client._next_rows(cfg, message, party.n_train)} if "rows" in params else {}
        return client._reply(message, party, steps=steps, dtype=cfg.wire_dtype, **kwargs)
    return client._reply(message, party, steps=steps)


def _forget(context) -> None:
    last = context.state.config_records.pop(LAST, None)
    if last is not None:
        for name in last["names"]:
            context.state.pop(LAST_PREFIX + name, None)


def _checkpoint(cfg, context, data, server_round: int) -> None:
    if cfg.checkpoint_every <= 0 or server_round % cfg.checkpoint_every:
        return
    from . import client

    record = context.state.array_records.get(client.MODEL_STATE)
    if record is not None:
        folder = ckpt.party_dir(context.node_config, cfg.to_flower(), data.partition_id)
        ckpt.save_party(folder, server_round, record.to_torch_state_dict())


def _check_incoming(message: Message, mtype: str, cfg, data, who: str) -> None:
    n = int(data.X_train.shape[0])
    if mtype in (msgs.TRAIN_ACTIVE, msgs.TRAIN_PASSIVE):  # z / ν hold one value per row of the round's batch
        from . import batching

        rows = batching.round_rows(cfg, int(message.content.config_records[msgs.ROUND]["round"]), n)
        n = n if rows is None else len(rows)
    if mtype == msgs.TRAIN_ACTIVE:
        if data.role != msgs.ROLE_ACTIVE:
            raise validate.ReplyError(f"{who}: got {mtype}, but this party is {data.role}")
        validate.check_payload(message.content, who, {"z": (n, False), "lam": (data.groups.num_multipliers, True)})
    elif mtype == msgs.TRAIN_PASSIVE:
        if data.role != msgs.ROLE_PASSIVE:
            raise validate.ReplyError(f"{who}: got {mtype}, but this party is {data.role}")
        validate.check_payload(message.content, who, {"nu": (n, False)})
