"""fairvfl-compare's tables: the paper's layout, measured (mean ± std over seeds) and the paper's own."""

from __future__ import annotations

import math

from fairvfl_flwr.tools.compare_methods import rows_in_order
from fairvfl_flwr.tools.paper import DATASET_TITLES, TABLE_TITLES, paper_tables
from fairvfl_flwr.tools.tables import hms, markdown, mean_std


def table_markdown(records: list[dict], model: str, epsilons: list[float], datasets: list[str] | None = None,
                   wall: float | None = None) -> str:
    """Rows = methods, columns = ACC/DFP/DFN per dataset; then the paper's numbers in the same layout."""
    rows = [r for r in records if r["model"] == model]
    datasets = datasets or [d for d in DATASET_TITLES if any(r["dataset"] == d for r in rows)] or \
        list(dict.fromkeys(r["dataset"] for r in rows))
    title = TABLE_TITLES.get(model, model)
    seeds = sorted({r["seed"] for r in rows})
    rounds = sorted({r["rounds"] for r in rows if r.get("rounds")})
    engines = sorted({r["engine"] for r in rows if r["engine"] != "central"})
    header = ["Method", *[f"{DATASET_TITLES.get(d, d)} {c}" for d in datasets for c in ("ACC", "DFP", "DFN")]]
    measured = []
    for method in rows_in_order(rows, epsilons):
        cells = [method]
        for d in datasets:
            sel = [r for r in rows if r["method"] == method and r["dataset"] == d]
            cells += [mean_std([r["acc"] for r in sel], scale=100, digits=2, unit="%"),
                      mean_std([r["dfp"] for r in sel]), mean_std([r["dfn"] for r in sel])] if sel else ["", "", ""]
        measured.append(cells)
    lines = [f"### {title}: measured here",
             "",
             f"Mean ± std over {len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({', '.join(map(str, seeds))}); "
             f"{'/'.join(map(str, rounds)) or '-'} rounds; engine: {', '.join(engines) or '-'}"
             + (f"; wall time {hms(wall)}" if wall is not None else "") + ".",
             "", *markdown(header, measured)]
    paper = paper_tables().get(model)
    if paper:
        nan3 = (math.nan,) * 3
        rows_paper = [[method, *[cell for d in datasets for cell in _paper_cells(per.get(d, nan3))]]
                      for method, per in paper.items()]
        lines += ["", f"### {title}: the paper's numbers (for reference)", "", *markdown(header, rows_paper)]
    return "\n".join(lines) + "\n"


def _paper_cells(acc_dfp_dfn: tuple[float, float, float]) -> list[str]:
    acc, dfp, dfn = acc_dfp_dfn
    return [f"{acc:.2f}%", f"{dfp:.2f}", f"{dfn:.2f}"]
