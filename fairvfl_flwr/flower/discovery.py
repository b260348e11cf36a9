"""Node discovery: the one wait for a federation's nodes that the rounds and every job start with.

A simulation registers all its nodes at once; SuperNodes started one after another join
seconds apart. So discovery waits, up to the run's timeout, while no node has joined, and
then while each next one arrives within :data:`NODE_WAIT` seconds of the last. A
federation that stopped growing short of num-parties (or one with more nodes) is refused,
naming what the run needs and how to start it. After a party dropped out,
:func:`joined_nodes` lists the nodes that joined since (features/rejoin.py).
"""

from __future__ import annotations

import time

from flwr.serverapp import Grid

from fairvfl_flwr.flower.errors import FederationError

#: Seconds discovery waits for one more node before it refuses a federation short of num-parties.
NODE_WAIT = 5.0


def discover_nodes(grid: Grid, num_parties: int, timeout: float, what: str = "the run") -> list[int]:
    """The ids of the federation's ``num_parties`` nodes, once they have joined.

    ``what`` names who needs them in a refusal ("the run", "the scoring job", "alignment").
    """
    deadline = time.monotonic() + timeout
    node_ids = list(grid.get_node_ids())
    changed = time.monotonic()
    while (len(node_ids) < num_parties and time.monotonic() < deadline
           and (not node_ids or time.monotonic() - changed < NODE_WAIT)):
        time.sleep(0.5)
        now = list(grid.get_node_ids())
        if len(now) != len(node_ids):
            changed = time.monotonic()
        node_ids = now
    if len(node_ids) != num_parties:
        waited = "" if len(node_ids) > num_parties else f" (no other node joined for {NODE_WAIT:g} s)"
        raise FederationError(
            f"{what} needs num-parties={num_parties} nodes, the federation has {len(node_ids)}{waited}: "
            f"one node per party (simulation: flwr run . <federation> --federation-config "
            f"num-supernodes={num_parties}; a deployment: one SuperNode per party)"
        )
    return node_ids


def joined_nodes(grid: Grid, known: set[int]) -> list[int]:
    """The nodes online now that ``known`` does not hold: a restarted SuperNode joins with a new node id."""
    return [nid for nid in grid.get_node_ids() if nid not in known]
