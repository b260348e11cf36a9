"""Rounds to target: how many rounds until test accuracy is within 0.5 points of its final
value and train DEO <= ε + 0.005 (and both stay so), for Q ∈ {1, 2, 5, 10} on Adult.

    python bench/rounds.py [--rounds 1000] [--qs 1,2,5,10] [--preset ""] [--out docs/results]

``--engine floor`` (default) runs the identical round math in one process (numpy, linear
models: core/reference.NumpyFloor; float64 throughout), test metrics every 10 rounds;
``--engine inprocess`` runs the real ServerApp strategy and ClientApp on the in-process
grid (same numbers up to the float32 wire, ~2-3x slower). ``--preset fast`` runs the
same Q values with the ``fast`` preset (fairvfl_flwr/config/presets.py). A run that never meets
the target reports ``rounds_to_target = None``.

``--optimizer newton`` trains with block Newton directions and the server's
subspace line search and dual Newton step (fairvfl_flwr/core/newton.py; Q is unused);
``--optimizer gd,newton --datasets adult,compas,crime --seeds 0,1,2`` compares both:

    python bench/rounds.py --optimizer gd,newton --datasets adult,compas,crime --seeds 0,1,2 \
        --qs 5 --rounds 1000 --newton-rounds 100 --name rounds-newton

``--app`` runs every row (gd and newton) through the real ServerApp and ClientApp on the
in-process grid (app/run.run_inprocess, float32 wire as by default); the table then has no
``final_train_L`` / ``min_weight_n``:

    python bench/rounds.py --app --optimizer gd,newton --datasets adult,compas,crime --seeds 0,1,2 \
        --qs 5 --rounds 1000 --newton-rounds 100 --name rounds-newton-app

``--optimizer adagrad --set "model='mlp'"`` trains MLP parties with AdaGrad steps (docs/adagrad.md),
``--optimizer gd --set "model='mlp'"`` with the paper's; MLP rows run on core/reference.PartyFloor,
the parties' own step code. ``--jobs N`` runs N of the (dataset, seed, optimizer, Q) runs
at a time, one process each; the JSON's MLP rows carry ``curve`` ([round, test acc, train
DEO] per evaluated round):

    python bench/rounds.py --dataset adult --seeds 0,1,2 --qs 5 --set "model='mlp'" --jobs 3 \
        --optimizer adagrad --rounds 100 --name mlp-adult-adagrad-100

``--optimizer newton,newton-secagg`` with ``--app``: block Newton against block Newton under
``privacy.secure-aggregation = true`` (shared step lengths, docs/newton.md):

    python bench/rounds.py --app --optimizer newton,newton-secagg --datasets adult,compas,crime --seeds 0,1,2 \
        --rounds 100 --jobs 1 --name rounds-secnewton-app

Floor rows also give ``final_train_L`` (L(θ) = mean loss + μ/2 ‖θ‖², the objective both
methods minimise under the constraint) and ``min_weight_n`` (n · min_i w_i at the final λ:
negative where the multipliers give some rows a negative weight).
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, page_name, table, write  # noqa: E402
from fairvfl_flwr.core.newton import MEMORY  # noqa: E402
from fairvfl_flwr.tools.cli import RunConfigArgError, parse_run_config  # noqa: E402

ACC_POINTS = 0.5
DEO_SLACK = 0.005
#: every training gap within ε + this: the target of ``rounds_to_gaps`` (issue's acceptance for coupled constraints)
GAP_SLACK = 0.002


def rounds_to_target(history: list[dict], epsilon: float) -> int | None:
    """First evaluated round from which on every evaluated round meets both targets."""
    # acc is NaN off eval rounds (None in a run folder's history.json)
    evals = [r for r in history if r["acc"] is not None and r["acc"] == r["acc"] and r["round"] > 0]
    final = evals[-1]["acc"]
    hit = None
    for r in evals:
        ok = abs(r["acc"] - final) * 100 <= ACC_POINTS and r["max_gap"] <= epsilon + DEO_SLACK
        hit = (hit or r["round"]) if ok else None
    return hit


def rounds_to_gaps(history: list[dict], epsilon: float) -> int | None:
    """First round from which on every round has every training gap <= ε + GAP_SLACK (None: never)."""
    hit = None
    for r in history:
        if r["round"] > 0:
            hit = (hit or r["round"]) if r["max_gap"] <= epsilon + GAP_SLACK else None
    return hit


def run_floor(overrides: dict, optimizer: str = "gd", curvature: str = "nu", memory: int = MEMORY,
              temperature: float = 1.0) -> dict:
    """The same run as the app's, with core/reference.NumpyFloor or NewtonFloor (linear models only).
    ``temperature``: the rate measure's, where a run's stop rule sharpened it (the floor has no stop rule)."""
    import dataclasses

    import numpy as np

    from fairvfl_flwr.core.reference import NewtonFloor, NumpyFloor
    from fairvfl_flwr.data.problem import party_problem
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.core.objective import train_stats
    from fairvfl_flwr.data.problem import party_columns

    t = time.perf_counter()
    cfg = RunConfig.from_flower(overrides)
    ds, blocks, constraint = party_problem(cfg)
    if temperature != 1.0:
        constraint = dataclasses.replace(constraint, temperature=temperature)
    test_blocks = [ds.X_test[:, c] for c in party_columns(cfg, ds)]
    n = len(ds.y_train)
    kw = dict(epsilon=cfg.epsilon, beta=cfg.beta, c=cfg.c, mu=cfg.mu_value(n), lr=cfg.lr, Q=cfg.local_steps,
              active=cfg.num_active, fairness=cfg.fairness)
    if cfg.model == "mlp":
        return _run_party_floor(cfg, ds, blocks, test_blocks, constraint, optimizer, kw, t)
    if optimizer == "newton":
        fl = NewtonFloor(blocks, ds.y_train, constraint, curvature=curvature, memory=memory, **kw)
    else:
        fl = NumpyFloor(blocks, ds.y_train, constraint, **kw)
    history = _floor_history(fl, cfg, ds, constraint,
                             lambda: np.sum([fl._u(k, x) for k, x in enumerate(test_blocks)], axis=0))
    reg = sum(float(th @ th) for th in fl.theta) + sum(b * b for b in fl.bias if b is not None)
    objective = train_stats(ds.y_train, fl.z(), constraint).loss + 0.5 * cfg.mu_value(n) * reg  # L(θ)
    return _floor_result(history, cfg.epsilon, objective, fl.lam, constraint, n, t)


def _floor_result(history: list[dict], eps: float, objective: float, lam, constraint, n: int, started: float) -> dict:
    """A floor run's row: rounds to target, the last round's metrics, L(θ), n · min weight."""
    last = history[-1]
    return {"rounds_to_target": rounds_to_target(history, eps), "final_acc": 100 * last["acc"],
            "final_train_deo": last["deo"], "test_dfp": last["dfp"], "test_dfn": last["dfn"],
            "rounds_to_gaps": rounds_to_gaps(history, eps), "final_max_gap": last["max_gap"],
            "max_gap_curve": [round(r["max_gap"], 5) for r in history],
            "final_train_L": objective, "min_weight_n": float(constraint.signed_weights(lam).min() * n),
            "seconds": time.perf_counter() - started}


def _floor_history(fl, cfg, ds, constraint, z_test) -> list[dict]:
    """The floor's rounds: train DEO every round, test metrics (``z_test()``) on evaluation rounds."""
    from fairvfl_flwr.core.metrics import fairness_metrics
    from fairvfl_flwr.core.objective import train_stats

    history = []
    for r in range(1, cfg.num_server_rounds + 1):
        fl.round()
        stats = train_stats(ds.y_train, fl.z(), constraint)
        row = {"round": r, "deo": abs(stats.gaps[0]), "max_gap": stats.max_gap, "acc": float("nan")}
        if r % cfg.eval_every == 0 or r == cfg.num_server_rounds:
            row.update(fairness_metrics(ds.y_test, ds.s_test, z_test()))
        history.append(row)
    return history


def _run_party_floor(cfg, ds, blocks, test_blocks, constraint, optimizer, kw, started) -> dict:
    """MLP parties (gd or adagrad) in one process: core/reference.PartyFloor, the parties' own step code."""
    import numpy as np

    from fairvfl_flwr.core.reference import PartyFloor
    from fairvfl_flwr.core.objective import train_stats

    fl = PartyFloor(blocks, ds.y_train, constraint, model=cfg.model, hidden=cfg.hidden,
                    step_rule="adagrad" if optimizer == "adagrad" else "",
                    seed=cfg.seed, test_blocks=test_blocks, **kw)
    history = _floor_history(fl, cfg, ds, constraint, lambda: fl.z("test"))
    objective = train_stats(ds.y_train, fl.z(), constraint).loss + 0.5 * kw["mu"] * fl.sq_norm()  # L(θ)
    curve = [[r["round"], r["acc"], r["deo"]] for r in history if r["acc"] == r["acc"]]  # the JSON's evaluated rounds
    hard = constraint.gaps(ds.y_train, fl.z(), hard=True) if cfg.fairness else None  # None: the loss measure
    hard = None if hard is None else float(np.max(np.abs(hard)))
    return {**_floor_result(history, cfg.epsilon, objective, fl.lam, constraint, len(ds.y_train), started),
            "curve": curve, "final_hard_gap": hard}


def run(overrides: dict, tmp: str) -> dict:
    from fairvfl_flwr.app.run import run_inprocess

    t = time.perf_counter()
    summary, folder = run_inprocess({**overrides, "output-dir": tmp}, quiet=True)
    history = json.loads((Path(folder) / "history.json").read_text())
    eps = float(overrides.get("epsilon", 0.01))
    return {"rounds_to_target": rounds_to_target(history, eps), "final_acc": 100 * summary["test_acc"],
            "final_train_deo": summary["train_max_gap"], "test_dfp": summary["test_dfp"], "test_dfn": summary["test_dfn"],
            "rounds_to_gaps": rounds_to_gaps(history, eps),
            "final_max_gap": history[-1]["max_gap"],
            "max_gap_curve": [round(r["max_gap"], 5) for r in history if r["round"] > 0],
            "min_weight_n": _min_weight_n(overrides, history[-1]), "rounds_run": summary.get("rounds"), "round_seconds": history[-1]["seconds"],
            "seconds": time.perf_counter() - t}


def _min_weight_n(overrides: dict, last: dict) -> float | None:
    """n · min_i w_i at a run's last λ (its history's ``lambdas``), from the run's own groups."""
    import numpy as np

    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.data.problem import party_problem

    if "lambdas" not in last:
        return None
    _, _, constraint = party_problem(RunConfig.from_flower(overrides))
    return float(constraint.signed_weights(np.asarray(last["lambdas"], dtype=np.float64)).min() * constraint.n)


def _one(task: tuple, args, tmp: str) -> dict:
    dataset, seed, optimizer, rounds, q, cfg, variant = task
    if args.app:  # newton-secagg: block Newton with privacy.secure-aggregation on
        res = run({**cfg, "optimizer": "newton" if optimizer.startswith("newton") else optimizer},
                  f"{tmp}/{dataset}-{seed}-{optimizer}-q{q}")
    elif optimizer == "newton":
        res = run_floor(cfg, "newton", args.curvature, args.memory)
    elif args.engine == "inprocess":
        res = run({**cfg, "optimizer": optimizer}, f"{tmp}/{dataset}-{seed}-{optimizer}-q{q}")
    else:
        res = run_floor(cfg, optimizer)
    if args.variants and res.get("rounds_to_gaps") is None:
        res["why"] = ("some row weight reached 0 (n·min w < 0.01): the target needs weights below 0"
                      if (res.get("min_weight_n") or 1.0) < 0.01 else "a gap above ε + 0.002 at the end")
    r = {"dataset": dataset, "config": variant, "seed": seed, "optimizer": optimizer, "rounds": rounds,
         "preset": args.preset or "default", "Q": q if q is not None else "-", **res}
    print({k: v for k, v in r.items() if k not in ("curve", "max_gap_curve")}, flush=True)
    return r


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="adult")
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--qs", default="1,2,5,10")
    ap.add_argument("--preset", default="", help="run-config preset (fairvfl_flwr/config/presets.py), e.g. fast")
    ap.add_argument("--set", default="", help="extra run config in flwr run's --run-config syntax, e.g. "
                    "\"eta=50 model='mlp'\"")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--name", type=page_name, default="")
    ap.add_argument("--engine", choices=("floor", "inprocess"), default="floor")
    ap.add_argument("--optimizer", default="gd",
                    help="gd, newton or both (gd,newton); with --app also newton-secagg (newton under secure aggregation)")
    ap.add_argument("--app", action="store_true", help="every run through the ServerApp/ClientApp (in-process grid)")
    ap.add_argument("--datasets", default="", help="several datasets, e.g. adult,compas,crime (overrides --dataset)")
    ap.add_argument("--seeds", default="", help="run-config seeds, e.g. 0,1,2 (default: the run config's)")
    ap.add_argument("--newton-rounds", type=int, default=0, help="rounds of the newton runs (default: --rounds)")
    ap.add_argument("--adagrad-rounds", type=int, default=0, help="rounds of the adagrad runs (default: --rounds)")
    ap.add_argument("--curvature", default="nu", help="newton: what passive parties use for h (exact, nu, const)")
    ap.add_argument("--memory", type=int, default=MEMORY, help="newton: earlier moves per party in the subspace search")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time, one process each")
    ap.add_argument("--variants", default="", help="'|'-separated 'datasets@run-config' cases, each run on its own "
                    "datasets with its own extra config (added to --set), e.g. "
                    "\"adult,crime@constraint='equalized-odds'|compas-race@pool-small-groups=true\"")
    args = ap.parse_args(argv)
    if "newton-secagg" in args.optimizer.split(",") and not args.app:
        ap.error("--optimizer newton-secagg runs through the app: add --app")
    try:
        extra = parse_run_config(args.set)
    except RunConfigArgError as exc:
        ap.error(str(exc))
    datasets = args.datasets.split(",") if args.datasets else [args.dataset]
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [None]
    cases = [(datasets, "", {})]
    if args.variants:
        cases = []
        for v in args.variants.split("|"):
            names, _, conf = v.partition("@")
            try:
                cases.append((names.split(","), conf, parse_run_config(conf)))
            except RunConfigArgError as exc:
                ap.error(f"--variants {v!r}: {exc}")
        datasets = [d for names, _, _ in cases for d in names]
    tasks = []
    for dataset, variant, more in [(d, conf, more) for names, conf, more in cases for d in names]:
        for seed in seeds:
            for optimizer in args.optimizer.split(","):
                qs = [int(x) for x in args.qs.split(",")] if optimizer in ("gd", "adagrad") else [None]
                newtonian = optimizer.startswith("newton")
                rounds = (args.newton_rounds if newtonian else args.adagrad_rounds if optimizer == "adagrad"
                          else 0) or args.rounds
                for q in qs:
                    cfg = {"dataset": dataset, "num-server-rounds": rounds, "eval-every": 10, **extra, **more}
                    if q is not None:
                        cfg["local-steps"] = q
                    if seed is not None:
                        cfg["seed"] = seed
                    if args.preset:
                        cfg["preset"] = args.preset
                    if newtonian or optimizer == "adagrad":
                        cfg["eval-every"] = 1
                    if optimizer == "newton-secagg":
                        cfg["privacy.secure-aggregation"] = True
                    tasks.append((dataset, seed, optimizer, rounds, q, cfg, variant))
    with tempfile.TemporaryDirectory() as tmp:
        one = functools.partial(_one, args=args, tmp=tmp)
        if args.jobs > 1:  # separate processes: each run is single-threaded (bench/common sets one BLAS thread)
            with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
                rows = pool.map(one, tasks, chunksize=1)
        else:
            rows = [one(t) for t in tasks]
    name = args.name or ("rounds" + (f"-{args.preset}" if args.preset else ""))
    md = (f"Rounds to target ({','.join(datasets)}, ε = 0.01: test acc within {ACC_POINTS} points of final and train "
          f"DEO <= ε + {DEO_SLACK}, staying so), {args.rounds} rounds, preset {args.preset or 'default'} {args.set}, engine {'app (in-process grid)' if args.app else args.engine}"
          + (f", newton: {'curvature and memory as the run config sets' if args.app else f'curvature {args.curvature}, memory {args.memory}'}, "
             f"{args.newton_rounds or args.rounds} rounds" if "newton" in args.optimizer else "")
          + (f"; rounds_to_gaps: first round from which every training gap stays <= ε + {GAP_SLACK}, final_max_gap: "
             "the last round's largest training gap" if args.variants else "") + "\n\n"
          + table(rows, ["dataset", *(["config"] if args.variants else []), "seed", "optimizer", "rounds", "preset", "Q",
                         "rounds_run", "rounds_to_target", *(["rounds_to_gaps", "final_max_gap"] if args.variants else []),
                         "final_acc", "final_train_deo", "test_dfp", "test_dfn", "final_train_L",
                         "min_weight_n", *(["why"] if args.variants else []), "round_seconds", "seconds"]))
    write(args.out, name, {"dataset": ",".join(datasets), "seeds": seeds, "optimizer": args.optimizer, "rounds": args.rounds, "extra": extra, "rows": rows}, md,
          title="Rounds until every training gap is within ε + 0.002" if args.variants
          else "Rounds to target: block Newton with and without secure aggregation"
          if "newton-secagg" in args.optimizer.split(",") else "Rounds to target")
    return {"rows": rows}


if __name__ == "__main__":
    main()
