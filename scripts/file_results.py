"""File the pages at the root of docs/results/ into their topic folders, and fix every link to them.

    python scripts/file_results.py [--dry-run]

Rerun it after merging a branch that wrote results pages before the topic folders existed (or
that links to ``docs/results/<name>.md``): each file at the root whose name TOPICS files
(fairvfl_flwr/tools/results.py) moves with ``git mv`` (its history follows), then

* every markdown link in README.md and docs/ that reached a filed file is rewritten from the
  linking page's folder, and a moved page's own relative links (``../privacy.md``, a sibling
  page now in another folder) are rewritten from its new folder;
* ``docs/results/<name>.<ext>`` in any markdown, Python or shell file of the repository
  (docstrings, help texts, recorded commands) and ``results/<name>.<ext>`` in docs/*.md
  become ``docs/results/<topic>/<name>.<ext>`` (``results/<topic>/...``);
* docs/results/README.md is regenerated.

A name TOPICS does not file stops the script before anything moves: add it to TOPICS and rerun.
Files already in their folders and links already rewritten are left as they are, so a second
run changes nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fairvfl_flwr.tools.results import RESULTS, UnfiledPage, index, topic  # noqa: E402

LINK = re.compile(r"(\]\()([^)\s#]*)(#[^)\s]*)?(\))")
#: ``docs/results/<name>.<ext>`` written from the repository root: in code, commands, prose.
ROOTED = re.compile(r"(?<![\w/.-])(docs/results/)([A-Za-z0-9_.-]+?)\.(md|json|png|csv)\b")
#: ``results/<name>.<ext>`` in a page of docs/ (the link text of a link to it).
DOCS_RELATIVE = re.compile(r"(?<![\w/.-])(results/)([A-Za-z0-9_.-]+?)\.(md|json|png|csv)\b")
TEXT_SUFFIXES = {".md", ".py", ".sh", ".toml"}
SKIP = {".git", ".venv", "node_modules", "__pycache__", "results"}  # results/: run folders, not docs


def filed(path: Path) -> Path:
    """Where ``path`` is once filed: a file at the root of docs/results/ goes to its topic folder."""
    if path.parent != RESULTS or path.name == "README.md" or not path.suffix:
        return path
    return RESULTS / topic(path.stem) / path.name


def to_move() -> list[Path]:
    return sorted(p for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md")


def text_files() -> list[Path]:
    out = []
    for root, dirs, files in os.walk(REPO):
        rel = Path(root).relative_to(REPO)
        dirs[:] = [d for d in dirs if not (d in SKIP and (rel == Path(".") or d != "results"))
                   and not d.startswith(".")]
        out += [Path(root) / f for f in files if Path(f).suffix in TEXT_SUFFIXES]
    return sorted(out)


def rewrite_links(text: str, old: Path, new: Path) -> str:
    """``text``'s relative markdown links, written in ``old``'s folder, as seen from ``new``'s."""
    def fix(m: re.Match) -> str:
        target = m.group(2)
        if not target or re.match(r"[a-z]+:", target):
            return m.group(0)
        before = Path(os.path.normpath(old.parent / target))
        try:
            after = filed(before)
        except UnfiledPage:
            return m.group(0)
        if after == before and old == new:
            return m.group(0)
        rel = os.path.relpath(after, new.parent) + ("/" if target.endswith("/") else "")
        return f"{m.group(1)}{rel}{m.group(3) or ''}{m.group(4)}"
    return LINK.sub(fix, text)


def rewrite_names(text: str, docs_page: bool) -> str:
    def fix(m: re.Match) -> str:
        try:
            return f"{m.group(1)}{topic(m.group(2))}/{m.group(2)}.{m.group(3)}"
        except UnfiledPage:
            return m.group(0)  # a placeholder (``NAME.md``) or an index, not a page
    text = ROOTED.sub(fix, text)
    return DOCS_RELATIVE.sub(fix, text) if docs_page else text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="list the moves and the files that would change")
    a = ap.parse_args(argv)
    moves = {}
    unfiled = []
    for path in to_move():
        try:
            moves[path] = filed(path)
        except UnfiledPage:
            unfiled.append(path.name)
    if unfiled:
        print(f"no topic folder for {', '.join(unfiled)}: add them to TOPICS in fairvfl_flwr/tools/results.py",
              file=sys.stderr)
        return 2
    for old, new in moves.items():
        print(f"{old.relative_to(REPO)} -> {new.relative_to(REPO)}")
        if not a.dry_run:
            new.parent.mkdir(exist_ok=True)
            tracked = subprocess.run(["git", "ls-files", "--error-unmatch", str(old)], cwd=REPO,
                                     capture_output=True).returncode == 0
            if tracked:
                subprocess.run(["git", "mv", str(old), str(new)], cwd=REPO, check=True)
            else:
                old.rename(new)
    # (where the file is now, where its links were written, where they are read from)
    if a.dry_run:
        places = [(path, path, moves.get(path, path)) for path in text_files()]
    else:
        where_was = {new: old for old, new in moves.items()}
        places = [(path, where_was.get(path, path), path) for path in text_files()]
    changed = []
    for path, before, after in places:
        text = path.read_text()
        out = rewrite_links(text, before, after) if path.suffix == ".md" else text
        out = rewrite_names(out, after.suffix == ".md" and after.parent == REPO / "docs")
        if out != text:
            changed.append(path.relative_to(REPO))
            if not a.dry_run:
                path.write_text(out)
    for path in changed:
        print(f"rewrote {path}")
    if not a.dry_run:
        index()
    return 0


if __name__ == "__main__":
    sys.exit(main())
