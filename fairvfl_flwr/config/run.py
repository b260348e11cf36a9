"""The run configuration: one typed, validated object built from Flower's run config.

Keys are kebab-case as in ``[tool.flwr.app.config]`` (and ``--run-config``); feature
options sit in sections with dotted keys (``privacy.secure-nu``, see ``sections.py``).
Every value is checked here, before any data is loaded or any message is sent, and a
bad value is reported with its key. The attributes stay flat (``cfg.secure_nu``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Mapping

from fairvfl_flwr.config import presets, sections
from fairvfl_flwr.core.errors import ConfigError
from fairvfl_flwr.core.newton import MEMORY as NEWTON_MEMORY
from fairvfl_flwr.core.newton import SHARED_MEMORY as NEWTON_SHARED_MEMORY
from fairvfl_flwr.core.names import DATASET_NAMES as DATASETS  # names only: config imports neither pandas nor torch
from fairvfl_flwr.core.names import DTYPE_NAMES as DTYPES
from fairvfl_flwr.core.names import MODEL_NAMES as MODELS
from fairvfl_flwr.core.objective import CONSTRAINTS, MEASURES

MODES = ("fairvfl", "fairvfl-scores", "split", "score")
OPTIMIZERS = ("auto", "gd", "newton", "adagrad")


@dataclass(frozen=True)
class RunConfig:
    """All settings of one FairVFL run (defaults: the paper's setup on Adult, linear)."""

    preset: str = ""  # "", "paper" (the paper's gradient steps) or "fast" (presets.py): fills keys left at their default
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
    mode: str = "fairvfl"  # fairvfl | fairvfl-scores (also saves the final scores) | split (baseline) | score
    # auto: newton where it runs, else adagrad, else gd (optimizer_in_use); gd: the paper's
    # gradient steps (preset "paper"); newton: block Newton with the server's subspace search
    # (linear, full batch; docs/newton.md); adagrad: per-coordinate adaptive steps kept by
    # each party (MLP; docs/adagrad.md)
    optimizer: str = "auto"
    # newton: training ends once a round decreases F by less than this (relative) twice in a
    # row with the gaps at ε (so num-server-rounds is a cap); 0: run every round
    newton_tolerance: float = 1e-6
    # newton: earlier moves of each party searched along with its new direction
    newton_memory: int = NEWTON_MEMORY
    # newton under secure aggregation: earlier combined moves searched along with the new
    # combined direction (shared step lengths search 1 + this many, not K(1 + newton-memory))
    newton_shared_memory: int = NEWTON_SHARED_MEMORY
    # [batching]
    batch_size: int = 0  # 0: full batch; b > 0: each round trains on b rows drawn from the seed (core/batching.py)
    # [reliability] (features/guards.py, features/checkpoint.py, docs/reliability.md)
    round_timeout: float = 600.0
    round_retries: int = 1  # re-sends to a party that missed round-timeout before the run stops
    checkpoint_every: int = 0  # 0: off; k: server and parties checkpoint every k rounds (and round 0)
    checkpoint_dir: str = ""  # parties' default θ folder (a node-config checkpoint-dir wins)
    resume_from: str = ""  # a run folder with checkpoint.npz: continue that run
    # [csv]: a user's own table (dataset = "csv")
    csv_path: str = ""
    csv_label: str = ""
    csv_positive: str = ""
    csv_sensitive: str = ""
    csv_group_a: str = ""
    csv_group_b: str = ""
    csv_protected_label: int = 1
    csv_id_column: str = ""
    csv_train_fraction: float = 0.8
    # Deployment: the server's label file (python -m fairvfl_flwr.tools.export writes it); the
    # server then reads labels and groups from it instead of the packaged/CSV table.
    server_labels: str = ""
    # [privacy] passive parties keep a transcript of the ν they receive (features/record_view.py)
    record_view: str = ""
    record_every: int = 10
    record_first: int = 10  # rounds 1..record-first are all recorded (then every record-every-th)
    # Transcripts of what every role receives, written on the receiving side (features/transcripts.py)
    transcript_dir: str = ""
    # Pairwise-masked partial logits: the server learns z = Σ u_k and nothing per party (features/secagg.py)
    secure_aggregation: bool = False
    # Gaussian noise on ν before it reaches passive parties, in units of 1/n (features/noise.py).
    nu_noise: float = 0.0
    # "ckks": ν reaches passive parties only CKKS-encrypted (features/ckks.py; linear models, needs .[privacy]).
    secure_nu: str = "none"
    # Label DP on ν (features/labeldp.py): target ε over the run's rounds (0: off), δ, the public
    # bound Λ on the multipliers and on the group sizes (0: the data's smallest group − 1).
    label_dp_epsilon: float = 0.0
    label_dp_delta: float = 1e-5
    label_dp_lambda_bound: float = 0.5
    label_dp_min_group: int = 0
    # [staleness] asynchronous rounds (features/staleness.py, features/straggler.py, docs/async.md)
    local_time_budget: float = 0.0  # > 0: active parties take as many steps as fit (1..local-steps)
    max_staleness: int = 0  # τ: 0 = synchronous rounds; > 0: a party's logits may be up to τ rounds old
    quorum: int = 0  # fresh replies a round needs when max-staleness > 0 (0: num-parties - 1)
    straggler_delays: str = ""  # simulated slow parties: "2=0.3" or "2=0.3~0.1,4=0.05" (features/straggler.py)
    # [split] the split-learning baseline (algorithms/split.py)
    split_embedding: int = 4  # d: each party's embedding size, as in Flower's vertical-FL example
    split_lr: float = 0.0  # SGD step of parties and head; 0: 1/eta
    # [score] the scoring job, mode = "score" (features/scoring.py, docs/scoring.md)
    score_model_from: str = ""  # the training run folder (with model.json) whose saved blocks score
    score_chunk_rows: int = 100_000  # rows per query.score message (bounds every message's size)
    score_round: int = -1  # -1: the final model; r >= 0: the checkpoint of round r (reliability.checkpoint-every)
    score_path: str = ""  # simulation: each party's raw file to score; {partition} becomes its partition id

    # -- construction ------------------------------------------------------------
    @classmethod
    def from_flower(cls, run_config: Mapping[str, Any]) -> "RunConfig":
        """Build from Flower's ``context.run_config`` (kebab-case keys, dotted for sections).

        An unknown key is refused, as ``flwr run`` refuses it; a key that moved into a
        section is refused with its new name.
        """
        by_key = {sections.key(f.name): f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, raw in run_config.items():
            f = by_key.get(key)
            if f is None:
                if key in sections.MOVED:
                    raise ConfigError(f"run config {key}: this key is now {sections.MOVED[key]!r} "
                                      f"(section [tool.flwr.app.config.{sections.MOVED[key].split('.')[0]}])")
                raise ConfigError(f"run config {key}={raw!r}: unknown key; the keys are listed in "
                                  "pyproject.toml [tool.flwr.app.config] and docs/configuration.md")
            values[f.name] = _coerce(key, raw, f.type)
        if values.get("preset"):
            values = presets.apply(values, {f.name: f.default for f in fields(cls)})
        cfg = cls(**values)
        cfg.validate()
        return cfg

    @classmethod
    def from_run_folder(cls, config: Mapping[str, Any]) -> "RunConfig":
        """From a run folder's ``config.json``: the run config plus what the run added
        (party columns, dataset summary), which is not the user's to set."""
        keys = {sections.key(f.name) for f in fields(cls)}
        return cls.from_flower({k: v for k, v in config.items() if k in keys})

    def replace(self, **changes: Any) -> "RunConfig":
        cfg = dataclasses.replace(self, **changes)
        cfg.validate()
        return cfg

    def to_flower(self) -> dict[str, Any]:
        """The flat dict Flower would hand the apps (dotted keys for sections)."""
        return {sections.key(f.name): getattr(self, f.name) for f in fields(self)}

    # -- checks ------------------------------------------------------------------
    def validate(self) -> None:
        """The everyday keys, then each section on its own, then the refused combinations."""
        def bad(field: str, why: str) -> ConfigError:
            return sections.bad(self, field, why)

        if self.dataset not in (*DATASETS, "csv"):
            raise bad("dataset", f"unknown dataset; choose one of {', '.join([*sorted(DATASETS), 'csv'])}")
        if self.model not in MODELS:
            raise bad("model", f"unknown model; choose one of {', '.join(MODELS)}")
        if self.mode not in MODES:
            raise bad("mode", f"choose one of {', '.join(MODES)}")
        if self.optimizer not in OPTIMIZERS:
            raise bad("optimizer", f"choose one of {', '.join(OPTIMIZERS)}")
        if not self.newton_tolerance >= 0:
            raise bad("newton_tolerance", "must be >= 0 (0 runs every round)")
        if not 0 <= self.newton_memory <= 16:
            raise bad("newton_memory", "must be 0..16 (moves kept per party; each adds an entry to every reply's a and Gram matrix)")
        if not 0 <= self.newton_shared_memory <= 16:
            raise bad("newton_shared_memory", "must be 0..16 (combined moves kept under secure aggregation)")
        if self.dtype not in DTYPES:
            raise bad("dtype", f"choose one of {', '.join(DTYPES)}")
        if self.wire_dtype not in ("float32", "float64"):
            raise bad("wire_dtype", "choose float32 (default: n×4 bytes per vector) or float64")
        if self.epsilon < 0:
            raise bad("epsilon", "the fairness tolerance must be >= 0")
        if self.num_server_rounds < 1:
            raise bad("num_server_rounds", "must be at least 1")
        if self.eta <= 0:
            raise bad("eta", "must be > 0 (the step size is 1/eta)")
        if self.beta < 0:
            raise bad("beta", "must be >= 0")
        if self.c < 0:
            raise bad("c", "must be >= 0")
        if self.local_steps < 1:
            raise bad("local_steps", "the active party takes at least one step per round (Q >= 1)")
        if self.num_parties < 1:
            raise bad("num_parties", "must be at least 1")
        if not 1 <= self.num_active <= self.num_parties:
            raise bad("num_active", f"must be between 1 and num-parties ({self.num_parties})")
        if self.active_columns < 0:
            raise bad("active_columns", "must be >= 0 (0 = the dataset's default)")
        if self.eval_every < 1:
            raise bad("eval_every", "must be at least 1")
        if self.hidden < 1:
            raise bad("hidden", "must be at least 1")
        if self.constraint not in CONSTRAINTS:
            raise bad("constraint", f"unknown constraint set; choose one of {', '.join(CONSTRAINTS)}")
        if self.constraint_measure not in MEASURES:
            raise bad("constraint_measure", f"choose one of {', '.join(MEASURES)}")
        if not 0 <= self.validation_fraction <= 0.5:
            raise bad("validation_fraction", "must be between 0 (no validation split) and 0.5")
        self.mu_value(1000)  # parse check
        for check in sections.CHECKS.values():
            check(self)
        sections.check_combinations(self)

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
    def optimizer_in_use(self) -> str:
        """``gd``, ``newton`` or ``adagrad``: ``auto`` is newton unless a setting of the run rules it
        out (sections.NEWTON_REFUSED: an MLP, mini-batches, staleness, ...), then adagrad unless
        one rules that out (sections.ADAGRAD_REFUSED: a linear model, ...), else gd;
        gd too where the constraint set is not the measured one (``deo``: docs/newton.md,
        docs/adagrad.md)."""
        if self.optimizer != "auto":
            return self.optimizer
        if self.constraint != "deo":
            return "gd"
        if not sections.newton_refusal(self):
            return "newton"
        return "gd" if sections.adagrad_refusal(self) else "adagrad"

    @property
    def newton_moves(self) -> int:
        """Moves a party keeps for Newton's search: its own (per-party step lengths), or its
        parts of the combined moves where secure aggregation shares the step lengths."""
        return self.newton_shared_memory if self.secure_aggregation else self.newton_memory

    @property
    def lr(self) -> float:
        return 1.0 / self.eta

    @property
    def split_step(self) -> float:
        """The split-learning baseline's SGD step (split.lr, or 1/eta when 0)."""
        return self.split_lr or self.lr


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
