"""Demographic parity without the sensitive attribute as an input: where ε lands on a linear
model's frontier of test accuracy against the hard positive-rate gap, and what moves it.

    python bench/parity_frontier.py                    # docs/results/fairness/parity-frontier.md (COMPAS, seeds 0-5)
    python bench/parity_frontier.py --dataset adult --seeds 0,1,2 --central "1:0.01,0.02" --eg-bounds 0.01,0.02 \\
        --target 0.02,0.83 --name parity-frontier-adult

Every row is measured on the same rows, split and groups, per seed, and reported as its mean
over the seeds and its seed-0 figures: the hard training gap (fairlearn's demographic parity
difference of sign(z) on the training rows), the test accuracy and the hard test gap, and on
how many seeds the test figures meet ``--target`` (gap at most, accuracy at least).

* ``app``: the ServerApp and ClientApps in process with ``dataset``, ``constraint =
  "demographic-parity"`` and ``epsilon`` and every other key at its default (the soft rate
  σ(z), block Newton, the stop rule), and the same run with the sensitive attribute an input.
* ``central``: the constrained problem itself, solved to its optimum in one process (SLSQP):
  min (1/n) Σ log(1 + e^(−y z)) + (μ/2)‖θ‖² subject to |mean_a σ(z/τ) − mean_b σ(z/τ)| ≤ ε,
  z = Xθ + b, μ = 2/n. τ = 1 is the app's measure (its search ends at this optimum); τ < 1 is
  a sharper soft rate, closer to the hard one.
* ``EG``: fairlearn's ExponentiatedGradient over LogisticRegression with DemographicParity
  at each bound (a randomised classifier; test rows only).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, page_name, table, write  # noqa: E402


def hard(y: np.ndarray, s: np.ndarray, z: np.ndarray) -> tuple[float, float]:
    """Accuracy and fairlearn's demographic parity difference of sign(z) (two groups)."""
    pred = np.where(z > 0, 1, -1)
    positive = pred > 0
    return float((pred == y).mean()), float(abs(positive[s].mean() - positive[~s].mean()))


def central(ds, tau: float, eps: float) -> np.ndarray:
    """The optimum of the constrained problem on the soft rate σ(z/τ): θ with its intercept last."""
    from scipy.optimize import minimize

    from fairvfl_flwr.core.constraints.measures import sigmoid

    x = np.column_stack([ds.X_train, np.ones(len(ds.y_train))])
    y, s = ds.y_train, np.asarray(ds.s_train, dtype=bool)
    n, mu = len(y), 2 / len(y)
    side = np.where(s, 1 / s.sum(), -1 / (~s).sum())  # gap = side · q

    def loss(w):
        z = x @ w
        grad = x.T @ (-y * sigmoid(-y * z) / n)
        grad[:-1] += mu * w[:-1]
        return np.logaddexp(0, -y * z).mean() + mu / 2 * w[:-1] @ w[:-1], grad

    def gap(w):
        q = sigmoid(x @ w / tau)
        return side @ q, x.T @ (side * q * (1 - q) / tau)

    start = minimize(loss, np.zeros(x.shape[1]), jac=True, method="L-BFGS-B").x
    bounds = [{"type": "ineq", "fun": lambda w: eps - gap(w)[0], "jac": lambda w: -gap(w)[1]},
              {"type": "ineq", "fun": lambda w: eps + gap(w)[0], "jac": lambda w: gap(w)[1]}]
    return minimize(loss, start, jac=True, method="SLSQP", constraints=bounds, options={"maxiter": 500}).x


def app_run(dataset: str, eps: float, seed: int, race_input: bool) -> dict:
    """The app with the named keys only; its hard training gap is the summary's."""
    from fairvfl_flwr.app.run import run_inprocess

    with tempfile.TemporaryDirectory() as tmp:
        summary, _ = run_inprocess({"dataset": dataset, "constraint": "demographic-parity", "epsilon": eps,
                                    "seed": seed, "sensitive-as-input": race_input, "output-dir": tmp}, quiet=True)
    return {"train_gap": summary["train_dp_diff"], "acc": summary["test_acc"], "gap": summary["test_dp_diff"],
            "rounds": summary["rounds"]}


def measure(dataset: str, seeds: list[int], eps: float, centrals: dict[float, list[float]],
            eg_bounds: list[float]) -> dict[str, list[dict]]:
    """Every setting's figures per seed, by setting name."""
    from fairvfl_flwr.data.tables import load_dataset
    from fairvfl_flwr.tools.baselines import eg_predict

    out: dict[str, list[dict]] = {}
    for seed in seeds:
        ds = load_dataset(dataset, seed, False)
        s, st = np.asarray(ds.s_train, dtype=bool), np.asarray(ds.s_test, dtype=bool)
        for race_input in (False, True):
            name = f"app, eps {eps:g}" + (", sensitive attribute an input" if race_input else "")
            out.setdefault(name, []).append(app_run(dataset, eps, seed, race_input))
        for tau, epss in centrals.items():
            for e in epss:
                w = central(ds, tau, e)
                (_, train_gap), (acc, gap) = hard(ds.y_train, s, ds.X_train @ w[:-1] + w[-1]), \
                    hard(ds.y_test, st, ds.X_test @ w[:-1] + w[-1])
                out.setdefault(f"central, tau {tau:g}, eps {e:g}", []).append(
                    {"train_gap": train_gap, "acc": acc, "gap": gap})
        for b in eg_bounds:
            pred = eg_predict(ds.X_train, ds.y_train, s, ds.X_test, ds.protected_label, "demographic-parity",
                              seed=seed, bound=b)
            acc, gap = hard(ds.y_test, st, pred.astype(float))
            out.setdefault(f"fairlearn EG, bound {b:g}", []).append({"train_gap": None, "acc": acc, "gap": gap})
        print(json.dumps({"seed": seed, **{k: v[-1] for k, v in out.items()}}), flush=True)
    return out


def rows(results: dict[str, list[dict]], target_gap: float, target_acc: float) -> list[dict]:
    """One row per setting: means over the seeds, seed 0's (the first seed's) figures, the seeds meeting the target."""
    def mean(key, runs):
        vals = [r[key] for r in runs if r[key] is not None]
        return round(float(np.mean(vals)), 3) if vals else "—"

    out = []
    for name, runs in results.items():
        first = runs[0]
        out.append({"setting": name, "train hard gap": mean("train_gap", runs), "test DP diff": mean("gap", runs),
                    "test ACC %": round(100 * float(np.mean([r["acc"] for r in runs])), 2),
                    "first seed: DP diff": round(first["gap"], 3), "first seed: ACC %": round(100 * first["acc"], 2),
                    **({"rounds": "/".join(str(r["rounds"]) for r in runs)} if "rounds" in first else {"rounds": ""}),
                    f"seeds with gap <= {target_gap:g} and ACC >= {100 * target_acc:g} %":
                        f"{sum(r['gap'] <= target_gap and r['acc'] >= target_acc for r in runs)}/{len(runs)}"})
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="compas")
    p.add_argument("--seeds", default="0,1,2,3,4,5")
    p.add_argument("--epsilon", type=float, default=0.02, help="the app runs' epsilon")
    p.add_argument("--central", default="1:0.01,0.02,0.03;0.5:0.02,0.04;0.3:0.02,0.06,0.1",
                   help="tau:eps,eps;tau:eps,... for the one-process optimum")
    p.add_argument("--eg-bounds", default="0.02,0.05,0.08")
    p.add_argument("--target", default="0.08,0.64", help="test gap at most, test accuracy at least")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--name", type=page_name, default="parity-frontier")
    args = p.parse_args(argv)
    seeds = [int(v) for v in args.seeds.split(",")]
    centrals = {float(t): [float(e) for e in es.split(",")]
                for t, es in (part.split(":") for part in args.central.split(";") if part)}
    target_gap, target_acc = (float(v) for v in args.target.split(","))
    results = measure(args.dataset, seeds, args.epsilon, centrals,
                      [float(b) for b in args.eg_bounds.split(",") if b])
    found = rows(results, target_gap, target_acc)
    write(Path(args.out), args.name, {"rows": found, "seeds": seeds}, table(found, list(found[0])),
          title=f"Demographic parity on {args.dataset}: accuracy against the hard gap",
          notes=f"Seeds {','.join(map(str, seeds))} (means over them; 'first seed' is seed {seeds[0]}). Linear "
                "models; the sensitive attribute is no input except where a row says so. 'train hard gap' and "
                "'test DP diff' are fairlearn's demographic parity difference of the hard predictions; the app's "
                "epsilon bounds the soft rate (docs/newton.md, 'Rates'). EG's classifier is randomised; its "
                "training gap is not measured.")


if __name__ == "__main__":
    main()
