"""The one writer of docs/results/: a page of figures with the command that made them.

``publish(name, command, payload, markdown)`` writes ``docs/results/<name>.md`` (a title,
the command, the commit and machine it ran on, the table, notes) and ``<name>.json``
beside it (the payload the page was rendered from), so rerunning the command refreshes
both. Standard library only: bench scripts and the tools (compare, sweep, epsweep, audit) call it.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository of an editable install (commands are run from its root)
RESULTS = REPO / "docs" / "results"


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
    """HEAD's short hash, with ``+changes`` when tracked files differ from it; '' outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+changes" if dirty else "")


def machine() -> dict:
    """The machine a page's figures were measured on: CPUs, the 1-minute load, Python, the UTC time."""
    return {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2), "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def publish(name: str, command: str, payload: dict, markdown: str, *, title: str = "", notes: str = "",
            out: Path | str = RESULTS) -> Path:
    """Write ``<out>/<name>.md`` and ``<out>/<name>.json``; returns the page's path.

    ``markdown`` is the figures (tables, image links relative to ``out``); ``notes`` what a
    reader needs to read them (settings, the target's definition), never a comparison with an
    earlier run: the page is replaced whole on every rerun."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mach = machine()
    sha = commit()
    payload = {"bench": name, "command": command, "commit": sha, "machine": mach, **payload}
    (out / f"{name}.json").write_text(json.dumps(payload, indent=1, default=float) + "\n")
    head = [f"# {title or name}", "",
            f"Written by `{command}`" + (f" at commit {sha}" if sha else "")
            + f", {mach['time']}, {mach['cpus']} CPUs (load {mach['load_1min']}), Python {mach['python']}.",
            f"Rerun the command to refresh this page and [{name}.json]({name}.json).", ""]
    page = "\n".join(head) + "\n" + markdown.rstrip() + "\n" + (f"\n{notes.rstrip()}\n" if notes else "")
    path = out / f"{name}.md"
    path.write_text(page)
    if out.resolve() == RESULTS.resolve():
        index()
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


def index(folder: Path = RESULTS) -> Path:
    """Rewrite ``folder/README.md``: one line per results page, its title and its command."""
    lines = ["# Results", "",
             "Figures measured by the bench scripts and tools, one page each with the command that",
             "made it. A page a script wrote (\"Written by\") is rewritten by rerunning its command",
             "(fairvfl_flwr/tools/results.py); a page headed \"Recorded by\" names the command and commit",
             "that measured it and where a rerun publishes. The reference pages in docs/ link",
             "here. This index is rewritten with every page.", "",
             "| page | command |", "|---|---|"]
    for page in sorted(folder.glob("*.md")):
        if page.name == "README.md":
            continue
        text = page.read_text().splitlines()
        title = text[0].lstrip("# ").strip() if text else page.stem
        cmd = next((line.split("`")[1] for line in text[1:6] if line.startswith(("Written by `", "Recorded by `"))), "")
        lines.append(f"| [{title}]({page.name}) | `{cmd}` |" if cmd else f"| [{title}]({page.name}) | |")
    path = folder / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path
