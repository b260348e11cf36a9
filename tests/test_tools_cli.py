"""The tools' shared pieces: Flower's run-config syntax for --set / --run-config (bad text
named), every console script's usage naming itself with help for each option, the task
runner's progress and the table cells."""

from __future__ import annotations

import argparse
import importlib
import io
import tomllib
from pathlib import Path

import pytest

from fairvfl_flwr.tools import appsource
from fairvfl_flwr.tools.cli import RunConfigArgError, config_text, parse_run_config
from fairvfl_flwr.tools.tasks import Task, run_tasks
from fairvfl_flwr.tools.tables import mean_std

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def test_run_config_args_read_flowers_syntax_later_ones_winning():
    got = parse_run_config(["num-server-rounds=500 optimizer='newton'", 'privacy.secure-nu="ckks"', "fairness=false",
                            "epsilon=1e-3", "num-server-rounds=7", ""])
    assert got == {"num-server-rounds": 7, "optimizer": "newton", "privacy.secure-nu": "ckks", "fairness": False,
                   "epsilon": 0.001}
    assert parse_run_config("eta=50 model='mlp' preset=''", "--run-config") == {"eta": 50, "model": "mlp", "preset": ""}


def test_run_config_text_reads_back_as_written():
    config = {"model": "mlp", "num-server-rounds": 20, "epsilon": 0.01, "fairness": True, "csv.path": "/tmp/a b.csv"}
    assert parse_run_config(config_text(config)) == config
    with pytest.raises(ValueError, match="double quotes"):
        config_text({"csv.label": 'say "hi"'})


@pytest.mark.parametrize("items, option, message", [
    (["model=mlp"], "--set", "--set 'model=mlp': the text 'mlp' needs quotes, as flwr run wants it: "
                             "--set \"model='mlp'\""),
    (["num-server-rounds"], "--set", "--set 'num-server-rounds': expected key=value pairs"),
    (["eval-every=5 junk"], "--set", "--set 'eval-every=5 junk': expected key=value pairs"),
    (["preset="], "--set", "--set 'preset=': preset has no value; an empty string is written --set \"preset=''\""),
    (["a=[1,2]"], "--run-config", "--run-config 'a=[1,2]': "),
    (["missing.toml"], "--set", "--set 'missing.toml': cannot read the TOML file"),
])
def test_bad_run_config_text_is_refused_with_the_text(items, option, message):
    with pytest.raises(RunConfigArgError) as err:
        parse_run_config(items, option)
    assert str(err.value).startswith(message)


def test_a_toml_file_is_read_as_flwr_run_reads_it(tmp_path):
    path = tmp_path / "extra.toml"
    path.write_text("num-server-rounds = 5\n[privacy]\nsecure-nu = \"ckks\"\n")
    assert parse_run_config([str(path)]) == {"num-server-rounds": 5, "privacy.secure-nu": "ckks"}


@pytest.mark.parametrize("module", ["sweep", "epsweep", "compare", "audit"])
def test_each_set_option_names_a_bad_value(module, tmp_path, capsys):
    main = importlib.import_module(f"fairvfl_flwr.tools.{module}").main
    try:
        rc = main(["--set", "model=mlp", "--out", str(tmp_path)])
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2
    assert "--set 'model=mlp': the text 'mlp' needs quotes" in capsys.readouterr().err


def _parser_of(target: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser a console script's function builds (stopped before it parses anything)."""
    module, _, func = target.partition(":")
    seen = []

    def capture(self, *args, **kwargs):
        seen.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(SystemExit):
        getattr(importlib.import_module(module), func)()
    return seen[0]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_each_console_script_names_itself_and_explains_every_option(script, monkeypatch):
    parser = _parser_of(SCRIPTS[script], monkeypatch)
    assert parser.prog == script
    assert parser.format_usage().startswith(f"usage: {script} ")
    missing = [a.option_strings or a.dest for a in parser._actions if not a.help]
    assert not missing, f"{script}: options without help: {missing}"


def test_test_harnesses_are_modules_not_console_scripts():
    targets = {t.partition(":")[0] for t in SCRIPTS.values()}
    assert "fairvfl_flwr.tools.localfed" not in targets


def test_the_runner_reports_each_job_once_in_order_with_a_cost_weighted_eta():
    stream, seen = io.StringIO(), []
    tasks = [Task(work=lambda k=k: k * k, cost=c, data=k) for k, c in ((1, 3.0), (2, 1.0))]
    run_tasks(tasks, lambda done: seen.append((done.task.data, done.value)) or f"task {done.task.data}", stream=stream)
    assert seen == [(1, 1), (2, 4)]
    first, second = stream.getvalue().splitlines()
    assert first.startswith("[" + "#" * 21 + "-" * 7 + "] 1/2 ") and first.endswith("| task 1")  # 3/4 of the cost
    assert second.startswith("[" + "#" * 28 + "] 2/2 ") and "ETA 0:00" in second
    with pytest.raises(ValueError, match="exactly one"):
        Task(run_config={"dataset": "crime"}, work=lambda: None)


def test_the_flwr_engine_stops_the_superlink_it_started_and_leaves_a_given_one_running(tmp_path, monkeypatch):
    """The runs themselves go through a real SuperLink in test_compare.py (the session's)."""
    from fairvfl_flwr.tools import tasks as tasks_module

    class FakeLink:
        def __init__(self, home, shared_ray=False):
            self.home, self.shared_ray, self.stopped, self.runs = home, shared_ray, False, []
            started.append(self)

        def run(self, run_config, num_supernodes):
            self.runs.append(num_supernodes)
            (Path(run_config["output-dir"]) / "run").mkdir(parents=True)
            (Path(run_config["output-dir"]) / "run" / "summary.json").write_text("{}")

        def stop(self):
            self.stopped = True

    started = []
    monkeypatch.setattr(tasks_module, "SimulationSuperLink", FakeLink)
    task = Task(run_config={"dataset": "crime", "num-parties": 3, "output-dir": str(tmp_path / "out")})
    run_tasks([task], lambda done: "", engine="flwr", home=tmp_path / "home", stream=io.StringIO())
    (own,) = started
    assert own.home == tmp_path / "home" and own.shared_ray is True and own.runs == [3] and own.stopped
    given = FakeLink(tmp_path / "given")
    run_tasks([task], lambda done: "", engine="flwr", stream=io.StringIO(), link=given)
    assert len(started) == 2 and given.runs == [3] and not given.stopped


def test_a_cell_is_a_value_or_mean_and_std_over_seeds_without_missing_ones():
    assert mean_std([0.8]) == "0.800"
    assert mean_std([0.80, 0.82, None, float("nan")], scale=100, digits=2, unit="%") == "81.00 ± 1.41%"
    assert mean_std([None]) == "n/a"


def test_made_up_organisations_pass_the_preflight_with_the_node_configs_printed(tmp_path, capsys):
    import pandas as pd

    from fairvfl_flwr.tools import owntables, preflight

    owntables.main(["--out", str(tmp_path / "orgs"), "--rows", "1500"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["party 0", "party 1", "party 2", "party 3"]
    ids = []
    for line in lines:
        text = line.split("--node-config ", 1)[1].strip("'")
        report = preflight.run(text, "num-parties=4")
        assert report.problems == [], (line, report.problems)
        node = parse_run_config(text, "--node-config")
        table = pd.read_csv(node["table-path"], dtype=str)
        assert table.columns[0] == node["id-column"]
        ids.append(set(table[node["id-column"]]))
        assert 0.85 * 1500 <= len(table) <= 0.95 * 1500
    assert len({frozenset(s) for s in ids}) == 4 and len(set.intersection(*ids)) > 0.6 * 1500
    # several sensitive columns move to the label owner, and only there
    nodes = owntables.organisations(tmp_path / "groups", "sex,race", rows=300)
    assert nodes[0]["sensitive-column"] == "sex,race" and "group-a" not in nodes[0]
    held = [pd.read_csv(n["table-path"], nrows=1).columns for n in nodes]
    assert {"sex", "race"} <= set(held[0]) and not any("race" in cols for cols in held[1:])


# -- what `flwr run` is handed --------------------------------------------------------------
def _fab(source: Path | dict[str, Path]) -> bytes:
    from flwr.cli.build import build_fab_from_disk, build_fab_from_files

    return build_fab_from_files(source)[0] if isinstance(source, dict) else build_fab_from_disk(source)


def test_the_submitted_source_leaves_out_environments_and_builds_the_same_fab(tmp_path):
    """A virtual environment in the app folder (one Flower drops by name, one the app's
    .gitignore drops) is not copied; Flower builds the FAB it builds from the folder itself."""
    app = tmp_path / "app"
    (app / "pkg").mkdir(parents=True)
    (app / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
        '[project]\nname = "tiny"\nversion = "1.0.0"\ndependencies = []\n\n'
        '[tool.flwr.app]\npublisher = "me"\n\n[tool.flwr.app.components]\n'
        'serverapp = "pkg.server:app"\nclientapp = "pkg.client:app"\n\n[tool.flwr.app.config]\nx = 1\n')
    (app / ".gitignore").write_text("ci-env/\n")
    for name in ("__init__.py", "server.py", "client.py"):
        (app / "pkg" / name).write_text("app = None\n")
    (app / "README.md").write_text("tiny\n")
    for env in (".venv", "ci-env"):
        (app / env / "lib").mkdir(parents=True)
        (app / env / "pyvenv.cfg").write_text("home = /usr\n")
        (app / env / "lib" / "site.py").write_text("x = 1\n")
    (app / "pkg" / "__pycache__").mkdir()
    (app / "pkg" / "__pycache__" / "server.cpython-311.pyc").write_bytes(b"\0")
    assert sorted(map(str, appsource.source_files(app))) == [
        ".gitignore", "README.md", "pkg/__init__.py", "pkg/client.py", "pkg/server.py", "pyproject.toml"]
    with appsource.submittable(app) as copy:
        assert _fab(copy) == _fab(app)
    assert not copy.exists()


def test_this_apps_submitted_source_builds_the_fab_of_the_files_git_knows():
    import subprocess

    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    known = {rel: REPO / rel for rel in listed.stdout.splitlines() if (REPO / rel).is_file()}
    with appsource.submittable(REPO) as copy:
        assert _fab(copy) == _fab(known)
