"""Accuracy against the hard-rate test gap: FairVFL over a grid of ε, fairlearn's
ExponentiatedGradient over a grid of bounds in expectation, and ThresholdOptimizer, on their curves.

Each row is a dataset, a constraint and its groups (:data:`ROWS`): COMPAS race with equalized
odds (six races, the small ones pooled), race not an input and race an input; an own CSV with
four groups (Adult's table with a column ``age_band``, sex × age band, written to a temporary
folder and run as ``dataset = "csv"``, as a user's own table is); COMPAS and Adult with
demographic parity; Crime with equalized odds. On each seed's split, with the groups the run
constrains (small groups pooled on the whole table, so every method is scored on the same groups):

* FairVFL over ``--epsilons`` and with ``fairness = false`` (the curve's unconstrained end),
  through the in-process engine, with the defaults a user gets (``constraint-measure =
  "auto"``: rates; ``hard-epsilon = true``: ε bounds the hard training gap; ``optimizer =
  "auto"``; the sensitive attribute an input only where the row says so), 3 parties and at
  most ``--rounds`` rounds;
* fairlearn's ExponentiatedGradient (LogisticRegression on the same columns) with the
  constraint's moment at each difference bound of ``--bounds``, scored in expectation over
  its randomised classifier (tools/baselines.eg_expected, expected_metrics: never one draw),
  and the plain LogisticRegression as its unconstrained end;
* fairlearn's ThresholdOptimizer on that LogisticRegression, in expectation too: one point,
  and it reads each test row's group at prediction time, which the other two do not.

Every point is a test accuracy, a hard-rate test gap (fairlearn's ``demographic_parity_difference``
or ``equalized_odds_difference`` on the constraint's groups) and the same gap on the training
rows. Each setting's figures are averaged over the seeds; the curves of those means are read at
common gaps (tools/tradeoff.py: linear between non-dominated points, nothing below the smallest
gap), and beside each common gap the per-seed difference: on each seed, the setting's own point
against the other method's curve of the same seed at that point's gap.

``--quick`` is a smoke run (two ε, two bounds). ``--set KEY=VALUE`` (flwr run's
--run-config syntax) overrides a run-config key of every FairVFL run. The page is published
after every finished seed, so an interrupted run leaves the rows and seeds it finished (a row on
fewer seeds than the page's says which it ran). Each row names the
command and commit it came from (its section, and the page's notes list them all). With
``--keep`` a run of some rows keeps the page's other rows (:func:`kept_rows`) when they were run
with the same settings: the page is rebuilt from its committed json, read at every publish, so
runs of other rows side by side into the same page each add theirs, and ``--rows '' --keep``
writes it again; ``--keep-from`` adds the rows of another page's json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, REPO, made_by, page, page_name, run_of, write  # noqa: E402
from fairvfl_flwr.app.run import run_inprocess  # noqa: E402
from fairvfl_flwr.config import RunConfig  # noqa: E402
from fairvfl_flwr.core.metrics import predict  # noqa: E402
from fairvfl_flwr.data.problem import constraint_groups, load_data, whole_table  # noqa: E402
from fairvfl_flwr.data.tables import packaged_file, read_csv  # noqa: E402
from fairvfl_flwr.features.final_logits import SCORES  # noqa: E402
from fairvfl_flwr.flower.errors import FederationError  # noqa: E402
from fairvfl_flwr.tools.baselines import (  # noqa: E402
    eg_predictors, expected_metrics, plain_predict, regroup, threshold_expected)
from fairvfl_flwr.tools.cli import RunConfigArgError, parse_run_config  # noqa: E402
from fairvfl_flwr.tools.results import commit, include, this_command  # noqa: E402
from fairvfl_flwr.tools.tradeoff import accuracy_at_gap, frontier  # noqa: E402

FAIRVFL, EG, THRESHOLD = "FairVFL", "fairlearn EG", "ThresholdOptimizer (group at prediction time)"
METHODS = (FAIRVFL, EG, THRESHOLD)
#: which hard-rate gap a constraint is read by: fairlearn's metric of the same meaning
GAP = {"demographic-parity": "dp_diff", "equalized-odds": "eo_diff"}
GAP_NAME = {"dp_diff": "demographic_parity_difference", "eo_diff": "equalized_odds_difference"}
OWN_CSV = "adult-sex-age.csv"
ROWS = {
    "compas-race-eo": {"dataset": "compas-race", "constraint": "equalized-odds", "pool-small-groups": True},
    "compas-race-eo-input": {"dataset": "compas-race", "constraint": "equalized-odds", "pool-small-groups": True,
                             "sensitive-as-input": True},
    "own-csv-eo": {"dataset": "csv", "constraint": "equalized-odds", "csv.label": "income",
                   "csv.positive": ">50K", "csv.sensitive": "sex,age_band", "csv.id-column": "row_id"},
    "compas-dp": {"dataset": "compas", "constraint": "demographic-parity"},
    "adult-dp": {"dataset": "adult", "constraint": "demographic-parity"},
    "crime-eo": {"dataset": "crime", "constraint": "equalized-odds"},
}
TITLES = {"compas-race-eo": "COMPAS race, equalized odds (six races; race not an input)",
          "compas-race-eo-input": "COMPAS race, equalized odds (six races; race an input of every model)",
          "own-csv-eo": "Own CSV, equalized odds (Adult's table, four groups: sex × age band)",
          "compas-dp": "COMPAS, demographic parity (African-American, Caucasian; race not an input)",
          "adult-dp": "Adult, demographic parity (sex; sex not an input)",
          "crime-eo": "Crime, equalized odds (black share > 0.06)"}
BASE = {"num-parties": 3, "eval-every": 1000, "mode": "fairvfl-scores"}
#: FairVFL's ε bounds every pair of groups; EG's difference bound each group against all rows, which
#: lets a pair differ by up to twice the bound: ε reaches 0.2 to cover the gaps EG's 0.1 leaves
EPSILONS, BOUNDS = (0.001, 0.01, 0.02, 0.05, 0.1, 0.2), (0.001, 0.005, 0.01, 0.02, 0.05, 0.1)
QUICK = (0.01, 0.05)
#: the payload keys a kept row must share with the run that adds rows to its page
SETTINGS = ("rounds", "epsilons", "bounds", "seeds", "overrides")
#: what a setting's figures are averaged over the seeds for (min and max beside each mean)
FIGURES = ("acc", "gap", "train_acc", "train_gap", "dp_diff", "eo_diff", "rounds", "train_max_gap", "tightenings",
           "temperature", "gap_apart", "train_gap_apart", "gap_drawn")
#: draws of :func:`drawn_gap`
DRAWS = 400


def own_csv(folder: Path) -> Path:
    """Adult's packaged table with a column ``age_band`` ("<40" or "40+"): with
    ``csv.sensitive = "sex,age_band"`` its four groups are sex × age band. ``age`` stays a
    feature (only the declared sensitive columns and their one-hot copies are left out)."""
    path = Path(folder) / OWN_CSV
    if not path.exists():
        df = read_csv(packaged_file("adult.csv.gz"))
        df = df.copy()  # one block: the packaged table arrives column by column
        df["age_band"] = np.where(df["age"].astype(float) < 40, "<40", "40+")
        df.to_csv(path, index=False)
    return path


def run_config(row: str, seed: int, rounds: int, overrides: dict, csv_folder: Path) -> dict:
    """The FairVFL run config of a row and seed (before ε)."""
    cfg = {**BASE, **ROWS[row], "seed": seed, "num-server-rounds": rounds, **overrides}
    if cfg["dataset"] == "csv":
        cfg["csv.path"] = str(own_csv(csv_folder))
    return cfg


def drawn_gap(y_train: np.ndarray, codes_train: np.ndarray, p_train: np.ndarray, y_test: np.ndarray,
              codes_test: np.ndarray, key: str, draws: int = DRAWS, seed: int = 0) -> float:
    """The test gap a classifier shows from the test cells' sizes alone: the mean over ``draws`` of
    the gap (``key``) where each test cell (a group, and for equalized odds a label) holds as many
    rows as the test split's, drawn with replacement from the same cell's training rows, each
    with its probability of a +1 (``p_train``). A classifier whose every cell's rate were the same
    on test rows as on training rows shows about this gap on the test split. On cells of a few
    rows it is far above the training gap, and lower for a randomised classifier (EG's
    expected rates average probabilities, a deterministic one's counts 0s and 1s)."""
    rng = np.random.default_rng(seed)
    labels = [None] if key == "dp_diff" else list(np.unique(y_train))
    gap = np.zeros(draws)
    for label in labels:
        rates = []
        for k in np.unique(codes_test):
            size = int(np.sum((codes_test == k) & (True if label is None else y_test == label)))
            pool = np.asarray(p_train, dtype=np.float64)[(codes_train == k) & (True if label is None else y_train == label)]
            if size and len(pool):
                rates.append(pool[rng.integers(0, len(pool), size=(draws, size))].mean(axis=1))
        if len(rates) > 1:
            gap = np.maximum(gap, np.max(rates, axis=0) - np.min(rates, axis=0))
    return float(gap.mean())


def points(row: str, seed: int, epsilons, bounds, rounds: int, overrides: dict, csv_folder: Path) -> tuple[list, dict]:
    """Every method's points (test accuracy, hard-rate test and training gaps) on one row and
    seed, and the groups."""
    base = run_config(row, seed, rounds, overrides, csv_folder)
    cfg = RunConfig.from_flower(base)
    constraint = cfg.constraint
    ds = load_data(cfg)
    groups = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label, ds.group_names,
                               whole_table(ds.y_train, ds.s_train, ds.y_test, ds.s_test)).groups
    test_codes = regroup(ds.s_train, groups.codes, ds.s_test)
    info = {"groups": list(groups.names), "columns": int(ds.X_train.shape[1]), "failed": [],
            "test_rows": {n: int((test_codes == k).sum()) for k, n in enumerate(groups.names)}}
    out = []

    def add(method, setting, p_test, p_train, seconds, **extra):
        """A point from each row's probability of a +1 (0 or 1 for a deterministic classifier)."""
        test, train = expected_metrics(ds.y_test, test_codes, p_test), expected_metrics(ds.y_train, groups.codes, p_train)
        out.append({"row": row, "seed": seed, "method": method, "setting": setting, "acc": test["acc"],
                    "gap": test[GAP[constraint]], "dp_diff": test["dp_diff"], "eo_diff": test["eo_diff"],
                    "train_gap": train[GAP[constraint]], "train_acc": train["acc"], "seconds": seconds,
                    "gap_drawn": drawn_gap(ds.y_train, groups.codes, p_train, ds.y_test, test_codes, GAP[constraint]),
                    **extra})

    for eps in (*epsilons, None):
        run = {**base, "epsilon": eps} if eps is not None else {**base, "fairness": False}
        t = time.perf_counter()
        setting = "off" if eps is None else f"ε={eps:g}"
        with tempfile.TemporaryDirectory() as folder:
            try:
                summary, run_dir = run_inprocess({**run, "output-dir": folder}, quiet=True)
            except FederationError as exc:  # a run that stops (diverges) is a finding: listed, not averaged
                info["failed"].append({"seed": seed, "setting": setting, "reason": str(exc)[:300]})
                continue
            with np.load(Path(run_dir) / SCORES) as f:
                z, z_train = f["z_test"], f["z_train"]
        add(FAIRVFL, setting, predict(z) > 0, predict(z_train) > 0,
            time.perf_counter() - t, epsilon=eps, rounds=summary["rounds"], train_max_gap=summary["train_max_gap"],
            tightenings=summary.get("tightenings"), met=summary.get("epsilon_met"),
            temperature=summary.get("temperature"),
            optimizer=RunConfig.from_flower(run).optimizer_in_use)
    for bound in (*bounds, None):
        t = time.perf_counter()
        if bound is None:
            both = plain_predict(ds.X_train, ds.y_train, np.vstack([ds.X_test, ds.X_train])) > 0
            p_test, p_train = both[:len(ds.y_test)], both[len(ds.y_test):]
            apart = {"gap_apart": None, "train_gap_apart": None}
        else:
            weights, (h_test, h_train) = eg_predictors(ds.X_train, ds.y_train, groups.codes, [ds.X_test, ds.X_train],
                                                       ds.protected_label, constraint, bound=bound)
            p_test, p_train = weights @ h_test, weights @ h_train
            # the gap EG would have if its predictors' gaps did not cancel: the weighted mean of their own
            apart = {f"{k}gap_apart": float(sum(w * expected_metrics(y, c, h)[GAP[constraint]]
                                                for w, h in zip(weights, hs)))
                     for k, y, c, hs in (("", ds.y_test, test_codes, h_test), ("train_", ds.y_train, groups.codes, h_train))}
        add(EG, "off (plain LR)" if bound is None else f"bound={bound:g}", p_test, p_train, time.perf_counter() - t,
            bound=bound, **apart)
    t = time.perf_counter()
    p_test, p_train = threshold_expected(ds.X_train, ds.y_train, groups.codes, [ds.X_test, ds.X_train],
                                         [test_codes, groups.codes], ds.protected_label, constraint)
    add(THRESHOLD, "thresholds per group", p_test, p_train, time.perf_counter() - t)
    print(f"  {row} seed {seed}: " + "; ".join(
        f"{p['method']} {p['setting']} acc {p['acc']:.4f} gap {p['gap']:.3f} train {p['train_gap']:.3f}"
        for p in out), flush=True)
    return out, info


def kept_rows(previous: Path, rows: list[str], settings: dict) -> tuple[list[dict], dict]:
    """The points and group info of the rows on the page ``previous`` (a results json) that
    this run does not rerun, each info with the command, commit and seeds it came from; nothing
    when there is no such page, its settings but the seeds differ from ``settings`` (their curves
    would not be comparable on one page) or it ran a seed this run's seeds do not hold."""
    if not previous.exists():
        return [], {}
    old = json.loads(previous.read_text())
    differ = [k for k in SETTINGS if k != "seeds" and old.get(k) != settings[k]]
    if not set(old.get("seeds", [])) <= set(settings["seeds"]):
        differ.append("seeds")
    if differ:
        print(f"[groups] not keeping the rows of {previous}: its {', '.join(differ)} differ from this run's", flush=True)
        return [], {}
    info = {row: {"command": old.get("command", ""), "commit": old.get("commit", ""), "seeds": old.get("seeds"), **i}
            for row, i in old.get("groups", {}).items() if row not in rows and row in ROWS}
    return [p for p in old.get("points", []) if p["row"] in info], info


def kept_pages(pages: list[Path], rows: list[str], settings: dict) -> tuple[list[dict], dict]:
    """:func:`kept_rows` of several pages. A row on more than one joins their seeds where they
    ran different ones (seeds run side by side; ``info[row]["also"]`` names the other runs) and
    comes from the last page where they ran the same."""
    results, info = [], {}
    for previous in pages:
        more, more_info = kept_rows(previous, rows, settings)
        for row, new in more_info.items():
            had = info.get(row)
            mine = [p for p in more if p["row"] == row]
            if had is not None and not {p.get("seed") for p in results if p["row"] == row} & {p.get("seed") for p in mine}:
                had.setdefault("also", []).append({k: new.get(k) for k in ("command", "commit", "seeds")})
                had["failed"] = had.get("failed", []) + new.get("failed", [])
            else:
                results = [p for p in results if p["row"] != row]
                info[row] = new
            results += mine
    return results, info


def summarise(rows: list[dict]) -> list[dict]:
    """One point per (row, method, setting): its figures averaged over the seeds (min, max)."""
    out = []
    for key in dict.fromkeys((r["row"], r["method"], r["setting"]) for r in rows):
        mine = [r for r in rows if (r["row"], r["method"], r["setting"]) == key]
        agg = {"row": key[0], "method": key[1], "setting": key[2], "seeds": [r["seed"] for r in mine]}
        for m in FIGURES:
            v = np.array([np.nan if r.get(m) is None else r[m] for r in mine], dtype=float)
            have = v[~np.isnan(v)]
            agg[m] = float(have.mean()) if len(have) else None
            agg[f"{m}_min"], agg[f"{m}_max"] = (float(have.min()), float(have.max())) if len(have) else (None, None)
        agg["optimizer"] = ",".join(sorted({r["optimizer"] for r in mine if r.get("optimizer")})) or None
        met = [r["met"] for r in mine if r.get("met") is not None]
        agg["met"] = f"{sum(met)}/{len(met)}" if met else None
        agg["epsilon"] = mine[0].get("epsilon")
        out.append(agg)
    return out


#: the figures a curve of each split is drawn from: (gap, accuracy, EG's predictors' mean gap)
SPLITS = {"test": ("gap", "acc", "gap_apart"), "train": ("train_gap", "train_acc", "train_gap_apart")}


def curve(points: list[dict], row: str, method: str, seed: int | None = None,
          split: str = "test") -> list[tuple[float, float]]:
    """A method's (gap, accuracy) points on a row and split: of the seed means (``points`` a
    summary), or of one seed."""
    x, y, _ = SPLITS[split]
    return [(p[x], p[y]) for p in points if p["row"] == row and p["method"] == method
            and (seed is None or p["seed"] == seed) and p.get(x) is not None and p.get(y) is not None]


def apart_curve(summary: list[dict], row: str, split: str = "test") -> list[tuple[float, float]]:
    """EG's seed-mean accuracy against the weighted mean of its predictors' own gaps: its
    curve were the draws' gaps not to cancel (a deterministic classifier's cannot)."""
    x, y, apart = SPLITS[split]
    return [(p[x] if p.get(apart) is None else p[apart], p[y]) for p in summary
            if p["row"] == row and p["method"] == EG and p.get(x) is not None and p.get(y) is not None]


def matched(summary: list[dict], points: list[dict], split: str = "test") -> list[dict]:
    """Per row, one entry at the gap of each frontier point of FairVFL's and EG's seed-mean
    curves on ``split`` (the test rows, or the training rows the constraint is fitted on):
    every method's accuracy there (read off its seed-mean curve), FairVFL − EG, and
    ``per_seed``: on each seed, that setting's own point against the other method's curve of
    the same seed at the point's gap (FairVFL − EG; None where that curve does not reach it)."""
    x, y, _ = SPLITS[split]
    out = []
    for row in dict.fromkeys(p["row"] for p in summary):
        curves = {m: curve(summary, row, m, split=split) for m in METHODS}
        seeds = sorted({p["seed"] for p in points if p["row"] == row})
        anchors = []
        for m in (FAIRVFL, EG):
            front = set(frontier(curves[m]))
            anchors += [(p[x], m, p["setting"]) for p in summary
                        if p["row"] == row and p["method"] == m and (p.get(x), p.get(y)) in front]
        for g, anchor, setting in sorted(anchors):
            other = EG if anchor == FAIRVFL else FAIRVFL
            acc = {m: accuracy_at_gap(curves[m], g) for m in METHODS}
            diff = None if acc[FAIRVFL] is None or acc[EG] is None else acc[FAIRVFL] - acc[EG]
            apart = accuracy_at_gap(apart_curve(summary, row, split), g)
            per_seed = []
            for s in seeds:
                own = next((p for p in points if (p["row"], p["method"], p["setting"], p["seed"])
                            == (row, anchor, setting, s)), None)
                theirs = None if own is None else accuracy_at_gap(curve(points, row, other, s, split), own[x])
                per_seed.append(None if theirs is None else (own[y] - theirs) * (1 if anchor == FAIRVFL else -1))
            out.append({"row": row, "gap": g, "point": f"{anchor}: {setting}", "acc": acc,
                        "fairvfl_minus_eg": diff, "per_seed": per_seed, "eg_apart": apart})
    return out


def _lowest(at: list[dict], row: str) -> dict | None:
    """The matched gap of ``row`` where FairVFL − EG is lowest (None: the curves share no gap)."""
    both = [a for a in at if a["row"] == row and a["fairvfl_minus_eg"] is not None]
    return min(both, key=lambda a: a["fairvfl_minus_eg"], default=None)


def verdicts(summary: list[dict], at: list[dict], at_train: list[dict] = ()) -> list[dict]:
    """Per row: FairVFL − EG at the matched test gap where it is lowest, with that gap's
    per-seed range, the same on the training rows (``at_train``: :func:`matched` of the
    training split), and each method's smallest seed-mean training and test gap (with its
    setting)."""
    out = []
    for row in dict.fromkeys(a["row"] for a in at):
        worst = _lowest(at, row)
        v = {"row": row, "worst": worst, "train_worst": _lowest(list(at_train), row)}
        for m, key in ((FAIRVFL, "fairvfl"), (EG, "eg")):
            mine = [p for p in summary if p["row"] == row and p["method"] == m]
            v[f"{key}_train_floor"] = min(((p["train_gap"], p["setting"]) for p in mine), default=None)
            v[f"{key}_test_floor"] = min(((p["gap"], p["setting"]) for p in mine), default=None)
            v[f"{key}_drawn_floor"] = min(((p["gap_drawn"], p["setting"]) for p in mine
                                           if p.get("gap_drawn") is not None), default=None)
        if worst is None:
            v["reading"] = "no common gap"
        elif worst["fairvfl_minus_eg"] >= 0:
            v["reading"] = "at or above"
        else:
            seeds = [d for d in worst["per_seed"] if d is not None]
            v["reading"] = "below, within the seed spread" if seeds and max(seeds) >= 0 else "below"
            fair = worst["acc"][FAIRVFL]
            if worst["eg_apart"] is None or fair >= worst["eg_apart"]:
                v["reading"] += "; at or above EG without its draws' cancelling"
        out.append(v)
    return out


def _pct(v) -> str:
    return "—" if v is None else f"{100 * v:.2f}%"


def _pt(v) -> str:
    return "" if v is None else f"{100 * v:+.2f}"


def _num(v, spec=".3f") -> str:
    return "" if v is None else format(v, spec)


def _seeds(per_seed: list) -> str:
    have = [d for d in per_seed if d is not None]
    if not have:
        return "—"
    span = f"{_pt(min(have))} to {_pt(max(have))}"
    return span if len(have) == len(per_seed) else f"{span} ({len(have)}/{len(per_seed)} seeds)"


def verdict_table(rows: list[dict]) -> str:
    """One line per row: the lowest FairVFL − EG over the matched test gaps, the same on the
    training rows, and the smallest gaps."""
    lines = ["| row | lowest FairVFL − EG (pt) at test gap | per seed (pt) | reading | on the training rows: lowest "
             "FairVFL − EG (pt) at gap | FairVFL smallest train / test gap | EG smallest train / test gap | "
             "smallest test gap from the cells' sizes: FairVFL / EG |",
             "|---|---|---|---|---|---|---|---|"]

    def lowest(w):
        return "—" if w is None else f"{_pt(w['fairvfl_minus_eg'])} at {w['gap']:.3f} ({w['point']})"

    for v in rows:
        w, t = v["worst"], v.get("train_worst")
        at = lowest(w)
        train = lowest(t) + ("" if t is None else f", per seed {_seeds(t['per_seed'])}")

        def floors(key):
            tr, te = v[f"{key}_train_floor"], v[f"{key}_test_floor"]
            return "—" if tr is None else f"{tr[0]:.3f} ({tr[1]}) / {te[0]:.3f} ({te[1]})"

        drawn = " / ".join("—" if v.get(f"{k}_drawn_floor") is None else
                           f"{v[f'{k}_drawn_floor'][0]:.3f} ({v[f'{k}_drawn_floor'][1]})" for k in ("fairvfl", "eg"))
        lines.append(f"| {v['row']} | {at} | {'' if w is None else _seeds(w['per_seed'])} | {v['reading']} | "
                     f"{train} | {floors('fairvfl')} | {floors('eg')} | {drawn} |")
    return "\n".join(lines)


def matched_table(at: list[dict]) -> str:
    """Every method's accuracy at the common gaps, one line per row and gap."""
    lines = [f"| row | gap ≤ | point | {FAIRVFL} | {EG} (expected) | FairVFL − EG (pt) | per seed (pt) | "
             f"EG without cancelling | {THRESHOLD} |", "|---|---|---|---|---|---|---|---|---|"]
    for a in at:
        lines.append(f"| {a['row']} | {a['gap']:.3f} | {a['point']} | {_pct(a['acc'][FAIRVFL])} | "
                     f"{_pct(a['acc'][EG])} | {_pt(a['fairvfl_minus_eg'])} | {_seeds(a['per_seed'])} | "
                     f"{_pct(a.get('eg_apart'))} | {_pct(a['acc'][THRESHOLD])} |")
    return "\n".join(lines)


def markdown(summary: list[dict], at: list[dict], info: dict, plot: str | None, at_train: list[dict] = ()) -> str:
    """The page: the per-row reading, the matched-gap table, then every row's points."""
    parts = ["## Per row", "",
             "FairVFL − EG at the matched test gap where it is lowest (a mean over the seeds), the per-seed range "
             "there, the same on the training rows (accuracy against the gap the constraint is fitted on), and "
             "each method's smallest training and test gap (seed means, with the setting). \"within the seed "
             "spread\": on some seed FairVFL is at or above EG there.", "",
             verdict_table(verdicts(summary, at, at_train)), "",
             "## Accuracy at matched gaps", "",
             "Each method's test accuracy read off its seed-mean curve at the gap of a frontier point "
             "(\"point\"); \"per seed\": on each seed, that point against the other method's curve of the "
             "same seed. \"—\": the method's curve never got a gap that small.", "",
             matched_table(at), ""]
    if plot:
        parts += [f"![test accuracy against the hard-rate test gap]({plot})", ""]
    ran = {row: sorted({s for p in summary if p["row"] == row for s in p["seeds"]}) for row in info}
    on_page = sorted({s for seeds in ran.values() for s in seeds})
    for row in dict.fromkeys(p["row"] for p in summary):
        constraint = ROWS[row]["constraint"]
        groups = info[row]
        fewer = (f" Seeds {', '.join(map(str, ran[row]))} only, of the page's {', '.join(map(str, on_page))}."
                 if ran[row] != on_page else "")
        parts += [f"### {row}: {TITLES[row]}", "",
                  f"Gap: `{GAP_NAME[GAP[constraint]]}` over the constraint's groups "
                  f"{', '.join(groups['groups'])} (test rows, seed {groups['seed']}: "
                  + ", ".join(f"{n} {c}" for n, c in groups["test_rows"].items()) + f"; {groups.get('columns', '?')} "
                  "input columns)." + (f" From `{groups['command']}` at commit {groups['commit'] or '?'}"
                                       + "".join(f"; seeds {', '.join(map(str, o['seeds'] or []))} from "
                                                 f"`{o['command']}` at commit {o['commit'] or '?'}"
                                                 for o in groups.get("also", [])) + "."
                                       if "command" in groups else "") + fewer
                  + "".join(f" Seed {f['seed']}, {f['setting']} failed, left out of its mean: {f['reason']}"
                            + ("" if f["reason"].endswith(".") else ".") for f in groups.get("failed", [])),
                  "",
                  "| method | setting | test ACC (min–max over seeds) | test gap (min–max) | train ACC | train gap (min–max) | "
                  "FairVFL: optimizer, rounds, tightenings, ε met, train soft gap, τ | EG: its predictors' test / train "
                  "gap | test gap from the cells' sizes | on the frontier |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        every = max(len(p["seeds"]) for p in summary if p["row"] == row)  # EG runs on every seed
        for m in METHODS:
            mine = [p for p in summary if p["row"] == row and p["method"] == m]
            front = set(frontier(curve(summary, row, m)))
            for p in mine:
                run = "" if m != FAIRVFL else (f"{p['optimizer']}, {_num(p['rounds'], '.0f')}, "
                                               f"{_num(p['tightenings'], '.1f')}, {p['met'] or ''}, "
                                               f"{_num(p['train_max_gap'], '.4f')}, {_num(p.get('temperature'), '.3g')}")
                apart = "" if p.get("gap_apart") is None else f"{p['gap_apart']:.3f} / {p['train_gap_apart']:.3f}"
                seeds = "" if len(p["seeds"]) == every else f" ({len(p['seeds'])} of {every} seeds)"
                parts.append(
                    f"| {m} | {p['setting']}{seeds} | {100 * p['acc']:.2f}% ({100 * p['acc_min']:.2f}–{100 * p['acc_max']:.2f}) | "
                    f"{p['gap']:.3f} ({p['gap_min']:.3f}–{p['gap_max']:.3f}) | "
                    f"{_pct(p.get('train_acc'))} | "
                    f"{p['train_gap']:.3f} ({p['train_gap_min']:.3f}–{p['train_gap_max']:.3f}) | {run} | {apart} | "
                    f"{_num(p.get('gap_drawn'))} | {'yes' if (p['gap'], p['acc']) in front else ''} |")
        parts.append("")
    return "\n".join(parts)


NOTES = """\
**Methods.** FairVFL: the in-process engine, linear parties, 3 parties, the constraint of the
row at each ε with every other setting its default (`constraint-measure = "auto"`, i.e. soft
rates; `hard-epsilon = true`, i.e. ε bounds the hard-rate gap on the training rows and the
run tightens its smooth surrogate until it does; `optimizer = "auto"`; `constraint-form =
"pairwise"`), at most the page's round cap (`--rounds`; the stop rule ends a run sooner);
"off" is `fairness = false`. Its columns: rounds, tightenings of the surrogate's bound, on
how many seeds the hard training gap met ε (+ 0.001), the smooth training gap the surrogate
holds, and the temperature τ of its smooth rates σ(z/τ) at the end (a mean over the seeds).
fairlearn EG: `ExponentiatedGradient(LogisticRegression(max_iter=1000), max_iter=50)` with the constraint's moment (`DemographicParity`, `EqualizedOdds`) at
`difference_bound` = the bound (each group against the overall rate, on training rows). Its
classifier is randomised: its figures are expectations over its draws (every row's
probability of a +1 is its predictors' predictions weighted by `weights_`; accuracy and
each group's rates are means of those probabilities, the gap the largest difference of the
expected rates), never one draw. "off" is the plain LogisticRegression. Every model sees the
same columns: the sensitive attribute and its one-hot copies are inputs only where the row
says so. ThresholdOptimizer: fairlearn's post-processing of that LogisticRegression
(`predict_proba`), randomised thresholds per group, in expectation too; it needs each test
row's group when it predicts, so it is not a model of the same inputs; shown for reference.

**Groups.** Every method is trained and scored on the groups FairVFL's run constrains (COMPAS
race: Asian, Native American and Other pooled into one group, decided on the whole table's
counts, `pool-small-groups = true`; the others have no small group). The own CSV is Adult's
packaged table with `age_band = "<40" | "40+"` from `age`, run as `dataset = "csv"`,
`csv.sensitive = "sex,age_band"` (four groups; `age` stays a feature).

**Matched gaps.** The gap on the x-axis is the hard-rate test gap (fairlearn's
`demographic_parity_difference` or `equalized_odds_difference`, the largest difference over
the groups); the training gap is the same on the training rows. Per method, each setting's
figures are averaged over the seeds; only non-dominated means count (no other has a smaller
or equal gap and a higher accuracy), and between two of them the accuracy is interpolated
linearly in the gap: predicting with one of the two at random attains that accuracy with a
gap no larger. Above a method's largest frontier gap its accuracy stays that point's; below
its smallest it has none ("—"). The common gaps are the gaps of FairVFL's and EG's frontier
points (shown to 3 decimals). "per seed" pairs each such point's own seed figures with the
other method's curve of that seed at the seed's gap. FairVFL − EG is in percentage points.

**Test gap from the cells' sizes.** A test cell (a group, and for equalized odds a label) of a
few rows moves a rate in steps of 1/rows (COMPAS race: 8 to 14 test rows with y = +1 in the
smallest groups). The column is each setting's mean over the seeds of `drawn_gap` (this script): the
test gap the classifier shows where every test cell holds as many rows as the split's, drawn
from the same cell's training rows (400 draws), i.e. were its rates on test rows those on
training rows. A test gap near it is what the cells' sizes give, not a rate that failed to
carry over; a deterministic classifier's (FairVFL's sign(z)) is higher than a randomised one's
at the same training gap, since EG's expected rates average probabilities.

**EG without cancelling.** EG's classifier draws one of a few deterministic predictors (each a
LogisticRegression on reweighted rows); its expected group rates are the weighted means of
theirs, so one predictor's lean toward a group can cancel another's lean against it, and the
mixture's gap is often far below every one of its predictors' (COMPAS race: a training gap of
0.002 from predictors with gaps of 0.05 to 0.15). No deterministic classifier, FairVFL's
sign(z) included, can cancel gaps that way. "EG: its predictors' test / train gap" is the
weighted mean of their own gaps, the gap the mixture would have without cancelling (and what
the curves' linear reading grants FairVFL between two of its models); "EG without cancelling"
reads EG's accuracy at that gap. A row whose reading says "at or above EG without its draws'
cancelling" is below EG only by what its randomisation cancels."""


def plot_curves(summary: list[dict], points: list[dict], rows: list[str], path: Path) -> bool:
    """Test accuracy against the hard-rate test gap, one panel per row: the seed-mean curves and,
    faint, each seed's points; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cols = min(len(rows), 3)
    fig, axes = plt.subplots((len(rows) + cols - 1) // cols, cols, figsize=(4.4 * cols, 3.8 * ((len(rows) + cols - 1) // cols)),
                             squeeze=False)
    style = {FAIRVFL: ("C0", "o"), EG: ("C1", "s"), THRESHOLD: ("C2", "*")}
    for ax, row in zip(axes.flat, rows):
        for m in METHODS:
            pts = sorted(curve(summary, row, m))
            if not pts:
                continue
            color, marker = style[m]
            front = frontier(pts)
            ax.plot(*zip(*front), color=color, lw=1.2)
            ax.scatter(*zip(*pts), color=color, marker=marker, s=60 if marker == "*" else 22,
                       label=m.replace(" (group at prediction time)", "\n(group at prediction)"))
            seeds = curve(points, row, m)
            ax.scatter(*zip(*seeds), color=color, marker=marker, s=8, alpha=0.3)
        gap = GAP_NAME[GAP[ROWS[row]["constraint"]]]
        ax.set_title(row, fontsize=10)
        ax.set_xlabel(f"test {gap}")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(rows):]:
        ax.set_visible(False)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> None:
    """Run the rows and publish the page (and the plot) after each."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS),
                    help=f"comma list of {', '.join(ROWS)} ('': none, the kept rows' page written again)")
    ap.add_argument("--seeds", default="0,1,2", help="comma list of seeds")
    ap.add_argument("--epsilons", default=",".join(map(str, EPSILONS)), help="FairVFL's ε grid")
    ap.add_argument("--bounds", default=",".join(map(str, BOUNDS)), help="fairlearn EG's difference bounds")
    ap.add_argument("--rounds", type=int, default=100, help="FairVFL's round cap (num-server-rounds)")
    ap.add_argument("--quick", action="store_true", help=f"a smoke run: ε and bounds {QUICK} only")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="run-config override of every FairVFL run, flwr run's --run-config syntax (repeatable)")
    ap.add_argument("--name", type=page_name, default="groups", help="results page name")
    ap.add_argument("--keep", action="store_true", help="keep the page's rows this call does not run (run with the "
                    "same settings; its json, read at every publish)")
    ap.add_argument("--keep-from", type=Path, action="append", default=[], metavar="JSON",
                    help="another page's json whose rows (run with the same settings, not rerun here) join this page")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    rows = [r for r in a.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        ap.error(f"--rows {','.join(unknown)}: choose from {', '.join(ROWS)}")
    try:
        overrides = parse_run_config(a.set)
        seeds = [int(s) for s in a.seeds.split(",")]
        epsilons = QUICK if a.quick else tuple(float(e) for e in a.epsilons.split(","))
        bounds = QUICK if a.quick else tuple(float(b) for b in a.bounds.split(","))
    except (RunConfigArgError, ValueError) as exc:
        ap.error(str(exc))
    clash = sorted(set(overrides) & {"dataset", "seed", "constraint", "fairness", "epsilon", "num-server-rounds"})
    if clash:
        ap.error(f"--set {clash[0]}=...: the bench sets {clash[0]} itself")
    if not rows and not (a.keep or a.keep_from):
        ap.error("--rows '' writes the kept rows' page again: add --keep (the page's own rows) or --keep-from JSON")
    settings = {"rounds": a.rounds, "epsilons": list(epsilons), "bounds": list(bounds), "seeds": seeds,
                "overrides": overrides}
    kept_from = [*a.keep_from, *([page(a.name, a.out).with_suffix(".json")] if a.keep else [])]

    def on_page(results: list[dict], info: dict) -> tuple[list[dict], dict]:
        kept, kept_info = kept_pages(kept_from, rows, settings)
        return kept + results, {**kept_info, **info}

    results, info = [], {}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as csv_folder:
        for i, row in enumerate(rows):
            for j, seed in enumerate(seeds):
                pts, groups = points(row, seed, epsilons, bounds, a.rounds, overrides, Path(csv_folder))
                results += pts
                failed = groups.pop("failed")
                mine = info.setdefault(row, {"command": this_command(), "commit": commit(), **groups, "seed": seed,
                                             "seeds": [], "failed": []})
                mine["seeds"].append(seed)
                mine["failed"] += failed
                rest = seeds[j + 1:]
                publish(a.out, a.name, settings, *on_page(results, info),
                        [f"{row} (seeds {', '.join(map(str, rest))})"] * bool(rest) + rows[i + 1:])
    if not rows:  # --rows '': the kept rows' page again
        results, info = on_page(results, info)
        if info:
            publish(a.out, a.name, settings, results, info, [])


def publish(out: Path, name: str, settings: dict, results: list[dict], info: dict, missing: list[str]) -> None:
    """Write the page of every row in ``info`` (and, into docs/results, the reference pages' tables)."""
    done = [r for r in ROWS if r in info]  # the page's rows in the bench's order
    results.sort(key=lambda p: done.index(p["row"]))
    summary = summarise(results)
    at, at_train = matched(summary, results), matched(summary, results, "train")
    rows = verdicts(summary, at, at_train)
    plot = f"{name}.png" if importlib.util.find_spec("matplotlib") else None
    notes = NOTES + ("" if plot else "\n\nNo plot: matplotlib is not installed.")
    notes += "" if not missing else "\n\nNot yet run: " + ", ".join(missing) + "."
    runs = [run_of(r["command"], r["commit"]) for i in (info[row] for row in done) for r in (i, *i.get("also", []))
            if "command" in r]
    notes += f"\n\n{made_by(runs)}" if runs else ""
    write(out, name, {**settings, "groups": info, "matched": at, "matched_train": at_train, "verdicts": rows,
                      "summary": summary, "points": results},
          markdown(summary, at, info, plot, at_train),
          title="Accuracy against the hard-rate gap: FairVFL, fairlearn EG (expected) and ThresholdOptimizer",
          notes=notes)
    if plot:  # after the page, which names the commit it was written at: a plot written first marks that changed
        plot_curves(summary, results, done, page(name, out).parent / plot)
    if Path(out).resolve() == Path(DEFAULT_OUT).resolve():  # the reference pages show the same tables
        include(REPO / "docs" / "fairness-constraints.md", name, verdict_table(rows))
        include(REPO / "docs" / "compare.md", name, verdict_table(rows))


if __name__ == "__main__":
    main()
