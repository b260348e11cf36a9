"""A party's node configuration (NodeConfig): every key a SuperNode's --node-config may give, declared once.

Each key is a field of :class:`NodeConfig` declared with ``settings.setting`` (type,
default, help, rule), as the run config's are. :meth:`NodeConfig.from_flower` is the one
reader of Flower's ``context.node_config``: it refuses a key it does not know, naming the
closest declared ones (a misspelt ``missing-values`` would otherwise train ``"?"`` as a
category), and a value of the wrong type or outside its rule, naming the key. The node
config table of docs/deploy.md is generated from the declarations
(``python -m fairvfl_flwr.config --write``).

Whether a node is a deployed party (it names its own data) and where its own disk folder
is (:attr:`NodeConfig.folder`) are answered here once. Nothing here imports Flower.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import parse_qs, urlsplit

from fairvfl_flwr.config.settings import Rule, Setting, at_least, cell as _cell, coerce, declared, setting
from fairvfl_flwr.core.errors import ConfigError

#: The environment variable naming a party's folder where its node config names no cache-dir.
CACHE_ENV = "FAIRVFL_CACHE_DIR"
ROLES = ("active", "passive", "registry")
#: The node-config keys that name the party's own files: a node giving one is a deployed party.
DATA_KEYS = ("data-path", "table-path", "table-sql", "score-path")


class NodeConfigError(ValueError):
    """The SuperNode's node config does not fit this run, or names a key or value it cannot."""


def default_folder() -> Path:
    """A party's folder where its node config names no ``cache-dir``: ``$FAIRVFL_CACHE_DIR``,
    else ``fairvfl-flwr`` under the user's cache folder."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fairvfl-flwr"


def party_folder(cache_dir: str) -> Path:
    """The party's own disk folder (parsed tables, aligned blocks, state, models): ``cache_dir``
    when given, else :func:`default_folder`."""
    return Path(cache_dir).expanduser() if cache_dir else default_folder()


N = setting  # the declarations below read as a table
_ALL, _ACTIVE, _OPTIONAL = "all", "active", "optional"
_OWN = "optional, `tables.own`"
_HOLDER = "active, or registry"


def _label_choice(value: int) -> bool:
    return value in (-1, 0, 1)


def url_password(url: str) -> bool:
    """Whether a database URL holds a password (``user:secret@host``, or ``?password=``): a node
    config is shown in logs and process lists, so the password comes from the environment."""
    try:
        parts = urlsplit(url)
        return bool(parts.password) or any(k.lower() == "password" for k in parse_qs(parts.query))
    except ValueError:  # not a URL at all: the driver names the problem when it is read
        return False


def redacted(value: Any) -> Any:
    """``value`` as a log line may show it: a database URL's password replaced by ``***``."""
    if not isinstance(value, str) or not url_password(value):
        return value
    parts = urlsplit(value)
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1) if parts.password else parts.netloc
    query = "&".join("password=***" if q.split("=", 1)[0].lower() == "password" else q for q in parts.query.split("&"))
    return parts._replace(netloc=netloc, query=query).geturl()


def _one_table(path: str, node: Any) -> bool:
    return not (path and node.table_sql)


def _sql_url(url: str, node: Any) -> bool:
    return not url_password(url)


def _sql_query(query: str, node: Any) -> bool:
    return bool(query.strip()) == bool(node.table_sql)


def _env_name(name: str, node: Any) -> bool:
    return not name or (bool(node.table_sql) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is not None)


@dataclass(frozen=True)
class NodeConfig:
    """Every key of one SuperNode's ``--node-config`` (defaults: a simulated node)."""

    partition_id: int = N(0, "the party's index 0..K-1 (active parties first); seeds its model. Simulation: Flower "
                          "sets it", rule=at_least(0), why="must be >= 0", who=_ALL)
    num_partitions: int = N(0, "set by Flower's simulation engine: its SuperNodes, which must be num-parties",
                            rule=at_least(0), why="must be >= 0", who="simulation")
    role: str = N("", "active (holds the label and the sensitive column), passive, or registry (holds the sensitive "
                  "column instead of the label owner: run config groups.holder); read where the node names its own "
                  "data", choices=("", *ROLES), why='give role="active" or role="passive" (or role="registry")',
                  who="deployed")
    data_path: str = N("", "the party's exported CSV (fairvfl-export), absolute path", who="exported files")
    table_path: str = N("", "the party's own raw table (CSV, or Parquet by the .parquet suffix, which needs pyarrow) "
                        "instead of data-path; its score-path may be Parquet too", rule=_one_table,
                        why="give table-path or table-sql, not both", who="`tables.own`")
    table_sql: str = N("", "the party's own table in its database instead of table-path: a SQLAlchemy URL "
                       "(postgresql+psycopg://user@host/db, sqlite:////data/crm.db) without a password; needs the sql "
                       "extra", rule=_sql_url, why="a database URL holds no password: name the environment variable "
                       "that holds it in table-sql-password-env", who="`tables.own`, optional")
    table_sql_query: str = N("", "with table-sql: the table's name (schema.table) or a SELECT query whose rows are "
                             "the party's table", rule=_sql_query, why="give table-sql-query (a table name or a "
                             "SELECT query) with table-sql, and only with it", who="with table-sql")
    table_sql_password_env: str = N("", "with table-sql: the environment variable of the SuperNode that holds the "
                                    "database password (empty: none, or the driver's own, e.g. ~/.pgpass)",
                                    rule=_env_name, why="give the name of an environment variable (letters, digits, "
                                    "_), with table-sql", who="with table-sql, optional")
    columns: str = N("", "the raw columns it contributes, comma-separated (default: all but the id, label and "
                     "sensitive columns)", who=_OWN)
    id_column: str = N("row_id", "the row id column", who=_ALL)
    split_column: str = N("split", "the train/test column of an exported file", who="exported files")
    label_column: str = N("", "the label column", who=_ACTIVE)
    label_positive: str = N("", "the label's positive value", who=_ACTIVE)
    label_negative: str = N("", "the label's other value; empty: the column must hold exactly one other value, and "
                            "any third value is refused", who="active, optional")
    sensitive_column: str = N("", "the sensitive column; with table-path several may be named (sex,race: every "
                              "combination is a group)", who=_HOLDER)
    group_a: str = N("", "the sensitive column's first group value; with table-path leave group-a and group-b out "
                     "to make every value a group", who=_HOLDER)
    group_b: str = N("", "the sensitive column's second group value", who=_HOLDER)
    protected_label: int = N(0, "1: N^a/N^b are the rows with the positive label, -1: the negative one (0: not given)",
                             rule=Rule(_label_choice, "1 or -1"),
                             why="give 1 (the positive label is the protected one) or -1", who=_ACTIVE)
    missing_values: str = N("", "markers that mean a missing value in this party's table and score file, e.g. "
                            "'?,NA' (`<blank>`: cells of spaces; empty: run config tables.missing-values)",
                            who=_OPTIONAL)
    protected_columns: str = N("", "the party's protected columns, e.g. 'race,age': never model inputs unless run "
                               "config sensitive-as-input, and listed on its model card (fairvfl-preflight suggests "
                               "likely ones)", who=_OWN)
    real_categories: str = N("", "values of text columns that look like missing markers (?, NA, unknown, -, ...) "
                             "but are real categories, 'column:value,...'; such a value declared neither here nor in "
                             "missing-values is refused", who=_OWN)
    cache_dir: str = N("", "the party's own folder: parsed tables, aligned blocks, state and models (empty: "
                       "$FAIRVFL_CACHE_DIR, else ~/.cache/fairvfl-flwr)", who=_OPTIONAL)
    model_dir: str = N("", "where the party keeps its trained blocks, <model-dir>/<run id>/partition-<k>/ (empty: "
                       "models/ under cache-dir); scoring.md", who=_OPTIONAL)
    state_dir: str = N("", "the party's folder for its state of the last rounds (rejoin and resume; empty: run config "
                       "reliability.checkpoint-dir, else state/ under cache-dir)", who=_OPTIONAL)
    score_path: str = N("", "the party's raw file of rows to score (mode = \"score\"); scoring.md", who="scoring")
    unscored_path: str = N("", "a file on the party's disk that receives the ids of its score file not held by every "
                           "party (not scored)", who="optional, scoring of own tables")
    identity_key: str = N("", "this party's Ed25519 private key (PEM), made on its machine with fairvfl-keys new",
                          who="deployed")
    peers: str = N("", "every party's public identity key, pinned (fairvfl-keys peers); check it with fairvfl-keys "
                   "fingerprints", who="deployed")
    allow_unmasked: bool = N(False, "true: this keyless node answers unmasked jobs (default: refused); it never "
                             "waives authentication", who=_OPTIONAL)
    release_secret: str = N("", "a file of 32+ random bytes made on the registry's machine: keys its randomized "
                            "response, each row drawn alike in every run (simulation: drawn per run)",
                            who="registry")
    release_epsilon: float = N(0.0, "the most epsilon_S this registry spends on its groups' releases over its "
                               "lifetime, kept in its ledger (state-dir): different epsilon_S add up, the same again "
                               "is free (0: its first release's, its only one)", rule=at_least(0),
                               why="must be >= 0", who="registry, optional")
    sums_per_round: int = N(256, "encrypted groups: the most sums over its groups this registry decrypts for one "
                            "round (each a sum over every row, under the server's masks); a request beyond it is "
                            "refused (0: no limit)", rule=at_least(0), why="must be >= 0", who="registry, optional")
    sums_per_run: int = N(0, "encrypted groups: the most sums this registry decrypts in a run (0: sums-per-round "
                          "times the run's rounds + 2)", rule=at_least(0), why="must be >= 0",
                          who="registry, optional")
    sums_lifetime: int = N(65536, "encrypted groups: the most sums this registry decrypts over all its runs, kept "
                           "in its ledger on its own disk (state-dir), which no fresh run resets (0: no limit)", rule=at_least(0), why="must be >= 0", who="registry, optional")
    sum_noise: float = N(4.0, "encrypted groups: the standard deviation of the Gaussian noise this registry adds "
                         "to every sum it decrypts, in the slots' units (a slot holds at most 2^17; privacy.md#a-"
                         "registry-holds-the-groups)", rule=at_least(0), why="must be >= 0",
                         who="registry, optional")
    delay_seconds: float = N(0.0, "a simulated straggler: seconds each train reply is held back (given here, it "
                             "overrides run config staleness.straggler-delays for this node)", rule=at_least(0),
                             why="must be >= 0 seconds", who="optional, testing")
    delay_jitter: float = N(0.0, "a simulated straggler: up to this many more seconds, drawn per message",
                            rule=at_least(0), why="must be >= 0 seconds", who="optional, testing")
    #: the keys the node config gave (a key left at its default and one not given differ for some)
    given: frozenset = dataclasses.field(default=frozenset(), repr=False, metadata={"not-a-setting": True})

    # -- construction ------------------------------------------------------------
    @classmethod
    def settings(cls) -> list[Setting]:
        """Every node-config key, in declaration order."""
        return SETTINGS

    @staticmethod
    def from_flower(node_config: Mapping[str, Any]) -> "NodeConfig":
        """The one reader of Flower's ``context.node_config`` (or a ``--node-config`` text's
        pairs): typed, checked, cached per distinct config (every message of a node carries the
        same one). An unknown key or a bad value raises :class:`NodeConfigError` naming it."""
        if isinstance(node_config, NodeConfig):
            return node_config
        return _parsed(tuple(sorted((str(k), _hashable(v)) for k, v in node_config.items())))

    @staticmethod
    def of(context: Any) -> "NodeConfig":
        """The node config of a Flower ``context`` (:meth:`from_flower` of ``context.node_config``)."""
        return NodeConfig.from_flower(context.node_config)

    @property
    def deployed(self) -> bool:
        """Whether this node reads its own data (a deployed party), not the packaged tables of a simulation."""
        return bool(self.data_keys)

    @property
    def data_keys(self) -> tuple[str, ...]:
        """The keys among :data:`DATA_KEYS` that this node gives."""
        return tuple(k for k in DATA_KEYS if getattr(self, BY_KEY[k].field))

    @property
    def has_table(self) -> bool:
        """Whether this node trains on a table of its own (data-path, table-path or table-sql)."""
        return bool(self.data_path or self.table_path or self.table_sql)

    @property
    def folder(self) -> Path:
        """The party's own disk folder (:func:`party_folder` of its ``cache-dir``)."""
        return party_folder(self.cache_dir)

    @property
    def where(self) -> str:
        """The node as a log line names it before its run is known: its partition."""
        return f"partition {self.partition_id if 'partition-id' in self.given else '?'}"


DOCS_BEGIN = "<!-- node config: generated from fairvfl_flwr/config/node.py (python -m fairvfl_flwr.config --write) -->"
DOCS_END = "<!-- end of node config -->"


def render_docs() -> str:
    """The node-config table of docs/deploy.md, one row per declared key."""
    out = [DOCS_BEGIN, "", "| key | who | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        allowed = (", ".join(f"`{c}`" for c in s.choices if c != "") if s.choices else s.allowed)
        meaning = s.help + (f" (allowed: {allowed})" if allowed else "")
        out.append(f"| `{s.key}` | {s.who} | {_cell(s.default)} | {meaning} |")
    return "\n".join(out + ["", DOCS_END])


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@functools.lru_cache(maxsize=32)
def _parsed(items: tuple) -> NodeConfig:
    # the partition first: every later refusal names the party it is about
    items = tuple(sorted(items, key=lambda kv: kv[0] != "partition-id"))
    values: dict[str, Any] = {}
    who = ""
    for key, raw in items:
        s = BY_KEY.get(key)
        if s is None:
            close = difflib.get_close_matches(key, BY_KEY, n=2, cutoff=0.6)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise NodeConfigError(f"{who}node config {key}={redacted(raw)!r}: unknown key{hint}; the keys are listed in "
                                  "docs/deploy.md (Node config keys)")
        try:
            values[s.field] = coerce(key, raw, s.type, "node config")
        except ConfigError as exc:
            raise NodeConfigError(f"{who}{exc}") from None
        if key == "partition-id":
            who = f"party {values[s.field]}: "
    if "role" in values:
        values["role"] = values["role"].strip().lower()
    node = NodeConfig(**values, given=frozenset(k for k, _ in items))
    path = node.data_path or node.table_path or node.table_sql
    if who and path:
        who = f"party {node.partition_id} ({redacted(path)}): "
    for s in SETTINGS:
        why = s.refusal(node)
        if why is not None:
            raise NodeConfigError(f"{who}node config {s.key}={redacted(getattr(node, s.field))!r}: {why}")
    return node


SETTINGS: list[Setting] = declared(NodeConfig)
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}
