"""Parity constraints under block Newton: rounds until the largest training gap is within
ε + 0.002, and the hard test metrics fairlearn reports, one in-process app run per line.

    python bench/parity_rounds.py                      # the rows of docs/newton.md, "Rates"
    python bench/parity_rounds.py --runs '[{"dataset": "compas", "constraint": "demographic-parity"}]'
    python bench/parity_rounds.py --table              # docs/results/rounds/parity-rounds.md
    python bench/parity_rounds.py --table --datasets compas,crime --seeds 0   # a subset (the page says so)

``--table`` runs the rounds table under ``optimizer = "auto"`` (at most 30 rounds): the
five datasets (adult, compas, crime with two groups; compas-race and adult-sex-race with
the small groups pooled) × equalized odds and demographic parity (and ``deo`` with several
groups, and compas-race equalized odds in the overall form) × seeds 0-2, and writes
docs/results/rounds/parity-rounds.md with every run's rounds, the round from which every gap is
within ε + 0.002 (or the miss and its last gap), and the test figures. A subset
(``--datasets``, ``--seeds``, ``--kinds``) writes the same page, saying it is one. The page
is written after every run, and a run keeps the rows of the page (``--name``) it does not
rerun (:func:`kept_rows`); each row names the commit it was measured at.

Each run is the ServerApp and ClientApp over the in-process grid (app/run.run_inprocess)
with ``optimizer = "newton"``, at most 30 rounds and test metrics every 5, unless the run
config given says otherwise. Prints one JSON object per run: the optimizer used, the
rounds run (the stop rule may end a run sooner), the first round from which every gap
stays within ε + 0.002, the last training max gap, and the test accuracy, DFP, DFN and
fairlearn's demographic parity and equalized odds differences.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, page, page_name, table, write  # noqa: E402
from bench.rounds import GAP_SLACK, rounds_to_gaps  # noqa: E402
from fairvfl_flwr.tools.results import commit  # noqa: E402

BASE = {"optimizer": "newton", "num-server-rounds": 30, "eval-every": 5}
RUNS = [
    *({"dataset": "compas", "constraint": "demographic-parity", "epsilon": 0.02, "seed": s} for s in (0, 1, 2)),
    {"dataset": "compas", "constraint": "equalized-odds"},
    {"dataset": "crime", "constraint": "demographic-parity"},
    {"dataset": "crime", "constraint": "equalized-odds"},
    {"dataset": "adult", "constraint": "demographic-parity"},
    {"dataset": "adult", "constraint": "equalized-odds"},
    {"dataset": "compas-race", "constraint": "equalized-odds", "epsilon": 0.02, "pool-small-groups": True,
     "num-parties": 3},
]


#: the rounds table: (dataset, run config) per kind; compas-race without race has too few
#: columns for 6 parties, so it runs with 3
TABLE_DATASETS = {
    "adult": {}, "compas": {}, "crime": {},
    "compas-race": {"pool-small-groups": True, "num-parties": 3},
    "adult-sex-race": {"pool-small-groups": True},
}
TABLE_KINDS = {
    "equalized-odds": {"constraint": "equalized-odds"},
    "demographic-parity": {"constraint": "demographic-parity"},
    "deo": {"constraint": "deo"},
    "equalized-odds-overall": {"constraint": "equalized-odds", "constraint-form": "overall"},
}
SEVERAL = ("compas-race", "adult-sex-race")


def table_runs(datasets, kinds, seeds) -> list[dict]:
    """The rounds table's run configs: ``deo`` and the overall form only with several groups
    (two-group deo is docs/results/rounds/rounds-newton-app.md's)."""
    out = []
    for ds in datasets:
        for kind in kinds:
            if kind in ("deo", "equalized-odds-overall") and ds not in SEVERAL:
                continue
            if kind == "equalized-odds-overall" and ds != "compas-race":
                continue
            for seed in seeds:
                out.append({"dataset": ds, **TABLE_DATASETS[ds], **TABLE_KINDS[kind], "optimizer": "auto",
                            "seed": seed})
    return out


def table_row(res: dict) -> dict:
    """A result as a row of the page: the round from which every gap stays within ε + 0.002,
    or the miss named with the last largest gap."""
    rc = res["run"]
    eps = rc.get("epsilon", 0.01)
    reached = (f"round {res['within_from']}" if res["within_from"] is not None
               else f"missed: max gap {res['train_max_gap']} > {eps + GAP_SLACK:g} after {res['rounds']} rounds")
    return {"dataset": rc["dataset"], "constraint": rc["constraint"], "form": rc.get("constraint-form", "pairwise"),
            "seed": rc.get("seed", 0), "gaps": res["gaps"], "optimizer": res["optimizer"], "measure": res["measure"],
            "rounds": res["rounds"], "within eps + 0.002 from": reached, "train max gap": res["train_max_gap"],
            "test ACC %": res["test_acc"], "test DP diff": res["dp_diff"], "test EO diff": res["eo_diff"],
            "commit": res.get("commit", "")}


def row_key(row: dict) -> tuple:
    """Where a row (or a run config of :func:`table_runs`) sits in the table: dataset, kind,
    seed, in the order :func:`table_runs` runs them."""
    form = row.get("form", row.get("constraint-form", "pairwise"))
    kind = "equalized-odds-overall" if form == "overall" else row["constraint"]
    datasets, kinds = list(TABLE_DATASETS), list(TABLE_KINDS)
    return (datasets.index(row["dataset"]) if row["dataset"] in datasets else len(datasets),
            kinds.index(kind) if kind in kinds else len(kinds), row["dataset"], kind, row.get("seed", 0))


def kept_rows(previous: Path, runs: list[dict]) -> list[dict]:
    """The rows of the page ``previous`` (its json) that none of ``runs`` reruns, each with the
    commit it was measured at (the page's, for a row written before rows carried their own)."""
    if not previous.exists():
        return []
    old = json.loads(previous.read_text())
    rerun = {row_key(r) for r in runs}
    return [{**row, "commit": row.get("commit") or old.get("commit", "")} for row in old.get("rows", [])
            if row_key(row) not in rerun]


def run(overrides: dict) -> dict:
    from fairvfl_flwr.app.run import run_inprocess
    from fairvfl_flwr.config import RunConfig

    rc = {**BASE, **overrides}
    cfg = RunConfig.from_flower(rc)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summary, folder = run_inprocess({**rc, "output-dir": tmp}, quiet=True)
        history = json.loads((Path(folder) / "history.json").read_text())
    return {"run": overrides, "optimizer": cfg.optimizer_in_use, "measure": cfg.measure, "rounds": summary["rounds"],
            "gaps": len(history[-1]["gaps"]),
            "within_from": rounds_to_gaps(history, cfg.epsilon), "train_max_gap": round(summary["train_max_gap"], 4),
            "max_gap_by_round": [round(h["max_gap"], 4) for h in history],
            "test_acc": round(100 * summary["test_acc"], 2),
            **{k: round(summary[f"test_{k}"], 3) for k in ("dfp", "dfn", "dp_diff", "eo_diff")},
            "seconds": round(time.perf_counter() - t, 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=None, help="a JSON list of run configs (default: the docs' rows)")
    p.add_argument("--table", action="store_true", help="the rounds table (docs/results/rounds/parity-rounds.md)")
    p.add_argument("--datasets", default=",".join(TABLE_DATASETS), help="--table: datasets")
    p.add_argument("--kinds", default=",".join(TABLE_KINDS), help="--table: " + ", ".join(TABLE_KINDS))
    p.add_argument("--seeds", default="0,1,2", help="--table: seeds")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="--table: where the page goes")
    p.add_argument("--name", type=page_name, default="parity-rounds", help="--table: the page's name (a subset's own page)")
    args = p.parse_args(argv)
    if not args.table:
        for overrides in json.loads(args.runs) if args.runs else RUNS:
            print(json.dumps(run(overrides)), flush=True)
        return
    datasets, kinds = args.datasets.split(","), args.kinds.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = table_runs(datasets, kinds, seeds)
    rows = kept_rows(page(args.name, args.out).with_suffix(".json"), runs)
    sha = commit()  # the code this process runs, whatever lands while it does
    every = {row_key(r) for r in table_runs(list(TABLE_DATASETS), list(TABLE_KINDS), [0, 1, 2])}
    for i, overrides in enumerate(runs):
        res = run(overrides)
        print(json.dumps(res), flush=True)
        rows.append(table_row({**res, "commit": sha}))
        rows.sort(key=row_key)
        md = table(rows, list(rows[-1]))
        whole = every <= {row_key(r) for r in rows}
        missing = [f"{r['dataset']} {r['constraint']}{' overall' if r.get('constraint-form') else ''} seed {r['seed']}"
                   for r in runs[i + 1:]]
        write(Path(args.out), args.name, {"rows": rows}, md, title="Rounds to epsilon under optimizer='auto'",
              notes="In-process app, linear, the defaults otherwise (epsilon 0.01, the sensitive attribute not an "
                    "input), at most 30 rounds, test metrics every 5 rounds. 'within' is the first round from which "
                    "every training gap (in the constraint's measure: soft rates for equalized odds and demographic "
                    "parity, the loss for deo) stays <= epsilon + 0.002. 'commit': the commit a row was measured at."
                    + ("" if whole else " A subset of the table; all of it: python bench/parity_rounds.py --table.")
                    + ("" if not missing else " Not yet run: " + ", ".join(missing) + "."))


if __name__ == "__main__":
    main()
