"""Mini-batch vs full-batch rounds on the synthetic table: accuracy, fairness, time to target.

    python bench/minibatch.py [--n 1000000] [--batches 0,10000] [--rounds 300] [--engine floor|app]

``--engine floor`` (default): the round math of core/reference.NumpyFloor (linear, K = 6,
Q = 5, one process) with each round restricted to the rows
``fairvfl_flwr.core.batching.batch_rows(seed, t, n, b)`` (the shared-seed batch: λ and ν use
the batch, so each party computes and receives b values); ``b = 0`` is the full batch.
Every 10 rounds the full training DEO and the test accuracy are computed on all rows (not
counted in the round time).

``--engine app``: the real ServerApp strategy and ClientApp on the in-process grid with
run config ``batch-size = b`` (``preset``-free: η, β, ε as given, Q = 5, eval-every = 10,
float32 wire). The app has no synthetic dataset, so ``problem._load_table`` is replaced
by the synthetic table in this process (``dataset`` is a placeholder); everything after
the table (party tables, server labels, messages, checks) is the app's own path. Round
time is the mean over non-evaluation rounds; seconds to target are the app's own clock
(training rounds, evaluation rounds included).

Target: test accuracy within 0.5 points of the full-batch run's final value and train
DEO (all training rows) <= ε + 0.005, from that evaluation on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.common import DEFAULT_OUT, page_name, table, write  # noqa: E402
from fairvfl_flwr.core.constraints import from_labels  # noqa: E402
from fairvfl_flwr.core.reference import NumpyFloor  # noqa: E402
from fairvfl_flwr.data import synthetic  # noqa: E402
from fairvfl_flwr.core.batching import batch_rows  # noqa: E402
from fairvfl_flwr.core.metrics import fairness_metrics  # noqa: E402
from fairvfl_flwr.core.objective import train_stats  # noqa: E402
from fairvfl_flwr.core.step import server_step  # noqa: E402
from fairvfl_flwr.data.partition import split_columns  # noqa: E402


class BatchedFloor(NumpyFloor):
    def __init__(self, blocks, y, s, batch, seed, **kw):
        super().__init__(blocks, y, from_labels(y, s, 1), **kw)
        self.s, self.batch, self.seed, self.t = s, batch, seed, 0

    def round(self):
        self.t += 1
        rows = batch_rows(self.seed, self.t, len(self.y), self.batch)
        if rows is None:
            return super().round()
        X = [x[rows] for x in self.X]
        y, g = self.y[rows], from_labels(self.y[rows], self.s[rows], 1)
        u = [self._u(k, x) for k, x in enumerate(X)]
        z = np.sum(u, axis=0)
        self.lam, nu = server_step(self.lam, y, z, g, epsilon=self.epsilon, beta=self.beta, c=self.c,
                                   fairness=self.fairness)
        for k, x in enumerate(X):
            if k < self.active:
                others = z - u[k]
                for _ in range(self.Q):
                    nu_k = g.masked_weights(y, others + self._u(k, x), self.lam)
                    self.theta[k] -= self.lr * (x.T @ nu_k + self.mu * self.theta[k])
                    self.bias[k] -= self.lr * (nu_k.sum() + self.mu * self.bias[k])
            else:
                self.theta[k] -= self.lr * (x.T @ nu + self.mu * self.theta[k])


def run_app(ds, b: int, rounds: int, eta: float, beta: float, epsilon: float, out: str) -> tuple[list, float]:
    """One app run on ``ds`` over the in-process grid: (eval curve, mean s per training round)."""
    import json

    from fairvfl_flwr.flower import party

    from fairvfl_flwr.data import partydata

    from fairvfl_flwr.data import problem
    from fairvfl_flwr.app.run import run_inprocess

    problem._load_table = lambda cfg: ds  # the synthetic table in place of the packaged ones (this process only)
    party.party_data.cache_clear()  # drop the previous run's party tensors (keyed by the run config)
    partydata.load_party.cache_clear()
    rc = {"dataset": "adult", "num-server-rounds": rounds, "eval-every": 10, "local-steps": 5, "eta": eta,
          "beta": beta, "epsilon": epsilon, "batching.batch-size": b, "output-dir": out, "reliability.round-timeout": 3600}
    _, folder = run_inprocess(rc, quiet=True)
    history = json.loads((folder / "history.json").read_text())
    curve = [(r["round"], r["seconds"], r["acc"], r["deo"], r["dfp"], r["dfn"])
             for r in history if r["round"] > 0 and r["acc"] is not None]
    steps = [h["seconds"] - prev["seconds"] for prev, h in zip(history[1:], history[2:]) if h["acc"] is None]
    return curve, float(np.mean(steps)) if steps else curve[-1][1] / rounds


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--batches", default="0,10000")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--eta", type=float, default=20.0, help="step 1/eta (default: the fast preset)")
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--epsilon", type=float, default=0.01)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--engine", choices=("floor", "app"), default="floor")
    ap.add_argument("--name", type=page_name, default="")
    args = ap.parse_args(argv)
    F, K = 32, 6
    ds = synthetic.make_dataset(args.n, F, seed=0)
    cols = split_columns(F, K, 1, 8)
    blocks = [np.ascontiguousarray(ds.X_train[:, c]) for c in cols]
    tests = [ds.X_test[:, c] for c in cols]
    full_groups = from_labels(ds.y_train, ds.s_train, 1)
    n = len(ds.y_train)
    runs, round_s = {}, {}
    for b in [int(x) for x in args.batches.split(",")]:
        if args.engine == "app":
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                runs[b], round_s[b] = run_app(ds, b, args.rounds, args.eta, args.beta, args.epsilon, tmp)
            print(b, runs[b][-1], f"{1000 * round_s[b]:.1f} ms/training round, "
                  f"{time.perf_counter() - t0:.0f} s with setup", flush=True)
            continue
        fl = BatchedFloor(blocks, ds.y_train, ds.s_train, b, 0, epsilon=args.epsilon, beta=args.beta, c=1e-3,
                          mu=2 / n, lr=1 / args.eta, Q=5)
        spent, curve = 0.0, []
        for r in range(1, args.rounds + 1):
            t = time.perf_counter()
            fl.round()
            spent += time.perf_counter() - t
            if r % 10 == 0 or r == args.rounds:
                fl.u = [fl._u(k, x) for k, x in enumerate(fl.X)]
                deo = abs(train_stats(ds.y_train, fl.z(), full_groups).gaps[0])
                acc = fairness_metrics(ds.y_test, ds.s_test, np.sum([fl._u(k, x) for k, x in enumerate(tests)], axis=0))
                curve.append((r, spent, acc["acc"], deo, acc["dfp"], acc["dfn"]))
        runs[b], round_s[b] = curve, spent / args.rounds
        print(b, curve[-1], f"{1000 * spent / args.rounds:.1f} ms/round", flush=True)
    ref = runs[min(runs)][-1][2]  # full-batch (or smallest) final accuracy
    rows = []
    for b, curve in runs.items():
        hit = None
        for r, sec, acc, deo, *_ in curve:
            ok = abs(acc - ref) * 100 <= 0.5 and deo <= args.epsilon + 0.005
            hit = (hit or (r, sec)) if ok else None
        r, sec, acc, deo, dfp, dfn = curve[-1]
        rows.append({"batch": b or "full", "ms_per_round": 1000 * round_s[b], "final_acc": 100 * acc, "train_deo": deo,
                     "test_dfp": dfp, "test_dfn": dfn, "rounds_to_target": hit and hit[0],
                     "seconds_to_target": hit and hit[1]})
    md = (f"Mini-batch vs full batch, synthetic n = {args.n} ({n} train), K = {K}, Q = 5, η = {args.eta}, "
          f"β = {args.beta}, ε = {args.epsilon}, {args.rounds} rounds ("
          + ("one process, numpy" if args.engine == "floor" else "the app on the in-process grid, float32 wire")
          + ")\n\n"
          + table(rows, ["batch", "ms_per_round", "final_acc", "train_deo", "test_dfp", "test_dfn",
                         "rounds_to_target", "seconds_to_target"]))
    name = args.name or ("minibatch" if args.engine == "floor" else "minibatch-app")
    write(args.out, name, {"n": args.n, "engine": args.engine, "rows": rows, "curves": {str(k): v for k, v in runs.items()}}, md, title="Mini-batch rounds")
    return {"rows": rows}


if __name__ == "__main__":
    main()
