"""Train, save, score and report once, and copy what a user gets into docs/results/scoring/example/.

    python scripts/scoring_example.py [--dataset adult] [--rounds 1000] [--out /tmp/scoring-example]

Runs the real ServerApp and ClientApp over the in-process grid (``flwr run`` runs the same
code, tests/test_scoring.py checks both give the same numbers): a FairVFL training run
(every party saves its block), a scoring job on the packaged test rows, and the fairness
report with the server's labels as the outcomes. Copies the model card, party 0's card,
the first rows of predictions.csv, report.json and report.png to docs/results/scoring/example/.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.data import model_files
from fairvfl_flwr.data.partydata import label_table
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.tools import report

DOCS = Path(__file__).resolve().parents[1] / "docs" / "results" / "scoring" / "example"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="adult")
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--out", default="/tmp/scoring-example")
    ap.add_argument("--docs", default=str(DOCS), help="where the example files go ('' : nowhere)")
    a = ap.parse_args()
    out = Path(a.out)
    rc = {"dataset": a.dataset, "num-server-rounds": a.rounds, "output-dir": str(out / "train")}
    summary, folder = run_inprocess(rc, quiet=True)
    print(f"trained: {folder} (test ACC {summary['test_acc']:.4f} DFP {summary['test_dfp']:.4f} "
          f"DFN {summary['test_dfn']:.4f})")
    scored, score_folder = run_inprocess({**rc, "mode": "score", "score.model-from": str(folder),
                                          "output-dir": str(out / "score")}, quiet=True)
    print(f"scored: {scored['rows']} rows in {scored['chunks']} chunk(s), {scored['seconds']:.2f} s -> "
          f"{scored['predictions']}")
    labels = out / "server_labels.csv"
    label_table(load_data(RunConfig.from_flower(rc))).to_csv(labels, index=False)
    report.main([str(score_folder / "predictions.csv"), "--outcomes", str(labels)])
    rep = json.loads((score_folder / "report.json").read_text())
    same = all(abs(rep["gaps"][k] - summary[f"test_{k}"]) < 1e-12 for k in ("dfp", "dfn"))
    print(f"report on the scored test rows equals the training run's test DFP/DFN: {same}")
    if a.docs:
        docs = Path(a.docs)
        docs.mkdir(parents=True, exist_ok=True)
        shutil.copy(folder / model_files.RUN_CARD, docs / "model-card.md")
        shutil.copy(folder / model_files.PARTIES / "partition-0" / model_files.PARTY_CARD, docs / "party-0-card.md")
        for name in ("report.json", "report.png"):
            shutil.copy(score_folder / name, docs / name)
        lines = (score_folder / "predictions.csv").read_text().splitlines()[:11]
        (docs / "predictions-head.csv").write_text("\n".join(lines) + "\n")
        print(f"example files in {docs}")


if __name__ == "__main__":
    main()
