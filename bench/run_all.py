"""Every benchmark, trimmed to fit ~20 minutes on an idle 2-core machine; results in one folder.

    python bench/run_all.py [--out docs/results] [--quick]

``--quick`` trims further (fewer rounds, n up to 100k) for a smoke run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import bytes as bytes_bench  # noqa: E402
from bench import minibatch, overhead, rounds, scaling  # noqa: E402
from bench.common import DEFAULT_OUT  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    out = ["--out", str(args.out)]
    q = args.quick
    steps = [
        ("overhead", overhead.main, []),
        ("bytes", bytes_bench.main, []),
        ("rounds", rounds.main, ["--rounds", "300" if q else "1000"]),
        ("rounds-fast", rounds.main, ["--rounds", "300" if q else "1000", "--preset", "fast"]),
        ("scaling", scaling.main, ["--rounds", "3"] + (["--ns", "10000,100000"] if q else [])),
        ("minibatch", minibatch.main, ["--n", "100000" if q else "1000000", "--rounds", "100"]),
    ]
    times = {}
    for name, fn, a in steps:
        t = time.perf_counter()
        fn(a + out)
        times[name] = time.perf_counter() - t
        print(f"== {name}: {times[name]:.0f} s", flush=True)
    print("wall seconds:", {k: round(v) for k, v in times.items()}, "total", round(sum(times.values())))


if __name__ == "__main__":
    main()
