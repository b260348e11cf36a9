"""A loopback deployment at scale: the synthetic table (n = 1M rows by default), 6 parties,
10 rounds; seconds per round, bytes per message and peak memory of every Flower process.

    python bench/deploy_scale.py [--n 1000000] [--parties 6] [--rounds 10] [--batch-size 0] \\
        [--poll 0.05] [--run-config "optimizer='newton'"]

The app has no packaged synthetic dataset, so the table (``fairvfl_flwr/data/synthetic.py``,
32 columns) is written to party files with the real exporter in this process
(``dataset`` in the run config is only a placeholder: a deployed server reads its label
file and every party its own file). A sampler thread reads ``/proc`` every 0.2 s and
keeps, per process of the federation (SuperLink, ServerApp, SuperNodes, their SuperExecs
and every short-lived ClientApp), its peak resident memory (VmHWM, the kernel's high-water
mark, read while the process lives). Bytes per message are the arrays each message
carries, from the timing log (features/timing.py; Flower's envelope not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, page_name, table, write  # noqa: E402
from bench.deploy_time import TIMING_ENV, breakdown, deploy, history, history_round_seconds, poll_env  # noqa: E402
from fairvfl_flwr.config import RunConfig  # noqa: E402
from fairvfl_flwr.data import problem, synthetic  # noqa: E402
from fairvfl_flwr.tools.export import export  # noqa: E402
from fairvfl_flwr.tools.cli import parse_run_config  # noqa: E402

KINDS = ("flower-superlink", "flwr-serverapp", "flower-supernode", "flower-superexec", "flwr-clientapp")


def _status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class MemorySampler(threading.Thread):
    """Peak RSS (VmHWM) of every descendant of the given roots, by kind of Flower process."""

    def __init__(self, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.roots: list[int] = []
        self.peak: dict[int, tuple[str, int]] = {}  # pid -> (kind, KiB)
        self.stop_event = threading.Event()

    def tree(self) -> list[int]:
        children: dict[int, list[int]] = defaultdict(list)
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children[ppid].append(int(entry.name))
        out, todo = {}, list(self.roots)
        while todo:
            pid = todo.pop()
            if pid not in out:
                out[pid] = None
                todo += children.get(pid, [])
        return list(out)

    def kind(self, pid: int) -> str | None:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        text = " ".join(c.decode(errors="replace") for c in cmd[:3])
        return next((k for k in KINDS if k in text), None)

    def run(self) -> None:
        while not self.stop_event.is_set():
            for pid in self.tree():
                kind = self.kind(pid) if pid not in self.peak else self.peak[pid][0]
                hwm = _status_kib(pid, "VmHWM")
                if kind and hwm:
                    self.peak[pid] = (kind, max(hwm, self.peak.get(pid, (kind, 0))[1]))
            self.stop_event.wait(self.interval)

    def by_kind(self) -> dict[str, dict]:
        out = {}
        for kind in KINDS:
            values = [kib / 1024 for k, kib in self.peak.values() if k == kind]
            if values:
                out[kind] = {"processes": len(values), "max_MiB": max(values), "median_MiB": statistics.median(values)}
        return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--parties", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=0, help="batching.batch-size (0: full batch)")
    ap.add_argument("--poll", default="0.05", help="SuperExec task poll of the SuperNodes ('default': Flower's 1 s)")
    ap.add_argument("--run-config", default="", help="extra run config (Flower's syntax)")
    ap.add_argument("--keep", type=Path, default=None, help="keep files and logs here (default: a temporary folder)")
    ap.add_argument("--parties-dir", type=Path, default=None,
                    help="party files from an earlier run (its manifest.json); written there if missing")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--name", type=page_name, default="deploy_scale")
    args = ap.parse_args(argv)
    extra = parse_run_config(args.run_config, "--run-config")
    with tempfile.TemporaryDirectory(prefix="fairvfl-scale-") as tmp:
        tmp = args.keep or Path(tmp)
        t0 = time.perf_counter()
        parties = args.parties_dir or tmp / "parties"
        if (parties / "manifest.json").exists():
            manifest = json.loads((parties / "manifest.json").read_text())
            if manifest["rows"]["train"] + manifest["rows"]["test"] != args.n:
                raise SystemExit(f"{parties} holds {manifest['rows']} rows, not n = {args.n}")
        else:
            ds = synthetic.make_dataset(args.n, args.features, seed=0)
            problem._load_table = lambda cfg: ds  # the synthetic table in place of the packaged ones (this process only)
            manifest = export(RunConfig(dataset="adult", num_parties=args.parties), parties, demo_keys=True)
            del ds
        export_s = time.perf_counter() - t0
        file_mib = {p.name: p.stat().st_size / 2**20 for p in sorted(parties.glob("*.csv"))}
        print(json.dumps({"export_seconds": export_s, "files_MiB": file_mib}), flush=True)
        cfg = {**manifest["run_config"], "num-server-rounds": args.rounds, "eval-every": args.rounds,
               "batching.batch-size": args.batch_size, "output-dir": str(tmp / "out"), **extra}
        log = tmp / "timing"
        sampler = MemorySampler()

        def watch(fed) -> None:
            sampler.roots = [proc.pid for _, proc, _ in fed.procs]
            sampler.start()

        load = os.getloadavg()[0]
        run = deploy(tmp / "fed", manifest["node_configs"], cfg,
                     {"FAIRVFL_CACHE_DIR": str(tmp / "cache"), TIMING_ENV: str(log), **poll_env(args.poll)},
                     on_start=watch)
        sampler.stop_event.set()
        sampler.join()
        if run["status"] != "finished:completed":
            print(run["log_tail"], file=sys.stderr)
        result = {"n": args.n, "parties": args.parties, "rounds": args.rounds, "batch_size": args.batch_size,
                  "status": run["status"], "load_before": load, "load_after": os.getloadavg()[0],
                  "export_seconds": export_s, "files_MiB": file_mib, "wall_seconds": run["finished"] - run["submitted"],
                  "memory": sampler.by_kind()}
        if run["status"] == "finished:completed":
            rows = history(tmp / "out")
            per_round = history_round_seconds(rows)
            bd = breakdown(log)
            result.update({
                "s_per_round_median": statistics.median(per_round), "per_round": per_round,
                "setup_seconds": json.loads(next((tmp / "out").glob("*/summary.json")).read_text()).get("setup_seconds"),
                "bytes_to_party": sorted(set(bd["bytes_to_party"])), "bytes_from_party": sorted(set(bd["bytes_from_party"])),
                "our_compute_mean": statistics.mean(r["mean"]["our_compute"] for r in bd["rounds"]),
                "our_import_mean": statistics.mean(r["mean"]["our_import"] for r in bd["rounds"]),
                "final_acc": 100 * rows[-1]["acc"], "final_train_deo": rows[-1]["deo"],
            })
    print(json.dumps(result, default=float), flush=True)
    mem = [{"process": k, **v} for k, v in result["memory"].items()]
    md = (f"Loopback deployment, synthetic n = {args.n:,} ({args.features} columns), {args.parties} parties, "
          f"{args.rounds} rounds, batching.batch-size = {args.batch_size}, SuperExec poll {args.poll}, run config "
          f"{args.run_config or '(defaults)'}: status {result['status']}, "
          f"{result.get('s_per_round_median', float('nan')):.2f} s per round (median), wall {result['wall_seconds']:.0f} s "
          f"from submission, load average {result['load_before']:.1f} before / {result['load_after']:.1f} after; "
          f"bytes per message to a party {result.get('bytes_to_party')}, from a party {result.get('bytes_from_party')}\n\n"
          + table(mem, ["process", "processes", "max_MiB", "median_MiB"]))
    write(args.out, args.name, {"args": {**vars(args), "out": str(args.out), "keep": str(args.keep)}, "result": result}, md, title="A deployment at scale")
    return result


if __name__ == "__main__":
    main()
