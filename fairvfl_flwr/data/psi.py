"""Private alignment of the parties' own tables by ECDH PSI (``openmined-psi``): each party's side.

The label owner (the active party) is the *leader*. One Diffie-Hellman PSI between the
leader and each other party k, each party's key never leaving it (the server relays every
message, jobs/alignment.py). With ``H`` the hash onto P-256 and ``a``, ``b_k`` the keys:

1. **blind.** The leader sends ``H(x)^a`` for its ids x, in its row order; party k sends
   ``H(y)^b_k`` for its ids y, in a secret random order it keeps.
2. **raise.** Party k raises the leader's list to its key, ``H(x)^(a·b_k)``, in the
   leader's order; the leader raises party k's list to its own, ``H(y)^(b_k·a)``, in k's
   order. Equal points are equal ids, so the leader learns, for each of its ids, whether k
   holds it and where in k's shuffled list. Two exponentiations an id for each pair, and
   every party's list is blinded once, whatever the number of parties.
3. **common.** The leader intersects over all k and checks the result (empty, below
   ``tables.min-common``), then tells each party k the positions in its shuffled list that
   are common (sorted: the positions say which of k's ids are common, nothing else). The
   agreed order is the common ids sorted as text, which every party computes from its own ids.

The leader then decides the split of the common rows from the run seed
(:func:`split_common`) and sends it, with nothing but row positions, to the parties, and
the labels of the common rows to the server. Each party prepares its block on its
aligned rows (data/own_table.py) and keeps it on its disk.

What each role learns: the server, every party's set size and the number of common rows
(and the split and labels by row position, as with a server label file); the leader, its
intersection with each party (star-shaped two-party PSI reveals the pairwise
intersections, a multi-party PSI would not); every other party, which of its own ids are
common and the leader's set size (it sees the leader's blinded list, never the leader's
raising of its own). Blinded ids cannot be inverted or compared across keys without the
keys (the decisional Diffie-Hellman assumption on P-256).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fairvfl_flwr.data.partydata import (CACHE_VERSION, ROLE_ACTIVE, ROLE_REGISTRY, PartyArrays, PartySpec, cache_dir,
                                         group_values, label_arrays, registry_groups, registry_ids, rows_digest, save_aligned,
                                         reserved_columns, aligned_files, write_atomically)
from fairvfl_flwr.data.own_table import id_pattern, prepare_block, read_table, table_digest
from fairvfl_flwr.data.sources import table_source
from fairvfl_flwr.data.tables import DataError

try:  # POSIX; elsewhere the session check still holds, only two claims at the same instant could race
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

TRAIN_CODE, TEST_CODE, UNUSED_CODE = 0, 1, 2


def psi_library():
    """openmined-psi's Python module, or an ImportError saying how to install it."""
    try:
        import private_set_intersection.python as psi
    except ImportError as exc:
        raise ImportError("private row alignment needs openmined-psi: pip install 'fairvfl-flwr[privacy]'") from exc
    return psi


# -- the PSI primitives: bytes in, bytes out (the wire) ---------------------------------
#: Bytes of one blinded id: a compressed P-256 point.
POINT = 33
#: Ids a table may have before its PSI work is spread over processes: each id costs a P-256
#: scalar multiplication (~0.1 ms of one core) per step, and openmined-psi runs on one core.
CHUNK = 50_000
WORKERS_ENV = "FAIRVFL_PSI_WORKERS"


def cores() -> int:
    """The cores a party spreads its PSI work over: its usable cores, or ``FAIRVFL_PSI_WORKERS``."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # macOS
    return int(os.environ.get(WORKERS_ENV, 0)) or usable


def workers(n: int, of_cores: int | None = None) -> int:
    """The processes a party's PSI work on ``n`` ids runs on, of its ``of_cores`` (default :func:`cores`)."""
    return max(1, min(cores() if of_cores is None else of_cores, -(-n // CHUNK)))


def _parts(n: int) -> tuple[int, int]:
    """(processes, parts) for ``n`` ids: the parts are a multiple of the processes, so that each
    wave of parts keeps every process busy and the party's progress moves a wave at a time."""
    w = workers(n)
    return w, w * -(-n // (w * CHUNK)) if n else 1


def _chunks(items: list, parts: int) -> list[list]:
    step = max(1, -(-len(items) // parts))
    return [items[i:i + step] for i in range(0, len(items), step)] or [items]


def _spread(fn, key: bytes, parts: list, processes: int, done=None) -> list:
    """``fn(key, part)`` for every part, on ``processes`` processes (the parts are independent:
    one key, any order), the results in the parts' order; ``done(i)`` once part ``i`` is."""
    if processes == 1 or len(parts) == 1:
        out = []
        for i, part in enumerate(parts):
            out.append(fn(key, part))
            if done is not None:
                done(i)
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    out = [b""] * len(parts)
    with ProcessPoolExecutor(processes, mp_context=get_context("fork")) as pool:
        futures = {pool.submit(fn, key, part): i for i, part in enumerate(parts)}
        for future in as_completed(futures):
            out[futures[future]] = future.result()
            if done is not None:
                done(futures[future])
    return out


def _blind_part(key: bytes, ids: list[str]) -> bytes:
    return b"".join(psi_library().client.CreateFromKey(key, True).CreateRequest(ids).encrypted_elements)


def _raise_part(key: bytes, blinded: bytes) -> bytes:
    psi = psi_library()
    request = psi.Request()
    request.reveal_intersection = True  # the server keeps the request's order
    request.encrypted_elements.extend(blinded[i:i + POINT] for i in range(0, len(blinded), POINT))
    return b"".join(psi.server.CreateFromKey(key, True).ProcessRequest(request).encrypted_elements)


def psi_key() -> bytes:
    """A fresh secret P-256 key (a party's for one alignment; it never leaves the party)."""
    return psi_library().client.CreateWithNewKey(True).GetPrivateKeyBytes()


def psi_blind(ids: np.ndarray, key: bytes, done=None) -> bytes:
    """``H(id)^key`` for every id, in their order, ``POINT`` bytes each; ``done(k)``: k more ids are."""
    processes, n_parts = _parts(len(ids))
    parts = _chunks(ids.tolist(), n_parts)
    return b"".join(_spread(_blind_part, key, parts, processes, done and (lambda i: done(len(parts[i])))))


def points(blinded: bytes, who: str) -> np.ndarray:
    """Blinded ids as an array of ``POINT``-byte strings; refused when ``blinded`` is not whole points."""
    if len(blinded) % POINT:
        raise DataError(f"{who}: {len(blinded)} bytes of blinded ids are not whole {POINT}-byte points")
    return np.frombuffer(blinded, dtype=f"S{POINT}")


def psi_raise(blinded: bytes, key: bytes, done=None) -> bytes:
    """Another party's blinded ids raised to ``key`` too, in their order (the cipher commutes:
    ``(H(x)^a)^b == (H(x)^b)^a``); ``done(k)``: k more ids are."""
    n = len(points(blinded, "psi_raise"))
    processes, n_parts = _parts(n)
    per = -(-n // n_parts) * POINT
    parts = [blinded[i:i + per] for i in range(0, len(blinded), per)] or [b""]
    return b"".join(_spread(_raise_part, key, parts, processes, done and (lambda i: done(len(parts[i]) // POINT))))


#: What a raise takes for a blinding's time: a raise is one multiplication, a blinding a hash
#: onto the curve and one, and the ids' text goes to the worker processes (bench/align.py's
#: page holds each step's seconds).
RAISE_PER_BLIND = 0.6


def cost_per_id(n: int, clock=time.process_time) -> dict[str, float]:
    """Seconds of one process (by ``clock``) per id to blind (hash onto the curve and one
    multiplication) and to raise (one multiplication), timed on ``n`` made-up ids."""
    ids = [f"cost-{i}" for i in range(n)]
    key, other = psi_key(), psi_key()
    t0 = clock()
    blinded = _blind_part(key, ids)
    blind = (clock() - t0) / n
    t0 = clock()
    _raise_part(other, blinded)
    return {"blind": blind, "raise": (clock() - t0) / n}


def work_units(lanes: list[list[int]], of_cores: int, shared: bool) -> float:
    """A PSI step's work in seconds of one core per id: ``lanes`` are the parties that work at
    once, each the id counts it takes in turn (the label owner raises one party's list after
    another). A list of n ids runs on :func:`workers` processes of ``of_cores``; parties on one
    machine (``shared``) also share its cores, so their work adds up."""
    own = max((sum(n / workers(n, of_cores) for n in lane) for lane in lanes), default=0.0)
    return max(own, sum(map(sum, lanes)) / of_cores) if shared else own


def positions_in(mine: bytes, theirs: bytes) -> np.ndarray:
    """For each of ``mine`` (ids blinded by both keys), its position in ``theirs`` (the same
    keys, the other party's ids), or -1."""
    a, b = points(mine, "the label owner's ids"), points(theirs, "the party's ids")
    if len(b) == 0:
        return np.full(len(a), -1, dtype=np.int64)
    order = np.argsort(b, kind="stable")
    ranked = b[order]
    at = np.minimum(np.searchsorted(ranked, a), len(b) - 1)
    return np.where(ranked[at] == a, order[at], -1)


# -- the split of the common rows ---------------------------------------------------------
def split_common(n: int, train_fraction: float, seed: int, validation_fraction: float = 0.0) -> np.ndarray:
    """Each common row's part (``TRAIN_CODE``, ``TEST_CODE``, ``UNUSED_CODE``), rows in the agreed order.

    The joint-table path's recipe (data/tables.py, data/problem.py): a seeded permutation
    puts round(train_fraction · n) rows in training; with a validation fraction, a share of
    those is evaluated instead of the test rows, which then go unused."""
    n_train = int(round(train_fraction * n))
    if not 0 < n_train < n:
        raise DataError(f"tables.train-fraction={train_fraction} of {n} common rows leaves no rows on one side")
    perm = np.random.default_rng(seed).permutation(n)
    train = np.sort(perm[:n_train])
    codes = np.full(n, TEST_CODE, dtype=np.int8)
    codes[train] = TRAIN_CODE
    if validation_fraction > 0:
        n_val = int(round(validation_fraction * n_train))
        if not 0 < n_val < n_train:
            raise DataError(f"validation-fraction={validation_fraction} of {n_train} training rows leaves no rows "
                            "on one side")
        val = train[np.sort(np.random.default_rng([seed, 0x5EED]).permutation(n_train)[:n_val])]
        codes[codes == TEST_CODE] = UNUSED_CODE
        codes[val] = TEST_CODE
    return codes


# -- a party's table, read once per process and version of the table (own_table.raw_table) ----
def own_table(spec: PartySpec) -> tuple[np.ndarray, Any]:
    """The party's normalised ids and raw frame, from its file or its database (callers must not
    change the frame)."""
    return read_table(table_source(spec), spec.id_column, spec.name, spec.missing_values)


def own_digest(spec: PartySpec) -> str:
    """The digest of the party's table that its kept alignments are keyed by (own_table.table_digest)."""
    return table_digest(table_source(spec), spec.id_column, spec.name, spec.missing_values, cache_dir(spec))


def feature_columns(spec: PartySpec, df: Any, sensitive_as_input: bool = False) -> list[str]:
    """The raw columns the party contributes: node config ``columns``, else all but its id,
    label and (unless ``sensitive_as_input``) sensitive columns."""
    reserved = reserved_columns(df, spec, sensitive_as_input)
    if spec.columns:
        clash = sorted(reserved & set(spec.columns))
        if clash:
            raise DataError(f"{spec.name}: node config columns names {clash}, its id, label or sensitive column; "
                            "those never become features")
        return list(spec.columns)
    return [str(c) for c in df.columns if c not in reserved]


# -- the steps a party takes -----------------------------------------------------------------
def size_step(spec: PartySpec) -> dict:
    """Check the table; say how many ids it holds and what they look like (not the ids)."""
    ids, _ = own_table(spec)
    if len(ids) == 0:
        raise DataError(f"{spec.name}: the table has no rows")
    return {"n": int(len(ids)), "pattern": id_pattern(str(ids[0]))}


@dataclass(frozen=True)
class Common:
    """The leader's result for the training tables: what goes to the parties and to the server."""

    split: np.ndarray  # codes, in the agreed order
    y: np.ndarray  # ±1 of the common rows (agreed order)
    s: np.ndarray  # group of the common rows
    protected_label: int
    digest: str  # rows_digest of the training and evaluation rows
    key: str  # the leader's prepared block
    #: several groups: the names s indexes; two groups: (group-a, group-b), the values s is True and False for
    group_names: tuple[str, ...] | None = None


def blind_step(ids: np.ndarray, shuffle: bool, done=None) -> tuple[bytes, bytes, np.ndarray | None]:
    """The party's ids blinded with a fresh key: (blinded, key, order). With ``shuffle``, in a
    secret random order (``order[j]``: the row of blinded id j), so that the positions the
    leader learns say nothing about the party's row order. ``done(k)``: k more ids are blinded."""
    key = psi_key()
    order = np.random.default_rng(secrets.randbits(128)).permutation(len(ids)) if shuffle else None
    return psi_blind(ids if order is None else ids[order], key, done), key, order


def peer_positions(spec: PartySpec, ids: np.ndarray, peer: int, n_peer: int, pattern: str, blinded: bytes,
                   raised: bytes, key: bytes, done=None) -> np.ndarray:
    """The leader with party ``peer``: for each of its ids, the position in the party's
    ``blinded`` list of the same id (-1: the party lacks it). ``raised`` is the leader's own
    blinded ids raised to the party's key; the leader raises the party's to its own key
    (``done(k)``: k more are) and compares. An empty intersection is refused, showing both
    sides' id shapes (never an id)."""
    theirs = psi_raise(blinded, key, done)
    if len(points(theirs, f"party {peer}")) != n_peer or len(points(raised, f"party {peer}")) != len(ids):
        raise DataError(f"party {peer} sent {len(theirs) // POINT} blinded ids for {n_peer} and raised "
                        f"{len(raised) // POINT} of the label owner's {len(ids)}; refused")
    found = positions_in(raised, theirs)
    if not (found >= 0).any():
        raise DataError(
            f"party {peer} and the label owner (party {spec.partition_id}) have no id in common "
            f"(empty intersection of {n_peer} and {len(ids)} ids): the label owner's ids look like "
            f"{id_pattern(str(ids[0]))!r}, party {peer}'s like {pattern!r} (9: a digit, a: a letter); ids are "
            "compared as text with surrounding spaces stripped")
    return found


def agreed_rows(ids: np.ndarray, hits: np.ndarray, pairwise: dict[int, int], min_common: int) -> np.ndarray:
    """The leader's rows every party holds, in the agreed order (the ids as text); refused
    below ``min_common``, naming the party that shares fewest."""
    rows = np.flatnonzero(hits)
    rows = rows[np.argsort(ids[rows], kind="stable")]
    if len(rows) < min_common:
        smallest = min(pairwise, key=pairwise.get) if pairwise else None
        raise DataError(
            f"{len(rows)} ids are common to all parties, fewer than tables.min-common={min_common}; "
            f"the label owner's ids in common with each party: {pairwise} (party {smallest} shares fewest)")
    return rows


def my_common_rows(spec: PartySpec, ids: np.ndarray, positions: np.ndarray, order: np.ndarray,
                   n_common: int) -> np.ndarray:
    """Another party's part: its rows of the common ids, in the agreed order, from the
    ``positions`` in its shuffled blinded list that the leader found common."""
    positions = np.asarray(positions, dtype=np.int64)
    if len(positions) != n_common or len(np.unique(positions)) != n_common or (
            n_common and not 0 <= positions.min() <= positions.max() < len(order)):
        raise DataError(f"{spec.name}: the label owner named {len(positions)} positions of its {len(order)} "
                        f"blinded ids for {n_common} common rows; did the table change during alignment?")
    rows = order[positions]
    return rows[np.argsort(ids[rows], kind="stable")]


def leader_step(spec: PartySpec, cfg: Any, rows: np.ndarray) -> Common:
    """The leader on its common ``rows``: decide the split, prepare its block, the labels."""
    ids, df = own_table(spec)
    split = split_common(len(rows), cfg.tables_train_fraction, cfg.seed, cfg.validation_fraction)
    arrays, key, pre = prepare_party(spec, cfg, ids, df, rows, split)
    used = df.iloc[rows[split != UNUSED_CODE]]
    y, s = label_arrays(used, spec, f"{spec.name}: {table_source(spec).name}")
    save_aligned(spec, key, arrays, pre)
    several = not (spec.group_a or spec.group_b)  # every value (combination) a group, coded as label_arrays does
    # the groups' values, not the column's name, reach the server: its model card and figures name the
    # groups by them, as a packaged table's run does (the server already holds each row's group)
    names = tuple(sorted(set(group_values(used, spec)))) if several else (str(spec.group_a), str(spec.group_b))
    if s is None:  # a registry holds the groups (jobs/group_release.py): the server gets none from the label owner
        s, names = np.zeros(len(y), dtype=np.int64), None
    return Common(split=split, y=y, s=s, protected_label=int(spec.protected_label), digest=arrays.ids_digest,
                  key=key, group_names=names)


def member_step(spec: PartySpec, cfg: Any, positions: np.ndarray, order: np.ndarray,
                split: np.ndarray) -> tuple[PartyArrays, str]:
    """A non-leader party: its common rows, then its prepared block and its key."""
    ids, df = own_table(spec)
    rows = my_common_rows(spec, ids, positions, order, len(split))
    arrays, key, pre = prepare_party(spec, cfg, ids, df, rows, split)
    save_aligned(spec, key, arrays, pre)
    return arrays, key


def prepare_party(spec: PartySpec, cfg: Any, ids: np.ndarray, df: Any, rows: np.ndarray,
                  split: np.ndarray) -> tuple[PartyArrays, str, dict]:
    """The party's block on its aligned ``rows`` (agreed order) split by ``split``."""
    train, test = rows[split == TRAIN_CODE], rows[split == TEST_CODE]
    source = table_source(spec).name
    where = f"{spec.name}: {source}"
    prepared = prepare_block(df, feature_columns(spec, df, cfg.sensitive_as_input), train, test, cfg.tables_types, cfg.tables_missing, where)
    digest = rows_digest(ids[train], ids[test])
    y = s = None
    names: tuple[str, ...] = ()
    used = split != UNUSED_CODE
    is_train, is_test = split[used] == TRAIN_CODE, split[used] == TEST_CODE
    if spec.role == ROLE_ACTIVE:  # groups coded over all the aligned rows, as the leader sends them to the server
        y, s = label_arrays(df.iloc[rows[used]], spec, where)
        y, y_test = y[is_train], y[is_test]
        s, s_test = (None, None) if s is None else (s[is_train], s[is_test])
    elif spec.role == ROLE_REGISTRY:  # a registry: its groups of the aligned rows, coded over all of them
        s, names = registry_groups(df.iloc[rows[used]], spec, where)
        s, s_test, y_test = s[is_train], s[is_test], None
    else:
        y_test = s_test = None
    arrays = PartyArrays(
        partition_id=spec.partition_id, role=spec.role, feature_names=prepared.pre.features,
        X_train=prepared.X_train, X_test=prepared.X_test, ids_digest=digest, n_train=len(train), n_test=len(test),
        y_train=y, s_train=s, protected_label=int(spec.protected_label), source=source,
        y_test=y_test, s_test=s_test, group_names=names, **registry_ids(spec.role, ids[train], ids[test]))
    content = own_digest(spec)
    key = hashlib.sha256(json.dumps({
        "v": CACHE_VERSION, "file": content, "digest": digest, "spec": [spec.partition_id, spec.role, spec.id_column,
                                                                      list(spec.columns), spec.label_column],
        "prep": [cfg.tables_types, cfg.tables_missing, *spec.missing_values], "pre": prepared.pre.digest(),
        "sensitive-as-input": cfg.sensitive_as_input,
    }, sort_keys=True).encode()).hexdigest()[:32]
    return arrays, key, {**prepared.pre.to_dict(), "prepared": list(prepared.record)}


# -- align once, run many: each party keeps its alignment on its own disk ---------------------
KEPT = "alignments"  # under the party's cache dir
KEPT_VERSION = 3


def _alignment_fields(spec: PartySpec, cfg: Any) -> dict[str, Any]:
    """Everything besides the table that decides a party's alignment and block, by the name its
    owner sets it under (a node-config or run-config key): who it is among how many parties, how
    its table is read and prepared, and the split. A changed one is named in the log."""
    return {
        "node config partition-id": spec.partition_id, "node config role": spec.role, "num-parties": cfg.num_parties,
        "node config id-column": spec.id_column, "node config columns": list(spec.columns),
        "missing-value markers (node config missing-values, tables.missing-values)": list(spec.missing_values),
        "node config label-column": spec.label_column, "node config label-positive": spec.label_positive,
        "node config label-negative": spec.label_negative, "node config sensitive-column": spec.sensitive_column,
        "node config group-a": spec.group_a, "node config group-b": spec.group_b,
        "node config protected-columns": list(spec.protected_columns),
        "node config real-categories": [list(pair) for pair in spec.real_categories],
        "protected-label": spec.protected_label, "tables.types": cfg.tables_types,
        "tables.missing": cfg.tables_missing, "sensitive-as-input": cfg.sensitive_as_input, "seed": cfg.seed,
        "tables.train-fraction": cfg.tables_train_fraction, "validation-fraction": cfg.validation_fraction,
    }


def _alignment_settings(fields: dict[str, Any]) -> str:
    """A digest of a party's alignment settings (:func:`_alignment_fields`)."""
    return hashlib.sha256(json.dumps({"v": KEPT_VERSION, **fields}, sort_keys=True).encode()).hexdigest()[:32]


def _kept_paths(spec: PartySpec, cfg: Any) -> tuple[Path, Path, str, str, dict[str, Any]]:
    """(this table's and settings' record, the party's last-alignment note, table digest, settings
    digest, the settings themselves)."""
    table = own_digest(spec)  # a file's remembered per version of the file, a database table's from its rows
    fields = _alignment_fields(spec, cfg)
    settings = _alignment_settings(fields)
    base = cache_dir(spec) / KEPT
    key = hashlib.sha256(f"{table}|{settings}".encode()).hexdigest()[:32]
    return base / f"{key}.json", base / f"last-{spec.partition_id}-of-{cfg.num_parties}.json", table, settings, fields


def changed_settings(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The names of the alignment settings whose values differ between ``before`` and ``now``."""
    return [name for name in now if before.get(name) != now[name]] + [name for name in before if name not in now]


def keep_alignment(spec: PartySpec, cfg: Any, record: dict, labels: dict[str, np.ndarray] | None = None) -> None:
    """Keep this party's alignment (its digest, its block's key, its size; the label owner also
    the split and labels it sends the server) for the next run on the same table and settings."""
    path, last, table, settings, fields = _kept_paths(spec, cfg)
    try:
        if labels is not None:
            write_atomically(path.with_suffix(".npz"), lambda fh: np.savez(fh, **labels))
        write_atomically(path, lambda fh: fh.write(json.dumps(record, sort_keys=True).encode()))
        write_atomically(last, lambda fh: fh.write(json.dumps({"table": table, "settings": settings, "fields": fields}).encode()))
    except OSError:
        pass  # a read-only cache only costs the next run an alignment


def kept_alignment(spec: PartySpec, cfg: Any) -> tuple[dict | None, str]:
    """This party's kept alignment of its current table and settings, or None and why not
    (words for the log: no id, no value)."""
    path, last, table, _, fields = _kept_paths(spec, cfg)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        try:
            before = json.loads(last.read_text())
        except (OSError, ValueError):
            return None, "no alignment kept on its side"
        if before.get("table") != table:
            return None, "its table changed since its last alignment"
        # the names, not the values: these words reach the server's log, and a value may be a column's name
        if not isinstance(before.get("fields"), dict):  # a note kept by an earlier version holds no settings
            return None, ("the run's table settings (tables.*, seed, split, its node config) changed since its last "
                          "alignment")
        changed = changed_settings(before["fields"], fields)
        if not changed:
            return None, "its kept alignment is gone from its cache"
        return None, f"the run's table settings changed since its last alignment: {', '.join(changed)}"
    if not aligned_files(spec, str(record.get("key", "")))[0].is_file():
        return None, "the block of its kept alignment is gone from its cache"
    if record.get("labels") and not path.with_suffix(".npz").is_file():
        return None, "the labels of its kept alignment are gone from its cache"
    return record, ""


def kept_labels(spec: PartySpec, cfg: Any) -> dict[str, np.ndarray]:
    """The label owner's kept split and labels (what it sends the server after an alignment)."""
    path = _kept_paths(spec, cfg)[0].with_suffix(".npz")
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


# -- alignment sessions a party has taken part in: a replayed one is refused ----------------------
#: Sessions a party remembers (the newest; 132 kB). An older one would be accepted again, but only
#: with signatures from before its last 4,096 alignments, which outlast few federations' keys.
SESSIONS_KEPT = 4096


def _sessions_file(spec: PartySpec) -> Path:
    return cache_dir(spec) / KEPT / f"sessions-{spec.partition_id}.txt"


def _session_entry(session: str) -> str:
    # the server chooses the id: only its digest goes to the party's disk
    return hashlib.sha256(session.encode()).hexdigest()[:32]


def used_session(spec: PartySpec, session: str) -> bool:
    """Whether this party already took part in alignment ``session`` (its own disk)."""
    try:
        return _session_entry(session) in _sessions_file(spec).read_text().split()
    except OSError:
        return False


def claim_session(spec: PartySpec, session: str) -> bool:
    """Record alignment ``session`` as taken part in on this party's disk, next to its kept
    alignments; False if it already was. A party that cannot record it refuses the session:
    unrecorded, it could be replayed in a later run."""
    path = _sessions_file(spec)
    entry = _session_entry(session)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "a") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another message's process may claim at the same time
            try:
                seen = path.read_text().split()
            except FileNotFoundError:
                seen = []
            if entry in seen:
                return False
            seen = [*seen[-(SESSIONS_KEPT - 1):], entry]
            write_atomically(path, lambda fh: fh.write(("\n".join(seen) + "\n").encode()))
    except OSError as err:
        raise DataError(f"{spec.name}: cannot record alignment session {session[:8]}… in {path} ({err}); a party "
                        "remembers the sessions it took part in so that none is replayed, and its cache folder "
                        "(node config cache-dir) must be writable") from err
    return True
