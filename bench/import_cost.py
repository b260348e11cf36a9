"""What a deployed party's process pays to import the app, per message: linear vs MLP,
against Flower's own ClientApp import (the floor every Flower app pays).

    python bench/import_cost.py [--repeats 7] [--out docs/results]

Each measurement is a fresh Python process (as ``flwr-clientapp`` starts one per message
in deployment), interleaved so that machine load hits every variant alike; the table
gives the median wall seconds and the ratio to the floor, and whether torch / pandas
were loaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, REPO, table, write  # noqa: E402

VARIANTS = {
    "flower floor (flwr.clientapp, flwr.app)": "import flwr.clientapp, flwr.app",
    "linear party (import client_app)": "import client_app",
    "MLP party (client_app + its torch model)": "import client_app, fairvfl_flwr.core.models",
}
PROBE = ("import sys, time; t = time.perf_counter(); {stmt}; "
         "print(time.perf_counter() - t, 'torch' in sys.modules, 'pandas' in sys.modules)")


def measure(stmt: str) -> tuple[float, bool, bool]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(stmt=stmt)], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[0]), out[1] == "True", out[2] == "True"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    loaded: dict[str, tuple[bool, bool]] = {}
    for _ in range(args.repeats):
        for name, stmt in VARIANTS.items():
            s, torch, pandas = measure(stmt)
            seconds[name].append(s)
            loaded[name] = (torch, pandas)
    floor = statistics.median(seconds[next(iter(VARIANTS))])
    rows = [{"process imports": name, "median s": statistics.median(v), "x floor": statistics.median(v) / floor,
             "torch": loaded[name][0], "pandas": loaded[name][1]} for name, v in seconds.items()]
    md = table(rows, ["process imports", "median s", "x floor", "torch", "pandas"])
    write(args.out, "import_cost", {"rows": rows, "seconds": seconds}, md, title="Import cost on the ClientApp path")
    return {"rows": rows}


if __name__ == "__main__":
    main()
