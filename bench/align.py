"""Private alignment of own tables: seconds for N ids per party × K parties.

    python bench/align.py [--ids 1000000] [--parties 6] [--overlap 0.9] [--workers 0] [--out docs/results]

Writes K raw tables of made-up customers (each holds ``overlap`` · N common ids and its own
others, shuffled; one number and one category column each, the label owner also the label
and the group) and runs the alignment step of a run (features/alignment.align_tables: both
PSI passes, the split and every party's local preparation) over the in-process grid, with
each party answering on its own thread as over a SuperLink. ``--workers`` caps the processes
a party's PSI work is spread over (0: every core; data/align.py). Prints the alignment's
wall time, the bytes the server relayed, and checks the common rows against the truth;
publishes them as ``<out>/align.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, table, write  # noqa: E402


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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ids", type=int, default=1_000_000, help="ids per party")
    p.add_argument("--parties", type=int, default=6)
    p.add_argument("--overlap", type=float, default=0.9, help="share of each party's ids that every party holds")
    p.add_argument("--workers", type=int, default=0, help="processes per party's PSI step (0: every core)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)
    if a.workers:
        os.environ["FAIRVFL_PSI_WORKERS"] = str(a.workers)
    from fairvfl_flwr.app.client import app as client_app
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.features.alignment import align_tables
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
            "tables.path": str(folder / "party{partition}.csv"), "tables.id-column": "customer"})
        relayed = []

        def tap(message) -> None:
            for record in message.content.config_records.values():
                relayed.extend(len(v) for v in record.values() if isinstance(v, bytes))

        grid = InProcessGrid(client_app, cfg.to_flower(), a.parties, tap=tap, async_replies=True)
        try:
            t0 = time.perf_counter()
            labels = align_tables(grid, cfg)
            seconds = time.perf_counter() - t0
        finally:
            grid.close()
    n = len(labels.y_train) + len(labels.y_test)
    assert n == common, f"aligned {n} rows, {common} are common"
    row = {"parties": a.parties, "ids per party": a.ids, "common": common, "seconds": round(seconds, 1),
           "cores": len(os.sched_getaffinity(0)), "workers": a.workers or "all",
           "MB relayed to the parties": round(sum(relayed) / 1e6, 1)}
    write(a.out, "align", {"rows": [row]}, table([row], list(row)),
          title="Private alignment of own tables (PSI, both passes, split, local preparation)",
          notes=f"Made-up ids, {a.overlap:.0%} common to all parties; the tables' writing ({written:.1f} s) is not "
                "counted; the common rows found equal the truth. In-process grid, each party on its own thread.")


if __name__ == "__main__":
    main()
