"""The run configuration: one typed, validated object built from Flower's run config.

Every setting is declared once, as a field of :class:`RunConfig` (``settings.setting``:
key, section, type, default, allowed values, help, rule). The pyproject.toml run config,
the validation and the key tables of docs/configuration.md come from these declarations.
Keys are kebab-case (``local-steps``); feature options sit in sections with dotted keys
(``privacy.secure-nu``). Every value is checked here, before any data is loaded or any
message is sent, and a bad value is reported with its key. The attributes stay flat
(``cfg.secure_nu``).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Mapping

from fairvfl_flwr.config import presets, sections
from fairvfl_flwr.config.algorithms import OPTIMIZERS, resolve
from fairvfl_flwr.config.settings import Setting, above, at_least, coerce, declared, setting, within
from fairvfl_flwr.core.errors import ConfigError
from fairvfl_flwr.core.names import DATASET_NAMES  # names only: config imports neither pandas nor torch
from fairvfl_flwr.core.names import DTYPE_NAMES, MODEL_NAMES
from fairvfl_flwr.core.newton import MEMORY as NEWTON_MEMORY
from fairvfl_flwr.core.newton import SHARED_MEMORY as NEWTON_SHARED_MEMORY
from fairvfl_flwr.core.constraints import CONSTRAINTS, FORMS, MEASURES, kind_named
from fairvfl_flwr.core.constraints.release import ENCRYPTED, RANDOMIZED_RESPONSE

class Modes(Sequence):
    """The run config's ``mode`` choices: the modes of the registered jobs, read on every use.

    Each mode is declared once, by the job that runs it (or by an algorithm that job runs), and
    held by the job registry (flower/jobs.py), which hands this sequence its reader once; the
    config layer keeps no list of its own. A process that loaded no registry (the config alone)
    has no choices to check ``mode`` against; the ServerApp's dispatch refuses a mode no
    registered job runs (flower/jobs.selected)."""

    def __init__(self) -> None:
        self._read: Callable[[], Iterable[str]] = tuple

    def read_from(self, reader: Callable[[], Iterable[str]]) -> None:
        """Read the choices from ``reader`` (the job registry's modes) from now on."""
        self._read = reader

    def _names(self) -> tuple[str, ...]:
        return tuple(self._read())

    def __getitem__(self, index):
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


MODES = Modes()
#: Who may hold the sensitive attribute (run config groups.holder).
GROUP_HOLDERS = ("label-owner", "registry")


def _mu_ok(text: str) -> bool:
    try:
        return mu_number(text, 1000) >= 0
    except ValueError:
        return False


def mu_number(text: str, n_train: int) -> float:
    """μ as a number: ``"k/n"`` is k / (training rows), as in the paper."""
    text = str(text).strip()
    return float(text[:-2]) / n_train if text.endswith("/n") else float(text)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


S = setting  # the declarations below read as a table
#: Seconds a deployment waits by default for a party whose SuperNode went away (``rejoin-timeout = -1``):
#: long enough for an operator to restart it, short enough that a party gone for good ends the run.
DEPLOYED_REJOIN_WAIT = 300.0


@dataclass(frozen=True)
class RunConfig:
    """All settings of one FairVFL run (defaults: the paper's setup on Adult, linear)."""

    # -- everyday keys -------------------------------------------------------------
    preset: str = S("", "fills keys left at their default: paper (the paper's gradient steps) or fast "
                    "(gd with eta 20, beta 0.5); fairvfl_flwr/config/presets.py", choices=("", *presets.PRESETS),
                    why=f"choose one of {', '.join(presets.PRESETS)} (or leave it empty)")
    dataset: str = S("adult", "adult, compas, crime (packaged) or csv (your own table: csv.*)",
                     choices=(*sorted(DATASET_NAMES), "csv"),
                     why=f"unknown dataset; choose one of {', '.join([*sorted(DATASET_NAMES), 'csv'])}")
    model: str = S("linear", "linear (theta_k^T x; the active party also has an intercept) or mlp "
                   "(2 hidden ReLU layers, scalar output)", choices=MODEL_NAMES,
                   why=f"unknown model; choose one of {', '.join(MODEL_NAMES)}")
    epsilon: float = S(0.01, "fairness tolerance: every constrained gap <= epsilon",
                       rule=at_least(0), why="the fairness tolerance must be >= 0")
    num_server_rounds: int = S(1000, "communication rounds (a cap: the stop rule may end training sooner)",
                               rule=at_least(1), why="must be at least 1")
    eta: float = S(100.0, "the parties' step size is 1/eta", rule=above(0),
                   why="must be > 0 (the step size is 1/eta)")
    beta: float = S(0.1, "dual step size of the multipliers (gradient steps)", rule=at_least(0),
                    why="must be >= 0")
    c: float = S(1e-3, "dual regularisation c_t (constant)", rule=at_least(0), why="must be >= 0")
    mu: str = S("2/n", "L2 weight mu: a number or 'k/n' (k / training rows)", rule=_mu_ok,
                why="give a number >= 0 or 'k/n' (e.g. '2/n')")
    local_steps: int = S(5, "Q: local steps of an active party per round (passive parties take one)",
                         rule=at_least(1),
                         why="the active party takes at least one step per round (Q >= 1)")
    num_parties: int = S(6, "K: parties, one per SuperNode", rule=at_least(1), why="must be at least 1")
    num_active: int = S(1, "active parties (they hold the labels and the sensitive attribute)",
                        rule=lambda v, c: 1 <= v <= c.num_parties, why="must be between 1 and num-parties ({num_parties})")
    active_columns: int = S(0, "columns of the active parties; 0: the paper's (Adult 19, COMPAS 16, Crime 49), "
                            "fewer where it would leave a passive party no column, or an even share",
                            rule=at_least(0), why="must be >= 0 (0 = the dataset's default)")
    seed: int = S(0, "fixes the train/test split, the model initialisation and every random draw")
    eval_every: int = S(50, "test-set evaluation period in rounds (the last round is always evaluated)",
                        rule=at_least(1), why="must be at least 1")
    fairness: bool = S(True, "false: the unconstrained FedBCD baseline (the multipliers stay 0)")
    constraint: str = S("deo", "which gaps are constrained: deo (the paper's, on the loss), equalized-odds or "
                        "demographic-parity (on positive rates, as fairlearn's; fairness-constraints.md)",
                        choices=CONSTRAINTS)
    constraint_measure: str = S("auto", "what each gap compares: rate (mean sigmoid: soft positive rates, as "
                                "fairlearn's parity), loss (the paper: mean logistic loss) or auto (rate for "
                                "equalized-odds and demographic-parity, loss for deo)", choices=("auto", *MEASURES))
    constraint_form: str = S("pairwise", "with several groups: pairwise (every pair of groups; two groups: the "
                             "paper's gap) or overall (each group against all rows, fairlearn's difference_bound)",
                             choices=FORMS, why=f"choose one of {', '.join(FORMS)}")
    min_group_size: int = S(30, "a group with fewer rows of the table (training and test) in a constrained row set "
                            "is pooled with the other small groups, or refused with pool-small-groups = false (its "
                            "gap cannot be measured reliably)", rule=at_least(1), why="must be at least 1")
    pool_small_groups: bool = S(True, "true: merge the groups below min-group-size into one group (with the next "
                                "smallest while the merged group is still small), named after its members and "
                                "logged before round 1; false: refuse them, naming each with its count")
    sensitive_as_input: bool = S(False, "true: the sensitive attribute's columns (and a one-hot copy or source of "
                                 "them in the table) are model inputs, as in the paper (preset paper); false: "
                                 "they are not")
    validation_fraction: float = S(0.0, "> 0: hold out this seeded share of the training rows and report "
                                   "metrics on it instead of the test rows", rule=within(0, 0.5),
                                   why="must be between 0 (no validation split) and 0.5")
    output_dir: str = S("outputs", "where run folders go; a relative path is taken from the ServerApp's "
                        "working directory (configuration.md#the-run-folder)")
    hidden: int = S(16, "MLP hidden width", rule=at_least(1), why="must be at least 1")
    dtype: str = S("float64", "the parties' model and feature dtype", choices=DTYPE_NAMES)
    wire_dtype: str = S("float32", "z, nu and partial logits on the wire (n x 4 bytes each); float64 for "
                        "exact-equality checks", choices=("float32", "float64"),
                        why="choose float32 (default: n×4 bytes per vector) or float64")
    mode: str = S("fairvfl", "fairvfl; fairvfl-scores (also saves the final scores); split (the split-learning "
                  "baseline); score (score rows with a trained model: score.*)", choices=MODES)
    optimizer: str = S("auto", "gd (the paper's steps), newton (block Newton, full batch; Gauss-Newton blocks for "
                       "MLP parties), adagrad (MLP) "
                       "or auto (the first registered algorithm the run's settings allow: the log says which and why)",
                       choices=OPTIMIZERS)
    stop_tolerance: float = S(5e-6, "training ends after stop-window rounds in a row in which F decreased by less "
                              "than this (relative to 1 + abs(F)), every gap within epsilon + 0.001 when fairness is on; "
                              "0: run every round", rule=at_least(0),
                              why="must be >= 0 (0 runs every round)")
    stop_plateau: float = S(0.01, "MLP parties under Gauss-Newton blocks: a round is quiet when F fell by less than "
                            "this share of its fall since round 1, instead of stop-tolerance (an MLP's F keeps "
                            "falling; newton.md#when-an-mlp-run-stops)", rule=above(0), why="must be > 0")
    newton_warm_rounds: int = S(6, "MLP parties under Gauss-Newton blocks, fairness on: first rounds that train the "
                                "loss alone; then the largest gap is halved each round down to epsilon "
                                "(newton.md#a-trained-start)", rule=at_least(0),
                                why="must be >= 0 (0 holds the gaps from round 1)")
    stop_window: int = S(3, "consecutive quiet rounds the stop rule needs (configuration.md#when-training-stops)", rule=at_least(1),
                         why="must be at least 1")
    hard_epsilon: bool = S(True, "rate constraints: epsilon bounds fairlearn's difference of the hard predictions on "
                           "the training rows (the smooth rates are calibrated until it does: fairness-constraints.md); false: "
                           "epsilon bounds the smooth rates")
    newton_memory: int = S(NEWTON_MEMORY, "newton, linear parties: earlier moves of each party searched with its "
                           "new direction (newton.md#how-many-moves)", rule=within(0, 16),
                           why="must be 0..16 (moves kept per party; each adds an entry to every reply's a and "
                               "Gram matrix)")
    newton_shared_memory: int = S(NEWTON_SHARED_MEMORY, "newton under privacy.secure-aggregation or with MLP parties: "
                                  "earlier combined moves searched with the new combined direction", rule=within(0, 16),
                                  why="must be 0..16 (combined moves kept where the step lengths are shared)")
    server_labels: str = S("", "deployment: the server's label file written by fairvfl-export (deploy.md)")
    # -- privacy ---------------------------------------------------------------------
    secure_nu: str = S("none", "ckks: passive parties receive nu only as CKKS ciphertexts (linear models, "
                       "needs .[privacy])", section="privacy", choices=("none", "ckks"),
                       rule=lambda v: v == "none" or _installed("tenseal"),
                       why="choose 'none' (plain ν) or 'ckks' (encrypted ν, linear models; needs TenSEAL: "
                           "pip install 'fairvfl-flwr[privacy]')")
    nu_noise: float = S(0.0, "Gaussian noise of std nu-noise/n on nu before it leaves the server", section="privacy",
                        rule=at_least(0), why="must be >= 0")
    record_view: str = S("", "a folder: the passive parties' part of privacy.transcript-dir (the nu each received, kept on "
                         "its own side)",
                         section="privacy")
    record_every: int = S(10, "rounds between recorded transcripts after the first rounds", section="privacy",
                          rule=at_least(0), why="must be >= 0 (0 = only the first rounds)")
    record_first: int = S(10, "rounds 1..record-first are all recorded", section="privacy",
                          rule=at_least(0), why="must be >= 0 (rounds 1..record-first are all recorded)")
    transcript_dir: str = S("", "a folder: every role keeps what it received there, on its own side "
                            "(privacy.md#transcripts)", section="privacy")
    secure_aggregation: str = S("auto", "pairwise-masked partial logits, the server learns only their sum "
                                "(privacy.md). auto: on where the parties read their own data (tables.own or "
                                "server-labels), off on packaged tables", section="privacy",
                                choices=("auto", "true", "false"))
    label_dp_epsilon: float = S(0.0, "> 0: label DP on nu at this epsilon over num-server-rounds (Opacus's RDP "
                                "accountant, needs .[privacy])", section="privacy",
                                rule=lambda v: v == 0 or (v > 0 and _installed("opacus")),
                                why="must be >= 0 (0: no label DP); > 0 needs Opacus's accountant: "
                                    "pip install 'fairvfl-flwr[privacy]'")
    label_dp_delta: float = S(1e-5, "delta of the label-DP guarantee", section="privacy",
                              rule=within(0, 1, open_=True), why="must be between 0 and 1 (exclusive), e.g. 1e-5")
    label_dp_lambda_bound: float = S(0.5, "the public bound on the multipliers under label DP (they are clipped "
                                     "to [0, bound])", section="privacy", rule=above(0),
                                     why="must be > 0 (the multipliers are clipped to [0, bound])")
    label_dp_min_group: int = S(0, "a public lower bound on every constraint group's size; 0: the data's "
                                "smallest group - 1", section="privacy", rule=at_least(0),
                                why="must be >= 0 rows (0: the data's smallest group - 1)")
    # -- reliability -----------------------------------------------------------------
    round_timeout: float = S(600.0, "seconds the server waits for a party's reply in one try",
                             section="reliability", rule=above(0), why="must be > 0 seconds")
    round_retries: int = S(1, "re-sends to a party that missed round-timeout before the run stops",
                           section="reliability", rule=at_least(0), why="must be >= 0 (0: no second try)")
    checkpoint_every: int = S(0, "0: off; k: server and parties checkpoint every k rounds (and after round 0); "
                              "each checkpoint also scores", section="reliability", rule=at_least(0),
                              why="must be >= 0 (0: no checkpoints)")
    checkpoint_dir: str = S("", "the parties' default folder for their state of the last rounds (a node-config "
                            "state-dir wins)", section="reliability")
    resume_from: str = S("", "a run folder with checkpoint.npz: continue that run", section="reliability")
    rejoin_timeout: float = S(-1.0, "seconds the server waits for a party that dropped out (every party then restores "
                              "the last completed round); 0: none; -1: 300 in a deployment (own tables), else 0", section="reliability", rule=at_least(-1),
                              why="must be -1 (auto), 0 (off) or > 0 seconds")
    # -- staleness -------------------------------------------------------------------
    max_staleness: int = S(0, "tau: 0 = synchronous rounds; > 0: a party's logits may be up to tau rounds old",
                           section="staleness", rule=at_least(0), why="must be >= 0 rounds (0: synchronous)")
    quorum: int = S(0, "fresh replies a round needs when max-staleness > 0 (0: num-parties - 1)",
                    section="staleness", rule=lambda v, c: 0 <= v <= c.num_parties,
                    why="must be between 0 (num-parties - 1) and num-parties ({num_parties})")
    local_time_budget: float = S(0.0, "> 0: seconds an active party may spend on local steps per round "
                                 "(1..local-steps steps)", section="staleness", rule=at_least(0),
                                 why="must be >= 0 seconds (0: always local-steps steps)")
    straggler_delays: str = S("", "simulated slow parties: '2=0.3' or '2=0.3~0.1,4=0.05' (partition=seconds~jitter)",
                              section="staleness")  # its rule names the item it cannot read: sections.check_conditional
    # -- batching --------------------------------------------------------------------
    batch_size: int = S(0, "0: full batch; b > 0: each round trains on b rows drawn from the seed and the round",
                        section="batching", rule=at_least(0), why="must be >= 0 rows (0: full batch)")
    # -- csv -------------------------------------------------------------------------
    csv_path: str = S("", "your own table (dataset = 'csv'): the file; a relative path is taken from the "
                      "ServerApp's working directory", section="csv")
    csv_label: str = S("", "the label column", section="csv")
    csv_positive: str = S("", "the label column's positive value", section="csv")
    csv_sensitive: str = S("", "the sensitive column, or several separated by commas (each combination of their "
                           "values is a group)", section="csv")
    csv_group_a: str = S("", "the sensitive column's value of group a; leave group-a and group-b empty: every "
                         "value is a group", section="csv")
    csv_group_b: str = S("", "the sensitive column's value of group b", section="csv")
    csv_protected_label: int = S(1, "1: the positive label is the protected one; -1: the other", section="csv",
                                 choices=(1, -1), why="must be 1 (positive label) or -1")
    csv_id_column: str = S("", "optional row-id column", section="csv")
    csv_train_fraction: float = S(0.8, "training share of the rows", section="csv", rule=within(0, 1, open_=True),
                                  why="must be between 0 and 1")
    # -- split -----------------------------------------------------------------------
    split_embedding: int = S(4, "each party's embedding width, as in Flower's vertical-FL example", section="split",
                             rule=at_least(1), why="must be at least 1")
    split_lr: float = S(0.0, "SGD step of the parties and the head; 0: 1/eta", section="split",
                        rule=at_least(0), why="must be > 0 (or 0: 1/eta)")
    # -- score -----------------------------------------------------------------------
    score_model_from: str = S("", "the training run folder (with model.json) whose saved blocks score",
                              section="score")
    score_chunk_rows: int = S(100_000, "rows per query.score message (bounds every message's size)", section="score",
                              rule=at_least(1), why="must be at least 1 row")
    score_round: int = S(-1, "-1: the final model; r >= 0: the checkpoint of round r", section="score",
                         rule=at_least(-1), why="must be -1 (the final model) or a checkpoint's round >= 0")
    score_path: str = S("", "simulation: each party's raw file to score, {partition} replaced by its partition id; "
                        "empty: the run's test rows", section="score")
    # -- tables ----------------------------------------------------------------------
    tables_own: bool = S(False, "true: every party starts from its own raw table (node config table-path; in "
                         "simulation tables.path) and the run begins with private alignment (PSI)", section="tables")
    tables_path: str = S("", "simulation: each party's raw table, {partition} replaced by its partition id",
                         section="tables")
    tables_id_column: str = S("row_id", "simulation: the id column of every party's table (deployment: node "
                              "config id-column)", section="tables")
    tables_min_common: int = S(100, "alignment refuses the run when fewer ids are common to all parties",
                               section="tables", rule=at_least(1), why="must be at least 1 row")
    tables_train_fraction: float = S(0.8, "share of the common rows the label owner puts in training (seeded)",
                                     section="tables", rule=within(0, 1, open_=True), why="must be between 0 and 1")
    tables_types: str = S("", "column type overrides, e.g. 'zip=category,score=number' (default: numbers are "
                          "numbers, anything else a category)", section="tables")
    tables_missing: str = S("", "missing values per column: 'age=median,job=value:none' (mean, median, mode, "
                            "value:<v>); a column not named refuses them", section="tables")
    tables_reuse_alignment: bool = S(True, "true: a party keeps its alignment (by its table's digest and the "
                                     "settings) and a run on the same tables reuses it once every party holds the "
                                     "same one; false: every run aligns again", section="tables")
    tables_name: str = S("own-tables", "the name of the parties' tables in run folders, the log and model cards "
                         "(the dataset key names only the packaged data)", section="tables")
    tables_missing_values: str = S("", "markers that mean a missing value in every party's table and score file, "
                                   "e.g. '?,NA' (a party's node config missing-values wins)", section="tables")
    # -- groups ----------------------------------------------------------------------
    groups_holder: str = S("label-owner", "who holds the sensitive attribute: label-owner (the active party, and the "
                           "server) or registry (a party of its own, in simulation the last; privacy.md#a-registry-"
                           "holds-the-groups)", section="groups", choices=GROUP_HOLDERS)
    groups_release: str = S(RANDOMIZED_RESPONSE, "how a registry releases the groups: randomized-response (each "
                            "row's, k-ary at groups.epsilon-s; the server corrects for the flip rates) or ckks (none: "
                            "the server gets sums over them under the registry's key)", section="groups",
                            choices=(RANDOMIZED_RESPONSE, ENCRYPTED))
    groups_epsilon_s: float = S(2.0, "epsilon_S of the registry's randomized response: each row's group is "
                                "epsilon_S-locally private against every other role, whatever they compute",
                                section="groups", rule=above(0), why="must be > 0")
    groups_release_margin: float = S(0.01, "randomized-response: the true gaps held within epsilon + this, at 2 standard "
                                     "deviations of the release's error (the run bounds it, at some accuracy); 0: "
                                     "the estimates only (privacy.md#a-registry-holds-the-groups)", section="groups",
                                     rule=at_least(0), why="must be >= 0")

    # -- construction ------------------------------------------------------------
    @classmethod
    def settings(cls) -> list[Setting]:
        """Every setting, in declaration order."""
        return SETTINGS

    @classmethod
    def key_of(cls, field: str) -> str:
        """The run-config key of a field (``batch_size`` -> ``batching.batch-size``)."""
        return BY_FIELD[field].key

    @classmethod
    def from_flower(cls, run_config: Mapping[str, Any]) -> "RunConfig":
        """Build from Flower's ``context.run_config`` (kebab-case keys, dotted for sections).

        An unknown key is refused, as ``flwr run`` refuses it, naming the closest keys.
        """
        values: dict[str, Any] = {}
        for key, raw in run_config.items():
            s = BY_KEY.get(key)
            if s is None:
                close = difflib.get_close_matches(key, BY_KEY, n=2) + [k for k in BY_KEY if k.endswith(f".{key}")]
                hint = f" (did you mean {' or '.join(map(repr, dict.fromkeys(close)))}?)" if close else ""
                raise ConfigError(f"run config {key}={raw!r}: unknown key{hint}; the keys are listed in "
                                  "pyproject.toml [tool.flwr.app.config] and docs/configuration.md")
            values[s.field] = coerce(key, raw, s.type)
        if values.get("preset"):
            values = presets.apply(values, {s.field: s.default for s in SETTINGS})
        cfg = cls(**values)
        cfg.validate()
        return cfg

    @staticmethod
    def mode_of(run_config: Mapping[str, Any]) -> str:
        """``run_config``'s ``mode``, which selects the job that reads the rest
        (flower/jobs.selected): the one key read before the rest, and checked as
        :meth:`from_flower` checks it."""
        s = BY_KEY["mode"]
        mode = coerce(s.key, run_config.get(s.key, s.default), s.type)
        if s.choices and mode not in s.choices:
            raise ConfigError(f"run config {s.key}={mode!r}: choose one of {', '.join(map(str, s.choices))}")
        return mode

    @classmethod
    def from_run_folder(cls, config: Mapping[str, Any]) -> "RunConfig":
        """From a run folder's ``config.json``: the run config plus what the run added
        (party columns, dataset summary), which is not the user's to set."""
        return cls.from_flower({k: v for k, v in config.items() if k in BY_KEY})

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with ``changes`` (snake_case fields), validated as a new run config would be."""
        cfg = dataclasses.replace(self, **changes)
        cfg.validate()
        return cfg

    def to_flower(self) -> dict[str, Any]:
        """The flat dict Flower would hand the apps (dotted keys for sections)."""
        return {s.key: getattr(self, s.field) for s in SETTINGS}

    # -- checks ------------------------------------------------------------------
    def validate(self) -> None:
        """Each setting's declared values and rule, then what depends on the mode or dataset,
        then the refused combinations."""
        for s in SETTINGS:
            why = s.refusal(self)
            if why is not None:
                raise sections.bad(self, s.field, why)
        sections.check_conditional(self)
        sections.check_combinations(self)

    def mu_value(self, n_train: int) -> float:
        """μ as a number: ``"2/n"`` means 2 / (training rows), as in the paper."""
        return mu_number(self.mu, n_train)

    @property
    def measure(self) -> str:
        """``loss`` or ``rate``: what the constraint's gaps compare (``auto``: the kind's own)."""
        if self.constraint_measure != "auto":
            return self.constraint_measure
        return kind_named(self.constraint).default_measure

    @property
    def data_name(self) -> str:
        """What the run's data is called in its folder, log and model card: the dataset, or
        with ``tables.own`` the parties' table set (``tables.name``), whatever ``dataset`` says."""
        return (self.tables_name or "own-tables") if self.tables_own else self.dataset

    @property
    def optimizer_in_use(self) -> str:
        """The name of the algorithm the run trains with (config/algorithms.resolve: the one
        ``mode`` selects, the one ``optimizer`` names, or what ``auto`` picked)."""
        return resolve(self).name

    @property
    def registry(self) -> bool:
        """Whether a registry party holds the sensitive attribute (``groups.holder``): the label
        owner and the server then hold none, and the server receives only its noisy release."""
        return self.groups_holder == "registry"

    @property
    def encrypted_groups(self) -> bool:
        """Whether a registry keeps the groups under its own CKKS key (``groups.release = "ckks"``): the
        server gets only sums over them, and every party's gradient goes through the registry."""
        return self.registry and self.groups_release == ENCRYPTED

    @property
    def groups_as_sums(self) -> bool:
        """Whether the server holds no row's group, only sums over the groups that a registry returns
        (:attr:`encrypted_groups`): what a training method's server computes from the groups is then
        a sum over rows of its own plaintexts."""
        return self.encrypted_groups

    @property
    def masked(self) -> bool:
        """Whether partial logits travel under secure aggregation: ``privacy.secure-aggregation``,
        where ``auto`` means on wherever the parties read their own data (a deployment: own
        tables, or exported party files with the server's label file). Server and parties
        resolve it alike from the same run config; a deployed party also refuses an unmasked
        job on its own (secure/identity.check_deployment)."""
        if self.secure_aggregation == "auto":
            return self.tables_own or bool(self.server_labels)
        return self.secure_aggregation == "true"

    @property
    def nu_as_gradient(self) -> bool:
        """Whether passive parties receive X_kᵀν instead of ν (encrypted ν, ``privacy.secure-nu``):
        an algorithm's passive step then works from that gradient alone."""
        return self.secure_nu != "none"

    @property
    def rejoin_wait(self) -> float:
        """Seconds the server waits for a party that dropped out (0: the run ends): ``rejoin-timeout``,
        where ``-1`` means :data:`DEPLOYED_REJOIN_WAIT` in a deployment that can rejoin (own tables, full
        batches, synchronous rounds, neither ν nor the groups encrypted, not split learning) and 0 elsewhere."""
        if self.rejoin_timeout >= 0:
            return self.rejoin_timeout
        can = (self.batch_size == 0 and self.max_staleness == 0 and self.secure_nu == "none"
               and not self.encrypted_groups and self.mode != "split")
        return DEPLOYED_REJOIN_WAIT if self.tables_own and can else 0.0

    @property
    def shared_steps(self) -> bool:
        """Whether block Newton's step lengths are shared by every party: under secure
        aggregation, whose server sees only sums over parties, and for MLP parties with or
        without it, so that masking an MLP run changes what the server sees and nothing else
        (a per-party search on plain replies is another method, whose trajectory parts from
        the masked run's from its first step, and the stop rule then ends the two apart)."""
        return self.masked or self.model != "linear"

    @property
    def newton_moves(self) -> int:
        """Moves a party keeps for Newton's search: its own (per-party step lengths), or its
        parts of the combined moves where the step lengths are shared (:attr:`shared_steps`)."""
        return self.newton_shared_memory if self.shared_steps else self.newton_memory

    @property
    def lr(self) -> float:
        """The parties' step size 1/η."""
        return 1.0 / self.eta

    @property
    def split_step(self) -> float:
        """The split-learning baseline's SGD step (split.lr, or 1/eta when 0)."""
        return self.split_lr or self.lr


SETTINGS: list[Setting] = declared(RunConfig)
BY_FIELD: dict[str, Setting] = {s.field: s for s in SETTINGS}
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}

