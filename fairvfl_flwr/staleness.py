"""Bounded-staleness rounds (issue 8, docs/async.md): rounds that do not wait for stragglers.

With ``max-staleness`` τ > 0 the server's round loop is this module's :class:`StaleRounds`
instead of the synchronous push-and-wait-for-all of ``FairVFL.start`` (τ = 0 never comes
here). Round t:

1. λ and ν are computed (``FairVFL.configure_train``) from the freshest logits held;
2. the round's message goes to every party that has no message outstanding; a party
   still working on an earlier round's message gets nothing new (never two at a time);
3. the server folds replies in as they arrive (also late ones, to earlier rounds) and
   proceeds once every message is answered, or once ``quorum`` parties have answered
   round t and every other party's held logits are at most τ rounds old;
4. the history row of round t lists ``fresh`` (partition ids whose logits come from
   round t) and ``stale`` ({partition id: rounds behind}); rounds behind never exceed τ.

Evaluation rounds (every ``eval-every`` rounds and the last) are synchronous: the server
first waits for every outstanding reply, then for every party's reply to round t, so
test metrics use every party's logits of that round. A party that does not answer a
message within ``round-timeout`` stops the run (no re-sends in this mode); checkpoints,
resume and ``secure-nu=ckks`` are refused with τ > 0 (config.py).
"""

from __future__ import annotations

import time
from logging import INFO
from typing import TYPE_CHECKING, Callable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.supercore import log

from . import messages as msgs
from . import reliability, validate

if TYPE_CHECKING:
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import Result

    from .strategy import FairVFL

POLL_SECONDS = 0.01


def effective_quorum(cfg) -> int:
    """Fresh replies a round needs: ``quorum``, or num-parties − 1 when it is 0."""
    return cfg.quorum or max(1, cfg.num_parties - 1)


class StaleRounds:
    """The round scheduler for max-staleness τ > 0 (see the module doc)."""

    def __init__(self, strategy: "FairVFL", grid: "Grid", timeout: float, last_round: int = 0) -> None:
        self.s = strategy
        self.grid = grid
        self.timeout = timeout
        self.tau = strategy.cfg.max_staleness
        self.quorum = effective_quorum(strategy.cfg)
        self.held = {nid: last_round for nid in strategy.nodes}  # round whose reply gave the logits held
        self.outstanding: dict[str, tuple[int, int, float]] = {}  # message id -> (node, round, sent at)
        self.sent: dict[str, Message] = {}

    def round(self, t: int) -> MetricRecord:
        evaluate = self.s._evaluates(t)
        if evaluate:  # test metrics need every party's logits of round t: drain first
            self._wait(t, lambda: not self.outstanding)
        busy = {nid for nid, _, _ in self.outstanding.values()}
        batch = [m for m in self.s.configure_train(t, ArrayRecord(), ConfigRecord(), self.grid)
                 if m.metadata.dst_node_id not in busy]
        now = time.monotonic()
        for mid, m in zip(self.grid.push_messages(batch), batch):
            self.outstanding[mid] = (m.metadata.dst_node_id, t, now)
            self.sent[mid] = m
        self._wait(t, (lambda: not self.outstanding) if evaluate else (lambda: self._ready(t)))
        return self._record(t)

    # -- waiting and folding ----------------------------------------------------------
    def _ready(self, t: int) -> bool:
        if not self.outstanding:
            return True
        fresh = sum(r == t for r in self.held.values())
        return fresh >= self.quorum and all(t - r <= self.tau for r in self.held.values())

    def _wait(self, t: int, done: Callable[[], bool]) -> None:
        while not done():
            got = list(self.grid.pull_messages(list(self.outstanding)))
            for reply in got:
                self._fold(reply)
            if got:
                continue
            now = time.monotonic()
            late = [(nid, r) for nid, r, sent_at in self.outstanding.values() if now - sent_at > self.timeout]
            if late:
                from .strategy import PartyUnavailable

                names = ", ".join(f"{self.s._who(nid, True)} (round {r})" for nid, r in late)
                raise PartyUnavailable(f"no reply within {self.timeout:g} s from {names} (max-staleness={self.tau})")
            time.sleep(POLL_SECONDS)

    def _fold(self, reply: Message) -> None:
        """Store a reply's partial logits (a late one too); the node is then free again."""
        from .strategy import FederationError

        entry = self.outstanding.pop(reply.metadata.reply_to_message_id, None)
        if entry is None:
            return  # not ours, or already folded
        nid, r, _ = entry
        who = self.s._who(nid, True)
        if reply.has_error():
            raise FederationError(f"{who} failed: {reply.error.reason}")
        try:
            validate.check_envelope(reply, self.sent, who)
        except validate.ReplyError as exc:
            raise FederationError(f"rejected a reply: {exc}") from None
        self.sent.pop(reply.metadata.reply_to_message_id, None)
        logits = reliability.checked_logits(self.s, reply)
        stats = reply.content.metric_records[msgs.STATS]
        self.s.u_train[nid] = logits["train"].astype(np.float64)
        if "test" in logits:
            self.s.u_test[nid] = logits["test"].astype(np.float64)
        self.s.sq_norms[nid] = float(stats["sq-norm"])
        self.s.steps[nid] = int(stats["steps"])
        self.held[nid] = r

    def _record(self, t: int) -> MetricRecord:
        pid = {nid: node.partition_id for nid, node in self.s.nodes.items()}
        behind = {pid[nid]: t - r for nid, r in self.held.items()}
        if max(behind.values()) > self.tau:  # _ready guarantees it; a broken invariant must not pass silently
            raise AssertionError(f"round {t}: staleness {behind} exceeds max-staleness={self.tau}")
        extra = {
            "fresh": sorted(p for p, b in behind.items() if b == 0),
            "stale": {str(p): b for p, b in sorted(behind.items()) if b > 0},
        }
        on_round = self.s.on_round
        self.s.on_round = lambda row: (row.update(extra), on_round(row) if on_round else None)
        try:
            row = self.s._record(t)
        finally:
            self.s.on_round = on_round
        return MetricRecord({k: v for k, v in row.items() if isinstance(v, (int, float))})


def run_rounds(strategy: "FairVFL", grid: "Grid", first: int, num_rounds: int, timeout: float,
               result: "Result") -> "Result":
    """Rounds ``first``..``num_rounds`` with bounded staleness (FairVFL.start, max-staleness > 0)."""
    cfg = strategy.cfg
    log(INFO, "FairVFL: bounded-staleness rounds, max-staleness=%d, quorum=%d of %d",
        cfg.max_staleness, effective_quorum(cfg), cfg.num_parties)
    rounds = StaleRounds(strategy, grid, timeout, first - 1)
    for t in range(first, num_rounds + 1):
        result.train_metrics_clientapp[t] = rounds.round(t)
        strategy.reliability.after_round(strategy, t)  # divergence guard
    return result
