"""The scoring job's configuration (``mode = "score"``): the training settings it adopts from
its model, declared once (:data:`ADOPTED`), and :class:`ScoringJob`, the job's run config with
those settings adopted, parsed once per run.

A scoring job's run config names the mode, the model and the files (``score.*``); what shapes
the model and the rows each party reads comes from the model's manifest. The ServerApp builds
the job from the manifest (jobs/scoring.py); every message of the job carries the adopted
settings, and each party builds the same job once from its own run config and them
(flower/party.py, ``PartyRuntime.cfg``): no one rewrites Flower's run config.
``python -m fairvfl_flwr.config --write`` writes the table of :data:`ADOPTED` into
docs/scoring.md.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Mapping

from fairvfl_flwr.config.run import BY_KEY, RunConfig
from fairvfl_flwr.config.settings import coerce
from fairvfl_flwr.core.errors import ConfigError

#: The training run's settings a scoring job adopts from the model's manifest, and whether the
#: job may set it otherwise (True: how its messages travel, not what the model is; a
#: plain-trained model may be scored under secure aggregation). What shapes the model, the
#: rows each party reads and how: the job's own keys (mode, score.*, output-dir,
#: reliability.*) stay the user's; training-only keys are not read.
ADOPTED: dict[str, bool] = {
    "dataset": False, "model": False, "hidden": False, "dtype": False, "wire-dtype": True, "num-parties": False,
    "num-active": False, "active-columns": False, "seed": False, "validation-fraction": False, "server-labels": False,
    "privacy.secure-aggregation": True,
    **dict.fromkeys(("csv.path", "csv.label", "csv.positive", "csv.sensitive", "csv.group-a", "csv.group-b",
                     "csv.protected-label", "csv.id-column", "csv.train-fraction"), False),
    **dict.fromkeys(("tables.own", "tables.path", "tables.id-column", "tables.min-common", "tables.train-fraction",
                     "tables.types", "tables.missing"), False),
}
_UNDECLARED = sorted(set(ADOPTED) - set(BY_KEY))
if _UNDECLARED:  # a renamed setting must be renamed here too
    raise TypeError(f"ADOPTED names keys no setting declares: {_UNDECLARED}")


class Contradiction(ConfigError):
    """A scoring job's run config sets a training setting otherwise than its model."""


def adopt(given: Mapping[str, Any], trained: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``given`` (a run config) with the training settings ``trained``: a key ``given`` leaves
    at its default takes the training value; one set to another value is refused (naming
    ``where``, the key and both values), except where :data:`ADOPTED` lets the job set it;
    a key that is not adopted is refused."""
    out = dict(given)
    for key, value in trained.items():
        setting = BY_KEY.get(key)
        if key not in ADOPTED or setting is None:
            raise Contradiction(f"{where}: {key!r} is not a training setting a scoring job adopts; refused")
        want = coerce(key, value, setting.type)
        have = coerce(key, given[key], setting.type) if key in given else setting.default
        if have != setting.default and have != want:
            if ADOPTED[key]:
                continue
            raise Contradiction(f"{where}: run config {key}={have!r} contradicts the model's {key}={want!r}; leave "
                                f"{key} out (a scoring job takes it from the model) or score a model trained with it")
        out[key] = want
    return out


@dataclass(frozen=True)
class ScoringJob:
    """A scoring job's run config, parsed once per run: what the user gave (``given``, every
    party's run config), the model's training settings it adopted (``trained``, what every
    message of the job carries) and the two together as a :class:`RunConfig` (``cfg``)."""

    given: Mapping[str, Any]
    trained: Mapping[str, Any]
    cfg: RunConfig

    @classmethod
    def own_settings(cls, given: Mapping[str, Any]) -> RunConfig:
        """The job's own settings (mode, score.*, output-dir, reliability.*): ``given`` without
        the keys the job adopts, checked as a run config."""
        return RunConfig.from_flower({k: v for k, v in given.items() if k not in ADOPTED})

    @classmethod
    def adopting(cls, given: Mapping[str, Any], trained: Mapping[str, Any], where: str) -> "ScoringJob":
        """The job of run config ``given`` with the model's settings ``trained`` (:func:`adopt`;
        ``where`` names who refuses a contradiction)."""
        merged = adopt(given, trained, where)
        return cls(types.MappingProxyType(dict(given)), types.MappingProxyType(dict(trained)),
                   RunConfig.from_flower(merged))

    @property
    def num_parties(self) -> int:
        """The model's parties: one SuperNode each."""
        return self.cfg.num_parties

    def to_flower(self) -> dict[str, Any]:
        """The run config every party is given: the user's (the parties adopt the rest from the messages)."""
        return dict(self.given)


DOCS_BEGIN = "<!-- adopted: generated from fairvfl_flwr/config/scoring.py (python -m fairvfl_flwr.config --write) -->"
DOCS_END = "<!-- end of adopted -->"


def render_docs() -> str:
    """docs/scoring.md's table of the settings a scoring job adopts from its model."""
    rows = [f"| `{key}` | {'yes: its messages, not the model' if own else 'no: refused when it differs'} |"
            for key, own in ADOPTED.items()]
    return "\n".join([DOCS_BEGIN, "", "| adopted from the model | the job may set it otherwise |", "|---|---|",
                      *rows, "", DOCS_END])
