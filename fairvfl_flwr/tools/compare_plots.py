"""fairvfl-compare's plots: the paper's Figures 1-2 (convergence) and accuracy against fairness."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from fairvfl_flwr.tools.compare_methods import FEDBCD_NAME, rows_in_order
from fairvfl_flwr.tools.paper import DATASET_TITLES, paper_tables


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _history(run_dir: str) -> list[dict]:
    return json.loads((Path(run_dir) / "history.json").read_text())


def plot_convergence(records: list[dict], model: str, path: Path) -> None:
    """L(θ) and the largest gap (DEO for the paper's runs) on the training rows against
    rounds, FedBCD and every ε (first seed).

    Only the paper's DEO runs: the FairVFL-EO / -DP rows constrain other gaps, on rates.
    """
    runs = [r for r in records if r["model"] == model and r.get("run_dir") and
            (r["method"] == FEDBCD_NAME or r["method"].startswith("FairVFL("))]
    if not runs:
        return
    plt = _pyplot()
    datasets = list(dict.fromkeys(r["dataset"] for r in runs))
    seed = min(r["seed"] for r in runs)
    fig, axes = plt.subplots(2, len(datasets), figsize=(4.2 * len(datasets), 6.4), squeeze=False)
    for j, d in enumerate(datasets):
        sel = sorted([r for r in runs if r["dataset"] == d and r["seed"] == seed],
                     key=lambda r: (r["epsilon"] is not None, r["epsilon"] or 0))
        for i, r in enumerate(sel):
            h = _history(r["run_dir"])
            color = "k" if r["method"] == FEDBCD_NAME else f"C{i}"
            label = FEDBCD_NAME if r["method"] == FEDBCD_NAME else rf"$\epsilon$={r['epsilon']:g}"
            rounds = [x["round"] for x in h]
            axes[0, j].plot(rounds, [x["loss"] for x in h], color=color, lw=1.2, label=label)
            deo = [max(x["max_gap"], 1e-5) for x in h]
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
    plt = _pyplot()
    rows = [r for r in records if r["model"] == model and r["dataset"] == dataset]
    paper = paper_tables().get(model, {})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric in zip(axes, ("dfp", "dfn")):
        for i, m in enumerate(rows_in_order(rows, epsilons)):
            sel = [r for r in rows if r["method"] == m]
            xs, ys = [r[metric] for r in sel], [100 * r["acc"] for r in sel]
            sx = statistics.stdev(xs) if len(xs) > 1 else 0
            sy = statistics.stdev(ys) if len(ys) > 1 else 0
            marker = "o" if m.startswith("FairVFL") else "s"
            ax.errorbar(statistics.mean(xs), statistics.mean(ys), xerr=sx, yerr=sy, fmt=marker, color=f"C{i}",
                        label=m, ms=6, capsize=2)
            if dataset in paper.get(m, {}):
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
