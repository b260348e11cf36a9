"""A registry's lifetime ledger (secure/ledger.py): what it discloses adds up across runs, and a
lying server that starts fresh runs (a fresh session, key, count and draw each time) gets no
more than the ledger's budget allows, in either release of the groups.

Each "run" below is a fresh in-process federation: fresh node state for every party, as a new
Flower run has; the registry keeps only its node config's files (its secret, its state-dir)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.config.node import NodeConfig
from fairvfl_flwr.core.constraints import SensitiveGroups
from fairvfl_flwr.core.constraints.release import RandomizedResponse
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.jobs import group_release
from fairvfl_flwr.secure import ledger

REGISTRY = {"groups.holder": "registry", "dataset": "compas"}


def _context() -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


# -- the ledger itself ---------------------------------------------------------------------------
def test_the_ledger_adds_up_across_openings_and_writes_only_what_succeeded(tmp_path):
    node = NodeConfig.from_flower({"partition-id": 5, "state-dir": str(tmp_path)})
    with ledger.opened(_context(), node, "registry") as book:
        assert book.spend("sums", 10, 25, "sums") == 10
    with ledger.opened(_context(), node, "registry") as book:  # another run's fresh node state
        assert book.spend("sums", 10, 25, "sums") == 20
    with pytest.raises(ledger.LedgerError, match="after 20 over its lifetime.*budget is 25: refused"):
        with ledger.opened(_context(), node, "registry") as book:
            book.spend("sums", 6, 25, "sums")
    with pytest.raises(ledger.LedgerError):  # a body that fails writes nothing of what it spent
        with ledger.opened(_context(), node, "registry") as book:
            book.spend("sums", 5, 25, "sums")
            book.release("rr", "eps=9", 9.0, 1.0, "a release")
    with ledger.opened(_context(), node, "registry") as book:
        assert book.used("sums") == 20 and book.releases("rr") == {}
        assert book.release("rr", "eps=1", 1.0, 3.0, "x") == 1.0
        assert book.release("rr", "eps=1", 1.0, 3.0, "x") == 1.0  # the same release again is free
        assert book.release("rr", "eps=2", 2.0, 3.0, "x") == 3.0  # another one composes
    with pytest.raises(ledger.LedgerError, match=r"eps=1 \(1\), eps=2 \(2\).*3.5 would pass its lifetime budget 3"):
        with ledger.opened(_context(), node, "registry") as book:
            book.release("rr", "eps=0.5", 0.5, 3.0, "x")
    (tmp_path / ledger.FILE).write_text("{ damaged")
    with pytest.raises(ledger.LedgerError, match="is damaged.*never reset"):
        with ledger.opened(_context(), node, "registry") as book:
            book.used("sums")


def test_a_simulated_party_keeps_its_ledger_in_its_node_state_and_a_deployed_one_on_its_disk(tmp_path):
    assert ledger.ledger_folder(NodeConfig.from_flower({"partition-id": 1})) is None
    deployed = NodeConfig.from_flower({"partition-id": 1, "table-path": "/data/t.csv", "cache-dir": str(tmp_path)})
    assert ledger.ledger_folder(deployed) == tmp_path / "state"
    context = _context()
    simulated = NodeConfig.from_flower({"partition-id": 1})
    with ledger.opened(context, simulated, "p") as book:
        book.spend("sums", 3, 0, "sums")
    with ledger.opened(context, simulated, "p") as book:
        assert book.used("sums") == 3
    assert ledger.STATE in context.state.config_records and not list(tmp_path.iterdir())


# -- randomized response: no fresh draws for any run ---------------------------------------------------
def _release(node: dict, **run) -> Message:
    """One fresh federation (a new run: every party's node state empty) whose server asks the
    registry for its release at the run config's ε_S."""
    rc = RunConfig.from_flower({**REGISTRY, **run}).to_flower()
    configs = [{"partition-id": k, "num-partitions": 6} for k in range(6)]
    configs[-1].update(node)
    grid = InProcessGrid(client_app, rc, 6, node_configs=configs)
    request = ConfigRecord({"mechanism": "randomized-response", "epsilon-s": float(rc["groups.epsilon-s"])})
    message = Message(RecordDict({"release": request}), dst_node_id=grid.node_ids[-1],
                      message_type=group_release.GROUPS_RELEASE, group_id="groups")
    (reply,) = grid.send_and_receive([message])
    return reply


def _by_id(reply: Message, **run) -> dict:
    """Every released row's code by its row id (the ids of the run's split)."""
    ds = load_data(RunConfig.from_flower({**REGISTRY, **run}))
    codes = reply.content.array_records["codes"]
    return {**dict(zip(map(str, ds.ids_train), codes["train"].numpy().tolist())),
            **dict(zip(map(str, ds.ids_test), codes["test"].numpy().tolist()))}


@pytest.fixture
def registry_files(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(bytes(range(32)))
    return {"release-secret": str(secret), "state-dir": str(tmp_path / "state")}


def test_fresh_runs_with_other_splits_get_every_row_released_alike(registry_files):
    """The attack: fresh runs, each with another split (so other rows in train and test, other
    positions), and a vote per row over them. It can fail: were a row drawn afresh in each run,
    as before the draws were keyed by row id, a vote over 9 runs at ε_S = 1 would name a row's
    group with probability 0.93 (binomial), 25 runs 0.99, against 0.73 from one release."""
    votes, seen = {}, []
    for seed in range(4):
        reply = _release(registry_files, **{"groups.epsilon-s": 1.0, "seed": seed})
        assert not reply.has_error(), reply.error.reason
        got = _by_id(reply, seed=seed)
        seen.append(got)
        for row, code in got.items():
            votes.setdefault(row, set()).add(code)
    assert all(len(v) == 1 for v in votes.values())  # one value per row over every run: nothing to average
    ds = load_data(RunConfig.from_flower(REGISTRY))
    truth = dict(zip(map(str, np.concatenate([ds.ids_train, ds.ids_test])),
                     SensitiveGroups.of(np.concatenate([ds.s_train, ds.s_test])).codes.tolist()))
    kept = np.mean([seen[0][r] == truth[r] for r in seen[0]])
    assert abs(kept - RandomizedResponse(1.0, 2).keep) < 0.03
    book = json.loads((Path(registry_files["state-dir"]) / ledger.FILE).read_text())
    assert list(book["releases"][group_release.LEDGER_KIND].values()) == [1.0]  # four runs, one release spent


def test_releases_at_other_epsilons_compose_within_the_lifetime_budget(registry_files):
    first = _release(registry_files, **{"groups.epsilon-s": 1.0})
    assert not first.has_error()
    # release-epsilon left at 0: the first release is the registry's only one
    refused = _release(registry_files, **{"groups.epsilon-s": 0.5})
    assert refused.has_error() and "lifetime budget 1: refused" in refused.error.reason, refused.error.reason
    budget = {**registry_files, "release-epsilon": 2.0}
    assert not _release(budget, **{"groups.epsilon-s": 0.5}).has_error()  # 1.5 of 2
    again = _release(budget, **{"groups.epsilon-s": 1.0})  # made before: free
    assert not again.has_error()
    over = _release(budget, **{"groups.epsilon-s": 0.75})
    assert over.has_error() and "2.25 would pass its lifetime budget 2" in over.error.reason
    # another secret file is another draw of every row: it composes like another epsilon_S
    other = Path(registry_files["state-dir"]).parent / "other-secret"
    other.write_bytes(bytes(range(1, 33)))
    swapped = _release({**budget, "release-secret": str(other)}, **{"groups.epsilon-s": 1.0})
    assert swapped.has_error() and "2.5 would pass its lifetime budget 2" in swapped.error.reason


# -- encrypted groups: the sums of every run count -----------------------------------------------
def test_fresh_runs_do_not_reset_the_registrys_decrypted_sums(tmp_path):
    """A lying server isolates rows with packed sums in one run until the round's budget refuses,
    then starts fresh runs (a fresh key, an empty count each) to go on: the ledger stops it at the
    lifetime budget, and a fresh session gets nothing more."""
    pytest.importorskip("tenseal")
    from fairvfl_flwr.tools import registry_attack

    from .test_encrypted_groups import federation

    node = {"sum-noise": 0.0, "sums-per-round": 8, "sums-lifetime": 12, "state-dir": str(tmp_path)}
    _, oracle, _, ds, _ = federation(**node)
    truth = SensitiveGroups.of(ds.s_train).codes
    first = registry_attack.attack(oracle, truth, 17, 16, noise=0.0, server_round=1, per_request=2)
    assert first.sums == 8 and "sums-per-round=8" in first.refused  # the round's budget: a fresh run is the way on
    _, oracle, _, _, _ = federation(**node)  # a fresh run: fresh key, fresh node state
    second = registry_attack.attack(oracle, truth, 17, 16, noise=0.0, server_round=1, first_row=8 * 17,
                                    per_request=2)
    assert second.sums == 4 and "after 12 over its lifetime" in second.refused and "budget is 12" in second.refused
    assert second.correct == second.attempted == 4 * 17  # what the budget let through, it did disclose
    _, oracle, _, _, _ = federation(**node)
    third = registry_attack.attack(oracle, truth, 17, 2, noise=0.0, server_round=1, per_request=1)
    assert third.sums == 0 and "lifetime" in third.refused
    # without the ledger's folder (a simulated registry) each run starts afresh: the case it closes
    loose = {k: v for k, v in node.items() if k != "state-dir"}
    for _ in range(2):
        _, oracle, _, _, _ = federation(**loose)
        assert registry_attack.attack(oracle, truth, 17, 8, noise=0.0, server_round=1, per_request=2).sums == 8
