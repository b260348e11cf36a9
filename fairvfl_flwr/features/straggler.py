"""Straggler simulation: delay a party's train replies (docs/async.md).

A ClientApp mod (:func:`delay_mod`) sleeps after the party has computed its reply and
before it returns it, so the server sees a slow party; it works the same in the
in-process grid, in ``flwr run`` simulation and in deployment, because the sleep is in
the ClientApp itself. Only a round's step, round and final messages are delayed, by their
kind (flower/protocol.Kind: any algorithm's); discovery and the start message are not.

Where the delay comes from (the first that is set wins):

* node config ``delay-seconds`` (fixed) and ``delay-jitter`` (an extra uniform
  [0, jitter) seconds per reply), e.g. ``flower-supernode ... --node-config
  'partition-id=2 ... delay-seconds=0.3 delay-jitter=0.1'``;
* run config ``staleness.straggler-delays``, for simulation where node configs are Flower's:
  ``"2=0.3"`` or ``"2=0.3~0.1,4=0.05"`` (partition id = seconds [~ jitter]).

The jitter is drawn from a generator seeded by the node id and the round, so a rerun
draws the same delays.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.config.node import NodeConfig
from fairvfl_flwr.config.sections import parse_delays
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.party import PartyRuntime

if TYPE_CHECKING:
    from flwr.app import Message


def delay_for(node: NodeConfig, cfg: RunConfig) -> tuple[float, float]:
    """(fixed seconds, jitter seconds) for this node; (0, 0) when it is not a straggler. A node
    config delay (either key given) wins over the run config's ``staleness.straggler-delays``."""
    if node.given & {"delay-seconds", "delay-jitter"}:
        return node.delay_seconds, node.delay_jitter
    text = cfg.straggler_delays
    if text and "partition-id" in node.given:
        return parse_delays(text).get(node.partition_id, (0.0, 0.0))
    return 0.0, 0.0


def delay_mod(message: Message, context, call_next) -> Message:
    """Compute the reply, then hold it back for this node's delay (a round's step, round and final messages only)."""
    reply = call_next(message, context)
    if msgs.kind_of(message.metadata.message_type) not in (msgs.Kind.STEP, msgs.Kind.ROUND, msgs.Kind.FINAL):
        return reply
    rt = PartyRuntime(context)
    base, jitter = delay_for(rt.node, rt.cfg)
    if base > 0 or jitter > 0:
        extra = random.Random(f"{context.node_id}/{message.metadata.group_id}").uniform(0.0, jitter) if jitter else 0.0
        time.sleep(base + extra)
    return reply
