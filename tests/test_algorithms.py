"""An algorithm is one module plus one registration (config/algorithms.py, docs/architecture.md
"Adding an algorithm").

tests/toy_algorithm.py is a whole algorithm, as a plug-in would write it: every party, active
or passive, takes one gradient step a round on the ν the server sends, under message types
of its own (its start message included), and each party counts its steps in a record of its
node's state; each handler is declared with its message's kind and the records it keeps. Registered by one line, it runs end to end through the real ServerApp and
ClientApp over the in-process grid; the guard answers a re-sent step without stepping twice,
a party that restarts mid-run is restored to the undisturbed model and count, transcripts
keep what every party received, and a straggler's replies are held back, all without an
edit outside the module. The last test holds the registries' side of it: no module compares
a message type's prefix, an optimizer's name or a constraint kind's name outside the module
that declares it.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import fairvfl_flwr
from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.config import algorithms as registry
from fairvfl_flwr.core.constraints import KINDS
from fairvfl_flwr.features import straggler, transcripts
from fairvfl_flwr.flower import jobs
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.jobs import saving
from fairvfl_flwr.flower.party import MODEL_STATE
from tests.test_rejoin import DropGrid
from tests.test_reliability import FaultyGrid
from tests.toy_algorithm import TOY, TOY_INIT, TOY_STATE, TOY_STEP

pytestmark = pytest.mark.usefixtures("private_party_cache")


@pytest.fixture
def toy():
    registry.register(TOY)  # the one registration line
    yield TOY
    registry.unregister(TOY.name)


RC = {"dataset": "crime", "num-parties": 3, "num-server-rounds": 5, "eval-every": 5, "stop-tolerance": 0.0,
      "optimizer": "toy", "privacy.secure-aggregation": False, "wire-dtype": "float64"}
KEYS = ("train_loss", "train_max_gap", "test_acc", "test_dfp", "test_dfn", "rounds")


def _rc(tmp_path: Path, **extra) -> dict:
    return RunConfig.from_flower({**RC, "output-dir": str(tmp_path / "runs"), **extra}).to_flower()


def _run(grid, rc: dict) -> dict:
    summary, folder = run_server(grid, rc)
    return {**summary, "history": json.loads((Path(folder) / "history.json").read_text())}


def _counts(grid) -> dict[int, int]:
    """Each party's count of its toy steps, by partition."""
    out = {}
    for ctx in grid.contexts.values():
        record = ctx.state.config_records.get(TOY_STATE)
        out[int(ctx.node_config["partition-id"])] = 0 if record is None else int(record["steps"])
    return out


def _thetas(grid) -> dict[int, dict[str, np.ndarray]]:
    return {int(ctx.node_config["partition-id"]): {k: v.numpy() for k, v in ctx.state.array_records[MODEL_STATE].items()}
            for ctx in grid.contexts.values()}


@pytest.fixture
def undisturbed(toy, tmp_path):
    rc = _rc(tmp_path / "undisturbed")
    grid = FaultyGrid(client_app, rc, rc["num-parties"])
    return _run(grid, rc), grid


def test_a_registered_algorithm_runs_end_to_end_with_its_own_messages(toy, undisturbed):
    summary, grid = undisturbed
    assert registry.resolve(RunConfig.from_flower(RC)).algorithm is TOY
    assert {TOY_INIT, TOY_STEP} <= set(jobs.message_types()) <= set(client_app._registered_funcs)
    sent = [(idx, rnd, mtype) for idx, rnd, mtype in grid.delivered]
    assert {mtype for _, _, mtype in sent} == {msgs.INFO, TOY_INIT, TOY_STEP, saving.SAVE}  # it saves its blocks
    assert [mtype for _, rnd, mtype in sent if rnd == "0" and mtype != msgs.INFO] == [TOY_INIT] * 3
    assert summary["rounds"] == 5 and _counts(grid) == {0: 5, 1: 5, 2: 5}
    assert summary["history"][-1]["loss"] < summary["history"][0]["loss"]  # the steps train the model
    # unregistered, it is no choice of the run config any more, and its types leave the protocol's list
    registry.unregister(TOY.name)
    try:
        assert "toy" not in registry.OPTIMIZERS and TOY_STEP not in jobs.message_types()
        with pytest.raises(ConfigError, match="optimizer='toy': choose one of auto, "):
            RunConfig.from_flower(RC)
    finally:
        registry.register(TOY)


def test_the_guard_answers_a_resent_step_without_stepping_twice(toy, undisturbed, tmp_path):
    lost = set()

    def lose(idx, rnd):  # the first reply of party 1 in round 3: the server sends the same message again
        if (idx, rnd) == (1, "3") and (idx, rnd) not in lost:
            lost.add((idx, rnd))
            return True
        return False

    rc = _rc(tmp_path / "resent", **{"reliability.round-timeout": 2.0})
    grid = FaultyGrid(client_app, rc, rc["num-parties"], lose_reply=lose)
    summary = _run(grid, rc)
    assert [d for d in grid.delivered if d[:2] == (1, "3")] == [(1, "3", TOY_STEP)] * 2
    assert _counts(grid) == {0: 5, 1: 5, 2: 5}  # the re-sent step was answered, not taken again
    for key in KEYS:
        assert summary[key] == undisturbed[0][key], key


def test_a_restarted_party_rejoins_with_the_undisturbed_model_and_count(toy, undisturbed, tmp_path):
    rc = _rc(tmp_path / "rejoin", **{"reliability.rejoin-timeout": 20.0, "reliability.round-timeout": 30.0})
    grid = DropGrid(client_app, rc, rc["num-parties"], victim=2, at=3)
    summary = _run(grid, rc)
    assert grid.returned and [(r["partition"], r["round"]) for r in summary["rejoins"]] == [(2, 3)]
    assert _counts(grid) == {0: 5, 1: 5, 2: 5}  # restored with θ: the toy's own record is round state
    reference = _thetas(undisturbed[1])
    for pid, state in _thetas(grid).items():
        for name, value in reference[pid].items():
            assert np.array_equal(state[name], value), (pid, name)
    for key in KEYS:
        assert summary[key] == undisturbed[0][key], key


def test_transcripts_keep_what_every_party_received(toy, tmp_path):
    folder = tmp_path / "transcripts"
    rc = _rc(tmp_path / "t", **{"privacy.transcript-dir": str(folder)})
    _run(FaultyGrid(client_app, rc, rc["num-parties"]), rc)
    server = {int(r["round"]): r for r in transcripts.load(folder, transcripts.SERVER)}
    assert sorted(server) == [0, 1, 2, 3, 4, 5]
    for pid in range(3):
        rounds = {int(r["round"]): r for r in transcripts.load(folder, pid)}
        assert sorted(rounds) == [0, 1, 2, 3, 4, 5]
        for t, mine in rounds.items():
            np.testing.assert_array_equal(mine["own-u"], server[t][f"u-{pid}"])  # its reply, as the server got it
            if t:  # the toy's payload, as it arrived: the ν the server sent
                np.testing.assert_array_equal(mine["nu"], server[t]["nu"])


def test_a_stragglers_toy_replies_are_held_back(toy, tmp_path, monkeypatch):
    slept = []
    monkeypatch.setattr(straggler, "time", SimpleNamespace(sleep=slept.append))
    rc = _rc(tmp_path / "slow", **{"staleness.straggler-delays": "1=0.25"})
    _run(FaultyGrid(client_app, rc, rc["num-parties"]), rc)
    assert slept == [0.25] * 5  # every round's step of party 1; its start message is not delayed


# -- the registries' side: nobody else compares a declared name ---------------------------------
PACKAGE = Path(fairvfl_flwr.__file__).parent


def _declaring_modules() -> dict[str, set[Path]]:
    """Each optimizer's and constraint kind's name -> the modules that declare it."""
    out: dict[str, set[Path]] = {}
    for alg in registry.registered():
        if alg.mode:  # a mode selects it: its name is no value of optimizer
            continue
        homes = {Path(inspect.getfile(module)) for module in list(sys.modules.values())
                 if getattr(module, "__file__", None) and str(module.__file__).startswith(str(PACKAGE))
                 and any(value is alg for value in vars(module).values())}
        out[alg.name] = {h for h in homes if h.parent.name == "algorithms" and h.name != "__init__.py"}
        if alg.step_rule:  # the block's step rule of that name (core/models.STEP_RULES)
            out[alg.name] |= {PACKAGE / "core" / "models.py"}
    for name, kind in KINDS.items():
        out[name] = {Path(inspect.getfile(kind))}
    return out


def _compared(tree: ast.AST) -> Iterable[tuple[int, str]]:
    """(line, text) of every string literal compared (==, !=, in, ...) or tested as a prefix or suffix."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for part in [node.left, *node.comparators]:
                elts = part.elts if isinstance(part, (ast.Tuple, ast.List, ast.Set)) else [part]
                yield from ((node.lineno, e.value) for e in elts
                            if isinstance(e, ast.Constant) and isinstance(e.value, str))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("startswith", "endswith"):
            for arg in node.args:
                elts = arg.elts if isinstance(arg, ast.Tuple) else [arg]
                yield from ((node.lineno, "prefix:" + e.value) for e in elts
                            if isinstance(e, ast.Constant) and isinstance(e.value, str))


def test_no_module_compares_a_name_another_module_declares():
    declared = _declaring_modules()
    assert {"gd", "newton", "adagrad", "deo", "equalized-odds", "demographic-parity"} <= set(declared)
    assert all(declared.values()), declared
    protocol = {PACKAGE / "flower" / "protocol.py", PACKAGE / "flower" / "jobs.py"}
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _compared(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(PACKAGE.parent)}:{line} {text!r}"
            if text in declared and path not in declared[text]:
                offenders.append(where)  # ask the algorithm's or the kind's declaration
            prefix = text.removeprefix("prefix:")
            if path not in protocol and (prefix.startswith(("train.", "query.")) or
                                         (text.startswith("prefix:") and prefix in ("train", "query"))):
                offenders.append(where)  # ask flower.protocol.kind_of
    assert offenders == [], "\n".join(offenders)
