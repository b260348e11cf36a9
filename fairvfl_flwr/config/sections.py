"""What no single setting's declaration can say: keys one mode or dataset requires, and
the combinations of settings that cannot run together (:data:`REFUSED`, one table).

Each setting's own key, section, default and allowed values are declared on
:class:`~fairvfl_flwr.config.run.RunConfig`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fairvfl_flwr.config import algorithms
from fairvfl_flwr.core.constraints.release import ENCRYPTED, RANDOMIZED_RESPONSE
from fairvfl_flwr.core.errors import ConfigError

def bad(cfg: Any, field: str, why: str) -> ConfigError:
    """The ConfigError for one setting: its run-config key, its value and why it is refused."""
    return ConfigError(f"run config {cfg.key_of(field)}={getattr(cfg, field)!r}: {why}")


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


def delays_refusal(text: str) -> str | None:
    """Why a ``staleness.straggler-delays`` text cannot be read, or None when it can."""
    try:
        parse_delays(text)
    except DelayError as exc:
        return str(exc)
    return None


_CSV_REQUIRED = ("csv_path", "csv_label", "csv_positive", "csv_sensitive")
_SCORE_ONLY = (("score_model_from", ""), ("score_round", -1), ("score_path", ""))


def check_conditional(c: Any) -> None:
    """Keys that one mode or dataset requires, or that only one mode reads."""
    if c.straggler_delays:
        why = delays_refusal(c.straggler_delays)
        if why:
            raise ConfigError(f"run config staleness.{why}")
    if c.dataset == "csv" and not c.server_labels:
        for field in _CSV_REQUIRED:
            if not getattr(c, field):
                raise bad(c, field, "required when dataset='csv'")
        if bool(c.csv_group_a) != bool(c.csv_group_b):
            raise bad(c, "csv_group_b" if c.csv_group_a else "csv_group_a",
                      "give both group values (two groups) or neither (every value of csv.sensitive is a group)")
    if c.registry and c.num_parties <= c.num_active:
        raise bad(c, "num_parties", f"groups.holder='registry' needs a party besides the {c.num_active} active "
                  "one(s): the registry is the last partition, a feature holder that also holds the groups")
    if c.registry and c.groups_release == RANDOMIZED_RESPONSE and c.groups_release_margin > 0 and c.epsilon <= 0:
        raise bad(c, "groups_release_margin", "needs epsilon > 0: the release's error is held within epsilon's "
                  "scale (privacy.md#a-registry-holds-the-groups); set it to 0 with epsilon = 0")
    if c.mode == "score" and not c.score_model_from:
        raise bad(c, "score_model_from", "mode='score' needs the training run folder whose model scores "
                  "(the folder with model.json)")
    for field, unset in _SCORE_ONLY:
        if c.mode != "score" and getattr(c, field) != unset:
            raise bad(c, field, f"is read only with mode='score' (mode is {c.mode!r})")


_FULL_BATCH = "use batching.batch-size=0 (full batch) with it"
_SYNC = "(a stale party's θ and the server's round differ); use staleness.max-staleness=0"

#: Refused combinations: (setting, is it on?, other setting, is it on?, why). The error
#: names the first setting and its value, then the other. What an algorithm cannot run
#: with is its own declaration's (config/algorithms.refused adds those rows).
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
    ("batch_size", lambda c: c.batch_size > 0, "transcript_dir", lambda c: bool(c.transcript_dir), _FULL_BATCH),
    ("label_dp_epsilon", lambda c: c.label_dp_epsilon > 0, "batch_size", lambda c: c.batch_size > 0,
     "the sensitivity and the accountant assume every round releases ν on all rows; " + _FULL_BATCH),
    ("secure_aggregation", lambda c: c.masked, "max_staleness", lambda c: c.max_staleness > 0,
     "masks cancel only in the sum of every party's reply to the same round; use staleness.max-staleness=0"),
    ("rejoin_timeout", lambda c: c.rejoin_wait > 0, "max_staleness", lambda c: c.max_staleness > 0, _SYNC),
    ("rejoin_timeout", lambda c: c.rejoin_wait > 0, "batch_size", lambda c: c.batch_size > 0, _FULL_BATCH),
    ("rejoin_timeout", lambda c: c.rejoin_wait > 0, "secure_nu", lambda c: c.secure_nu != "none",
     "an encrypted round's second leg is not restored when a party comes back; use privacy.secure-nu='none' "
     "(secure aggregation rejoins)"),
    ("resume_from", lambda c: bool(c.resume_from), "secure_nu", lambda c: c.secure_nu != "none",
     "an encrypted round's second leg is not part of a party's stored state; use privacy.secure-nu='none'"),
    ("groups_holder", lambda c: c.registry, "batch_size", lambda c: c.batch_size > 0,
     "the label owner's row weights and the corrected group sizes are over every training row; " + _FULL_BATCH),
    ("groups_holder", lambda c: c.registry, "label_dp_epsilon", lambda c: c.label_dp_epsilon > 0,
     "label DP's sensitivity assumes exact groups (row weights 1/|group|); the released groups' corrected weights "
     "are larger: use privacy.label-dp-epsilon=0"),
    ("groups_holder", lambda c: c.registry, "mode", lambda c: c.mode == "split",
     "the split-learning baseline has no fairness constraint to hold on the registry's groups"),
    ("groups_holder", lambda c: c.registry, "sensitive_as_input", lambda c: c.sensitive_as_input,
     "the sensitive attribute is the registry's alone: no party's features may carry it"),
    ("groups_holder", lambda c: c.registry, "server_labels", lambda c: bool(c.server_labels),
     "the server's label file holds every row's group, which a registry run keeps from the server"),
    ("groups_release", lambda c: c.groups_release == ENCRYPTED, "secure_nu", lambda c: c.secure_nu != "none",
     "every party's nu goes under the registry's key already; use privacy.secure-nu='none'"),
    ("groups_release", lambda c: c.groups_release == ENCRYPTED, "nu_noise", lambda c: c.nu_noise > 0,
     "the server sends nu only under the registry's key; use privacy.nu-noise=0"),
    ("groups_release", lambda c: c.groups_release == ENCRYPTED, "model", lambda c: c.model != "linear",
     "a party's gradient under encryption is X_k^T nu: linear models only"),
    ("groups_release", lambda c: c.groups_release == ENCRYPTED, "checkpoint_every", lambda c: c.checkpoint_every > 0,
     "a round's legs through the registry are not part of a checkpoint; use reliability.checkpoint-every=0"),
    ("groups_release", lambda c: c.groups_release == ENCRYPTED, "resume_from", lambda c: bool(c.resume_from),
     "a round's legs through the registry are not part of a checkpoint"),
    ("groups_release", lambda c: c.groups_release == ENCRYPTED, "rejoin_timeout", lambda c: c.rejoin_wait > 0,
     "a round's legs through the registry are not restored when a party comes back; use reliability.rejoin-timeout=0"),
    ("groups_release", lambda c: c.groups_release == ENCRYPTED, "max_staleness", lambda c: c.max_staleness > 0,
     "every party's legs of a round go through the registry together; use staleness.max-staleness=0"),
    ("groups_release", lambda c: c.groups_release == ENCRYPTED, "local_time_budget", lambda c: c.local_time_budget > 0,
     "the label owner's steps each wait for the registry's sums; use staleness.local-time-budget=0"),
]


def refused_combinations() -> list[tuple[str, Callable[[Any], bool], str, Callable[[Any], bool], str]]:
    """:data:`REFUSED` and every registered algorithm's refusals (config/algorithms.py)."""
    return REFUSED + algorithms.refused()


def check_combinations(c: Any) -> None:
    """Refuse the first pair of settings that cannot run together (:func:`refused_combinations`),
    naming both keys and why."""
    for field, on, other, other_on, why in refused_combinations():
        if on(c) and other_on(c):
            raise bad(c, field, f"not supported with {c.key_of(other)}={getattr(c, other)!r}: {why}")


def refused_with(key_of: Callable[[str], str]) -> dict[str, list[str]]:
    """field -> the keys it cannot run with, both ways round (the docs list them under each key)."""
    out: dict[str, list[str]] = {}
    for field, _, other, _, _ in refused_combinations():
        for a, b in ((field, other), (other, field)):
            if key_of(b) not in out.setdefault(a, []):
                out[a].append(key_of(b))
    return out
