"""A party's products with BLAS's default threads vs one thread, in one run.

    python bench/blas_threads.py [--rows 30000] [--cols 20] [--repeats 20]

Times the products of one round of a linear party (a block Newton direction's
xᵀdiag(h)x and xᵀν, a gradient step's xᵀν and x θ) in two fresh processes, one with
OpenBLAS's default thread count and one limited to a single thread as the app does
(fairvfl_flwr/app/threads.py), and prints seconds per round for both, their ratio and
the load average. The ratio depends on how busy the machine is: that is the point.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits
rows, cols, repeats, one = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
if one:
    threadpool_limits(limits=1, user_api="blas")
rng = np.random.default_rng(0)
x, h, nu, theta = rng.random((rows, cols)), rng.random(rows), rng.random(rows), rng.random(cols)
started = time.perf_counter()
for _ in range(repeats):
    hess = (x * h[:, None]).T @ x
    grad = x.T @ nu
    u = x @ theta
seconds = (time.perf_counter() - started) / repeats
threads = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
print(json.dumps({"seconds_per_round": seconds, "blas_threads": threads}))
"""


def run(rows: int, cols: int, repeats: int, one: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", CHILD, str(rows), str(cols), str(repeats), "1" if one else "0"],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=30000)
    p.add_argument("--cols", type=int, default=20)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    default = run(args.rows, args.cols, args.repeats, one=False)
    single = run(args.rows, args.cols, args.repeats, one=True)
    print(f"rows={args.rows} cols={args.cols} cores={os.cpu_count()} load average={os.getloadavg()[0]:.1f}")
    print(f"default BLAS threads {default['blas_threads']}: {default['seconds_per_round'] * 1e3:.1f} ms per round")
    print(f"one BLAS thread      {single['blas_threads']}: {single['seconds_per_round'] * 1e3:.1f} ms per round")
    print(f"default / one = {default['seconds_per_round'] / single['seconds_per_round']:.2f}")


if __name__ == "__main__":
    main()
