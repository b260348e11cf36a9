"""The run configuration: one typed, validated object built from Flower's run config.

Keys are kebab-case as in ``[tool.flwr.app.config]`` (and ``--run-config``); every
value is checked here, before any data is loaded or any message is sent, and a bad
value is reported with its key.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, fields
from typing import Any, Mapping

from .names import DATASET_NAMES as DATASETS  # names only: config imports neither pandas nor torch
from .names import DTYPE_NAMES as DTYPES
from .names import MODEL_NAMES as MODELS
from .objective import CONSTRAINTS, MEASURES


class ConfigError(ValueError):
    """A run-config value is out of range or of the wrong kind."""


@dataclass(frozen=True)
class RunConfig:
    """All settings of one FairVFL run (defaults: the paper's setup on Adult, linear)."""

    preset: str = ""  # "", "paper" (= the defaults) or "fast" (presets.py): fills keys left at their default
    dataset: str = "adult"
    model: str = "linear"
    epsilon: float = 0.01
    num_server_rounds: int = 1000
    eta: float = 100.0
    beta: float = 0.1
    c: float = 1e-3
    mu: str = "2/n"
    local_steps: int = 5
    num_parties: int = 6
    num_active: int = 1
    active_columns: int = 0
    seed: int = 0
    eval_every: int = 50
    fairness: bool = True  # false: the unconstrained FedBCD baseline (multipliers stay 0)
    constraint: str = "deo"  # which gaps are constrained when fairness is on (objective.CONSTRAINTS)
    constraint_measure: str = "loss"  # what each gap compares: "loss" (the paper) or "rate" (soft error rate)
    validation_fraction: float = 0.0  # > 0: hold out this share of training rows and evaluate on it
    output_dir: str = "outputs"
    hidden: int = 16
    dtype: str = "float64"  # the parties' model and feature dtype
    wire_dtype: str = "float32"  # z, ν and partial logits on the wire; "float64" for exact-equality checks
    round_timeout: float = 600.0
    batch_size: int = 0  # 0: full batch; b > 0: each round trains on b rows drawn from the seed (batching.py)
    # Reliability (reliability.py, checkpoint.py, docs/reliability.md)
    round_retries: int = 1  # re-sends to a party that missed round-timeout before the run stops
    checkpoint_every: int = 0  # 0: off; k: server and parties checkpoint every k rounds (and round 0)
    checkpoint_dir: str = ""  # parties' default θ folder (a node-config checkpoint-dir wins)
    resume_from: str = ""  # a run folder with checkpoint.npz: continue that run
    # A user's own table (dataset = "csv")
    csv_path: str = ""
    csv_label: str = ""
    csv_positive: str = ""
    csv_sensitive: str = ""
    csv_group_a: str = ""
    csv_group_b: str = ""
    csv_protected_label: int = 1
    csv_id_column: str = ""
    csv_train_fraction: float = 0.8
    # Deployment: the server's label file (python -m fairvfl_flwr.export writes it); the
    # server then reads labels and groups from it instead of the packaged/CSV table.
    server_labels: str = ""
    # Privacy audit: passive parties keep a transcript of the ν they receive (view.py).
    record_view: str = ""
    record_every: int = 10
    # Gaussian noise on ν before it reaches passive parties, in units of 1/n (strategy._noisy).
    nu_noise: float = 0.0
    # "ckks": ν reaches passive parties only CKKS-encrypted (secure.py; linear models, needs .[privacy]).
    secure_nu: str = "none"
    # Asynchronous rounds (issue 8, staleness.py, straggler.py, docs/async.md)
    local_time_budget: float = 0.0  # > 0: active parties take as many steps as fit (1..local-steps)
    max_staleness: int = 0  # τ: 0 = synchronous rounds; > 0: a party's logits may be up to τ rounds old
    quorum: int = 0  # fresh replies a round needs when max-staleness > 0 (0: num-parties - 1)
    straggler_delays: str = ""  # simulated slow parties: "2=0.3" or "2=0.3~0.1,4=0.05" (straggler.py)

    # -- construction ------------------------------------------------------------
    @classmethod
    def from_flower(cls, run_config: Mapping[str, Any]) -> "RunConfig":
        """Build from Flower's ``context.run_config`` (kebab-case keys)."""
        known = {f.name.replace("_", "-"): f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, raw in run_config.items():
            f = known.get(key)
            if f is None:
                continue  # other apps' keys and Flower's own are not ours to judge
            values[f.name] = _coerce(key, raw, f.type)
        if values.get("preset"):
            from .presets import apply

            values = apply(values, {f.name: f.default for f in fields(cls)})
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def replace(self, **changes: Any) -> "RunConfig":
        cfg = dataclasses.replace(self, **changes)
        cfg.validate()
        return cfg

    def to_flower(self) -> dict[str, Any]:
        """The kebab-case dict Flower would hand the apps."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)}

    # -- checks ------------------------------------------------------------------
    def validate(self) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"run config {key}={getattr(self, key.replace('-', '_'))!r}: {why}")

        if self.dataset not in (*DATASETS, "csv"):
            raise bad("dataset", f"unknown dataset; choose one of {', '.join([*sorted(DATASETS), 'csv'])}")
        if self.dataset == "csv" and not self.server_labels:
            for key in ("csv_path", "csv_label", "csv_positive", "csv_sensitive", "csv_group_a", "csv_group_b"):
                if not getattr(self, key):
                    raise bad(key.replace("_", "-"), "required when dataset='csv'")
            if self.csv_protected_label not in (-1, 1):
                raise bad("csv-protected-label", "must be 1 (positive label) or -1")
            if not 0 < self.csv_train_fraction < 1:
                raise bad("csv-train-fraction", "must be between 0 and 1")
        if self.model not in MODELS:
            raise bad("model", f"unknown model; choose one of {', '.join(MODELS)}")
        if self.dtype not in DTYPES:
            raise bad("dtype", f"choose one of {', '.join(DTYPES)}")
        if self.wire_dtype not in ("float32", "float64"):
            raise bad("wire-dtype", "choose float32 (default: n×4 bytes per vector) or float64")
        if self.epsilon < 0:
            raise bad("epsilon", "the fairness tolerance must be >= 0")
        if self.num_server_rounds < 1:
            raise bad("num-server-rounds", "must be at least 1")
        if self.eta <= 0:
            raise bad("eta", "must be > 0 (the step size is 1/eta)")
        if self.beta < 0:
            raise bad("beta", "must be >= 0")
        if self.c < 0:
            raise bad("c", "must be >= 0")
        if self.local_steps < 1:
            raise bad("local-steps", "the active party takes at least one step per round (Q >= 1)")
        if self.num_parties < 1:
            raise bad("num-parties", "must be at least 1")
        if not 1 <= self.num_active <= self.num_parties:
            raise bad("num-active", f"must be between 1 and num-parties ({self.num_parties})")
        if self.active_columns < 0:
            raise bad("active-columns", "must be >= 0 (0 = the dataset's default)")
        if self.eval_every < 1:
            raise bad("eval-every", "must be at least 1")
        if self.hidden < 1:
            raise bad("hidden", "must be at least 1")
        if self.constraint not in CONSTRAINTS:
            raise bad("constraint", f"unknown constraint set; choose one of {', '.join(CONSTRAINTS)}")
        if self.constraint_measure not in MEASURES:
            raise bad("constraint-measure", f"choose one of {', '.join(MEASURES)}")
        if self.batch_size < 0:
            raise bad("batch-size", "must be >= 0 rows (0: full batch)")
        if self.batch_size > 0:
            # Each of these assumes every message and checkpoint carries all n rows.
            for key, on in (("max_staleness", self.max_staleness > 0), ("secure_nu", self.secure_nu != "none"),
                            ("checkpoint_every", self.checkpoint_every > 0), ("resume_from", bool(self.resume_from)),
                            ("record_view", bool(self.record_view))):
                if on:
                    raise bad("batch-size", f"not supported with {key.replace('_', '-')}="
                              f"{getattr(self, key)!r}; use batch-size=0 (full batch) with it")
        if not 0 <= self.validation_fraction <= 0.5:
            raise bad("validation-fraction", "must be between 0 (no validation split) and 0.5")
        if self.validation_fraction > 0 and self.server_labels:
            raise bad("validation-fraction", "is not supported with server-labels (deployed party files carry "
                      "only a train/test split); choose epsilon in simulation with python -m fairvfl_flwr.epsweep")
        if self.nu_noise < 0:
            raise bad("nu-noise", "must be >= 0")
        if self.secure_nu not in ("none", "ckks"):
            raise bad("secure-nu", "choose 'none' (plain ν) or 'ckks' (encrypted ν, linear models)")
        if self.secure_nu == "ckks" and self.model != "linear":
            raise bad("secure-nu", f"encrypted ν needs model='linear' (the homomorphic J_kᵀν = X_kᵀν is linear "
                      f"only), got model={self.model!r}; use secure-nu='none' or nu-noise for the MLP")
        if self.secure_nu == "ckks" and importlib.util.find_spec("tenseal") is None:
            raise bad("secure-nu", "needs TenSEAL: pip install 'fairvfl-flwr[privacy]'")
        if self.record_every < 0:
            raise bad("record-every", "must be >= 0 (0 = only the first rounds)")
        if self.round_timeout <= 0:
            raise bad("round-timeout", "must be > 0 seconds")
        if self.round_retries < 0:
            raise bad("round-retries", "must be >= 0 (0: no second try)")
        if self.checkpoint_every < 0:
            raise bad("checkpoint-every", "must be >= 0 (0: no checkpoints)")
        if self.local_time_budget < 0:
            raise bad("local-time-budget", "must be >= 0 seconds (0: always local-steps steps)")
        if self.max_staleness < 0:
            raise bad("max-staleness", "must be >= 0 rounds (0: synchronous)")
        if not 0 <= self.quorum <= self.num_parties:
            raise bad("quorum", f"must be between 0 (num-parties - 1) and num-parties ({self.num_parties})")
        if self.max_staleness > 0:
            for key, why in (("secure_nu", self.secure_nu != "none"), ("checkpoint_every", self.checkpoint_every > 0),
                             ("resume_from", bool(self.resume_from))):
                if why:
                    raise bad(key.replace("_", "-"), "not supported with max-staleness > 0 (a stale party's θ and "
                              "the server's round differ); use max-staleness=0")
        from .straggler import DelayError, parse_delays

        try:
            parse_delays(self.straggler_delays)
        except DelayError as exc:
            raise ConfigError(f"run config {exc}") from None
        self.mu_value(1000)  # parse check

    def mu_value(self, n_train: int) -> float:
        """μ as a number: ``"2/n"`` means 2 / (training rows), as in the paper."""
        text = str(self.mu).strip()
        try:
            if text.endswith("/n"):
                value = float(text[:-2]) / n_train
            else:
                value = float(text)
        except ValueError:
            raise ConfigError(f"run config mu={self.mu!r}: give a number or 'k/n' (e.g. '2/n')") from None
        if value < 0:
            raise ConfigError(f"run config mu={self.mu!r}: must be >= 0")
        return value

    @property
    def lr(self) -> float:
        return 1.0 / self.eta


def _coerce(key: str, raw: Any, typ: Any) -> Any:
    typ = {"int": int, "float": float, "bool": bool, "str": str}.get(typ, typ) if isinstance(typ, str) else typ
    try:
        if typ is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("true", "1", "on", "yes"):
                return True
            if str(raw).lower() in ("false", "0", "off", "no"):
                return False
            raise ValueError
        if typ is int:
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            return int(raw)
        if typ is float:
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"run config {key}={raw!r}: expected {typ.__name__}") from None
