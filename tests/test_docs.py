"""The README and docs/: every relative link reaches a file (and its heading, where it names
one), every code name they and the module docstrings cite is there, and the README stays short
enough to read in one sitting."""

import argparse
import ast
import dataclasses
import importlib
import inspect
import json
import re
import sys
import subprocess
from functools import cache
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
    published = [json.loads(p.read_text()).get("command", "") for p in (REPO / "docs" / "results").rglob("*.json")]
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


# -- code names cited in prose --------------------------------------------------------------------
# The layout copies each module docstring into docs/architecture.md, and the reference pages name
# functions and classes: a rename that leaves the old name in prose fails here, not in a reader's hands.

ROLE = re.compile(r":(?:func|class|meth|data|attr|mod|obj|exc):`~?([\w.]+)(?:\(\))?`")
TICKED = re.compile(r"(?<!`)``?([A-Za-z_][\w.]*\.\w+)(?:\(\))?``?(?!`)")
ABSOLUTE = re.compile(r"(?<![\w/.])fairvfl_flwr(?:\.\w+)+")
PATH_DOT = re.compile(r"(?<![\w/.-])((?:fairvfl_flwr/)?(?:%s)(?:/\w+)+)\.([A-Za-z_]\w*(?:\.\w+)*)"
                      % "|".join(layout.LAYERS))
#: First names that are not the module of that name: ``fairvfl.model`` is a node state key.
NOT_MODULES = {"fairvfl"}
FILE_SUFFIXES = {"py", "md", "toml", "json", "csv", "npz", "npy", "txt", "yaml", "yml", "log", "pt", "html", "png",
                 "svg", "sh", "cfg", "ini", "gz", "pkl", "pub", "key", "pem", "crt", "db", "sqlite"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _package() -> tuple[dict[str, Path], dict[str, list[str]], dict[str, list[str]], frozenset[str]]:
    """The package's modules by dotted name, by last name, its top-level public names, and the
    run and node config keys (``tables.missing`` is a setting, not data/tables.missing)."""
    from fairvfl_flwr.config import node, run

    modules = {_module_name(p): p for p in sorted((REPO / "fairvfl_flwr").rglob("*.py")) if p.name != "__main__.py"}
    short: dict[str, list[str]] = {}
    top: dict[str, list[str]] = {}
    for name, path in modules.items():
        short.setdefault(name.rsplit(".", 1)[-1], []).append(name)
        for node_ in ast.parse(path.read_text()).body:
            if isinstance(node_, (ast.ClassDef, ast.FunctionDef)) and not node_.name.startswith("_"):
                top.setdefault(node_.name, []).append(name)
    keys = frozenset(s.key for s in [*run.SETTINGS, *node.SETTINGS])
    return modules, short, top, keys


def _has(obj, name: str) -> bool:
    """``obj.name`` is there: an attribute, or a field or ``self.name`` an instance of the class gets."""
    if hasattr(obj, name):
        return True
    if not inspect.isclass(obj):
        return False
    for cls in obj.__mro__:
        if name in vars(cls).get("__annotations__", {}) or name in getattr(cls, "__slots__", ()):
            return True
        if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
            return True
        try:
            if re.search(rf"\bself\.{name}\b\s*(?::[^=\n]+)?=", inspect.getsource(cls)):
                return True
        except (OSError, TypeError):
            pass
    return False


def _in_a_class(module: str, attrs: list[str]) -> bool:
    """``module.x`` naming an object of one of the module's classes: ``server.computed()``."""
    mod = importlib.import_module(module)
    return any(_walk(module, [name, *attrs]) for name, c in vars(mod).items()
               if inspect.isclass(c) and c.__module__ == module)


def _walk(module: str, attrs: list[str]) -> bool:
    obj = importlib.import_module(module)
    for a in attrs:
        if not _has(obj, a):
            return False
        obj = getattr(obj, a, None)
    return True


def resolves(name: str, here: str | None = None) -> bool | None:
    """Whether a cited name is there: True, False (one of ours that is not), or None (not ours:
    numpy's, Flower's, a config key). Tried in turn: absolute (``fairvfl_flwr.core.step``,
    ``core/step.server_step``), in the module ``here`` (a docstring's own names, its classes'
    methods; a bare name must be one of these), a module beside ``here`` (an object of one of
    its classes: ``server.computed()``), a module by its last name where no other module has
    it (``step.server_step``), a public class or function of the package (``ConstraintSet.gaps``)."""
    modules, short, top, keys = _package()
    if name in keys or name.replace("_", "-") in keys:
        return None
    parts = name.replace("/", ".").split(".")
    if parts[0] in layout.LAYERS:
        parts = ["fairvfl_flwr", *parts]
    if parts[0] == "fairvfl_flwr":
        for i in range(len(parts), 1, -1):
            if ".".join(parts[:i]) in modules:
                return _walk(".".join(parts[:i]), parts[i:])
        return False
    if here is not None:
        if _walk(here, parts):
            return True
        mod = importlib.import_module(here)
        if len(parts) == 1 and any(_has(c, parts[0]) for c in vars(mod).values()
                                   if inspect.isclass(c) and c.__module__ == here):
            return True
        if len(parts) == 1:  # a bare name is the module's own (Sphinx's current module)
            return False
        package = here if modules.get(here, Path()).name == "__init__.py" else here.rpartition(".")[0]
        for i in range(len(parts), 0, -1):
            if (near := f"{package}.{'.'.join(parts[:i])}") in modules:
                return _walk(near, parts[i:]) or (i == 1 and _in_a_class(near, parts[1:]))
    if len(parts) > 1 and len(short.get(parts[0], ())) == 1 and parts[0] not in NOT_MODULES:
        return _walk(short[parts[0]][0], parts[1:])
    if parts[0] in top:
        return any(_walk(m, parts) for m in top[parts[0]])
    return None


def cited_names(text: str) -> list[tuple[str, bool]]:
    """The code names a docstring or page cites, each with whether it is a reST role (a role must
    resolve; a dotted name in backticks only when it is one of ours)."""
    out = [(m.group(1), True) for m in ROLE.finditer(text)]
    text = ROLE.sub("", text)
    out += [(m.group(0), False) for m in ABSOLUTE.finditer(text)]
    out += [(f"{m.group(1)}.{m.group(2)}", False) for m in PATH_DOT.finditer(text)
            if m.group(2).split(".")[0] not in FILE_SUFFIXES]
    out += [(m.group(1), False) for m in TICKED.finditer(text)
            if m.group(1).rsplit(".", 1)[-1] not in FILE_SUFFIXES and not m.group(1).startswith("fairvfl_flwr.")]
    return out


def stale_names(text: str, here: str | None = None) -> list[str]:
    """The names ``text`` cites that are not there (``here``: the module whose docstring it is)."""
    return sorted({name for name, role in cited_names(text)
                   if (found := resolves(name, here)) is False or (found is None and role)})


def _docstrings():
    """Every module docstring (the layout renders their first paragraphs) and RoundHook's
    methods' (the hook points), with the module they belong to."""
    modules, *_ = _package()
    for name, path in modules.items():
        yield str(path.relative_to(REPO)), ast.get_docstring(ast.parse(path.read_text())) or "", name
    for point, member in vars(layout.RoundHook).items():
        if inspect.isfunction(member):
            yield f"flower/hooks.py RoundHook.{point}", inspect.getdoc(member) or "", "fairvfl_flwr.flower.hooks"


def test_the_names_module_docstrings_cite_are_there():
    """Each module docstring's ``:func:``/``:class:``/... roles and dotted names (``core/step.server_step``,
    ``fairvfl_flwr.core.newton``, ``ConstraintSet.gaps``) name a module or attribute that exists."""
    stale = [f"{where}: {names}" for where, doc, here in _docstrings() if (names := stale_names(doc, here))]
    assert not stale, "docstrings cite names that are not there:\n  " + "\n  ".join(stale)


def test_the_names_every_docstring_cites_are_there():
    """The same for every class, function and method docstring of the package (help() and the
    editor show them)."""
    modules, *_ = _package()
    stale = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if names := stale_names(ast.get_docstring(node) or "", name):
                    stale.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {names}")
    assert not stale, "docstrings cite names that are not there:\n  " + "\n  ".join(stale)


@pytest.mark.parametrize("page", [p for p in PAGES if "results" not in p.parts], ids=lambda p: str(p.relative_to(REPO)))
def test_the_names_reference_pages_cite_are_there(page):
    names = stale_names(FENCE.sub("", page.read_text()))
    assert not names, f"{page.relative_to(REPO)} cites names that are not there: {names}"


def test_a_stale_name_in_a_docstring_is_caught():
    """The check above can fail: a renamed function, a module moved away, a role to nothing."""
    doc = ("The dual step (:func:`dual_newton_step`, core/step.server_step) and ``core.newton.no_such_step``;\n"
           "see :class:`~fairvfl_flwr.core.stopping.StopRule` and ``ConstraintSet.gone`` and "
           "fairvfl_flwr.core.dual_newton, data/psi.no_such_function; ``tables.missing`` is a setting.")
    assert stale_names(doc, "fairvfl_flwr.core.objective") == [
        "ConstraintSet.gone", "core.newton.no_such_step", "data/psi.no_such_function", "dual_newton_step",
        "fairvfl_flwr.core.dual_newton"]
    assert stale_names(doc.replace("dual_newton_step", "server_step"), "fairvfl_flwr.core.newton") == [
        "ConstraintSet.gone", "core.newton.no_such_step", "data/psi.no_such_function", "fairvfl_flwr.core.dual_newton"]


# -- tables a reference page includes from a results page -----------------------------------------
INCLUDED = re.compile(r"<!-- results/([\w./-]+): begin -->\n(.*?)<!-- results/\1: end -->", re.S)


def include_drift(text: str, results: Path = REPO / "docs" / "results") -> list[str]:
    """The ``<!-- results/<name> -->`` blocks of a page whose text is not in ``results/<name>.md``
    verbatim: a table edited by hand, or a results page rewritten without its include."""
    from fairvfl_flwr.tools.results import page

    drift = []
    for name, block in INCLUDED.findall(text):
        source = results / f"{name}.md" if "/" in name else page(name, results)
        if not source.exists():
            drift.append(f"{name}: no results page {source.relative_to(REPO)}")
        elif block.strip() not in source.read_text():
            drift.append(f"{name}: differs from {source.relative_to(REPO)} (rerun the command that writes it)")
    return drift


@pytest.mark.parametrize("page", [p for p in PAGES if "results" not in p.parts], ids=lambda p: str(p.relative_to(REPO)))
def test_an_included_table_is_its_results_pages(page):
    drift = include_drift(page.read_text())
    assert not drift, f"{page.relative_to(REPO)}: " + "; ".join(drift)


def test_the_readme_tables_are_included_not_copied():
    """README's Table 1 and privacy table are results blocks (bench/readme_tables.py), and the
    privacy summary page is what its audit pages' JSON give."""
    from bench.readme_tables import first_table, load, privacy_table

    readme = (REPO / "README.md").read_text()
    names = [name for name, _ in INCLUDED.findall(readme)]
    assert names == ["compare/table_linear", "privacy-summary"]
    from fairvfl_flwr.tools.results import page as results_page

    page = results_page("privacy-summary").read_text()
    assert first_table(page) == privacy_table(load())
    outside = INCLUDED.sub("", readme)
    assert "| Method | Adult ACC" not in outside and "| defence |" not in outside, "a README table outside its block"


def test_a_hand_edited_readme_table_is_caught():
    readme = (REPO / "README.md").read_text()
    assert not include_drift(readme)
    edited = readme.replace("error 1.7e-6 / 7.9e-6", "error 1.6e-6 / 7.9e-6", 1)
    assert edited != readme and include_drift(edited) == [
        "privacy-summary: differs from docs/results/audits/privacy-summary.md (rerun the command that writes it)"]
    edited = readme.replace("| FedBCD + EO | 83.31", "| FedBCD + EO | 83.41", 1)
    assert edited != readme and [d.split(":")[0] for d in include_drift(edited)] == ["compare/table_linear"]


def test_every_results_page_names_the_command_that_made_it():
    """A page of docs/results/<topic>/ opens with "Written by `<command>`" (bench/results publish)
    or "Recorded by `<command>`" (figures kept from an earlier run), so its index names the
    command; a folder below a topic folder holds files a page's command copies there."""
    from fairvfl_flwr.tools.results import command_of, pages

    found = pages()
    assert len(found) > 50, "docs/results/<topic>/*.md: the pages are not where pages() looks"
    nameless = [str(p.relative_to(REPO)) for p in found if not command_of(p.read_text())]
    assert not nameless, f"results pages that name no command: {nameless}"


def test_every_results_file_is_in_the_folder_its_topic_names():
    """Nothing at the root of docs/results/ but the index, and every file of a topic folder is
    where TOPICS files its name: a page written before the map knew it, or moved by hand, fails
    (python scripts/file_results.py files it)."""
    from fairvfl_flwr.tools.results import RESULTS, TOPICS, UnfiledPage, topic

    assert [p.name for p in RESULTS.iterdir() if p.is_file()] == ["README.md"]
    assert {p.name for p in RESULTS.iterdir() if p.is_dir()} <= set(TOPICS)
    misfiled = []
    for path in sorted(RESULTS.glob("*/*")):
        if path.is_file():
            try:
                folder = topic(path.stem)
            except UnfiledPage:
                folder = "(none)"
            if folder != path.parent.name:
                misfiled.append(f"{path.relative_to(RESULTS)}: TOPICS files it in {folder}/")
    assert not misfiled, "\n".join(misfiled)


def test_the_results_index_is_generated_from_the_pages():
    """docs/results/README.md is render_index's text: a hand edit, or a page added or retitled
    without the index rewritten, fails (python -m fairvfl_flwr.tools.results --index)."""
    from fairvfl_flwr.tools.results import RESULTS, pages, render_index

    text = (RESULTS / "README.md").read_text()
    assert text == render_index(), "docs/results/README.md is stale: python -m fairvfl_flwr.tools.results --index"
    assert all(f"]({p.parent.name}/{p.name})" in text for p in pages())


def test_a_page_is_published_into_its_topic_folder_and_an_unfiled_name_is_refused(tmp_path, monkeypatch):
    from fairvfl_flwr.tools import results

    monkeypatch.setattr(results, "RESULTS", tmp_path)
    page = results.publish("rounds-demo", "python bench/rounds.py --name rounds-demo", {}, "| a |\n|---|\n| 1 |",
                           title="Demo rounds", out=tmp_path)
    assert page == tmp_path / "rounds" / "rounds-demo.md" and page.with_suffix(".json").exists()
    index = (tmp_path / "README.md").read_text()
    assert "| [Demo rounds](rounds/rounds-demo.md) | `python bench/rounds.py --name rounds-demo` |" in index
    with pytest.raises(results.UnfiledPage, match="TOPICS in fairvfl_flwr/tools/results.py"):
        results.publish("no-topic-of-its-own", "python x.py", {}, "", out=tmp_path)
    assert not list(tmp_path.rglob("no-topic-of-its-own*"))
    assert "TOPICS" in results.unfiled("no-topic-of-its-own", tmp_path) and not results.unfiled("rounds-demo", tmp_path)
    assert not results.unfiled("no-topic-of-its-own", tmp_path / "scratch")  # outside docs/results: flat, any name
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", type=results.page_name, default="")
    assert parser.parse_args([]).name == "" and parser.parse_args(["--name", "ttt-demo"]).name == "ttt-demo"
    with pytest.raises(SystemExit):
        parser.parse_args(["--name", "no-topic-of-its-own"])


@pytest.mark.parametrize("name, folder", [("mlp-rounds", "rounds"), ("rounds-newton-const", "rounds"),
                                          ("deploy-section0", "deployment"), ("hard-epsilon", "fairness"),
                                          ("groups", "fairness"), ("registry-noisy", "privacy"),
                                          ("ckks-audit", "audits"), ("ckks-adult-gd", "privacy"),
                                          ("wan-align", "data"), ("wan", "deployment"), ("compare-linear-mlp", "compare")])
def test_topics_files_the_pages_other_branches_write(name, folder):
    from fairvfl_flwr.tools.results import topic

    assert topic(name) == folder


def test_filing_rewrites_the_links_to_a_page_and_a_moved_pages_own():
    """scripts/file_results.py: a page written at the root (another branch's) links to its
    siblings and to ../ as it was; filed, its links and the links to it reach the same files."""
    import importlib.util

    from fairvfl_flwr.tools.results import RESULTS

    spec = importlib.util.spec_from_file_location("file_results", REPO / "scripts" / "file_results.py")
    filing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filing)
    text = "[a](../privacy.md#who-receives-what) [b](rounds.md) [c](groups.md) ![d](groups.png) [e](https://x.org/a.md)"
    moved = filing.rewrite_links(text, RESULTS / "rounds-demo.md", RESULTS / "rounds" / "rounds-demo.md")
    assert moved == ("[a](../../privacy.md#who-receives-what) [b](rounds.md) [c](../fairness/groups.md) "
                     "![d](../fairness/groups.png) [e](https://x.org/a.md)")
    assert filing.rewrite_links(moved, RESULTS / "rounds" / "rounds-demo.md", RESULTS / "rounds" / "rounds-demo.md") == moved
    doc = REPO / "docs" / "fairness-constraints.md"
    linked = filing.rewrite_names(filing.rewrite_links("[results/groups.md](results/groups.md#x)", doc, doc), True)
    assert linked == "[results/fairness/groups.md](results/fairness/groups.md#x)"
    code = "writes docs/results/" + "hard-epsilon.md and docs/results/NAME.md"  # split: the script would file it
    assert filing.rewrite_names(code, False) == "writes docs/results/fairness/hard-epsilon.md and docs/results/NAME.md"


def test_a_results_page_left_uncommitted_does_not_mark_the_next_page_as_made_by_changed_code(tmp_path, monkeypatch):
    """Two bench calls write pages in turn: the first call's page, not yet committed, is no change to
    the code the second measured; a changed source file is."""
    from fairvfl_flwr.tools import results

    repo = tmp_path / "repo"
    (repo / "docs" / "results" / "rounds").mkdir(parents=True)
    (repo / "docs" / "results" / "rounds" / "a.md").write_text("one\n")
    (repo / "code.py").write_text("x = 1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "start"], check=True)
    monkeypatch.setattr(results, "REPO", repo)
    (repo / "docs" / "results" / "rounds" / "a.md").write_text("two\n")
    assert results.commit() and not results.commit().endswith("+changes")
    (repo / "code.py").write_text("x = 2\n")
    assert results.commit().endswith("+changes")
