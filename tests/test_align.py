"""Each party brings its own raw table: private alignment (PSI over the run's messages) and
local preparation, against the joint-table path on the same common rows and split."""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from flwr.app import ConfigRecord
from flwr.common import GRPC_MAX_MESSAGE_LENGTH

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.config.algorithms import resolve
from fairvfl_flwr.data import psi
from fairvfl_flwr.data.psi import TRAIN_CODE, split_common
from fairvfl_flwr.data.partydata import label_table
from fairvfl_flwr.data.own_table import normalise_ids, prepare_block
from fairvfl_flwr.data.tables import DataError, load_csv, packaged_file
from fairvfl_flwr.secure import identity
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.flower import progress
from fairvfl_flwr.jobs import alignment, scoring
from fairvfl_flwr.jobs.alignment import align_tables
from fairvfl_flwr.tools import owntables
from fairvfl_flwr.tools.owntables import ID, LABEL_OWNER, PARTY_COLUMNS, own_node, write_own_tables  # noqa: F401  (the deployment tests import them from here)

pytest.importorskip("private_set_intersection")
pytestmark = pytest.mark.usefixtures("private_party_cache")  # a kept alignment is reused only within a test

ROWS = 3000
MASKED = {"privacy.secure-aggregation": True}  # deployed parties hold keys, and a node with keys refuses unmasked jobs


# unmasked (own tables default to masked): these runs are compared with unmasked joint-table references
BASE = {"num-parties": 4, "num-active": 1, "num-server-rounds": 12, "eval-every": 6, "seed": 3, "dataset": "adult",
        "optimizer": "gd", "privacy.secure-aggregation": False}


def adult_raw(rows: int = ROWS, seed: int = 0) -> pd.DataFrame:
    """``rows`` rows of Adult as raw columns (tools/owntables.py)."""
    return owntables.adult_raw(rows, seed)


@pytest.fixture(scope="module")
def own_tables(tmp_path_factory):
    folder = tmp_path_factory.mktemp("own")
    raw = adult_raw()
    held = write_own_tables(raw, folder)
    return folder, raw, held


@pytest.fixture(scope="module")
def trained_own(own_tables, tmp_path_factory):
    """The run of ``own_config`` on ``own_tables`` (summary, run folder), for the tests that
    only read it: the scoring job's model."""
    folder, _, _ = own_tables
    return run_inprocess(own_config(folder, **{"output-dir": str(tmp_path_factory.mktemp("trained"))}), quiet=True)


def own_config(folder, **extra) -> dict:
    return {**BASE, "tables.own": True, "tables.path": str(folder / "party{partition}.csv"), "tables.id-column": ID,
            "output-dir": str(folder / "runs"), **extra}


def joint_reference(raw: pd.DataFrame, common: list[str], folder, **extra):
    """The joint-table path on the common rows: one table, prepared by data/tables.py, cut
    into party files by raw column (the exported format) and run as a deployment."""
    joint = raw.set_index(ID).loc[common].reset_index()
    joint_path = folder / "joint.csv"
    joint.to_csv(joint_path, index=False)
    ds = load_csv(joint_path, label_column="income", positive_value=">50K", sensitive_column="sex",
                  group_a="Female", group_b="Male", protected_label=1, id_column=ID, train_fraction=0.8,
                  seed=BASE["seed"])
    raw_of = [enc[0] for enc in ds.extra["encoding"]]
    ids = np.concatenate([ds.ids_train, ds.ids_test])
    split = ["train"] * len(ds.ids_train) + ["test"] * len(ds.ids_test)
    nodes = []
    for k, cols in enumerate(PARTY_COLUMNS):
        mine = [j for j, r in enumerate(raw_of) if r in cols]
        frame = pd.DataFrame(np.concatenate([ds.X_train[:, mine], ds.X_test[:, mine]]),
                             columns=[ds.feature_names[j] for j in mine])
        frame.insert(0, "split", split)
        frame.insert(0, "row_id", ids)
        node = {"partition-id": k, "num-partitions": 4, "data-path": str(folder / f"ref{k}.csv"), "allow-unmasked": True,
                "role": "active" if k == 0 else "passive"}
        if k == 0:
            frame["income"] = np.where(np.concatenate([ds.y_train, ds.y_test]) == 1, ">50K", "<=50K")
            frame["sex"] = np.where(np.concatenate([ds.s_train, ds.s_test]), "Female", "Male")
            node.update(LABEL_OWNER)
        frame.to_csv(node["data-path"], index=False, float_format="%.17g")
        nodes.append(node)
    label_table(ds).to_csv(folder / "labels.csv", index=False)
    rc = RunConfig.from_flower({**BASE, "server-labels": str(folder / "labels.csv"),
                                "output-dir": str(folder / "ref-runs"), **extra}).to_flower()
    return ds, run_server(InProcessGrid(client_app, rc, 4, node_configs=nodes), rc)


def test_split_common_is_the_joint_tables_split():
    codes = split_common(1000, 0.8, 7)
    perm = np.random.default_rng(7).permutation(1000)
    assert np.array_equal(np.flatnonzero(codes == TRAIN_CODE), np.sort(perm[:800]))


@pytest.mark.slow  # two runs
def test_own_tables_run_equals_the_joint_table_run_on_the_common_rows(own_tables, tmp_path):
    folder, raw, held = own_tables
    summary, run_folder = run_inprocess(own_config(folder, **{"tables.name": "bank-retail"}), quiet=True)
    # named by the run's table set, not by the dataset key (adult), in the folder, the summary and the card
    assert "-bank-retail-linear" in run_folder.name and summary["dataset"] == "bank-retail"
    card = (run_folder / "model-card.md").read_text()
    assert "`bank-retail`" in card and "adult" not in card and "income = >50K" not in card
    # the label owner's group values reach the card and the summary; its column's name does not
    assert "- groups: a = group = Female, b = group = Male" in card and "group a" not in card
    assert list(summary["groups"]) == ["Female", "Male"]
    common = sorted(set.intersection(*held))
    ds, (ref, ref_folder) = joint_reference(raw, common, tmp_path)
    for key in ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn"):
        assert summary[key] == pytest.approx(ref[key], abs=1e-9, rel=0), key
    hist = json.loads((run_folder / "history.json").read_text())
    ref_hist = json.loads((ref_folder / "history.json").read_text())
    assert len(hist) == len(ref_hist) == BASE["num-server-rounds"] + 1
    for row, ref_row in zip(hist, ref_hist):
        assert row["loss"] == pytest.approx(ref_row["loss"], abs=1e-9, rel=0)


def test_the_default_optimizer_meets_the_constraint_on_a_small_own_table(own_tables, tmp_path):
    """A few hundred rows per group, where a group's loss grows fast once its rows weigh little:
    block Newton's multipliers must hold the gap within ε and not swing past it."""
    folder, _, _ = own_tables
    config = own_config(folder, optimizer="auto", **{"num-server-rounds": 40, "eval-every": 40,
                                                   "output-dir": str(tmp_path)})
    assert resolve(RunConfig.from_flower(config)).name == "newton"
    summary, _ = run_inprocess(config, quiet=True)
    assert summary["train_deo"] <= 0.01 + 0.002
    assert summary["rounds"] < 40


def _aligned_messages(folder, **extra):
    seen = []
    rc = RunConfig.from_flower(own_config(folder, **extra)).to_flower()
    grid = InProcessGrid(client_app, rc, 4, tap=seen.append)
    return grid, rc, seen


def test_the_servers_alignment_messages_hold_no_id_in_the_clear(own_tables):
    folder, raw, held = own_tables
    grid, rc, sent = _aligned_messages(folder, **{"num-server-rounds": 1})
    replies, pull = [], grid.pull_messages
    grid.pull_messages = lambda ids: replies.extend(got := pull(ids)) or got  # what reaches the server
    run_server(grid, rc)
    align_msgs = [m for m in sent if m.metadata.message_type in alignment.ALIGN_STEPS]
    align_replies = [r for r in replies if r.metadata.message_type in alignment.ALIGN_STEPS]
    # 4 parties: size and blind to all, raise to the 3 others, the leader intersects with all three
    # and finds the common rows in one message (their lists fit the budget), the 3 others finish
    per_step = [alignment.ALIGN_SIZE] * 4 + [alignment.ALIGN_BLIND] * 4 + [alignment.ALIGN_RAISE] * 3 + [alignment.ALIGN_INTERSECT] \
        + [alignment.ALIGN_FINISH] * 3
    assert [m.metadata.message_type for m in align_msgs] == per_step
    assert Counter(r.metadata.message_type for r in align_replies) == Counter(per_step)
    blob = b"".join(_bytes_of(m) for m in align_msgs + align_replies)
    ids = sorted(set.union(*held))
    assert len(blob) > 10_000
    for i in ids[::37]:
        assert i.encode() not in blob and i.encode("utf-32-le") not in blob


def _bytes_of(message) -> bytes:
    out = []
    for record in message.content.config_records.values():
        for v in record.values():
            out.append(v if isinstance(v, bytes) else str(v).encode())
    for record in message.content.array_records.values():
        for v in record.values():
            out.append(v.numpy().tobytes())
    return b"".join(out)


# -- refusals: a clear error naming the party, nothing written ----------------------------------
def _refused(folder, tmp_path, match, **extra):
    out = tmp_path / "runs"
    with pytest.raises(FederationError, match=match) as refused:
        run_inprocess({**own_config(folder, **extra), "output-dir": str(out)}, quiet=True)
    assert not out.exists() or not any(out.iterdir())
    return str(refused.value)


def _refused_before_alignment(folder, tmp_path, caplog, party: int, problems: int, secrets: list[str]) -> str:
    """The run is refused after the size step: the server's error counts the party's problems and
    holds none of ``secrets``; the party's own log holds the details, which are returned."""
    caplog.set_level("INFO", logger="flwr")
    grid, rc, sent = _aligned_messages(folder)
    replies, pull = [], grid.pull_messages
    grid.pull_messages = lambda ids: replies.extend(got := pull(ids)) or got
    out = folder / "runs"
    with pytest.raises(FederationError, match=rf"party {party}: {problems} problems?\b") as refused:
        run_server(grid, {**rc, "output-dir": str(tmp_path / "refused")})
    assert not (tmp_path / "refused").exists() and not out.exists()
    steps = {m.metadata.message_type for m in sent if m.metadata.message_type in alignment.ALIGN_STEPS}
    assert steps == {alignment.ALIGN_SIZE}  # refused before any id was blinded
    server_side = str(refused.value).encode() + b"".join(_bytes_of(r) for r in replies)
    party_log = "\n".join(r.getMessage() for r in caplog.records if "checked before alignment" in r.getMessage())
    for secret in secrets:
        assert secret.encode() not in server_side
        assert secret in party_log
    return party_log


def test_duplicate_ids_are_refused_before_alignment_naming_the_party_not_the_id(own_tables, tmp_path, caplog):
    folder, raw, _ = own_tables
    for k in range(4):
        pd.read_csv(folder / f"party{k}.csv").to_csv(tmp_path / f"party{k}.csv", index=False)
    df = pd.read_csv(tmp_path / "party2.csv")
    df.loc[5, ID] = " " + df.loc[4, ID]  # the same id once spaces are stripped
    df.to_csv(tmp_path / "party2.csv", index=False)
    details = _refused_before_alignment(tmp_path, tmp_path, caplog, 2, 1, [df.loc[4, ID]])
    assert "duplicate ids" in details


def test_a_missing_id_column_is_refused_naming_the_party(own_tables, tmp_path, caplog):
    folder, _, _ = own_tables
    for k in range(4):
        df = pd.read_csv(folder / f"party{k}.csv")
        (df.rename(columns={ID: "client"}) if k == 3 else df).to_csv(tmp_path / f"party{k}.csv", index=False)
    details = _refused_before_alignment(tmp_path, tmp_path, caplog, 3, 1, ["'customer'"])
    assert "id column 'customer' not found" in details


def test_a_third_label_value_is_refused_before_alignment_and_the_server_sees_no_id_or_value(own_tables, tmp_path,
                                                                                          caplog):
    folder, _, _ = own_tables
    for k in range(4):
        pd.read_csv(folder / f"party{k}.csv").to_csv(tmp_path / f"party{k}.csv", index=False)
    df = pd.read_csv(tmp_path / "party0.csv")
    odd = df.index[df["income"] == ">50K"][:37]
    df.loc[odd, "income"] = ">50K."  # the test file's spelling of a positive label
    df.loc[df.index[:3], "workclass"] = None  # and a second problem: missing values without a rule
    df.to_csv(tmp_path / "party0.csv", index=False)
    details = _refused_before_alignment(tmp_path, tmp_path, caplog, 0, 2, [">50K.", "workclass"])
    assert "'>50K.' in 37 rows" in details and "'workclass=mode'" in details


def test_an_empty_intersection_is_refused_naming_the_party(own_tables, tmp_path):
    folder, _, _ = own_tables
    for k in range(4):
        df = pd.read_csv(folder / f"party{k}.csv")
        if k == 1:
            df[ID] = df[ID].str[1:]  # its own id scheme: no C prefix
        df.to_csv(tmp_path / f"party{k}.csv", index=False)
    _refused(tmp_path, tmp_path, r"party 1 and the label owner .*no id in common.*'a999999'.*'999999'")


def test_an_intersection_below_the_minimum_is_refused(own_tables, tmp_path):
    folder, _, _ = own_tables
    _refused(folder, tmp_path, r"common to all parties, fewer than tables.min-common=100000",
             **{"tables.min-common": 100_000})


# -- local preparation ------------------------------------------------------------------------
def test_missing_values_are_refused_by_default_and_imputed_by_a_named_rule():
    df = pd.DataFrame({"id": list("abcdef"), "age": [1.0, np.nan, 3.0, 5.0, np.nan, 7.0],
                       "job": ["x", "y", None, "x", "x", "y"]})
    train, test = np.arange(4), np.arange(4, 6)
    with pytest.raises(DataError, match=r"party 9: t.csv: column 'age' has 2 missing values"):
        prepare_block(df, ["age", "job"], train, test, where="party 9: t.csv")
    out = prepare_block(df, ["age", "job"], train, test, missing="age=median,job=value:none", where="p")
    assert out.pre.fill == {"age": 3.0, "job": "none"}  # median of the training rows 1, 3, 5
    assert [r.get("rule") for r in out.record] == ["median", "value:none"]
    assert [r["missing"] for r in out.record] == [2, 1]
    assert out.pre.features == ("age", "job_none", "job_x", "job_y")
    X = np.vstack([out.X_train, out.X_test])
    assert np.allclose(X[:4].mean(axis=0), 0) and np.allclose(out.pre.apply(df, "p"), X)


def test_type_overrides_make_a_number_a_category():
    df = pd.DataFrame({"zip": [10, 20, 10, 30], "v": ["1", "2", "3", "4"]})
    out = prepare_block(df, ["zip", "v"], np.arange(3), np.arange(3, 4), types="zip=category,v=number")
    assert out.pre.features == ("v", "zip_10", "zip_20", "zip_30")


def test_ids_are_text_with_surrounding_spaces_stripped():
    assert normalise_ids([" 007", "7 ", 7]).tolist() == ["007", "7", "7"]


@pytest.mark.slow  # a node-config run on 3,000 Adult rows (its reference is the fast loop's); alignment runs there too
def test_deployed_parties_name_their_own_files_and_id_columns(own_tables, tmp_path):
    """Deployment: each node config names its table, its id column (any name) and, for the
    label owner, the label and groups; the run config only says tables.own."""
    folder, _, _ = own_tables
    nodes = []
    identities = identity.generate_identities(tmp_path / "identities", 4)  # deployed: signed, so masked
    for k in range(4):
        df = pd.read_csv(folder / f"party{k}.csv")
        id_name = ["customer", "client_no", "kundennummer", "policy holder"][k]
        df.rename(columns={ID: id_name}).to_csv(tmp_path / f"own{k}.csv", index=False)
        node = {"partition-id": k, "num-partitions": 4, "table-path": str(tmp_path / f"own{k}.csv"),
                "id-column": id_name, "role": "active" if k == 0 else "passive", **identities[k]}
        if k == 0:
            node.update(LABEL_OWNER)
        nodes.append(node)
    rc = RunConfig.from_flower({**BASE, **MASKED, "tables.own": True, "output-dir": str(tmp_path / "dep")}).to_flower()
    deployed, _ = run_server(InProcessGrid(client_app, rc, 4, node_configs=nodes), rc)
    simulated, _ = run_inprocess(own_config(folder, **MASKED, **{"output-dir": str(tmp_path / "sim")}), quiet=True)
    for key in ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn"):
        assert deployed[key] == simulated[key], key


def test_psi_spread_over_processes_finds_the_same_rows(monkeypatch):
    from fairvfl_flwr.data import psi

    a = np.array([f"id{i}" for i in range(0, 700)])
    b = np.array([f"id{i}" for i in range(350, 1200)])[::-1]
    for workers in ("1", "3"):
        monkeypatch.setenv(psi.WORKERS_ENV, workers)
        monkeypatch.setattr(psi, "CHUNK", 100)
        ka, kb = psi.psi_key(), psi.psi_key()
        mine, theirs = psi.psi_blind(a, ka), psi.psi_blind(b, kb)
        found = psi.positions_in(psi.psi_raise(mine, kb), psi.psi_raise(theirs, ka))
        assert np.array_equal(np.flatnonzero(found >= 0), np.arange(350, 700)), workers
        assert np.array_equal(b[found[350:700]], a[350:700]), workers  # where in the other's list


def test_a_party_learns_its_common_rows_in_the_agreed_order_from_positions_in_its_shuffled_list():
    from fairvfl_flwr.data import psi
    from fairvfl_flwr.data.partydata import PartySpec

    leader = np.array([f"c{i}" for i in range(40)] + [f"l{i}" for i in range(30)])
    mine = np.random.default_rng(0).permutation(np.array([f"c{i}" for i in range(40)] + [f"m{i}" for i in range(25)]))
    ka = psi.psi_key()
    theirs, kb, order = psi.blind_step(mine, shuffle=True)
    assert not np.array_equal(order, np.arange(len(mine)))
    found = psi.positions_in(psi.psi_raise(psi.psi_blind(leader, ka), kb), psi.psi_raise(theirs, ka))
    rows = psi.agreed_rows(leader, found >= 0, {1: 40}, 1)
    spec = PartySpec(partition_id=1, role="passive")
    got = psi.my_common_rows(spec, mine, np.sort(found[rows]), order, len(rows))
    assert list(mine[got]) == list(leader[rows]) == sorted(f"c{i}" for i in range(40))
    with pytest.raises(DataError, match="party 1"):
        psi.my_common_rows(spec, mine, np.sort(found[rows])[:-1], order, len(rows))


def test_a_model_trained_on_own_tables_scores_each_partys_raw_rows(own_tables, trained_own, tmp_path, caplog):
    """Scoring aligns the parties' raw score files (each its own ids, shuffled) by PSI, scores the
    rows all hold, reading each file with its own id column and applying the
    preparation the party fitted at alignment (its categories, means, deviations)."""
    folder, raw, held = own_tables
    _, trained = trained_own
    # rows of the common ids (a category seen only outside them would be refused, naming it);
    # each party's score file holds 400 of 480 of them, shuffled: 4 x 80 dropped at random
    fresh = raw[raw[ID].isin(set.intersection(*held))].sample(480, random_state=5)
    rng = np.random.default_rng(7)
    scored = set(fresh[ID])
    held_by = []
    for k, cols in enumerate(PARTY_COLUMNS):
        keep = [c for c in cols if c not in ("income", "sex")]
        mine = fresh.iloc[np.sort(rng.permutation(480)[:400])].sample(frac=1, random_state=k)
        mine[[ID, *keep]].to_csv(tmp_path / f"score{k}.csv", index=False)
        scored &= set(mine[ID])
        held_by.append(set(mine[ID]))
    # the job names the mode, the model and the files; tables.*, the dataset, the parties come from the model
    rc = {"mode": "score", "score.model-from": str(trained), "score.path": str(tmp_path / "score{partition}.csv"),
          "output-dir": str(tmp_path / "scored")}
    sent = []
    nodes = [{"partition-id": k, "num-partitions": 4, "unscored-path": str(tmp_path / f"unscored{k}.csv")}
             for k in range(4)]
    caplog.set_level("INFO", logger="flwr")
    summary, out = run_inprocess(rc, grid=InProcessGrid(client_app, rc, 4, tap=sent.append, node_configs=nodes))
    for k in range(4):  # each party's ids that were not scored, on its own side; the log counts them by party
        unscored = set(pd.read_csv(tmp_path / f"unscored{k}.csv", dtype=str)["id"])
        assert unscored == held_by[k] - scored
        assert f"party {k}: {len(unscored)}" in caplog.text
    _, full = run_inprocess(own_config(folder, **{**rc, "output-dir": str(tmp_path / "full")}), quiet=True)
    assert (full / "predictions.csv").read_text() == (out / "predictions.csv").read_text()
    blob = b"".join(_bytes_of(m) for m in sent if m.metadata.message_type in alignment.ALIGN_STEPS)
    assert len(blob) > 10_000 and not any(i.encode() in blob for i in fresh[ID])  # alignment: blinded ids only
    predictions = pd.read_csv(out / "predictions.csv")
    assert sorted(predictions.iloc[:, 0].astype(str)) == sorted(scored)  # the rows every party holds
    truth = fresh.set_index(ID).loc[predictions.iloc[:, 0].astype(str), "income"].to_numpy() == ">50K"
    assert (predictions["decision"].to_numpy() == truth).mean() > 0.75


def test_each_partys_own_log_says_its_alignment_and_scoring_steps_with_counts_and_time_left(
        own_tables, trained_own, tmp_path, caplog, monkeypatch):
    """A party's log (its SuperNode's output) shows each of its alignment steps with its counts (its
    ids blinded, the label owner's raised, the label owner's matches, the common rows) and, while a
    step runs, the time left; in a scoring job, the rows it read and the chunks it scored. The
    server says each step with its counts, then the time left."""
    folder, raw, held = own_tables
    monkeypatch.setattr(progress, "EVERY", 0.002)  # every running step says how far it is
    monkeypatch.setattr(scoring, "CHUNK_LINES_GAP", 0.0)  # and every chunk
    caplog.set_level("INFO", logger="flwr")
    _align(folder)
    said = caplog.text
    n, common = [len(h) for h in held], len(set.intersection(*held))
    for k in range(4):
        party = f"FairVFL: alignment, party {k} ({'passive' if k else 'active'}), step"
        assert f"{party} 'size': checked its table ({n[k]:,} ids)" in said
        assert (f"{party} 'blind': blinded its ids with a fresh key{', in a secret order' if k else ''} ({n[k]:,} ids)"
                in said)
        if k:
            assert f"{party} 'raise': raised the label owner's blinded ids to its key ({n[0]:,} ids)" in said
            assert re.search(rf"{re.escape(party)} 'raise': raising the label owner's blinded ids \({n[0]:,} ids\).* so far; "
                             r"about \d+ s left", said)  # at its pace of blinding
            assert (f"{party} 'finish': prepared its block on the common rows ({common:,} of its {n[k]:,} ids are "
                    "common to every party)") in said
            assert re.search(rf"party 0 \(active\), step 'intersect', step {k}/4: matched party {k} \({n[k]:,} ids\); "
                             rf"{len(held[0] & held[k]):,} of its {n[0]:,} ids also party {k}'s \(\d+\.\d s\); "
                             r"about \d+ s left", said)
    assert f"found the rows every party holds and prepared its block on them; {common:,} rows common to every party" in said
    assert re.search(r"private alignment, step 2/5: every party blinded its ids \(4 parties, .*\); about \d+ s left",
                     said)
    assert re.search(r"private alignment, step 3/5: waiting for the other parties to raise the label owner's ids "
                     r"\(3 × [\d,]+ ids\), \d of 3 replied: \d+ s so far; about \d+ s left", said)

    caplog.clear()  # scoring 300 of the common rows, in chunks of 100
    fresh = raw[raw[ID].isin(sorted(set.intersection(*held))[:300])]
    for k, cols in enumerate(PARTY_COLUMNS):
        fresh[[ID, *[c for c in cols if c not in ("income", "sex")]]].to_csv(tmp_path / f"score{k}.csv", index=False)
    rc = {"mode": "score", "score.model-from": str(trained_own[1]), "score.path": str(tmp_path / "score{partition}.csv"),
          "score.chunk-rows": 100, "output-dir": str(tmp_path / "scored")}
    run_inprocess(rc)
    said = caplog.text
    for k in range(4):
        party = rf"FairVFL: scoring, party {k} \({'passive' if k else 'active'}, node \d+\)"
        assert re.search(rf"{party}: loaded its block and read its rows to score; 300 rows, with its block of run", said)
        assert re.search(rf"{party}: scored rows 100..199 of its 300; about \d+ s left", said)
        assert re.search(rf"{party}: scored rows 200..299 of its 300; done", said)
    assert "scoring, step 1/4: every party loaded its block and read its rows to score (4 parties); 300 rows each" in said
    assert re.search(r"scoring, step 2/4: chunk 1 of 3: every party's partial logits of rows 0..99 \(\d+\.\d s\); "
                     r"about \d+ s left", said)


def test_ids_with_leading_zeros_match_between_the_training_tables_and_the_score_files(own_tables, tmp_path):
    """Ids that look like numbers ("0001234") are text in every reader: the tables a party
    trains on and the files it scores align on them, and the predictions keep the zeros."""
    folder, raw, held = own_tables
    ids = {c: f"{int(c[1:]):07d}" for c in raw[ID]}  # C000123 -> 0000123
    for k in range(4):
        df = pd.read_csv(folder / f"party{k}.csv")
        df[ID] = df[ID].map(ids)
        df.to_csv(tmp_path / f"party{k}.csv", index=False)
        df.sample(200, random_state=k).drop(columns=["income", "sex"], errors="ignore").to_csv(
            tmp_path / f"score{k}.csv", index=False)
    _, trained = run_inprocess(own_config(tmp_path, **{"num-server-rounds": 2, "eval-every": 1,
                                                       "output-dir": str(tmp_path / "train")}), quiet=True)
    common = set.intersection(*(set(pd.read_csv(tmp_path / f"score{k}.csv", dtype=str)[ID]) for k in range(4)))
    assert common and all(c.startswith("0") for c in common)
    _, out = run_inprocess({"mode": "score", "score.model-from": str(trained), "output-dir": str(tmp_path / "scored"),
                            "score.path": str(tmp_path / "score{partition}.csv")}, quiet=True)
    assert set(pd.read_csv(out / "predictions.csv", dtype={"id": str})["id"]) == common


@pytest.mark.slow  # a second own-tables run and scoring
def test_a_parquet_table_and_score_file_give_the_csv_ones_results(own_tables, tmp_path):
    """Party 2 brings Parquet (its table and its score file, by suffix), the others CSV."""
    pytest.importorskip("pyarrow")
    folder, raw, held = own_tables
    fresh = sorted(set.intersection(*held))[:200]
    for fmt in ("csv", "parquet"):
        d = tmp_path / fmt
        d.mkdir()
        for k in range(4):
            df = pd.read_csv(folder / f"party{k}.csv", dtype={ID: str})
            score = df.set_index(ID).loc[fresh].drop(columns=["income", "sex"], errors="ignore").reset_index()
            if k == 2 and fmt == "parquet":
                df.to_parquet(d / "party2.parquet", index=False)
                score.to_parquet(d / "score2.parquet", index=False)
            else:
                df.to_csv(d / f"party{k}.csv", index=False)
                score.to_csv(d / f"score{k}.csv", index=False)
    rc = {"num-server-rounds": 3, "eval-every": 3}
    identities = identity.generate_identities(tmp_path / "identities", 4)  # deployed: signed, so masked
    nodes = [[{"partition-id": k, "num-partitions": 4, **identities[k], "table-path": str(tmp_path / fmt / (
        f"party{k}.parquet" if k == 2 and fmt == "parquet" else f"party{k}.csv")), "id-column": ID,
        "score-path": str(tmp_path / fmt / (f"score{k}.parquet" if k == 2 and fmt == "parquet" else f"score{k}.csv")),
        "role": "active" if k == 0 else "passive", **({"label-column": "income", "label-positive": ">50K",
                                                      "sensitive-column": "sex", "group-a": "Female", "group-b": "Male",
                                                      "protected-label": 1} if k == 0 else {})}
        for k in range(4)] for fmt in ("csv", "parquet")]
    out = {}
    for fmt, node_configs in zip(("csv", "parquet"), nodes):
        train = RunConfig.from_flower({**BASE, **rc, **MASKED, "tables.own": True,
                                       "output-dir": str(tmp_path / f"run-{fmt}")})
        summary, trained = run_server(InProcessGrid(client_app, train.to_flower(), 4, node_configs=node_configs),
                                      train.to_flower())
        job = {"mode": "score", "score.model-from": str(trained), "output-dir": str(tmp_path / f"score-{fmt}")}
        _, scored = run_server(InProcessGrid(client_app, job, 4, node_configs=node_configs), job)
        out[fmt] = summary, (scored / "predictions.csv").read_text()
    for key in ("train_loss", "test_acc", "test_dfp", "test_dfn"):
        assert out["parquet"][0][key] == out["csv"][0][key], key
    assert out["parquet"][1] == out["csv"][1] and out["csv"][1].count("\n") == 201


def test_parquet_ids_stored_as_numbers_read_as_the_csv_reads_them(tmp_path):
    pytest.importorskip("pyarrow")
    from fairvfl_flwr.data.tables import read_party_file

    pd.DataFrame({"id": [7.0, 12.0], "x": [1, 2]}).to_parquet(tmp_path / "f.parquet")
    pd.DataFrame({"id": [7, 12], "x": [1, 2]}).to_parquet(tmp_path / "i.parquet")
    pd.DataFrame({"id": ["007", "12"], "x": [1, 2]}).to_parquet(tmp_path / "t.parquet")
    assert read_party_file(tmp_path / "f.parquet", "p", "id")["id"].tolist() == ["7", "12"]
    assert read_party_file(tmp_path / "i.parquet", "p", "id")["id"].tolist() == ["7", "12"]
    assert read_party_file(tmp_path / "t.parquet", "p", "id")["id"].tolist() == ["007", "12"]


def test_a_parquet_table_without_an_engine_is_refused_naming_the_file_and_the_package(tmp_path, monkeypatch):
    from fairvfl_flwr.data.own_table import read_table

    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)
    with pytest.raises(DataError, match=r"party 1: .*t.parquet: a Parquet file needs the pyarrow package.*pip install "
                                         r"pyarrow"):
        read_table(tmp_path / "t.parquet", ID, "party 1")


def test_own_tables_with_several_sensitive_columns_give_the_server_every_combination_as_a_group(own_tables, tmp_path):
    """adult-sex-race: the label owner's table holds sex and race; each combination over the
    common rows is a group (sorted names, as data/tables.py names them), coded the same for
    the server and the label owner; under the defaults the run pools the small ones and
    trains under the G-group constraint."""
    from fairvfl_flwr.jobs.alignment import align_tables
    from fairvfl_flwr.data.psi import TEST_CODE

    folder, raw, held = own_tables
    columns = [["age", "workclass", "education", "sex", "race", "income"], PARTY_COLUMNS[1],
               ["capital-gain", "capital-loss", "relationship"], PARTY_COLUMNS[3]]
    for k, cols in enumerate(columns):
        mine = raw[raw[ID].isin(held[k])].sample(frac=1, random_state=k)
        mine[[ID, *cols]].to_csv(tmp_path / f"party{k}.csv", index=False)
    rc = RunConfig.from_flower(own_config(tmp_path, dataset="adult-sex-race", **{
        "output-dir": str(tmp_path / "runs")})).to_flower()
    grid = InProcessGrid(client_app, rc, 4)
    labels = align_tables(grid, RunConfig.from_flower(rc))
    common = raw.set_index(ID).loc[sorted(set.intersection(*held))]
    codes = split_common(len(common), 0.8, BASE["seed"])
    key = (common["sex"] + " & " + common["race"]).to_numpy()
    names = tuple(sorted(set(key)))
    assert len(names) == 10 and labels.group_names == names
    assert labels.s_train.tolist() == np.searchsorted(names, key[codes == TRAIN_CODE]).tolist()
    assert labels.s_test.tolist() == np.searchsorted(names, key[codes == TEST_CODE]).tolist()
    assert labels.y_train.tolist() == np.where(common["income"].to_numpy()[codes == TRAIN_CODE] == ">50K", 1, -1).tolist()
    summary, run_folder = run_server(grid, rc)
    assert summary["test_acc"] > 0.75 and len(summary["train_gaps"]) > 2  # pooled groups, pairwise gaps
    pooled = {gap.split(" vs ")[1] for gap in summary["train_gaps"] if " + " in gap}
    assert len(pooled) == 1 and {"Female & Amer-Indian-Eskimo", "Female & Other"} <= set(pooled.pop().split(" + "))
    said = next(line for line in (run_folder / "model-card.md").read_text().splitlines() if line.startswith("- pooled"))
    assert "'Female & Other' has " in said, said  # by name, as the table writes it


def test_common_score_rows_come_in_one_order_whatever_other_ids_a_party_holds():
    from fairvfl_flwr.data.encoding import ScoreRows, common_score_rows, ids_digest

    def rows(ids):
        ids = np.asarray(ids)
        return ScoreRows(ids=ids, X=np.arange(len(ids), dtype=float)[:, None], ids_digest=ids_digest(ids), source="f")

    common = np.asarray(["9", "10", "11"])
    digits_only = common_score_rows(rows(["9", "10", "11", "12"]), common)
    with_text_id = common_score_rows(rows(["10", "11", "9", "A1"]), common)  # sorted as text: 'A1' is not digits
    assert digits_only.ids.tolist() == with_text_id.ids.tolist() == ["9", "10", "11"]
    assert digits_only.ids_digest == with_text_id.ids_digest
    assert with_text_id.X[:, 0].tolist() == [2.0, 0.0, 1.0]


def test_a_label_owners_sensitive_columns_never_become_features():
    from fairvfl_flwr.data.psi import feature_columns
    from fairvfl_flwr.data.partydata import party_spec

    node = {"partition-id": 0, "role": "active", "table-path": "t.csv", "id-column": "id", "label-column": "y",
            "label-positive": "1", "sensitive-column": "sex,race", "protected-label": 1}
    frame = pd.DataFrame({"id": ["a"], "y": [1], "sex": ["F"], "race": ["W"], "age": [30]})
    assert feature_columns(party_spec(node, 4, 1), frame) == ["age"]
    # a table written from a joint dataset holds the combination in one column of that name
    frame = pd.DataFrame({"id": ["a"], "y": [1], "sex,race": ["F & W"], "age": [30]})
    assert feature_columns(party_spec(node, 4, 1), frame) == ["age"]


def test_a_deployed_label_owner_with_its_own_table_may_name_no_groups_or_both():
    from fairvfl_flwr.data.partydata import NodeConfigError, party_spec

    node = {"partition-id": 0, "role": "active", "table-path": "t.csv", "label-column": "income",
            "label-positive": ">50K", "sensitive-column": "sex,race", "protected-label": 1}
    spec = party_spec(node, 4, 1)
    assert (spec.sensitive_column, spec.group_a, spec.group_b) == ("sex,race", "", "")
    with pytest.raises(NodeConfigError, match=r"party 0 \(t.csv\): give both group-a and group-b"):
        party_spec({**node, "group-a": "Female"}, 4, 1)
    with pytest.raises(NodeConfigError, match=r"needs group-a, group-b"):  # an exported file names its two groups
        party_spec({**{k: v for k, v in node.items() if k != "table-path"}, "data-path": "p.csv"}, 4, 1)


def test_missing_values_in_a_partys_table_are_refused_or_filled_by_the_named_rule(own_tables, tmp_path):
    folder, _, _ = own_tables
    for k in range(4):
        df = pd.read_csv(folder / f"party{k}.csv")
        if k == 1:
            df.loc[df.index[::50], "occupation"] = None
        df.to_csv(tmp_path / f"party{k}.csv", index=False)
    message = _refused(tmp_path, tmp_path, r"party 1: 1 problem\b")
    assert "occupation" not in message
    summary, _ = run_inprocess(own_config(tmp_path, **{"tables.missing": "occupation=value:unknown",
                                                       "output-dir": str(tmp_path / "filled")}), quiet=True)
    assert summary["test_acc"] > 0.75


def test_a_label_owner_cannot_contribute_its_label_as_a_feature():
    from fairvfl_flwr.data.psi import feature_columns
    from fairvfl_flwr.data.partydata import PartySpec

    spec = PartySpec(partition_id=0, role="active", table_path="t.csv", label_column="income",
                     sensitive_column="sex", columns=("age", "income"))
    with pytest.raises(DataError, match=r"party 0 .*columns names \['income'\]"):
        feature_columns(spec, pd.DataFrame(columns=["row_id", "age", "income", "sex"]))


#: What is kept is the alignment: two rounds show that the reused one trains as the first did, on a
#: third of the ids (each full alignment blinds all of them), whose groups are smaller.
SHORT = {"num-server-rounds": 2, "eval-every": 1, "min-group-size": 5}


def test_a_second_run_on_the_same_tables_reuses_the_kept_alignment_and_a_changed_table_aligns_again(
        own_tables, tmp_path, caplog):
    folder, raw, _ = own_tables
    kept = set(raw[ID].iloc[:1000])
    for k in range(4):
        df = pd.read_csv(folder / f"party{k}.csv")
        df[df[ID].isin(kept)].to_csv(tmp_path / f"party{k}.csv", index=False)

    def run(**extra):
        nonlocal sent_by_last_run
        grid, rc, sent = _aligned_messages(tmp_path, **{"output-dir": str(tmp_path / "runs"), **SHORT, **extra})
        sent_by_last_run = sent
        summary, run_folder = run_server(grid, rc)
        steps = [m.metadata.message_type.removeprefix("query.align_") for m in sent
                 if m.metadata.message_type in alignment.ALIGN_STEPS]
        return summary, json.loads((run_folder / "history.json").read_text()), steps

    sent_by_last_run: list = []
    caplog.set_level("INFO", logger="flwr")
    first, history, steps = run()
    assert "blind" in steps and "party 0: no alignment kept on its side" in caplog.text
    again, history_again, steps = run()
    assert steps == ["size"] * 4 + ["reuse"] * 4  # no id blinded: every party took up its kept alignment
    assert history_again == [{**row, "seconds": r["seconds"]} for row, r in zip(history, history_again)]
    assert again["test_acc"] == first["test_acc"]
    replayed = _reuse_fields(sent_by_last_run)["size-signature-2"]  # party 2's signature of the last session
    rc = RunConfig.from_flower(own_config(tmp_path, **{"output-dir": str(tmp_path / "runs"), **SHORT})).to_flower()
    with pytest.raises(FederationError, match=r"alignment step 'reuse': party 2's size answer and kept-alignment "
                                              r"digest are not signed by party 2's pinned identity key for this "
                                              r"alignment; refused"):
        run_server(Replaying(client_app, rc, 4, signature=replayed), rc)
    caplog.clear()
    df = pd.read_csv(tmp_path / "party2.csv")
    df.drop(index=df.index[:5]).to_csv(tmp_path / "party2.csv", index=False)  # party 2's table changed
    _, _, steps = run()
    assert "blind" in steps
    assert "party 2: its table changed since its last alignment" in caplog.text
    assert "party 0:" not in caplog.text.split("FairVFL: aligning:")[1].splitlines()[0]
    _, _, steps = run(**{"tables.reuse-alignment": False})
    assert "blind" in steps


def _reuse_fields(sent) -> dict:
    return dict(next(m for m in sent if m.metadata.message_type == alignment.ALIGN_REUSE).content.config_records["align"])


class Replaying(InProcessGrid):
    """A server that says every party kept the same alignment, relaying party 2's signature of
    its digest from an earlier session instead of this one's."""

    def __init__(self, *a, signature, **kw):
        super().__init__(*a, **kw)
        self.signature = signature

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            if m.metadata.message_type == alignment.ALIGN_REUSE:
                m.content.config_records["align"] = ConfigRecord({**_reuse_fields([m]),
                                                                  "size-signature-2": self.signature})
        return super().push_messages(messages)


class Dictionary(InProcessGrid):
    """The server stands in for the label owner: it has every other party raise ids of its own
    choosing, blinded under its own key (keeping or dropping the label owner's signature)."""

    def __init__(self, *a, chosen, keep_signature, **kw):
        super().__init__(*a, **kw)
        self.blinded, _, _ = psi.blind_step(normalise_ids(np.asarray(chosen)), shuffle=False)
        self.keep = keep_signature

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            rc = m.content.config_records.get("align")
            if m.metadata.message_type == alignment.ALIGN_RAISE:
                fields = {**rc, "blinded": self.blinded}
                if not self.keep:
                    fields.pop("signature")
                m.content.config_records["align"] = ConfigRecord(fields)
        return super().push_messages(messages)


@pytest.mark.parametrize("keep_signature", [True, False])
def test_the_servers_dictionary_test_of_a_partys_ids_is_refused(own_tables, tmp_path, keep_signature):
    folder, raw, _ = own_tables
    rc = RunConfig.from_flower(own_config(folder, **{"output-dir": str(tmp_path / "runs")})).to_flower()
    grid = Dictionary(client_app, rc, 4, chosen=raw[ID].astype(str).iloc[:1000].to_numpy(),
                      keep_signature=keep_signature)
    with pytest.raises(FederationError, match=r"alignment step 'raise': the label owner's blinded ids are not signed "
                                              r"by party 0's pinned identity key for this alignment; refused"):
        run_server(grid, rc)
    assert not (tmp_path / "runs").exists()


# -- folded intersect messages: fewer message rounds, every list still checked ----------------------
def _align(folder, grid_class=InProcessGrid, **grid_kw):
    """Align ``folder``'s tables over a grid of ``grid_class`` (no kept alignment); the labels and
    the message types of every message round (one push of messages)."""
    rc = RunConfig.from_flower(own_config(folder, **{"tables.reuse-alignment": False})).to_flower()
    rounds = []

    class Counting(grid_class):
        def push_messages(self, messages):
            messages = list(messages)
            rounds.append([m.metadata.message_type for m in messages])
            return super().push_messages(messages)

    grid = Counting(client_app, rc, 4, **grid_kw)
    return align_tables(grid, RunConfig.from_flower(rc)), rounds


@pytest.fixture(scope="module")
def aligned_once(own_tables):
    """The labels of ``own_tables``' alignment under the default budget."""
    return _align(own_tables[0])[0]


def _list_bytes(held: list[set]) -> list[int]:
    """Each other party's lists in an intersect message: its blinded ids and its raising of the leader's."""
    return [psi.POINT * (len(held[k]) + len(held[0])) for k in range(1, len(held))]


@pytest.mark.parametrize("budget, intersects", [
    (lambda sizes: alignment.INTERSECT_BUDGET, 1),  # Adult's lists fit: one message, which finds the common rows
    (lambda sizes: 2 * max(sizes), 2),  # two parties' lists fit, not three
    (lambda sizes: min(sizes) - 1, 3),  # less than one party's lists: each party alone, as before folding
], ids=["all-fit", "two-fit", "none-fit"])
def test_the_leader_gets_as_few_intersect_messages_as_the_budget_allows_and_the_rows_stay_the_same(
        own_tables, aligned_once, monkeypatch, budget, intersects):
    folder, _, held = own_tables
    sizes = _list_bytes(held)
    assert sum(sizes) > 2 * max(sizes)  # so that two-fit splits three parties' lists in two
    monkeypatch.setattr(alignment, "INTERSECT_BUDGET", budget(sizes))
    labels, rounds = _align(folder)
    # before folding: size, blind, raise, one intersect per other party, common, finish = 8 rounds
    assert [r[0] for r in rounds] == [alignment.ALIGN_SIZE, alignment.ALIGN_BLIND, alignment.ALIGN_RAISE,
                                      *[alignment.ALIGN_INTERSECT] * intersects, alignment.ALIGN_FINISH]
    assert len(rounds) == 8 - (3 + 1 - intersects)
    reference = aligned_once  # the rows of the default budget: every list in one message
    assert labels.ids_digest == reference.ids_digest
    for k in ("y_train", "s_train", "y_test", "s_test"):
        assert np.array_equal(getattr(labels, k), getattr(reference, k))


def test_fold_keeps_every_message_within_the_budget_unless_one_party_alone_is_over():
    assert alignment.fold({1: 10, 2: 10, 3: 10}, 30) == [[1, 2, 3]]
    assert alignment.fold({1: 10, 2: 10, 3: 10}, 25) == [[1, 2], [3]]
    assert alignment.fold({1: 66, 2: 66, 3: 66}, 30) == [[1], [2], [3]]  # 1M ids: each party alone, as before
    assert alignment.fold({}, 30) == [[]]  # the leader alone: one message finds the common rows
    assert 16 * alignment.INTERSECT_BUDGET <= GRPC_MAX_MESSAGE_LENGTH  # a wide margin under Flower's gRPC limit
    assert 2 * psi.POINT * 1_000_000 > alignment.INTERSECT_BUDGET  # so a party of 1M ids goes alone


class Substituting(InProcessGrid):
    """A server that changes one party's lists in the folded intersect message: swaps in another
    party's signed list, or leaves the party out."""

    def __init__(self, *a, field, **kw):
        super().__init__(*a, **kw)
        self.field = field

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            if m.metadata.message_type == alignment.ALIGN_INTERSECT:
                fields = dict(m.content.config_records["align"])
                if self.field == "peers":
                    fields["peers"] = [p for p in fields["peers"] if p != 2]
                else:  # party 3's list, signed by party 3, in party 2's place
                    fields[f"{self.field}-2"] = fields[f"{self.field}-3"]
                m.content.config_records["align"] = ConfigRecord(fields)
        return super().push_messages(messages)


@pytest.mark.parametrize("field, refusal", [
    ("blinded", r"alignment step 'intersect': party 2's blinded ids are not signed by party 2's pinned identity key"),
    ("raised", r"alignment step 'intersect': party 2's raising of this party's ids are not signed by party 2's"),
    ("peers", r"alignment step 'intersect': the lists of party 2 never came in this alignment; refused"),
], ids=["blinded", "raised", "left-out"])
def test_a_substituted_or_missing_list_in_a_folded_intersect_message_is_refused_naming_the_party(
        own_tables, field, refusal):
    folder, _, _ = own_tables
    with pytest.raises(FederationError, match=refusal):
        _align(folder, Substituting, field=field)
