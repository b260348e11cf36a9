"""Scoring 1M rows with 6 parties: wall time and peak memory of the scoring job, over the
in-process grid and through ``flwr run``'s simulation engine.

    python bench/scoring.py [--table synthetic|adult] [--rows 1000000] [--chunk-rows 100000]
                            [--engines inprocess,flwr] [--out docs/results]

1. Trains FairVFL (6 parties, linear, ``--train-rounds`` rounds, in-process grid); every party
   saves its block. ``--table synthetic``: a 20,000-row table of data/synthetic.py (32 numeric
   columns) given as ``dataset = "csv"``; ``--table adult``: the packaged Adult table.
2. Writes one raw score file per party: ``--rows`` new rows (synthetic: drawn column by column
   with another seed; adult: drawn, seeded and with replacement, from the packaged table),
   ids 0..rows-1, that party's raw columns only, each file in its own row order (rows are
   matched by id). Not timed.
3. In a fresh process, the scoring job over the in-process grid (the real ServerApp and
   ClientApp, run config ``score.path`` naming each party's file), twice: cold (each party
   parses its CSV, preprocesses, sorts by id) and warm (each party loads its parsed rows from
   its disk cache). Peak RSS is the whole process's (server and all 6 parties together).
4. ``flwr run`` on a private simulation SuperLink (6 SuperNodes), the same job twice (cold,
   warm): wall time from submission to the run's end (Ray's start included), the job's own
   time (``score.json``), and the peak, sampled every 0.5 s, of the resident memory summed
   over the SuperLink's whole process tree (SuperLink, ServerApp, simulation, Ray's
   processes and workers): RSS (shared pages counted in every process) and PSS (shared
   pages divided among their processes).
5. In a fresh process, one party alone (the largest block): parse and preprocess its file,
   then the partial logits of every chunk: what one organisation's machine needs.

The numbers go to ``<out>/scoring.json`` and ``.md``; docs/scoring.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, peak_rss_mib, table, write  # noqa: E402

K = 6
SYNTHETIC_TRAIN_ROWS = 20_000
SYNTHETIC_FEATURES = 32
FILES = "score{partition}.csv"
RAY_TRIES = 3


def base_config(table: str, work: Path) -> dict:
    """The run config keys training and scoring share (the model's data)."""
    if table == "adult":
        return {"dataset": "adult"}
    return {"dataset": "csv", "csv.path": str(work / "train.csv"), "csv.label": "label", "csv.positive": "yes",
            "csv.sensitive": "group", "csv.group-a": "a", "csv.group-b": "b", "csv.id-column": "row_id"}


def _synthetic_train(work: Path) -> None:
    import numpy as np
    import pandas as pd

    from fairvfl_flwr.data import synthetic

    n, f = SYNTHETIC_TRAIN_ROWS, SYNTHETIC_FEATURES
    X = synthetic.columns(n, range(f), seed=0)
    y, s = synthetic.labels(n, f, seed=0)
    df = pd.DataFrame(X, columns=[f"x{c}" for c in range(f)])
    df.insert(0, "row_id", np.arange(n))
    df["group"] = np.where(s, "a", "b")
    df["label"] = np.where(y == 1, "yes", "no")
    df.to_csv(work / "train.csv", index=False)


def prepare(work: Path, table: str, rows: int, train_rounds: int) -> dict:
    import numpy as np
    import pandas as pd

    from fairvfl_flwr.app.run import run_inprocess
    from fairvfl_flwr.data import model_files, synthetic
    from fairvfl_flwr.data.tables import DATASETS, packaged_file

    if table == "synthetic":
        _synthetic_train(work)
    _, folder = run_inprocess({**base_config(table, work), "num-server-rounds": train_rounds,
                               "eval-every": train_rounds, "output-dir": str(work / "train")}, quiet=True)
    if table == "adult":
        raw = pd.read_csv(packaged_file(DATASETS["adult"].path.name))
        pick = np.random.default_rng(0).integers(0, len(raw), rows)
        table_ = raw.iloc[pick].reset_index(drop=True)
        table_["row_id"] = np.arange(rows)
    files = []
    for k in range(K):
        meta = json.loads((folder / model_files.PARTIES / f"partition-{k}" / model_files.BLOCK_META).read_text())
        raw_cols = list(dict.fromkeys(meta["preprocessing"]["raw"]))
        if table == "adult":
            part = table_[["row_id", *raw_cols]]
        else:  # only this party's columns exist at once: new rows, another seed than training's
            part = pd.DataFrame(synthetic.columns(rows, [int(c[1:]) for c in raw_cols], seed=1), columns=raw_cols)
            part.insert(0, "row_id", np.arange(rows))
        path = work / FILES.format(partition=k)
        part.iloc[np.random.default_rng(k + 1).permutation(rows)].to_csv(path, index=False, float_format="%.7g")
        files.append({"path": str(path), "columns": len(raw_cols), "mib": path.stat().st_size / 2**20})
    return {"model": str(folder), "files": files}


def score_config(table: str, work: Path, model: str, chunk: int, out: Path) -> dict:
    return {**base_config(table, work), "mode": "score", "score.model-from": model, "score.chunk-rows": chunk,
            "score.path": str(work / FILES), "output-dir": str(out)}


def score_job(work: Path, table: str, model: str, chunk: int) -> dict:
    """Child process: the scoring job twice over the in-process grid."""
    from fairvfl_flwr.app.client import app as client_app
    from fairvfl_flwr.app.server import run_server
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.data import encoding
    from fairvfl_flwr.flower.inprocess import InProcessGrid

    from fairvfl_flwr.jobs import scoring

    os.environ["FAIRVFL_CACHE_DIR"] = str(work / "cache-inprocess")
    base = peak_rss_mib()
    out = {}
    writing, write = [], scoring.write_predictions

    def timed_write(*args) -> None:  # the job's share spent writing predictions.csv
        t = time.perf_counter()
        write(*args)
        writing.append(time.perf_counter() - t)

    scoring.write_predictions = timed_write
    for run in ("cold", "warm"):
        encoding.clear_cache()  # as a fresh process per run would
        cfg = RunConfig.from_flower(score_config(table, work, model, chunk, work / f"score-{run}"))
        grid = InProcessGrid(client_app, cfg.to_flower(), K)
        t0, c0 = time.perf_counter(), time.process_time()
        summary, folder = run_server(grid, cfg.to_flower())
        out[run] = {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
                    "write_seconds": writing[-1], "rows": summary["rows"], "chunks": summary["chunks"],
                    "peak_rss_mib": peak_rss_mib(),
                    "predictions_mib": (folder / "predictions.csv").stat().st_size / 2**20}
    out["base_rss_mib"] = base
    return out


# -- flwr run: the process tree's memory ------------------------------------------------------
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    return kids


def tree(root: int) -> list[int]:
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _mib(pid: int, file: str, field: str) -> float:
    try:
        for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class TreeMemory:
    """Samples the summed RSS and PSS of a process tree every ``every`` seconds; keeps the peaks."""

    def __init__(self, root: int, every: float = 0.5) -> None:
        self.root, self.every = root, every
        self.peak_rss = self.peak_pss = self.peak_one = 0.0
        self.peak_procs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> tuple[float, float, float, int]:
        pids = tree(self.root)
        rss = [_mib(p, "status", "VmRSS") for p in pids]
        pss = sum(_mib(p, "smaps_rollup", "Pss") for p in pids)
        return sum(rss), pss, max(rss, default=0.0), len(pids)

    def _loop(self) -> None:
        while not self._stop.is_set():
            rss, pss, one, n = self.sample()
            if rss > self.peak_rss:
                self.peak_rss, self.peak_procs = rss, n
            self.peak_pss, self.peak_one = max(self.peak_pss, pss), max(self.peak_one, one)
            self._stop.wait(self.every)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def flwr_job(work: Path, table: str, model: str, chunk: int) -> dict:
    """The scoring job through `flwr run` on a private simulation SuperLink, cold then warm."""
    from fairvfl_flwr.tools.flwr_engine import FlwrRunError, SimulationSuperLink

    os.environ["FAIRVFL_CACHE_DIR"] = str(work / "cache-flwr")  # the SuperLink's processes inherit it
    out: dict = {}
    with SimulationSuperLink(work / "flwr-home") as link:
        idle_rss, idle_pss, _, idle_n = TreeMemory(link.proc.pid).sample()
        out["idle"] = {"rss_mib": idle_rss, "pss_mib": idle_pss, "processes": idle_n}
        for run in ("cold", "warm"):
            dest = work / f"flwr-score-{run}"
            for attempt in range(RAY_TRIES):
                with TreeMemory(link.proc.pid) as mem:
                    t0 = time.perf_counter()
                    try:
                        link.run(score_config(table, work, model, chunk, dest), num_supernodes=K, timeout=1800)
                    except FlwrRunError as exc:
                        # Ray gives its raylet a fixed 30 s to start, which a loaded machine can miss
                        if "timed out during startup" not in str(exc) or attempt == RAY_TRIES - 1:
                            raise
                        out.setdefault("ray_start_retries", []).append(run)
                        continue
                    wall = time.perf_counter() - t0
                break
            (folder,) = [p for p in dest.iterdir() if p.is_dir()]
            summary = json.loads((folder / "score.json").read_text())
            out[run] = {"seconds": wall, "job_seconds": summary["seconds"], "rows": summary["rows"],
                        "chunks": summary["chunks"], "peak_rss_mib": mem.peak_rss, "peak_pss_mib": mem.peak_pss,
                        "peak_one_process_mib": mem.peak_one, "processes": mem.peak_procs}
    return out


def one_party(path: str, model: str, k: int, chunk: int) -> dict:
    """Child process: one party's share (parse + preprocess its file, logits chunk by chunk)."""
    import numpy as np
    import torch

    from fairvfl_flwr.core.models import build_model
    from fairvfl_flwr.data import model_files
    from fairvfl_flwr.data.encoding import Preprocessing, read_columns, rows_from_frame

    torch.set_num_threads(1)
    base = peak_rss_mib()
    arrays, meta = model_files.load_block(Path(model) / model_files.PARTIES / f"partition-{k}", f"party {k}")
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
    ap.add_argument("--table", choices=["synthetic", "adult"], default="synthetic")
    ap.add_argument("--engines", default="inprocess,flwr", help="comma-separated, run in this order: inprocess, flwr")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--chunk-rows", type=int, default=100_000)
    ap.add_argument("--train-rounds", type=int, default=20)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--child", choices=["score", "flwr", "party"], help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--files", help=argparse.SUPPRESS)
    ap.add_argument("--k", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child == "score":
        print(json.dumps(score_job(Path(a.work), a.table, a.model, a.chunk_rows)))
        return {}
    if a.child == "flwr":
        print(json.dumps(flwr_job(Path(a.work), a.table, a.model, a.chunk_rows)))
        return {}
    if a.child == "party":
        print(json.dumps(one_party(a.files, a.model, a.k, a.chunk_rows)))
        return {}
    engines = [e for e in a.engines.split(",") if e]
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fairvfl-bench-scoring-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        prep = prepare(work, a.table, a.rows, a.train_rounds)
        prep_s = time.perf_counter() - t0
        paths = [f["path"] for f in prep["files"]]
        common = ["--work", str(work), "--table", a.table, "--model", prep["model"], "--chunk-rows", str(a.chunk_rows)]
        job: dict = {}
        sim: dict = {}
        for engine in engines:  # in the order given
            if engine == "inprocess":
                job = _child("--child", "score", *common)
            elif engine == "flwr":
                sim = _child("--child", "flwr", *common)
        big = max(range(K), key=lambda k: prep["files"][k]["columns"])
        party = _child("--child", "party", "--model", prep["model"], "--files", paths[big], "--k", str(big),
                       "--chunk-rows", str(a.chunk_rows))
    rows = [{"what": f"scoring job, in-process grid ({run}; writing predictions.csv {job[run]['write_seconds']:.1f} s)",
             "rows": job[run]["rows"], "chunks": job[run]["chunks"], "seconds": job[run]["seconds"],
             "cpu_seconds": job[run]["cpu_seconds"], "peak_rss_mib": job[run]["peak_rss_mib"]}
            for run in ("cold", "warm") if job]
    rows += [{"what": f"scoring job, flwr run simulation ({run}; job {sim[run]['job_seconds']:.1f} s)",
              "rows": sim[run]["rows"], "chunks": sim[run]["chunks"], "seconds": sim[run]["seconds"],
              "peak_rss_mib": sim[run]["peak_rss_mib"], "peak_pss_mib": sim[run]["peak_pss_mib"]}
             for run in ("cold", "warm") if sim]
    rows.append({"what": f"one party alone (partition {big}, {party['features']} features): parse + preprocess",
                 "rows": a.rows, "seconds": party["parse_seconds"], "peak_rss_mib": party["peak_rss_mib"]})
    rows.append({"what": "one party alone: partial logits of every chunk", "rows": a.rows,
                 "chunks": -(-a.rows // a.chunk_rows), "seconds": party["logits_seconds"]})
    notes = [f"score files: {sum(f['mib'] for f in prep['files']):.0f} MiB in all",
             f"process base RSS {party['base_rss_mib']:.0f} MiB (party)",
             f"preparing (training + files) took {prep_s:.0f} s",
             f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
             f"({len(os.sched_getaffinity(0))} cores: seconds beyond the CPU seconds are mostly waiting for a core)",
             "cpu_seconds: the job process's CPU time (the server and all parties share the process)"]
    if job:
        notes += [f"in-process job base RSS {job['base_rss_mib']:.0f} MiB",
                  f"predictions.csv {job['cold']['predictions_mib']:.0f} MiB"]
    if sim:
        notes += [f"flwr run: the idle SuperLink tree {sim['idle']['rss_mib']:.0f} MiB RSS / "
                  f"{sim['idle']['pss_mib']:.0f} MiB PSS ({sim['idle']['processes']} processes); at the peak "
                  f"{sim['cold']['processes']} processes, the largest {sim['cold']['peak_one_process_mib']:.0f} MiB"]
    md = (f"Scoring {a.rows:,} rows, {K} parties ({a.table} columns, linear blocks), chunks of {a.chunk_rows:,} rows\n\n"
          + table(rows, ["what", "rows", "chunks", "seconds", "cpu_seconds", "peak_rss_mib", "peak_pss_mib"])
          + "\n\n" + "; ".join(notes))
    payload = {"table": a.table, "rows": a.rows, "parties": K, "chunk_rows": a.chunk_rows, "job": job, "flwr": sim,
               "party": party, "files": prep["files"]}
    write(Path(a.out), "scoring" if a.table == "adult" else "scoring-synthetic", payload, md,
          title=f"Scoring: time and memory per role ({a.table} columns)")
    return payload


if __name__ == "__main__":
    main()
