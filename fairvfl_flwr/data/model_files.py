"""The files a trained model leaves: each party's block on its own disk, the server's manifest.

A party's folder (``<model-dir>/<run id>/partition-<k>/`` in deployment, node config
``model-dir``; ``<run folder>/parties/partition-<k>/`` in simulation)::

    block.npz    θ_k as numpy arrays, named as the model's state_dict (linear: weight,
                 bias on active parties; mlp: net.0.weight, net.0.bias, ...)
    block.json   run id, partition, role, model kind, feature names, the party's
                 preprocessing (data/encoding.py), its training rows' digest, the
                 block's digest
    card.md      the party's own model card (its columns' weights, for a linear block)

The server's run folder holds ``model.json`` (the manifest: parties, block digests,
threshold, constraint, ε, final metrics, config) and ``model-card.md``. No block ever
reaches the server: a party reports only its block's digest.

A checkpoint of round r (``reliability.checkpoint-every``) is a model of its own, in
``checkpoints/round-<r>/`` below both: the server's ``<run folder>/checkpoints/round-<r>/``
(manifest and card) and each party's ``<model-dir>/<run id>/checkpoints/round-<r>/partition-<k>/``
(deployment) or ``<run folder>/checkpoints/round-<r>/parties/partition-<k>/`` (simulation).

numpy only (no torch, no Flower): the block is read back into a model by the party.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Mapping

import numpy as np

from fairvfl_flwr.config.node import NodeConfig

BLOCK = "block.npz"
BLOCK_META = "block.json"
PARTY_CARD = "card.md"
MANIFEST = "model.json"
RUN_CARD = "model-card.md"
PARTIES = "parties"
CHECKPOINTS = "checkpoints"
FORMAT = 1


class BlockError(RuntimeError):
    """A saved block or manifest is missing, damaged, or does not fit the job."""


def block_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over the arrays' names, dtypes, shapes and bytes (order-independent)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def checkpoint_part(checkpoint: int | None) -> Path:
    """The relative folder of a checkpoint's model (empty for the final model)."""
    return Path() if checkpoint is None else Path(CHECKPOINTS) / f"round-{int(checkpoint)}"


def block_folder(node: NodeConfig, run_folder: str, run_id: str, partition_id: int,
                 checkpoint: int | None = None) -> Path:
    """Where this party keeps its block of run ``run_id`` (see the module doc); ``checkpoint``:
    the round of a checkpoint's block, None for the final one.

    A node that trains on a file of its own without ``model-dir``: ``models/<run id>/partition-<k>``
    in its own folder (node config ``cache-dir``).
    """
    part = checkpoint_part(checkpoint)
    if node.model_dir:
        return Path(node.model_dir).expanduser() / run_id / part / f"partition-{partition_id}"
    if node.has_table:
        return node.folder / "models" / run_id / part / f"partition-{partition_id}"
    if not run_folder:
        raise BlockError(f"partition {partition_id}: no model-dir in the node config and no run folder in the message")
    return Path(run_folder) / part / PARTIES / f"partition-{partition_id}"


def checkpoint_rounds(run_folder: str | Path) -> list[int]:
    """The rounds whose checkpoint has a manifest in the run folder, ascending."""
    root = Path(run_folder) / CHECKPOINTS
    found = []
    for p in root.glob("round-*") if root.is_dir() else ():
        r = p.name.split("-", 1)[1]
        if r.isdigit() and (p / MANIFEST).is_file():
            found.append(int(r))
    return sorted(found)


def read_model(model_from: str | Path, round_: int, what: str = "score.model-from") -> tuple[dict, Path, int | None]:
    """The manifest of the model to score: (manifest, training run folder, checkpoint round or None).

    ``round_`` < 0: the final model of ``model_from``, or, when ``model_from`` is a
    checkpoint's own folder, that checkpoint; else the checkpoint of that round.
    """
    model_from = Path(model_from).expanduser().resolve()
    if round_ < 0:
        manifest = read_manifest(model_from, what)
        if manifest.get("checkpoint"):
            return manifest, model_from.parents[1], int(manifest["round"])
        return manifest, model_from, None
    folder = model_from / checkpoint_part(round_)
    if not (folder / MANIFEST).is_file():
        have = checkpoint_rounds(model_from)
        raise BlockError(f"score.round={round_}: the run folder {model_from} has no checkpoint of round {round_} "
                         f"(its checkpoints: {', '.join(map(str, have)) if have else 'none'}; a run writes one every "
                         "reliability.checkpoint-every rounds, and round 0)")
    return read_manifest(folder, what), model_from, round_


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        write(fh)
    os.replace(tmp, path)


def save_block(folder: Path, arrays: Mapping[str, np.ndarray], meta: dict, card: str) -> str:
    """Write the block, its metadata and the party's card; return the block digest."""
    folder.mkdir(parents=True, exist_ok=True)
    digest = block_digest(arrays)
    meta = {**meta, "format": FORMAT, "block-digest": digest, "saved-at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    _atomic_write(folder / BLOCK, lambda fh: np.savez(fh, **{k: np.asarray(v) for k, v in arrays.items()}))
    _atomic_write(folder / BLOCK_META, lambda fh: fh.write((json.dumps(meta, indent=1) + "\n").encode()))
    _atomic_write(folder / PARTY_CARD, lambda fh: fh.write(card.encode()))
    return digest


def load_block(folder: Path, who: str) -> tuple[dict[str, np.ndarray], dict]:
    """The block and its metadata; the digest is checked against the file's content."""
    if not (folder / BLOCK).is_file() or not (folder / BLOCK_META).is_file():
        raise BlockError(f"{who}: no saved block in {folder} (missing {BLOCK} or {BLOCK_META})")
    try:
        meta = json.loads((folder / BLOCK_META).read_text())
        with np.load(folder / BLOCK, allow_pickle=False) as f:
            arrays = {k: f[k].copy() for k in f.files}
    except Exception as exc:  # noqa: BLE001  (a damaged file is reported, never half-used)
        raise BlockError(f"{who}: the block in {folder} cannot be read: {exc}") from None
    if block_digest(arrays) != meta.get("block-digest"):
        raise BlockError(f"{who}: {folder / BLOCK} does not match the digest in {BLOCK_META} (changed after saving?)")
    return arrays, meta


def party_card(meta: dict, arrays: Mapping[str, np.ndarray]) -> str:
    """The party's own model card: what it holds; for a linear block, each column's weight."""
    pre = meta["preprocessing"]
    lines = [
        f"# Party {meta['partition-id']} ({meta['role']}): block of run {meta['run-id']}"
        + (f", checkpoint of round {meta['round']}" if meta.get("checkpoint") else ""),
        "",
        "This card stays with the party, next to its block; the server never receives either.",
        "",
        f"- model: {meta['model']}" + (f" (hidden {meta['hidden']})" if meta["model"] == "mlp" else ""),
        f"- features: {len(pre['features'])}, from raw columns: {', '.join(dict.fromkeys(pre['raw']))}",
        f"- training rows digest: {meta['data-digest']}",
        f"- block digest: {meta['block-digest'] if 'block-digest' in meta else block_digest(arrays)}",
        "- parameters: " + ", ".join(f"{k} {list(np.shape(v))}" for k, v in arrays.items()),
        "",
    ]
    if pre.get("protected"):
        lines += ["Protected columns (the sensitive column, node config protected-columns) and whether each was a "
                  "model input (run config sensitive-as-input):", "", "| protected column | model input |", "|---|---|",
                  *(f"| {c} | {'yes' if used else 'no'} |" for c, used in pre["protected"].items()), ""]
    if meta["model"] == "linear":
        w = np.asarray(arrays["weight"], dtype=np.float64)
        lines += ["Weights on the standardised features (feature = (raw − mean) / std), largest first:", "",
                  "| feature | raw column | category | mean | std | weight |", "|---|---|---|---|---|---|"]
        for j in np.argsort(-np.abs(w), kind="stable"):
            cat = pre["category"][j]
            lines.append(f"| {pre['features'][j]} | {pre['raw'][j]} | {'' if cat is None else cat} | "
                         f"{pre['mean'][j]:.6g} | {pre['std'][j]:.6g} | {w[j]:+.6f} |")
        if "bias" in arrays:
            lines += ["", f"Intercept: {float(np.asarray(arrays['bias'])):+.6f}"]
        lines.append("")
    return "\n".join(lines)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a reader never sees half a file)."""
    _atomic_write(path, lambda fh: fh.write(text.encode()))


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` as indented JSON to ``path``, whole or not at all."""
    _atomic_write(path, lambda fh: fh.write((json.dumps(data, indent=1, default=str) + "\n").encode()))


def read_manifest(folder: str | Path, what: str = "score.model-from") -> dict:
    """The manifest of a training run's folder, refused naming ``what`` when the folder holds none or a broken one."""
    path = Path(folder).expanduser() / MANIFEST
    if not path.is_file():
        raise BlockError(f"{what}={str(folder)!r}: no {MANIFEST} there (is it the run folder of a finished "
                         "training run?)")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise BlockError(f"{path} cannot be read: {exc}") from None
