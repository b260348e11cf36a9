"""The paper's numbers: its Tables 1 (linear) and 2 (MLP), read from ``paper_tables.csv``.

One CSV row per (table, method, dataset): test ACC in percent, DFP and DFN as printed in
the paper. The compare command prints them under its own tables and plots them as
hollow points next to the measured ones.
"""

from __future__ import annotations

import csv
from functools import cache
from importlib import resources

PAPER_EPSILONS = (0.001, 0.01, 0.05, 0.1, 0.5)
DATASET_TITLES = {"adult": "Adult", "compas": "Compas", "crime": "Crime"}
TABLE_TITLES = {"linear": "Table 1 (linear model)", "mlp": "Table 2 (MLP)"}
TABLES_FILE = "paper_tables.csv"


@cache
def paper_tables() -> dict[str, dict[str, dict[str, tuple[float, float, float]]]]:
    """model -> method (the paper's row name, in its order) -> dataset -> (ACC %, DFP, DFN)."""
    tables: dict[str, dict[str, dict[str, tuple[float, float, float]]]] = {}
    with resources.files(__package__).joinpath(TABLES_FILE).open(encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            cells = tables.setdefault(row["model"], {}).setdefault(row["method"], {})
            cells[row["dataset"]] = (float(row["acc_percent"]), float(row["dfp"]), float(row["dfn"]))
    return tables


def fairvfl_name(eps: float, tag: str = "") -> str:
    """``FairVFL(ε=1e-3)``, as the paper writes it; ``FairVFL-EO(ε=1e-2)`` with ``tag="EO"``."""
    mant, _, exp = f"{eps:.0e}".partition("e")
    name = "FairVFL" + (f"-{tag}" if tag else "")
    return f"{name}(ε={mant}e{int(exp)})" if float(f"{eps:.0e}") == eps else f"{name}(ε={eps:g})"
