"""Label DP: test accuracy, DFP, DFN and the passive party's attacks against the privacy ε.

::

    python bench/labeldp_curve.py --datasets adult,compas,crime --eps 0.5,1,2,4,8,inf --rounds 100 \\
        --out results/labeldp --png docs/results/privacy/labeldp-curve.png

Every point is one audit (``fairvfl_flwr.tools.audit.run_audit``): a real in-process run
with transcripts, then the passive party's label and group attacks on what it received.
``inf`` is the plain run (no label DP, λ not clipped). The λ bound per dataset is a public
setting chosen near the largest λ of a plain run (``--lambda-bound``). Also prints, from
the accountant alone, the ε that the same noise multiplier gives after 20 and after 1,000
rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fairvfl_flwr.features.labeldp import epsilon_spent, noise_multiplier_for  # noqa: E402
from fairvfl_flwr.tools.results import RESULTS, page, publish, this_command, unfiled  # noqa: E402
from fairvfl_flwr.tools.audit import run_audit  # noqa: E402

#: Λ per dataset: about the largest λ a plain 300-round run reaches (Adult 0.12, COMPAS 0.31, Crime 0.62).
LAMBDA_BOUND = {"adult": 0.1, "compas": 0.3, "crime": 0.6}


def accountant_table(eps_list: list[float], delta: float, rounds: tuple[int, ...] = (20, 100, 300, 1000)) -> str:
    """For a σ calibrated to ε over R rounds: the ε of the same σ over each round count."""
    lines = ["| calibrated for | noise multiplier | " + " | ".join(f"ε after {r} rounds" for r in rounds) + " |",
             "|---|---|" + "---|" * len(rounds)]
    for base in (20, 1000):
        for eps in eps_list:
            z = noise_multiplier_for(eps, delta, base)
            cells = " | ".join(f"{epsilon_spent(z, r, delta):.3g}" for r in rounds)
            lines.append(f"| ε={eps:g} over {base} rounds | {z:.3f} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", default="adult")
    p.add_argument("--eps", default="0.5,1,2,4,8,inf")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--lambda-bound", default="", help="dataset=value,... (default: LAMBDA_BOUND)")
    p.add_argument("--nu-noise", type=float, default=0.0, help="privacy.nu-noise on top (units of 1/n)")
    p.add_argument("--out", type=Path, default=Path("results/labeldp"))
    p.add_argument("--png", type=Path, default=None)
    p.add_argument("--results", type=Path, default=RESULTS,
                   help="where the results page <out folder's name>.md and its .json go")
    p.add_argument("--from-json", type=Path, nargs="*", default=[],
                   help="print and plot the points of earlier runs (their curve.json) instead of running")
    a = p.parse_args(argv)
    if why := unfiled(a.out.name, a.results):
        p.error(why)
    if a.from_json:
        rows = [r for f in a.from_json for r in json.loads(f.read_text())]
        print(table(rows))
        if a.png is not None:
            plot(rows, a.png, rows[0]["rounds"])
        return
    bounds = dict(LAMBDA_BOUND)
    for item in filter(None, a.lambda_bound.split(",")):
        name, _, value = item.partition("=")
        bounds[name.strip()] = float(value)
    a.out.mkdir(parents=True, exist_ok=True)
    eps_list = [float(e) for e in a.eps.split(",")]
    print(accountant_table([e for e in eps_list if math.isfinite(e)], a.delta), flush=True)
    rows, t0 = [], time.perf_counter()
    datasets = [d.strip() for d in a.datasets.split(",") if d.strip()]
    for ds in datasets:
        for eps in eps_list:
            over = {"privacy.label-dp-delta": a.delta}
            if math.isfinite(eps):
                over.update({"privacy.label-dp-epsilon": eps, "privacy.label-dp-lambda-bound": bounds[ds]})
            r = run_audit(ds, a.rounds, a.nu_noise, overrides=over)
            r["target_epsilon"] = eps
            rows.append(r)
            print(f"{ds} ε={eps:g}: ACC {100 * r['test_acc']:.2f} DFP {r['test_dfp']:.3f} DFN {r['test_dfn']:.3f} "
                  f"DEO {r['train_deo']:.4f} | labels r1 {r['label_attack_acc']:.3f} avg {r['label_attack_acc_avg']:.3f} "
                  f"last {r['label_attack_acc_last']:.3f} (majority {r['label_baseline_acc']:.3f}) "
                  f"groups AUC {r['group_attack_auc']:.3f} [{time.perf_counter() - t0:.0f} s]", flush=True)
            (a.out / "curve.json").write_text(json.dumps(rows, indent=1, default=float) + "\n")
    md = table(rows)
    print(md)
    if a.png is not None:
        plot(rows, a.png, a.rounds)
        print(f"figure: {a.png}")
        md = f"![test accuracy, DFP and DFN against the label-DP ε]({os.path.relpath(a.png.resolve(), page(a.out.name, a.results).parent.resolve())})\n\n" + md
    notes = (f"Each point is one audit: a real in-process run of {a.rounds} rounds with transcripts, then the attacks on "
             f"what the passive party received; δ = {a.delta:g}, Λ per dataset {[bounds[d] for d in datasets]}.")
    written = publish(a.out.name, this_command(), {"rows": rows}, md, title=f"Label DP against ε: {', '.join(datasets)}",
                      notes=notes, out=a.results)
    print(f"results page: {written}")


def table(rows: list[dict]) -> str:
    lines = ["| dataset | ε (δ=1e-5) | Λ | noise std × n | test ACC % | DFP | DFN | train DEO | labels, round 1 | "
             "labels, mean of rounds 1–10 | labels, last round | majority | groups AUC |", "|" + "---|" * 13]
    for r in rows:
        eps = r["target_epsilon"]
        dp = math.isfinite(eps)
        n_std = f"{r['label_dp_noise_std'] * r['n_train']:.3g}" if dp and r.get("n_train") else ("–" if not dp else "")
        lines.append(
            f"| {r['dataset']} | {'∞ (off)' if not dp else format(r['label_dp_epsilon'], '.3g')} | "
            f"{r['label_dp_lambda_bound'] if dp else '–'} | {n_std} | {100 * r['test_acc']:.2f} | "
            f"{r['test_dfp']:.3f} | {r['test_dfn']:.3f} | {r['train_deo']:.4f} | {r['label_attack_acc']:.3f} | "
            f"{r['label_attack_acc_avg']:.3f} | {r['label_attack_acc_last']:.3f} | {r['label_baseline_acc']:.3f} | "
            f"{r['group_attack_auc']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path, rounds: int) -> None:
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.4), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        pts = [r for r in rows if r["dataset"] == ds]
        finite = sorted((r for r in pts if math.isfinite(r["target_epsilon"])), key=lambda r: r["target_epsilon"])
        plain = [r for r in pts if not math.isfinite(r["target_epsilon"])]
        xs = [r["target_epsilon"] for r in finite]
        ax.plot(xs, [r["test_acc"] for r in finite], "o-", label="test ACC")
        ax.plot(xs, [r["test_dfp"] for r in finite], "s-", label="DFP")
        ax.plot(xs, [r["test_dfn"] for r in finite], "^-", label="DFN")
        for r in plain:
            ax.axhline(r["test_acc"], color="C0", ls=":", lw=1)
            ax.axhline(r["test_dfp"], color="C1", ls=":", lw=1)
            ax.axhline(r["test_dfn"], color="C2", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"label-DP ε (δ = 1e-5, {rounds} rounds)")
        ax.set_title(f"{ds} (dotted: no label DP)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
