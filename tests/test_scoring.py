"""Saved blocks and the scoring job: reproduce the training run's test metrics, refuse what
does not fit (naming the party), and never let a block reach the server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.core.errors import ConfigError
from fairvfl_flwr.core.metrics import fairness_metrics
from fairvfl_flwr.data import model_files, partydata
from fairvfl_flwr.flower import store
from fairvfl_flwr.flower.party import MODEL_STATE
from fairvfl_flwr.data.encoding import Preprocessing, packaged_test_frame
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.flower import party
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.jobs import scoring
from fairvfl_flwr.jobs import saving
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.data.tables import DATASETS, DataError, packaged_file
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.tools import report
from fairvfl_flwr.tools.localfed import LocalFederation
from fairvfl_flwr.tools.export import export

BASE = {"dataset": "crime", "num-server-rounds": 10, "eval-every": 5, "num-parties": 4}


def _train(out: Path, **extra) -> tuple[dict, Path]:
    return run_inprocess({**BASE, "output-dir": str(out), **extra}, quiet=True)


def _score(model_from: Path, out: Path, node_configs=None, **extra) -> tuple[dict, Path]:
    rc = {**BASE, "mode": "score", "score.model-from": str(model_from), "output-dir": str(out), **extra}
    cfg = RunConfig.from_flower(rc)
    grid = InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties, node_configs=node_configs)
    return run_server(grid, cfg.to_flower())


def _metrics(rc: dict, predictions: Path) -> dict:
    ds = load_data(RunConfig.from_flower(rc))
    p = pd.read_csv(predictions)
    assert p["id"].tolist() == ds.ids_test.tolist()  # every test row, sorted by id
    return fairness_metrics(ds.y_test, ds.s_test, np.where(p["decision"] == 1, 1.0, -1.0))


def _raw_files(rc: dict, model_from: Path, out: Path, edit=None) -> list[dict]:
    """One raw score file per party (its id column and raw columns, unscaled) and its node config."""
    cfg = RunConfig.from_flower(rc)
    df, id_column, _ = packaged_test_frame(cfg)
    out.mkdir(parents=True, exist_ok=True)
    configs = []
    for k in range(cfg.num_parties):
        meta = json.loads((model_from / model_files.PARTIES / f"partition-{k}" / model_files.BLOCK_META).read_text())
        raw = list(dict.fromkeys(meta["preprocessing"]["raw"]))
        table = df[[id_column, *raw]].sample(frac=1.0, random_state=k)  # the id column under the table's name
        if edit is not None:
            table = edit(k, table)
        path = out / f"score{k}.csv"
        table.to_csv(path, index=False)
        configs.append({"partition-id": k, "num-partitions": cfg.num_parties, "score-path": str(path),
                        "allow-unmasked": True})  # an unmasked job: this test is about the score files
    return configs


pytestmark = pytest.mark.usefixtures("private_party_cache")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    summary, folder = _train(out)
    return summary, folder


@pytest.fixture
def model_copy(trained, tmp_path):
    """A copy of the trained run folder a test may damage."""
    dst = tmp_path / trained[1].name
    shutil.copytree(trained[1], dst)
    return dst


def _no_predictions(out: Path) -> bool:
    return not list(out.rglob("predictions.csv*")) if out.exists() else True


# -- reproduce ------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["linear", "mlp"])
def test_scoring_the_test_rows_reproduces_the_training_runs_test_metrics(model, tmp_path):
    summary, folder = _train(tmp_path / "train", model=model)
    assert summary["test_acc"] is not None
    s, out = _score(folder, tmp_path / "score", model=model, **{"score.chunk-rows": 150})
    assert s["chunks"] == -(-s["rows"] // 150) > 1
    got = _metrics({**BASE, "model": model}, out / "predictions.csv")
    assert (got["acc"], got["dfp"], got["dfn"]) == (summary["test_acc"], summary["test_dfp"], summary["test_dfn"])
    p = pd.read_csv(out / "predictions.csv")
    assert list(p.columns) == ["id", "probability", "decision"]
    assert ((p["probability"] >= 0.5) == (p["decision"] == 1)).all()
    manifest = json.loads((folder / model_files.MANIFEST).read_text())
    assert manifest["metrics"]["test_acc"] == summary["test_acc"]
    lo, hi = manifest["metrics"]["intervals"]["acc"]
    assert lo <= summary["test_acc"] <= hi


def test_raw_score_files_reproduce_the_packaged_rows(trained, tmp_path):
    """Each party's raw, unscaled, shuffled file, preprocessed with its saved scaling."""
    summary, folder = trained
    configs = _raw_files(BASE, folder, tmp_path / "raw")
    _, out = _score(folder, tmp_path / "score", node_configs=configs)
    got = _metrics(BASE, out / "predictions.csv")
    assert (got["acc"], got["dfp"], got["dfn"]) == (summary["test_acc"], summary["test_dfp"], summary["test_dfn"])


def test_a_csv_table_with_text_columns_is_one_hot_encoded_as_in_training(tmp_path):
    """A user's table with a category column: the party holding it encodes raw rows itself,
    and a category training never saw is refused naming the party, column and value."""
    rng = np.random.default_rng(0)
    n = 600
    group = rng.choice(["a", "b"], n)
    color = rng.choice(["red", "green", "blue"], n)
    x = rng.normal(size=(n, 4))
    score = x[:, 0] + 0.5 * (color == "red") + 0.3 * (group == "a") + rng.normal(scale=0.5, size=n)
    table = pd.DataFrame({"id": np.arange(1000, 1000 + n), "x0": x[:, 0], "x1": x[:, 1], "x2": x[:, 2],
                          "x3": x[:, 3], "color": color, "group": group, "label": np.where(score > 0, "yes", "no")})
    csv = tmp_path / "table.csv"
    table.to_csv(csv, index=False)
    rc = {"dataset": "csv", "num-parties": 3, "num-server-rounds": 10, "eval-every": 5, "active-columns": 2,
          "csv.path": str(csv), "csv.label": "label", "csv.positive": "yes", "csv.sensitive": "group",
          "csv.group-a": "a", "csv.group-b": "b", "csv.id-column": "id"}
    summary, folder = run_inprocess({**rc, "output-dir": str(tmp_path / "train")}, quiet=True)
    meta = json.loads((folder / model_files.PARTIES / "partition-2" / model_files.BLOCK_META).read_text())
    assert meta["preprocessing"]["categories"] == {"color": ["blue", "green", "red"]}
    score_rc = {**rc, "mode": "score", "score.model-from": str(folder)}

    def score(configs, out):
        cfg = RunConfig.from_flower({**score_rc, "output-dir": str(out)})
        return run_server(InProcessGrid(client_app, cfg.to_flower(), 3, node_configs=configs), cfg.to_flower())

    raw = _raw_files(rc, folder, tmp_path / "raw")
    _, out = score(raw, tmp_path / "score")
    got = _metrics(rc, out / "predictions.csv")
    assert (got["acc"], got["dfp"], got["dfn"]) == (summary["test_acc"], summary["test_dfp"], summary["test_dfn"])
    # the user names the mode, the model and the files: dataset, csv.*, the parties, from the model's manifest
    _, short = run_inprocess({"mode": "score", "score.model-from": str(folder), "output-dir": str(tmp_path / "short")},
                             quiet=True, node_configs=raw)
    assert (short / "predictions.csv").read_text() == (out / "predictions.csv").read_text()

    def purple(k, t):
        if k == 2:
            t.loc[t.index[:3], "color"] = "purple"
        return t

    with pytest.raises(FederationError, match=r"party 2 .*column 'color' holds categories training never saw: "
                                               r"\['purple'\] \(3 rows"):
        score(_raw_files(rc, folder, tmp_path / "bad", edit=purple), tmp_path / "refused")
    assert _no_predictions(tmp_path / "refused")


# -- what reaches the server ----------------------------------------------------------------
class RecordingGrid(InProcessGrid):
    """Keeps every reply a party sends to the server."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.replies = []

    def _answer(self, msg):
        reply = super()._answer(msg)
        self.replies.append((msg.metadata.message_type, reply))
        return reply


def test_a_masked_model_is_scored_masked_by_a_job_naming_only_the_model(tmp_path):
    """A model trained under secure aggregation: the job's run config leaves it out, the
    job takes it from the model, and the parties mask their partial logits."""
    from fairvfl_flwr.secure import identity

    nodes = [{"partition-id": i, "num-partitions": 4, **keys}
             for i, keys in enumerate(identity.generate_identities(tmp_path / "identities", 4))]
    train = RunConfig.from_flower({**BASE, "num-server-rounds": 4, "privacy.secure-aggregation": True,
                                   "output-dir": str(tmp_path / "train")}).to_flower()
    _, folder = run_server(InProcessGrid(client_app, train, 4, node_configs=nodes), train)
    outs = {}
    for name, job in (("short", {}), ("full", {**BASE, "privacy.secure-aggregation": True})):
        job = {**job, "mode": "score", "score.model-from": str(folder), "output-dir": str(tmp_path / name)}
        grid = RecordingGrid(client_app, job, 4, node_configs=nodes)
        _, outs[name] = run_server(grid, job)
        logits = [r.content.array_records["logits"]["logits"].numpy() for t, r in grid.replies if t == scoring.SCORE]
        assert logits and all(u.dtype == np.uint64 for u in logits), name  # masked words only
    assert (outs["short"] / "predictions.csv").read_text() == (outs["full"] / "predictions.csv").read_text()
    # a server that leaves secure aggregation out of the model's settings: every party refuses
    manifest = json.loads((folder / model_files.MANIFEST).read_text())
    manifest["config"]["privacy.secure-aggregation"] = False
    (folder / model_files.MANIFEST).write_text(json.dumps(manifest))
    job = {"mode": "score", "score.model-from": str(folder), "output-dir": str(tmp_path / "lied")}
    with pytest.raises(FederationError, match=r"this scoring job is not masked"):
        run_server(InProcessGrid(client_app, job, 4, node_configs=nodes), job)
    assert _no_predictions(tmp_path / "lied")


def test_blocks_never_reach_the_server(tmp_path):
    """Neither at the end nor at a checkpoint (rounds 0, 5 and 10 here)."""
    cfg = RunConfig.from_flower({**BASE, "output-dir": str(tmp_path / "train"), "reliability.checkpoint-every": 5,
                                 "reliability.checkpoint-dir": str(tmp_path / "ckpt")})
    grid = RecordingGrid(client_app, cfg.to_flower(), cfg.num_parties)
    _, folder = run_server(grid, cfg.to_flower())
    saved = [r for t, r in grid.replies if t == saving.SAVE]
    assert len(saved) == cfg.num_parties * 4
    assert model_files.checkpoint_rounds(folder) == [0, 5, 10]
    for reply in saved:
        assert not reply.content.array_records  # digests only
        assert set(reply.content.config_records) == {"saved"}
    thetas = {k: np.load(folder / model_files.PARTIES / f"partition-{k}" / model_files.BLOCK)["weight"] for k in range(4)}
    manifest_text = (folder / model_files.MANIFEST).read_text()
    for k, w in thetas.items():
        assert repr(float(w[0])) not in manifest_text

    score_cfg = RunConfig.from_flower({**BASE, "mode": "score", "score.model-from": str(folder),
                                       "score.chunk-rows": 200, "output-dir": str(tmp_path / "score")})
    grid = RecordingGrid(client_app, score_cfg.to_flower(), score_cfg.num_parties)
    run_server(grid, score_cfg.to_flower())
    for kind, reply in grid.replies:
        if kind == scoring.SCORE_INFO:
            assert not reply.content.array_records
        else:
            assert kind == scoring.SCORE
            (record,) = reply.content.array_records.values()
            assert set(record) == {"logits", "ids"}
            assert record["logits"].numpy().shape == record["ids"].numpy().shape
            assert len(record["ids"].numpy()) <= 200
            assert not reply.content.config_records and not reply.content.metric_records


# -- checkpoints ----------------------------------------------------------------------------
def test_a_checkpoint_scores_as_the_run_stopped_at_that_round(tmp_path):
    """checkpoint-every=4 over 10 rounds: each checkpoint (rounds 0, 4, 8) is a model. The one of
    round 4 holds the θ the checkpoint feature saved for round 4 and the blocks of a run of 4
    rounds, and scores its rows as that run's final model does; a round without a
    checkpoint is refused, listing the checkpoints."""
    ckpt = {"reliability.checkpoint-every": 4, "reliability.checkpoint-dir": str(tmp_path / "ckpt"), "eval-every": 2,
            "optimizer": "gd"}
    _, folder = _train(tmp_path / "train", **ckpt)
    assert model_files.checkpoint_rounds(folder) == [0, 4, 8]
    # gradient steps: a block-Newton checkpoint's block is θ before that round's step lengths, which a
    # run ending at that round applies last (docs/scoring.md)
    four, folder4 = _train(tmp_path / "four", **{"num-server-rounds": 4, "eval-every": 2, "optimizer": "gd"})
    at4 = json.loads((folder / "checkpoints" / "round-4" / model_files.MANIFEST).read_text())
    final4 = json.loads((folder4 / model_files.MANIFEST).read_text())
    assert at4["checkpoint"] and at4["round"] == 4 and at4["run-id"] == folder.name
    assert [p["block-digest"] for p in at4["parties"]] == [p["block-digest"] for p in final4["parties"]]
    assert at4["metrics"]["test_acc"] == four["test_acc"] and at4["metrics"]["intervals"]
    cfg = RunConfig.from_flower({**BASE, **ckpt})
    for p in at4["parties"]:
        k = p["partition-id"]
        kept = store.load_state(store.run_dir(tmp_path / "ckpt", cfg, k), 4, f"party {k}")[MODEL_STATE]
        assert model_files.block_digest({name: a.numpy() for name, a in kept.items()}) == p["block-digest"]
        party = folder / "checkpoints" / "round-4" / model_files.PARTIES / f"partition-{k}"
        assert "checkpoint of round 4" in (party / model_files.PARTY_CARD).read_text()
    assert "checkpoint of round 4" in (folder / "checkpoints" / "round-4" / model_files.RUN_CARD).read_text()

    s, out = _score(folder, tmp_path / "score", **{"score.round": 4})
    _, out4 = _score(folder4, tmp_path / "score4")
    assert s["checkpoint"] == 4 and s["round"] == 4
    assert (out / "predictions.csv").read_text() == (out4 / "predictions.csv").read_text()
    got = _metrics(BASE, out / "predictions.csv")
    assert (got["acc"], got["dfp"], got["dfn"]) == (four["test_acc"], four["test_dfp"], four["test_dfn"])
    # the checkpoint's own folder names the same model
    _, direct = _score(folder / "checkpoints" / "round-4", tmp_path / "direct")
    assert (direct / "predictions.csv").read_text() == (out4 / "predictions.csv").read_text()

    with pytest.raises(model_files.BlockError, match=r"score.round=5: the run folder .* has no checkpoint of round 5 "
                                                r"\(its checkpoints: 0, 4, 8;"):
        _score(folder, tmp_path / "refused", **{"score.round": 5})
    assert _no_predictions(tmp_path / "refused")


# -- simulation: a raw file per party from the run config -----------------------------------
def test_score_path_gives_each_simulated_party_its_raw_file(trained, tmp_path):
    """run config score.path with {partition}: per-party raw, shuffled files score as the test
    rows do; one file holding every party's columns does too; a missing file names the party
    and the key."""
    summary, folder = trained
    _raw_files(BASE, folder, tmp_path / "raw")
    _, out = _score(folder, tmp_path / "score", **{"score.path": str(tmp_path / "raw" / "score{partition}.csv")})
    got = _metrics(BASE, out / "predictions.csv")
    assert (got["acc"], got["dfp"], got["dfn"]) == (summary["test_acc"], summary["test_dfp"], summary["test_dfn"])

    df, id_column, _ = packaged_test_frame(RunConfig.from_flower(BASE))
    df.rename(columns={id_column: "row_id"}).sample(frac=1.0, random_state=9).to_csv(tmp_path / "all.csv", index=False)
    _, out_all = _score(folder, tmp_path / "score-all", **{"score.path": str(tmp_path / "all.csv")})
    assert (out_all / "predictions.csv").read_text() == (out / "predictions.csv").read_text()

    with pytest.raises(FederationError, match=r"party (\d) .*score file .*nowhere\1.csv not found \(run config "
                                              r"score.path='.*nowhere\{partition\}.csv'\)"):
        _score(folder, tmp_path / "refused", **{"score.path": str(tmp_path / "nowhere{partition}.csv")})
    assert _no_predictions(tmp_path / "refused")


# -- refusals -------------------------------------------------------------------------------
def test_a_missing_block_is_refused_naming_the_party(model_copy, tmp_path):
    (model_copy / model_files.PARTIES / "partition-3" / model_files.BLOCK_META).unlink()
    with pytest.raises(FederationError, match=r"party 3 \(passive, node \d+\): no saved block of run"):
        _score(model_copy, tmp_path / "out")
    assert _no_predictions(tmp_path / "out")


def test_blocks_from_different_runs_are_refused(model_copy, tmp_path):
    _, other = _train(tmp_path / "other", seed=1)
    dst = model_copy / model_files.PARTIES / "partition-2"
    shutil.rmtree(dst)
    shutil.copytree(other / model_files.PARTIES / "partition-2", dst)
    with pytest.raises(FederationError, match=rf"party 2 \(passive, node \d+\) holds a block of run {other.name}, "
                                              rf"the model is run {model_copy.name}: blocks from different runs"):
        _score(model_copy, tmp_path / "out")
    assert _no_predictions(tmp_path / "out")


def test_a_changed_block_is_refused(model_copy, tmp_path):
    path = model_copy / model_files.PARTIES / "partition-1" / model_files.BLOCK
    with np.load(path) as f:
        arrays = {k: f[k].copy() for k in f.files}
    arrays["weight"][0] += 1.0
    np.savez(path, **arrays)
    with pytest.raises(FederationError, match=r"party 1 .*does not match the digest"):
        _score(model_copy, tmp_path / "out")
    assert _no_predictions(tmp_path / "out")


def test_a_score_file_missing_a_column_is_refused(trained, tmp_path):
    _, folder = trained
    drop = {}

    def edit(k, t):
        if k == 1:
            drop["col"] = t.columns[3]
            return t.drop(columns=[t.columns[3]])
        return t

    configs = _raw_files(BASE, folder, tmp_path / "raw", edit=edit)
    with pytest.raises(FederationError, match=rf"party 1 .*score file .*score1.csv: column\(s\) \['{drop['col']}'\] "
                                              r"not found"):
        _score(folder, tmp_path / "out", node_configs=configs)
    assert _no_predictions(tmp_path / "out")


def test_score_file_ids_are_text_by_the_one_id_rule(tmp_path):
    """Leading zeros stay ("007" and "7" are two ids), spaces around an id are stripped (and
    then a duplicate is refused); ids made of digits sort by length then text."""
    from fairvfl_flwr.data.encoding import read_columns, rows_from_frame

    pre = Preprocessing.from_dict({"features": ["x"], "raw": ["x"], "category": [None], "mean": [0.0], "std": [1.0]})
    path = tmp_path / "s.csv"
    path.write_text("client no,x\n007,1\n7,2\n010, 3\n")
    rows = rows_from_frame(read_columns(str(path), ["client no", "x"], "f", "client no"), "client no", pre, "f")
    assert rows.ids.tolist() == ["7", "007", "010"] and rows.X[:, 0].tolist() == [2.0, 1.0, 3.0]
    path.write_text("client no,x\n007,1\n 007 ,2\n")
    with pytest.raises(DataError, match=r"f: id column 'client no' has duplicate ids, e.g. \['007'\]"):
        rows_from_frame(read_columns(str(path), ["client no", "x"], "f", "client no"), "client no", pre, "f")


def test_ids_not_held_by_every_party_are_refused(trained, tmp_path):
    _, folder = trained
    configs = _raw_files(BASE, folder, tmp_path / "raw", edit=lambda k, t: t.iloc[1:] if k == 2 else t)
    with pytest.raises(FederationError, match=r"party 2 \(passive, node \d+\) holds 792 rows to score .*party 0 holds "
                                              r"793 .*every party must hold the same row ids"):
        _score(folder, tmp_path / "out", node_configs=configs)
    assert _no_predictions(tmp_path / "out")


def test_a_job_with_only_the_mode_and_the_model_scores_as_the_full_config(trained, tmp_path):
    _, folder = trained
    _, full = _score(folder, tmp_path / "full")
    _, short = run_inprocess({"mode": "score", "score.model-from": str(folder), "output-dir": str(tmp_path / "short")},
                             quiet=True)
    assert (short / "predictions.csv").read_text() == (full / "predictions.csv").read_text()


def test_each_party_parses_its_scoring_job_once_and_leaves_its_run_config_as_given(trained, tmp_path):
    """A party's handlers read the job (its run config with the model's settings adopted)
    through PartyRuntime; Flower's run config is the one the job was given, after every message."""
    _, folder = trained
    job = {"mode": "score", "score.model-from": str(folder), "output-dir": str(tmp_path / "out")}
    grid = InProcessGrid(client_app, job, 4)
    run_server(grid, job)
    for context in grid.contexts.values():
        assert context.run_config == job
        rt = party.PartyRuntime(context)
        assert rt.job is not None and rt.job.given == job and rt.cfg.num_parties == 4
        assert rt.job.trained["model"] == "linear" and rt.cfg.model == "linear"
        assert party.scoring_job(context) is rt.job  # parsed once per run


def test_a_key_contradicting_the_model_is_refused_naming_both_values(trained, tmp_path):
    _, folder = trained
    with pytest.raises(FederationError, match=r"score.model-from=.*: run config model='mlp' contradicts the model's "
                                              r"model='linear'; leave model out"):
        _score(folder, tmp_path / "out", model="mlp")
    with pytest.raises(FederationError, match=r"run config num-parties=3 contradicts the model's num-parties=4"):
        run_inprocess({"mode": "score", "score.model-from": str(folder), "num-parties": 3,
                       "output-dir": str(tmp_path / "out")}, quiet=True)
    assert _no_predictions(tmp_path / "out")


def test_a_party_refuses_training_settings_its_own_run_config_contradicts(trained, tmp_path):
    """The parties check what the job's messages carry: a key its own run config sets
    otherwise is refused, naming the key; one the job may set (secure aggregation) is kept."""
    _, folder = trained
    job = {"mode": "score", "score.model-from": str(folder), "output-dir": str(tmp_path / "out")}
    grid = InProcessGrid(client_app, {**job, "tables.id-column": "customer"}, 4)
    with pytest.raises(FederationError, match=r"partition \d \(node \d+\): run config tables.id-column='customer' "
                                              r"contradicts the model's tables.id-column='row_id'"):
        run_server(grid, job)
    grid = InProcessGrid(client_app, {**job, "privacy.secure-aggregation": True}, 4)
    # the server (plain, as trained) set up no pair keys: the parties refuse to reply unmasked
    with pytest.raises(FederationError, match=r"party \d .*privacy.secure-aggregation is on but this node holds 0 of 3"):
        run_server(grid, job)
    assert _no_predictions(tmp_path / "out")


def test_score_settings_are_checked():
    with pytest.raises(ConfigError, match=r"score.model-from='': mode='score' needs the training run folder"):
        RunConfig.from_flower({"mode": "score"})
    with pytest.raises(ConfigError, match=r"score.model-from='x': is read only with mode='score'"):
        RunConfig.from_flower({"score.model-from": "x"})
    with pytest.raises(ConfigError, match=r"score.chunk-rows=0"):
        RunConfig.from_flower({"score.chunk-rows": 0})
    with pytest.raises(ConfigError, match=r"score.round=-2: must be -1 \(the final model\)"):
        RunConfig.from_flower({"mode": "score", "score.model-from": "x", "score.round": -2})
    with pytest.raises(ConfigError, match=r"score.round=3: is read only with mode='score'"):
        RunConfig.from_flower({"score.round": 3})
    with pytest.raises(ConfigError, match=r"score.path='a.csv': is read only with mode='score'"):
        RunConfig.from_flower({"score.path": "a.csv"})


def test_a_folder_without_a_manifest_is_refused(tmp_path):
    with pytest.raises(model_files.BlockError, match=r"no model.json there"):
        _score(tmp_path, tmp_path / "out")


# -- deployed party files (in process) ------------------------------------------------------
def test_deployed_parties_keep_blocks_in_model_dir_and_score_raw_files(tmp_path):
    """Export → train on the party files (each node with its own model-dir) → score a new
    1,000-row raw file per party; equal to scoring the saved blocks by hand."""
    rc = {**BASE, "num-server-rounds": 6, "eval-every": 3}
    manifest = export(RunConfig.from_flower(rc), tmp_path / "files", demo_keys=True)
    nodes = [{**n, "model-dir": str(tmp_path / f"node{n['partition-id']}")} for n in manifest["node_configs"]]
    train_rc = RunConfig.from_flower({**rc, **manifest["run_config"], "output-dir": str(tmp_path / "runs")}).to_flower()
    _, folder = run_server(InProcessGrid(client_app, train_rc, 4, node_configs=nodes), train_rc)
    assert not (folder / model_files.PARTIES).exists()  # deployed parties keep their blocks on their own disk
    run_id = folder.name

    raw = pd.read_csv(packaged_file(DATASETS["crime"].path.name)).iloc[:1000]
    expected = np.zeros(1000)
    for node in nodes:
        k = node["partition-id"]
        arrays, meta = model_files.load_block(tmp_path / f"node{k}" / run_id / f"partition-{k}", f"party {k}")
        pre = Preprocessing.from_dict(meta["preprocessing"])
        cols = ["row_id", *pre.raw_columns]
        raw[cols].sample(frac=1.0, random_state=k).to_csv(tmp_path / f"new{k}.csv", index=False)
        node["score-path"] = str(tmp_path / f"new{k}.csv")
        u = pre.apply(raw, "test") @ arrays["weight"] + (arrays["bias"] if "bias" in arrays else 0.0)
        expected += u.astype(np.float32)
    # the export's run config has secure aggregation on: the job's replies are masked too
    score_rc = RunConfig.from_flower({**train_rc, "mode": "score",
                                      "score.model-from": str(folder), "score.chunk-rows": 300,
                                      "output-dir": str(tmp_path / "scores")}).to_flower()
    summary, out = run_server(InProcessGrid(client_app, score_rc, 4, node_configs=nodes), score_rc)
    p = pd.read_csv(out / "predictions.csv")
    assert summary["rows"] == 1000 and p["id"].tolist() == raw["row_id"].tolist()
    z = np.log(p["probability"] / (1 - p["probability"])).to_numpy()
    np.testing.assert_allclose(z, expected, rtol=1e-5, atol=1e-6)
    clear = np.abs(expected) > 1e-5
    assert (p["decision"].to_numpy()[clear] == (expected[clear] >= 0)).all()
    # each party parsed its file once; a fresh ClientApp process loads the parsed rows from its disk
    assert len(list((tmp_path / "cache").glob("score-*.npz"))) == 4


def test_the_report_on_scored_test_rows_gives_the_training_runs_gaps(trained, tmp_path):
    pytest.importorskip("fairlearn")
    summary, folder = trained
    _, out = _score(folder, tmp_path / "score")
    partydata.label_table(load_data(RunConfig.from_flower(BASE))).to_csv(tmp_path / "server_labels.csv", index=False)
    assert report.main([str(out / "predictions.csv"), "--outcomes", str(tmp_path / "server_labels.csv"),
                        "--out", str(tmp_path / "report")]) == 0
    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    assert rep["rows"] == 793  # crime's test rows
    assert rep["overall"]["accuracy"] == pytest.approx(summary["test_acc"], abs=1e-12)
    assert rep["gaps"]["dfp"] == pytest.approx(summary["test_dfp"], abs=1e-12)
    assert rep["gaps"]["dfn"] == pytest.approx(summary["test_dfn"], abs=1e-12)


@pytest.mark.slow
def test_flwr_run_trains_then_scores_the_test_rows_reproducing_its_metrics(simulation_superlink, tmp_path):
    """The real runtime: `flwr run` trains (parties save their blocks, at the end and at each
    checkpoint), then `flwr run` with mode = "score" sums the partial logits; ACC/DFP/DFN equal
    the training run's. Then the checkpoint of round 5 scores a raw file per party
    (score.path) as the in-process grid does."""
    ckpt = {"reliability.checkpoint-every": 5, "reliability.checkpoint-dir": str(tmp_path / "ckpt")}
    link = simulation_superlink
    link.run({**BASE, **ckpt, "output-dir": str(tmp_path / "train")}, num_supernodes=4, timeout=600)
    (folder,) = [p for p in (tmp_path / "train").iterdir() if p.is_dir()]
    assert all((folder / model_files.PARTIES / f"partition-{k}" / model_files.BLOCK).is_file() for k in range(4))
    assert model_files.checkpoint_rounds(folder) == [0, 5, 10]
    link.run({**BASE, "mode": "score", "score.model-from": str(folder), "score.chunk-rows": 300,
              "output-dir": str(tmp_path / "score")}, num_supernodes=4, timeout=600)
    _raw_files(BASE, folder, tmp_path / "raw")
    at5 = {"score.round": 5, "score.path": str(tmp_path / "raw" / "score{partition}.csv")}
    link.run({**BASE, "mode": "score", "score.model-from": str(folder), "score.chunk-rows": 300, **at5,
              "output-dir": str(tmp_path / "score5")}, num_supernodes=4, timeout=600)
    (out,) = [p for p in (tmp_path / "score").iterdir() if p.is_dir()]
    summary = json.loads((folder / "summary.json").read_text())
    got = _metrics(BASE, out / "predictions.csv")
    assert (got["acc"], got["dfp"], got["dfn"]) == (summary["test_acc"], summary["test_dfp"], summary["test_dfn"])
    (out5,) = [p for p in (tmp_path / "score5").iterdir() if p.is_dir()]
    _, here = _score(folder, tmp_path / "here", **at5)
    assert (out5 / "predictions.csv").read_text() == (here / "predictions.csv").read_text()
    assert json.loads((out5 / "score.json").read_text())["checkpoint"] == 5


@pytest.mark.slow
@pytest.mark.deploy_long
def test_loopback_deployment_trains_then_scores_new_raw_files(tmp_path):
    """A real SuperLink and 4 SuperNodes on 127.0.0.1: train on exported files, then score a
    new 1,000-row raw file per party; equal to scoring the saved blocks by hand. Every
    deployed message starts a fresh ClientApp process; the SuperNodes poll for tasks every
    0.05 s (docs/deploy.md), which keeps 20 rounds within the timeouts on a loaded machine."""
    rc = {**BASE, "num-server-rounds": 20, "eval-every": 10}
    manifest = export(RunConfig.from_flower(rc), tmp_path / "files", demo_keys=True)
    raw = pd.read_csv(packaged_file(DATASETS["crime"].path.name)).iloc[-1000:]
    nodes = []
    for n in manifest["node_configs"]:
        k = n["partition-id"]
        pre = Preprocessing.from_dict(json.loads((tmp_path / "files" / f"party{k}.preprocessing.json").read_text()))
        raw[["row_id", *pre.raw_columns]].sample(frac=1.0, random_state=k).to_csv(tmp_path / f"new{k}.csv", index=False)
        nodes.append({**n, "model-dir": str(tmp_path / f"models{k}"), "score-path": str(tmp_path / f"new{k}.csv")})
    env = {"FAIRVFL_CACHE_DIR": str(tmp_path / "party-cache")}
    train_rc = {**rc, **manifest["run_config"], "output-dir": str(tmp_path / "runs")}
    with LocalFederation(tmp_path / "fed", nodes, env=env) as fed:
        run_id, status = fed.run(train_rc, timeout=1500)
        assert status == "finished:completed", fed.logs(run_id)[-3000:]
        (folder,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
        assert json.loads((folder / "summary.json").read_text())["rounds"] == 20
        # the scoring job takes secure aggregation from the model: its replies are masked too
        run_id, status = fed.run({**train_rc, "mode": "score", "score.model-from": str(folder),
                                  "score.chunk-rows": 300, "output-dir": str(tmp_path / "scores")}, timeout=600)
        assert status == "finished:completed", fed.logs(run_id)[-3000:]
    assert not (folder / model_files.PARTIES).exists()
    expected = np.zeros(len(raw))
    for n in nodes:
        k = n["partition-id"]
        arrays, meta = model_files.load_block(Path(n["model-dir"]) / folder.name / f"partition-{k}", f"party {k}")
        u = Preprocessing.from_dict(meta["preprocessing"]).apply(raw, "test") @ arrays["weight"]
        expected += (u + arrays["bias"] if "bias" in arrays else u).astype(np.float32)
    (out,) = [p for p in (tmp_path / "scores").iterdir() if p.is_dir()]
    p = pd.read_csv(out / "predictions.csv")
    assert p["id"].tolist() == sorted(raw["row_id"].tolist())
    z = np.log(p["probability"] / (1 - p["probability"])).to_numpy()
    order = np.argsort(raw["row_id"].to_numpy())
    np.testing.assert_allclose(z, expected[order], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ids", [np.arange(70_000) * 7 - 5, np.array([f"c-{i}" for i in range(70_000)])])
def test_predictions_are_each_rows_id_the_probability_read_back_exactly_and_the_decision(tmp_path, ids):
    from fairvfl_flwr.jobs.scoring import write_predictions

    z = np.random.default_rng(0).normal(scale=30.0, size=len(ids))
    z[:3] = [0.0, -800.0, 800.0]
    write_predictions(tmp_path / "p.csv", ids, z)
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0] == "id,probability,decision" and len(lines) == len(ids) + 1  # more rows than one write block
    got = [line.split(",") for line in lines[1:]]
    assert [g[0] for g in got] == [str(i) for i in ids.tolist()]
    prob = np.array([float(g[1]) for g in got])
    assert np.array_equal(prob, np.exp(-np.logaddexp(0.0, -z)))  # σ(z), its text reads back as the same float
    assert [g[2] for g in got] == ["1" if v >= 0 else "0" for v in z]
    assert lines[1:4] == [f"{ids[0]},0.5,1", f"{ids[1]},0.0,0", f"{ids[2]},1.0,1"]
