"""The server side of a vertical FL run: what every algorithm shares.

:class:`VFLServer` is not a Flower ``Strategy``. Flower's ``Strategy.start`` is the
horizontal loop: the same arrays to every node, one global model aggregated from the
replies, a separate evaluate phase; Flower's strategy wrappers (differential privacy,
...) inherit that loop and act on the aggregated arrays. A VFL round has no global
arrays: it sends *different* content to active and passive nodes, needs every party's
reply before it can go on, and starts with discovery and a round 0. A wrapper around a
VFL "strategy" would run the stock loop instead of this one, so the class does not claim
the contract (docs/architecture.md, "Flower's Strategy contract"). It keeps the
``configure_train`` / ``aggregate_train`` seams under Flower's names and shapes; test-set
evaluation rides on the round's replies every ``eval-every`` rounds.

An algorithm (``algorithms/``) subclasses :class:`VFLServer` and writes
``configure_train`` (what each party receives) and ``z`` (the server's scores from the
held replies). Features attach through :class:`~fairvfl_flwr.flower.hooks.RoundHook`
objects and a round scheduler; nothing here names a feature. Every reply enters the
server's state through :meth:`VFLServer.fold`, and the whole state round-trips through
:meth:`state_dict` / :meth:`load_state_dict`.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any, Callable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.core import batching
from fairvfl_flwr.core.constraints import ConstraintSet, SensitiveGroups, constrained_codes
from fairvfl_flwr.core.metrics import RAW_METRICS, group_counts, predict
from fairvfl_flwr.core.objective import TrainStats, train_stats
from fairvfl_flwr.core.stopping import GAP_SLACK, StopRule
from fairvfl_flwr.data.problem import ServerLabels
from fairvfl_flwr.flower import checks, exchange
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.discovery import discover_nodes
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.hooks import Hooks, Node, RoundHook, ServerView
from fairvfl_flwr.core.newton import smooth_part
from fairvfl_flwr.flower.records import config_records, metric_records


#: The test metrics of an evaluated round (NaN in the others): core/metrics.fairness_metrics, over
#: the groups the run constrained.
TEST_METRICS = ("acc", "dfp", "dfn", "dp_diff", "eo_diff")
#: Beside them where small groups were pooled: the same differences over the data's own groups.
RAW_TEST_METRICS = tuple(f"{k}_raw" for k in RAW_METRICS)


class SyncRounds:
    """The synchronous round loop: every party's reply to round t before round t + 1."""

    def run(self, server: "VFLServer", grid: Grid, first: int, last: int, timeout: float, result: Result) -> Result:
        """Rounds ``first`` to ``last``, each waiting for every party's reply, until the last round or
        the stop rule ends training; the result of the last round folded."""
        for t in range(first, last + 1):
            replies = server.exchange(grid, server.configure_train(t, ArrayRecord(), ConfigRecord(), grid), timeout)
            replies = server.hooks.incoming(grid, t, replies, timeout)
            _, metrics = server.aggregate_train(t, replies)
            server.hooks.end(grid, t, timeout)
            result.train_metrics_clientapp[t] = metrics
            if t >= server.last_round:  # an algorithm that converged ended training early
                break
        return result


class VFLServer:
    """The server of one vertical FL run: discovery, exchange, state, history, the loop.

    Parameters
    ----------
    config : RunConfig
        The validated run configuration.
    labels : ServerLabels
        Labels and groups of the training and test rows (the server's own data).
    on_round : callable, optional
        Called with each round's history row (a dict) as soon as it is complete.
    hooks : iterable of RoundHook
        Features on the round loop, called in order.
    scheduler : object with ``run(server, grid, first, last, timeout, result)``
        The round loop; :class:`SyncRounds` unless a feature replaces it.
    """

    #: Values per row in a party's reply (a partial logit: 1).
    width = 1
    #: The message type that starts (or restarts) a party's model.
    init_type = msgs.INIT
    #: Whether the stop rule (``stop-tolerance``, ``stop-window``) may end training early.
    stops = True
    #: Whether this algorithm computes every fairness term on the server (no party's own steps use the
    #: constraint), so that the stop rule may sharpen the smooth rates mid-run (core/stopping.py).
    sharpens = False
    #: The attributes a round changes: what :meth:`snapshot` keeps (an algorithm adds its own).
    round_state: tuple[str, ...] = ("lam", "u_train", "u_test", "sq_norms", "steps", "stats", "history",
                                    "held_rows", "last_round", "stop", "reference")
    #: Of those, the mappings keyed by node id: :meth:`rebind` moves a restarted party's entries.
    node_keyed: tuple[str, ...] = ("u_train", "u_test", "sq_norms", "steps")

    def __init__(
        self,
        config: RunConfig,
        labels: ServerLabels,
        on_round: Callable[[dict], None] | None = None,
        hooks: Iterable[RoundHook] = (),
        scheduler: Any = None,
    ) -> None:
        self.cfg = config
        self.labels = labels
        self._constraint = labels.constraint_for(config.constraint, config.measure)  # at temperature 1
        # with pooled groups, each row's constrained group: the figures a user reads are over the
        # groups ε holds for, not over a member of one test row (None: the data's groups are those,
        # or the server holds no row's group: encrypted groups are pooled under the registry's key)
        pooled = self._constraint.pooling is not None and self._constraint.groups is not None
        self.constrained_test, self.constrained_train = (
            (constrained_codes(self._constraint, labels.s_test, labels.group_names),
             constrained_codes(self._constraint, labels.s_train, labels.group_names)) if pooled else (None, None))
        self.mu = config.mu_value(len(labels.y_train))
        self.on_round = on_round
        self.view = ServerView(self)  # what the hooks see of this server
        self.hooks = Hooks(hooks, self.view)
        self.scheduler = scheduler or SyncRounds()
        self.wire_dtype = np.dtype(config.wire_dtype)
        # 0: full batch (also when batch-size >= the training rows); b: rounds train on b rows
        self.batch_size = batching.effective_batch(config.batch_size, len(labels.y_train))
        batching.check_batches(self._constraint, config.seed, self.batch_size, config.num_server_rounds)
        self.held_rows: np.ndarray | None = None  # training rows the held partial logits are on (None: all)
        self.lam = np.zeros(self._constraint.num_multipliers)  # multipliers; stay 0 without a fairness term
        # the training scores a constraint whose gaps are not all linear in q (a release's spread) takes
        # their slopes at (:meth:`record`); None: none taken, or every gap linear
        self.reference: np.ndarray | None = None
        self._linearised_at: np.ndarray | None = None
        self.nodes: dict[int, Node] = {}
        self.u_train: dict[int, np.ndarray] = {}
        self.u_test: dict[int, np.ndarray] = {}
        self.sq_norms: dict[int, float] = {}
        self.steps: dict[int, int] = {}
        self.stats: TrainStats | None = None
        self.history: list[dict] = []
        # The round training ends with: num-server-rounds, unless an algorithm finds itself
        # converged sooner and says so by lowering it (it then evaluates that round).
        self.last_round = config.num_server_rounds
        # a rate constraint's ε is read as fairlearn's hard difference: the stop rule tightens the
        # smooth gaps' bound until the hard ones meet it (the loss measure, the paper's, has no hard
        # gap), except where a gap is not linear in q: a release margin's spread gaps hold the release's
        # error at ε's scale, and a bound the rule moved would move the margin with it
        hard_target = (config.epsilon if config.hard_epsilon and self._constraint.q.hard and self._constraint.linear
                       else None)
        # sharper rates change every fairness term: only where the server computes them all, and not
        # under label DP, whose noise is calibrated to the rates' slope at the start
        self.stop = StopRule(config.stop_tolerance, config.stop_window, config.epsilon, config.fairness,
                             target=hard_target, sharpen=self.sharpens and config.label_dp_epsilon <= 0)
        self.setup_seconds = 0.0
        self.first_round_started: float | None = None  # perf_counter when the first training round began
        self._t0 = time.perf_counter()

    @property
    def constraint(self) -> ConstraintSet:
        """The run's constraint at the stop rule's temperature of the smooth rates (1 unless sharpened),
        its gaps' slopes taken at :attr:`reference` (ConstraintSet.linearised)."""
        temperature = self.stop.temperature
        if self._constraint.temperature != temperature:
            self._constraint = dataclasses.replace(self._constraint, temperature=temperature)
            self._linearised_at = None  # the slopes were of the other temperature's values
        if self._linearised_at is not self.reference:
            self._constraint = self._constraint.linearised(self.labels.y_train, self.reference)
            self._linearised_at = self.reference
        return self._constraint

    # -- what an algorithm writes ---------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The round's training messages, one per party (each algorithm writes its own: what the active
        and passive parties receive)."""
        raise NotImplementedError

    def masked_gradient_message(self, node_id: int, server_round: int,
                                arrays: dict[str, np.ndarray]) -> tuple[RecordDict, str]:
        """The second message of a round to a passive party whose ν went out encrypted: with
        ``arrays`` (an encryption feature's) it recovers its gradient X_kᵀν; gradient descent
        then takes its step. An algorithm whose parties do more with it overrides this."""
        content = RecordDict({msgs.PAYLOAD: msgs.array_record(**arrays),
                              msgs.ROUND: msgs.round_config(server_round, self.evaluates(server_round))})
        return content, msgs.TRAIN_PASSIVE_UNMASK

    def z(self, split: str) -> np.ndarray:
        """The server's scores on ``split`` ("train" or "test"): the sum of the held partial
        logits (an algorithm whose replies are not partial logits overrides this). Summed in
        partition order, so that a run's floats do not depend on the node ids a runtime
        assigns."""
        parts = self.u_train if split == "train" else self.u_test
        return np.sum([parts[n.node_id] for n in self.ordered_nodes()], axis=0)

    def init_content(self) -> RecordDict:
        """The start message's content (round 0): every party returns its initial logits, test ones too."""
        return msgs.init_content(True)

    # -- the round's seams (Flower's names) and the loop ---------------------------------
    def summary(self) -> None:
        """Log the run's shape once before round 0: data, model, parties, rounds."""
        log(INFO, "%s: %s, %s model, %d parties, %d rounds", type(self).__name__, self.cfg.data_name,
            self.cfg.model, self.cfg.num_parties, self.cfg.num_server_rounds)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Fold each party's reply into the server's state; record the round."""
        evaluate = server_round == 0 or self.evaluates(server_round)  # init replies every row
        self.held_rows = batching.reply_rows(self.cfg, server_round, evaluate, len(self.labels.y_train))
        n_train = None if self.held_rows is None else len(self.held_rows)
        # the stop rule needs F on every training row before and after the round's steps
        f_before = self.objective() if server_round > 0 and self.stops and not self.batch_size else None
        for reply in replies:
            self.fold(reply, n_train)
        if f_before is not None and self.converged(f_before, self.z("train")):
            # the last round is evaluated: when this one's replies hold no test logits, one more round
            self.last_round = server_round if evaluate else server_round + 1
            self.log_stop(server_round)
        row = self.record(server_round)
        return None, MetricRecord({k: v for k, v in row.items() if isinstance(v, (int, float))})

    def start(self, grid: Grid, num_rounds: int | None = None, timeout: float | None = None) -> Result:
        """Discover the parties, initialise (or let a hook restore), then run the rounds
        (``num_rounds``, ``timeout``: default num-server-rounds and reliability.round-timeout)."""
        num_rounds = num_rounds or self.cfg.num_server_rounds
        self.last_round = num_rounds
        timeout = timeout or self.cfg.round_timeout
        self.summary()
        if self.cfg.fairness and self.constraint.groups is not None:
            log(INFO, "FairVFL: %s on %s, %d groups (%s), %d gap(s)", self.cfg.constraint, self.cfg.measure,
                len(self.constraint.groups), ", ".join(self.constraint.groups.names), len(self.constraint.gap_list))
            if self.constraint.pooling is not None:
                log(INFO, "FairVFL: %s", self.constraint.pooling.describe())
        setup_started = time.perf_counter()
        log(INFO, "FairVFL: set-up: asking every party for its role and rows")
        self.discover(grid, timeout)
        log(INFO, "FairVFL: set-up: parties found in %.1f s; the features' set-up and the initial model (round 0) "
            "next", time.perf_counter() - setup_started)
        first = self.hooks.begin(grid, timeout)
        if first is None:
            self.initialise(grid, timeout)
            self.hooks.end(grid, 0, timeout)
            first = 1
        self.setup_seconds = time.perf_counter() - setup_started
        self.first_round_started = time.perf_counter()
        log(INFO, "[round %d] starts (set-up took %.1f s)", first, self.setup_seconds)
        self._t0 = time.perf_counter()  # "seconds" in the history counts training rounds only
        result = Result()
        while True:
            try:
                return self.scheduler.run(self, grid, first, num_rounds, timeout, result)
            except FederationError as exc:  # a hook may bring the federation back (features/rejoin.py)
                first = self.hooks.recover(grid, exc, timeout)
                if first is None:
                    raise

    # -- the parts of a round ------------------------------------------------------------
    def discover(self, grid: Grid, timeout: float) -> None:
        """Ask every node for its role; check the federation matches the run. Nodes still
        joining are waited for, up to ``timeout`` (flower/discovery.py)."""
        node_ids = discover_nodes(grid, self.cfg.num_parties, timeout)
        queries = [
            Message(RecordDict(), dst_node_id=nid, message_type=msgs.INFO, group_id="discover") for nid in node_ids
        ]
        replies = self.exchange(grid, queries, timeout, named=False)
        for reply in replies:
            node = self.node_of(reply)
            self.nodes[node.node_id] = node
        pids = sorted(n.partition_id for n in self.nodes.values())
        if pids != list(range(self.cfg.num_parties)):
            raise FederationError(f"partition ids must be 0..{self.cfg.num_parties - 1} once each, got {pids}")
        n_active = sum(n.role == msgs.ROLE_ACTIVE for n in self.nodes.values())
        if n_active != self.cfg.num_active:
            raise FederationError(f"expected {self.cfg.num_active} active parties, found {n_active}")
        log(INFO, "FairVFL: %s", ", ".join(str(n) for n in self.ordered_nodes()))
        self.hooks.discovered(replies)

    def node_of(self, reply: Message, when: str = "before round 1") -> Node:
        """The node a ``query.info`` reply describes, checked against the server's labels: the same row
        ids (digest) and train/test rows (``when``: when a refusal stops the run)."""
        info = config_records(reply.content)["info"]
        node = Node(
            node_id=reply.metadata.src_node_id,
            role=str(info["role"]),
            partition_id=int(info["partition-id"]),
            n_train=int(info["n-train"]),
            n_test=int(info["n-test"]),
        )
        if str(info["ids-digest"]) != self.labels.ids_digest:
            raise FederationError(
                f"{node} is not aligned with the server's labels: its row ids (digest {info['ids-digest']}, "
                f"{node.n_train}/{node.n_test} train/test rows) differ from the server's (digest "
                f"{self.labels.ids_digest}, {len(self.labels.y_train)}/{len(self.labels.y_test)} rows); "
                "every party file must hold the same row ids and train/test split (re-export them). "
                f"Refused {when}"
            )
        if node.n_train != len(self.labels.y_train) or node.n_test != len(self.labels.y_test):
            raise FederationError(
                f"{node} has {node.n_train}/{node.n_test} train/test rows, the server "
                f"{len(self.labels.y_train)}/{len(self.labels.y_test)}"
            )
        return node

    def initialise(self, grid: Grid, timeout: float) -> None:
        """Every party builds its model and sends its first replies (round 0)."""
        messages = [
            Message(self.init_content(), dst_node_id=nid, message_type=self.init_type, group_id="0")
            for nid in self.nodes
        ]
        self.aggregate_train(0, self.hooks.incoming(grid, 0, self.exchange_init(grid, messages, timeout), timeout))

    def exchange_init(self, grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
        """Send (re)start messages with what every hook adds to them (``init_messages``)."""
        self.hooks.init_messages(messages)
        return self.exchange(grid, messages, timeout)

    def exchange(self, grid: Grid, messages: Iterable[Message], timeout: float, named: bool = True) -> list[Message]:
        """Push, poll, retry and check envelopes (:func:`fairvfl_flwr.flower.exchange.exchange`),
        once every hook has seen the messages (``outgoing``)."""
        messages = list(messages)
        self.hooks.outgoing(messages)
        return exchange.exchange(grid, messages, timeout, self.cfg.round_retries,
                                 lambda nid: self.who(nid, named))

    def fold(self, reply: Message, n_train: int | None = None) -> None:
        """Check one party's reply and make it the server's view of that party.

        ``n_train``: training rows the reply must hold (a mini-batch's b); default all.
        Raises :class:`FederationError` naming the node for a malformed reply.
        """
        nid = reply.metadata.src_node_id
        n_train = len(self.labels.y_train) if n_train is None else n_train
        try:
            logits = checks.check_logits_reply(reply.content, self.who(nid), n_train, len(self.labels.y_test),
                                               width=self.width)
        except checks.ReplyError as exc:
            raise FederationError(f"rejected a reply: {exc}") from None
        stats = metric_records(reply.content)[msgs.STATS]
        self.u_train[nid] = logits["train"].astype(np.float64)
        if "test" in logits:
            self.u_test[nid] = logits["test"].astype(np.float64)
        self.sq_norms[nid] = float(stats["sq-norm"])
        self.steps[nid] = int(stats["steps"])

    def objective(self, z: np.ndarray | None = None, sq_norm: float | None = None) -> float:
        """F at the current λ: φ(z) + (μ/2) Σ_k ‖θ_k‖², by default of the held logits and norms."""
        z = self.z("train") if z is None else z
        sq_norm = sum(self.sq_norms.values()) if sq_norm is None else sq_norm
        return smooth_part(self.constraint, self.labels.y_train, z, self.lam) + 0.5 * self.mu * sq_norm

    def converged(self, f_before: float, z_after: np.ndarray) -> bool:
        """Feed the round just folded (F before its steps, the logits after) to the stop rule."""
        f_after = self.objective(z_after)
        y = self.labels.y_train
        hard, over = None, False
        smooth = self.constraint.gaps(y, z_after)
        if self.stop.target is not None:  # the server holds y, s and z: the hard gaps cost no message
            gaps = self.constraint.gaps(y, z_after, hard=True)
            largest = int(np.argmax(np.abs(gaps)))
            hard = float(abs(gaps[largest]))
            # it leans the other way than its smooth gap, which the bound holds: the bound over-corrects it (a
            # smooth gap well inside the bound pushes nothing, and its sign says nothing of the bound's)
            over = bool(gaps[largest] * smooth[largest] < 0 and abs(smooth[largest]) >= 0.5 * self.stop.epsilon)
            self.stop.observe(len(self.history), hard, float(np.mean(predict(z_after) == y)))
        bound, temperature = self.stop.epsilon, self.stop.temperature
        done = self.stop.update(f_before, f_after, smooth, self.lam, hard, over)
        if self.stop.temperature != temperature:
            log(INFO, "[round %d] converged with the largest hard gap %.4f above epsilon %.3g, which the smooth gaps "
                "cannot carry lower at temperature %.3g: the smooth rates sharpen to sigma(z / %.3g) and their bound "
                "starts again at %.4g; training continues from this model and lambda", len(self.history), hard,
                self.cfg.epsilon, temperature, self.stop.temperature, self.stop.epsilon)
        elif self.stop.epsilon != bound:
            where = ("above" if self.stop.epsilon < bound else
                     "above, leaning the other way than its smooth gap," if over else "well below")
            log(INFO, "[round %d] converged with the largest hard gap %.4f %s epsilon %.3g: the smooth gaps' "
                "bound goes from %.4g to %.4g; training continues from this model and lambda",
                len(self.history), hard, where, self.cfg.epsilon, bound, self.stop.epsilon)
        return done

    def log_stop(self, server_round: int) -> None:
        """Log why training stops and with which round it ends (one more, evaluated, round when this one was not)."""
        ends = "here" if self.last_round == server_round else f"with round {self.last_round} (evaluated)"
        log(INFO, "[round %d] converged: %s; training ends %s", server_round, self.stop.describe(), ends)

    def computed(self) -> dict[int, dict[str, np.ndarray]]:
        """Per node, what the algorithm computed for that party from the round just folded,
        beyond ν, z and λ (a transcript keeps it); gradient descent computes nothing more."""
        return {}

    def record(self, server_round: int, extra: dict | None = None) -> dict:
        """History row for θ after ``server_round`` (round 0: the initial model).

        Mini-batch runs: L and the gaps are on every training row in evaluation rounds,
        and on the next round's batch otherwise (``train_rows`` says which).
        """
        if self.held_rows is None:
            if not self._constraint.linear:
                # what the next round's steps take the gaps' slopes at: the model just recorded (a step
                # judged and taken back records the point it returned to)
                self.reference = self.z("train")
            self.stats = train_stats(self.labels.y_train, self.z("train"), self.constraint)
        else:
            self.stats = train_stats(*self.batch_view(self.held_rows))
        row: dict = {
            "round": server_round,
            "loss": self.stats.loss + 0.5 * self.mu * sum(self.sq_norms.values()),
            "max_gap": self.stats.max_gap,  # max_c |D_c|: the constraint set holds when <= ε
            "gaps": {c.name: g for c, g in zip(self.constraint.gap_list, self.stats.gaps)},  # every D_c by name
            "lambdas": [float(v) for v in self.lam],  # all multipliers [λ_1+, λ_1-, λ_2+, λ_2-, ...]
            **self.constraint.history.columns(self.stats.gaps, self.lam),
            **dict.fromkeys(TEST_METRICS + (RAW_TEST_METRICS if self.constrained_test is not None else ()), np.nan),
            "seconds": time.perf_counter() - self._t0,
        }
        if self.batch_size:
            row["train_rows"] = len(self.labels.y_train) if self.held_rows is None else len(self.held_rows)
        row.update(extra or {})
        evaluated = bool(self.u_test) and (server_round == 0 or self.evaluates(server_round))
        if evaluated:
            row.update(self.labels.metrics("test", self.z("test"), self.constraint))
        self.hooks.record(server_round, row)
        if evaluated:
            self.u_test.clear()
            log(INFO, "[round %d/%d] %s", server_round, self.cfg.num_server_rounds, self.round_line(row))
        self.history.append(row)
        if self.on_round is not None:
            self.on_round(row)
        return row

    def train_differences(self) -> dict[str, float | None]:
        """fairlearn's demographic parity and equalized odds differences of the hard predictions
        sign(z) on the training rows (``train_dp_diff``, ``train_eo_diff``). ε bounds the
        constrained gaps in the run's measure (soft rates or losses); these are what a bound on
        hard rates, fairlearn's, would hold, so a run shows both (docs/newton.md, "Rates").
        None while the server holds only a batch's scores."""
        keys = ("dp_diff", "eo_diff") + (("dp_diff_raw", "eo_diff_raw") if self.constrained_train is not None else ())
        if self.held_rows is not None:
            return dict.fromkeys((f"train_{k}" for k in keys), None)
        hard = self.labels.metrics("train", self.z("train"), self.constraint)
        return {f"train_{k}": hard[k] for k in keys} | self.epsilon_outcome()

    def epsilon_outcome(self) -> dict:
        """What ε bounded and how the run got there, logged once and returned for the summary:
        ``epsilon_bounds`` ("hard": fairlearn's difference on the training rows; "smooth": the
        soft rates or losses the gaps compare), and with a hard target ``train_hard_gap`` (the
        largest hard gap of the constraint), ``epsilon_met``, ``surrogate_bound`` (the smooth gaps'
        final bound), ``tightenings``; where the target was not met, the round with the smallest
        hard gap and the training accuracy there."""
        if not self.cfg.fairness:
            return {}
        stop = self.stop
        if stop.target is None:
            log(INFO, "FairVFL: epsilon=%g bounds the constraint's %s gaps (train: %.4f); fairlearn's hard-prediction "
                "differences are reported beside them", self.cfg.epsilon, self.cfg.measure,
                self.history[-1]["max_gap"] if self.history else float("nan"))
            return {"epsilon_bounds": "smooth"}
        y, z = self.labels.y_train, self.z("train")
        hard = float(np.max(np.abs(self.constraint.gaps(y, z, hard=True))))
        met = hard <= stop.target + GAP_SLACK
        out = {"epsilon_bounds": "hard", "train_hard_gap": hard, "epsilon_met": met,
               "surrogate_bound": stop.epsilon, "tightenings": stop.tightenings, "loosenings": stop.loosenings,
               "temperature": stop.temperature, "sharpenings": stop.sharpenings}
        moves = " and ".join(f"{k} {what}(s)" for k, what in ((stop.tightenings, "tightening"),
                                                             (stop.loosenings, "loosening")) if k)
        how = (f"{moves} of the smooth gaps' bound, final bound {stop.epsilon:.4g}" if moves
               else f"no change of the smooth gaps' bound, which stayed {stop.epsilon:.4g}")
        if stop.sharpenings:
            how += f", the smooth rates sharpened {stop.sharpenings} time(s) to temperature {stop.temperature:g}"
        if met:
            log(INFO, "FairVFL: epsilon=%g bounds fairlearn's hard-prediction difference of the %s gaps on the "
                "training rows: %.4f, reached with %s", self.cfg.epsilon, self.cfg.constraint, hard, how)
            return out
        best = stop.best or {"round": self.history[-1]["round"] if self.history else 0, "hard_gap": hard,
                             "accuracy": float(np.mean(predict(z) == y))}
        why = ("the smooth gaps cannot bring it lower without giving up the predictions (a constant classifier "
               "meets any epsilon)" if stop.gave_up else "the rounds ran out first")
        log(WARNING, "FairVFL: epsilon=%g (fairlearn's hard-prediction difference of the %s gaps on the training "
            "rows) NOT met: %.4f at the end, after %s; %s. The smallest hard gap reached was %.4f (round %d, "
            "training accuracy %.2f%%)", self.cfg.epsilon, self.cfg.constraint, hard, how, why, best["hard_gap"],
            best["round"], 100 * best["accuracy"])
        return out | {"smallest_hard_gap": best["hard_gap"], "smallest_hard_gap_round": best["round"],
                      "train_acc_at_smallest_hard_gap": best["accuracy"]}

    def fairness_groups(self) -> dict[str, dict]:
        """The groups the fairness figures are over, by their values: ``groups``, those the run
        constrained (a pooled one named by its members joined with " + "), each with its training
        and test rows; where pooling made them differ, ``raw_groups``: the data's own groups with
        theirs and the group each was pooled into (what the ``*_raw`` figures are over)."""
        if self.constraint.groups is None:
            return {}
        names = self.constraint.groups.names
        if not self.constraint.groups.exact:  # a registry's noisy release: the server knows estimated counts only
            return {"groups": _estimated(self.constraint.groups, self.labels.s_test), "groups_released": True}
        raw = SensitiveGroups.of(self.labels.s_train, self.labels.group_names)
        if self.constrained_test is None:
            train, test = raw.codes, SensitiveGroups.of(self.labels.s_test, self.labels.group_names).codes
            return {"groups": _counted(names, train, test)}
        out = {"groups": _counted(names, self.constrained_train, self.constrained_test)}
        raw_test = SensitiveGroups.of(self.labels.s_test, self.labels.group_names).codes
        into = constrained_codes(self.constraint, np.arange(len(raw.names)), raw.names)
        out["raw_groups"] = {name: {**counts, "pooled_into": names[into[k]] if into[k] == len(names) - 1 else None}
                             for k, (name, counts) in enumerate(_counted(raw.names, raw.codes, raw_test).items())}
        return out

    def round_line(self, row: dict) -> str:
        """The log line of an evaluated round: L, the largest gap (named for the constraint),
        the multipliers, the test metrics and fairlearn's differences."""
        # without the fairness term ε bounds nothing and λ stays 0: the line leaves both out
        lam = row["lambdas"]
        multipliers = (f"lambda=({lam[0]:.4f}, {lam[1]:.4f})" if len(lam) == 2
                       else f"max lambda={max(lam):.4f} of {len(lam)}")
        fair = f" (eps {self.cfg.epsilon:.3g}) {multipliers}" if self.cfg.fairness else ""
        raw = (f" (unpooled groups: DP diff={row['dp_diff_raw']:.3f} EO diff={row['eo_diff_raw']:.3f})"
               if "dp_diff_raw" in row else "")
        return (f"L={row['loss']:.4f} {self.constraint.history.gap_label}={row['max_gap']:.4f}{fair} | test "
                f"ACC={100 * row['acc']:.2f}% DFP={row['dfp']:.3f} DFN={row['dfn']:.3f} "
                f"DP diff={row['dp_diff']:.3f} EO diff={row['eo_diff']:.3f}{raw} | {row['seconds']:.1f} s")

    # -- state -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue after the last recorded round: :meth:`snapshot` with its
        per-node entries keyed by partition id (node ids change when a SuperNode restarts, and a
        resumed run is a new run)."""
        pid = {nid: node.partition_id for nid, node in self.nodes.items()}
        snapshot = self.snapshot()
        for name in self.node_keyed:
            snapshot[name] = {pid[n]: v for n, v in snapshot[name].items()}
        return {"round": int(self.history[-1]["round"]) if self.history else 0, "snapshot": snapshot}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` (after :meth:`discover`: needs the nodes). The round
        training ends with stays this run's (``num-server-rounds`` may change on resume)."""
        by_pid = {node.partition_id: nid for nid, node in self.nodes.items()}
        snapshot = dict(state["snapshot"])
        for name in self.node_keyed:
            snapshot[name] = {by_pid[p]: v for p, v in snapshot[name].items()}
        last_round = self.last_round
        self.restore(snapshot)
        self.last_round = last_round

    def snapshot(self) -> dict:
        """A copy of everything a round changes (:attr:`round_state`): :meth:`restore` returns the
        server to it, node ids and all."""
        return copy.deepcopy({name: getattr(self, name) for name in self.round_state})

    def restore(self, snapshot: dict) -> None:
        """Return to a :meth:`snapshot` (a copy of it: the snapshot stays usable)."""
        for name, value in copy.deepcopy(snapshot).items():
            setattr(self, name, value)

    def rebind(self, old: int, node: Node) -> None:
        """A party is back as ``node`` (a restarted SuperNode has a new node id): it takes the place
        of node ``old``, with every per-node entry of the server's state."""
        if self.nodes[old].partition_id != node.partition_id or self.nodes[old].role != node.role:
            raise FederationError(f"{node} cannot take the place of {self.nodes[old]}")
        for name in self.node_keyed:
            held = getattr(self, name)
            if old in held:
                held[node.node_id] = held.pop(old)
        del self.nodes[old]
        self.nodes[node.node_id] = node

    # -- helpers -------------------------------------------------------------------------
    def who(self, node_id: int, named: bool = True) -> str:
        """A node as the log and errors name it (its partition and role), or its id before it is known."""
        return str(self.nodes[node_id]) if named and node_id in self.nodes else f"node {node_id}"

    def ordered_nodes(self) -> list[Node]:
        """The nodes by partition id: the order every sum over parties takes, whatever ids the runtime assigned."""
        return sorted(self.nodes.values(), key=lambda n: n.partition_id)

    def evaluates(self, server_round: int) -> bool:
        """Whether the parties also return test logits in ``server_round``: every eval-every rounds and the last."""
        return server_round % self.cfg.eval_every == 0 or server_round == self.last_round

    def batch_view(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, ConstraintSet]:
        """Labels, scores and the constraint on the batch ``rows``."""
        z = self.z("train")
        if self.held_rows is None:  # an evaluation round's replies held every row
            z = z[rows]
        elif not np.array_equal(self.held_rows, rows):
            raise FederationError("internal: the parties' logits are not on this round's batch rows")
        return self.labels.y_train[rows], z, self.constraint.restrict(rows)


def _estimated(train: SensitiveGroups, s_test: np.ndarray) -> dict[str, dict[str, int]]:
    test = dataclasses.replace(train, codes=np.asarray(s_test, dtype=np.int64))
    every_train, every_test = np.ones(len(train.codes), dtype=bool), np.ones(len(test.codes), dtype=bool)
    return {name: {"train_rows": train.count(every_train, k), "test_rows": test.count(every_test, k)}
            for k, name in enumerate(train.names)}


def _counted(names: tuple[str, ...], train: np.ndarray, test: np.ndarray) -> dict[str, dict[str, int]]:
    train, test = group_counts(train, names), group_counts(test, names)
    return {name: {"train_rows": train[name], "test_rows": test[name]} for name in names}
