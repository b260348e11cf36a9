"""Leakage audit: what an honest-but-curious passive party learns from ν.

::

    python -m fairvfl_flwr.tools.audit --datasets adult,compas,crime --rounds 300 --out results/audit
    python -m fairvfl_flwr.tools.audit --datasets adult --noise 0,1,4,16    # with the nu-noise defence

For each dataset the command trains FairVFL (in-process grid, real ClientApp) with
``privacy.record-view`` on, so every passive party keeps the ν it received on its own side,
then attacks party 1's transcript and scores the attacks against the truth, which the
attacker never sees:

* **labels**: ``ŷ_i = −sign(ν_i)``. Since ν_i = w_i ∂l/∂z_i and ∂l/∂z_i = −y_i σ(−y_i z_i),
  the sign gives the label wherever the row weight w_i is positive. In round 1, z = 0
  and λ = 0, so ν_i = −y_i / (2n) exactly. Scored as accuracy on round 1's ν and on the
  last recorded round's (where a large λ can make a group's weight negative), next to
  the majority-class baseline; and on the mean of the first 10 rounds' ν, which strips
  zero-mean noise (the ``privacy.nu-noise`` defence) off.
* **groups** of the protected-label rows: ν_i(t) = w_g(t) o_i(t) with one weight per
  group g ∈ {N^a, N^b, rest} that moves with λ1 − λ2. The attacker takes the per-round
  log-ratios log|ν_i(t)/ν_i(t−1)|, centres them per round, and projects each row on
  the first principal component: rows of the same group share the weight's moves.
  Scored as AUC against the true group (max(AUC, 1 − AUC): the attacker learns the
  partition, not which side is called "a"), next to 0.5 for guessing.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config.run import RunConfig
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.features import record_view as view


def auc(score: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve (Mann–Whitney, ties averaged)."""
    score, positive = np.asarray(score, float), np.asarray(positive, bool)
    n_pos, n_neg = positive.sum(), (~positive).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    _, inv, counts = np.unique(score, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    ranks = (sums / counts)[inv]
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def label_attack(nu: np.ndarray) -> np.ndarray:
    """ŷ = −sign(ν) (ν = 0 guessed positive)."""
    return np.where(nu <= 0, 1, -1)


def group_scores(nus: np.ndarray) -> np.ndarray:
    """One score per row from the co-movement of |ν_i| across recorded rounds."""
    mag = np.log(np.abs(nus.astype(np.float64)) + 1e-300)
    steps = np.diff(mag, axis=0)  # rounds-1 × rows
    steps -= np.median(steps, axis=1, keepdims=True)  # remove moves all rows share
    steps = steps[np.isfinite(steps).all(axis=1)]
    # First principal component across rows (SVD of the small rounds × rows matrix).
    _, _, vt = np.linalg.svd(steps - steps.mean(axis=1, keepdims=True), full_matrices=False)
    return vt[0]


def audit_transcript(folder: str | Path, partition_id: int, y: np.ndarray, s: np.ndarray, protected_label: int) -> dict:
    """Run both attacks on one party's recorded ν and score them against the truth."""
    majority = float(max((y == 1).mean(), (y == -1).mean()))
    if not view.has_plaintext(folder, partition_id):  # privacy.secure-nu=ckks: the transcript is ciphertext only
        recorded = len(list((Path(folder) / f"party-{partition_id}").glob("nu-ct-r*.bin")))
        if recorded:
            nan = float("nan")  # no per-row plaintext: the attacks have nothing to work on
            return {"rounds_recorded": recorded, "view": "ciphertext", "label_attack_acc": nan,
                    "label_attack_acc_last": nan, "label_attack_acc_avg": nan, "label_baseline_acc": majority,
                    "group_attack_auc": nan, "group_rows_scored": 0}
    rounds, nus = view.load(folder, partition_id)
    # Round 1 is the worst case for the defender: z = 0 and λ = 0, so ν_i = −y_i / (2n).
    y_first = label_attack(nus[0])
    y_last = label_attack(nus[-1])
    # Noise is fresh every round while ∂l/∂z moves slowly: averaging the early rounds
    # (λ still small, so every weight is positive) strips zero-mean noise off ν.
    y_avg = label_attack(nus[rounds <= view.EARLY_ROUNDS].mean(axis=0))
    # The attacker restricts the group attack to rows it believes carry the protected label.
    chosen = y_first == protected_label
    score = group_scores(nus)
    truth_rows = chosen & (y == protected_label)
    a = auc(score[truth_rows], s[truth_rows])
    return {
        "rounds_recorded": int(len(rounds)),
        "view": "plaintext",
        "label_attack_acc": float((y_first == y).mean()),
        "label_attack_acc_last": float((y_last == y).mean()),
        "label_attack_acc_avg": float((y_avg == y).mean()),
        "label_baseline_acc": majority,
        "group_attack_auc": float(max(a, 1 - a)),
        "group_rows_scored": int(truth_rows.sum()),
    }


def run_audit(dataset: str, rounds: int, noise: float, seed: int = 0, overrides: dict | None = None) -> dict:
    """Train with recording on, then attack passive party 1's transcript."""


    with tempfile.TemporaryDirectory() as tmp:
        changes = {
            "dataset": dataset, "num-server-rounds": rounds, "eval-every": rounds, "seed": seed,
            "privacy.record-view": str(Path(tmp) / "views"), "privacy.record-every": 5, "privacy.nu-noise": noise,
            "output-dir": str(Path(tmp) / "runs"), **(overrides or {}),
        }
        cfg = RunConfig.from_flower({**RunConfig().to_flower(), **changes})
        summary, _ = run_inprocess(cfg.to_flower(), quiet=True)
        ds = load_data(cfg)
        result = audit_transcript(cfg.record_view, cfg.num_active, ds.y_train, ds.s_train, ds.protected_label)
    return {"dataset": dataset, "nu_noise": noise, "secure_nu": cfg.secure_nu, "rounds": rounds, "test_acc": summary["test_acc"],
            "test_dfp": summary["test_dfp"], "test_dfn": summary["test_dfn"], "train_deo": summary["train_deo"],
            **result}


def table(rows: list[dict]) -> str:
    lines = [
        "| dataset | nu-noise | label attack acc (round 1) | (last round) | (mean of rounds 1-10) | majority baseline | group attack AUC (guess: 0.5) | test ACC % | DFP | DFN | train DEO |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    def f(v: float) -> str:  # nan: the transcript was ciphertext only (privacy.secure-nu=ckks)
        return "n/a (ciphertext)" if v != v else f"{v:.3f}"

    for r in rows:
        name = r["dataset"] + (" (privacy.secure-nu=ckks)" if r.get("secure_nu") == "ckks" else "")
        lines.append(
            f"| {name} | {r['nu_noise']:g} | {f(r['label_attack_acc'])} | {f(r['label_attack_acc_last'])} | "
            f"{f(r['label_attack_acc_avg'])} | "
            f"{r['label_baseline_acc']:.3f} | "
            f"{f(r['group_attack_auc'])} | {100 * r['test_acc']:.2f} | {r['test_dfp']:.3f} | {r['test_dfn']:.3f} | "
            f"{r['train_deo']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Leakage audit of the masked weights ν (see module docstring).")
    p.add_argument("--datasets", default="adult,compas,crime")
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--noise", default="0", help="comma list of nu-noise levels (units of 1/n)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--secure-nu", default="none", choices=["none", "ckks"], help="audit under encrypted ν (linear)")
    p.add_argument("--out", type=Path, default=Path("results/audit"))
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.perf_counter()
    for dataset in [d.strip() for d in a.datasets.split(",") if d.strip()]:
        for noise in [float(x) for x in a.noise.split(",")]:
            r = run_audit(dataset, a.rounds, noise, a.seed, {"privacy.secure-nu": a.secure_nu})
            rows.append(r)
            print(f"{dataset} privacy.nu-noise={noise:g} privacy.secure-nu={a.secure_nu}: labels {r['label_attack_acc']:.3f} (baseline {r['label_baseline_acc']:.3f}), "
                  f"groups AUC {r['group_attack_auc']:.3f}, test ACC {100 * r['test_acc']:.2f}% "
                  f"[{time.perf_counter() - t0:.0f} s]", flush=True)
            (a.out / "audit.json").write_text(json.dumps(rows, indent=1) + "\n")
            (a.out / "audit.md").write_text(table(rows))
    print(table(rows))
    print(f"{len(rows)} audits in {time.perf_counter() - t0:.0f} s; results in {a.out.resolve()}")


if __name__ == "__main__":
    main()
