"""MLP parties under ``optimizer = "auto"``: rounds to the target and to the stop, per dataset ×
constraint × seed, with a 1,000-round reference beside them.

    python bench/mlp_rounds.py --page                        # adult, compas, crime × deo, dp, eo, groups × seeds 0-2
    python bench/mlp_rounds.py --datasets compas --constraints deo,eo --seeds 0
    python bench/mlp_rounds.py --masked --page               # each run also under secure aggregation
    python bench/mlp_rounds.py --reference adagrad --page    # each run also 1,000 reference rounds
    python bench/mlp_rounds.py --constraints dp,eo --matched --keep --page   # + the reference held as the run ended

Each run is the in-process app with every key at its default but the dataset, constraint and
seed (``model = "mlp"``, ε = 0.01, ``hard-epsilon`` on for the rates), evaluated every round.
Per run: the optimizer ``auto`` chose; ``to target``, the first round from which every training
gap stays within ε + 0.002 up to the stop (the hard-prediction gaps where ε bounds them, a rate
constraint's under ``hard-epsilon``; else the smooth gaps of the run's measure); ``stop``, the
round training ended; seconds; test accuracy; the final smooth gap, and the hard gap and whether
it met ε (within 0.001) where ε bounds it. ``groups`` is the dataset's several-groups variant
(``compas-race``, ``adult-race``: every race, pairwise DEO); Crime has none.

``--masked``: the same run under ``privacy.secure-aggregation = true`` (shared step lengths,
sums only): its stop round and test accuracy. ``--reference OPT``: the same run config trained
by ``OPT`` (adagrad or gd) for ``--reference-rounds`` rounds with the stop rule off, on the
one-process floor (core/reference.PartyFloor: the parties' own step code; bench/rounds.py),
which has no hard-gap target (ε bounds its smooth gaps); ``Δacc`` is the run's test accuracy
minus the reference's, in points. ``--matched``: for a rate constraint's run, whose stop rule moved
the smooth gaps' bound (and the rates' temperature) until the hard gap met ε, the reference again
at that final bound and temperature, so that both hold the same constraint (``Δacc matched``).
``--keep`` keeps the page's rows of the runs not run this time (and the reference or masked
columns a row has but this call did not compute; a row whose plain run this call makes again
without ``--masked`` drops its masked columns, which an earlier
call's code made).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, REPO, kept_page, made_by, page, run_of, table, this_run, write  # noqa: E402
from bench.rounds import GAP_SLACK, rounds_to_gaps, run_floor  # noqa: E402
from fairvfl_flwr.app.run import run_inprocess  # noqa: E402
from fairvfl_flwr.config import RunConfig  # noqa: E402
from fairvfl_flwr.flower.server import VFLServer  # noqa: E402
from fairvfl_flwr.algorithms.newton import VIOLATION_SLACK, NewtonVFL, step_share  # noqa: E402

NAME = "mlp-rounds"
CONSTRAINTS = {"deo": {}, "dp": {"constraint": "demographic-parity"}, "eo": {"constraint": "equalized-odds"},
               "groups": {}}
GROUPS = {"adult": "adult-race", "compas": "compas-race"}  # the several-groups variant of each dataset
EPSILON = 0.01


def config(dataset: str, constraint: str, seed: int) -> dict | None:
    """The run config of one cell (None: the dataset has no several-groups variant)."""
    if constraint == "groups" and dataset not in GROUPS:
        return None
    data = GROUPS[dataset] if constraint == "groups" else dataset
    return {"dataset": data, "model": "mlp", "seed": seed, "epsilon": EPSILON, **CONSTRAINTS[constraint]}


class HardGaps:
    """The largest hard training gap of every round of the runs in this process, where a rate
    constraint's ε bounds it (``hard-epsilon``): the server holds y, s and z, and the history
    keeps only the smooth gaps, so the bench reads it as each round is recorded. Also what
    cost a run its rounds: the stop rule's moves of the smooth gaps' bound and temperature
    (each restarts its wait for quiet rounds) and the Gauss–Newton steps taken back."""

    def __init__(self) -> None:
        self.rounds: list[dict] = []
        self.moves: list[int] = []  # the rounds at which the stop rule moved its bound or temperature
        self.taken_back = 0
        self.dampings: list[float] = []  # the search's Levenberg–Marquardt δ after each kept step
        self.smallest_cell: int | None = None  # the fewest training rows of a rate the constraint compares
        self.installed = False

    def install(self) -> None:
        """Wrap the server's record and judge (by the first run, not on import: a test that imports
        this module leaves the classes as they are)."""
        if self.installed:
            return
        self.installed = True
        record, judge = VFLServer.record, NewtonVFL.judge

        def recording(server, server_round, extra=None):
            row = record(server, server_round, extra)
            stop = server.stop
            moved = stop.tightenings + stop.loosenings + stop.sharpenings
            self.moves += [server_round] * (moved - len(self.moves))
            if server.stop.target is not None and server.held_rows is None:
                if self.smallest_cell is None:
                    self.smallest_cell = smallest_cell(server.cfg.constraint, server.labels.y_train,
                                                       server.labels.s_train)
                hard = server.constraint.gaps(server.labels.y_train, server.z("train"), hard=True)
                self.rounds.append({"round": server_round, "max_gap": float(np.max(np.abs(hard)))})
            return row

        def judging(server, server_round):
            kept = judge(server, server_round)
            self.taken_back += not kept
            if kept:
                self.dampings.append(server.damping)
            return kept

        VFLServer.record, NewtonVFL.judge = recording, judging

    def clear(self) -> None:
        self.rounds.clear()
        self.moves.clear()
        self.taken_back = 0
        self.dampings.clear()
        self.smallest_cell = None

    def late_damping(self) -> float | None:
        """The median δ of the last :data:`LATE` kept steps: what held the steps where a run ended on its plateau."""
        return float(np.median(self.dampings[-LATE:])) if self.dampings else None


LATE = 5


def smallest_cell(constraint: str, y: np.ndarray, s: np.ndarray) -> int:
    """The fewest training rows any rate of ``constraint`` is a mean over: a group (demographic parity)
    or a group's rows of one label (equalized odds). One row of it moves the hard gap by 1 / that."""
    cells = [s == g for g in np.unique(s)]
    if constraint == "equalized-odds":
        cells = [c & (y == label) for c in cells for label in (-1, 1)]
    return int(min(int(c.sum()) for c in cells))


HARD = HardGaps()


def app_run(cfg: dict, tmp: str) -> dict:
    """One in-process run: what ``auto`` chose, rounds to target and to the stop, time, accuracy, gaps."""
    HARD.install()
    HARD.clear()
    started = time.perf_counter()
    summary, folder = run_inprocess({**cfg, "eval-every": 1, "output-dir": tmp}, quiet=True)
    seconds = time.perf_counter() - started
    history = json.loads((Path(folder) / "history.json").read_text())
    # a rate constraint's target is its hard gap (hard-epsilon), the smooth gaps' bound is the stop rule's to move
    rows = HARD.rounds if HARD.rounds else history
    # a kept step that cut the gaps at the cost of a loss far above the initial model's, which later rounds win back
    peak = max(history[1:], key=lambda r: r["loss"], default=None)
    surge = f"{peak['loss']:.3g} at round {peak['round']} (round 0: {history[0]['loss']:.3g})" if (
        peak is not None and peak["loss"] > LOSS_SURGE * history[0]["loss"]) else ""
    return {"optimizer": RunConfig.from_flower(cfg).optimizer_in_use, "to target": rounds_to_gaps(rows, cfg["epsilon"]),
            "stop": summary["rounds"], "seconds": seconds, "test acc": 100 * summary["test_acc"],
            "train gap": summary["train_max_gap"], "hard gap": summary.get("train_hard_gap"),
            "met": summary.get("epsilon_met"), "tightenings": summary.get("tightenings"),
            "bound moves": " ".join(map(str, HARD.moves)), "taken back": HARD.taken_back, "loss surge": surge,
            "late damping": HARD.late_damping(),
            **({"surrogate bound": summary["surrogate_bound"], "temperature": summary.get("temperature", 1.0)}
               if "surrogate_bound" in summary else {}),
            **({"smallest cell": HARD.smallest_cell} if HARD.smallest_cell is not None else {})}


def reference_run(cfg: dict, optimizer: str, rounds: int) -> dict:
    """The reference: ``optimizer`` for ``rounds`` rounds on the floor, test accuracy at the last."""
    res = run_floor({**cfg, "num-server-rounds": rounds, "eval-every": rounds}, optimizer)
    return {"reference": f"{optimizer} {rounds}", "reference acc": res["final_acc"],
            "reference gap": res["final_max_gap"], "reference seconds": res["seconds"]}


def matched_run(cfg: dict, optimizer: str, rounds: int, bound: float, temperature: float) -> dict:
    """The reference held to what a rate constraint's run ended holding: ``optimizer`` for ``rounds``
    rounds at ε = the run's final smooth bound and the rates' temperature (its stop rule moved both
    until the hard gap met ε; the floor has no stop rule), and the hard gap it ends with."""
    res = run_floor({**cfg, "epsilon": bound, "num-server-rounds": rounds, "eval-every": rounds}, optimizer,
                    temperature=temperature)
    return {"matched acc": res["final_acc"], "matched hard gap": res["final_hard_gap"]}


TARGET_ROUNDS, STOP_ROUNDS, MASKED_APART = 30, 50, 5  # the rounds the bar allows
DAMPED = 1.0  # a late damping above this is named as what held a plateaued run's steps
LOSS_SURGE = 2.0  # a training loss this many times round 0's, after it, is named as what a run's rounds went to
ACC_BAR = 0.2  # the most test accuracy, in points, a run may give up against its reference


def cause(moves: str | None, taken_back: int | None, target, surge: str | None = None,
          cell: int | None = None) -> str:
    """What a run spent its rounds on, from its columns (None: a row of an earlier call, which
    did not record them)."""
    if taken_back is None:
        return "not recorded (a row of an earlier call: rerun it)"
    parts = []
    if cell and 1.0 / cell > EPSILON:
        parts.append(f"its smallest rate is over {cell} training rows, so one row moves the hard gap by "
                     f"1/{cell} = {1 / cell:.3f}, {1 / (cell * EPSILON):.1f}× ε: the gap meets ε + 0.002 only in "
                     "rounds where the other rates land near one of those steps")
    if moves:
        rounds = moves.split()
        parts.append(f"the stop rule moved the smooth gaps' bound or temperature {len(rounds)}× (rounds {moves}), "
                     "each a new wait for quiet rounds")
    if taken_back:
        parts.append(f"{taken_back} step(s) taken back")
    if surge:
        parts.append(f"a kept step raised the training loss to {surge} to cut the gaps (the ℓ1 merit at the "
                     "search's multipliers), and the rounds after it won the loss back")
    if target is None:
        parts.append("a gap above ε + 0.002 at the stop")
    return "; ".join(parts) or "no calibration move and no step taken back: the search's own pace"


def misses(rows: list[dict]) -> list[str]:
    """Each row past the bar (to target > 30 or never, stop > 50, masked and plain stops more than 5
    rounds apart), with the measured cause."""
    out = []
    for r in rows:
        name = f"{r['dataset']} {r['constraint']} seed {r['seed']}"
        if "to target" in r and (r["to target"] is None or r["to target"] > TARGET_ROUNDS or r["stop"] > STOP_ROUNDS):
            why = cause(r.get("bound moves"), r.get("taken back"), r["to target"], r.get("loss surge"),
                        r.get("smallest cell"))
            out.append(f"- {name}: to target {r['to target']}, stop {r['stop']}: {why}.")
        if "masked stop" in r and "stop" in r and abs(r["masked stop"] - r["stop"]) > MASKED_APART:
            out.append(f"- {name}: masked stop {r['masked stop']} against {r['stop']}: plain "
                       f"{cause(r.get('bound moves'), r.get('taken back'), r['to target'])}; masked "
                       f"{cause(r.get('masked bound moves'), r.get('masked taken back'), r.get('masked to target'))}.")
    return out


def accuracy_misses(rows: list[dict]) -> list[str]:
    """Each row whose test accuracy is more than :data:`ACC_BAR` points below its reference's, with
    what the two runs bound: a rate constraint's run holds its hard-prediction gap within ε
    (``hard-epsilon``), the reference only its smooth gaps; and the spread of Δacc over the
    row's seeds, which the bar sits inside where the two runs' seeds part by points."""
    out = []
    for r in rows:
        if r.get("Δacc") is None or r["Δacc"] >= -ACC_BAR:
            continue
        spread = [o["Δacc"] for o in rows if (o["dataset"], o["constraint"]) == (r["dataset"], r["constraint"])
                  and o.get("Δacc") is not None]
        parts = [f"Δacc over its seeds {min(spread):+.2f} to {max(spread):+.2f}"]
        if r.get("hard gap") is not None:
            parts.append(f"this run holds the hard-prediction gap ({r['hard gap']:.4f}), the reference only the smooth "
                         f"gaps ({r.get('reference gap', float('nan')):.4f} at its end)")
            if r.get("Δacc matched") is not None:
                parts.append(f"the reference held to this run's final smooth bound ({r['surrogate bound']:.4g}, "
                             f"temperature {r['temperature']:g}) ends at Δacc {r['Δacc matched']:+.2f} "
                             f"with a hard gap of {r['matched hard gap']:.4f}")
        elif r.get("stop") is not None:
            parts.append(f"this run ended on its plateau at round {r['stop']} (F fell by less than stop-plateau of "
                         f"its fall since round 1), the reference ({r.get('reference', 'not recorded')}) trained on")
            if r.get("late damping") is not None and r["late damping"] > DAMPED:
                parts.append(f"its last kept steps ran at a damping of {r['late damping']:.3g}, at most "
                             f"1/{1 / step_share(r['late damping']):.0f} of the linearised model's step: the true "
                             f"gaps ending more than {VIOLATION_SLACK} from the linearised ones grows it "
                             "(docs/newton.md)")
        out.append(f"- {r['dataset']} {r['constraint']} seed {r['seed']}: Δacc {r['Δacc']:+.2f}: {'; '.join(parts)}.")
    return out


def key(row: dict) -> tuple:
    return row["dataset"], row["constraint"], row["seed"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="adult,compas,crime")
    ap.add_argument("--constraints", default=",".join(CONSTRAINTS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--masked", action="store_true", help="also each run under privacy.secure-aggregation=true")
    ap.add_argument("--reference", default="", choices=("", "adagrad", "gd"),
                    help="also each run config trained by this optimizer for --reference-rounds rounds (floor)")
    ap.add_argument("--reference-rounds", type=int, default=1000)
    ap.add_argument("--matched", action="store_true",
                    help="also, for a rate constraint's run, the reference optimizer (adagrad without --reference) "
                    "at the run's final smooth bound and temperature")
    ap.add_argument("--skip-app", action="store_true",
                    help="only the reference (with --keep: added to the page's rows)")
    ap.add_argument("--keep", action="store_true", help="keep the page's rows and columns this call does not compute")
    ap.add_argument("--page", action="store_true", help=f"write {page(NAME).relative_to(REPO)}")
    args = ap.parse_args(argv)
    unknown = set(args.constraints.split(",")) - set(CONSTRAINTS)
    if unknown:
        ap.error(f"--constraints: {sorted(unknown)} unknown (choose from {', '.join(CONSTRAINTS)})")
    kept: dict[tuple, dict] = {}
    previous = kept_page(NAME) if args.keep else None
    if previous:
        kept = {key(r): r for r in previous["rows"]}
    skipped = []
    with tempfile.TemporaryDirectory() as tmp:
        for dataset in args.datasets.split(","):
            for constraint in args.constraints.split(","):
                for seed in map(int, args.seeds.split(",")):
                    cfg = config(dataset, constraint, seed)
                    if cfg is None:
                        skipped.append(f"{dataset} × {constraint}")
                        continue
                    row = {**kept.get((dataset, constraint, seed), {}), "dataset": dataset, "constraint": constraint,
                           "seed": seed}
                    if not args.skip_app and not args.masked:  # an earlier call's masked run is of other code
                        row = {k: v for k, v in row.items() if not k.startswith("masked")}
                    if not args.skip_app and not args.matched:  # matched to an earlier call's bound
                        row = {k: v for k, v in row.items() if not k.startswith("matched") and k != "Δacc matched"}
                    if not args.skip_app:
                        row.update(app_run(cfg, tmp))
                    if args.masked:
                        masked = app_run({**cfg, "privacy.secure-aggregation": True}, tmp)
                        row.update({"masked stop": masked["stop"], "masked acc": masked["test acc"],
                                    "masked seconds": masked["seconds"], "masked to target": masked["to target"],
                                    "masked bound moves": masked["bound moves"],
                                    "masked taken back": masked["taken back"]})
                    if args.reference:
                        row.update(reference_run(cfg, args.reference, args.reference_rounds))
                    if args.matched and row.get("surrogate bound") is not None:
                        row.update(matched_run(cfg, args.reference or "adagrad", args.reference_rounds,
                                               row["surrogate bound"], row.get("temperature", 1.0)))
                    if "reference acc" in row and "test acc" in row:
                        row["Δacc"] = row["test acc"] - row["reference acc"]
                    if "matched acc" in row and "test acc" in row:
                        row["Δacc matched"] = row["test acc"] - row["matched acc"]
                    print(json.dumps(row), flush=True)
                    kept[key(row)] = {**row, "run here": True}
    commands = [this_run()]
    previous = kept_page(NAME) if args.keep else None
    if previous:  # what another call wrote meanwhile, under this call's rows
        done = {key(r) for r in kept.values() if r.get("run here")}
        kept = {**{key(r): r for r in previous["rows"]}, **{k: r for k, r in kept.items() if k in done}}
        earlier = previous.get("commands", [run_of(previous["command"], previous.get("commit"))])
        commands = [c for c in earlier if c != commands[0]] + commands
    for r in kept.values():
        r.pop("run here", None)
    rows = sorted(kept.values(), key=lambda r: (r["dataset"], list(CONSTRAINTS).index(r["constraint"]), r["seed"]))
    cols = ["dataset", "constraint", "seed", "optimizer", "to target", "stop", "seconds", "test acc", "train gap",
            "hard gap", "met", "smallest cell", "bound moves", "taken back", "late damping", "loss surge",
            "masked to target", "masked stop", "masked acc",
            "masked bound moves", "masked taken back", "reference", "reference acc", "Δacc", "surrogate bound",
            "temperature", "matched acc", "matched hard gap", "Δacc matched"]
    cols = [c for c in cols if any(c in r for r in rows)]
    markdown = table(rows, cols)
    missed = misses(rows)
    if missed:
        markdown += (f"\n\nPast the bar (to target > {TARGET_ROUNDS}, stop > {STOP_ROUNDS}, masked and plain stops "
                     f"more than {MASKED_APART} rounds apart), each with what its rounds went to:\n\n"
                     + "\n".join(missed))
    below = accuracy_misses(rows)
    if below:
        markdown += (f"\n\nMore than {ACC_BAR} points of test accuracy below the reference, each with what the two "
                     "runs bound:\n\n" + "\n".join(below))
    if args.page:
        notes = (f"ε = {EPSILON}; `to target`: the first round from which every training gap stays within "
                 f"ε + {GAP_SLACK} up to the stop (a rate constraint's hard-prediction gaps, which ε bounds under "
                 "`hard-epsilon`; DEO's smooth gaps; None: not so at the stop); `stop`: the round the stop rule ended "
                 "training; `seconds`: the whole in-process run, evaluated every round; `train gap`: the largest "
                 "smooth training gap at the end (under `hard-epsilon` the stop rule moves its bound); `hard gap`, "
                 "`met`: the largest hard-prediction training gap at the end and whether it is within ε + 0.001; "
                 "`smallest cell`: the fewest training rows a rate the constraint compares is over (a group, or under "
                 "equalized odds a group's rows of one label): one row there moves the hard gap by its inverse; "
                 "`bound moves`: the rounds at which the stop rule moved the smooth gaps' bound or sharpened "
                 "their rates (`hard-epsilon`: each starts its wait for quiet rounds again); `taken back`: "
                 f"Gauss–Newton steps the server took back; `late damping`: the median Levenberg–Marquardt δ of "
                 f"the last {LATE} kept steps (a step is at most 1/(1 + 4δ) of the undamped search's); `loss surge`: "
                 "the largest training loss after round 0 where it is more than "
                 f"{LOSS_SURGE}× round 0's (a kept step that cut the gaps at that cost); `masked …`: the same under secure aggregation; "
                 "`Δacc`: test accuracy minus the reference's, in points; `surrogate bound`, `temperature`: where a "
                 "rate constraint's ε bounds the hard gap, the smooth gaps' final bound and the rates' temperature "
                 "(the stop rule moves both); `matched …`: the reference at that bound and temperature (the floor "
                 "has no stop rule), its test accuracy, its hard training gap at the end, and Δacc against it."
                 + (f" Not run (no several-groups variant): {', '.join(sorted(set(skipped)))}." if skipped else ""))
        notes += " " + made_by(commands, "rows and columns")
        write(DEFAULT_OUT, NAME, {"epsilon": EPSILON, "commands": commands, "rows": rows}, markdown,
              title="MLP parties: rounds to the target and to the stop", notes=notes)
    else:
        print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
