"""Shared helpers of the bench scripts: the output folder, a markdown table, machine facts.

Every script's figures go through ``write`` into docs/results/<topic>/ (fairvfl_flwr/tools/results.py
files each page name into its topic folder), with the command that made them. The one-process floors they time are fairvfl_flwr/core/reference.py's."""

from __future__ import annotations

import json
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one thread, as the ClientApp's torch
    os.environ.setdefault(_var, "1")
import resource
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fairvfl_flwr.tools.results import RESULTS, commit, machine, page, page_name, publish, this_command  # noqa: E402

DEFAULT_OUT = RESULTS  # docs/results/: a rerun of the command refreshes the page it wrote


def ms_per_round(folder) -> float:
    """Milliseconds per round of the run in ``folder`` (its history's seconds), rounds 2..R:
    round 1 is left out (a party's first message does one-time work, e.g. loading data)."""
    (hist,) = Path(folder).glob("*/history.json")
    secs = [r["seconds"] for r in json.loads(hist.read_text())]  # secs[t]: after round t (round 0: set-up)
    return 1000 * (secs[-1] - secs[1]) / (len(secs) - 2)


def alternated(reps: int, rounds: int, tmp: str):
    """(rep, on, run folder, rounds) for a feature's cost against plain: off and on runs
    alternated ``reps`` times, so that load drifts hit both alike, after a 2-round warm-up
    pair (rep -1: loads the data; not to be counted)."""
    for rep in range(-1, reps):
        for on in (False, True):
            yield rep, on, Path(tmp) / f"{int(on)}-{rep}", 2 if rep < 0 else rounds


def table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def write(out: Path, name: str, payload: dict, markdown: str, *, title: str = "", notes: str = "") -> None:
    """Print the figures and publish them as the page ``name`` + its ``.json`` (in its topic
    folder when ``out`` is docs/results) with this process's command line (fairvfl_flwr/tools/results.py)."""
    print(markdown)
    written = publish(name, this_command(), payload, markdown, title=title, notes=notes, out=out)
    print(f"\n[{name}] written to {written} and {written.with_suffix('.json').name}")


def run_of(command: str, sha: str) -> str:
    """A call that made some of a page's rows, as the page names it: its command and commit."""
    return f"{command} (at {sha or 'no commit'})"


def this_run() -> str:
    """:func:`run_of` this process: what a row run here records, so that a page rebuilt from its
    json with ``--keep`` still names the command and commit that measured the row."""
    return run_of(this_command(), commit())


def made_by(runs, what: str = "rows") -> str:
    """The page's note naming the calls (:func:`run_of`) that made its ``what``, each once, in order:
    a page rebuilt with ``--keep`` is written by one command but measured by these."""
    return f"The {what} were made by " + "; ".join(f"`{r}`" for r in dict.fromkeys(runs)) + "."


def kept_page(name: str, out: Path | str = DEFAULT_OUT) -> dict | None:
    """The json of the page ``name`` in ``out`` (the committed one in docs/results), which ``--keep``
    rebuilds the page from; None when there is none yet. Read when the page is written, not when
    the call starts, so that calls of other rows run side by side each add theirs instead of
    overwriting them."""
    path = page(name, out).with_suffix(".json")
    return json.loads(path.read_text()) if path.is_file() else None


def peak_rss_mib() -> float:
    """This process's peak resident memory (MiB).

    VmHWM, not ``getrusage``: Linux carries ru_maxrss over fork and exec, so a child
    started by a large parent (bench/run_all.py after the simulation benchmark: 617 MiB)
    reported the parent's peak instead of its own.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
