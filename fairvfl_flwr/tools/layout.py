"""Check or rewrite docs/architecture.md's package layout and hook points, generated from the code.

    python -m fairvfl_flwr.tools.layout           # exit 1 if the layout or the points have drifted
    python -m fairvfl_flwr.tools.layout --write   # rewrite them from the docstrings

Each layer's folder is described by its ``__init__.py`` docstring and each module by the
first paragraph of its own, so a module added, renamed or redescribed shows up in the
layout once ``--write`` runs (tests/test_docs.py fails until it does). The round hook
points are ``RoundHook``'s methods with their docstrings, in the class's order.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import textwrap
from pathlib import Path

from fairvfl_flwr.config.settings import replace_between
from fairvfl_flwr.flower.hooks import RoundHook

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fairvfl_flwr"
DOC = ROOT / "docs" / "architecture.md"
#: The layers, in the order imports go (pyproject.toml's import-linter contract).
LAYERS = ("core", "config", "data", "flower", "secure", "algorithms", "features", "jobs", "app", "tools")
#: Folders described but not listed module by module (their own section below the layout).
FOLDED = {"tools": "command-line tools and their helpers: the table under Tools below"}
BEGIN = "<!-- layout: generated from the module docstrings (python -m fairvfl_flwr.tools.layout --write) -->"
END = "<!-- end of layout -->"
NAME_WIDTH, WIDTH = 26, 108
POINTS_BEGIN = "<!-- hook points: generated from flower/hooks.RoundHook (python -m fairvfl_flwr.tools.layout --write) -->"
POINTS_END = "<!-- end of hook points -->"
POINTS_WIDTH = 92


def summary(path: Path) -> str:
    """The first paragraph of a module's docstring, on one line, without reST markup."""
    doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def _entry(indent: int, name: str, text: str) -> list[str]:
    head = " " * indent + name
    if not text:
        return [head]
    pad = " " * NAME_WIDTH
    first = head.ljust(NAME_WIDTH) if len(head) < NAME_WIDTH - 1 else None
    lines = textwrap.wrap(text, WIDTH, initial_indent=first or pad, subsequent_indent=pad)
    return lines if first else [head, *lines]


def _folder(folder: Path, indent: int) -> list[str]:
    init = folder / "__init__.py"
    lines = _entry(indent, folder.name + "/", FOLDED.get(folder.name) or (summary(init) if init.exists() else ""))
    if folder.name in FOLDED:
        return lines
    for path in sorted(folder.glob("*.py")):
        if path.name != "__init__.py":
            lines += _entry(indent + 2, path.name, summary(path))
    for sub in sorted(p for p in folder.iterdir() if (p / "__init__.py").exists()):
        lines += _folder(sub, indent + 2)
    return lines


def render(package: Path = PACKAGE) -> str:
    """The generated block: the package's folders in layer order, each module with its summary."""
    lines = _entry(0, "fairvfl_flwr/", summary(package / "__init__.py"))
    for layer in LAYERS:
        lines += _folder(package / layer, 2)
    return "\n".join([BEGIN, "```", *lines, "```", END])


def _markdown(doc: str) -> str:
    """A docstring on one line, its reST roles and literals as markdown code."""
    text = " ".join(doc.split())
    text = re.sub(r":\w+:`~[\w.]*?(\w+)`", r"`\1`", text)  # :class:`~a.b.C`: C
    return re.sub(r":\w+:`([^`]+)`", r"`\1`", text).replace("``", "`")


def hook_points(hook: type = RoundHook) -> str:
    """The generated block: every point of ``hook`` (its public methods, in the class's order) with
    its docstring."""
    lines = [POINTS_BEGIN]
    for name, member in vars(hook).items():
        if inspect.isfunction(member) and not name.startswith("_"):
            lines += textwrap.wrap(f"`{name}`: {_markdown(inspect.getdoc(member) or '')}", POINTS_WIDTH,
                                   initial_indent="* ", subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join([*lines, POINTS_END])


def generated(root: Path = ROOT) -> dict[Path, str]:
    """docs/architecture.md's text with its layout as the docstrings say it should be, and its
    hook points as ``RoundHook`` declares them."""
    doc = root / "docs" / "architecture.md"
    text = replace_between(doc.read_text(), BEGIN, END, render(root / "fairvfl_flwr"), str(doc))
    return {doc: replace_between(text, POINTS_BEGIN, POINTS_END, hook_points(), str(doc))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fairvfl_flwr.tools.layout", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the layout instead of checking it")
    args = ap.parse_args(argv)
    drift = {path: text for path, text in generated().items() if path.read_text() != text}
    for path, text in drift.items():
        if args.write:
            path.write_text(text)
            print(f"rewrote {path}")
        else:
            print(f"{path}: its layout or hook points differ from the code; run python -m fairvfl_flwr.tools.layout "
                  "--write", file=sys.stderr)
    return 1 if drift and not args.write else 0


if __name__ == "__main__":
    raise SystemExit(main())
