"""Bounded-staleness rounds (docs/async.md): rounds that do not wait for stragglers.

With ``staleness.max-staleness`` τ > 0 the server's round scheduler is this module's
:class:`StaleRounds` instead of the synchronous push-and-wait-for-all of
``flower.server.SyncRounds`` (τ = 0 never comes here). Round t:

1. λ and ν are computed (the algorithm's ``configure_train``) from the freshest logits held;
2. the round's message goes to every party that has no message outstanding; a party
   still working on an earlier round's message gets nothing new (never two at a time);
3. the server folds replies in as they arrive (also late ones, to earlier rounds) and
   proceeds once every message is answered, or once ``staleness.quorum`` parties have answered
   round t and every other party's held logits are at most τ rounds old;
4. the history row of round t lists ``fresh`` (partition ids whose logits come from
   round t) and ``stale`` ({partition id: rounds behind}); rounds behind never exceed τ.

Evaluation rounds (every ``eval-every`` rounds and the last) are synchronous: the server
first waits for every outstanding reply, then for every party's reply to round t, so
test metrics use every party's logits of that round. A party that does not answer a
message within ``reliability.round-timeout`` stops the run (no re-sends in this mode); checkpoints,
resume and encrypted ν are refused with τ > 0 (config/sections.py).
"""

from __future__ import annotations

import time
from logging import INFO
from typing import Callable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from fairvfl_flwr.flower.errors import PartyUnavailable, party_failed
from fairvfl_flwr.flower.exchange import POLL_SECONDS, check_envelope
from fairvfl_flwr.flower.server import VFLServer


def effective_quorum(cfg) -> int:
    """Fresh replies a round needs: ``staleness.quorum``, or num-parties − 1 when it is 0."""
    return cfg.quorum or max(1, cfg.num_parties - 1)


class StaleRounds:
    """The round scheduler for max-staleness τ > 0 (see the module doc)."""

    def __init__(self, tau: int, quorum: int) -> None:
        self.tau = tau
        self.quorum = quorum

    def run(self, server: VFLServer, grid: Grid, first: int, last: int, timeout: float, result: Result) -> Result:
        """Rounds ``first`` to ``last`` where a party's logits may be up to τ rounds old: each round
        waits for a quorum of fresh replies, not for all."""
        log(INFO, "FairVFL: bounded-staleness rounds, staleness.max-staleness=%d, staleness.quorum=%d of %d",
            self.tau, self.quorum, server.cfg.num_parties)
        self.s, self.grid, self.timeout = server, grid, timeout
        self.held = {nid: first - 1 for nid in server.nodes}  # round whose reply gave the logits held
        self.outstanding: dict[str, tuple[int, int, float]] = {}  # message id -> (node, round, sent at)
        self.sent: dict[str, Message] = {}
        for t in range(first, last + 1):
            result.train_metrics_clientapp[t] = self.round(t)
            server.hooks.end(grid, t, timeout)
        return result

    def round(self, t: int) -> MetricRecord:
        """One bounded-staleness round: send to the parties not busy, fold the replies that came (a
        stale one no older than τ), record; its train metrics."""
        evaluate = self.s.evaluates(t)
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
                names = ", ".join(f"{self.s.who(nid)} (round {r})" for nid, r in late)
                raise PartyUnavailable(f"no reply within {self.timeout:g} s from {names} (staleness.max-staleness={self.tau})")
            time.sleep(POLL_SECONDS)

    def _fold(self, reply: Message) -> None:
        """Fold a reply in (a late one too); the node is then free again."""
        entry = self.outstanding.pop(reply.metadata.reply_to_message_id, None)
        if entry is None:
            return  # not ours, or already folded
        nid, r, _ = entry
        if reply.has_error():
            raise party_failed(self.s.who(nid), reply.error.reason)
        check_envelope(reply, self.sent, self.s.who(nid))
        self.sent.pop(reply.metadata.reply_to_message_id, None)
        self.s.fold(reply)
        self.held[nid] = r

    def _record(self, t: int) -> MetricRecord:
        pid = {nid: node.partition_id for nid, node in self.s.nodes.items()}
        behind = {pid[nid]: t - r for nid, r in self.held.items()}
        if max(behind.values()) > self.tau:  # _ready guarantees it; a broken invariant must not pass silently
            raise AssertionError(f"round {t}: staleness {behind} exceeds staleness.max-staleness={self.tau}")
        row = self.s.record(t, extra={
            "fresh": sorted(p for p, b in behind.items() if b == 0),
            "stale": {str(p): b for p, b in sorted(behind.items()) if b > 0},
        })
        return MetricRecord({k: v for k, v in row.items() if isinstance(v, (int, float))})
