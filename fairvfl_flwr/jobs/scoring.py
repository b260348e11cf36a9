"""The scoring job (``mode = "score"``): every party scores its own columns, the server sums.

Server (:func:`run_scoring`), given ``score.model-from`` (a training run folder with its
``model.json``) and ``score.round`` (-1: its final model; r: its checkpoint of round r):

1. builds the job's :class:`~fairvfl_flwr.config.scoring.ScoringJob` (:func:`read_job`):
   the training run's settings (``config/scoring.ADOPTED``: dataset, tables, model shape,
   the scoring messages' privacy) from the model's manifest; the user names the mode, the
   model and the files; a key set to another value than the model's is refused, naming the
   key and both values. Every message of the job carries those settings (:class:`JobGrid`),
   and each party builds its own job from them once (:func:`settings_mod`), after checking
   them against its own run config;
2. sends ``query.scoreinfo``: each party loads its block, checks it is its own, reads
   its rows to score and replies its block's run id and digest, its row count and the
   digest of its sorted ids (never an id list, a feature or a weight);
3. refuses, naming the party, a block of another run, a block that is not the one the
   manifest recorded, a different set of ids;
4. asks for the rows in chunks of ``score.chunk-rows`` (positions in the id-sorted rows
   every party holds); each reply has the chunk's partial logits in the run's wire dtype
   and the chunk's ids, which must be equal across parties;
5. writes ``predictions.csv`` (id, probability = σ(z), decision = 1 when z ≥ 0) and
   ``score.json`` into a new run folder, only once every chunk has arrived: a refused
   job leaves no output file.

Party (:func:`score_info`, :func:`score`): its block from node config ``model-dir``
(deployment) or the training run folder (simulation), its rows from its raw file,
preprocessed with its saved encoding and scaling: node config ``score-path`` (deployment),
run config ``score.path`` with ``{partition}`` replaced by its partition id (simulation),
else, in simulation, the packaged test rows. No labels or groups are read or sent.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from logging import INFO
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.config.scoring import ADOPTED, Contradiction, ScoringJob
from fairvfl_flwr.core.blocks import as_dtype, build_block
from fairvfl_flwr.data import model_files
from fairvfl_flwr.data.partydata import own_table_spec, party_spec
from fairvfl_flwr.data.encoding import Preprocessing, common_score_rows, score_file, score_rows
from fairvfl_flwr.data.tables import ids_digest
from fairvfl_flwr.flower.arrays import to_numpy
from fairvfl_flwr.jobs.alignment import align_score_rows
from fairvfl_flwr.flower import checks, exchange
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.jobs import Job
from fairvfl_flwr.flower.discovery import discover_nodes
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.party import SCORE_COMMON_STATE, TRAINED_STATE, Handles, PartyRuntime, handlers, scoring_job
from fairvfl_flwr.flower.progress import Estimate, Progress, Step, duration
from fairvfl_flwr.flower.results import run_folder
from fairvfl_flwr.secure import agreement, ring, view
from fairvfl_flwr.secure.nonces import CHUNK, mask_round
from fairvfl_flwr.flower.records import array_records, config_records

#: Which block and how many rows to score (digests only).
SCORE_INFO = "query.scoreinfo"
#: Partial logits of a chunk of rows, with their ids; summed under secure aggregation where it is on.
SCORE = "query.score"
RECORD = CHUNK  # the ConfigRecord every scoring message carries (secure aggregation orders chunks by it)
TRAINING = "trained-settings"  # the ConfigRecord of the training settings every message of a scoring job carries
LOGITS = "logits"
PREDICTIONS = "predictions.csv"
SUMMARY = "score.json"


class ScoreError(FederationError):
    """The scoring job is refused; the message names the party and what is wrong."""


class ScoringRun(NamedTuple):
    """The server's scoring job, read once per run (:func:`read_job`): the job's config and the
    model it scores with (its manifest, folder and checkpoint round, or None: the final model)."""

    job: ScoringJob
    manifest: dict
    model_from: Path
    checkpoint: int | None

    @property
    def num_parties(self) -> int:
        """The model's parties: one SuperNode each."""
        return self.job.num_parties

    def to_flower(self) -> dict[str, Any]:
        """The run config every party is given (the user's: the parties adopt the rest from the messages)."""
        return self.job.to_flower()


def read_job(run_config: Mapping[str, Any]) -> ScoringRun:
    """The scoring job of ``run_config``, parsed once per run: its own settings, then the
    training settings of its model (``score.model-from``, ``score.round``) adopted from the
    manifest; and the model as ``model_files.read_model`` gives it."""
    own = ScoringJob.own_settings(run_config)
    manifest, model_from, checkpoint = model_files.read_model(own.score_model_from, own.score_round)
    trained = {k: manifest["config"][k] for k in ADOPTED if k in manifest["config"]}
    try:
        job = ScoringJob.adopting(run_config, trained, f"score.model-from={own.score_model_from!r}")
    except Contradiction as exc:
        raise ScoreError(str(exc)) from None
    return ScoringRun(job, manifest, model_from, checkpoint)


class JobGrid:
    """``grid`` whose every message carries the training settings of the job's model (the
    alignment, key agreement and scoring messages alike): the parties' run config is the
    scoring job's, which names only the mode, the model and the files."""

    def __init__(self, grid: Grid, trained: Mapping[str, Any]) -> None:
        self._grid, self._record = grid, ConfigRecord(dict(trained))

    def stamp(self, messages: list[Message]) -> None:
        """Add the training settings to ``messages`` (before a view of them is taken: the
        parties act on them)."""
        for m in messages:
            m.content[TRAINING] = self._record

    def push_messages(self, messages):
        messages = list(messages)
        self.stamp(messages)
        return self._grid.push_messages(messages)

    def __getattr__(self, name: str):
        return getattr(self._grid, name)


def settings_mod(message: Message, context: Context, call_next) -> Message:
    """ClientApp mod: in a scoring job, the party keeps the training settings its messages
    carry, and builds its scoring job from them and its own run config (once per run,
    ``flower/party.scoring_job``; handlers and mods read it through ``PartyRuntime``): a key
    its own run config sets otherwise is refused, and only keys of ``config/scoring.ADOPTED``
    are taken. The block it loads must fit them."""
    record = config_records(message.content).get(TRAINING)
    if record is not None and RunConfig.mode_of(context.run_config) in JOB.modes:
        config_records(context.state)[TRAINED_STATE] = ConfigRecord(dict(record))
        scoring_job(context)  # refuses here, before any other mod acts on the message
    return call_next(message, context)


def _message(nid: int, kind: str, job: dict, group: str) -> Message:
    return Message(RecordDict({RECORD: ConfigRecord(job)}), dst_node_id=nid, message_type=kind, group_id=group)


class _Parties:
    """The scoring job's parties over its grid: each node's name once it has told its
    partition (a refusal names the party), and one exchange with the job's retries."""

    def __init__(self, grid: "JobGrid", cfg: RunConfig) -> None:
        self.grid, self.timeout, self.retries = grid, cfg.round_timeout, cfg.round_retries
        self.who: dict[int, str] = {}
        self.info: dict[int, dict] = {}  # by node: its query.scoreinfo reply

    def name(self, nid: int) -> str:
        return self.who.get(nid, f"node {nid}")

    def role(self, nid: int) -> str:
        return str(self.info[nid]["role"])

    def partition(self, nid: int) -> int:
        return int(self.info[nid]["partition-id"])

    def exchange(self, messages: list[Message], on_reply=None) -> list[Message]:
        return exchange.exchange(self.grid, messages, self.timeout, self.retries, self.name, on_reply)


def run_scoring(grid: Grid, scoring: ScoringRun, run_id: int | str | None = None) -> tuple[dict, Path]:
    """Score every party's rows with the model of ``score.model-from``; return (summary, folder).

    With ``tables.own``, the parties' score files are aligned first (their common ids)."""
    started = time.perf_counter()
    cfg, manifest, model_from, checkpoint = scoring.job.cfg, scoring.manifest, scoring.model_from, scoring.checkpoint
    parties = _Parties(JobGrid(grid, scoring.job.trained), cfg)
    node_ids = discover_nodes(parties.grid, cfg.num_parties, cfg.round_timeout,
                              f"the scoring job (a model of {cfg.num_parties} parties)")
    if cfg.tables_own:  # each party's score file holds its own ids: score the rows all of them hold
        align_score_rows(parties.grid, cfg, node_ids)
    job = {"run-id": manifest["run-id"], "run-folder": str(model_from), "checkpoint": -1 if checkpoint is None else checkpoint}
    progress = Progress("scoring", Estimate([Step(
        "every party loaded its block and read its rows to score", None, counts=f"{len(node_ids)} parties",
        doing="waiting for the parties to load their blocks and read their rows to score")]), min_gap=CHUNK_LINES_GAP)
    with progress.step(len(node_ids)):
        info = _block_info(parties, node_ids, job, manifest, progress.replied)
        n_rows = int(info[min(info)]["n-rows"])
        progress.found = f"{n_rows:,} rows each"
        progress.estimate.plan([progress.estimate.current, *_plan(cfg, n_rows)])
    ordered = [info[pid]["node"] for pid in sorted(info)]
    views = None
    if cfg.masked:  # each chunk's replies masked: the server learns the per-row totals only
        with progress.step():
            session = agreement.agree_keys([(nid, pid, parties.name(nid)) for pid, nid in zip(sorted(info), ordered)],
                                           parties.exchange)
        views = view.ServerViews(session)  # every chunk one view of all parties
    ids, z = _score_chunks(parties, cfg, ordered, job, n_rows, views, progress)
    folder = run_folder(cfg, run_id)
    write_predictions(folder / PREDICTIONS, ids, z)
    summary = {"mode": "score", "model-from": str(model_from), "run-id": manifest["run-id"],
               "round": manifest.get("round"), "checkpoint": checkpoint, "rows": n_rows,
               "chunk-rows": cfg.score_chunk_rows, "chunks": -(-n_rows // cfg.score_chunk_rows),
               "positive": int((z >= 0).sum()), "positive-label": manifest.get("positive-label"),
               "seconds": time.perf_counter() - started, "predictions": str(folder / PREDICTIONS)}
    model_files.write_json(folder / SUMMARY, summary)
    log(INFO, "FairVFL score: %d rows, %d positive, with run %s%s (%s) -> %s (%.1f s)", n_rows, summary["positive"],
        manifest["run-id"], "" if checkpoint is None else f" at its checkpoint of round {checkpoint}", model_from,
        folder / PREDICTIONS, summary["seconds"])
    return summary, folder


#: Seconds between the server's lines of scored chunks (and a party's): a job of many small chunks
#: logs its first, its last and one every so often.
CHUNK_LINES_GAP = 10.0


def _plan(cfg: RunConfig, n_rows: int) -> list[Step]:
    """The scoring job's steps after the parties' ``query.scoreinfo``: the masks' keys (under secure
    aggregation), then one step per chunk (they cost alike per row)."""
    chunk, steps = cfg.score_chunk_rows, []
    if cfg.masked:
        steps.append(Step("the parties agreed on the keys of their masks", None,
                          doing="waiting for the parties to agree on the keys of their masks"))
    chunks = -(-n_rows // chunk)
    for i, start in enumerate(range(0, n_rows, chunk), 1):
        rows = f"rows {start:,}..{min(n_rows, start + chunk) - 1:,}"
        steps.append(Step(f"chunk {i} of {chunks}: every party's partial logits of {rows}", "rows",
                          min(chunk, n_rows - start), doing=f"waiting for the parties' partial logits of {rows}"))
    return steps


def _block_info(parties: _Parties, node_ids: list[int], job: dict, manifest: Mapping[str, Any],
                on_reply=None) -> dict[int, dict]:
    """Ask every party which block it holds and how many rows it scores (``query.scoreinfo``;
    ``on_reply(node)`` as each replies); by partition id, its reply and node. Refuses another
    run's block, a block the manifest did not record, and parties that do not hold the same rows."""
    info: dict[int, dict] = {}
    for reply in parties.exchange([_message(nid, SCORE_INFO, job, "score-info") for nid in node_ids], on_reply):
        nid = reply.metadata.src_node_id
        if array_records(reply.content):
            raise ScoreError(f"{parties.name(nid)}: its {SCORE_INFO} reply must hold no arrays; refused")
        r = dict(config_records(reply.content)[RECORD])
        pid = int(r["partition-id"])
        parties.who[nid] = f"party {pid} ({r['role']}, node {nid})"
        info[pid] = parties.info[nid] = {**r, "node": nid}
    saved = {int(p["partition-id"]): p for p in manifest["parties"]}
    if sorted(info) != sorted(saved):
        raise ScoreError(f"the model's parties are partitions {sorted(saved)}, the federation's {sorted(info)}")
    first = info[min(info)]
    for pid in sorted(info):
        r, party = info[pid], parties.name(info[pid]["node"])
        if r["run-id"] != manifest["run-id"]:
            raise ScoreError(f"{party} holds a block of run {r['run-id']}, the model is run {manifest['run-id']}: "
                             "blocks from different runs; refused")
        if r["block-digest"] != saved[pid]["block-digest"]:
            raise ScoreError(f"{party}: its block (digest {r['block-digest']}) is not the one run "
                             f"{manifest['run-id']} saved (digest {saved[pid]['block-digest']}); refused")
        if r["ids-digest"] != first["ids-digest"] or r["n-rows"] != first["n-rows"]:
            raise ScoreError(
                f"{party} holds {r['n-rows']} rows to score (ids digest {r['ids-digest']}), party {min(info)} holds "
                f"{first['n-rows']} (ids digest {first['ids-digest']}): every party must hold the same row ids; refused")
    return info


def _score_chunks(parties: _Parties, cfg: RunConfig, ordered: list[int], job: dict, n_rows: int,
                  views: view.ServerViews | None, progress: Progress) -> tuple[np.ndarray, np.ndarray]:
    """Every row's id and summed logit z, asked for in chunks of ``score.chunk-rows``
    (under secure aggregation, each chunk one view of all parties: ``views``), each chunk a
    step of ``progress`` (they cost alike per row: the time left follows from the first)."""
    chunk = cfg.score_chunk_rows
    z = np.zeros(n_rows, dtype=np.float64)
    ids: list[np.ndarray] = []
    chunks = -(-n_rows // chunk)
    log(INFO, "FairVFL score: %d rows to score in %d chunk%s of at most %d rows (score.chunk-rows)", n_rows, chunks,
        "s" if chunks != 1 else "", chunk)
    for start in range(0, n_rows, chunk):
        stop = min(n_rows, start + chunk)
        with progress.step(len(ordered)):
            chunk_ids, z[start:stop] = _score_chunk(parties, cfg, ordered, {**job, "start": start, "stop": stop}, views,
                                                    progress.replied)
        ids.append(chunk_ids)
    return (np.concatenate(ids) if ids else np.array([], dtype=str)), z


def _score_chunk(parties: _Parties, cfg: RunConfig, ordered: list[int], job: dict,
                 views: view.ServerViews | None, on_reply=None) -> tuple[np.ndarray, np.ndarray]:
    """One chunk (rows ``job["start"]`` up to ``job["stop"]``): its ids, equal across parties,
    and the sum of the parties' partial logits (unmasked under secure aggregation)."""
    start, stop = job["start"], job["stop"]
    messages = [_message(nid, SCORE, job, f"score-{start}") for nid in ordered]
    if views is not None:
        parties.grid.stamp(messages)
        views.attach(messages, parties.role, parties.partition, mask_round)
    got = {r.metadata.src_node_id: r for r in parties.exchange(messages, on_reply)}
    if views is not None:
        views.collect(got.values(), parties.partition)
    chunk_ids = None
    parts = []
    for nid in ordered:
        u, ids = _partial_logits(parties.name(nid), got[nid], cfg, start, stop)
        if chunk_ids is None:
            chunk_ids = ids
        elif not np.array_equal(ids, chunk_ids):
            raise ScoreError(f"{parties.name(nid)}: rows {start}..{stop - 1} are not the same ids as "
                             f"{parties.name(ordered[0])}'s; refused")
        parts.append(u)
    if cfg.masked:
        return chunk_ids, ring.unmask_sum(parts, f"rows {start}..{stop - 1}")
    return chunk_ids, np.sum(parts, axis=0)


def _partial_logits(party: str, reply: Message, cfg: RunConfig, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """A party's ``query.score`` reply, checked: its partial logits of rows ``start`` up to
    ``stop`` (float64, or masked words under secure aggregation) and their ids."""
    content = reply.content
    if LOGITS not in array_records(content) or set(array_records(content)[LOGITS]) != {"logits", "ids"}:
        raise ScoreError(f"{party}: a {SCORE} reply holds exactly the chunk's logits and ids; refused")
    u = to_numpy(array_records(content)[LOGITS]["logits"])
    dtype = np.dtype(np.uint64) if cfg.masked else np.dtype(cfg.wire_dtype)
    if u.dtype != dtype or u.shape != (stop - start,):
        raise ScoreError(f"{party}: partial logits of rows {start}..{stop - 1} as {u.dtype} {u.shape}, "
                         f"expected {dtype} ({stop - start},)"
                         f"{' (masked words: privacy.secure-aggregation)' if cfg.masked else ''}")
    if not cfg.masked:
        try:
            u = checks.check_vector(u, "partial logits", stop - start, party).astype(np.float64)
        except checks.ReplyError as exc:
            raise ScoreError(f"rejected a reply: {exc}") from None
    ids = to_numpy(array_records(content)[LOGITS]["ids"]).astype(str)
    if ids.shape != (stop - start,):
        raise ScoreError(f"{party}: {ids.shape} ids for rows {start}..{stop - 1}; refused")
    return u, ids


def write_predictions(path: Path, ids: np.ndarray, z: np.ndarray) -> None:
    """id, probability = σ(z), decision = 1 when z ≥ 0 (σ(z) ≥ 0.5); written whole, then renamed."""
    prob = np.exp(-np.logaddexp(0.0, -z))  # σ(z) without overflow for large |z|
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write("id,probability,decision\n")
        step = 1 << 16
        for i in range(0, len(z), step):  # C-level loops: str/repr over Python scalars, one join per block
            a = map(str, ids[i:i + step].tolist())
            p = map(repr, prob[i:i + step].tolist())  # the shortest text that reads back as the same float
            d = np.where(z[i:i + step] >= 0, "1", "0").tolist()
            fh.write("\n".join(map(",".join, zip(a, p, d))) + "\n")
    os.replace(tmp, path)


# -- the parties' handlers ---------------------------------------------------------------
_COMMON: dict[tuple, Any] = {}  # recent common rows per party in this process (in-process grids hold several)


def _common_rows(rows, common: np.ndarray):
    """:func:`common_score_rows`, once per (score file, common ids) in a process rather than
    once per chunk message (it matches and sorts every row)."""
    key = (rows.source, rows.ids_digest, ids_digest(common))
    found = _COMMON.get(key)
    if found is None:
        found = _COMMON[key] = common_score_rows(rows, common)
        while len(_COMMON) > 16:
            _COMMON.pop(next(iter(_COMMON)), None)
    return found


@functools.lru_cache(maxsize=8)
def _model(folder: str, mtime_ns: int, who: str) -> tuple:
    """The saved block as a model block (numpy for linear: scoring needs no torch there)."""
    arrays, meta = model_files.load_block(Path(folder), who)
    model = build_block(meta["model"], int(meta["n-features"]), hidden=int(meta["hidden"]),
                        bias="bias" in arrays or meta["model"] == "mlp", dtype=meta["dtype"])
    expected = model.state_dict()
    if set(arrays) != set(expected) or any(np.shape(arrays[k]) != np.shape(v) for k, v in expected.items()):
        raise model_files.BlockError(f"{who}: the block in {folder} does not fit a {meta['model']} model: it holds "
                                f"{ {k: np.shape(v) for k, v in arrays.items()} }, the model "
                                f"{ {k: np.shape(v) for k, v in expected.items()} }")
    model.load_state_dict(arrays)
    return model, meta


class PartyScorer:
    """One party's block and rows for a scoring message (cached between the job's messages)."""

    def __init__(self, message: Message, context: Context) -> None:
        rt = PartyRuntime(context)
        self.cfg, node = rt.cfg, rt.node
        self.spec = party_spec(node, self.cfg.num_parties, self.cfg.num_active)
        if self.cfg.tables_own:  # a model trained on own tables: the id column is the party's (tables.id-column)
            self.spec = own_table_spec(self.spec, self.cfg)
        elif not node.has_table and self.cfg.dataset == "csv" and self.cfg.csv_id_column:  # the user's table's id column
            self.spec = dataclasses.replace(self.spec, id_column=self.cfg.csv_id_column)
        job = config_records(message.content)[RECORD]
        self.run_id = str(job["run-id"])
        self.who = _who(self.spec, context)
        checkpoint = int(job.get("checkpoint", -1))
        folder = model_files.block_folder(node, str(job["run-folder"]), self.run_id, self.spec.partition_id,
                                          checkpoint=None if checkpoint < 0 else checkpoint)
        meta_file = folder / model_files.BLOCK_META
        if not meta_file.is_file():
            what = "" if checkpoint < 0 else f" (checkpoint of round {checkpoint})"
            raise model_files.BlockError(f"{self.who}: no saved block of run {self.run_id}{what} in {folder} "
                                    "(node config model-dir, or the training run folder's parties/)")
        self.model, self.meta = _model(str(folder), os.stat(meta_file).st_mtime_ns, self.who)
        if int(self.meta["partition-id"]) != self.spec.partition_id:
            raise model_files.BlockError(f"{self.who}: the block in {folder} is partition {self.meta['partition-id']}'s")
        for key in ("model", "hidden", "dtype"):  # the settings it was sent must be its own block's
            if self.meta[key] != getattr(self.cfg, key) and (key != "hidden" or self.meta["model"] == "mlp"):
                raise model_files.BlockError(f"{self.who}: the scoring job's {key}={getattr(self.cfg, key)!r}, its block "
                                        f"in {folder} has {key}={self.meta[key]!r}; refused")
        if self.meta.get("secure-aggregation") and not self.cfg.masked:
            # the job's settings come from the server: the party's own record of training decides
            raise model_files.BlockError(f"{self.who}: its block in {folder} was trained under secure aggregation and "
                                    "this scoring job is not masked (privacy.secure-aggregation off): its partial "
                                    "logits would reach the server in the clear; refused")
        pre = Preprocessing.from_dict(self.meta["preprocessing"])
        path, source = score_file(self.spec, node, self.cfg)
        self.rows = score_rows(self.spec, self.cfg, pre, path, source)
        common = array_records(context.state).get(SCORE_COMMON_STATE)
        if common is not None:  # tables.own: the rows every party holds, found by private alignment
            self.rows = _common_rows(self.rows, to_numpy(common["ids"]))

    def logits(self, start: int, stop: int) -> np.ndarray:
        return self.model.forward(as_dtype(self.rows.X[start:stop], self.meta["dtype"])).astype(self.cfg.wire_dtype)


def _who(spec, context: Context) -> str:
    return f"party {spec.partition_id} ({spec.role}, node {context.node_id})"


#: A party's scoring job so far, in its node state: when its first chunk came, when it last said so.
PACE_STATE = "fairvfl.score-pace"


def score_info(message: Message, context: Context) -> Message:
    """Which block this party holds and how many rows it scores (digests, no ids)."""
    rt = PartyRuntime(context)
    progress = Progress(f"scoring, {_who(party_spec(rt.node, rt.cfg.num_parties, rt.cfg.num_active), context)}",
                        Estimate([Step("loaded its block and read its rows to score", None,
                                       doing="reading its rows to score")]))
    with progress.step():
        s = PartyScorer(message, context)
        progress.found = f"{len(s.rows.ids):,} rows, with its block of run {s.meta['run-id']}"
    config_records(context.state).pop(PACE_STATE, None)
    return Message(RecordDict({RECORD: ConfigRecord({
        "partition-id": s.spec.partition_id, "role": s.spec.role, "run-id": str(s.meta["run-id"]),
        "block-digest": str(s.meta["block-digest"]), "n-rows": int(len(s.rows.ids)), "ids-digest": s.rows.ids_digest,
    })}), reply_to=message)


def score(message: Message, context: Context) -> Message:
    """Partial logits of rows [start, stop) of this party's id-sorted rows, with their ids."""
    s = PartyScorer(message, context)
    job = config_records(message.content)[RECORD]
    start, stop = int(job["start"]), int(job["stop"])
    if not 0 <= start < stop <= len(s.rows.ids):
        raise checks.ReplyError(f"{s.who}: rows {start}..{stop} asked, it holds {len(s.rows.ids)}")
    reply = Message(RecordDict({LOGITS: msgs.array_record(logits=s.logits(start, stop), ids=s.rows.ids[start:stop])}),
                    reply_to=message)
    _said_chunk(context, s.who, start, stop, len(s.rows.ids))
    return reply


def _said_chunk(context: Context, who: str, start: int, stop: int, n: int) -> None:
    """This party's log of a chunk it scored: its first, its last and one every
    :data:`CHUNK_LINES_GAP` seconds, with the time left at its pace since its first chunk came
    (each chunk a message of its own: the pace is kept in its node state)."""
    now = time.time()  # messages may be processes of their own: the wall clock they share
    pace = config_records(context.state).get(PACE_STATE)
    if pace is None or start == 0:
        pace = ConfigRecord({"started": now, "said": 0.0})
    if start == 0 or stop == n or now - float(pace["said"]) >= CHUNK_LINES_GAP:
        left = Estimate([Step("its rows", "rows", n)]).left(now - float(pace["started"]), start) if start else None
        tail = "done" if stop == n else "the time left is not known yet" if left is None else f"about {duration(left)} left"
        log(INFO, "FairVFL: scoring, %s: scored rows %s..%s of its %s; %s", who, f"{start:,}", f"{stop - 1:,}",
            f"{n:,}", tail)
        pace["said"] = now
    config_records(context.state)[PACE_STATE] = pace


#: The scoring job: selected by ``mode = "score"``.
JOB = Job("scoring", handlers({SCORE_INFO: Handles(msgs.Kind.SETUP, score_info, in_view=False),
                              SCORE: Handles(msgs.Kind.QUERY, score)}), run=run_scoring, modes=("score",),
          read=read_job)
