"""The FairVFL strategy: dual ascent on λ and masked weights ν, as a Flower Strategy.

Flower's stock ``Strategy.start`` sends one message to every node and runs a separate
evaluate phase; a VFL round instead sends *different* content to active and passive
nodes and needs every party's reply before it can go on. This class therefore keeps
the ``configure_train`` / ``aggregate_train`` seams of ``Strategy`` and overrides
``start`` with the VFL loop (SPEC.md, "One round t"). Test-set evaluation rides on the
round's replies every ``eval-every`` rounds, so ``configure_evaluate`` sends nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

from . import messages as msgs
from . import batching, reliability, secure
from .config import RunConfig
from .metrics import fairness_metrics
from .objective import Groups, TrainStats, dual_step, masked_weights, train_stats
from .problem import ServerLabels

POLL_SECONDS = 0.01


class FederationError(RuntimeError):
    """The federation does not fit the run (wrong nodes, roles, rows) or a party failed."""


class PartyUnavailable(FederationError):
    """A party did not answer within round-timeout, after round-retries re-sends (reliability.py)."""


@dataclass
class Node:
    """What the server knows about one party: its role and row counts, never its data."""

    node_id: int
    role: str
    partition_id: int
    n_train: int
    n_test: int

    def __str__(self) -> str:
        return f"node {self.node_id} (partition {self.partition_id}, {self.role})"


class FairVFL(Strategy):
    """Fair vertical FL (SPEC.md): the server side of one run.

    Parameters
    ----------
    config : RunConfig
        The validated run configuration.
    labels : ServerLabels
        Labels and groups of the training and test rows (the server's own data).
    on_round : callable, optional
        Called with each round's history row (a dict) as soon as it is complete.
    """

    def __init__(
        self,
        config: RunConfig,
        labels: ServerLabels,
        on_round: Callable[[dict], None] | None = None,
    ) -> None:
        self.cfg = config
        self.labels = labels
        self.groups = labels.groups_for(config.constraint, config.constraint_measure)
        self.mu = config.mu_value(len(labels.y_train))
        self.on_round = on_round
        self.wire_dtype = np.dtype(config.wire_dtype)  # float32 unless wire-dtype = "float64"
        self.ckks = secure.CkksServer(len(labels.y_train)) if config.secure_nu == "ckks" else None
        # 0: full batch (also when batch-size >= the training rows); b: rounds train on b rows (batching.py)
        self.batch_size = batching.effective_batch(config.batch_size, len(labels.y_train))
        batching.check_batches(self.groups, config.seed, self.batch_size, config.num_server_rounds)
        self.held_rows: np.ndarray | None = None  # training rows the held partial logits are on (None: all)
        self.lam = np.zeros(self.groups.num_multipliers)  # [λ_1+, λ_1-, ...]; deo: [λ1, λ2]
        self.nodes: dict[int, Node] = {}
        self.u_train: dict[int, np.ndarray] = {}
        self.u_test: dict[int, np.ndarray] = {}
        self.sq_norms: dict[int, float] = {}
        self.steps: dict[int, int] = {}
        self.stats: TrainStats | None = None
        self.history: list[dict] = []
        self.reliability = reliability.Reliability()  # divergence guard; run_server adds checkpoints/resume
        self.setup_seconds = 0.0
        self._t0 = time.perf_counter()

    # -- Strategy interface ------------------------------------------------------
    def summary(self) -> None:
        c = self.cfg
        log(
            INFO,
            "FairVFL: %s, %s model, %d parties (%d active), epsilon=%s, fairness=%s (%s), "
            "eta=%s, beta=%s, c=%s, mu=%s, Q=%d, %d rounds, batch %s",
            c.dataset, c.model, c.num_parties, c.num_active, c.epsilon,
            "on" if c.fairness else "off",
            c.constraint if c.constraint_measure == "loss" else f"{c.constraint} on {c.constraint_measure}", c.eta, c.beta, c.c, c.mu, c.local_steps, c.num_server_rounds,
            f"{self.batch_size} rows" if self.batch_size else "full",
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Dual step on λ, then z and λ to active parties and ν to passive ones.

        With a mini-batch every quantity is on round ``server_round``'s rows only.
        """
        rows = batching.round_rows(self.cfg, server_round, len(self.labels.y_train))
        if rows is None:
            y, z, groups, stats = self.labels.y_train, self._z("train"), self.groups, self.stats
        else:
            y, z, groups = self._batch_view(rows)
            stats = train_stats(y, z, groups)
        if self.cfg.fairness:
            self.lam = dual_step(self.lam, np.array(stats.gaps), self.cfg.epsilon, self.cfg.beta, self.cfg.c)
        nu = self._noisy(masked_weights(y, z, self.lam, groups), server_round)
        evaluate = self._evaluates(server_round)
        out = []
        for node in self.nodes.values():
            if node.role == msgs.ROLE_ACTIVE:
                content = msgs.active_content(z, self.lam, server_round, evaluate, self.wire_dtype)
                kind = msgs.TRAIN_ACTIVE
            elif self.ckks is not None:  # secure-nu=ckks: Enc(ν) only, then a second leg (secure.py)
                content, kind = self.ckks.passive_content(nu, server_round, evaluate), secure.TRAIN_PASSIVE_ENC
            else:
                content = msgs.passive_content(nu, server_round, evaluate, self.wire_dtype)
                kind = msgs.TRAIN_PASSIVE
            out.append(Message(content, dst_node_id=node.node_id, message_type=kind, group_id=str(server_round)))
        return out

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Store each party's new partial logits; record the round's metrics."""
        evaluate = server_round == 0 or self._evaluates(server_round)  # init replies every row
        self.held_rows = batching.reply_rows(self.cfg, server_round, evaluate, len(self.labels.y_train))
        n_train = None if self.held_rows is None else len(self.held_rows)
        for reply in replies:
            node_id = reply.metadata.src_node_id
            logits = reliability.checked_logits(self, reply, n_train)  # shape, dtype, finite: or FederationError
            stats = reply.content.metric_records[msgs.STATS]
            self.u_train[node_id] = logits["train"].astype(np.float64)
            if "test" in logits:
                self.u_test[node_id] = logits["test"].astype(np.float64)
            self.sq_norms[node_id] = float(stats["sq-norm"])
            self.steps[node_id] = int(stats["steps"])
        row = self._record(server_round)
        return None, MetricRecord({k: v for k, v in row.items() if isinstance(v, (int, float))})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No separate evaluate phase: test logits come back with the train replies."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    # -- the VFL loop ------------------------------------------------------------
    def start(  # type: ignore[override]
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float | None = None,
        **_: object,
    ) -> Result:
        """Discover the parties, initialise, then run ``num_rounds`` FairVFL rounds."""
        num_rounds = num_rounds or self.cfg.num_server_rounds
        timeout = timeout or self.cfg.round_timeout
        self.summary()
        setup_started = time.perf_counter()
        self.discover(grid, timeout)
        first = self.reliability.begin(self, grid, timeout)  # initialise, or restore from resume-from
        self.setup_seconds = time.perf_counter() - setup_started
        self._t0 = time.perf_counter()  # "seconds" in the history counts training rounds only
        result = Result()
        if self.cfg.max_staleness > 0:  # bounded-staleness rounds, stragglers may lag (staleness.py, issue 8)
            from .staleness import run_rounds

            return run_rounds(self, grid, first, num_rounds, timeout, result)
        for t in range(first, num_rounds + 1):
            replies = self.exchange(grid, self.configure_train(t, ArrayRecord(), ConfigRecord(), grid), timeout)
            if self.ckks is not None:
                replies = self.ckks.second_leg(self, grid, replies, t, timeout)
            _, metrics = self.aggregate_train(t, replies)
            self.reliability.after_round(self, t)  # divergence guard, checkpoint every checkpoint-every rounds
            result.train_metrics_clientapp[t] = metrics
        return result

    def discover(self, grid: Grid, timeout: float) -> None:
        """Ask every node for its role; check the federation matches the run."""
        deadline = time.monotonic() + timeout
        node_ids = list(grid.get_node_ids())
        while len(node_ids) < self.cfg.num_parties and time.monotonic() < deadline:
            time.sleep(0.5)
            node_ids = list(grid.get_node_ids())
        if len(node_ids) != self.cfg.num_parties:
            raise FederationError(
                f"the run needs num-parties={self.cfg.num_parties} nodes, the federation has {len(node_ids)}"
            )
        queries = [
            Message(RecordDict(), dst_node_id=nid, message_type=msgs.INFO, group_id="discover") for nid in node_ids
        ]
        for reply in self.exchange(grid, queries, timeout, named=False):
            info = reply.content.config_records["info"]
            node = Node(
                node_id=reply.metadata.src_node_id,
                role=str(info["role"]),
                partition_id=int(info["partition-id"]),
                n_train=int(info["n-train"]),
                n_test=int(info["n-test"]),
            )
            self.nodes[node.node_id] = node
            if str(info["ids-digest"]) != self.labels.ids_digest:
                raise FederationError(
                    f"{node} is not aligned with the server's labels: its row ids (digest {info['ids-digest']}, "
                    f"{node.n_train}/{node.n_test} train/test rows) differ from the server's (digest "
                    f"{self.labels.ids_digest}, {len(self.labels.y_train)}/{len(self.labels.y_test)} rows); "
                    "every party file must hold the same row ids and train/test split (re-export them). "
                    "Refused before round 1"
                )
            if node.n_train != len(self.labels.y_train) or node.n_test != len(self.labels.y_test):
                raise FederationError(
                    f"{node} has {node.n_train}/{node.n_test} train/test rows, the server "
                    f"{len(self.labels.y_train)}/{len(self.labels.y_test)}"
                )
        pids = sorted(n.partition_id for n in self.nodes.values())
        if pids != list(range(self.cfg.num_parties)):
            raise FederationError(f"partition ids must be 0..{self.cfg.num_parties - 1} once each, got {pids}")
        n_active = sum(n.role == msgs.ROLE_ACTIVE for n in self.nodes.values())
        if n_active != self.cfg.num_active:
            raise FederationError(f"expected {self.cfg.num_active} active parties, found {n_active}")
        log(INFO, "FairVFL: %s", ", ".join(str(n) for n in sorted(self.nodes.values(), key=lambda n: n.partition_id)))

    def initialise(self, grid: Grid, timeout: float) -> None:
        """Every party builds its model and sends its first partial logits (round 0)."""
        messages = [
            Message(msgs.init_content(True), dst_node_id=nid, message_type=msgs.INIT, group_id="0")
            for nid in self.nodes
        ]
        if self.ckks is not None:
            self.ckks.ship_context(messages, secure.passive_nodes(self.nodes))
        self.aggregate_train(0, self.exchange(grid, messages, timeout))

    def exchange(self, grid: Grid, messages: Iterable[Message], timeout: float, named: bool = True) -> list[Message]:
        """Push, then poll for replies every 10 ms (Flower's own loop sleeps 3 s); re-send to
        silent nodes up to round-retries times; check every reply's envelope (reliability.py)."""
        return reliability.exchange(self, grid, messages, timeout, self.cfg.round_retries, named)

    # -- helpers -----------------------------------------------------------------
    def _noisy(self, nu: np.ndarray, server_round: int) -> np.ndarray:
        """ν + N(0, (nu-noise / n)²) per row: the scale of ν itself is about 1/n.

        A defence against reading labels off sign(ν) (see the audit); no formal
        differential-privacy guarantee is claimed. The noise is zero-mean, so it averages
        out in a passive party's gradient X_kᵀν (its std there shrinks like 1/√n).
        """
        if self.cfg.nu_noise <= 0:
            return nu
        rng = np.random.default_rng([self.cfg.seed, server_round, 0x6E75])
        return nu + rng.normal(scale=self.cfg.nu_noise / len(nu), size=nu.shape)

    def _who(self, node_id: int, named: bool) -> str:
        return str(self.nodes[node_id]) if named and node_id in self.nodes else f"node {node_id}"

    def _z(self, split: str) -> np.ndarray:
        parts = self.u_train if split == "train" else self.u_test
        return np.sum([parts[nid] for nid in self.nodes], axis=0)

    def _batch_view(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, Groups]:
        """Labels, summed logits and constraint groups on the batch ``rows``."""
        z = self._z("train")
        if self.held_rows is None:  # an evaluation round's replies held every row
            z = z[rows]
        elif not np.array_equal(self.held_rows, rows):
            raise FederationError("internal: the parties' logits are not on this round's batch rows")
        return self.labels.y_train[rows], z, batching.batch_groups(self.groups, rows)

    def _evaluates(self, server_round: int) -> bool:
        return server_round % self.cfg.eval_every == 0 or server_round == self.cfg.num_server_rounds

    def _record(self, server_round: int) -> dict:
        """History row for θ after ``server_round`` (round 0: the initial model).

        Mini-batch runs: L and the gaps are on every training row in evaluation rounds,
        and on the next round's batch otherwise (``train_rows`` says which).
        """
        if self.held_rows is None:
            self.stats = train_stats(self.labels.y_train, self._z("train"), self.groups)
        else:
            self.stats = train_stats(*self._batch_view(self.held_rows))
        row: dict = {
            "round": server_round,
            "loss": self.stats.loss + 0.5 * self.mu * sum(self.sq_norms.values()),
            "deo": self.stats.deo,
            "gap": self.stats.gap,
            "lambda1": float(self.lam[0]),
            "lambda2": float(self.lam[1]),
            "max_gap": self.stats.max_gap,  # max_c |D_c|: the constraint set holds when <= ε
            "gaps": list(self.stats.gaps),  # D_c of every constraint (deo: [D])
            "lambdas": [float(v) for v in self.lam],  # all multipliers [λ_1+, λ_1-, λ_2+, λ_2-, ...]
            "acc": np.nan,
            "dfp": np.nan,
            "dfn": np.nan,
            "seconds": time.perf_counter() - self._t0,
        }
        if self.batch_size:
            row["train_rows"] = len(self.labels.y_train) if self.held_rows is None else len(self.held_rows)
        if self.u_test and (server_round == 0 or self._evaluates(server_round)):
            row.update(fairness_metrics(self.labels.y_test, self.labels.s_test, self._z("test")))
            self.u_test.clear()
            log(
                INFO,
                "[round %d/%d] L=%.4f DEO=%.4f (eps %.3g) lambda=(%.4f, %.4f) | test ACC=%.2f%% DFP=%.3f DFN=%.3f | %.1f s",
                server_round, self.cfg.num_server_rounds, row["loss"], row["deo"], self.cfg.epsilon,
                row["lambda1"], row["lambda2"], 100 * row["acc"], row["dfp"], row["dfn"], row["seconds"],
            )
        self.history.append(row)
        if self.on_round is not None:
            self.on_round(row)
        return row
