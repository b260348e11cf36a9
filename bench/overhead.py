"""Overhead: ms per round of the same FairVFL problem, from the single-process floor to `flwr run`.

    python bench/overhead.py [--rounds 20] [--sim-rounds 10] [--out docs/results] [--no-sim]

Problem: Adult, 6 parties (1 active), linear, the default run config (Q = 5, float64
models, float32 wire). Modes, all measured in this one run (quote the ratios, not the
absolute numbers, on a loaded machine):

* ``numpy floor``: the identical round math in one process, numpy only (core/reference.NumpyFloor);
* ``torch centralised GDA``: fairvfl_flwr/core/reference.py (Q = 1, autograd on the whole problem);
* ``in-process grid``: the real ServerApp strategy and ClientApp, no SuperLink (fairvfl_flwr/flower/inprocess.py);
* ``flwr run simulation``: a private simulation SuperLink (fairvfl_flwr/tools/flwr_engine.py), 6 SuperNodes;
* ``no-op Flower round``: scripts/noop_app under the same SuperLink kind and node count,
  each message carrying n float32 each way (the same sizes as FairVFL's z/ν and logits).

Round 1 is excluded everywhere (first-round start-up); ms/round is the mean of the rest.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, REPO, ms_per_round, table, write  # noqa: E402
from fairvfl_flwr.core.reference import NumpyFloor  # noqa: E402
from fairvfl_flwr.data.problem import party_problem  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--sim-rounds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--no-sim", action="store_true", help="skip the two flwr-run modes (no SuperLink)")
    args = ap.parse_args(argv)

    import torch

    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.app.run import run_inprocess
    from fairvfl_flwr.core.models import build_model
    from fairvfl_flwr.core.reference import CentralisedGDA

    torch.set_num_threads(1)
    cfg = RunConfig()  # the defaults: Adult, K = 6, Q = 5, η = 100
    ds, blocks, constraint = party_problem(cfg)
    n = len(ds.y_train)
    kw = dict(epsilon=cfg.epsilon, beta=cfg.beta, c=cfg.c, mu=cfg.mu_value(n), lr=cfg.lr)
    rows = []

    def timed(label, step, rounds, note=""):
        step()  # round 1 excluded
        t = time.perf_counter()
        for _ in range(rounds - 1):
            step()
        ms = 1000 * (time.perf_counter() - t) / (rounds - 1)
        rows.append({"mode": label, "ms_per_round": ms, "rounds": rounds, "note": note})
        print(f"{label}: {ms:.1f} ms/round", flush=True)

    floor = NumpyFloor(blocks, ds.y_train, constraint, Q=cfg.local_steps, **kw)
    timed("numpy floor", floor.round, args.rounds, "same math, one process")
    models = [build_model("linear", b.shape[1], bias=k == 0, seed=k) for k, b in enumerate(blocks)]
    ref = CentralisedGDA(models, [torch.from_numpy(b) for b in blocks], ds.y_train.astype(float), constraint, **kw)
    timed("torch centralised GDA (Q=1)", ref.round, args.rounds, "reference.py, autograd")

    with tempfile.TemporaryDirectory() as tmp:
        run_inprocess({**cfg.to_flower(), "num-server-rounds": args.rounds, "eval-every": args.rounds,
                       "output-dir": f"{tmp}/inproc"})
        ms = ms_per_round(Path(tmp) / "inproc")
        rows.append({"mode": "in-process grid", "ms_per_round": ms, "rounds": args.rounds, "note": "real ServerApp+ClientApp"})
        print(f"in-process grid: {ms:.1f} ms/round", flush=True)
        if not args.no_sim:
            from fairvfl_flwr.tools.flwr_engine import SimulationSuperLink

            with SimulationSuperLink(Path(tmp) / "home-fairvfl") as link:
                t0 = time.perf_counter()
                link.run({"num-server-rounds": args.sim_rounds, "eval-every": args.sim_rounds,
                          "output-dir": f"{tmp}/sim"}, num_supernodes=cfg.num_parties)
                ms = ms_per_round(Path(tmp) / "sim")
                rows.append({"mode": "flwr run simulation", "ms_per_round": ms, "rounds": args.sim_rounds,
                             "note": f"6 SuperNodes; whole run {time.perf_counter() - t0:.0f} s"})
                print(f"flwr run simulation: {ms:.1f} ms/round", flush=True)
            with SimulationSuperLink(Path(tmp) / "home-noop", app_dir=REPO / "scripts" / "noop_app") as link:
                out = Path(tmp) / "noop.json"
                link.run({"num-server-rounds": args.sim_rounds, "output": str(out), "payload-floats": n,
                          "min-nodes": cfg.num_parties},
                         num_supernodes=cfg.num_parties)
                got = json.loads(out.read_text())
                assert got["nodes"] == cfg.num_parties, got
                secs = got["seconds"][2:]  # [0] set-up round, [1] first round
                ms = 1000 * sum(secs) / len(secs)
                rows.append({"mode": "no-op Flower round", "ms_per_round": ms, "rounds": args.sim_rounds,
                             "note": f"simulation, {n} float32 each way per node"})
                print(f"no-op Flower round: {ms:.1f} ms/round", flush=True)

    by = {r["mode"]: r["ms_per_round"] for r in rows}
    for r in rows:
        r["x_floor"] = r["ms_per_round"] / by["numpy floor"]
    ratios = {}
    if "flwr run simulation" in by:
        ratios = {"simulation/floor": by["flwr run simulation"] / by["numpy floor"],
                  "simulation/no-op": by["flwr run simulation"] / by["no-op Flower round"],
                  "targets": "simulation/floor <= 3, simulation/no-op <= 1.2"}
    md = (f"Overhead, Adult n = {n}, K = 6, linear, Q = {cfg.local_steps}, float32 wire\n\n"
          + table(rows, ["mode", "ms_per_round", "x_floor", "rounds", "note"])
          + ("\n\n" + ", ".join(f"{k} = {v:.2f}" if isinstance(v, float) else f"{k}: {v}" for k, v in ratios.items())
             if ratios else ""))
    write(args.out, "overhead", {"n": n, "parties": 6, "rows": rows, "ratios": ratios}, md, title="Overhead per round")
    return {"rows": rows, "ratios": ratios}


if __name__ == "__main__":
    main()
