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
from fairvfl_flwr.flower.hooks import CAPABILITIES, Hooks, Recovery, RoundHook, ServerView, in_order
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.features.checkpoint import Checkpoints
from fairvfl_flwr.features.ckks import CkksChannel
from fairvfl_flwr.features.final_logits import KeepScores, load_scores
from fairvfl_flwr.features.labeldp import LabelDP
from fairvfl_flwr.features.registry import LabelOwnerWeights, ReleaseError
from fairvfl_flwr.features.rejoin import Rejoin
from fairvfl_flwr.flower.server import VFLServer
from fairvfl_flwr.jobs.encrypted_groups import RegistryChannel


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
    # every feature on: every hook, in order (but Rejoin, last, which encrypted ν leaves off, the
    # label owner's weights and the release's error, which need a registry, which label DP refuses, and
    # the registry's channel of encrypted groups, which encrypted ν refuses)
    assert [type(h) for h in server.hooks.hooks] == [h for h in HOOK_ORDER[:-1]
                                                     if h not in (LabelOwnerWeights, ReleaseError, RegistryChannel)]
    assert HOOK_ORDER[-1] is Rejoin
    registry = build_server(cfg.replace(label_dp_epsilon=0.0, groups_holder="registry"), _labels(cfg), tmp_path)
    assert [type(h) for h in registry.hooks.hooks] == [h for h in HOOK_ORDER[:-1]
                                                       if h not in (LabelDP, RegistryChannel)]
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


class _Peeks(RoundHook):
    """A hook that declares nothing and tries what only a restoring hook may do."""

    def begin(self, server, grid, timeout):
        server.snapshot()


class _Restores(RoundHook):
    needs = ("recovery",)

    def begin(self, server, grid, timeout):
        self.saved = server.snapshot()


def test_only_a_hook_that_declares_recovery_gets_it():
    cfg = RunConfig.from_flower({"dataset": "crime", "num-parties": 3})
    server = FairVFL(cfg, _labels(cfg), hooks=[_Peeks()])
    with pytest.raises(AttributeError, match=r"snapshot is part of the 'recovery' capability \(Recovery\): a round "
                                             r"hook that uses it declares needs = \('recovery',\)"):
        server.hooks.begin(grid=None, timeout=1.0)
    for name in ("restore", "rebind", "load_state_dict", "state_dict", "node_of", "exchange_unnamed"):
        with pytest.raises(AttributeError, match="'recovery' capability"):
            getattr(server.view, name)
    restores = _Restores()
    server = FairVFL(cfg, _labels(cfg), hooks=[restores])
    server.hooks.begin(grid=None, timeout=1.0)
    assert set(restores.saved) == set(server.round_state)
    assert type(server.hooks.views[0]) is Recovery and type(server.view) is ServerView  # the plain view stays plain

    class Greedy(RoundHook):
        needs = ("recovery", "root")

    with pytest.raises(ValueError, match="Greedy needs 'root': the capabilities a hook may declare are 'recovery'"):
        FairVFL(cfg, _labels(cfg), hooks=[Greedy()])


def test_the_recovery_capability_goes_only_to_the_hooks_that_restore(tmp_path):
    cfg = RunConfig.from_flower({
        "dataset": "crime", "num-parties": 3, "mode": "fairvfl-scores", "privacy.label-dp-epsilon": 2.0,
        "privacy.nu-noise": 1.0, "privacy.secure-aggregation": True, "reliability.checkpoint-every": 5,
        "reliability.rejoin-timeout": 5.0, "privacy.transcript-dir": str(tmp_path / "t")})
    server = build_server(cfg, _labels(cfg), tmp_path)
    given = {type(h): type(v) for h, v in zip(server.hooks.hooks, server.hooks.views)}
    assert {h for h, v in given.items() if v is not ServerView} == {Checkpoints, Rejoin}
    assert all(v is Recovery for h, v in given.items() if h in (Checkpoints, Rejoin))
    assert set(CAPABILITIES) == {"recovery"}


class _Recovers(RoundHook):
    def recover(self, server, grid, exc, timeout):
        return 1


class _Carries(RoundHook):
    def passive_message(self, server, server_round, nu, evaluate):
        return None


def test_two_hooks_answering_a_point_only_one_may_answer_are_refused():
    cfg = RunConfig.from_flower({"dataset": "crime", "num-parties": 3})
    server = FairVFL(cfg, _labels(cfg))
    with pytest.raises(ValueError, match="round hooks _Recovers and Rejoin both answer recover"):
        Hooks([_Recovers(), Rejoin(5.0)], server.view)
    with pytest.raises(ValueError, match="round hooks CkksChannel and _Carries both answer passive_message"):
        Hooks([CkksChannel(10), _Carries()], server.view)
    Hooks([_Recovers(), _Carries(), RoundCounter()], server.view)  # one each: allowed


class _Says(RoundHook):
    def __init__(self, key):
        self.key, self.written = key, None

    def summary(self):
        return {self.key: 7}

    def files(self, server, grid, folder, summary, timeout):
        self.written = (folder, summary[self.key])


def test_hooks_add_to_the_summary_and_write_their_files_after_the_run(monkeypatch, tmp_path):
    says = _Says("said")
    monkeypatch.setattr(app_training, "ROUND_FEATURES", (*app_training.ROUND_FEATURES, (_Says, lambda s: says)))
    summary, folder = run_inprocess({"dataset": "crime", "num-parties": 3, "num-server-rounds": 2,
                                     "mode": "fairvfl-scores", "output-dir": str(tmp_path)}, quiet=True)
    assert summary["said"] == 7 and json.loads((folder / "summary.json").read_text())["said"] == 7
    assert says.written == (folder, 7)  # after the summary: the hook's files see it
    cfg = RunConfig.from_flower({"dataset": "crime", "num-parties": 3})
    labels = _labels(cfg)
    z_train, z_test = load_scores(folder)
    assert z_train.shape == labels.y_train.shape and z_test.shape == labels.y_test.shape
    assert (folder / "model.json").exists()  # the kept scores and the saved blocks, from one hook's scores
    server = FairVFL(cfg, _labels(cfg), hooks=[_Says("same"), _Says("same")])
    with pytest.raises(ValueError, match="round hooks _Says and _Says both add 'same' to the run's summary"):
        server.hooks.summary()


def test_one_hook_keeps_the_final_scores(tmp_path):
    cfg = RunConfig.from_flower({"dataset": "crime", "num-parties": 3, "mode": "fairvfl-scores",
                                 "reliability.checkpoint-every": 2})
    server = build_server(cfg, _labels(cfg), tmp_path)
    kept = [h for h in server.hooks.hooks if isinstance(h, KeepScores)]
    assert len(kept) == 1 and kept[0].write
    saving = [h for h in server.hooks.hooks if type(h).__name__ == "SaveBlocks"]
    assert len(saving) == 1 and saving[0].scores is kept[0]  # the model cards read the same scores
    plain = build_server(cfg.replace(mode="fairvfl"), _labels(cfg), tmp_path)
    assert [h.write for h in plain.hooks.hooks if isinstance(h, KeepScores)] == [False]  # for the cards only
