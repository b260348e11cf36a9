"""The one writer of docs/results/: a page of figures with the command that made them.

``publish(name, command, payload, markdown)`` writes ``docs/results/<topic>/<name>.md`` (a
title, the command, the commit and machine it ran on, the table, notes) and ``<name>.json``
beside it (the payload the page was rendered from), so rerunning the command refreshes
both; :data:`TOPICS` files each page name into its topic folder, and the folder's index
(``python -m fairvfl_flwr.tools.results --index``) lists every page with its command.
Standard library only: bench scripts and the tools (compare, sweep, epsweep, audit) call it.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository of an editable install (commands are run from its root)
RESULTS = REPO / "docs" / "results"

#: The topic folder of every page of docs/results/ by the page's name (the stem its .md, .json
#: and figures share), as (what the folder holds, fnmatch patterns); the first folder with a
#: matching pattern wins, so the order settles overlaps (``ckks-audit`` is an audit, ``ckks-*``
#: a cost). A name no pattern matches is refused (:func:`topic`) rather than left at the root:
#: a new page, or a new ``--name``, is filed here first. scripts/file_results.py applies this
#: map to pages written before it knew them (another branch's) and to every link to them.
TOPICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "rounds": ("Rounds to target: optimizers, local steps, constraints, MLP parties",
               ("rounds", "rounds-*", "parity-rounds", "parity-rounds-*", "mlp-rounds", "mlp-rounds-*",
                "mlp-adult-*", "newton-memory", "newton-ckks", "compas-gd-*")),
    "fairness": ("Fairness against accuracy: constraints, ε, group definitions, baselines",
                 ("groups", "groups-*", "hard-epsilon", "hard-epsilon-*", "parity-frontier", "parity-frontier-*",
                  "eo-rate", "eo-vs-deo", "epsweep", "epsweep-*", "sweep", "quality-*")),
    "audits": ("What each party learns: the leakage audits and their summary",
               ("audit-*", "threat-table", "privacy-summary", "ckks-audit")),
    "privacy": ("Privacy defences: label DP, secure aggregation, encrypted ν, a noisy group registry",
                ("labeldp", "labeldp-*", "secagg", "secagg-*", "ckks", "ckks-*", "registry-noisy", "registry-noisy-*",
                 "registry-isolation", "registry-isolation-*", "registry-encrypted",
                 "registry-encrypted-*", "registry-deploy")),
    "deployment": ("Deployed runs: seconds per round, a party's cost, WAN, scale, faults",
                   ("deploy_scale", "deploy_time", "deploy-*", "measure-deploy", "measure-deploy-*", "party-cost",
                    "party-cost-*", "wan", "time_to_target", "ttt-*", "reliability")),
    "speed": ("One process's costs: overhead, bytes, threads, imports, scaling, mini-batches, stragglers",
              ("overhead", "bytes", "blas_threads", "import_cost", "scaling", "scaling-*", "minibatch",
               "minibatch-*", "async_stragglers", "run-all")),
    "data": ("Preparing the parties' tables: private alignment, from files, SQL and over a WAN",
             ("align", "align-*", "wan-align")),
    "scoring": ("Scoring a trained model: time and memory per role, an example report",
                ("scoring", "scoring-*")),
    "compare": ("FairVFL against its baselines and the paper: the tables and figures",
                ("compare", "compare-*", "table_*", "convergence_*", "tradeoff_*")),  # the tool's --out files, copied in
}


class UnfiledPage(ValueError):
    """A results page whose name :data:`TOPICS` does not file."""


def topic(name: str) -> str:
    """The topic folder of the page ``name`` (:data:`TOPICS`); :class:`UnfiledPage` when no
    pattern matches, so that no page lands at the root of docs/results/."""
    for folder, (_, patterns) in TOPICS.items():
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return folder
    raise UnfiledPage(f"results page {name!r} has no topic folder: add its name (or a pattern) to TOPICS "
                      f"in fairvfl_flwr/tools/results.py (folders: {', '.join(TOPICS)})")


def page_name(name: str) -> str:
    """``name``, when TOPICS files it ('' too: a command's own default): the argparse ``type``
    of a ``--name``, so that a run is refused its page name before its runs, not after them."""
    if name:
        try:
            topic(name)
        except UnfiledPage as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return name


def unfiled(name: str, out: Path | str = RESULTS) -> str:
    """Why :func:`publish` would refuse the page ``name`` in ``out``; '' when it would not. A
    command whose page name comes from its ``--out`` asks before its runs, not after them."""
    try:
        page(name, out)
    except UnfiledPage as exc:
        return str(exc)
    return ""


def page(name: str, out: Path | str = RESULTS) -> Path:
    """Where the page ``name`` is: ``docs/results/<topic>/<name>.md`` under docs/results/, and
    ``<out>/<name>.md`` in any other folder (a scratch copy, a test's tmp folder). Its .json
    and the figures it shows are beside it (``.with_suffix``, ``.parent``)."""
    out = Path(out)
    if out.resolve() == RESULTS.resolve():
        return out / topic(name) / f"{name}.md"
    return out / f"{name}.md"


def this_command() -> str:
    """The command line of this process, as one would retype it from the repository root
    on another machine (:func:`portable`)."""
    args = [portable(a) for a in sys.argv[1:]]
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:  # python -m package.module
        return "python -m " + shlex.join([spec.name.removesuffix(".__main__"), *args])
    argv0 = Path(sys.argv[0]).resolve()
    if argv0.suffix != ".py":  # a console script
        return shlex.join([argv0.name, *args])
    script = argv0.relative_to(REPO) if argv0.is_relative_to(REPO) else argv0
    return "python " + shlex.join([str(script), *args])


def portable(arg: str) -> str:
    """``arg`` (or the value of ``--key=arg``) without this machine's folders: an absolute path
    in the repository or the home folder becomes relative to it, so the page's command writes
    under the repository root wherever it is retyped."""
    key, eq, value = arg.rpartition("=") if arg.startswith("-") and "=" in arg else ("", "", arg)
    path = Path(value)
    if not path.is_absolute():
        return arg
    if path.is_relative_to(REPO):
        value = str(path.relative_to(REPO)) or "."
    elif path.is_relative_to(Path.home()):
        value = str(path.relative_to(Path.home())) or "."
    return f"{key}{eq}{value}"


def commit() -> str:
    """HEAD's short hash, with ``+changes`` when tracked files differ from it; '' outside git. The
    results pages do not count: another bench call's page, written and not yet committed, changes
    nothing this call measured."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)docs/results"], cwd=REPO, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+changes" if dirty else "")


def machine() -> dict:
    """The machine a page's figures were measured on: CPUs, the 1-minute load, Python, the UTC time."""
    return {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2), "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def publish(name: str, command: str, payload: dict, markdown: str, *, title: str = "", notes: str = "",
            out: Path | str = RESULTS) -> Path:
    """Write the page ``name`` and its .json where :func:`page` puts them; returns the page's path.

    ``markdown`` is the figures (tables, image links relative to the page's folder); ``notes``
    what a reader needs to read them (settings, the target's definition), never a comparison
    with an earlier run: the page is replaced whole on every rerun."""
    out = Path(out)
    path = page(name, out)  # first: an unfiled name is refused before anything is written
    path.parent.mkdir(parents=True, exist_ok=True)
    mach = machine()
    sha = commit()
    payload = {"bench": name, "command": command, "commit": sha, "machine": mach, **payload}
    path.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=float) + "\n")
    head = [f"# {title or name}", "",
            f"Written by `{command}`" + (f" at commit {sha}" if sha else "")
            + f", {mach['time']}, {mach['cpus']} CPUs (load {mach['load_1min']}), Python {mach['python']}.",
            f"Rerun the command to refresh this page and [{name}.json]({name}.json).", ""]
    path.write_text("\n".join(head) + "\n" + markdown.rstrip() + "\n" + (f"\n{notes.rstrip()}\n" if notes else ""))
    if out.resolve() == RESULTS.resolve():
        index(out)
    return path


def include(doc: Path | str, name: str, markdown: str) -> bool:
    """Replace the block of ``doc`` from ``<!-- results/<name>: begin -->`` to
    ``<!-- results/<name>: end -->`` with ``markdown`` (markers kept), so that a reference page
    shows a results page's table without a second, hand-copied one. False when ``doc`` has no
    such markers."""
    doc = Path(doc)
    begin, end = f"<!-- results/{name}: begin -->", f"<!-- results/{name}: end -->"
    head, found, rest = doc.read_text().partition(begin)
    if not found or end not in rest:
        return False
    doc.write_text(f"{head}{begin}\n{markdown.strip()}\n{end}{rest.partition(end)[2]}")
    return True


COMMAND = re.compile(r"^(?:Written|Recorded) by `([^`]+)`", re.M)


def pages(folder: Path = RESULTS) -> list[Path]:
    """Every results page: the .md files of the topic folders. A folder below a topic folder
    holds files a page's command copies there (scoring/example/: what a user gets), not pages."""
    return sorted(p for p in folder.glob("*/*.md"))


def command_of(text: str) -> str:
    """The command a page names in its head ("Written by `...`" or "Recorded by `...`"), '' if none."""
    m = COMMAND.search("\n".join(text.splitlines()[1:6]))
    return m.group(1) if m else ""


def render_index(folder: Path = RESULTS) -> str:
    """The text of ``folder/README.md``: each topic folder, then each page's title and command."""
    lines = ["# Results", "",
             "Figures measured by the bench scripts and tools, one page each with the command that",
             "made it, filed by topic. A page a script wrote (\"Written by\") is rewritten by rerunning",
             "its command; a page headed \"Recorded by\" names the command and commit that measured it",
             "and where a rerun publishes. The reference pages in docs/ link here. Generated by",
             "`python -m fairvfl_flwr.tools.results --index` (and with every page published): edits",
             "by hand are overwritten; the topic folders are TOPICS in fairvfl_flwr/tools/results.py.", ""]
    found = pages(folder)
    lines += [f"- [{name}/](#{name}): {what}" for name, (what, _) in TOPICS.items()
              if any(p.parent.name == name for p in found)]
    for name, (what, _) in TOPICS.items():
        here = [p for p in found if p.parent.name == name]
        if not here:
            continue
        lines += ["", f"## {name}", "", what + ".", "", "| page | command |", "|---|---|"]
        for p in here:
            text = p.read_text()
            title = text.splitlines()[0].lstrip("# ").strip() if text else p.stem
            cmd = command_of(text)
            lines.append(f"| [{title}]({name}/{p.name}) | " + (f"`{cmd}` |" if cmd else "|"))
    return "\n".join(lines) + "\n"


def index(folder: Path = RESULTS) -> Path:
    """Rewrite ``folder/README.md`` (:func:`render_index`)."""
    path = folder / "README.md"
    path.write_text(render_index(folder))
    return path


def main(argv: list[str] | None = None) -> int:
    """``--index``: rewrite docs/results/README.md; ``--topic NAME``: print the folder of a page name."""
    ap = argparse.ArgumentParser(prog="python -m fairvfl_flwr.tools.results", description=__doc__.splitlines()[0])
    ap.add_argument("--index", action="store_true", help="rewrite docs/results/README.md from the pages")
    ap.add_argument("--topic", metavar="NAME", help="print the topic folder TOPICS files the page NAME in")
    a = ap.parse_args(argv)
    if a.topic:
        try:
            print(topic(a.topic))
        except UnfiledPage as exc:
            print(exc, file=sys.stderr)
            return 2
    if a.index:
        print(index())
    if not (a.index or a.topic):
        ap.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
