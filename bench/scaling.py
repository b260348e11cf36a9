"""Scaling: seconds per round and peak memory per role, n ∈ {10k, 100k, 1M} rows, K ∈ {2, 6, 16}.

    python bench/scaling.py [--ns 10000,100000,1000000] [--ks 2,6,16] [--rounds 5] [--batch 0]
                            [--out docs/results]

Synthetic table (fairvfl_flwr/synthetic.py: seeded, planted group bias, 32 columns, the
active party holds 8 of them). Each role runs **in its own process** — the server, the
active party and one passive party (the largest passive block) — doing exactly its own
share of a round with the app's own code: the server sums K float32 logit vectors, takes
the dual step and computes ν (fairvfl_flwr/core/step.py) and casts z/ν to the float32 wire; a party
runs ``parties.Party.step`` / ``ActiveParty.local_steps`` (Q = 5) and computes its new
logits. Each process generates only its own columns (the active party and the server
also the labels), so its peak RSS is what that organisation's machine needs. There is no
Flower transport in these numbers (bench/overhead.py measures it: add it per round).

``round_s`` = server + max(active, passive): the round's critical path when every party
runs on its own machine. ``--batch b`` measures mini-batch rounds (fairvfl_flwr/batching.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, page_name, peak_rss_mib, table, write  # noqa: E402

FEATURES = 32
ACTIVE_COLUMNS = 8
Q = 5


def _columns(K: int):
    from fairvfl_flwr.data.partition import split_columns

    return split_columns(FEATURES, K, 1, ACTIVE_COLUMNS)


def role_main(role: str, n: int, K: int, rounds: int, batch: int, seed: int = 0) -> dict:
    """One role's share of ``rounds`` rounds; returns its seconds per round and peak RSS."""
    import numpy as np

    from fairvfl_flwr.data import synthetic
    from fairvfl_flwr.core.constraints import from_labels
    from fairvfl_flwr.core.batching import batch_rows
    from fairvfl_flwr.core.blocks import build_block
    from fairvfl_flwr.core.objective import train_stats
    from fairvfl_flwr.core.step import server_step
    from fairvfl_flwr.core.parties import ActiveParty, Party

    base = peak_rss_mib()
    tr, _ = synthetic.split(n)
    n_train = tr.stop
    cols = _columns(K)
    lr, mu = 1 / 100.0, 2 / n_train
    rng = np.random.default_rng(1)
    t_data = time.perf_counter()
    if role in ("server", "active"):
        y, s = synthetic.labels(n, FEATURES, seed)
        y, s = y[tr], s[tr]
    if role == "server":
        u = [rng.normal(size=n_train).astype(np.float32) for _ in range(K)]  # the K replies as they arrive
        lam = np.zeros(2)
        constraint = from_labels(y, s, 1)
    else:
        block = cols[0] if role == "active" else max(cols[1:], key=len)
        X = np.ascontiguousarray(synthetic.columns(n, block, seed)[tr])
        model = build_block("linear", len(block), bias=role == "active", seed=0)
        z_wire = rng.normal(size=n_train).astype(np.float32)
        nu_wire = (rng.normal(size=n_train) / n_train).astype(np.float32)
        if role == "active":
            constraint = from_labels(y, s, 1)
    t_data = time.perf_counter() - t_data

    def one_round(t: int) -> None:
        nonlocal lam
        rows = batch_rows(seed, t, n_train, batch)
        if role == "server":
            z = np.sum([v.astype(np.float64) for v in u], axis=0)
            g = constraint if rows is None else from_labels(y[rows], s[rows], 1)
            yb = y if rows is None else y[rows]
            train_stats(yb, z, g)  # the round's history row
            lam, nu = server_step(lam, yb, z, g, epsilon=0.01, beta=0.1, c=1e-3)
            _wire = (nu.astype(np.float32), z.astype(np.float32))
            return
        Xb = X if rows is None else X[rows]
        if role == "active":
            yb, gb = (y, constraint) if rows is None else (y[rows], from_labels(y[rows], s[rows], 1))
            party = ActiveParty(model, Xb, Xb[:0], lr, mu, y=yb.astype(np.float64), constraint=gb)
            party.local_steps(z_wire[: len(yb)].astype(np.float64), np.array([0.01, 0.0]), Q)
        else:
            party = Party(model, Xb, Xb[:0], lr, mu)
            party.step(nu_wire[: Xb.shape[0]].astype(np.float64))
        nxt = batch_rows(seed, t + 1, n_train, batch)  # reply: new logits on the next round's rows
        Xn = X if nxt is None else X[nxt]
        _reply = model.forward(Xn).astype(np.float32)

    if role == "server" and batch:
        u = [v[:batch] for v in u]  # mini-batch: the server holds b logits per party
    one_round(1)
    t0 = time.perf_counter()
    for t in range(2, rounds + 1):
        one_round(t)
    sec = (time.perf_counter() - t0) / max(1, rounds - 1)
    return {"role": role, "seconds_per_round": sec, "peak_rss_mib": peak_rss_mib(), "base_rss_mib": base,
            "data_seconds": t_data}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ns", default="10000,100000,1000000")
    ap.add_argument("--ks", default="2,6,16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--name", type=page_name, default="")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--k", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:  # child process
        print(json.dumps(role_main(args.role, args.n, args.k, args.rounds, args.batch)))
        return {}
    rows = []
    for n in [int(x) for x in args.ns.split(",")]:
        for K in [int(x) for x in args.ks.split(",")]:
            row: dict = {"n": n, "K": K, "batch": args.batch}
            for role in ("server", "active", "passive"):
                out = subprocess.run([sys.executable, __file__, "--role", role, "--n", str(n), "--k", str(K),
                                      "--rounds", str(args.rounds), "--batch", str(args.batch)],
                                     capture_output=True, text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                row[f"{role}_s"] = r["seconds_per_round"]
                row[f"{role}_MiB"] = r["peak_rss_mib"]
                row[f"{role}_data_MiB"] = r["peak_rss_mib"] - r["base_rss_mib"]
            row["round_s"] = row["server_s"] + max(row["active_s"], row["passive_s"])
            print(row, flush=True)
            rows.append(row)
    name = args.name or ("scaling" if not args.batch else f"scaling-batch{args.batch}")
    md = (f"Scaling (synthetic, {FEATURES} columns, Q = {Q}, {'full batch' if not args.batch else f'batch {args.batch}'}, "
          f"{args.rounds} rounds, one process per role, no transport): seconds per round and peak RSS (MiB)\n\n"
          + table(rows, ["n", "K", "round_s", "server_s", "active_s", "passive_s", "server_MiB", "active_MiB", "passive_MiB"]))
    write(args.out, name, {"features": FEATURES, "Q": Q, "rounds": args.rounds, "batch": args.batch, "rows": rows}, md, title="Scaling: seconds and memory per role")
    return {"rows": rows}


if __name__ == "__main__":
    main()
