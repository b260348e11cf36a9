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
import contextlib
import io
import json
import logging
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config.run import ConfigError, RunConfig
from fairvfl_flwr.core.models import MODELS
from fairvfl_flwr.core.objective import MEASURES
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.data.tables import DATASETS, load_dataset
from fairvfl_flwr.features.scores import load_scores
from fairvfl_flwr.tools import baselines
from fairvfl_flwr.tools.baselines import EXTRAS_HINT, extras_available
from fairvfl_flwr.tools.flwr_engine import SimulationSuperLink

METHODS = ("fedbcd", "eo", "ceo", "fairvfl", "fairvfl-eo", "fairvfl-dp", "split", "central")
# the constraint-set rows (docs/fairness-constraints.md): method -> (run-config constraint, row tag)
CONSTRAINT_METHODS = {"fairvfl-eo": ("equalized-odds", "EO"), "fairvfl-dp": ("demographic-parity", "DP")}
PAPER_EPSILONS = (0.001, 0.01, 0.05, 0.1, 0.5)
DATASET_TITLES = {"adult": "Adult", "compas": "Compas", "crime": "Crime"}

# The paper's Tables 1 (linear) and 2 (MLP): (ACC %, DFP, DFN) per dataset.
PAPER: dict[str, dict[str, dict[str, tuple[float, float, float]]]] = {
    "linear": {
        "FedBCD": {"adult": (85.06, 0.14, 0.18), "compas": (69.25, 0.14, 0.13), "crime": (88.65, 0.17, 0.27)},
        "FedBCD + EO": {"adult": (73.23, 0.01, 0.04), "compas": (66.73, 0.07, 0.05), "crime": (85.18, 0.07, 0.19)},
        "FedBCD + CEO": {"adult": (79.89, 0.10, 0.14), "compas": (68.20, 0.11, 0.10), "crime": (86.36, 0.13, 0.18)},
        "FairVFL(ε=1e-3)": {"adult": (81.41, 0.01, 0.08), "compas": (66.95, 0.02, 0.02), "crime": (85.50, 0.03, 0.06)},
        "FairVFL(ε=1e-2)": {"adult": (82.11, 0.01, 0.09), "compas": (66.95, 0.03, 0.02), "crime": (85.80, 0.04, 0.04)},
        "FairVFL(ε=5e-2)": {"adult": (82.77, 0.03, 0.12), "compas": (67.78, 0.03, 0.04), "crime": (86.13, 0.04, 0.07)},
        "FairVFL(ε=1e-1)": {"adult": (82.36, 0.07, 0.13), "compas": (68.39, 0.05, 0.07), "crime": (87.14, 0.08, 0.11)},
        "FairVFL(ε=5e-1)": {"adult": (83.08, 0.14, 0.16), "compas": (68.36, 0.11, 0.14), "crime": (88.65, 0.16, 0.27)},
    },
    "mlp": {
        "FedBCD": {"adult": (85.55, 0.14, 0.19), "compas": (70.36, 0.15, 0.13), "crime": (89.65, 0.17, 0.31)},
        "FedBCD + EO": {"adult": (77.23, 0.01, 0.03), "compas": (66.78, 0.08, 0.09), "crime": (86.13, 0.07, 0.14)},
        "FedBCD + CEO": {"adult": (81.39, 0.10, 0.04), "compas": (64.44, 0.11, 0.13), "crime": (88.36, 0.15, 0.07)},
        "FairVFL(ε=1e-3)": {"adult": (81.98, 0.00, 0.11), "compas": (68.41, 0.01, 0.00), "crime": (84.62, 0.01, 0.06)},
        "FairVFL(ε=1e-2)": {"adult": (81.98, 0.01, 0.11), "compas": (68.83, 0.02, 0.03), "crime": (85.87, 0.03, 0.06)},
        "FairVFL(ε=5e-2)": {"adult": (82.17, 0.04, 0.12), "compas": (68.62, 0.03, 0.03), "crime": (86.19, 0.05, 0.05)},
        "FairVFL(ε=1e-1)": {"adult": (82.55, 0.07, 0.13), "compas": (70.29, 0.05, 0.05), "crime": (88.13, 0.08, 0.12)},
        "FairVFL(ε=5e-1)": {"adult": (83.15, 0.14, 0.13), "compas": (70.36, 0.12, 0.12), "crime": (89.01, 0.15, 0.28)},
    },
}
SPLIT_NAME = "Split learning (Flower example)"
CENTRAL_NAME = "Centralised ExpGrad (reference)"


class CompareError(ValueError):
    """A command-line value is unknown or out of range; the message says which."""


def fairvfl_name(eps: float, tag: str = "") -> str:
    """``FairVFL(ε=1e-3)``, as the paper writes it; ``FairVFL-EO(ε=1e-2)`` with ``tag="EO"``."""
    mant, _, exp = f"{eps:.0e}".partition("e")
    name = "FairVFL" + (f"-{tag}" if tag else "")
    return f"{name}(ε={mant}e{int(exp)})" if float(f"{eps:.0e}") == eps else f"{name}(ε={eps:g})"


def method_order(epsilons: list[float], constraint_epsilons: list[float] = ()) -> list[str]:
    return ["FedBCD", "FedBCD + EO", "FedBCD + CEO", *[fairvfl_name(e) for e in sorted(epsilons)],
            *[fairvfl_name(e, _tag(tag, m)) for _, tag in CONSTRAINT_METHODS.values()
              for m in ("rate", *[m for m in MEASURES if m != "rate"])
              for e in sorted(constraint_epsilons)],
            SPLIT_NAME, CENTRAL_NAME]


def _tag(tag: str, measure: str) -> str:
    """Row tag of a constraint-set run: ``EO`` (rate gaps, the default) or ``EO-loss``."""
    return tag if measure == "rate" else f"{tag}-{measure}"


def _constraint_epsilons(records: list[dict]) -> list[float]:
    """The ε of the constraint-set rows present in ``records`` (for the row order)."""
    return sorted({r["epsilon"] for r in records
                   if r.get("epsilon") is not None and r.get("config", {}).get("constraint", "deo") != "deo"})


# -- the plan -------------------------------------------------------------------------
@dataclass
class Job:
    """One training run (or the centralised fit) and the table rows it produces."""

    kind: str  # "train" or "central"
    dataset: str
    model: str
    seed: int
    method: str  # table row name of the run itself
    run_config: dict = field(default_factory=dict)
    post: list[str] = field(default_factory=list)  # post-processing on its scores: "eo", "ceo"
    models: list[str] = field(default_factory=list)  # central: the tables it appears in
    cost: float = 1.0  # relative run time, for the ETA


# rough seconds per 1000 in-process rounds on 2 cores (measured), for the ETA weights
_COST = {("adult", "linear"): 30, ("adult", "mlp"): 90, ("compas", "linear"): 10, ("compas", "mlp"): 25,
         ("crime", "linear"): 12, ("crime", "mlp"): 20}


def plan(datasets, models, epsilons, seeds, methods, base: dict, out: Path,
         constraint_epsilons: list[float] = (0.01,), constraint_measure: str = "rate") -> list[Job]:
    jobs: list[Job] = []
    for seed in seeds:  # seed-major: a sweep cut short still covers every dataset for its first seeds
        for dataset in datasets:
            for model in models:
                rounds = int(base.get("num-server-rounds", RunConfig().num_server_rounds))
                cost = _COST.get((dataset, model), 20) * rounds / 1000

                def cfg(**kw):
                    return {**base, "dataset": dataset, "model": model, "seed": seed,
                            "output-dir": str(out / "runs"), **kw}

                post = [m for m in ("eo", "ceo") if m in methods]
                if "fedbcd" in methods or post:
                    jobs.append(Job("train", dataset, model, seed, "FedBCD",
                                    cfg(fairness=False, mode="fairvfl-scores"), post=post, cost=cost))
                if "fairvfl" in methods:
                    for eps in epsilons:
                        jobs.append(Job("train", dataset, model, seed, fairvfl_name(eps),
                                        cfg(fairness=True, epsilon=eps, mode="fairvfl-scores"), cost=cost))
                for method, (constraint, tag) in CONSTRAINT_METHODS.items():
                    if method in methods:
                        for eps in constraint_epsilons:
                            jobs.append(Job("train", dataset, model, seed,
                                            fairvfl_name(eps, _tag(tag, constraint_measure)),
                                            cfg(fairness=True, epsilon=eps, constraint=constraint,
                                                **{"constraint-measure": constraint_measure},
                                                mode="fairvfl-scores"), cost=cost))
                if "split" in methods:
                    jobs.append(Job("train", dataset, model, seed, SPLIT_NAME,
                                    cfg(fairness=False, mode="split"), cost=cost))
            if "central" in methods:
                jobs.append(Job("central", dataset, "-", seed, CENTRAL_NAME, models=list(models),
                                cost=_COST.get((dataset, "linear"), 10) / 5))
    return jobs


# -- running --------------------------------------------------------------------------
class Progress:
    """A bar over the runs with elapsed time and ETA (cost-weighted); plain lines if not a TTY."""

    def __init__(self, jobs: list[Job], stream=None) -> None:
        self.total = sum(j.cost for j in jobs) or 1.0
        self.n = len(jobs)
        self.done_cost, self.done = 0.0, 0
        self.t0 = time.perf_counter()
        self.stream = stream or sys.stderr

    def update(self, job: Job, note: str) -> None:
        self.done += 1
        self.done_cost += job.cost
        elapsed = time.perf_counter() - self.t0
        frac = self.done_cost / self.total
        eta = elapsed / frac * (1 - frac) if frac > 0 else math.nan
        width = 28
        bar = "#" * int(round(width * frac)) + "-" * (width - int(round(width * frac)))
        print(f"[{bar}] {self.done}/{self.n} {_hms(elapsed)} elapsed, ETA {_hms(eta)} | {note}",
              file=self.stream, flush=True)


def _hms(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


@contextlib.contextmanager
def _quiet(enabled: bool):
    if not enabled:
        yield
        return
    flwr_logger = logging.getLogger("flwr")
    # a filter, not setLevel: Flower code run inside a job may reset the logger's level
    drop_info = _DropBelowWarning()
    flwr_logger.addFilter(drop_info)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        flwr_logger.removeFilter(drop_info)


class _DropBelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


class Engine:
    """Runs one training job and returns its run folder."""

    def __init__(self, kind: str, out: Path) -> None:
        self.kind = kind
        self.link = None
        if kind == "flwr":

            self.link = SimulationSuperLink(out / "flwr-home")

    def run(self, run_config: dict) -> Path:
        if self.kind == "inprocess":

            _, folder = run_inprocess(run_config)
            return Path(folder)
        # flwr: give the run its own output-dir so that its folder is the only one there
        out_dir = Path(run_config["output-dir"]) / f"flwr-{time.strftime('%Y%m%d-%H%M%S')}-{time.perf_counter_ns()}"
        cfg = {**run_config, "output-dir": str(out_dir)}
        self.link.run(cfg, num_supernodes=int(cfg.get("num-parties", RunConfig().num_parties)))
        folders = [p for p in out_dir.iterdir() if p.is_dir()]
        if len(folders) != 1:
            raise RuntimeError(f"expected one run folder in {out_dir}, found {folders}")
        return folders[0]

    def close(self) -> None:
        if self.link is not None:
            self.link.stop()


def _train_records(job: Job, folder: Path, engine: str, seconds: float) -> list[dict]:
    summary = json.loads((folder / "summary.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    base = {"dataset": job.dataset, "model": job.model, "seed": job.seed, "engine": engine,
            "rounds": summary["rounds"], "epsilon": config.get("epsilon") if config.get("fairness") else None,
            "run_dir": str(folder)}
    recs = [{"method": job.method, **base, "acc": summary["test_acc"], "dfp": summary["test_dfp"],
             "dfn": summary["test_dfn"], "train_loss": summary["train_loss"], "train_deo": summary["train_deo"],
             "seconds": seconds, "config": config}]
    return recs + post_records(recs[0], job.post)


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
    for name, label in (("eo", "FedBCD + EO"), ("ceo", "FedBCD + CEO")):
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
                     "train_loss": None, "train_deo": None, "seconds": time.perf_counter() - t,
                     "train_acc": r["train"]["acc"], "train_dfp": r["train"]["dfp"],
                     "train_dfn": r["train"]["dfn"], "config": {**config, **extra}})
    return recs


def _central_records(job: Job, max_iter: int) -> list[dict]:
    ds = load_dataset(job.dataset, job.seed)
    t = time.perf_counter()
    r = baselines.centralised_reference(ds.X_train, ds.y_train, ds.s_train, ds.X_test, ds.y_test, ds.s_test,
                                        ds.protected_label, seed=job.seed, max_iter=max_iter)
    seconds = time.perf_counter() - t
    config = {"dataset": job.dataset, "seed": job.seed, "estimator": "LogisticRegression(max_iter=1000)",
              "reduction": "ExponentiatedGradient", "constraints": "TruePositiveRateParity",
              "positive-class": "protected label", "max-iter": max_iter}
    return [{"method": CENTRAL_NAME, "dataset": job.dataset, "model": m, "seed": job.seed, "engine": "central",
             "rounds": None, "epsilon": None, "run_dir": None, "acc": r["acc"], "dfp": r["dfp"], "dfn": r["dfn"],
             "train_loss": None, "train_deo": None, "seconds": seconds, "config": config} for m in job.models]


def _job_key(r: dict) -> tuple:
    rounds = r.get("rounds") if r["method"] != CENTRAL_NAME else None
    return (r["method"], r["dataset"], r["model"], r["seed"], rounds)


def _job_done(job: Job, done: set) -> bool:
    if job.kind == "central":
        return all((CENTRAL_NAME, job.dataset, m, job.seed, None) in done for m in job.models)
    rounds = int(job.run_config.get("num-server-rounds", RunConfig().num_server_rounds))
    names = [job.method] + [{"eo": "FedBCD + EO", "ceo": "FedBCD + CEO"}[p] for p in job.post]
    return all((n, job.dataset, job.model, job.seed, rounds) in done for n in names)


def run_compare(datasets, models, epsilons, seeds, methods, out: Path, overrides: dict | None = None,
                engine: str = "inprocess", quiet: bool = True, central_iters: int = 50,
                stream=None, resume: bool = False, redo_post: bool = False,
                constraint_epsilons: list[float] = (0.01,), constraint_measure: str = "rate") -> list[dict]:
    """Run the plan, writing results and tables after every job; return all records.

    ``resume``: keep the results already in ``out/results.json`` and run only the jobs
    missing there (same method, dataset, model, seed and number of rounds); the wall time
    reported adds up all sessions. ``redo_post`` (with ``resume``): recompute the EO/CEO
    rows from the saved FedBCD scores (after a change to the post-processing).
    """
    stream = stream or sys.stderr
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # the paper's tables: its gradient steps, unless the caller sets a preset or an optimizer
    jobs = plan(datasets, models, epsilons, seeds, methods, {"preset": "paper", **(overrides or {})}, out,
                constraint_epsilons, constraint_measure)
    progress = Progress(jobs, stream)
    print(f"compare: {len(jobs)} jobs ({sum(j.kind == 'train' for j in jobs)} federated trainings) -> {out}",
          file=stream, flush=True)
    records: list[dict] = []
    prior_wall = 0.0
    if resume and (out / "results.json").exists():
        saved = json.loads((out / "results.json").read_text())
        records, prior_wall = saved["runs"], float(saved.get("wall_seconds") or 0.0)
        done = {_job_key(r) for r in records}
        jobs_left = [j for j in jobs if not _job_done(j, done)]
        print(f"compare: --resume: {len(records)} results already in {out / 'results.json'}, "
              f"{len(jobs) - len(jobs_left)} of {len(jobs)} jobs done", file=stream, flush=True)
        jobs = jobs_left
        progress = Progress(jobs, stream)
        if redo_post:
            post = [m for m in ("eo", "ceo") if m in methods]
            kept = [r for r in records if r["method"] not in ("FedBCD + EO", "FedBCD + CEO")]
            records = []
            for r in kept:
                records.append(r)
                if r["method"] == "FedBCD" and r.get("run_dir"):
                    records += post_records(r, post)
            print(f"compare: --redo-post: EO/CEO recomputed from the saved scores of "
                  f"{sum(r['method'] == 'FedBCD' for r in kept)} FedBCD runs", file=stream, flush=True)
    t0 = time.perf_counter() - prior_wall
    eng = Engine(engine, out) if any(j.kind == "train" for j in jobs) else None
    try:
        for job in jobs:
            started = time.perf_counter()
            if job.kind == "train":
                with _quiet(quiet):
                    folder = eng.run(job.run_config)
                recs = _train_records(job, folder, engine, time.perf_counter() - started)
            else:
                recs = _central_records(job, central_iters)
            records += recs
            note = "; ".join(f"{r['method']} {r['dataset']}/{r['model']} s{r['seed']}: ACC {100 * r['acc']:.2f}% "
                             f"DFP {r['dfp']:.3f} DFN {r['dfn']:.3f}" for r in recs[:1])
            if len(recs) > 1 and job.kind == "train":
                note += " (+" + ", ".join(r["method"] for r in recs[1:]) + ")"
            progress.update(job, note)
            write_outputs(records, out, epsilons, wall=time.perf_counter() - t0, plots=False)
    finally:
        if eng is not None:
            eng.close()
    write_outputs(records, out, epsilons, wall=time.perf_counter() - t0, plots=True)
    return records


# -- outputs --------------------------------------------------------------------------
def _fmt(values: list[float], pct: bool) -> str:
    vals = [100 * v if pct else v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return "n/a"
    d = 2 if pct else 3
    unit = "%" if pct else ""
    if len(vals) == 1:
        return f"{vals[0]:.{d}f}{unit}"
    return f"{statistics.mean(vals):.{d}f} ± {statistics.stdev(vals):.{d}f}{unit}"


def table_markdown(records: list[dict], model: str, epsilons: list[float], datasets: list[str] | None = None,
                   wall: float | None = None) -> str:
    """The paper's layout: rows = methods, columns = ACC/DFP/DFN per dataset; then the paper's table."""
    rows = [r for r in records if r["model"] == model]
    datasets = datasets or [d for d in DATASET_TITLES if any(r["dataset"] == d for r in rows)] or \
        list(dict.fromkeys(r["dataset"] for r in rows))
    title = {"linear": "Table 1 (linear model)", "mlp": "Table 2 (MLP)"}.get(model, model)
    seeds = sorted({r["seed"] for r in rows})
    rounds = sorted({r["rounds"] for r in rows if r.get("rounds")})
    engines = sorted({r["engine"] for r in rows if r["engine"] != "central"})
    header = "| Method | " + " | ".join(f"{DATASET_TITLES.get(d, d)} {c}" for d in datasets
                                        for c in ("ACC", "DFP", "DFN")) + " |"
    sep = "|---|" + "---:|" * (3 * len(datasets))
    lines = [f"### {title}: measured here",
             "",
             f"Mean ± std over {len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({', '.join(map(str, seeds))}); "
             f"{'/'.join(map(str, rounds)) or '-'} rounds; engine: {', '.join(engines) or '-'}"
             + (f"; wall time {_hms(wall)}" if wall is not None else "") + ".",
             "", header, sep]
    present = list(dict.fromkeys(r["method"] for r in rows))
    known = method_order(epsilons, _constraint_epsilons(rows))
    order = [m for m in known if m in present] + [m for m in present if m not in known]
    for method in order:
        cells = []
        for d in datasets:
            sel = [r for r in rows if r["method"] == method and r["dataset"] == d]
            cells += [_fmt([r["acc"] for r in sel], True), _fmt([r["dfp"] for r in sel], False),
                      _fmt([r["dfn"] for r in sel], False)] if sel else ["", "", ""]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    paper = PAPER.get(model)
    if paper:
        lines += ["", f"### {title}: the paper's numbers (for reference)", "", header, sep]
        for method, per in paper.items():
            cells = []
            for d in datasets:
                acc, dfp, dfn = per.get(d, (math.nan,) * 3)
                cells += [f"{acc:.2f}%", f"{dfp:.2f}", f"{dfn:.2f}"]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(records: list[dict], out: Path, epsilons: list[float], wall: float | None = None,
                  plots: bool = True) -> None:
    out = Path(out)
    (out / "results.json").write_text(json.dumps({"wall_seconds": wall, "runs": records}, indent=1,
                                                 default=str) + "\n")
    keys = ["method", "dataset", "model", "seed", "engine", "epsilon", "rounds", "acc", "dfp", "dfn",
            "train_loss", "train_deo", "train_acc", "train_dfp", "train_dfn", "seconds", "run_dir", "config"]
    import csv

    with (out / "results.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(keys)
        for r in records:
            w.writerow([json.dumps(r.get(k), sort_keys=True) if k == "config" else
                        ("" if r.get(k) is None else r.get(k)) for k in keys])
    for model in dict.fromkeys(r["model"] for r in records if r["model"] != "-"):
        (out / f"table_{model}.md").write_text(table_markdown(records, model, epsilons, wall=wall))
        if plots:
            plot_convergence(records, model, out / f"convergence_{model}.png")
            for d in dict.fromkeys(r["dataset"] for r in records if r["model"] == model):
                plot_tradeoff(records, model, d, out / f"tradeoff_{model}_{d}.png", epsilons)


def _history(run_dir: str) -> list[dict]:
    return json.loads((Path(run_dir) / "history.json").read_text())


def plot_convergence(records: list[dict], model: str, path: Path) -> None:
    """L(θ) and DEO(θ) on the training rows against rounds, FedBCD and every ε (first seed).

    Only the paper's DEO runs: the FairVFL-EO / -DP rows constrain other gaps (their
    ``deo`` history column is a rate gap under ``constraint-measure = "rate"``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in records if r["model"] == model and r.get("run_dir") and
            (r["method"] == "FedBCD" or r["method"].startswith("FairVFL("))]
    datasets = list(dict.fromkeys(r["dataset"] for r in runs))
    if not runs:
        return
    seed = min(r["seed"] for r in runs)
    fig, axes = plt.subplots(2, len(datasets), figsize=(4.2 * len(datasets), 6.4), squeeze=False)
    for j, d in enumerate(datasets):
        sel = sorted([r for r in runs if r["dataset"] == d and r["seed"] == seed],
                     key=lambda r: (r["epsilon"] is not None, r["epsilon"] or 0))
        for i, r in enumerate(sel):
            h = _history(r["run_dir"])
            color = "k" if r["method"] == "FedBCD" else f"C{i}"
            label = "FedBCD" if r["method"] == "FedBCD" else rf"$\epsilon$={r['epsilon']:g}"
            rounds = [x["round"] for x in h]
            axes[0, j].plot(rounds, [x["loss"] for x in h], color=color, lw=1.2, label=label)
            deo = [max(x["deo"], 1e-5) for x in h]
            axes[1, j].plot(rounds[1:], deo[1:], color=color, lw=1.2, label=label)
            if r["epsilon"] is not None:
                axes[1, j].axhline(r["epsilon"], color=color, ls=":", lw=0.8)
        axes[0, j].set_title(f"{DATASET_TITLES.get(d, d)} ({model})")
        axes[0, j].set_ylabel(r"$L(\theta)$")
        axes[1, j].set_ylabel(r"DEO($\theta$) (train; dotted: $\epsilon$)")
        axes[1, j].set_yscale("log")
        axes[1, j].set_xlabel("communication round")
    axes[0, -1].legend(fontsize=8)
    fig.suptitle(f"FairVFL(ε) and FedBCD, {model}, seed {seed}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_tradeoff(records: list[dict], model: str, dataset: str, path: Path, epsilons: list[float]) -> None:
    """Accuracy against DFP and against DFN: measured (filled, mean ± std) and paper (hollow)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r["model"] == model and r["dataset"] == dataset]
    methods = [m for m in method_order(epsilons, _constraint_epsilons(rows)) if any(r["method"] == m for r in rows)]
    paper = PAPER.get(model, {})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, (ax, metric) in enumerate(zip(axes, ("dfp", "dfn"))):
        for i, m in enumerate(methods):
            sel = [r for r in rows if r["method"] == m]
            xs, ys = [r[metric] for r in sel], [100 * r["acc"] for r in sel]
            sx = statistics.stdev(xs) if len(xs) > 1 else 0
            sy = statistics.stdev(ys) if len(ys) > 1 else 0
            marker = "o" if m.startswith("FairVFL") else "s"
            ax.errorbar(statistics.mean(xs), statistics.mean(ys), xerr=sx, yerr=sy, fmt=marker, color=f"C{i}",
                        label=m, ms=6, capsize=2)
            if m in paper and dataset in paper[m]:
                acc, dfp, dfn = paper[m][dataset]
                ax.plot(dfp if metric == "dfp" else dfn, acc, marker, mfc="none", color=f"C{i}", ms=8)
        ax.set_xlabel(metric.upper() + " (test)")
        ax.set_ylabel("ACC % (test)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{DATASET_TITLES.get(dataset, dataset)}, {model}: accuracy vs fairness "
                 "(filled: measured, mean ± std; hollow: paper)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- command line ---------------------------------------------------------------------
def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fairvfl_flwr.tools.compare", description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="adult,compas,crime", help="comma list of: " + ", ".join(DATASETS))
    p.add_argument("--models", default="linear,mlp", help="comma list of: " + ", ".join(MODELS))
    p.add_argument("--epsilons", default=",".join(map(str, PAPER_EPSILONS)), help="FairVFL fairness levels ε")
    p.add_argument("--constraint-epsilons", default="0.01",
                   help="ε of the FairVFL-EO / FairVFL-DP rows (methods fairvfl-eo, fairvfl-dp)")
    p.add_argument("--constraint-measure", default="rate", choices=MEASURES,
                   help="what the FairVFL-EO / -DP gaps compare: rate (soft error rates, default) or loss")
    p.add_argument("--seeds", default="3", help="N (seeds 0..N-1) or a comma list like 0,5,7 (one seed k: 'k,')")
    p.add_argument("--methods", default=",".join(METHODS), help="comma list of: " + ", ".join(METHODS))
    p.add_argument("--engine", default="inprocess", choices=("inprocess", "flwr"),
                   help="inprocess: the app's ServerApp/ClientApp over an in-process grid; flwr: `flwr run` "
                        "on a private simulation SuperLink")
    p.add_argument("--rounds", type=int, default=None, help="num-server-rounds for every run (default: the app's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="run-config override for every run, e.g. --set eval-every=100")
    p.add_argument("--central-iters", type=int, default=50, help="ExponentiatedGradient max_iter")
    p.add_argument("--out", type=Path, default=Path("results/compare"))
    p.add_argument("--resume", action="store_true",
                   help="keep the results already in --out and run only the missing jobs")
    p.add_argument("--redo-post", action="store_true",
                   help="with --resume: recompute FedBCD + EO / + CEO from the saved FedBCD scores")
    p.add_argument("--verbose", action="store_true", help="show every run's round log")
    return p.parse_args(argv)


def _validate(a: argparse.Namespace) -> tuple[list[str], list[str], list[float], list[int], list[str], dict]:
    datasets, models, methods = _split(a.datasets), _split(a.models), _split(a.methods)
    for name, vals, known in (("dataset", datasets, tuple(DATASETS)), ("model", models, MODELS),
                              ("method", methods, METHODS)):
        if not vals:
            raise CompareError(f"--{name}s is empty")
        bad = [v for v in vals if v not in known]
        if bad:
            raise CompareError(f"unknown {name} {', '.join(map(repr, bad))}: choose from {', '.join(known)}")
    try:
        epsilons = [float(e) for e in _split(a.epsilons)]
    except ValueError:
        raise CompareError(f"--epsilons {a.epsilons!r}: give numbers, e.g. 0.001,0.01") from None
    if "fairvfl" in methods and not epsilons:
        raise CompareError("--epsilons is empty but method fairvfl is selected")
    if any(e < 0 or not math.isfinite(e) for e in epsilons):
        raise CompareError(f"--epsilons {a.epsilons!r}: every ε must be a finite number >= 0")
    try:
        constraint_epsilons = [float(e) for e in _split(a.constraint_epsilons)]
    except ValueError:
        raise CompareError(f"--constraint-epsilons {a.constraint_epsilons!r}: give numbers, e.g. 0.01") from None
    if set(CONSTRAINT_METHODS) & set(methods) and not constraint_epsilons:
        raise CompareError("--constraint-epsilons is empty but method fairvfl-eo or fairvfl-dp is selected")
    if any(e < 0 or not math.isfinite(e) for e in constraint_epsilons):
        raise CompareError(f"--constraint-epsilons {a.constraint_epsilons!r}: every ε must be a finite number >= 0")
    seeds_text = a.seeds.strip()
    try:
        seeds = list(range(int(seeds_text))) if "," not in seeds_text else [int(s) for s in _split(seeds_text)]
    except ValueError:
        raise CompareError(f"--seeds {a.seeds!r}: give a count N or a comma list of seeds") from None
    if not seeds or any(s < 0 for s in seeds):
        raise CompareError(f"--seeds {a.seeds!r}: give a count N >= 1 (seeds 0..N-1) or a comma list of "
                           "seeds >= 0 (one seed k: 'k,')")
    overrides: dict[str, Any] = {}
    for item in a.set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise CompareError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = value.strip()
    for key in ("dataset", "model", "seed", "fairness", "epsilon", "mode", "output-dir", "constraint",
                "constraint-measure"):
        if key in overrides:
            raise CompareError(f"--set {key}=...: the compare command sets {key} itself")
    if a.rounds is not None:
        overrides["num-server-rounds"] = a.rounds
    if a.redo_post and not a.resume:
        raise CompareError("--redo-post works on the results of an earlier run: add --resume")
    if a.central_iters < 1:
        raise CompareError("--central-iters must be at least 1")
    try:  # check the overrides now, not after an hour of runs
        RunConfig.from_flower({**RunConfig().to_flower(), **overrides})
    except ConfigError as exc:
        raise CompareError(str(exc)) from None
    if {"eo", "ceo", "central"} & set(methods):

        if not extras_available():
            raise CompareError(f"methods eo/ceo/central: {EXTRAS_HINT} (or drop them with --methods)")
    return datasets, models, epsilons, seeds, methods, overrides, constraint_epsilons


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        datasets, models, epsilons, seeds, methods, overrides, constraint_epsilons = _validate(a)
    except CompareError as exc:
        print(f"compare: error: {exc}", file=sys.stderr)
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
    print(f"{len(records)} results in {_hms(wall)} ({wall:.0f} s); written to {a.out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
