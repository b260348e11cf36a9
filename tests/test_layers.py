"""The package's shape: import-linter's contracts (pyproject.toml), no imports hidden in
functions, no private names imported across modules, no feature named in the round loop,
every third-party import declared."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fairvfl_flwr"


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def test_import_linter_contracts_are_kept():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.skip('needs import-linter: pip install -e ".[test]"')
    done = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_the_independence_contract_lists_every_feature():
    """A feature left out of the contract could quietly start importing another."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    listed = next(c["modules"] for c in contracts if c["name"] == "Features are independent of each other")
    features = {f"fairvfl_flwr.features.{p.stem}" for p in (PACKAGE / "features").glob("*.py") if p.stem != "__init__"}
    assert set(listed) == features


def test_only_the_apps_assembly_imports_secure_aggregations_feature():
    """Its pieces are the secure layer's (identity keys, ring, view, nonces, key agreement): a job,
    tool or other feature that needs one imports it from there, never the round hook's module."""
    importing = set()
    for path, tree in _modules():
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""]
                     if isinstance(node, ast.ImportFrom) else [])
            if any(n == "fairvfl_flwr.features.secagg" or n.startswith("fairvfl_flwr.features.secagg.") for n in names):
                importing.add(str(path.relative_to(PACKAGE)))
    assert importing and all(p.startswith("app/") for p in importing), sorted(importing)


def test_nodes_are_listed_only_by_discovery_and_the_exchanges_online_check():
    """One node discovery (flower/discovery.py) for the rounds and every job; the exchange
    asks which nodes are still online; the in-process grid answers."""
    calling = {str(path.relative_to(PACKAGE)) for path, tree in _modules()
               if any(isinstance(n, ast.Attribute) and n.attr == "get_node_ids" for n in ast.walk(tree))}
    assert calling <= {"flower/discovery.py", "flower/exchange.py"}, calling


# The only deferred imports: torch-backed modules, loaded where a run needs torch (the MLP,
# split learning) so that the linear path never imports it. No cycle is hidden this way.
DEFERRED = {("core/blocks.py", "fairvfl_flwr.core.models"), ("algorithms/split.py", "fairvfl_flwr.core.models")}


def test_no_package_import_inside_a_function():
    found = []
    for path, tree in _modules():
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("fairvfl_flwr")):
                        if (str(path.relative_to(PACKAGE)), node.module) not in DEFERRED:
                            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}")
    assert not found, "imports of the package's own modules belong at the top of the module:\n" + "\n".join(found)


def test_no_private_name_imported_across_modules():
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fairvfl_flwr"):
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, "\n".join(found)


def _imported_top_names() -> dict[str, str]:
    """Every top-level module the package imports (statements and literal import_module calls),
    with one place that imports it."""
    names = {}
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                found = [node.module]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                found = [node.args[0].value]
            else:
                continue
            for name in found:
                names.setdefault(name.split(".")[0], f"{path.relative_to(ROOT)}:{node.lineno}")
    return names


def test_every_third_party_import_is_declared_and_ray_is_an_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = {re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0].lower().replace("_", "-")
                for req in [*project["dependencies"], *(r for reqs in extras.values() for r in reqs)]}
    dists = packages_distributions()
    undeclared = [f"{where}: {name} (from {dists[name]})" for name, where in sorted(_imported_top_names().items())
                  if name in dists and name not in ("fairvfl_flwr", "_pytest")
                  and not {d.lower().replace("_", "-") for d in dists[name]} & declared]
    assert not undeclared, "imported but not declared in pyproject.toml:\n" + "\n".join(undeclared)
    # a deployed party installs the base dependencies: Flower's simulation engine (Ray) is an extra
    assert not any("simulation" in req or req.startswith("ray") for req in project["dependencies"])
    assert any(req.startswith("flwr[simulation]") for req in extras["simulation"])


def test_the_round_loop_and_the_algorithms_name_no_feature():
    features = [p.stem for layer in ("features", "jobs") for p in (PACKAGE / layer).glob("*.py") if p.stem != "__init__"]
    words = set(features) | {"ckks", "secure_nu", "nu_noise", "checkpoint", "resume", "record_view", "staleness",
                             "straggler", "scores", "secure_aggregation", "transcript_dir"}
    for rel in ("flower/server.py", "flower/hooks.py", "algorithms/fairvfl.py", "algorithms/newton.py",
                "algorithms/split.py"):
        tree = ast.parse((PACKAGE / rel).read_text())
        # an algorithm's declaration lists the settings it cannot run with (Algorithm(refuses=...)):
        # data the run config checks, not a branch of the algorithm
        declared = [kw.value for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Algorithm"
                    for kw in n.keywords if kw.arg == "refuses"]
        skip = {id(n) for d in declared for n in ast.walk(d)}
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in skip}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and id(n) not in skip}
        modules = {(n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not names & words, f"{rel} names a feature: {sorted(names & words)}"
        assert not any(m.startswith(("fairvfl_flwr.features", "fairvfl_flwr.jobs")) for m in modules), \
            f"{rel} imports a feature or a job"


@pytest.mark.slow
def test_the_wheel_installs_the_package_only(tmp_path):
    """client_app.py / server_app.py travel in the FAB; as top-level site-packages modules
    they would collide with any other Flower app in the same environment."""
    import zipfile

    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(tmp_path), str(ROOT)], capture_output=True, text=True)
    if done.returncode != 0 and "hatchling" in done.stderr:
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
                               str(ROOT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"fairvfl_flwr"}, top
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    for tool in ("compare", "sweep", "epsweep", "audit", "export", "tls", "report"):
        assert f"fairvfl-{tool} = fairvfl_flwr.tools.{tool}:" in scripts
    for harness in ("localfed", "psi"):  # a test harness and a micro-benchmark: python -m, not published
        assert f"fairvfl-{harness}" not in scripts
