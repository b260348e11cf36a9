"""Keep the trained model: every party saves its block on its own disk after the last round
and at every checkpoint.

Server (:class:`SaveBlocks`, a round hook): after the rounds (its ``files``),
:func:`save_blocks` sends ``query.save`` (run id, run folder) to every party, collects the
digests the parties report, and writes the manifest ``model.json`` and the run's model card
into the run folder. With ``reliability.checkpoint-every`` = c the hook does the same after
round 0 and every c-th round, into ``checkpoints/round-<r>/`` (data/model_files.py), so the
model of any checkpoint can be scored. A reply that carries any array is refused: θ_k never
reaches the server. The cards' bootstrap intervals are over the test scores the run's
:class:`~fairvfl_flwr.features.final_logits.KeepScores` keeps, handed to the hook when the
app assembles the run.

Party (:func:`save`): writes ``block.npz`` (θ_k as numpy arrays), ``block.json`` (its
preprocessing, run id, data digest) and its own ``card.md`` (data/model_files.py), in node
config ``model-dir`` (deployment) or the run folder's ``parties/partition-<k>``
(simulation: the parties share the machine).
"""

from __future__ import annotations

import math
import time
from logging import INFO
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.core.bootstrap import bootstrap, cell_counts
from fairvfl_flwr.core.metrics import group_rates, predict
from fairvfl_flwr.data import model_files
from fairvfl_flwr.data.encoding import party_preprocessing
from fairvfl_flwr.data.sources import table_source
from fairvfl_flwr.data.tables import DATASETS
from fairvfl_flwr.features.final_logits import KeepScores
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.jobs import Job
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.hooks import RoundHook, ServerView
from fairvfl_flwr.flower.party import Handles, PartyRuntime, handlers
from fairvfl_flwr.core.constraints import constrained_codes
from fairvfl_flwr.flower.records import array_records, config_records

SAVE_RECORD = "save"
SAVED_RECORD = "saved"
BOOTSTRAP_REPLICATES = 1000

#: After the last round (and at a checkpoint): each party saves its block on its own disk and
#: replies its digests, never θ; outside secure aggregation's views (digests only).
SAVE = "query.save"


def positive_label(cfg) -> str:
    if cfg.dataset in DATASETS and not cfg.server_labels and not cfg.tables_own:
        spec = DATASETS[cfg.dataset]
        return f"{spec.label_column} = {spec.positive_value}"
    if cfg.dataset == "csv" and cfg.csv_label:
        return f"{cfg.csv_label} = {cfg.csv_positive}"
    return "y = +1 (the active party's label-positive)"


def group_labels(cfg, names: list | None) -> dict:
    """The groups as the data names them (deployment with two groups: the server knows only a and b)."""
    if not names:
        return {"a": "group a", "b": "group b"}
    if cfg.tables_own:  # the label owner's own column names stay with it: the groups by their values
        column = "group"
    else:
        column = DATASETS[cfg.dataset].sensitive_column if cfg.dataset in DATASETS else cfg.csv_sensitive
    if len(names) == 2:
        return {k: f"{column} = {name}" for k, name in zip(("a", "b"), names)}
    return {str(name): f"{column} = {name}" for name in names}  # several groups: by name, not by code


def final_intervals(labels, z_test: np.ndarray | None, seed: int, constraint=None) -> dict:
    """Bootstrap intervals of the final test ACC/DFP/DFN/DEO (empty without test scores), over the
    groups the run constrained (``constraint``, the run's ConstraintSet: its pooled groups as one)."""
    if z_test is None or len(z_test) == 0:
        return {}
    s = np.asarray(labels.s_test)
    if constraint is not None and constraint.pooling is not None:
        s = constrained_codes(constraint, s, labels.group_names)
    group, names = (np.where(s, "a", "b"), ["a", "b"]) if s.dtype == bool else (s, sorted(set(s.tolist())))
    counts = cell_counts(labels.y_test == 1, group, z_test >= 0, names)
    return {k: list(v) for k, v in bootstrap(counts, BOOTSTRAP_REPLICATES, seed).items()}


def per_group(labels, z_test: np.ndarray | None, names: list | None) -> dict:
    """Each data group's test rows and error rates (two groups: a, then b)."""
    s = np.asarray(labels.s_test)
    if z_test is None or len(z_test) == 0:
        return {}
    if s.dtype == bool:
        s = np.where(s, 0, 1)
        names = names or ["a", "b"]
    return group_rates(labels.y_test, s, predict(z_test), tuple(names) if names else None)


#: What a card shows of the groups the figures are over: the constrained groups' figures come
#: under the summary's names; where small groups were pooled, the data's own groups' beside them.
RAW_FIGURES = ("test_dfp_raw", "test_dfn_raw", "test_dp_diff_raw", "test_eo_diff_raw", "train_dp_diff_raw",
               "train_eo_diff_raw")


def save_blocks(server: ServerView, grid: Grid, folder: Path, summary: Mapping[str, Any], z_test: np.ndarray | None,
                timeout: float) -> dict:
    """Every party saves its block; the server writes ``model.json`` and ``model-card.md``, the card's
    intervals over ``z_test``, the final test scores (None: no intervals)."""
    metrics = {k: summary.get(k) for k in ("rounds", "train_loss", "train_max_gap", "train_gaps", "evaluated_on",
                                           "test_acc", "test_dfp", "test_dfn", "test_dp_diff", "test_eo_diff",
                                           "train_dp_diff", "train_eo_diff") + RAW_FIGURES
               if k in summary or not k.endswith("_raw")}
    metrics["constrained-groups"] = summary.get("groups")
    if summary.get("raw_groups"):
        metrics["raw-groups"] = summary["raw_groups"]
    # from a registry's release or its encrypted groups the server holds no row's group: no per-group rates
    # or intervals of its own
    z_test = z_test if server.labels.release is None and server.labels.sums is None else None
    metrics["intervals"] = final_intervals(server.labels, z_test, server.cfg.seed, server.constraint)
    metrics["groups"] = per_group(server.labels, z_test, summary.get("group-names"))
    return _save(server, grid, Path(folder), int(summary["rounds"]), None, metrics, summary, timeout)


def _number(v: Any) -> Any:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


class SaveBlocks(RoundHook):
    """After the run, every party saves its block of θ and the server writes the manifest and card
    (:func:`save_blocks`); after round 0 and every ``every``-th round (0: never) the same of θ_r,
    into that checkpoint's ``checkpoints/round-<r>/``.

    ``scores``: the run's kept scores, whose test scores give a card its intervals;
    ``described``: what the model card says about the data (``dataset-summary``,
    ``group-names``).
    """

    def __init__(self, folder: Path, every: int, scores: KeepScores, described: dict | None = None) -> None:
        self.folder = Path(folder)
        self.every = every
        self.scores = scores
        self.described = dict(described or {})

    def files(self, server: ServerView, grid: Grid, folder: Path, summary: Mapping[str, Any], timeout: float) -> None:
        """The final model: every party saves its block, the server writes ``model.json`` and the card."""
        save_blocks(server, grid, folder, {**summary, **self.described}, self.scores.z_test, timeout)

    def end(self, server: ServerView, grid: Grid, server_round: int, timeout: float) -> None:
        if self.every <= 0 or server_round % self.every:
            return
        row = server.last_row
        metrics = {"rounds": server_round, "train_loss": _number(row["loss"]),
                   "train_max_gap": _number(row["max_gap"]), "train_gaps": row["gaps"],
                   "evaluated_on": "validation" if server.cfg.validation_fraction > 0 else "test",
                   **{f"test_{k}": _number(row.get(k)) for k in ("acc", "dfp", "dfn", "dp_diff", "eo_diff")},
                   **{f"test_{k}": _number(row[k]) for k in ("dfp_raw", "dfn_raw", "dp_diff_raw", "eo_diff_raw")
                      if k in row}}
        evaluated = self.scores.test_round == server_round
        metrics["intervals"] = final_intervals(server.labels, self.scores.z_test if evaluated else None,
                                               server.cfg.seed, server.constraint)
        _save(server, grid, self.folder, server_round, server_round, metrics, self.described, timeout)


def _save(server: ServerView, grid: Grid, folder: Path, server_round: int, checkpoint: int | None, metrics: dict,
          summary: dict, timeout: float) -> dict:
    """Ask every party to save its block of θ after ``server_round``; write the manifest and card
    into ``folder`` (the run folder) or, for a checkpoint, its ``checkpoints/round-<r>/``."""
    run_id = folder.name
    model_folder = folder / model_files.checkpoint_part(checkpoint)
    messages = [
        Message(RecordDict({SAVE_RECORD: ConfigRecord({"run-id": run_id, "run-folder": str(folder),
                                                       "round": server_round,
                                                       "checkpoint": checkpoint is not None})}),
                dst_node_id=nid, message_type=SAVE,
                group_id="save" if checkpoint is None else f"save-checkpoint-{checkpoint}")
        for nid in server.nodes
    ]
    parties = []
    for reply in server.exchange(grid, messages, timeout):
        who = server.who(reply.metadata.src_node_id)
        if array_records(reply.content) or SAVED_RECORD not in config_records(reply.content):
            raise FederationError(f"{who}: its {SAVE} reply must hold only digests, never arrays; refused")
        r = config_records(reply.content)[SAVED_RECORD]
        if str(r["run-id"]) != run_id:
            raise FederationError(f"{who} saved a block of run {r['run-id']}, this run is {run_id}")
        parties.append({k: r[k] for k in ("partition-id", "role", "model", "n-features", "block-digest",
                                          "data-digest", "preprocessing-digest")})
    parties.sort(key=lambda p: p["partition-id"])
    cfg = server.cfg
    manifest = {
        "format": model_files.FORMAT, "run-id": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "round": server_round, "checkpoint": checkpoint is not None,
        "parties": parties,
        "threshold": {"logit": 0.0, "probability": 0.5,
                      "rule": "decision 1 (positive) when sigma(z) >= 0.5, i.e. z = sum_k u_k >= 0"},
        "positive-label": positive_label(cfg),
        "groups": group_labels(cfg, summary.get("group-names")),
        # which groups the constraint pooled into one (pool-small-groups), and why; None: none
        "pooled-groups": None if server.constraint.pooling is None else server.constraint.pooling.describe(),
        # who held the groups where not the label owner: a registry's release (jobs/group_release.py) or its
        # encrypted groups (jobs/encrypted_groups.py)
        "groups-release": groups_release(server.labels, cfg),
        "fairness": cfg.fairness, "constraint": cfg.constraint, "constraint-measure": cfg.measure,
        "epsilon": cfg.epsilon, "metrics": metrics, "labels-digest": server.labels.ids_digest,
        "data": cfg.data_name,
        "config": cfg.to_flower(),
    }
    model_folder.mkdir(parents=True, exist_ok=True)
    model_files.write_json(model_folder / model_files.MANIFEST, manifest)
    model_files.write_text(model_folder / model_files.RUN_CARD, run_card(manifest, summary))
    log(INFO, "FairVFL: %d parties saved their blocks of round %d (run %s); manifest %s", len(parties),
        server_round, run_id, model_folder / model_files.MANIFEST)
    return manifest


def sensitive_line(config: dict, data: dict) -> str:
    """The card's line on whether the sensitive attribute was a model input (``sensitive-as-input``)."""
    columns = data.get("sensitive-inputs") or []
    if config.get("sensitive-as-input"):
        shown = f" (features {', '.join(f'`{c}`' for c in columns)})" if columns else ""
        return f"- sensitive attribute: a model input{shown} (`sensitive-as-input = true`, the paper's recipe)"
    return ("- sensitive attribute: not a model input (`sensitive-as-input = false`): neither its column nor a "
            "one-hot copy or source of it in the table is a feature")


def groups_release(labels, cfg) -> dict | None:
    """What the manifest says of a registry that held the groups (None: the label owner did)."""
    if labels.release is not None:
        return {"holder": "registry", "mechanism": cfg.groups_release, "epsilon-s": labels.release.epsilon,
                "keep": labels.release.keep, "release-margin": 0.0 if labels.margin is None else labels.margin.margin}
    if labels.sums is not None:
        return {"holder": "registry", "mechanism": cfg.groups_release}
    return None


def registry_line(release: dict | None) -> list[str]:
    """The card's line on who held the sensitive attribute, where a registry did."""
    if not release:
        return []
    if "epsilon-s" not in release:
        return ["- sensitive attribute: held by a registry party under its own CKKS key, not by the label owner or "
                "the server; the server computed every group figure here from the registry's sums over the groups "
                "(each with the registry's noise), never from a row's group (privacy.md#encrypted-groups-the-"
                "servers-sums-over-the-registrys-key)"]
    return [f"- sensitive attribute: held by a registry party, not by the label owner or the server; each row's group "
            f"reached the server only through randomized response at ε_S = {release['epsilon-s']:g} (kept with "
            f"probability {release['keep']:.3f}), so the group figures here are the server's corrected estimates "
            "and carry that noise" + (f"; training also constrained two standard deviations of each gap's release "
                                      f"error to {release['release-margin']:g}" if release.get("release-margin") else "")
            + " (privacy.md#a-registry-holds-the-groups)"]


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "n/a"
    return f"{100 * v:.2f}%" if pct else f"{v:.4f}"


def constrained_line(met: dict) -> list[str]:
    """The card's line naming the groups its fairness figures are over, with their test rows."""
    groups = met.get("constrained-groups")
    if not groups:
        return []
    what = "the groups the run constrained" if met.get("raw-groups") else "the groups"
    return [f"- fairness figures over {what}: "
            + ", ".join(f"{name} ({c['test_rows']} test rows)" for name, c in groups.items())]


def run_card(m: dict, summary: dict) -> str:
    """The run's model card (markdown)."""
    c, met = m["config"], m["metrics"]
    over = f", over the {len(met['constrained-groups'])} constrained groups" if met.get("raw-groups") else ""
    iv = met.get("intervals", {})

    def with_iv(key: str, value: Any, pct: bool = False) -> str:
        lo_hi = iv.get(key)
        return _fmt(value, pct) + (f" [{_fmt(lo_hi[0], pct)}, {_fmt(lo_hi[1], pct)}]" if lo_hi else "")

    data = summary.get("dataset-summary") or {}
    checkpoint = bool(m.get("checkpoint"))
    lines = [
        f"# Model card: run {m['run-id']}" + (f", checkpoint of round {m['round']}" if checkpoint else ""),
        "",
        f"FairVFL, {c['model']} model, trained {met['rounds']} rounds on `{m.get('data', c['dataset'])}` by {len(m['parties'])} "
        f"parties ({c['num-active']} active). Created {m['created']}.",
        "",
        "## Fairness constraint",
        "",
        (f"- constraint `{m['constraint']}` on `{m['constraint-measure']}`, ε = {m['epsilon']:g}" if m["fairness"]
         else "- none (fairness = false: the FedBCD baseline)"),
        "- groups: " + ", ".join(f"{k} = {v}" if k in ("a", "b") else v for k, v in m["groups"].items()),
        *([f"- {m['pooled-groups']}"] if m.get("pooled-groups") else []),
        *constrained_line(met),
        f"- decision: positive ({m['positive-label']}) when σ(z) ≥ {m['threshold']['probability']}, "
        "z = Σ_k u_k the sum of the parties' partial logits; the group column is not read to predict",
        sensitive_line(c, summary.get("dataset-summary") or {}),
        *registry_line(m.get("groups-release")),
        "",
        f"## Metrics on the {met.get('evaluated_on') or 'test'} rows (95% bootstrap intervals, "
        f"{BOOTSTRAP_REPLICATES} resamples)",
        "",
        "| metric | value |",
        "|---|---|",
        f"| accuracy | {with_iv('acc', met.get('test_acc'), pct=True)} |",
        f"| DFP = abs(FPR_a − FPR_b) | {with_iv('dfp', met.get('test_dfp'))} |",
        f"| DFN = abs(FNR_a − FNR_b) | {with_iv('dfn', met.get('test_dfn'))} |",
        f"| demographic parity difference (fairlearn's{over}) | {_fmt(met.get('test_dp_diff'))} |",
        f"| equalized odds difference (fairlearn's{over}) | {_fmt(met.get('test_eo_diff'))} |",
        *([f"| raw groups (before pooling, not constrained one by one): DFP / DFN | "
           f"{_fmt(met.get('test_dfp_raw'))} / {_fmt(met.get('test_dfn_raw'))} |",
           f"| raw groups: demographic parity / equalized odds difference (fairlearn's) | "
           f"{_fmt(met.get('test_dp_diff_raw'))} / {_fmt(met.get('test_eo_diff_raw'))} |"]
          if met.get("test_dp_diff_raw") is not None else []),
        f"| train: largest constrained gap ({m['constraint']} on {m['constraint-measure']}) | "
        f"{_fmt(met.get('train_max_gap'))} |",
        *([f"| train: demographic parity / equalized odds difference (fairlearn's, hard predictions) | "
           f"{_fmt(met['train_dp_diff'])} / {_fmt(met.get('train_eo_diff'))} |"] if met.get("train_dp_diff") is not None
          else []),
        *([f"| train, raw groups: demographic parity / equalized odds difference (fairlearn's, hard predictions) | "
           f"{_fmt(met['train_dp_diff_raw'])} / {_fmt(met.get('train_eo_diff_raw'))} |"]
          if met.get("train_dp_diff_raw") is not None else []),
        "",
    ]
    if met.get("groups"):
        lines += [("Per data group" + (" (the raw groups)" if met.get("raw-groups") else "")
                   + (": DFP and DFN above are the largest pairwise gaps" if len(met["groups"]) > 2 else "") + ":"), "",
                  "| group | test rows | error | FPR | FNR |", "|---|---|---|---|---|"]
        lines += [f"| {g} | {r['rows']} | {_fmt(r['error'])} | {_fmt(r['fpr'])} | {_fmt(r['fnr'])} |"
                  for g, r in met["groups"].items()]
        lines.append("")
    if data:
        lines += [f"Data: {data.get('train', {}).get('rows')} training rows, {data.get('test', {}).get('rows')} "
                  f"test rows, {data.get('features')} features.", ""]
    lines += [
        "## Parties: what each one holds",
        "",
        "Each party keeps its block θ_k, its preprocessing (raw columns, categories, means and deviations) and its "
        "own card on its own disk; the server holds this card, `model.json` (digests only), the labels and groups "
        "of the training rows, and no feature or weight.",
        "",
        "| partition | role | model | features | block digest | training rows digest |",
        "|---|---|---|---|---|---|",
    ]
    for p in m["parties"]:
        lines.append(f"| {p['partition-id']} | {p['role']} | {p['model']} | {p['n-features']} | "
                     f"`{p['block-digest']}` | `{p['data-digest']}` |")
    lines += [
        "",
        "## Scoring",
        "",
        f"`flwr run . --run-config \"mode='score' score.model-from='<the run folder>'"
        + (f" score.round={m['round']}" if checkpoint else "") + "\"` (docs/scoring.md): every "
        "party must be online; each returns partial logits on its own columns, the server writes "
        "`predictions.csv` (id, probability, decision).",
        "",
    ]
    return "\n".join(lines)


# -- the parties' handler ---------------------------------------------------------------
def save(message: Message, context: Context) -> Message:
    """Save this party's block, preprocessing and card on its own disk; reply digests only."""
    rt = PartyRuntime(context)
    rc = config_records(message.content)[SAVE_RECORD]
    if rt.model_state() is None:
        raise model_files.BlockError(f"{rt.who}: no trained model on this node to save")
    state = rt.party(steps=False).block.weights()  # θ only: a step rule's state stays with the run
    cfg = rt.cfg
    spec = rt.spec  # with tables.own, the block prepared at alignment
    pre = party_preprocessing(spec, cfg)
    arrays = {k: np.asarray(v) for k, v in state.items()}
    n_features = int(rt.data.X_train.shape[1])
    if len(pre.features) != n_features:
        raise model_files.BlockError(f"{rt.who}: preprocessing describes {len(pre.features)} features, the block "
                                f"has {n_features}")
    run_id = str(rc["run-id"])
    server_round, checkpoint = int(rc["round"]), bool(rc.get("checkpoint", False))
    folder = model_files.block_folder(rt.node, str(rc["run-folder"]), run_id, spec.partition_id,
                                      checkpoint=server_round if checkpoint else None)
    meta = {
        "run-id": run_id, "partition-id": spec.partition_id, "role": rt.data.role, "model": cfg.model,
        "hidden": cfg.hidden, "dtype": cfg.dtype, "n-features": n_features, "round": server_round,
        "checkpoint": checkpoint, "secure-aggregation": cfg.masked,
        "data-digest": rt.data.ids_digest, "source": spec.data_path or (table_source(spec).name if spec.table_path or spec.table_sql
                                                      else f"{cfg.data_name} (packaged)"),
        "preprocessing": pre.to_dict(),
    }
    digest = model_files.save_block(folder, arrays, meta, model_files.party_card({**meta, "block-digest": model_files.block_digest(arrays)}, arrays))
    return Message(RecordDict({SAVED_RECORD: ConfigRecord({
        "run-id": run_id, "partition-id": spec.partition_id, "role": rt.data.role, "model": cfg.model,
        "n-features": n_features, "block-digest": digest, "data-digest": rt.data.ids_digest,
        "preprocessing-digest": pre.digest(),
    })}), reply_to=message)


#: Saving the model (after a training run and at its checkpoints).
JOB = Job("saving", handlers({SAVE: Handles(msgs.Kind.QUERY, save, in_view=False)}))
