"""Private alignment of the parties' own tables by ECDH PSI (``openmined-psi``): each party's side.

The label owner (the active party) is the *leader*. Two PSI passes, each party's key
never leaving it (the server relays every message, features/alignment.py):

1. **who is common.** Each other party k is a PSI server over its ids, the leader the
   PSI client over its own: k sends its setup (its ids blinded with its key, in a
   Golomb-compressed set), the leader one request (its ids blinded with its key), k the
   response (the request re-blinded). The leader learns which of its ids party k holds,
   intersects over all k and checks the result (empty, below ``tables.min-common``).
2. **telling the others.** The leader is a PSI server over the common ids only; each
   party k a PSI client over its own ids, and learns which of its ids are common. The
   agreed order is the common ids sorted as text, which every party can compute from its
   own ids.

The leader then decides the split of the common rows from the run seed
(:func:`split_common`) and sends it, with nothing but row positions, to the parties, and
the labels of the common rows to the server. Each party prepares its block on its
aligned rows (data/prepare.py) and keeps it on its disk.

What each role learns: the server, every party's set size and the number of common rows
(and the split and labels by row position, as with a server label file); the leader, its
intersection with each party (star-shaped two-party PSI reveals the pairwise
intersections, a multi-party PSI would not); every other party, which of its own ids are
common and the leader's set size. Blinded ids cannot be inverted without the party's key
(the decisional Diffie-Hellman assumption on P-256).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fairvfl_flwr.data.partydata import (CACHE_VERSION, ROLE_ACTIVE, PartyArrays, PartySpec, cache_dir, known_digest,
                                         label_arrays, rows_digest, save_aligned)
from fairvfl_flwr.data.prepare import id_pattern, prepare_block, read_table
from fairvfl_flwr.data.tables import DataError

#: False-positive rate of the Golomb-compressed sets: a spurious common id once in 10⁹ lookups.
FPR = 1e-9
TRAIN_CODE, TEST_CODE, UNUSED_CODE = 0, 1, 2


def psi_library():
    """openmined-psi's Python module, or an ImportError saying how to install it."""
    try:
        import private_set_intersection.python as psi
    except ImportError as exc:
        raise ImportError("private row alignment needs openmined-psi: pip install 'fairvfl-flwr[privacy]'") from exc
    return psi


# -- the PSI primitives: bytes in, bytes out (the wire) ---------------------------------
#: Ids a table may have before its PSI work is spread over processes: each id costs a P-256
#: scalar multiplication (~0.1 ms of one core) per step, and openmined-psi runs on one core.
CHUNK = 50_000
WORKERS_ENV = "FAIRVFL_PSI_WORKERS"


def _workers(n: int) -> int:
    cores = int(os.environ.get(WORKERS_ENV, 0)) or len(os.sched_getaffinity(0))
    return max(1, min(cores, -(-n // CHUNK)))


def _chunks(items: list, parts: int) -> list[list]:
    step = -(-len(items) // parts)
    return [items[i:i + step] for i in range(0, len(items), step)]


def _spread(fn, *args_per_chunk: list) -> list:
    """``fn`` over the chunks, one process each (the chunks are independent: one key, any order)."""
    if len(args_per_chunk[0]) == 1:
        return [fn(*(a[0] for a in args_per_chunk))]
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(len(args_per_chunk[0]), mp_context=get_context("fork")) as pool:
        return list(pool.map(fn, *args_per_chunk))


def _setup_part(key: bytes, n_client: int, ids: list[str], raw: bool) -> bytes:
    psi = psi_library()
    ds = psi.DataStructure.RAW if raw else psi.DataStructure.GCS
    return psi.server.CreateFromKey(key, True).CreateSetupMessage(FPR, max(int(n_client), 1), ids, ds).SerializeToString()


def _request_part(key: bytes, ids: list[str]) -> bytes:
    return psi_library().client.CreateFromKey(key, True).CreateRequest(ids).SerializeToString()


def _response_part(key: bytes, elements: list[bytes]) -> bytes:
    psi = psi_library()
    request = psi.Request()
    request.reveal_intersection = True
    request.encrypted_elements.extend(elements)
    return psi.server.CreateFromKey(key, True).ProcessRequest(request).SerializeToString()


def _intersection_part(key: bytes, setup: bytes, elements: list[bytes], offset: int) -> list[int]:
    psi = psi_library()
    s, r = psi.ServerSetup(), psi.Response()
    s.ParseFromString(setup)
    r.encrypted_elements.extend(elements)
    return [offset + i for i in psi.client.CreateFromKey(key, True).GetIntersection(s, r)]


def psi_setup(ids: np.ndarray, n_client: int) -> tuple[bytes, bytes]:
    """A PSI server's setup over ``ids`` for a client with ``n_client`` ids: (setup, key).

    One process: a Golomb-compressed set (false-positive rate ``FPR``). Spread over
    processes: the blinded ids themselves, sorted (openmined-psi's raw set; exact, 33 bytes
    an id), since a compressed set cannot be merged from parts."""
    key = psi_library().server.CreateWithNewKey(True).GetPrivateKeyBytes()
    parts = _chunks(ids.tolist(), _workers(len(ids)))
    if len(parts) == 1:
        return _setup_part(key, n_client, parts[0], False), key
    merged = psi_library().ServerSetup()
    merged.ParseFromString(b"".join(_spread(_setup_part, [key] * len(parts), [n_client] * len(parts), parts,
                                            [True] * len(parts))))  # protobuf: concatenated parts merge
    elements = sorted(merged.raw.encrypted_elements)  # the client looks them up by binary search
    del merged.raw.encrypted_elements[:]
    merged.raw.encrypted_elements.extend(elements)
    return merged.SerializeToString(), key


def psi_request(ids: np.ndarray) -> tuple[bytes, bytes]:
    """A PSI client's request over ``ids``: (request, key)."""
    key = psi_library().client.CreateWithNewKey(True).GetPrivateKeyBytes()
    parts = _chunks(ids.tolist(), _workers(len(ids)))
    return b"".join(_spread(_request_part, [key] * len(parts), parts)), key


def psi_response(request: bytes, key: bytes) -> bytes:
    """A PSI server's response to ``request``, with its key (in the request's order)."""
    parsed = psi_library().Request()
    parsed.ParseFromString(request)
    elements = list(parsed.encrypted_elements)
    parts = _chunks(elements, _workers(len(elements)))
    return b"".join(_spread(_response_part, [key] * len(parts), parts))


def psi_intersection(setup: bytes, response: bytes, key: bytes) -> np.ndarray:
    """A PSI client's result: positions, in the ids it requested, of those the server holds."""
    parsed = psi_library().Response()
    parsed.ParseFromString(response)
    elements = list(parsed.encrypted_elements)
    parts = _chunks(elements, _workers(len(elements)))
    offsets = np.cumsum([0] + [len(p) for p in parts[:-1]]).tolist()
    found = _spread(_intersection_part, [key] * len(parts), [setup] * len(parts), parts, offsets)
    return np.sort(np.asarray([i for part in found for i in part], dtype=np.int64))


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


# -- a party's table, read once per process and file version --------------------------------
@functools.lru_cache(maxsize=4)
def _table(path: str, id_column: str, who: str, stamp: tuple) -> tuple[np.ndarray, Any]:
    return read_table(path, id_column, who)


def own_table(spec: PartySpec) -> tuple[np.ndarray, Any]:
    """The party's normalised ids and raw frame (callers must not change the frame)."""
    p = Path(spec.table_path)
    st = os.stat(p) if p.is_file() else None
    stamp = (st.st_size, st.st_mtime_ns) if st else ()
    return _table(spec.table_path, spec.id_column, spec.name, stamp)


def feature_columns(spec: PartySpec, df: Any) -> list[str]:
    """The raw columns the party contributes: node config ``columns``, else all but its id,
    label and sensitive columns."""
    reserved = {spec.id_column}
    if spec.role == ROLE_ACTIVE:
        reserved |= {spec.label_column, spec.sensitive_column}
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


def peer_hits(spec: PartySpec, ids: np.ndarray, peer: int, n_peer: int, pattern: str, setup: bytes,
              response: bytes, client_key: bytes) -> np.ndarray:
    """Pass 1, the leader's result with party ``peer``: a mask over its own ids; an empty
    intersection is refused, showing both sides' id shapes (never an id)."""
    found = psi_intersection(setup, response, client_key)
    if len(found) == 0:
        raise DataError(
            f"party {peer} and the label owner (party {spec.partition_id}) have no id in common "
            f"(empty intersection of {n_peer} and {len(ids)} ids): the label owner's ids look like "
            f"{id_pattern(str(ids[0]))!r}, party {peer}'s like {pattern!r} (9: a digit, a: a letter); ids are "
            "compared as text with surrounding spaces stripped")
    hits = np.zeros(len(ids), dtype=bool)
    hits[found] = True
    return hits


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


def my_common_rows(spec: PartySpec, ids: np.ndarray, setup: bytes, response: bytes, n_common: int,
                   client_key: bytes) -> np.ndarray:
    """Pass 2, another party's part: its rows of the common ids, in the agreed order."""
    found = psi_intersection(setup, response, client_key)
    if len(found) != n_common:
        raise DataError(f"{spec.name}: {len(found)} of its ids are common, the label owner found {n_common}; "
                        "did the table change during alignment?")
    return found[np.argsort(ids[found], kind="stable")]


def leader_step(spec: PartySpec, cfg: Any, rows: np.ndarray) -> Common:
    """The leader on its common ``rows``: decide the split, prepare its block, the labels."""
    ids, df = own_table(spec)
    split = split_common(len(rows), cfg.tables_train_fraction, cfg.seed, cfg.validation_fraction)
    arrays, key, pre = prepare_party(spec, cfg, ids, df, rows, split)
    y, s = label_arrays(df.iloc[rows[split != UNUSED_CODE]], spec, f"{spec.name}: {spec.table_path}")
    save_aligned(spec, key, arrays, pre)
    return Common(split=split, y=y, s=s, protected_label=int(spec.protected_label), digest=arrays.ids_digest,
                  key=key)


def member_step(spec: PartySpec, cfg: Any, setup: bytes, response: bytes, split: np.ndarray,
                client_key: bytes) -> tuple[PartyArrays, str]:
    """A non-leader party: its common rows from pass 2, then its prepared block and its key."""
    ids, df = own_table(spec)
    rows = my_common_rows(spec, ids, setup, response, len(split), client_key)
    arrays, key, pre = prepare_party(spec, cfg, ids, df, rows, split)
    save_aligned(spec, key, arrays, pre)
    return arrays, key


def prepare_party(spec: PartySpec, cfg: Any, ids: np.ndarray, df: Any, rows: np.ndarray,
                  split: np.ndarray) -> tuple[PartyArrays, str, dict]:
    """The party's block on its aligned ``rows`` (agreed order) split by ``split``."""
    train, test = rows[split == TRAIN_CODE], rows[split == TEST_CODE]
    where = f"{spec.name}: {spec.table_path}"
    prepared = prepare_block(df, feature_columns(spec, df), train, test, cfg.tables_types, cfg.tables_missing, where)
    digest = rows_digest(ids[train], ids[test])
    y = s = None
    if spec.role == ROLE_ACTIVE:
        y, s = label_arrays(df.iloc[train], spec, where)
    arrays = PartyArrays(
        partition_id=spec.partition_id, role=spec.role, feature_names=prepared.pre.features,
        X_train=prepared.X_train, X_test=prepared.X_test, ids_digest=digest, n_train=len(train), n_test=len(test),
        y_train=y, s_train=s, protected_label=int(spec.protected_label), source=spec.table_path)
    content = known_digest(Path(spec.table_path), cache_dir(spec))
    key = hashlib.sha256(json.dumps({
        "v": CACHE_VERSION, "file": content, "digest": digest, "spec": [spec.partition_id, spec.role, spec.id_column,
                                                                      list(spec.columns), spec.label_column],
        "prep": [cfg.tables_types, cfg.tables_missing], "pre": prepared.pre.digest(),
    }, sort_keys=True).encode()).hexdigest()[:32]
    return arrays, key, {**prepared.pre.to_dict(), "prepared": list(prepared.record)}
