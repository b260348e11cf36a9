"""The run folder: resolved config, per-round history, final summary, the Figure-1 plot.

Layout of ``<output-dir>/<run name>/``::

    config.json     the resolved run config (every key, defaults included)
    history.csv     one row per round: L, the largest gap, every gap by name, the multipliers,
                    test ACC/DFP/DFN and fairlearn's DP/EO differences over the groups the run
                    constrained, seconds (DEO adds the paper's DEO, D, λ1, λ2; pooled small
                    groups add the differences over the data's own groups, ``*_raw``); gaps
                    and multipliers as JSON in the CSV
    history.json    the same rows as JSON
    summary.json    final metrics, rounds, wall time, dataset sizes, the groups the figures are over
    convergence.png L(θ) and the largest gap against rounds, with the ε line

The history is rewritten at every evaluation round, so a long run shows its progress
on disk and an interrupted run keeps what it had done.
"""

from __future__ import annotations

import csv
import json
import math
import os
import secrets
import time
from pathlib import Path

from fairvfl_flwr.config.run import RunConfig
from fairvfl_flwr.core.constraints import KINDS, HistoryNames, kind_named

# One schema for every constraint (docs/fairness-constraints.md, "History and summary"):
# max_gap = max_c |D_c|, gaps = {name: D_c}, lambdas = [λ_1+, λ_1-, ...]; dp_diff, eo_diff:
# fairlearn's differences on the test rows, over the groups the run constrained.
COLUMNS = ["round", "loss", "max_gap", "gaps", "lambdas", "acc", "dfp", "dfn", "dp_diff", "eo_diff", "seconds"]
#: constraint = "deo" only: the paper's names (|D|, D and the first gap's two multipliers)
DEO_COLUMNS = ["deo", "gap", "lambda1", "lambda2"]
# max-staleness > 0: partition ids whose logits are from this round, and {partition id: rounds behind}
ASYNC_COLUMNS = ["fresh", "stale"]
# batch-size > 0: training rows loss/deo/gaps were measured on (all rows in evaluation rounds, else the next batch)
BATCH_COLUMNS = ["train_rows"]
#: Rows of runs with a privacy accountant: the ε spent after the row's round.
PRIVACY_COLUMNS = ["dp_epsilon"]
#: Runs that pooled small groups: the test differences over the data's own groups, beside COLUMNS' over the
#: constrained ones (a member with one test row would otherwise decide the figure).
RAW_COLUMNS = ["dfp_raw", "dfn_raw", "dp_diff_raw", "eo_diff_raw"]
#: Runs on a registry's noisy release of the groups: the error the release adds to the gaps (features/registry.py).
RELEASE_COLUMNS = ["release_error", "estimated_gap", "gap_within"]


def run_folder(cfg: RunConfig, run_id: int | str | None = None) -> Path:
    """A new folder under ``output-dir`` named by time and the Flower run id, or a random tag
    where there is none (in process). The name is the run's id in its saved model, which must
    tell two runs apart even when they started in the same second."""
    base = Path(cfg.output_dir).expanduser().resolve()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{stamp}-{cfg.data_name}-{cfg.model}-{secrets.token_hex(3) if run_id is None else run_id}"
    folder, i = base / name, 1
    while folder.exists():
        folder, i = base / f"{name}-{i}", i + 1
    folder.mkdir(parents=True)
    return folder


def _clean(v):
    return None if isinstance(v, float) and math.isnan(v) else v


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunRecorder:
    """Collects history rows and writes the run folder."""

    def __init__(self, folder: Path, cfg: RunConfig, extra: dict | None = None) -> None:
        self.folder = Path(folder)
        self.cfg = cfg
        self.rows: list[dict] = []
        self.folder.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.folder / "config.json", json.dumps({**cfg.to_flower(), **(extra or {})}, indent=2) + "\n")

    def add(self, row: dict) -> None:
        """Append a round's row (in place of the rows from that round on: a round run again after a party
        rejoined); an evaluation round (it holds test accuracy) also rewrites history.json."""
        self.rows = [r for r in self.rows if r.get("round", -1) < row.get("round", 0)]
        self.rows.append(row)
        if not math.isnan(row.get("acc", math.nan)):
            self.write_history()

    def write_history(self) -> None:
        # fresh/stale, train_rows: only bounded-staleness / mini-batch runs have them; other runs keep COLUMNS
        """Write every row so far to history.json, whole, with the columns the run's features add."""
        optional = DEO_COLUMNS + ASYNC_COLUMNS + BATCH_COLUMNS + PRIVACY_COLUMNS + RAW_COLUMNS + RELEASE_COLUMNS
        columns = COLUMNS + [k for k in optional if any(k in r for r in self.rows)]
        rows = [{k: _clean(r.get(k)) for k in columns} for r in self.rows]
        _write_atomic(self.folder / "history.json", json.dumps(rows, indent=1) + "\n")
        tmp = self.folder / "history.csv.tmp"
        with tmp.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            writer.writerows({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()}
                             for r in rows)
        os.replace(tmp, self.folder / "history.csv")

    def finish(self, extra: dict | None = None) -> dict:
        """Write history, summary and plot; return the summary."""
        self.write_history()
        last = self.rows[-1]
        evaluated = [r for r in self.rows if not math.isnan(r.get("acc", math.nan))]
        final_eval = evaluated[-1] if evaluated else {}
        summary = {
            "dataset": self.cfg.data_name,
            "model": self.cfg.model,
            "fairness": self.cfg.fairness,
            "epsilon": self.cfg.epsilon,
            "rounds": last["round"],
            "train_loss": last["loss"],
            "constraint": self.cfg.constraint,
            "constraint_measure": self.cfg.measure,
            "train_max_gap": last["max_gap"],
            "train_gaps": last["gaps"],
            "lambdas": last["lambdas"],
            **kind_named(self.cfg.constraint).history.summary(last),
            "evaluated_on": "validation" if self.cfg.validation_fraction > 0 else "test",
            **{f"test_{k}": final_eval.get(k) for k in ("acc", "dfp", "dfn", "dp_diff", "eo_diff")},
            **{f"test_{k}": final_eval.get(k) for k in RAW_COLUMNS if k in final_eval},
            "seconds": last["seconds"],
            "seconds_per_round": last["seconds"] / max(1, last["round"]),
            **(extra or {}),
        }
        _write_atomic(self.folder / "summary.json", json.dumps(summary, indent=2) + "\n")
        plot_convergence(self.rows, self.cfg, self.folder / "convergence.png")
        return summary


def plot_convergence(rows: list[dict], cfg: RunConfig, path: Path) -> None:
    """L(θ) and DEO(θ) against rounds with the ε line (the paper's Figure 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [r["round"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot(rounds, [r["loss"] for r in rows], color="C0")
    ax1.set_xlabel("communication round")
    ax1.set_ylabel(r"$L(\theta)$")
    ax1.set_title("training objective")
    ax2.plot(rounds, [r["max_gap"] for r in rows], color="C1", label=rf"max$_c|D_c|$ ({cfg.constraint} on {cfg.measure})")
    if cfg.fairness:
        ax2.axhline(cfg.epsilon, color="k", ls="--", lw=1, label=rf"$\epsilon$ = {cfg.epsilon:g}")
    ax2.set_xlabel("communication round")
    ax2.set_ylabel("largest gap on train")
    ax2.set_ylim(bottom=0)
    ax2.set_title("fairness constraint")
    ax2.legend()
    label = "FairVFL" if cfg.fairness else "FedBCD (fairness off)"
    fig.suptitle(f"{label}: {cfg.data_name}, {cfg.model}, K={cfg.num_parties}, Q={cfg.local_steps}")
    # fixed margins, not tight_layout: the same figure for half the CPU of every run's end
    fig.subplots_adjust(left=0.075, right=0.98, bottom=0.13, top=0.85, wspace=0.27)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def gap_label(summary: dict) -> str:
    """The name of the largest training gap in a summary: its constraint kind's (DEO for the paper's)."""
    kind = KINDS.get(summary.get("constraint"))  # a summary of a kind not registered here: the shared name
    return (kind.history if kind is not None else HistoryNames()).gap_label


def format_summary(summary: dict, folder: Path) -> str:
    """The final table printed at the end of a run."""
    def f(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    groups = summary.get("groups") or {}
    over = f", over the {len(groups)} constrained groups" if summary.get("raw_groups") else ""

    lines = [
        "",
        f"FairVFL run finished: {summary['dataset']} / {summary['model']} / "
        f"fairness {'on, eps=' + format(summary['epsilon'], 'g') if summary['fairness'] else 'off'}",
        f"  rounds            {summary['rounds']}",
        f"  train L(theta)    {summary['train_loss']:.4f}",
        f"  train {gap_label(summary):<12}{summary['train_max_gap']:.4f}  ({summary['constraint']} on "
        f"{summary['constraint_measure']}, largest of {len(summary['train_gaps'])} gap(s))",
        *([f"  train DP diff     {summary['train_dp_diff']:.4f}, EO diff {summary['train_eo_diff']:.4f}  "
           f"(fairlearn's, hard predictions on the training rows{over})"]
          if summary.get("train_dp_diff") is not None else []),
        *([f"  lambda            ({', '.join(f'{v:.4f}' for v in summary['lambdas'][:6])}"
           f"{', ...' if len(summary['lambdas']) > 6 else ''})"]
          if summary["fairness"] else []),  # without the fairness term λ stays 0
        f"  test ACC          {f(None if summary['test_acc'] is None else 100 * summary['test_acc'], '.2f')}%",
        f"  test DFP          {f(summary['test_dfp'], '.4f')}",
        f"  test DFN          {f(summary['test_dfn'], '.4f')}",
        f"  test DP diff      {f(summary.get('test_dp_diff'), '.4f')}  (fairlearn's demographic_parity_difference{over})",
        f"  test EO diff      {f(summary.get('test_eo_diff'), '.4f')}  (fairlearn's equalized_odds_difference{over})",
        *group_lines(summary, f),
        f"  wall time         {summary['seconds']:.1f} s ({1000 * summary['seconds_per_round']:.1f} ms/round)",
        *([f"  to round 1        {summary['seconds_to_round_1']:.1f} s (alignment, set-up)"]
          if summary.get("seconds_to_round_1") is not None else []),
        f"  results           {folder}",
    ]
    return "\n".join(lines)


def group_lines(summary: dict, f) -> list[str]:
    """The final table's lines on the groups: each constrained group's test rows and, where small
    groups were pooled, the differences over the data's own groups, labelled, with their test rows."""
    groups, raw = summary.get("groups") or {}, summary.get("raw_groups")
    if not groups:
        return []
    lines = ["  groups (test rows) " + ", ".join(f"{name} {c['test_rows']}" for name, c in groups.items())]
    if raw:
        lines += [
            f"  raw groups        test DP diff {f(summary.get('test_dp_diff_raw'), '.4f')}, EO diff "
            f"{f(summary.get('test_eo_diff_raw'), '.4f')}"
            + (f"; train DP diff {summary['train_dp_diff_raw']:.4f}, EO diff {summary['train_eo_diff_raw']:.4f}"
               if summary.get("train_dp_diff_raw") is not None else "")
            + f"  (over the data's {len(raw)} groups before pooling, not constrained one by one)",
            "  raw (test rows)   " + ", ".join(f"{name} {c['test_rows']}" for name, c in raw.items()),
        ]
    return lines
