"""A registry holds the groups (run config groups.holder = "registry"): its node config, its
release, a whole run that holds ε on the true groups, and what every role receives."""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pandas as pd
import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.config.node import NodeConfig, NodeConfigError
from fairvfl_flwr.core.constraints import SensitiveGroups
from fairvfl_flwr.core.constraints.release import RandomizedResponse
from fairvfl_flwr.data.partydata import ROLE_REGISTRY, PartySpec, party_spec
from fairvfl_flwr.data.preflight import check_party
from fairvfl_flwr.data.problem import constraint_groups, load_data, whole_table
from fairvfl_flwr.features.final_logits import load_scores
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.jobs import group_release
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.flower.party import PartyRuntime
from fairvfl_flwr.tools import owntables

from .conftest import assert_masked_run_is_plain

REGISTRY = {"groups.holder": "registry"}


# -- settings ---------------------------------------------------------------------------------
def test_node_config_declares_the_registry_role_and_its_keys(tmp_path):
    node = NodeConfig.from_flower({"partition-id": 5, "role": "Registry", "release-secret": "/k", "release-epsilon": 2})
    assert (node.role, node.release_secret, node.release_epsilon) == ("registry", "/k", 2.0)
    with pytest.raises(NodeConfigError, match="node config release-epsilon=-1.0: must be >= 0"):
        NodeConfig.from_flower({"partition-id": 5, "release-epsilon": -1})
    # in simulation the last party is the registry where the run config says so, a passive one otherwise
    assert party_spec({"partition-id": 5}, 6, 1, registry=True).role == ROLE_REGISTRY
    assert party_spec({"partition-id": 5}, 6, 1).role == "passive"


def test_run_config_refuses_what_a_registry_run_cannot_do():
    cfg = RunConfig.from_flower({**REGISTRY, "groups.epsilon-s": 1.5})
    assert cfg.registry and cfg.groups_epsilon_s == 1.5 and not RunConfig().registry
    for bad, why in (({"num-parties": 1}, "needs a party besides the 1 active"),
                     ({"batching.batch-size": 64}, "not supported with batching.batch-size"),
                     ({"privacy.label-dp-epsilon": 2.0}, "not supported with privacy.label-dp-epsilon"),
                     ({"sensitive-as-input": True}, "the registry's alone"),
                     ({"groups.epsilon-s": 0.0}, "must be > 0"),
                     ({"groups.release-margin": -0.01}, "groups.release-margin=-0.01: must be >= 0"),
                     ({"epsilon": 0.0}, "groups.release-margin=0.01: needs epsilon > 0")):
        with pytest.raises(ConfigError, match=why):
            RunConfig.from_flower({**REGISTRY, **bad})
    assert cfg.groups_release_margin == 0.01  # on by default: the true gaps within epsilon + 0.01
    # the margin bounds the release's error: with the estimates only (0), epsilon = 0 is a run; exact and
    # encrypted groups carry no release error, so they take it as they are
    assert RunConfig.from_flower({**REGISTRY, "epsilon": 0.0, "groups.release-margin": 0.0}).epsilon == 0.0
    assert RunConfig.from_flower({**REGISTRY, "epsilon": 0.0, "groups.release": "ckks"}).groups_release_margin == 0.01
    assert RunConfig.from_flower({"epsilon": 0.0}).groups_release_margin == 0.01


# -- the registry's side of the release ---------------------------------------------------------
def _registry(tmp_path, eps_s=2.0, **node) -> tuple[InProcessGrid, int]:
    """A COMPAS federation (6 parties, the last the registry with ``node`` config) and the registry's node id."""
    rc = RunConfig.from_flower({**REGISTRY, "dataset": "compas", "groups.epsilon-s": eps_s}).to_flower()
    configs = [{"partition-id": k, "num-partitions": 6} for k in range(6)]
    configs[-1].update(node)
    grid = InProcessGrid(client_app, rc, 6, node_configs=configs)
    return grid, grid.node_ids[-1]


def _ask(registry, eps_s=2.0, mechanism="randomized-response") -> Message:
    grid, node_id = registry
    request = ConfigRecord({"mechanism": mechanism, "epsilon-s": eps_s})
    message = Message(RecordDict({"release": request}), dst_node_id=node_id, message_type=group_release.GROUPS_RELEASE,
                      group_id="groups")
    (reply,) = grid.send_and_receive([message])
    return reply


def test_registry_releases_once_and_refuses_another_epsilon(tmp_path):
    registry = _registry(tmp_path)
    first, again = _ask(registry), _ask(registry)
    codes = first.content.array_records["codes"]["train"].numpy()
    assert np.array_equal(codes, again.content.array_records["codes"]["train"].numpy())  # nothing new to average
    truth = SensitiveGroups.of(load_data(RunConfig.from_flower({**REGISTRY, "dataset": "compas"})).s_train).codes
    kept = np.mean(codes == truth)
    assert abs(kept - RandomizedResponse(2.0, 2).keep) < 0.03
    for reply, why in ((_ask(registry, eps_s=8.0), "epsilon_S=8.*groups.epsilon-s=2: refused"),
                       (_ask(registry, mechanism="none"), "by randomized-response only"),
                       (_ask(_registry(tmp_path, eps_s=8.0, **{"release-epsilon": 4.0}), eps_s=8.0),
                        "release-epsilon=4: refused")):
        assert reply.has_error() and re.search(why, reply.error.reason), reply.error.reason


def test_a_registry_with_its_secret_file_draws_from_it(tmp_path):
    key = tmp_path / "secret"
    key.write_bytes(b"\x01" * 32)
    one = _ask(_registry(tmp_path, **{"release-secret": str(key)}))
    two = _ask(_registry(tmp_path, **{"release-secret": str(key)}))  # another node state, the same secret
    assert np.array_equal(one.content.array_records["codes"]["test"].numpy(),
                          two.content.array_records["codes"]["test"].numpy())
    key.write_bytes(b"short")
    assert "at least 32" in _ask(_registry(tmp_path, **{"release-secret": str(key)})).error.reason


# -- a whole run -----------------------------------------------------------------------------------
def _secret_configs(num_parties: int, folder, seed: int = 0) -> list[dict]:
    key = folder / f"registry-{seed}"
    key.write_bytes(hashlib.sha256(f"test registry {seed}".encode()).digest())
    configs = [{"partition-id": k, "num-partitions": num_parties} for k in range(num_parties)]
    configs[-1]["release-secret"] = str(key)
    return configs


@pytest.mark.slow  # an Adult run through the registry's noisy groups
def test_adult_at_epsilon_s_4_holds_epsilon_on_the_true_groups(tmp_path):
    """Adult, DEO at ε = 0.01, the registry's release at ε_S = 4: the largest loss gap on the
    TRUE groups of the training rows is within ε + 0.01, as with the label owner's groups."""
    rc = {"dataset": "adult", "mode": "fairvfl-scores", "output-dir": str(tmp_path), **REGISTRY,
          "groups.epsilon-s": 4.0}
    summary, folder = run_inprocess(rc, quiet=True, node_configs=_secret_configs(6, tmp_path))
    cfg = RunConfig.from_flower(rc)
    ds = load_data(cfg)
    truth = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label,
                              whole=whole_table(ds.y_train, ds.s_train, ds.y_test, ds.s_test))
    z_train, _ = load_scores(folder)
    gap = float(np.max(np.abs(truth.gaps(ds.y_train, z_train))))
    assert summary["groups_released"] and summary["train_max_gap"] <= cfg.epsilon + 1e-3  # the server's estimate
    assert gap <= cfg.epsilon + 0.01
    # the run says how far the true gap may be from its estimate: the release's error at ε_S = 4 on
    # Adult's 7,500 positives is a few thousandths, and the true gap lies within two of them (one
    # gap, so the largest estimate and the largest error are the same gap's)
    assert 1e-3 < summary["train_release_error"] < 0.01
    assert gap <= summary["train_gap_within"] == pytest.approx(summary["train_estimated_gap"]
                                                               + 2 * summary["train_release_error"], abs=1e-12)
    history = json.loads((folder / "history.json").read_text())
    assert all(row["release_error"] > 0 for row in history[1:])
    # the default release margin holds two errors within 0.01 (at margin 0, this release's error ends at 0.008)
    assert 2 * summary["train_release_error"] <= 0.01 + 1e-4
    assert set(history[-1]["gaps"]) == {"y=+1: Female vs Male", "y=+1: Female vs Male (release spread)"}
    assert summary["test_acc"] > 0.84
    # the model card says who held the groups, and shows no per-group rates the server could not compute
    assert "held by a registry party" in (folder / "model-card.md").read_text()
    manifest = json.loads((folder / "model.json").read_text())
    assert manifest["groups-release"]["epsilon-s"] == 4.0 and manifest["metrics"]["groups"] == {}
    assert manifest["groups-release"]["release-margin"] == 0.01


def test_the_release_margin_holds_the_true_gap_where_the_estimate_alone_does_not(tmp_path):
    """COMPAS, equalized odds at ε = 0.01, the release at ε_S = 1: holding the estimates within ε only
    (``groups.release-margin = 0``, no spread gaps) leaves the largest gap on the TRUE groups beyond
    ε + 0.01, as the release's error (0.012) lets it; with the default margin the run also holds two
    errors within 0.01, and the true gap lands within ε + 0.01. Both runs see the same release."""
    rc = {"dataset": "compas", "constraint": "equalized-odds", "hard-epsilon": False, "mode": "fairvfl-scores",
          **REGISTRY, "groups.epsilon-s": 1.0}
    nodes = _secret_configs(6, tmp_path)
    out = {}
    for margin in (0.0, 0.01):
        run = {**rc, "groups.release-margin": margin, "output-dir": str(tmp_path / str(margin))}
        summary, folder = run_inprocess(run, quiet=True, node_configs=nodes)
        cfg = RunConfig.from_flower(run)
        ds = load_data(cfg)
        truth = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label,
                                  whole=whole_table(ds.y_train, ds.s_train, ds.y_test, ds.s_test))
        history = json.loads((folder / "history.json").read_text())
        out[margin] = (float(np.max(np.abs(truth.gaps(ds.y_train, load_scores(folder)[0])))), summary, history)
    (loose, plain, plain_history), (held, margin, margin_history) = out[0.0], out[0.01]
    assert not any("release spread" in name for name in plain_history[-1]["gaps"])  # margin 0: no spread gap
    assert plain["train_estimated_gap"] <= 0.01 + 1e-3 < 0.02 < loose  # the estimate held, the true gap not
    assert 2 * plain["train_release_error"] > 0.02
    spreads = [name for name in margin_history[-1]["gaps"] if name.endswith(" (release spread)")]
    assert len(spreads) == len(margin_history[-1]["gaps"]) / 2 == 2  # one per gap: y=+1 and y=-1
    assert 2 * margin["train_release_error"] <= 0.01 + 1e-4
    assert margin["train_estimated_gap"] <= 0.01 + 1e-3 and held <= 0.01 + 0.01
    assert margin["test_acc"] > 0.6



@pytest.mark.slow  # two COMPAS runs through the registry
def test_the_margin_holds_under_the_default_hard_epsilon_and_is_not_added_without_fairness(tmp_path):
    """Equalized odds reads ε as the hard gap by default: the hard-gap rule moves ε's bound, which would
    move the margin, so with a margin it is off and two errors stay within the margin. Without a
    fairness term nothing is held: no spread gap, and the model card claims no margin."""
    rc = {"dataset": "compas", "constraint": "equalized-odds", "mode": "fairvfl-scores", **REGISTRY,
          "groups.epsilon-s": 1.0}
    nodes = _secret_configs(6, tmp_path)
    summary, _ = run_inprocess({**rc, "output-dir": str(tmp_path / "held")}, quiet=True, node_configs=nodes)
    assert 2 * summary["train_release_error"] <= 0.01 + 1e-4
    summary, folder = run_inprocess({**rc, "fairness": False, "output-dir": str(tmp_path / "off")}, quiet=True,
                                    node_configs=nodes)
    history = json.loads((folder / "history.json").read_text())
    assert not any("release spread" in name for name in history[-1]["gaps"])
    assert json.loads((folder / "model.json").read_text())["groups-release"]["release-margin"] == 0.0
    assert "release error" not in (folder / "model-card.md").read_text()

# -- what every role receives ------------------------------------------------------------------------
class Recording(InProcessGrid):
    """Keeps every message the server sends and every reply it receives."""

    def __init__(self, *args, **kwargs) -> None:
        self.sent: list[Message] = []
        self.received: list[Message] = []
        super().__init__(*args, tap=self.sent.append, **kwargs)

    def _answer(self, msg: Message) -> Message:
        reply = super()._answer(msg)
        self.received.append(reply)
        return reply

    def partition(self, node_id: int) -> int:
        return int(self.contexts[node_id].node_config["partition-id"])


def _arrays(message: Message) -> dict[str, np.ndarray]:
    if message.has_error():
        return {}
    return {f"{name}/{key}": array.numpy() for name, record in message.content.array_records.items()
            for key, array in record.items()}


def recorded_run(tmp_path, eps_s: float, may_fail: bool = False) -> tuple[Recording, RunConfig]:
    rc = RunConfig.from_flower({"dataset": "adult", "optimizer": "gd", "num-server-rounds": 3, "eval-every": 3,
                                "output-dir": str(tmp_path), **REGISTRY, "groups.epsilon-s": eps_s})
    grid = Recording(client_app, rc.to_flower(), rc.num_parties, node_configs=_secret_configs(6, tmp_path))
    try:
        run_inprocess(rc.to_flower(), quiet=True, grid=grid)
    except Exception:
        if not may_fail:
            raise
    return grid, rc


def guessing_accuracy(arrays: list[np.ndarray], truth: np.ndarray, y: np.ndarray, seed: int = 0) -> float:
    """The best guess of a row's true group from any one array a role received (one value per
    training row, few distinct values per label, as a group code or a group weight is): the
    attacker learns which group each (label, value) cell holds most on one half of the rows,
    with every group equally often (a uniform prior, under which ε_S-LDP caps any guess at
    e^ε/(e^ε + k − 1)), and is scored on the other half."""
    rng = np.random.default_rng(seed)
    k = int(truth.max()) + 1
    per_group = min(np.bincount(truth, minlength=k))
    rows = np.concatenate([rng.choice(np.flatnonzero(truth == g), per_group, replace=False) for g in range(k)])
    rng.shuffle(rows)
    fit, score = rows[: len(rows) // 2], rows[len(rows) // 2:]
    best = 1.0 / k
    for a in arrays:
        if a.shape != truth.shape or any(len(np.unique(a[y == v])) > 4 * k for v in (-1, 1)):
            continue  # not a per-row categorical array: ν, logits (post-processing all the same)
        cells = {}
        for r in fit:
            cells.setdefault((y[r], a[r]), np.zeros(k))[truth[r]] += 1
        guess = np.array([np.argmax(cells.get((y[r], a[r]), np.ones(k))) for r in score])
        best = max(best, float(np.mean(guess == truth[score])))
    return best


def _received(grid: Recording, rc: RunConfig) -> dict[str, list[np.ndarray]]:
    """Every array each role received: the server (every reply), the label owner, the passive
    parties and the registry (every message sent to them)."""
    roles = {0: "label owner", rc.num_parties - 1: "registry"}
    out: dict[str, list[np.ndarray]] = {"server": [], "label owner": [], "passive": [], "registry": []}
    for reply in grid.received:
        out["server"] += _arrays(reply).values()
    for message in grid.sent:
        out[roles.get(grid.partition(message.metadata.dst_node_id), "passive")] += _arrays(message).values()
    return out


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    return recorded_run(tmp_path_factory.mktemp("honest"), eps_s=1.0)


def test_no_role_but_the_registry_receives_a_true_group(honest):
    grid, rc = honest
    ds = load_data(rc)
    truth = SensitiveGroups.of(ds.s_train).codes
    received = _received(grid, rc)
    for role, arrays in received.items():
        for a in arrays:
            assert not (a.shape == truth.shape and np.array_equal(a, truth)), role
    # the label owner gets z, λ and its rows' weights; passive parties ν; nobody a group column
    keys = {role: set() for role in ("label owner", "passive")}
    for message in grid.sent:
        role = {0: "label owner"}.get(grid.partition(message.metadata.dst_node_id), "passive")
        if message.metadata.message_type in (msgs.TRAIN_ACTIVE, msgs.TRAIN_PASSIVE):
            keys[role] |= set(message.content.array_records[msgs.PAYLOAD])
    assert keys == {"label owner": {"z", "lam", "weights"}, "passive": {"nu"}}
    # the server's only group data: the release, which keeps each row's group at the RR rate
    (release,) = [r for r in grid.received if not r.has_error() and "codes" in r.content.array_records]
    codes = release.content.array_records["codes"]["train"].numpy()
    assert abs(np.mean(codes == truth) - RandomizedResponse(1.0, 2).keep) < 0.02


def test_guessing_a_true_group_from_what_any_role_received_stays_within_the_rr_bound(honest):
    grid, rc = honest
    ds = load_data(rc)
    truth, y = SensitiveGroups.of(ds.s_train).codes, np.asarray(ds.y_train)
    bound = RandomizedResponse(1.0, 2).keep  # 0.731
    received = _received(grid, rc)
    for role in ("server", "label owner", "passive"):
        accuracy = guessing_accuracy(received[role], truth, y)
        assert accuracy <= bound + 0.02, role  # 4 standard errors on ~2,900 scored rows
    # the attack is not blind: from the release it gets the RR rate itself
    assert guessing_accuracy(received["server"], truth, y) > bound - 0.03


def test_a_registry_that_sends_the_true_groups_is_caught(tmp_path, monkeypatch):
    """A planted leak: the registry's randomized response keeps every group (the server, correcting
    for flips that did not happen, may then refuse the groups as too small: what it received is
    what counts)."""
    monkeypatch.setattr(RandomizedResponse, "apply", lambda self, codes, u, shift: np.asarray(codes, dtype=np.int64))
    grid, rc = recorded_run(tmp_path, eps_s=1.0, may_fail=True)
    ds = load_data(rc)
    truth, y = SensitiveGroups.of(ds.s_train).codes, np.asarray(ds.y_train)
    assert guessing_accuracy(_received(grid, rc)["server"], truth, y) > RandomizedResponse(1.0, 2).keep + 0.2


def test_the_server_refuses_a_release_that_does_not_fit(monkeypatch, tmp_path):
    """The server checks what the registry sent: a code beyond the groups is refused, naming the registry."""
    monkeypatch.setattr(RandomizedResponse, "apply", lambda self, codes, u, shift: np.asarray(codes) + 5)
    with pytest.raises(Exception, match="the registry .*release holds codes outside 0..1"):
        run_inprocess({"dataset": "compas", "num-server-rounds": 2, "output-dir": str(tmp_path), **REGISTRY},
                      quiet=True)


def test_a_masked_registry_run_is_the_plain_one(tmp_path):
    """Under secure aggregation the registry is a passive party of the round's view (its part is
    the passive parties'), so a masked run trains as the plain one (gradient descent: the same
    steps; the sums to fixed-point precision)."""
    rc = {"dataset": "compas", "constraint": "equalized-odds", "optimizer": "gd", "num-server-rounds": 4,
          "groups.epsilon-s": 2.0, **REGISTRY}
    nodes = _secret_configs(6, tmp_path)  # one release for both runs (a simulated registry draws its secret per run)
    assert_masked_run_is_plain(rc, tmp_path, nodes, atol=1e-6)


# -- the registry's own table: pre-flight and private alignment ----------------------------------------
#: Adult's raw columns cut as a consortium would hold them: the label owner has income but not
#: sex; the registry (the last party) has sex and two feature columns.
REGISTRY_COLUMNS = [["age", "workclass", "education", "income"], ["fnlwgt", "education-num", "marital-status",
                    "occupation"], ["capital-gain", "capital-loss", "relationship", "race"],
                    ["hours-per-week", "native-country", "sex"]]


@pytest.fixture(scope="module")
def registry_tables(tmp_path_factory):
    pytest.importorskip("private_set_intersection")
    folder = tmp_path_factory.mktemp("registry-own")
    raw = owntables.adult_raw(3000, 0)
    raw.loc[raw.index[:3], "sex"] = None  # three people the registry has no group for: refused, then dropped
    owntables.write_own_tables(raw, folder, columns=REGISTRY_COLUMNS)
    return folder


def _registry_spec(folder, **extra) -> PartySpec:
    node = {"partition-id": 3, "role": "registry", "table-path": str(folder / "party3.csv"),
            "id-column": owntables.ID, "sensitive-column": "sex", "group-a": "Female", "group-b": "Male", **extra}
    return party_spec(node, 4, 1, registry=True)


def _drop_missing_groups(folder) -> None:
    table = pd.read_csv(folder / "party3.csv", dtype={owntables.ID: str})
    table.dropna(subset=["sex"]).to_csv(folder / "party3.csv", index=False)


def test_preflight_checks_the_registrys_sensitive_column_and_counts_its_groups(registry_tables):
    report = check_party(_registry_spec(registry_tables))
    if not report.ok:  # the table as written, before another test dropped the rows
        assert re.search(r"sensitive column 'sex' has \d+ missing values", report.text())
        _drop_missing_groups(registry_tables)
    report = check_party(_registry_spec(registry_tables))
    assert report.ok, report.text()
    assert re.search(r"groups: Female: \d+ rows; Male: \d+ rows", report.text())
    assert "'sex'" not in report.text().split("likely protected")[-1]  # its own column, declared by its role


def test_a_deployed_registry_and_label_owner_name_what_each_holds():
    with pytest.raises(NodeConfigError, match="a registry's node config needs sensitive-column"):
        party_spec({"partition-id": 3, "role": "registry", "table-path": "/t.csv"}, 4, 1, registry=True)
    owner = {"partition-id": 0, "role": "active", "table-path": "/t.csv", "label-column": "income",
             "label-positive": ">50K", "protected-label": 1}
    assert party_spec(owner, 4, 1, registry=True).sensitive_column == ""
    with pytest.raises(NodeConfigError, match="the label owner holds no sensitive column"):
        party_spec({**owner, "sensitive-column": "sex"}, 4, 1, registry=True)
    with pytest.raises(NodeConfigError, match="needs sensitive-column"):
        party_spec(owner, 4, 1)  # without a registry the label owner holds the groups


def test_own_tables_with_a_registry_align_by_psi_and_train(registry_tables, tmp_path):
    """Every party brings its own table, the registry's holds the groups: the PSI aligns all
    four, the registry's groups of the common rows are released, and no party's block holds sex.
    Masked, as own tables are by default: the registry is a passive party in the round's view."""
    _drop_missing_groups(registry_tables)
    rc = {"num-parties": 4, "num-server-rounds": 30, "dataset": "adult",
          "tables.own": True, "tables.path": str(registry_tables / "party{partition}.csv"),
          "tables.id-column": owntables.ID, "output-dir": str(tmp_path), "groups.holder": "registry",
          # the default release margin: its weights leave the registry's two-column block almost no curvature,
          # and its Newton direction is scaled to the masking ring's range (algorithms/newton.within_ring)
          "groups.epsilon-s": 4.0}
    settings = RunConfig.from_flower(rc)
    grid = InProcessGrid(client_app, settings.to_flower(), 4)
    summary, _ = run_inprocess(rc, quiet=True, grid=grid)
    assert settings.masked
    assert summary["groups_released"] and set(summary["groups"]) == {"Female", "Male"}
    assert summary["train_max_gap"] <= settings.epsilon + 1e-3
    data = [PartyRuntime(grid.contexts[nid]).data for nid in grid.node_ids]
    assert data[0].constraint is None and data[0].y is not None  # the label owner: labels, no groups
    assert data[3].held is not None and data[3].held.names == ("Female", "Male")
    assert len(data[3].held.train) == data[3].X_train.shape[0] == data[0].X_train.shape[0]
    assert data[3].X_train.shape[1] > 0  # its features: hours-per-week and native-country, never sex
