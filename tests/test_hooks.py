"""The server's seams: hooks see a read-only ServerView and run in the one declared order;
the server is not a Flower Strategy (docs/architecture.md)."""

import importlib
import json
import inspect
import pkgutil
import random

import numpy as np
import pytest
from flwr.serverapp.strategy import Strategy

from fairvfl_flwr import features, jobs
from fairvfl_flwr.algorithms.fairvfl import FairVFL
from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app import training as app_training
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.app.training import HOOK_ORDER, build_server
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.data.partydata import server_labels_for
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.flower.hooks import RoundHook, ServerView, in_order
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.features.labeldp import LabelDP
from fairvfl_flwr.features.registry import LabelOwnerWeights
from fairvfl_flwr.features.rejoin import Rejoin
from fairvfl_flwr.flower.server import VFLServer


def _feature_hooks() -> set[type]:
    found = set()
    for package in (features, jobs):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            found |= {c for c in vars(module).values()
                      if isinstance(c, type) and issubclass(c, RoundHook) and c.__module__ == module.__name__}
    return found


def _labels(cfg: RunConfig):
    return server_labels_for(cfg, load_data(cfg))


def test_every_feature_hook_has_one_place_in_the_declared_order():
    assert len(set(HOOK_ORDER)) == len(HOOK_ORDER)
    assert set(HOOK_ORDER) == _feature_hooks(), "a feature's round hook needs a place in app/training.py HOOK_ORDER"


def test_build_server_runs_the_hooks_in_the_declared_order_whatever_order_they_are_added(tmp_path):
    pytest.importorskip("tenseal")
    cfg = RunConfig.from_flower({
        "dataset": "crime", "num-parties": 3, "mode": "fairvfl-scores", "privacy.label-dp-epsilon": 2.0,
        "privacy.nu-noise": 1.0, "privacy.secure-nu": "ckks", "privacy.transcript-dir": str(tmp_path / "t"),
        "privacy.secure-aggregation": True, "reliability.checkpoint-every": 5})
    server = build_server(cfg, _labels(cfg), tmp_path)
    # every feature on: every hook, in order (but Rejoin, last, which encrypted ν leaves off, and the
    # label owner's weights, which need a registry, which label DP refuses)
    assert [type(h) for h in server.hooks.hooks] == [h for h in HOOK_ORDER[:-1] if h is not LabelOwnerWeights]
    assert HOOK_ORDER[-1] is Rejoin
    registry = build_server(cfg.replace(label_dp_epsilon=0.0, groups_holder="registry"), _labels(cfg), tmp_path)
    assert [type(h) for h in registry.hooks.hooks] == [h for h in HOOK_ORDER[:-1] if h is not LabelDP]
    shuffled = list(server.hooks.hooks)
    random.Random(0).shuffle(shuffled)
    assert in_order(shuffled, HOOK_ORDER) == server.hooks.hooks


def test_a_hook_the_order_does_not_place_is_refused():
    class Stray(RoundHook):
        pass

    with pytest.raises(ValueError, match="Stray has no place in the hook order"):
        in_order([Stray()], HOOK_ORDER)


class Spy(RoundHook):
    """Notes each point it is called at, and what it was handed as the server."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []
        self.views: set[type] = set()

    def _note(self, server, point: str, server_round: int | None = None) -> None:
        self.views.add(type(server))
        if not self.calls or self.calls[-1] != (point, server_round):
            self.calls.append((point, server_round))

    def begin(self, server, grid, timeout):
        self._note(server, "begin")

    def init_messages(self, server, messages):
        self._note(server, "init_messages")

    def nu(self, server, server_round, nu):
        self._note(server, "nu", server_round)
        return nu

    def passive_message(self, server, server_round, nu, evaluate):
        self._note(server, "passive_message", server_round)

    def incoming(self, server, grid, server_round, replies, timeout):
        self._note(server, "incoming", server_round)
        return replies

    def record(self, server, server_round, row):
        self._note(server, "record", server_round)

    def end(self, server, grid, server_round, timeout):
        self._note(server, "end", server_round)


def test_hooks_get_the_view_at_each_point_in_the_documented_order():
    cfg = RunConfig.from_flower({"dataset": "crime", "num-parties": 3, "num-server-rounds": 2, "eval-every": 2,
                                 "optimizer": "gd"})
    spy = Spy()
    server = FairVFL(cfg, _labels(cfg), hooks=[spy])
    server.start(InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties))
    assert spy.views == {ServerView}
    one_round = lambda t: [("nu", t), ("passive_message", t), ("incoming", t), ("record", t), ("end", t)]  # noqa: E731
    assert spy.calls == [("begin", None), ("init_messages", None), ("incoming", 0), ("record", 0), ("end", 0),
                         *one_round(1), *one_round(2)]


def test_the_view_is_read_only_and_changes_go_through_its_methods():
    cfg = RunConfig.from_flower({"dataset": "crime", "num-parties": 3})
    server = FairVFL(cfg, _labels(cfg))
    server.history.append({"round": 0, "loss": 1.0})
    view = server.view
    with pytest.raises(ValueError):
        view.lam[0] = 1.0
    with pytest.raises(AttributeError):
        view.lam = np.ones(2)
    with pytest.raises(TypeError):
        view.nodes[7] = None
    with pytest.raises(TypeError):
        view.last_row["loss"] = 0.0
    with pytest.raises(AttributeError):
        view.history  # noqa: B018  (the history is the server's: a hook reads the last row)
    view.set_lambda(np.full(server.lam.shape, 0.25))
    assert np.array_equal(server.lam, np.full(server.lam.shape, 0.25)) and np.array_equal(view.lam, server.lam)
    server.u_train[7] = np.zeros(4)
    server.u_test[7] = np.zeros(2)
    for write in (lambda: view.u_train[7].__setitem__(0, 1.0), lambda: view.u_test[7].__setitem__(0, 1.0),
                  lambda: view.labels.y_train.__setitem__(0, 1), lambda: view.labels.s_train.__setitem__(0, 1),
                  lambda: view.labels.y_test.__setitem__(0, 1)):
        with pytest.raises(ValueError, match="read-only"):
            write()
    with pytest.raises(TypeError):
        view.u_train[8] = np.zeros(4)
    assert not server.u_train[7].any() and server.labels.y_train.flags.writeable  # the server's own stay writeable


class _Resumes(RoundHook):
    def __init__(self, first):
        self.first, self.began = first, False

    def begin(self, server, grid, timeout):
        self.began = True
        return self.first


def test_every_hook_begins_on_a_resume_and_two_resuming_hooks_are_refused():
    cfg = RunConfig.from_flower({"dataset": "crime", "num-parties": 3})
    resume, after = _Resumes(5), _Resumes(None)
    server = FairVFL(cfg, _labels(cfg), hooks=[resume, after])
    assert server.hooks.begin(grid=None, timeout=1.0) == 5
    assert after.began  # a hook after the resuming one still begins (e.g. a key set-up)
    server = FairVFL(cfg, _labels(cfg), hooks=[_Resumes(5), _Resumes(3)])
    with pytest.raises(ValueError, match=r"more than one round hook restored the run: _Resumes \(round 5\), "
                                         r"_Resumes \(round 3\)"):
        server.hooks.begin(grid=None, timeout=1.0)


def test_the_server_does_not_claim_flowers_strategy_contract():
    """Flower's wrapper strategies run Strategy.start's stock loop; the VFL loop is the
    server's own start, so the class must not pass for a Strategy (docs/architecture.md)."""
    assert not issubclass(VFLServer, Strategy)
    params = inspect.signature(VFLServer.start).parameters
    assert list(params) == ["self", "grid", "num_rounds", "timeout"]  # no initial_arrays: no global model


class RoundCounter(RoundHook):
    """A new round feature's module: a hook that notes every round the server records."""

    def __init__(self) -> None:
        self.rounds: list[int] = []

    def record(self, server, server_round, row):
        self.rounds.append(server_round)


def test_a_new_round_feature_is_its_module_plus_one_line_in_round_features(monkeypatch, tmp_path):
    counter = RoundCounter()
    monkeypatch.setattr(app_training, "ROUND_FEATURES", (*app_training.ROUND_FEATURES, (RoundCounter, lambda s: counter)))
    _, folder = run_inprocess({"dataset": "crime", "num-parties": 3, "num-server-rounds": 3, "output-dir": str(tmp_path)},
                              quiet=True)
    history = json.loads((folder / "history.json").read_text())
    assert counter.rounds == [row["round"] for row in history] and counter.rounds[:2] == [0, 1]
