"""The run config's sections: which keys each feature owns, their checks, the refusals.

Everyday keys (dataset, model, epsilon, num-server-rounds, seed, ...) are flat in
``[tool.flwr.app.config]``. Feature options live in Flower's nested tables
``[tool.flwr.app.config.<section>]``, which Flower flattens to dotted keys
(``privacy.secure-nu``); ``--run-config "privacy.secure-nu='ckks'"`` sets one. Each
section is validated on its own (:data:`CHECKS`); combinations of sections that cannot
run together are one table (:data:`REFUSED`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from fairvfl_flwr.core.errors import ConfigError

# section -> {key in the section: RunConfig field}
SECTIONS: dict[str, dict[str, str]] = {
    "privacy": {"secure-nu": "secure_nu", "nu-noise": "nu_noise", "record-view": "record_view",
                "record-every": "record_every", "record-first": "record_first", "transcript-dir": "transcript_dir",
                "secure-aggregation": "secure_aggregation", "label-dp-epsilon": "label_dp_epsilon",
                "label-dp-delta": "label_dp_delta", "label-dp-lambda-bound": "label_dp_lambda_bound",
                "label-dp-min-group": "label_dp_min_group"},
    "reliability": {"round-timeout": "round_timeout", "round-retries": "round_retries",
                    "checkpoint-every": "checkpoint_every", "checkpoint-dir": "checkpoint_dir",
                    "resume-from": "resume_from"},
    "staleness": {"max-staleness": "max_staleness", "quorum": "quorum", "local-time-budget": "local_time_budget",
                  "straggler-delays": "straggler_delays"},
    "batching": {"batch-size": "batch_size"},
    "csv": {"path": "csv_path", "label": "csv_label", "positive": "csv_positive", "sensitive": "csv_sensitive",
            "group-a": "csv_group_a", "group-b": "csv_group_b", "protected-label": "csv_protected_label",
            "id-column": "csv_id_column", "train-fraction": "csv_train_fraction"},
    "split": {"embedding": "split_embedding", "lr": "split_lr"},
    "score": {"model-from": "score_model_from", "chunk-rows": "score_chunk_rows", "round": "score_round",
              "path": "score_path"},
}
#: RunConfig field -> its dotted key.
KEY_OF: dict[str, str] = {field: f"{sec}.{key}" for sec, keys in SECTIONS.items() for key, field in keys.items()}
#: Flat keys of earlier versions -> their dotted key now.
MOVED: dict[str, str] = {field.replace("_", "-"): dotted for field, dotted in KEY_OF.items()}


def key(field: str) -> str:
    """The run-config key of a RunConfig field (``batch_size`` -> ``batching.batch-size``)."""
    return KEY_OF.get(field, field.replace("_", "-"))


def bad(cfg: Any, field: str, why: str) -> ConfigError:
    return ConfigError(f"run config {key(field)}={getattr(cfg, field)!r}: {why}")


class DelayError(ValueError):
    """A straggler-delay setting that cannot be read."""


def parse_delays(text: str) -> dict[int, tuple[float, float]]:
    """``"2=0.3~0.1,4=0.05"`` → {2: (0.3, 0.1), 4: (0.05, 0.0)}."""
    out: dict[int, tuple[float, float]] = {}
    for item in filter(None, (part.strip() for part in str(text).split(","))):
        try:
            pid, _, value = item.partition("=")
            base, _, jitter = value.partition("~")
            delay = (float(base), float(jitter or 0.0))
            out[int(pid)] = delay
        except ValueError:
            raise DelayError(f"straggler-delays item {item!r}: write partition=seconds or partition=seconds~jitter") from None
        if min(delay) < 0:
            raise DelayError(f"straggler-delays item {item!r}: seconds must be >= 0")
    return out


def check_privacy(c: Any) -> None:
    if c.nu_noise < 0:
        raise bad(c, "nu_noise", "must be >= 0")
    if c.secure_nu not in ("none", "ckks"):
        raise bad(c, "secure_nu", "choose 'none' (plain ν) or 'ckks' (encrypted ν, linear models)")
    if c.secure_nu == "ckks" and importlib.util.find_spec("tenseal") is None:
        raise bad(c, "secure_nu", "needs TenSEAL: pip install 'fairvfl-flwr[privacy]'")
    if c.label_dp_epsilon < 0:
        raise bad(c, "label_dp_epsilon", "must be >= 0 (0: no label DP)")
    if not 0 < c.label_dp_delta < 1:
        raise bad(c, "label_dp_delta", "must be between 0 and 1 (exclusive), e.g. 1e-5")
    if c.label_dp_lambda_bound <= 0:
        raise bad(c, "label_dp_lambda_bound", "must be > 0 (the multipliers are clipped to [0, bound])")
    if c.label_dp_min_group < 0:
        raise bad(c, "label_dp_min_group", "must be >= 0 rows (0: the data's smallest group - 1)")
    if c.label_dp_epsilon > 0 and importlib.util.find_spec("opacus") is None:
        raise bad(c, "label_dp_epsilon", "needs Opacus's accountant: pip install 'fairvfl-flwr[privacy]'")
    if c.record_every < 0:
        raise bad(c, "record_every", "must be >= 0 (0 = only the first rounds)")
    if c.record_first < 0:
        raise bad(c, "record_first", "must be >= 0 (rounds 1..record-first are all recorded)")


def check_reliability(c: Any) -> None:
    if c.round_timeout <= 0:
        raise bad(c, "round_timeout", "must be > 0 seconds")
    if c.round_retries < 0:
        raise bad(c, "round_retries", "must be >= 0 (0: no second try)")
    if c.checkpoint_every < 0:
        raise bad(c, "checkpoint_every", "must be >= 0 (0: no checkpoints)")


def check_staleness(c: Any) -> None:
    if c.local_time_budget < 0:
        raise bad(c, "local_time_budget", "must be >= 0 seconds (0: always local-steps steps)")
    if c.max_staleness < 0:
        raise bad(c, "max_staleness", "must be >= 0 rounds (0: synchronous)")
    if not 0 <= c.quorum <= c.num_parties:
        raise bad(c, "quorum", f"must be between 0 (num-parties - 1) and num-parties ({c.num_parties})")
    try:
        parse_delays(c.straggler_delays)
    except DelayError as exc:
        raise ConfigError(f"run config staleness.{exc}") from None


def check_batching(c: Any) -> None:
    if c.batch_size < 0:
        raise bad(c, "batch_size", "must be >= 0 rows (0: full batch)")


def check_csv(c: Any) -> None:
    if c.dataset != "csv" or c.server_labels:
        return
    for field in ("csv_path", "csv_label", "csv_positive", "csv_sensitive", "csv_group_a", "csv_group_b"):
        if not getattr(c, field):
            raise bad(c, field, "required when dataset='csv'")
    if c.csv_protected_label not in (-1, 1):
        raise bad(c, "csv_protected_label", "must be 1 (positive label) or -1")
    if not 0 < c.csv_train_fraction < 1:
        raise bad(c, "csv_train_fraction", "must be between 0 and 1")


def check_split(c: Any) -> None:
    if c.split_embedding < 1:
        raise bad(c, "split_embedding", "must be at least 1")
    if c.split_lr < 0:
        raise bad(c, "split_lr", "must be > 0 (or 0: 1/eta)")


def check_score(c: Any) -> None:
    if c.score_chunk_rows < 1:
        raise bad(c, "score_chunk_rows", "must be at least 1 row")
    if c.mode == "score" and not c.score_model_from:
        raise bad(c, "score_model_from", "mode='score' needs the training run folder whose model scores "
                  "(the folder with model.json)")
    if c.score_round < -1:
        raise bad(c, "score_round", "must be -1 (the final model) or a checkpoint's round >= 0")
    for field, unset in (("score_model_from", ""), ("score_round", -1), ("score_path", "")):
        if c.mode != "score" and getattr(c, field) != unset:
            raise bad(c, field, f"is read only with mode='score' (mode is {c.mode!r})")


CHECKS: dict[str, Callable[[Any], None]] = {
    "privacy": check_privacy, "reliability": check_reliability, "staleness": check_staleness,
    "batching": check_batching, "csv": check_csv, "split": check_split, "score": check_score,
}

_FULL_BATCH = "use batching.batch-size=0 (full batch) with it"
_SYNC = "(a stale party's θ and the server's round differ); use staleness.max-staleness=0"
_SPLIT = "the split-learning baseline runs plain, synchronous, full-batch rounds"

#: Refused combinations: (setting, is it on?, other setting, is it on?, why). The error
#: names the first setting and its value, then the other.
REFUSED: list[tuple[str, Callable[[Any], bool], str, Callable[[Any], bool], str]] = [
    ("batch_size", lambda c: c.batch_size > 0, "max_staleness", lambda c: c.max_staleness > 0, _FULL_BATCH),
    ("batch_size", lambda c: c.batch_size > 0, "secure_nu", lambda c: c.secure_nu != "none", _FULL_BATCH),
    ("batch_size", lambda c: c.batch_size > 0, "checkpoint_every", lambda c: c.checkpoint_every > 0, _FULL_BATCH),
    ("batch_size", lambda c: c.batch_size > 0, "resume_from", lambda c: bool(c.resume_from), _FULL_BATCH),
    ("batch_size", lambda c: c.batch_size > 0, "record_view", lambda c: bool(c.record_view), _FULL_BATCH),
    ("secure_nu", lambda c: c.secure_nu == "ckks", "model", lambda c: c.model != "linear",
     "encrypted ν needs model='linear' (the homomorphic J_kᵀν = X_kᵀν is linear only); "
     "use privacy.secure-nu='none' or privacy.nu-noise for the MLP"),
    ("secure_nu", lambda c: c.secure_nu != "none", "max_staleness", lambda c: c.max_staleness > 0, _SYNC),
    ("checkpoint_every", lambda c: c.checkpoint_every > 0, "max_staleness", lambda c: c.max_staleness > 0, _SYNC),
    ("resume_from", lambda c: bool(c.resume_from), "max_staleness", lambda c: c.max_staleness > 0, _SYNC),
    ("validation_fraction", lambda c: c.validation_fraction > 0, "server_labels", lambda c: bool(c.server_labels),
     "deployed party files carry only a train/test split; choose epsilon in simulation with "
     "python -m fairvfl_flwr.tools.epsweep"),
    ("batch_size", lambda c: c.batch_size > 0, "mode", lambda c: c.mode == "split", _SPLIT),
    ("secure_nu", lambda c: c.secure_nu != "none", "mode", lambda c: c.mode == "split", _SPLIT),
    ("nu_noise", lambda c: c.nu_noise > 0, "mode", lambda c: c.mode == "split", _SPLIT),
    ("max_staleness", lambda c: c.max_staleness > 0, "mode", lambda c: c.mode == "split", _SPLIT),
    ("checkpoint_every", lambda c: c.checkpoint_every > 0, "mode", lambda c: c.mode == "split", _SPLIT),
    ("resume_from", lambda c: bool(c.resume_from), "mode", lambda c: c.mode == "split", _SPLIT),
    ("record_view", lambda c: bool(c.record_view), "mode", lambda c: c.mode == "split", _SPLIT),
    ("batch_size", lambda c: c.batch_size > 0, "transcript_dir", lambda c: bool(c.transcript_dir), _FULL_BATCH),
    ("transcript_dir", lambda c: bool(c.transcript_dir), "mode", lambda c: c.mode == "split", _SPLIT),
    ("label_dp_epsilon", lambda c: c.label_dp_epsilon > 0, "batch_size", lambda c: c.batch_size > 0,
     "the sensitivity and the accountant assume every round releases ν on all rows; " + _FULL_BATCH),
    ("label_dp_epsilon", lambda c: c.label_dp_epsilon > 0, "mode", lambda c: c.mode == "split", _SPLIT),
    ("secure_aggregation", lambda c: c.secure_aggregation, "max_staleness", lambda c: c.max_staleness > 0,
     "masks cancel only in the sum of every party's reply to the same round; use staleness.max-staleness=0"),
    ("secure_aggregation", lambda c: c.secure_aggregation, "resume_from", lambda c: bool(c.resume_from),
     "a resumed run restores per-party logits, which a masked run never had; start the run afresh"),
    ("secure_aggregation", lambda c: c.secure_aggregation, "mode", lambda c: c.mode == "split", _SPLIT),
    ("secure_aggregation", lambda c: c.secure_aggregation, "mode", lambda c: c.mode == "score",
     "scoring replies are not masked (no pair keys are agreed in a scoring job); score with "
     "privacy.secure-aggregation=false"),
]


_NEWTON = "optimizer='newton' is block Newton for linear parties on full batches (docs/newton.md); use optimizer='gd'"

#: What optimizer='newton' cannot run with: (setting, is it on?, why). optimizer='auto'
#: falls back to gradient descent where one of these holds (:func:`newton_refusal`).
NEWTON_REFUSED: list[tuple[str, Callable[[Any], bool], str]] = [
    ("model", lambda c: c.model != "linear",
     "a block Newton direction is computed for a linear block (an MLP would need its Jacobian); " + _NEWTON),
    ("batch_size", lambda c: c.batch_size > 0,
     "the subspace search evaluates the objective on every training row, and the last moves it searches along "
     "lose their meaning when the rows change each round; use batching.batch-size=0 or optimizer='gd'"),
    ("max_staleness", lambda c: c.max_staleness > 0,
     "the subspace search combines every party's direction of the same round; use staleness.max-staleness=0"),
    ("local_time_budget", lambda c: c.local_time_budget > 0,
     "the active party computes one Newton direction per round, not a number of gradient steps; "
     "use staleness.local-time-budget=0"),
    ("checkpoint_every", lambda c: c.checkpoint_every > 0,
     "a party's checkpoint holds θ only, not the directions and last moves a Newton round continues from; "
     "use reliability.checkpoint-every=0 or optimizer='gd'"),
    ("resume_from", lambda c: bool(c.resume_from),
     "Newton runs are not checkpointed (a party's pending directions are not saved); start the run afresh"),
    ("mode", lambda c: c.mode == "split", "the split-learning baseline has its own SGD steps; use optimizer='gd'"),
]
REFUSED += [("optimizer", lambda c: c.optimizer == "newton", other, on, why) for other, on, why in NEWTON_REFUSED]


_ADAGRAD = "optimizer='adagrad' is per-coordinate adaptive steps for MLP parties (docs/adagrad.md); use optimizer='gd'"

#: What optimizer='adagrad' cannot run with: (setting, is it on?, why). optimizer='auto'
#: falls back to gradient descent where one of these holds (:func:`adagrad_refusal`).
ADAGRAD_REFUSED: list[tuple[str, Callable[[Any], bool], str]] = [
    ("model", lambda c: c.model == "linear",
     "a linear party's problem is convex and block Newton solves it in tens of rounds; use optimizer='newton' "
     "(or 'auto') for a linear model, or optimizer='gd'"),
    ("mode", lambda c: c.mode == "split", "the split-learning baseline has its own SGD steps; " + _ADAGRAD),
]
REFUSED += [("optimizer", lambda c: c.optimizer == "adagrad", other, on, why) for other, on, why in ADAGRAD_REFUSED]


def _first(table: list[tuple[str, Callable[[Any], bool], str]], c: Any) -> tuple[str, str] | None:
    for other, on, why in table:
        if on(c):
            return other, why
    return None


def newton_refusal(c: Any) -> tuple[str, str] | None:
    """(setting, why) of the first setting of ``c`` that rules block Newton out, or None."""
    return _first(NEWTON_REFUSED, c)


def adagrad_refusal(c: Any) -> tuple[str, str] | None:
    """(setting, why) of the first setting of ``c`` that rules AdaGrad out, or None."""
    return _first(ADAGRAD_REFUSED, c)


def check_combinations(c: Any) -> None:
    for field, on, other, other_on, why in REFUSED:
        if on(c) and other_on(c):
            raise bad(c, field, f"not supported with {key(other)}={getattr(c, other)!r}: {why}")
