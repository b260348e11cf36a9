"""ε read as fairlearn's hard-prediction difference on the training rows (run config
``hard-epsilon``): one in-process app run per packaged dataset × constraint × seed at
ε = 0.02, every other key at its default, and whether each meets ε + 0.005 within 30 rounds.

    python bench/hard_epsilon.py                       # every packaged dataset × DP, EO × seeds 0-2
    python bench/hard_epsilon.py --datasets compas --seeds 0 --off
    python bench/hard_epsilon.py --page                # also writes docs/results/fairness/hard-epsilon.md
    python bench/hard_epsilon.py --datasets adult --seeds 2 --page --keep  # these rows rerun, the page's others kept
    python bench/hard_epsilon.py --page --from-log L   # the page from the JSON lines a run printed to L
    python bench/hard_epsilon.py --page --from-log L --keep-from OLD.json  # rows L lacks from an earlier page

Per run: rounds, how the stop rule moved the smooth rates' bound (tightenings, loosenings,
final bound) and their temperature, the training and test hard gaps of the constraint
(fairlearn's demographic parity or equalized odds difference over the constrained groups),
the smooth training gap and the test accuracy; a run that misses names its cause. ``--off``
adds the run with ``hard-epsilon = false`` (ε bounds the smooth rates) beside each.

Every row names the call that made it (its command and commit); ``--keep`` rebuilds the page from
its committed json, the rows run now replacing theirs, so that the page is made by repository
commands alone and lists them.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, kept_page, made_by, run_of, table, this_command, this_run, write  # noqa: E402
from fairvfl_flwr.app.run import run_inprocess  # noqa: E402
from fairvfl_flwr.tools.results import commit  # noqa: E402

KEY = {"demographic-parity": "dp_diff", "equalized-odds": "eo_diff"}
NAME = "hard-epsilon"
#: the page's order of rows (and the default selection)
DATASETS = ("adult", "compas", "crime", "adult-race", "adult-sex-race", "compas-race")
CONSTRAINTS = ("demographic-parity", "equalized-odds")
#: the options of a call that read rows from other files instead of running them
READ_ELSEWHERE = ("--from-log", "--keep-from")


#: The bar a run is held to: the hard training gap within ε + this, in at most ROUNDS rounds.
SLACK, ROUNDS = 0.005, 30


def one(dataset: str, constraint: str, seed: int, hard: bool, epsilon: float, tmp: str) -> dict:
    summary, _ = run_inprocess({"dataset": dataset, "constraint": constraint, "epsilon": epsilon, "seed": seed,
                                "hard-epsilon": hard, "output-dir": tmp}, quiet=True)
    key = KEY[constraint]
    row = {"dataset": dataset, "constraint": constraint, "seed": seed, "hard-epsilon": "on" if hard else "off",
           "rounds": summary["rounds"], "temperature": summary.get("temperature", 1.0),
           "tightenings": summary.get("tightenings", 0), "loosenings": summary.get("loosenings", 0),
           "smooth bound": summary.get("surrogate_bound", epsilon), "train smooth gap": summary["train_max_gap"],
           "train hard gap": summary[f"train_{key}"], "test hard gap": summary[f"test_{key}"],
           "test acc": summary["test_acc"]}
    met = row["train hard gap"] <= epsilon + SLACK and row["rounds"] <= ROUNDS
    return row | {"met": "yes" if met else "no", "cause": "" if met or not hard else cause(summary, row, epsilon),
                  "run": this_run()}


def key(row: dict) -> tuple:
    return row["dataset"], row["constraint"], row["seed"], row["hard-epsilon"]


def order(row: dict) -> tuple:
    known = row["dataset"] in DATASETS
    return (DATASETS.index(row["dataset"]) if known else len(DATASETS), row["dataset"],
            CONSTRAINTS.index(row["constraint"]), *key(row)[2:])


def run_without_reads(command: str, sha: str) -> str:
    """The call that measured a row which names none (a page or log line written before rows named
    theirs): ``command`` less the options that read rows from other files, at ``sha``. Such a page's
    rows are those its command printed without ``--from-log`` (its notes said so); those it took with
    ``--keep-from`` are not told apart in its json (its notes name them): rerun them to name their call."""
    words, out = shlex.split(command), []
    while words:
        word = words.pop(0)
        if word in READ_ELSEWHERE:
            words = words[1:]
        elif not word.startswith(tuple(f"{o}=" for o in READ_ELSEWHERE)):
            out.append(word)
    return run_of(shlex.join(out), sha)


def page_rows(rows: list[dict], epsilon: float, out: Path) -> list[dict]:
    """``--keep``: the rows of the committed page (read now) that ``rows`` does not hold, each naming
    the call that made it; nothing where the page's ε is not ``epsilon``."""
    previous = kept_page(NAME, out)
    if previous is None:
        return []
    if previous.get("epsilon") != epsilon:
        print(f"[hard-epsilon] not keeping the page's rows: its epsilon {previous.get('epsilon')} is not {epsilon}",
              flush=True)
        return []
    have, made = {key(r) for r in rows}, run_without_reads(previous["command"], previous.get("commit", ""))
    return [{"run": made, **r} for r in previous.get("rows", []) if key(r) not in have]


def cause(summary: dict, row: dict, epsilon: float) -> str:
    """Why a run missed ε + SLACK within ROUNDS rounds, from what its summary says."""
    if row["train hard gap"] <= epsilon + SLACK:
        # each calibration move waits for the run to settle again (stop-window rounds at rest)
        moves = {"tightening": summary.get("tightenings", 0), "raise or loosening": summary.get("loosenings", 0),
                 "sharpening": summary.get("sharpenings", 0)}
        said = ", ".join(f"{k} {what}{'s' if k > 1 else ''}" for what, k in moves.items() if k)
        return (f"met in {row['rounds']} rounds, over {ROUNDS}: {sum(moves.values())} calibration moves of the smooth "
                f"rates ({said}), each waiting for the run to settle again")
    smallest = min((g["train_rows"] for g in (summary.get("groups") or {}).values()), default=0)
    floor = summary.get("smallest_hard_gap", row["train hard gap"])
    said = (f"the smooth rates stopped moving the hard gap at temperature {row['temperature']:g}: smallest "
            f"hard gap {floor:.4f} (training accuracy {100 * summary.get('train_acc_at_smallest_hard_gap', 0):.1f}%)")
    if smallest and 1.0 / smallest > epsilon / 2:
        said += f"; the smallest constrained group has {smallest} training rows (a rate moves in steps of 1/{smallest})"
    return said


def kept_rows(previous: Path, rows: list[dict], args: argparse.Namespace) -> tuple[list[dict], str]:
    """The rows of an earlier page's json (``previous``) within --datasets/--constraints/--seeds that
    ``rows`` does not hold, and that page's commit; nothing where its ε differs from this run's."""
    old = json.loads(previous.read_text())
    if old.get("epsilon") != args.epsilon:
        print(f"[hard-epsilon] not keeping the rows of {previous}: its epsilon {old.get('epsilon')} is not "
              f"{args.epsilon}", flush=True)
        return [], ""
    have = {(r["dataset"], r["constraint"], r["seed"], r["hard-epsilon"]) for r in rows}
    wanted = (set(args.datasets.split(",")), set(args.constraints.split(",")), set(map(int, args.seeds.split(","))))
    kept = [r for r in old.get("rows", []) if (r["dataset"], r["constraint"], r["seed"], r["hard-epsilon"]) not in have
            and r["dataset"] in wanted[0] and r["constraint"] in wanted[1] and r["seed"] in wanted[2]
            and (args.off or r["hard-epsilon"] == "on")]
    return kept, old.get("commit", "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--constraints", default=",".join(CONSTRAINTS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epsilon", type=float, default=0.02)
    ap.add_argument("--off", action="store_true", help="also run each with hard-epsilon = false")
    ap.add_argument("--page", action="store_true", help="write docs/results/fairness/hard-epsilon.md (or into --out)")
    ap.add_argument("--from-log", type=Path, help="the JSON lines an earlier run of this script printed: take "
                    "the rows of --datasets/--constraints/--seeds from it instead of running them")
    ap.add_argument("--keep-from", type=Path, metavar="JSON", help="an earlier page's json: its rows of "
                    "--datasets/--constraints/--seeds that this run does not hold join the page, named with its commit")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where --page writes (and --keep reads) the page")
    ap.add_argument("--keep", action="store_true", help="keep every row of the page that this call does not run "
                    "(its committed json, read when the page is written)")
    args = ap.parse_args(argv)
    unknown = set(args.constraints.split(",")) - set(CONSTRAINTS)
    if unknown:
        ap.error(f"--constraints: {sorted(unknown)} unknown (choose from {', '.join(CONSTRAINTS)})")
    rows = []
    if args.from_log:
        wanted = (set(args.datasets.split(",")), set(args.constraints.split(",")), set(map(int, args.seeds.split(","))))
        printed = run_without_reads(this_command(), commit())
        rows = [{"run": printed, **r} for r in map(json.loads, (line for line in args.from_log.read_text().splitlines()
                                                                if line.startswith("{")))
                if (r["dataset"] in wanted[0] and r["constraint"] in wanted[1] and r["seed"] in wanted[2]
                    and (args.off or r["hard-epsilon"] == "on"))]
    with tempfile.TemporaryDirectory() as tmp:
        for dataset in ([] if args.from_log else args.datasets.split(",")):
            for constraint in args.constraints.split(","):
                for seed in map(int, args.seeds.split(",")):
                    for hard in ((False, True) if args.off else (True,)):
                        rows.append(one(dataset, constraint, seed, hard, args.epsilon, tmp))
                        print(json.dumps(rows[-1]), flush=True)
    kept, kept_commit = kept_rows(args.keep_from, rows, args) if args.keep_from else ([], "")
    if kept:
        made = run_without_reads(json.loads(args.keep_from.read_text()).get("command", ""), kept_commit)
        kept = [{"run": made, **r} for r in kept]
    rows += kept
    rows = sorted(rows + (page_rows(rows, args.epsilon, args.out) if args.keep else []), key=order)
    off = any(r["hard-epsilon"] == "off" for r in rows)
    cols = ["dataset", "constraint", "seed"] + (["hard-epsilon"] if off else []) + [
        "rounds", "temperature", "tightenings", "loosenings", "smooth bound", "train smooth gap", "train hard gap",
        "test hard gap", "test acc", "met", "cause"]
    on = [r for r in rows if r["hard-epsilon"] == "on"]
    met = sum(r["met"] == "yes" for r in on)
    print(f"{met} of {len(on)} runs meet epsilon + {SLACK} on the training rows within {ROUNDS} rounds", flush=True)
    markdown = table(rows, cols)
    if args.page:
        notes = (f"ε = {args.epsilon:g}, every other key at its default (`optimizer = auto`: block Newton). "
                 f"{met} of {len(on)} runs meet ε + {SLACK} on the training rows within {ROUNDS} rounds. ε bounds "
                 "fairlearn's difference of the hard predictions on the training rows: the stop rule calibrates the "
                 "smooth rates' bound (tightenings, loosenings) and sharpens their temperature where the bound stops "
                 "moving the hard gap (docs/fairness-constraints.md, What ε bounds). Hard gaps: the constraint's "
                 "fairlearn difference (demographic parity or equalized odds) over the constrained groups"
                 + ("; `off`: ε bounds the smooth rates (`hard-epsilon = false`)." if off else ".")
                 + (" The rows are those the same command without `--from-log` printed (same commit): run it "
                    "without `--from-log` to measure them again." if args.from_log else "")
                 + (f" Not rerun here, from the page at commit {kept_commit or '?'}: "
                    + "; ".join(f"{r['dataset']} {r['constraint']} seed {r['seed']}" for r in kept) + "." if kept else "")
                 + " " + made_by(r["run"] for r in rows))
        write(args.out, NAME, {"epsilon": args.epsilon, "rows": rows}, markdown,
              title="ε as the hard-prediction difference", notes=notes)
    else:
        print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
