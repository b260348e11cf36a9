"""Private alignment of own tables: seconds for N ids per party × K parties, against the PSI library's floor.

    python bench/align.py [--ids 1000000] [--parties 6] [--overlap 0.9] [--workers 0] [--out docs/results]
                          [--page align]

Writes K raw tables of made-up customers (each holds ``overlap`` · N common ids and its own
others, shuffled; one number and one category column each, the label owner also the label
and the group) and runs the alignment step of a run (jobs/alignment.align_tables: the
PSI, the split and every party's local preparation) over the in-process grid, with each
party answering on its own thread as over a SuperLink. ``--workers`` caps the processes a
party's PSI work is spread over (0: every core; data/psi.py). Prints the alignment's wall
time and CPU time (this process and the PSI worker processes), the bytes the server
relayed, the time left the server's log said at 25%, 50% and 75% of the alignment's
seconds over the seconds in fact left (bench/progress_check.py; 1 is exact), and checks the
common rows against the truth.

The floor, measured in the same run on one core: the protocol's exponentiations (every
party blinds its N ids once, hash onto P-256 and one multiplication; each of the K-1 pairs
raises both lists, one multiplication an id) times openmined-psi's cost of each, timed on
``--floor-ids`` ids. ``--again`` then runs the alignment step of a second run on the same
tables (a fresh grid, the parties' caches kept): each party takes up its kept alignment
(data/psi.py), and the page adds that second run's seconds. Publishes ``<out>/align.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, table, write  # noqa: E402
from bench.progress_check import Estimates, ratios  # noqa: E402


def write_tables(folder: Path, ids: int, parties: int, overlap: float, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    common = int(ids * overlap)
    shared = np.char.add("cust-", np.arange(common).astype(str))
    for k in range(parties):
        own = np.char.add(f"p{k}-", np.arange(ids - common).astype(str))
        table = pd.DataFrame({"customer": rng.permutation(np.concatenate([shared, own]))})
        table[f"x{k}"] = rng.normal(size=ids)
        table[f"c{k}"] = rng.choice(["a", "b", "c"], size=ids)
        if k == 0:
            table["label"] = rng.choice(["yes", "no"], size=ids)
            table["group"] = rng.choice(["f", "m"], size=ids)
        table.to_csv(folder / f"party{k}.csv", index=False)
    return common


def cpu_seconds() -> float:
    """User + system time of this process and its waited-for children (the PSI workers)."""
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def library_costs(n: int) -> dict:
    """Seconds of one core per id: blinding (hash onto the curve and one multiplication) and
    raising (one multiplication), through data/psi.py's wrappers, in one process."""
    from fairvfl_flwr.data import psi

    return psi.cost_per_id(n)


def x25519_cost(n: int) -> float:
    """Seconds of one core per id for a hash and one X25519 multiplication (``cryptography``,
    OpenSSL): what a faster curve would cost per operation; not used by the alignment."""
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

    key = X25519PrivateKey.generate()
    ids = [f"cust-{i}".encode() for i in range(n)]
    t0 = time.process_time()
    for x in ids:
        key.exchange(X25519PublicKey.from_public_bytes(hashlib.sha256(x).digest()))
    return (time.process_time() - t0) / n


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ids", type=int, default=1_000_000, help="ids per party")
    p.add_argument("--parties", type=int, default=6)
    p.add_argument("--overlap", type=float, default=0.9, help="share of each party's ids that every party holds")
    p.add_argument("--workers", type=int, default=0, help="processes per party's PSI step (0: every core)")
    p.add_argument("--floor-ids", type=int, default=20_000, help="ids timed for the library's cost per id")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--page", default="align", help="name of the results page written in --out")
    p.add_argument("--again", action="store_true", help="also time a second run's alignment on the same tables "
                   "(the kept alignment reused)")
    a = p.parse_args(argv)
    cost = {**library_costs(a.floor_ids), "x25519": x25519_cost(a.floor_ids)}
    os.environ.pop("FAIRVFL_PSI_WORKERS", None)
    if a.workers:
        os.environ["FAIRVFL_PSI_WORKERS"] = str(a.workers)
    from fairvfl_flwr.app.client import app as client_app
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.jobs.alignment import align_tables
    from fairvfl_flwr.flower.inprocess import InProcessGrid

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ["FAIRVFL_CACHE_DIR"] = str(folder / "cache")
        t0 = time.perf_counter()
        common = write_tables(folder, a.ids, a.parties, a.overlap)
        written = time.perf_counter() - t0
        cfg = RunConfig.from_flower({
            "num-parties": a.parties, "dataset": "csv", "csv.path": "-", "csv.label": "label", "csv.positive": "yes",
            "csv.sensitive": "group", "csv.group-a": "f", "csv.group-b": "m", "tables.own": True,
            "tables.path": str(folder / "party{partition}.csv"), "tables.id-column": "customer",
            # every party's step runs on this one machine's cores at once, not on its own machine
            "reliability.round-timeout": 6 * 3600.0})
        relayed = []

        def tap(message) -> None:
            for record in message.content.config_records.values():
                relayed.extend(len(v) for v in record.values() if isinstance(v, bytes))
            for record in message.content.array_records.values():
                relayed.extend(len(v.data) for v in record.values())

        grid = InProcessGrid(client_app, cfg.to_flower(), a.parties, tap=tap, async_replies=True)
        try:
            with Estimates("private alignment") as said:  # the server's time left, held against what happened
                t0, c0 = time.perf_counter(), cpu_seconds()
                labels = align_tables(grid, cfg)
                seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        finally:
            grid.close()
        again = None
        if a.again:  # a second run: a fresh grid (fresh node states), the same tables and caches
            grid = InProcessGrid(client_app, cfg.to_flower(), a.parties, async_replies=True)
            try:
                t0 = time.perf_counter()
                reused = align_tables(grid, cfg)
                again = time.perf_counter() - t0
            finally:
                grid.close()
            assert reused.ids_digest == labels.ids_digest and (reused.y_train == labels.y_train).all()
    n = len(labels.y_train) + len(labels.y_test)
    assert n == common, f"aligned {n} rows, {common} are common"
    cores = len(os.sched_getaffinity(0))
    blinds, raises = a.parties * a.ids, 2 * (a.parties - 1) * a.ids
    floor = blinds * cost["blind"] + raises * cost["raise"]
    row = {"parties": a.parties, "ids per party": a.ids, "common": common, "seconds": round(seconds, 1),
           "CPU seconds": round(cpu, 1), "floor CPU seconds": round(floor, 1), "CPU / floor": round(cpu / floor, 2),
           "µs CPU per id": round(1e6 * cpu / (a.parties * a.ids), 1), "cores": cores, "workers": a.workers or "all",
           "MB relayed": round(sum(relayed) / 1e6, 1), **ratios(said.seen, t0, t0 + seconds),
           **({"second run seconds (kept alignment)": round(again, 2)} if again is not None else {})}
    per_million = (a.parties * cost["blind"] + 2 * (a.parties - 1) * cost["raise"]) * 1e6
    floor_line = (f"library floor: {blinds:,} blindings × {1e6 * cost['blind']:.0f} µs + {raises:,} raisings × "
                  f"{1e6 * cost['raise']:.0f} µs = {floor:.0f} CPU-s (openmined-psi {_psi_version()}, P-256, "
                  f"one core, {a.floor_ids:,} ids timed in this run)")
    print(floor_line)
    notes = (f"{floor_line}. At 1M ids × {a.parties} parties the same floor is {per_million:,.0f} CPU-s: at least "
             f"{per_million / cores:,.0f} s on these {cores} cores with perfect overlap, and {per_million / 60:.0f} "
             f"cores for 60 s. For comparison, not used: a hash and one X25519 multiplication "
             f"({1e6 * cost['x25519']:.0f} µs an id with `cryptography`) would put the same {3 * a.parties - 2} "
             f"operations an id at {(3 * a.parties - 2) * cost['x25519'] * 1e6:,.0f} CPU-s for 1M ids; no PSI "
             "library on PyPI offers that curve, and hashing onto it would be a construction of this project's own. "
             f"Made-up ids, {a.overlap:.0%} common to all parties; the tables' writing ({written:.1f} s) is not "
             "counted; the common rows found equal the truth. In-process grid, each party on its own thread; CPU "
             f"seconds: this process and its PSI worker processes; load average {os.getloadavg()[0]:.1f} at the end.")
    write(a.out, a.page, {"rows": [row], "cost_per_id_s": cost, "floor_per_million_cpu_s": per_million},
          table([row], list(row)),
          title="Private alignment of own tables (PSI, split, local preparation) against the PSI library's floor",
          notes=notes)


def _psi_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openmined_psi")
    except PackageNotFoundError:
        return "?"

if __name__ == "__main__":
    main()
