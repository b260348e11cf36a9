"""Secure aggregation of partial logits: cost per round against plain, both in this one run.

    python bench/secagg.py [--dataset adult] [--rounds 20] [--reps 3] [--out docs/results]

The real ServerApp strategy and ClientApp over the in-process grid, the default run
config (6 parties, linear, float32 wire), plain and ``privacy.secure-aggregation = true``
runs alternated ``--reps`` times each so that load drifts hit both alike. ms/round is
the mean over rounds 2..R of each run (round 1 excluded); the minimum and the median
over reps are reported with their ratios (the minimum is the least disturbed by load),
and the CPU time per round of this process, which holds the server and every party
(other users' load moves it far less than wall time). Also: the set-up (key agreement) time, the bytes of one party's
logits reply (float32 plain, uint64 masked), and the masking cost of one reply alone.
Quote the ratio, not the absolute numbers, on a loaded machine.

``--optimizer newton``: block Newton (``stop-tolerance = 0``, so both run every round)
against block Newton under secure aggregation (shared step lengths, algorithms/newton.py):
the cost of a round of each method, the masking included. Also the masking of one Newton
reply (X_k s_k in the 64-bit ring, a and the 3 × 3 Gram matrix in the 128-bit ring).

    python bench/secagg.py --optimizer newton --dataset adult --rounds 10 --reps 3
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# bench.common first: it sets one BLAS thread before numpy loads OpenBLAS
from bench.common import DEFAULT_OUT, alternated, ms_per_round, table, write  # noqa: E402

import numpy as np  # noqa: E402


def _per_round(folder: Path) -> tuple[float, float]:
    (summ,) = Path(folder).glob("*/summary.json")
    return ms_per_round(folder), float(json.loads(summ.read_text()).get("setup_seconds", 0.0))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="adult")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--optimizer", choices=("gd", "newton"), default="gd")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    newton = args.optimizer == "newton"

    from fairvfl_flwr.app.run import run_inprocess
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.secure import ring

    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    accs: dict[bool, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep, on, out, rounds in alternated(args.reps, args.rounds, tmp):
            cfg = RunConfig.from_flower({**RunConfig().to_flower(), "dataset": args.dataset,
                                         "num-server-rounds": rounds, "eval-every": rounds,
                                         "output-dir": str(out), "privacy.secure-aggregation": on,
                                         # the same method both ways (auto would pick shared steps under masks)
                                         **({"optimizer": "newton", "stop-tolerance": 0.0} if newton
                                            else {"optimizer": "gd"})})
            started = time.process_time()
            summary, _ = run_inprocess(cfg.to_flower(), quiet=True)
            if rep < 0:
                continue
            # CPU time of this process (server and every party run in it): other
            # users' load on the machine moves wall time far more than CPU time
            cpu[on].append(1000 * (time.process_time() - started) / rounds)
            runs[on].append(_per_round(out))
            accs[on] = summary["test_acc"]
            print(f"rep {rep} secure-aggregation={on}: {runs[on][-1][0]:.1f} ms/round wall, "
                  f"{cpu[on][-1]:.1f} ms/round CPU", flush=True)
    n = {"adult": 40000, "compas": 4800, "crime": 1200}[args.dataset]
    rng = np.random.default_rng(0)
    keys = {j: rng.bytes(32) for j in range(1, 6)}
    u = rng.normal(size=n).astype(np.float32)
    t0 = time.perf_counter()
    for t in range(50):
        words = ring.masked(u, 0, keys, t, "train", 6, "bench")
    mask_ms = 1000 * (time.perf_counter() - t0) / 50
    t0 = time.perf_counter()
    for _ in range(50):
        ring.decode(np.sum([words] * 6, axis=0, dtype=np.uint64))
    sum_ms = 1000 * (time.perf_counter() - t0) / 50
    t0 = time.perf_counter()
    small = rng.normal(size=3 + 9)
    for t in range(50):  # one Newton reply: X_k s_k, then a and the Gram matrix, then ‖θ_k‖²
        ring.masked(u, 0, keys, t, "dir", 6, "bench")
        ring.masked_wide(small, 0, keys, t, "dir-gram", 6, "bench", "gram")
        ring.masked_wide(small[:1], 0, keys, t, "dir-sq-norm", 6, "bench", "sq-norm")
    newton_mask_ms = 1000 * (time.perf_counter() - t0) / 50

    def stats(on: bool) -> tuple[float, float]:
        ms = [r[0] for r in runs[on]]
        return float(np.min(ms)), float(np.median(ms))

    (plain_min, plain_med), (masked_min, masked_med) = stats(False), stats(True)
    rows = [
        {"mode": "plain", "CPU ms/round (median)": float(np.median(cpu[False])),
         "ms/round (min)": plain_min, "ms/round (median)": plain_med,
         "set-up s": float(np.median([r[1] for r in runs[False]])), "logits bytes/party/round": 4 * n,
         "test ACC": accs[False]},
        {"mode": "secure aggregation", "CPU ms/round (median)": float(np.median(cpu[True])),
         "ms/round (min)": masked_min, "ms/round (median)": masked_med,
         "set-up s": float(np.median([r[1] for r in runs[True]])), "logits bytes/party/round": 8 * n,
         "test ACC": accs[True]},
    ]
    what = "block Newton vs block Newton with shared step lengths" if newton else "gradient descent"
    md = (f"Secure aggregation vs plain ({what}), {args.dataset}, {args.rounds} rounds x {args.reps} reps each, "
          "in-process grid "
          "(the 6 parties run one after another in one process)\n\n"
          + table(rows, ["mode", "CPU ms/round (median)", "ms/round (min)", "ms/round (median)", "set-up s", "logits bytes/party/round",
                         "test ACC"])
          + f"\n\nratio (secure aggregation / plain): CPU per round {np.median(cpu[True]) / np.median(cpu[False]):.3f}; "
          f"wall per round min {masked_min / plain_min:.3f}, median {masked_med / plain_med:.3f}"
          + f"\none party masking one training reply (encode + 5 pair masks, {n} rows): {mask_ms:.2f} ms"
          + f"\nthe server summing 6 masked replies and decoding z: {sum_ms:.2f} ms"
          + f"\none party masking one Newton reply (X_k s_k, a + Gram matrix, ‖θ_k‖²): {newton_mask_ms:.2f} ms")
    payload = {"dataset": args.dataset, "optimizer": args.optimizer, "rounds": args.rounds, "reps": args.reps,
               "ms_per_round": {"plain": [r[0] for r in runs[False]], "secagg": [r[0] for r in runs[True]]},
               "cpu_ms_per_round": {"plain": cpu[False], "secagg": cpu[True]},
               "ratio_cpu": float(np.median(cpu[True]) / np.median(cpu[False])), "ratio_min": masked_min / plain_min, "ratio_median": masked_med / plain_med,
               "mask_ms": mask_ms, "server_sum_ms": sum_ms, "newton_mask_ms": newton_mask_ms}
    write(args.out, "secagg" + ("-newton" if newton else ""), payload, md, title="Secure aggregation: cost per round" + (" (block Newton)" if newton else ""))
    return payload


if __name__ == "__main__":
    main()
