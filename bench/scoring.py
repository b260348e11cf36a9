"""Scoring 1M rows with 6 parties: wall time and peak memory of the scoring job.

    python bench/scoring.py [--rows 1000000] [--chunk-rows 100000] [--out bench/results]

1. Trains FairVFL on Adult (6 parties, linear, ``--train-rounds`` rounds, in-process grid);
   every party saves its block.
2. Writes one raw score file per party: ``--rows`` rows drawn (seeded, with replacement) from
   the packaged Adult table, ids 0..rows-1, that party's raw columns only, each file in its
   own row order (rows are matched by id). Not timed.
3. In a fresh process, the scoring job over the in-process grid (the real ServerApp and
   ClientApp, every party with node config ``score-path``), twice: cold (each party parses
   its CSV, preprocesses, sorts by id) and warm (each party loads its parsed rows from its
   disk cache, as a fresh deployed ClientApp process does for every chunk after the first).
   Peak RSS is the whole process's (server and all 6 parties together).
4. In a fresh process, one party alone (the largest block): parse and preprocess its file,
   then the partial logits of every chunk: what one organisation's machine needs.

The numbers go to ``<out>/scoring.json`` and ``.md``; docs/scoring.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, peak_rss_mib, table, write  # noqa: E402

K = 6


def prepare(work: Path, rows: int, train_rounds: int) -> dict:
    import numpy as np
    import pandas as pd

    from fairvfl_flwr.app.run import run_inprocess
    from fairvfl_flwr.data import blocks
    from fairvfl_flwr.data.tables import DATASETS, packaged_file

    _, folder = run_inprocess({"dataset": "adult", "num-server-rounds": train_rounds, "eval-every": train_rounds,
                               "output-dir": str(work / "train")}, quiet=True)
    raw = pd.read_csv(packaged_file(DATASETS["adult"].path.name))
    pick = np.random.default_rng(0).integers(0, len(raw), rows)
    table_ = raw.iloc[pick].reset_index(drop=True)
    table_["row_id"] = np.arange(rows)
    files = []
    for k in range(K):
        meta = json.loads((folder / blocks.PARTIES / f"partition-{k}" / blocks.BLOCK_META).read_text())
        cols = ["row_id", *dict.fromkeys(meta["preprocessing"]["raw"])]
        path = work / f"score{k}.csv"
        table_[cols].iloc[np.random.default_rng(k + 1).permutation(rows)].to_csv(path, index=False)
        files.append({"path": str(path), "columns": len(cols) - 1, "mib": path.stat().st_size / 2**20})
    return {"model": str(folder), "files": files}


def score_job(work: Path, model: str, files: list[str], chunk: int) -> dict:
    """Child process: the scoring job twice over the in-process grid."""
    import os

    from fairvfl_flwr.app.client import app as client_app
    from fairvfl_flwr.app.server import run_server
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.data import preprocess
    from fairvfl_flwr.flower.inprocess import InProcessGrid

    os.environ["FAIRVFL_CACHE_DIR"] = str(work / "cache")
    base = peak_rss_mib()
    out = {}
    for run in ("cold", "warm"):
        preprocess.clear_cache()  # as a fresh process per run would
        cfg = RunConfig.from_flower({"dataset": "adult", "mode": "score", "score.model-from": model,
                                     "score.chunk-rows": chunk, "output-dir": str(work / f"score-{run}")})
        nodes = [{"partition-id": k, "num-partitions": K, "score-path": f} for k, f in enumerate(files)]
        grid = InProcessGrid(client_app, cfg.to_flower(), K, node_configs=nodes)
        t0 = time.perf_counter()
        summary, folder = run_server(grid, cfg.to_flower())
        out[run] = {"seconds": time.perf_counter() - t0, "rows": summary["rows"], "chunks": summary["chunks"],
                    "peak_rss_mib": peak_rss_mib(), "predictions_mib": (folder / "predictions.csv").stat().st_size / 2**20}
    out["base_rss_mib"] = base
    return out


def one_party(path: str, model: str, k: int, chunk: int) -> dict:
    """Child process: one party's share (parse + preprocess its file, logits chunk by chunk)."""
    import numpy as np
    import torch

    from fairvfl_flwr.core.models import build_model
    from fairvfl_flwr.data import blocks
    from fairvfl_flwr.data.preprocess import Preprocessing, read_columns, rows_from_frame

    torch.set_num_threads(1)
    base = peak_rss_mib()
    arrays, meta = blocks.load_block(Path(model) / blocks.PARTIES / f"partition-{k}", f"party {k}")
    t0 = time.perf_counter()
    pre = Preprocessing.from_dict(meta["preprocessing"])
    rows = rows_from_frame(read_columns(path, ["row_id", *pre.raw_columns], path), "row_id", pre, path)
    t_parse = time.perf_counter() - t0
    m = build_model("linear", int(meta["n-features"]), bias="bias" in arrays)
    m.load_state_dict({n: torch.from_numpy(v) for n, v in arrays.items()})
    t0 = time.perf_counter()
    with torch.no_grad():
        for s in range(0, len(rows.ids), chunk):
            m(torch.from_numpy(rows.X[s:s + chunk])).numpy().astype(np.float32)
    return {"partition": k, "features": int(meta["n-features"]), "parse_seconds": t_parse,
            "logits_seconds": time.perf_counter() - t0, "peak_rss_mib": peak_rss_mib(), "base_rss_mib": base}


def _child(*args: str) -> dict:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--chunk-rows", type=int, default=100_000)
    ap.add_argument("--train-rounds", type=int, default=20)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--child", choices=["score", "party"], help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--files", help=argparse.SUPPRESS)
    ap.add_argument("--k", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child == "score":
        print(json.dumps(score_job(Path(a.work), a.model, a.files.split(","), a.chunk_rows)))
        return {}
    if a.child == "party":
        print(json.dumps(one_party(a.files, a.model, a.k, a.chunk_rows)))
        return {}
    with tempfile.TemporaryDirectory(prefix="fairvfl-bench-scoring-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        prep = prepare(work, a.rows, a.train_rounds)
        prep_s = time.perf_counter() - t0
        paths = [f["path"] for f in prep["files"]]
        job = _child("--child", "score", "--work", str(work), "--model", prep["model"], "--files", ",".join(paths),
                     "--chunk-rows", str(a.chunk_rows))
        big = max(range(K), key=lambda k: prep["files"][k]["columns"])
        party = _child("--child", "party", "--model", prep["model"], "--files", paths[big], "--k", str(big),
                       "--chunk-rows", str(a.chunk_rows))
    rows = [{"what": f"scoring job, in-process grid ({run})", "rows": job[run]["rows"], "chunks": job[run]["chunks"],
             "seconds": job[run]["seconds"], "peak_rss_mib": job[run]["peak_rss_mib"]} for run in ("cold", "warm")]
    rows.append({"what": f"one party alone (partition {big}, {party['features']} features): parse + preprocess",
                 "rows": a.rows, "seconds": party["parse_seconds"], "peak_rss_mib": party["peak_rss_mib"]})
    rows.append({"what": "one party alone: partial logits of every chunk", "rows": a.rows,
                 "chunks": -(-a.rows // a.chunk_rows), "seconds": party["logits_seconds"]})
    md = (f"Scoring {a.rows:,} rows, {K} parties (Adult columns, linear blocks), chunks of {a.chunk_rows:,} rows\n\n"
          + table(rows, ["what", "rows", "chunks", "seconds", "peak_rss_mib"])
          + f"\n\nscore files: {sum(f['mib'] for f in prep['files']):.0f} MiB in all; process base RSS "
            f"{job['base_rss_mib']:.0f} MiB (job), {party['base_rss_mib']:.0f} MiB (party); "
            f"predictions.csv {job['cold']['predictions_mib']:.0f} MiB; preparing (training + files) took {prep_s:.0f} s")
    payload = {"rows": a.rows, "parties": K, "chunk_rows": a.chunk_rows, "job": job, "party": party,
               "files": prep["files"]}
    write(Path(a.out), "scoring", payload, md)
    return payload


if __name__ == "__main__":
    main()
