"""A party's state of its last rounds on its own disk: what it restores from.

After every reply that follows a step (and the first logits) a party writes every record
of its node state that carries the run from one round to the next
(declared with the handlers that keep them, ``flower.party.Handles``: θ, a step's own state, Newton's directions and moves,
the aligned block's key, the secure-aggregation sessions it joined, its history's round and
head) to ``round-<r>.npz`` under its state folder, when the run waits for parties that
drop out (every round) or checkpoints (its checkpoint rounds). Where: node config
``state-dir``, else the run config's ``reliability.checkpoint-dir``, else ``state/`` under
the party's data cache (node config ``cache-dir``, ``$FAIRVFL_CACHE_DIR``); per run key
(:func:`run_key`: the settings that determine θ, so a resumed run, a new Flower run, finds
the states of the run it continues) and partition; the last :data:`KEEP` rounds and the
last :data:`KEEP` checkpoint rounds. Nothing of it is ever sent.

A restore (:func:`restore`) puts a round's records back, closes that round in the party's
history (nothing of it is answered again) and drops what described the last message
answered. Under secure aggregation only a key set-up every party signed moves a party
(secure/agreement.py); without it the run's restart message does (features/rejoin.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from fairvfl_flwr.data.partydata import cache_dir, write_atomically
from fairvfl_flwr.flower import history
from fairvfl_flwr.flower.arrays import record_of, to_array, to_numpy
from fairvfl_flwr.flower.party import PartyRuntime, answer_records, round_state
from fairvfl_flwr.flower.records import array_records, config_records

STATE_DIR = "state-dir"  # node config: where this party keeps its state of the last rounds
KEEP = 3  # rounds of state kept per party (the last completed round is among the last two), and checkpoint rounds
# Keys that do not change θ_r: they may differ between a run and its resumption.
OPERATIONAL = frozenset({
    "num-server-rounds", "reliability.round-timeout", "reliability.round-retries", "reliability.checkpoint-every",
    "reliability.checkpoint-dir", "reliability.resume-from", "reliability.rejoin-timeout", "output-dir", "eval-every",
    "privacy.record-view", "privacy.record-every", "privacy.record-first", "privacy.transcript-dir", "server-labels",
    "csv.path",
})


def run_key(run_config: Mapping[str, Any]) -> str:
    """Hash of every θ-relevant run-config key (server and parties compute the same)."""
    items = {k: v for k, v in sorted(run_config.items()) if k not in OPERATIONAL}
    return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()[:16]


class StateStoreError(RuntimeError):
    """A party has no state of the round the run continues from, or a damaged one."""


def state_dir(context: Context, rt: PartyRuntime) -> Path:
    """This party's state folder for this run: node config ``state-dir``, else the run config's
    ``reliability.checkpoint-dir``, else ``state/`` under its data cache; then
    ``run-<run key>/partition-<k>``."""
    root = rt.node.state_dir or rt.cfg.checkpoint_dir
    return run_dir(Path(root).expanduser() if root else cache_dir(rt.spec) / "state", rt.cfg, rt.spec.partition_id)


def run_dir(base: Path, cfg, partition_id: int) -> Path:
    """The folder under ``base`` of partition ``partition_id``'s states of runs with ``cfg``'s run key."""
    return Path(base) / f"run-{run_key(cfg.to_flower())}" / f"partition-{partition_id}"


def save_state(folder: Path, server_round: int, state: RecordDict, checkpoint_every: int = 0) -> Path:
    """Write the registered round-state records of ``state`` as ``round-<r>.npz``; keep the last
    :data:`KEEP` rounds and the last :data:`KEEP` checkpoint rounds (multiples of
    ``checkpoint_every``); a later round's file is of a round this run is about to run again."""
    arrays: dict[str, np.ndarray] = {}
    meta: dict = {"round": server_round, "arrays": {}, "configs": {}}
    for name in round_state():
        if name in array_records(state):
            keys = meta["arrays"][name] = []
            for key, value in array_records(state)[name].items():
                keys.append(key)
                arrays[f"a{len(arrays)}"] = to_numpy(value)
        elif name in config_records(state):
            meta["configs"][name] = dict(config_records(state)[name])
    path = folder / f"round-{server_round:08d}.npz"

    def write(fh) -> None:
        np.savez(fh, meta=np.array(json.dumps(meta)), **arrays)
        fh.flush()
        os.fsync(fh.fileno())

    write_atomically(path, write)
    for old in folder.glob("round-*.npz"):
        if int(old.stem.split("-")[1]) > server_round:
            old.unlink(missing_ok=True)
    rounds = sorted(int(p.stem.split("-")[1]) for p in folder.glob("round-*.npz"))
    pinned = [r for r in rounds if checkpoint_every > 0 and r % checkpoint_every == 0][-KEEP:]
    for r in rounds[:-KEEP]:
        if r not in pinned:
            (folder / f"round-{r:08d}.npz").unlink(missing_ok=True)
    return path


def load_state(folder: Path, server_round: int, who: str) -> dict[str, ArrayRecord | ConfigRecord]:
    """The records a party saved after ``server_round``, or a refusal naming what it has."""
    path = folder / f"round-{server_round:08d}.npz"
    if not path.exists():
        have = sorted(p.stem for p in folder.glob("round-*.npz")) if folder.exists() else []
        raise StateStoreError(f"{who} holds no state of round {server_round} of this run in {folder} (has: "
                              f"{', '.join(have) or 'none'}); it cannot continue the run (was its node config's "
                              f"{STATE_DIR} or cache-dir changed, or its disk replaced?)")
    try:
        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(str(f["meta"]))
            stored = iter(sorted((k for k in f.files if k != "meta"), key=lambda k: int(k[1:])))
            records: dict[str, ArrayRecord | ConfigRecord] = {}
            for name, keys in meta["arrays"].items():
                records[name] = record_of({key: to_array(np.array(f[next(stored)], order="C")) for key in keys})  # 0-d stays 0-d
    except Exception as exc:  # noqa: BLE001  (a damaged file is reported, never half-used)
        raise StateStoreError(f"{who}: its state of round {server_round} in {path} cannot be read: {exc}") from exc
    if int(meta["round"]) != server_round:
        raise StateStoreError(f"{who}: {path} holds round {meta['round']}, not {server_round}")
    records.update({name: ConfigRecord(values) for name, values in meta["configs"].items()})
    return records


def stored_history(records: dict[str, ArrayRecord | ConfigRecord], context: Context) -> history.History:
    """The history a party's stored round ends with (what it signs before a rollback)."""
    state = RecordDict({history.STATE: records[history.STATE]} if history.STATE in records else {})
    return history.History.held(state, context.run_id)


def restore(context: Context, records: dict[str, ArrayRecord | ConfigRecord]) -> None:
    """Put a stored round's records back into the node state: records that only grow are merged
    with the node's, the round is closed in the history, and the copy of the last answered
    message is dropped."""
    merge = round_state()
    for name, record in records.items():
        held = config_records(context.state).get(name) if merge.get(name) else None
        if held is not None:  # a record that only grows: what the disk held, then what the node holds now
            record = ConfigRecord({k: list(dict.fromkeys([*v, *held.get(k, [])])) for k, v in record.items()})
        context.state[name] = record
    if history.STATE in records:
        history.History.held(context.state, context.run_id).closed().save(context.state)
    prefixes = answer_records()
    for name in list(context.state.keys()):
        if name.startswith(prefixes):
            context.state.pop(name, None)
