import functools
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")  # before flwr loads

from fairvfl_flwr.app.client import MODEL_STATE  # noqa: E402
from fairvfl_flwr.app.client import app as client_app  # noqa: E402
from fairvfl_flwr.app.run import run_inprocess  # noqa: E402
from fairvfl_flwr.app.threads import THREAD_VARS  # noqa: E402
from fairvfl_flwr.app.server import run_server  # noqa: E402
from fairvfl_flwr.config import RunConfig  # noqa: E402
from fairvfl_flwr.data import partydata  # noqa: E402
from fairvfl_flwr.flower.inprocess import InProcessGrid  # noqa: E402
from fairvfl_flwr.tools.flwr_engine import SIMULATION_HINT, PrivateRay, SimulationSuperLink  # noqa: E402

TESTS = Path(__file__).resolve().parent

#: The Ray head that ``simulation_superlink`` hands to its SuperLink, started at collection.
_RAY_HEADS: list[PrivateRay] = []
#: This folder's session fixtures that cost nothing to build once per worker.
_FREE_TO_REPEAT = {"run_app"}


#: BLAS and OpenMP (torch's) threads per test process: the workers already keep every core busy,
#: and a second thread per process spins against the other worker's (app/threads.py).
ONE_THREAD = dict.fromkeys(THREAD_VARS, "1")


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (addopts): one worker per core for the suite or the fast loop; none when a
    file or test is named, where starting workers would cost more than it saves."""
    named = [a.split("::")[0] for a in config.args]
    if any(Path(a).resolve() != TESTS for a in named):
        return 0
    return None  # pytest-xdist's own count: the machine's cores


#: Where the pytest-xdist workers leave each test's unit (nodeid: unit) for the controller's
#: scheduler: only the workers collect, and pytest 9 ignores the nodeid suffix by which
#: pytest-xdist's own ``loadgroup`` would carry groups.
UNITS_ENV = "FAIRVFL_TEST_UNITS"


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        for var, value in ONE_THREAD.items():  # before the workers start, so that they inherit it
            os.environ.setdefault(var, value)
    if not hasattr(config, "workerinput") and config.getvalue("dist") == "loadscope":
        # set before the workers start, so that they inherit it
        os.environ[UNITS_ENV] = os.path.join(tempfile.mkdtemp(prefix="fairvfl-units"), "units.json")


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and UNITS_ENV in os.environ:
        shutil.rmtree(Path(os.environ.pop(UNITS_ENV)).parent, ignore_errors=True)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` (addopts), by shared fixture instead of by module: the tests that
    share a costly fixture are one unit, on one worker, so that no fixture is built twice:
    every `flwr run` shares the session's SuperLink and Ray head, and the tests of a module that
    share one of its module fixtures (a trained model, a federation) go together. Every other
    test is a unit of its own."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415 (only under pytest-xdist)

    units: dict[str, str] = {}

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if not units:  # read once every worker has collected, which is when scheduling starts
                path = Path(os.environ[UNITS_ENV])
                units.update(json.loads(path.read_text()) if path.exists() else {"": ""})
            return units.get(nodeid, nodeid)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """In a pytest-xdist worker: deal the units with the most slow tests first
    (``--no-loadscope-reorder`` keeps this order), so that no worker is left with a long test
    at the end while the other waits; and leave each test's unit for the scheduler."""
    if not hasattr(config, "workerinput") or UNITS_ENV not in os.environ:
        return
    unit = {item.nodeid: _shared_fixture_group(item) or item.nodeid for item in items}
    slow, first = {}, {}
    for i, item in enumerate(items):
        key = unit[item.nodeid]
        slow[key] = slow.get(key, 0) + (item.get_closest_marker("slow") is not None)
        first.setdefault(key, i)
    items.sort(key=lambda item: (-slow[unit[item.nodeid]], first[unit[item.nodeid]]))
    path = Path(os.environ[UNITS_ENV])
    fd, tmp = tempfile.mkstemp(dir=path.parent)  # every worker writes the same map; the last replaces
    with os.fdopen(fd, "w") as f:
        json.dump(unit, f)
    os.replace(tmp, path)


def _shared_fixture_group(item) -> str | None:
    fixtures = getattr(item, "_fixtureinfo", None)
    if fixtures is None:
        return None
    if "simulation_superlink" in fixtures.names_closure:
        return "flwr-sim"
    for name in fixtures.names_closure:
        if name in _FREE_TO_REPEAT:
            continue
        for fixturedef in fixtures.name2fixturedefs.get(name, ()):
            # pytest's and plugins' own (tmp_path_factory, pytestconfig) have no base folder
            if fixturedef.scope != "function" and fixturedef.baseid:
                return item.nodeid.split("::")[0]
    return None


def pytest_collection_finish(session):
    """When a selected test submits a `flwr run`, start the shared Ray head now: it comes up on
    the second core while the tests before the first run go on. A pytest-xdist worker does not
    know yet whether it will get the `flwr run` tests: its fixture starts the head when asked."""
    if session.config.option.collectonly or not importlib.util.find_spec("ray"):
        return
    if hasattr(session.config, "workerinput"):
        return
    if any("simulation_superlink" in getattr(item, "fixturenames", ()) for item in session.items):
        _RAY_HEADS.append(PrivateRay())


def pytest_sessionfinish(session):
    while _RAY_HEADS:  # not handed to a SuperLink (the run ended before its first `flwr run`)
        _RAY_HEADS.pop().stop()


@pytest.fixture
def out_dir(tmp_path):
    return str(tmp_path / "outputs")


@pytest.fixture
def private_party_cache(tmp_path, monkeypatch):
    """The parties' prepared-data cache in this test's folder, so that no test reads another's."""
    monkeypatch.setenv(partydata.CACHE_ENV, str(tmp_path / "cache"))


class AppRun(NamedTuple):
    """One run of the real ServerApp and ClientApp over an in-process grid."""

    grid: InProcessGrid
    summary: dict
    folder: Path

    @property
    def history(self) -> list[dict]:
        return json.loads((self.folder / "history.json").read_text())

    def thetas(self) -> dict[int, dict]:
        """Each party's model state after the run, by partition id."""
        return {int(ctx.node_config["partition-id"]): ctx.state.array_records[MODEL_STATE].to_torch_state_dict()
                for ctx in self.grid.contexts.values()}


def _run_app(cfg: RunConfig | Mapping, grid_cls: type[InProcessGrid] = InProcessGrid, **grid_kwargs) -> AppRun:
    """Run ``cfg`` (a RunConfig or a Flower run config) on ``grid_cls`` (an InProcessGrid by default)."""
    if isinstance(cfg, Mapping):
        cfg = RunConfig.from_flower(cfg)
    grid = grid_cls(client_app, cfg.to_flower(), cfg.num_parties, **grid_kwargs)
    try:
        summary, folder = run_server(grid, cfg.to_flower())
    finally:
        grid.close()
    return AppRun(grid, summary, folder)


@pytest.fixture(scope="session")
def run_app():
    """``run_app(cfg, grid_cls=InProcessGrid, **grid_kwargs) -> AppRun``: the app in-process; a grid class
    (a subclass of InProcessGrid that records or tampers) and its keywords may be given."""
    return _run_app


@pytest.fixture(scope="session")
def simulation_superlink(tmp_path_factory):
    """One ``flower-superlink --simulation`` for every test that submits a ``flwr run``, and one
    Ray head that every run's simulation engine connects to (each run still makes its own actors);
    skips where the ``simulation`` extra (Ray) is missing. Stopped after the last of those tests
    (:func:`pytest_runtest_teardown`), else at the session's end."""
    pytest.importorskip("ray", reason=f"needs Flower's simulation engine: {SIMULATION_HINT}")
    ray = _RAY_HEADS.pop() if _RAY_HEADS else True  # True: start one now
    link = SimulationSuperLink(tmp_path_factory.mktemp("flwr-home"), shared_ray=ray)
    _LINKS.append(link)
    yield link
    if link in _LINKS:  # not stopped by the hook already
        _LINKS.remove(link)
        link.stop()


#: The live ``simulation_superlink`` of this process.
_LINKS: list[SimulationSuperLink] = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Stop the shared SuperLink and its Ray head once the session's last ``flwr run`` test is
    done, after pytest's teardown of that test's own fixtures (which may still use the link; in
    a pytest-xdist worker these tests are one unit, :func:`pytest_collection_modifyitems`): the
    idle SuperLink and Ray daemons would take CPU from every test after it."""
    if _LINKS and item is _last_simulation_test(item.session):
        _LINKS.pop().stop()


@functools.cache
def _last_simulation_test(session):
    users = [item for item in session.items if "simulation_superlink" in getattr(item, "fixturenames", ())]
    return users[-1] if users else None


def assert_masked_run_is_plain(run_config: dict, folder, node_configs: list[dict], atol: float) -> None:
    """The run of ``run_config`` under secure aggregation is its unmasked run: the same test accuracy,
    and its largest training gap and multipliers within ``atol`` (the ring's fixed-point sums)."""
    plain, _ = run_inprocess({**run_config, "output-dir": str(folder / "plain")}, quiet=True,
                             node_configs=node_configs)
    masked, _ = run_inprocess({**run_config, "output-dir": str(folder / "masked"),
                               "privacy.secure-aggregation": True}, quiet=True, node_configs=node_configs)
    assert masked["test_acc"] == plain["test_acc"]
    assert abs(masked["train_max_gap"] - plain["train_max_gap"]) < atol
    assert np.allclose(masked["lambdas"], plain["lambdas"], atol=atol)
