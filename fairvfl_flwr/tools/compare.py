"""Compare FairVFL with its baselines: the paper's Tables 1-2 and Figures 1-2 in one command.

::

    python -m fairvfl_flwr.tools.compare --datasets adult,compas,crime --models linear,mlp \\
        --epsilons 0.001,0.01,0.05,0.1,0.5 --seeds 3 --out results/compare

Methods (``--methods``, default all), every one on the same split, seed and partition:

``fedbcd``   the app with the fairness term off (λ ≡ 0), same Q: FedBCD-style VFL
``eo``       FedBCD + equalized-odds post-processing (fairlearn ThresholdOptimizer)
``ceo``      FedBCD + calibrated equalized odds (aif360 CalibratedEqOddsPostprocessing)
``fairvfl``  FairVFL(ε) for every ``--epsilons`` value
``fairvfl-eo`` FairVFL-EO(ε): the equalized-odds constraint set (both label values) for
             every ``--constraint-epsilons`` value, gaps in ``--constraint-measure``
``fairvfl-dp`` FairVFL-DP(ε): the demographic-parity constraint (all rows), likewise
``split``    split-learning VFL as in Flower's vertical-FL example (``algorithms/split.py``)
``central``  not federated: fairlearn ExponentiatedGradient + TruePositiveRateParity on a
             logistic regression over all columns (model-independent, shown in both tables)

``eo``/``ceo`` post-process the FedBCD run's final scores at the server (``scores.npz``
in its run folder); ``eo``, ``ceo`` and ``central`` need ``pip install -e ".[baselines]"``.

Training runs go through the real ServerApp strategy and ClientApp. ``--engine
inprocess`` (default) carries the messages over the in-process grid; ``--engine flwr``
submits every run to a private simulation SuperLink with ``flwr run`` (Ray; slower per round,
see docs/performance.md). ``tests/test_simulation.py`` checks both give the same numbers.

Writes into ``--out``: ``results.json`` / ``results.csv`` (every run's config and
metrics), ``table_<model>.md`` (the paper's layout, mean ± std over seeds, the paper's
numbers in a second table), ``convergence_<model>.png`` (L(θ) and DEO(θ) against rounds
for FedBCD and every ε: the paper's Figures 1-2), ``tradeoff_<model>_<dataset>.png``
(accuracy against DFP and DFN, paper points hollow) and ``runs/`` (every run folder).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.core.models import MODELS
from fairvfl_flwr.core.constraints import MEASURES
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.data.tables import DATASETS, load_dataset
from fairvfl_flwr.features.final_logits import load_scores
from fairvfl_flwr.tools import baselines
from fairvfl_flwr.tools.baselines import EXTRAS_HINT, extras_available
from fairvfl_flwr.tools.cli import RunConfigArgError, comma_list, parse_run_config
from fairvfl_flwr.tools.compare_methods import (CENTRAL_NAME, CONSTRAINT_METHODS, FEDBCD_NAME, METHODS,
                                                POST_NAMES, SPLIT_NAME, constraint_tag)
from fairvfl_flwr.tools.compare_plots import plot_convergence, plot_tradeoff
from fairvfl_flwr.tools.compare_tables import table_markdown
from fairvfl_flwr.tools.results import publish, this_command, unfiled
from fairvfl_flwr.tools.tasks import ENGINES, SECONDS_PER_1000_ROUNDS, Done, Task, run_tasks
from fairvfl_flwr.tools.paper import PAPER_EPSILONS, fairvfl_name
from fairvfl_flwr.tools.tables import hms

PROG = "fairvfl-compare"
# keys the command sets itself, per run
OWN_KEYS = ("dataset", "model", "seed", "fairness", "epsilon", "mode", "output-dir", "constraint",
            "constraint-measure")


class CompareError(ValueError):
    """A command-line value is unknown or out of range; the message says which."""


# -- the plan -------------------------------------------------------------------------
@dataclass
class Row:
    """What one task puts in the tables: its own row and those derived from it."""

    method: str  # table row name of the run itself
    dataset: str
    model: str  # "-" for the centralised fit, which appears in every model's table
    seed: int
    post: list[str] = field(default_factory=list)  # post-processing of its scores: "eo", "ceo"
    models: list[str] = field(default_factory=list)  # central: the tables it appears in


def plan(datasets, models, epsilons, seeds, methods, base: dict, out: Path,
         constraint_epsilons: list[float] = (0.01,), constraint_measure: str = "rate",
         central_iters: int = 50) -> list[Task]:
    tasks: list[Task] = []
    for seed in seeds:  # seed-major: a sweep cut short still covers every dataset for its first seeds
        for dataset in datasets:
            for model in models:
                def train(method: str, post=(), **kw) -> Task:
                    cfg = {**base, "dataset": dataset, "model": model, "seed": seed,
                           "output-dir": str(out / "runs"), **kw}
                    return Task(run_config=cfg, data=Row(method, dataset, model, seed, post=list(post)))

                post = [m for m in POST_NAMES if m in methods]
                if "fedbcd" in methods or post:
                    tasks.append(train(FEDBCD_NAME, post, fairness=False, mode="fairvfl-scores"))
                if "fairvfl" in methods:
                    tasks += [train(fairvfl_name(eps), fairness=True, epsilon=eps, mode="fairvfl-scores")
                             for eps in epsilons]
                for method, (constraint, tag) in CONSTRAINT_METHODS.items():
                    if method in methods:
                        tasks += [train(fairvfl_name(eps, constraint_tag(tag, constraint_measure)), fairness=True,
                                       epsilon=eps, constraint=constraint, mode="fairvfl-scores",
                                       **{"constraint-measure": constraint_measure})
                                 for eps in constraint_epsilons]
                if "split" in methods:
                    tasks.append(train(SPLIT_NAME, fairness=False, mode="split"))
            if "central" in methods:
                row = Row(CENTRAL_NAME, dataset, "-", seed, models=list(models))
                tasks.append(Task(work=partial(_central_records, row, central_iters), data=row,
                                cost=SECONDS_PER_1000_ROUNDS.get((dataset, "linear"), 10) / 5))
    return tasks


# -- records --------------------------------------------------------------------------
def _train_records(row: Row, done: Done, engine: str) -> list[dict]:
    summary = done.summary
    config = json.loads((done.folder / "config.json").read_text())
    base = {"dataset": row.dataset, "model": row.model, "seed": row.seed, "engine": engine,
            "rounds": summary["rounds"], "epsilon": config.get("epsilon") if config.get("fairness") else None,
            "run_dir": str(done.folder)}
    recs = [{"method": row.method, **base, "acc": summary["test_acc"], "dfp": summary["test_dfp"],
             "dfn": summary["test_dfn"], "train_loss": summary["train_loss"], "train_max_gap": summary["train_max_gap"],
             "seconds": done.seconds, "config": config}]
    return recs + post_records(recs[0], row.post)


def post_records(fedbcd: dict, post: list[str]) -> list[dict]:
    """FedBCD + EO / + CEO from a FedBCD record's saved scores (its run folder's ``scores.npz``)."""
    if not post:
        return []
    config = fedbcd["config"]
    ds = load_data(RunConfig.from_run_folder(config))
    z_train, z_test = load_scores(Path(fedbcd["run_dir"]))
    args = (z_train, ds.y_train, ds.s_train, z_test, ds.y_test, ds.s_test)
    base = {k: fedbcd[k] for k in ("dataset", "model", "seed", "engine", "rounds", "epsilon", "run_dir")}
    recs = []
    for name, label in POST_NAMES.items():
        if name not in post:
            continue
        t = time.perf_counter()
        if name == "eo":
            r = baselines.eo_postprocess(*args, seed=fedbcd["seed"])
            extra = {"post-processing": "eo", "constraints": "equalized_odds"}
        else:
            r = baselines.ceo_postprocess(*args, seed=fedbcd["seed"], protected_label=ds.protected_label)
            extra = {"post-processing": "ceo", "cost_constraint": r["cost_constraint"]}
        recs.append({"method": label, **base, "acc": r["acc"], "dfp": r["dfp"], "dfn": r["dfn"],
                     "train_loss": None, "train_max_gap": None, "seconds": time.perf_counter() - t,
                     "train_acc": r["train"]["acc"], "train_dfp": r["train"]["dfp"],
                     "train_dfn": r["train"]["dfn"], "config": {**config, **extra}})
    return recs


def _central_records(row: Row, max_iter: int) -> list[dict]:
    ds = load_dataset(row.dataset, row.seed, sensitive_as_input=True)  # the paper's recipe, as its FairVFL rows
    t = time.perf_counter()
    r = baselines.centralised_reference(ds.X_train, ds.y_train, ds.s_train, ds.X_test, ds.y_test, ds.s_test,
                                        ds.protected_label, seed=row.seed, max_iter=max_iter)
    seconds = time.perf_counter() - t
    config = {"dataset": row.dataset, "seed": row.seed, "estimator": "LogisticRegression(max_iter=1000)",
              "reduction": "ExponentiatedGradient", "constraints": "TruePositiveRateParity",
              "positive-class": "protected label", "max-iter": max_iter}
    return [{"method": CENTRAL_NAME, "dataset": row.dataset, "model": m, "seed": row.seed, "engine": "central",
             "rounds": None, "epsilon": None, "run_dir": None, "acc": r["acc"], "dfp": r["dfp"], "dfn": r["dfn"],
             "train_loss": None, "train_max_gap": None, "seconds": seconds, "config": config} for m in row.models]


def _record_key(r: dict) -> tuple:
    rounds = r.get("rounds") if r["method"] != CENTRAL_NAME else None
    return (r["method"], r["dataset"], r["model"], r["seed"], rounds)


def _task_done(task: Task, done: set) -> bool:
    row = task.data
    if task.run_config is None:
        return all((CENTRAL_NAME, row.dataset, m, row.seed, None) in done for m in row.models)
    rounds = int(task.run_config.get("num-server-rounds", RunConfig().num_server_rounds))
    names = [row.method] + [POST_NAMES[p] for p in row.post]
    return all((n, row.dataset, row.model, row.seed, rounds) in done for n in names)


# -- running --------------------------------------------------------------------------
def run_compare(datasets, models, epsilons, seeds, methods, out: Path, overrides: dict | None = None,
                engine: str = "inprocess", quiet: bool = True, central_iters: int = 50,
                stream=None, resume: bool = False, redo_post: bool = False,
                constraint_epsilons: list[float] = (0.01,), constraint_measure: str = "rate",
                link=None) -> list[dict]:
    """Run the plan, writing results and tables after every task; return all records.

    ``link``: with ``engine="flwr"``, a SimulationSuperLink already running to submit the
    runs to (left running) instead of one started for this comparison.

    ``resume``: keep the results already in ``out/results.json`` and run only the tasks
    missing there (same method, dataset, model, seed and number of rounds); the wall time
    reported adds up all sessions. ``redo_post`` (with ``resume``): recompute the EO/CEO
    rows from the saved FedBCD scores (after a change to the post-processing).
    """
    stream = stream or sys.stderr
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # the paper's tables: its gradient steps, unless the caller sets a preset or an optimizer
    tasks = plan(datasets, models, epsilons, seeds, methods, {"preset": "paper", **(overrides or {})}, out,
                constraint_epsilons, constraint_measure, central_iters)
    print(f"compare: {len(tasks)} tasks ({sum(j.run_config is not None for j in tasks)} federated trainings) -> {out}",
          file=stream, flush=True)
    records: list[dict] = []
    prior_wall = 0.0
    if resume and (out / "results.json").exists():
        saved = json.loads((out / "results.json").read_text())
        records, prior_wall = saved["runs"], float(saved.get("wall_seconds") or 0.0)
        done = {_record_key(r) for r in records}
        tasks_left = [j for j in tasks if not _task_done(j, done)]
        print(f"compare: --resume: {len(records)} results already in {out / 'results.json'}, "
              f"{len(tasks) - len(tasks_left)} of {len(tasks)} tasks done", file=stream, flush=True)
        tasks = tasks_left
        if redo_post:
            post = [m for m in POST_NAMES if m in methods]
            kept = [r for r in records if r["method"] not in POST_NAMES.values()]
            records = []
            for r in kept:
                records.append(r)
                if r["method"] == FEDBCD_NAME and r.get("run_dir"):
                    records += post_records(r, post)
            print(f"compare: --redo-post: EO/CEO recomputed from the saved scores of "
                  f"{sum(r['method'] == FEDBCD_NAME for r in kept)} FedBCD runs", file=stream, flush=True)
    t0 = time.perf_counter() - prior_wall

    def keep(done: Done) -> str:
        recs = done.value if done.task.run_config is None else _train_records(done.task.data, done, engine)
        records.extend(recs)
        write_outputs(records, out, epsilons, wall=time.perf_counter() - t0, plots=False)
        r = recs[0]
        note = f"{r['method']} {r['dataset']}/{r['model']} s{r['seed']}: ACC {100 * r['acc']:.2f}% " \
               f"DFP {r['dfp']:.3f} DFN {r['dfn']:.3f}"
        if len(recs) > 1 and done.task.run_config is not None:
            note += " (+" + ", ".join(r["method"] for r in recs[1:]) + ")"
        return note

    run_tasks(tasks, keep, engine=engine, home=out / "flwr-home", quiet=quiet, stream=stream, link=link)
    write_outputs(records, out, epsilons, wall=time.perf_counter() - t0, plots=True)
    return records


CSV_KEYS = ("method", "dataset", "model", "seed", "engine", "epsilon", "rounds", "acc", "dfp", "dfn",
            "train_loss", "train_max_gap", "train_acc", "train_dfp", "train_dfn", "seconds", "run_dir", "config")


def write_outputs(records: list[dict], out: Path, epsilons: list[float], wall: float | None = None,
                  plots: bool = True) -> None:
    """results.json, results.csv, a table per model and, with ``plots``, the figures."""
    out = Path(out)
    (out / "results.json").write_text(json.dumps({"wall_seconds": wall, "runs": records}, indent=1,
                                                 default=str) + "\n")
    with (out / "results.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_KEYS)
        for r in records:
            w.writerow([json.dumps(r.get(k), sort_keys=True) if k == "config" else
                        ("" if r.get(k) is None else r.get(k)) for k in CSV_KEYS])
    for model in dict.fromkeys(r["model"] for r in records if r["model"] != "-"):
        (out / f"table_{model}.md").write_text(table_markdown(records, model, epsilons, wall=wall))
        if plots:
            plot_convergence(records, model, out / f"convergence_{model}.png")
            for d in dict.fromkeys(r["dataset"] for r in records if r["model"] == model):
                plot_tradeoff(records, model, d, out / f"tradeoff_{model}_{d}.png", epsilons)


# -- command line ---------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="adult,compas,crime", help="comma list of: " + ", ".join(DATASETS))
    p.add_argument("--models", default="linear,mlp", help="comma list of: " + ", ".join(MODELS))
    p.add_argument("--epsilons", default=",".join(map(str, PAPER_EPSILONS)),
                   help="FairVFL fairness levels ε, comma list (default: the paper's)")
    p.add_argument("--constraint-epsilons", default="0.01",
                   help="ε of the FairVFL-EO / FairVFL-DP rows (methods fairvfl-eo, fairvfl-dp)")
    p.add_argument("--constraint-measure", default="rate", choices=MEASURES,
                   help="what the FairVFL-EO / -DP gaps compare: rate (soft error rates, default) or loss")
    p.add_argument("--seeds", default="3", help="N (seeds 0..N-1) or a comma list like 0,5,7 (one seed k: 'k,')")
    p.add_argument("--methods", default=",".join(METHODS), help="comma list of: " + ", ".join(METHODS))
    p.add_argument("--engine", default="inprocess", choices=ENGINES,
                   help="inprocess: the app's ServerApp/ClientApp over an in-process grid; flwr: `flwr run` "
                        "on a private simulation SuperLink")
    p.add_argument("--rounds", type=int, default=None, help="num-server-rounds for every run (default: the app's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="run-config override for every run in flwr run's --run-config syntax, e.g. "
                        "--set eval-every=100 --set \"optimizer='newton'\" (repeatable)")
    p.add_argument("--central-iters", type=int, default=50, help="ExponentiatedGradient max_iter")
    p.add_argument("--out", type=Path, default=Path("results/compare"), help="folder for results, tables, plots")
    p.add_argument("--results", type=Path, default=None, metavar="DIR",
                   help="also publish the table as DIR/<--out's folder name>.md with this command "
                        "(docs/results refreshes the docs' results page)")
    p.add_argument("--resume", action="store_true",
                   help="keep the results already in --out and run only the missing tasks")
    p.add_argument("--redo-post", action="store_true",
                   help="with --resume: recompute FedBCD + EO / + CEO from the saved FedBCD scores")
    p.add_argument("--verbose", action="store_true", help="show every run's round log")
    return p


def _epsilons(option: str, text: str, example: str) -> list[float]:
    try:
        values = [float(e) for e in comma_list(text)]
    except ValueError:
        raise CompareError(f"{option} {text!r}: give numbers, e.g. {example}") from None
    if any(e < 0 or not math.isfinite(e) for e in values):
        raise CompareError(f"{option} {text!r}: every ε must be a finite number >= 0")
    return values


def _validate(a: argparse.Namespace) -> tuple[list[str], list[str], list[float], list[int], list[str], dict,
                                              list[float]]:
    datasets, models, methods = comma_list(a.datasets), comma_list(a.models), comma_list(a.methods)
    for name, vals, known in (("dataset", datasets, tuple(DATASETS)), ("model", models, MODELS),
                              ("method", methods, METHODS)):
        if not vals:
            raise CompareError(f"--{name}s is empty")
        bad = [v for v in vals if v not in known]
        if bad:
            raise CompareError(f"unknown {name} {', '.join(map(repr, bad))}: choose from {', '.join(known)}")
    epsilons = _epsilons("--epsilons", a.epsilons, "0.001,0.01")
    if "fairvfl" in methods and not epsilons:
        raise CompareError("--epsilons is empty but method fairvfl is selected")
    constraint_epsilons = _epsilons("--constraint-epsilons", a.constraint_epsilons, "0.01")
    if set(CONSTRAINT_METHODS) & set(methods) and not constraint_epsilons:
        raise CompareError("--constraint-epsilons is empty but method fairvfl-eo or fairvfl-dp is selected")
    seeds_text = a.seeds.strip()
    try:
        seeds = list(range(int(seeds_text))) if "," not in seeds_text else [int(s) for s in comma_list(seeds_text)]
    except ValueError:
        raise CompareError(f"--seeds {a.seeds!r}: give a count N or a comma list of seeds") from None
    if not seeds or any(s < 0 for s in seeds):
        raise CompareError(f"--seeds {a.seeds!r}: give a count N >= 1 (seeds 0..N-1) or a comma list of "
                           "seeds >= 0 (one seed k: 'k,')")
    try:
        overrides: dict[str, Any] = parse_run_config(a.set)
    except RunConfigArgError as exc:
        raise CompareError(str(exc)) from None
    for key in OWN_KEYS:
        if key in overrides:
            raise CompareError(f"--set {key}=...: the compare command sets {key} itself")
    if a.rounds is not None:
        overrides["num-server-rounds"] = a.rounds
    if a.results is not None:
        for model in models:
            if why := unfiled(f"{a.out.name}-{model}", a.results):
                raise CompareError(why)
    if a.redo_post and not a.resume:
        raise CompareError("--redo-post works on the results of an earlier run: add --resume")
    if a.central_iters < 1:
        raise CompareError("--central-iters must be at least 1")
    try:  # check the overrides now, not after an hour of runs
        RunConfig.from_flower({**RunConfig().to_flower(), **overrides})
    except ConfigError as exc:
        raise CompareError(str(exc)) from None
    if {"eo", "ceo", "central"} & set(methods) and not extras_available():
        raise CompareError(f"methods eo/ceo/central: {EXTRAS_HINT} (or drop them with --methods)")
    return datasets, models, epsilons, seeds, methods, overrides, constraint_epsilons


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        datasets, models, epsilons, seeds, methods, overrides, constraint_epsilons = _validate(a)
    except CompareError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    records = run_compare(datasets, models, epsilons, seeds, methods, a.out, overrides, engine=a.engine,
                          quiet=not a.verbose, central_iters=a.central_iters, resume=a.resume,
                          redo_post=a.redo_post, constraint_epsilons=constraint_epsilons,
                          constraint_measure=a.constraint_measure)
    wall = time.perf_counter() - t0
    for model in models:
        path = a.out / f"table_{model}.md"
        if path.exists():
            print(path.read_text())
            if a.results is not None:
                runs = [r for r in records if r["model"] in (model, "-")]
                publish(f"{a.out.name}-{model}", this_command(), {"wall_seconds": wall, "runs": runs},
                        path.read_text(), title=f"FairVFL against its baselines ({model})", out=a.results)
    print(f"{len(records)} results in {hms(wall)} ({wall:.0f} s); written to {a.out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
