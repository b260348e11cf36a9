"""The README's two tables, from the results they summarise: no hand copy to drift.

    python bench/readme_tables.py      # rewrites docs/results/audits/privacy-summary.md and both README blocks

Table 1 is the linear table tools/compare generated (docs/results/compare/table_linear.md).
"What each party learns" is built here from the audit pages' JSON: the server's Gram matrix
error without a defence (audit-eval-newton) and under secure aggregation
(audit-eval-newton-secagg), the strongest label attack under label DP at ε = 2
(audit-labeldp-eps2) and the lying server's consistent probe (audit-malicious). Nothing is
measured: rerun the audits' commands (each page names its own) and then this script.
tests/test_docs.py checks that the README's blocks are these tables and the summary page is
what its sources give.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairvfl_flwr.tools.results import RESULTS, include, page, publish, this_command  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATASETS = ("crime", "compas", "adult")
SOURCES = {"none": "audit-eval-newton", "secagg": "audit-eval-newton-secagg", "labeldp": "audit-labeldp-eps2",
           "malicious": "audit-malicious"}
#: What the audit's lying server (--malicious) is refused; each is a row of audit-malicious.md.
REFUSED = ("different ν per party, a re-sent round with changed ν, a rejoin, restart or session that steps one "
           "party away from the others (every party keeps one signed history), forged demo keys, unmasked runs, "
           "replayed alignment sessions and the alignment's dictionary test")


def first_table(markdown: str) -> str:
    """The first markdown table of a page (its header, rule and rows)."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def _sig(x: float) -> str:
    """Two significant digits, exponents without a leading zero (1.7e-6)."""
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{x:.2g}")


def _per_dataset(runs: list[dict], key: str, fmt, pick=max) -> str:
    return " / ".join(fmt(pick(r[key] for r in runs if r["dataset"] == d)) for d in DATASETS)


def privacy_table(pages: dict[str, dict]) -> str:
    """The README's "What each party learns" table from the audits' JSON (``pages``: SOURCES' keys)."""
    plain, masked, dp = pages["none"]["runs"], pages["secagg"]["runs"], pages["labeldp"]["runs"]
    probe = next(r for r in pages["malicious"]["runs"]
                 if r["dataset"] == "crime" and r["role"].startswith("the same probe ν to every passive party"))
    err, rounds = re.search(r"error ([\d.e+-]+) after (\d+) rounds", probe["result"]).groups()
    rows = [
        ("none", f"rebuilds a passive party's Gram matrix (error {_per_dataset(plain, 'server_gram_error', _sig)}, "
                 "Newton)", "the same"),
        ("secure aggregation (a deployment's default)",
         f"sees only z: error {_per_dataset(masked, 'server_gram_error_col', '{:.1f}'.format)}",
         f"refused: {REFUSED}; the same probe ν to every party gives their summed Gram matrix "
         f"(crime: {float(err):.2f} after {rounds} rounds)"),
        ("label DP on ν, ε = 2 (against passive parties)",
         f"label attack {_per_dataset(dp, 'label_attack_best', '{:.3f}'.format)}, "
         f"majority {_per_dataset(dp, 'label_baseline_acc', '{:.3f}'.format)}", "the server may leave the noise out"),
    ]
    return "\n".join(["| defence | honest-but-curious server | malicious server |", "|---|---|---|",
                      *(f"| {a} | {b} | {c} |" for a, b, c in rows)])


def load(folder: Path = RESULTS) -> dict[str, dict]:
    """The audit pages' JSON the privacy table reads."""
    return {key: json.loads(page(name, folder).with_suffix(".json").read_text()) for key, name in SOURCES.items()}


def main() -> int:
    pages = load()
    table = privacy_table(pages)
    notes = ("Each cell: crime / compas / adult. Sources, each with the command that measured it: "
             + ", ".join(f"[{name}.md]({os.path.relpath(page(name), page('privacy-summary').parent)})"
                         for name in SOURCES.values())
             + ". The strongest label attack is the best of the audit's attackers over its repeats; "
               "\"majority\" guesses every label as the larger class.")
    publish("privacy-summary", this_command(), {"sources": {k: p["command"] for k, p in pages.items()}},
            table, title="What each party learns: the README's summary of the privacy audit", notes=notes)
    readme = REPO / "README.md"
    linear = first_table((RESULTS / "compare" / "table_linear.md").read_text())
    for name, block in (("compare/table_linear", linear), ("privacy-summary", table)):
        if not include(readme, name, block):
            raise SystemExit(f"README.md has no <!-- results/{name}: begin --> ... end --> block")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
