"""The README and docs/: every relative link reaches a file (and its heading, where it names
one), and the README stays short enough to read in one sitting."""

import ast
import inspect
import json
import re
import sys
from pathlib import Path

import pytest

from fairvfl_flwr.flower.hooks import Hooks
from fairvfl_flwr.tools import layout

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 120
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The page's heading anchors and its explicit ``<a id="...">`` ones."""
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set(re.findall(r'<a (?:id|name)="([^"]+)"', text))
    for line in text.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(page: Path):
    for m in LINK.finditer(FENCE.sub("", page.read_text())):
        target = m.group(1) or m.group(2)
        if not re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            yield target


def test_readme_is_short():
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; at most {README_MAX_LINES}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}:\n  " + "\n  ".join(broken)


def test_a_published_page_names_its_command_and_keeps_its_json(tmp_path):
    from fairvfl_flwr.tools.results import publish

    page = publish("demo", "python bench/demo.py --rounds 3", {"rows": [{"a": 1}]}, "| a |\n|---|\n| 1 |",
                   title="Demo", notes="one row", out=tmp_path)
    text = page.read_text()
    assert text.startswith("# Demo\n")
    assert "Written by `python bench/demo.py --rounds 3`" in text and "| 1 |" in text
    assert text.rstrip().endswith("one row")
    payload = json.loads((tmp_path / "demo.json").read_text())
    assert payload["command"] == "python bench/demo.py --rounds 3" and payload["rows"] == [{"a": 1}]
    assert not (tmp_path / "README.md").exists()  # the index belongs to docs/results only


def test_a_reference_page_includes_a_results_table_between_its_markers(tmp_path):
    from fairvfl_flwr.tools.results import include

    doc = tmp_path / "page.md"
    doc.write_text("intro\n<!-- results/demo: begin -->\nold table\n<!-- results/demo: end -->\nafter\n")
    assert include(doc, "demo", "| a |\n|---|\n| 2 |\n")
    assert doc.read_text() == "intro\n<!-- results/demo: begin -->\n| a |\n|---|\n| 2 |\n<!-- results/demo: end -->\nafter\n"
    assert not include(doc, "other", "x") and "x" not in doc.read_text().split("after")[1]


def test_a_pages_command_carries_no_folder_of_the_machine_it_ran_on(monkeypatch):
    from fairvfl_flwr.tools import results

    home = Path.home()
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)  # a script, not python -m
    monkeypatch.setattr(sys, "argv", [str(REPO / "bench" / "align.py"), "--out", str(home / "out"),
                                      f"--keep={REPO / 'results' / 'x'}", "--tables", "/data/t.csv", "--ids", "10"])
    assert results.this_command() == "python bench/align.py --out out --keep=results/x --tables /data/t.csv --ids 10"
    published = [json.loads(p.read_text()).get("command", "") for p in (REPO / "docs" / "results").glob("*.json")]
    assert not [c for c in published if str(home) in c or "/root/" in c or str(REPO) in c]


CODE_PATH = re.compile(
    r"`((?:fairvfl_flwr|bench|scripts|tests|core|app|flower|secure|features|jobs|algorithms|data|tools|config)/[\w/]+\.py)")


@pytest.mark.parametrize("page", [p for p in PAGES if "results" not in p.parts], ids=lambda p: str(p.relative_to(REPO)))
def test_code_files_named_in_reference_pages_exist(page):
    """A reference page that names `core/x.py` or `fairvfl_flwr/core/x.py` points at a file that is there."""
    missing = [f for f in CODE_PATH.findall(page.read_text())
               if not (REPO / f).exists() and not (REPO / "fairvfl_flwr" / f).exists()]
    assert not missing, f"{page.relative_to(REPO)} names files that do not exist: {missing}"


def test_the_architecture_layout_is_the_module_docstrings():
    """docs/architecture.md's package layout is generated (python -m fairvfl_flwr.tools.layout
    --write): a module added, moved or redescribed without rewriting it fails here."""
    for path, text in layout.generated(REPO).items():
        assert path.read_text() == text, f"{path.name}: run python -m fairvfl_flwr.tools.layout --write"


def test_the_hook_points_in_the_docs_are_the_round_hooks_methods():
    """docs/architecture.md lists the round hook points as RoundHook declares them (tools/layout.py):
    a point added, renamed or redescribed without --write fails here; and what the hook list
    calls is what RoundHook declares (``rejoined`` is called from ``recover``)."""
    points = layout.hook_points()
    assert points in (REPO / "docs" / "architecture.md").read_text(), "run python -m fairvfl_flwr.tools.layout --write"
    listed = re.findall(r"^\* `(\w+)`:", points, re.M)
    assert listed[:2] == ["discovered", "begin"] and listed[-1] == "stopped"
    called = {name for name, f in vars(Hooks).items() if inspect.isfunction(f) and not name.startswith("_")}
    assert set(listed) == called | {"rejoined"}


def test_the_layout_lists_every_module_of_every_layer():
    text = layout.render(REPO / "fairvfl_flwr")
    for path in (REPO / "fairvfl_flwr").rglob("*.py"):
        rel = path.relative_to(REPO / "fairvfl_flwr")
        if rel.parts[0] in layout.FOLDED or path.name == "__init__.py" or rel.parts[0] == "__init__.py":
            continue
        assert f" {path.name} " in text or f" {path.name}\n" in text, rel
    assert set(layout.LAYERS) == {p.name for p in (REPO / "fairvfl_flwr").iterdir() if (p / "__init__.py").exists()}


def _public_definitions(tree, where: str):
    """(where, has a docstring) for each public function, class and method of a module: the names
    without a leading underscore, at module level or in a public class (not inside functions)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            yield f"{where}:{node.lineno} {node.name}", ast.get_docstring(node) is not None
            if isinstance(node, ast.ClassDef):
                yield from _public_definitions(node, where)


def test_nine_in_ten_public_definitions_say_what_they_are_for():
    """Flower and fairlearn document every public definition; a newcomer reads ours from help()
    and the editor. The share may not fall below 0.9; the undocumented ones are listed."""
    found = [d for path in sorted((REPO / "fairvfl_flwr").rglob("*.py"))
             for d in _public_definitions(ast.parse(path.read_text()), str(path.relative_to(REPO)))]
    missing = [where for where, documented in found if not documented]
    share = 1 - len(missing) / len(found)
    assert share >= 0.9, f"{share:.3f} of {len(found)} public definitions documented; undocumented:\n" + "\n".join(missing)
