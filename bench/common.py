"""Shared helpers of the bench scripts: the output folder, a markdown table, machine facts.

The one-process floors they time are fairvfl_flwr/core/reference.py's."""

from __future__ import annotations

import json
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one thread, as the ClientApp's torch
    os.environ.setdefault(_var, "1")
import platform
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_OUT = REPO / "bench" / "results"


def machine() -> dict:
    return {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2), "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def ms_per_round(folder) -> float:
    """Milliseconds per round of the run in ``folder`` (its history's seconds), rounds 2..R:
    round 1 is left out (a party's first message does one-time work, e.g. loading data)."""
    (hist,) = Path(folder).glob("*/history.json")
    secs = [r["seconds"] for r in json.loads(hist.read_text())]  # secs[t]: after round t (round 0: set-up)
    return 1000 * (secs[-1] - secs[1]) / (len(secs) - 2)


def alternated(reps: int, rounds: int, tmp: str):
    """(rep, on, run folder, rounds) for a feature's cost against plain: off and on runs
    alternated ``reps`` times, so that load drifts hit both alike, after a 2-round warm-up
    pair (rep -1: loads the data; not to be counted)."""
    for rep in range(-1, reps):
        for on in (False, True):
            yield rep, on, Path(tmp) / f"{int(on)}-{rep}", 2 if rep < 0 else rounds


def table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def write(out: Path, name: str, payload: dict, markdown: str) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"bench": name, "machine": machine(), **payload}
    (out / f"{name}.json").write_text(json.dumps(payload, indent=1, default=float))
    (out / f"{name}.md").write_text(markdown + "\n")
    print(markdown)
    print(f"\n[{name}] written to {out}/{name}.json and .md")


def peak_rss_mib() -> float:
    """This process's peak resident memory (MiB).

    VmHWM, not ``getrusage``: Linux carries ru_maxrss over fork and exec, so a child
    started by a large parent (bench/run_all.py after the simulation benchmark: 617 MiB)
    reported the parent's peak instead of its own.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
