"""An in-process Grid: the real ServerApp strategy and ClientApp, without a SuperLink.

Messages are real ``flwr.app.Message`` objects handed to the real ``ClientApp`` with
one ``Context`` per fake node; only the transport differs from ``flwr run``. Used by
the tests (fast, inspectable messages) and by sweeps that would take hours on Ray
(``app/run.py``).
It relies on ``flwr.supercore.task_identity`` (an internal API; flwr is pinned).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Mapping

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

SERVER_NODE_ID = 1


def partition_configs(num_nodes: int) -> list[dict[str, Any]]:
    """The simulation's node configs: node ``i`` reads partition ``i`` of ``num_nodes`` of the packaged data."""
    return [{"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)]


class InProcessGrid(Grid):
    """A Grid whose nodes are ``ClientApp`` calls in this process.

    Parameters
    ----------
    client_app : ClientApp
        The app every node runs.
    run_config : mapping
        The run config every node (and the server) sees.
    num_nodes : int
        Number of nodes; node ``i`` gets ``partition-id=i``.
    seed : int
        Seeds the random 64-bit node ids (Flower's ids are random too).
    node_configs : list of mapping, optional
        Per-node node config, replacing the default partition-id/num-partitions.
    tap : callable, optional
        Called with every message the server pushes (for privacy tests).
    async_replies : bool
        False (default): ``push_messages`` runs the ClientApp at once and the reply is
        ready before it returns. True: every node answers on its own worker thread (one
        message at a time per node, like a SuperNode) and ``pull_messages`` returns only
        the replies that are done, so a party whose ClientApp is slow (features/straggler.py)
        answers late, as over a real SuperLink. Call :meth:`close` when done.
    """

    def __init__(
        self,
        client_app: ClientApp,
        run_config: Mapping[str, Any],
        num_nodes: int,
        seed: int = 0,
        node_configs: list[Mapping[str, Any]] | None = None,
        tap: Callable[[Message], None] | None = None,
        async_replies: bool = False,
    ) -> None:
        self.client_app = client_app
        rng = random.Random(seed)
        self.node_ids = [rng.getrandbits(63) for _ in range(num_nodes)]
        configs = node_configs or partition_configs(num_nodes)
        self.contexts = {
            nid: Context(run_id=1, node_id=nid, node_config=dict(cfg), state=RecordDict(), run_config=dict(run_config))
            for nid, cfg in zip(self.node_ids, configs)
        }
        self.tap = tap
        self._replies: dict[str, Message] = {}
        self._futures: dict[str, Future] = {}
        self._workers = (
            {nid: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"node-{i}") for i, nid in enumerate(self.node_ids)}
            if async_replies else None
        )
        TaskIdentity.run_id = 1
        TaskIdentity.node_id = SERVER_NODE_ID
        TaskIdentity.task_id = 1

    @property
    def run(self):  # the ServerApp only asks for run_id
        """The ServerApp reads only ``run_id`` from Flower's Run here; the in-process grid has none."""
        return None

    def set_run(self, run_id: int) -> None:
        """Nothing to set: every node's context was built for this grid's one run."""
        pass

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl=None) -> Message:
        """A Message to ``dst_node_id`` as Grid.create_message makes one (its id is given when it is pushed)."""
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        """The simulated nodes' ids, all of them online."""
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Give each message an id, show it to ``tap``, and answer it with the node's ClientApp (on the
        node's worker thread when replies are asynchronous); the message ids."""
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            if self.tap is not None:
                self.tap(msg)
            if self._workers is not None:
                worker = self._workers[msg.metadata.dst_node_id]
                self._futures[msg.metadata.message_id] = worker.submit(self._answer, msg)
            else:
                self._replies[msg.metadata.message_id] = self._answer(msg)
            ids.append(msg.metadata.message_id)
        return ids

    def _answer(self, msg: Message) -> Message:
        context = self.contexts[msg.metadata.dst_node_id]
        try:
            reply = self.client_app(msg, context)
        except Exception as exc:  # the real runtime turns a ClientApp exception into an error reply
            reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
        reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
        return reply

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to ``message_ids`` that are ready, each returned once (as Grid.pull_messages)."""
        out = []
        for mid in message_ids:
            if mid in self._replies:
                out.append(self._replies.pop(mid))
            elif mid in self._futures and self._futures[mid].done():
                out.append(self._futures.pop(mid).result())
        return out

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push ``messages`` and wait for their replies until all came or ``timeout`` passed (the replies that came)."""
        ids = list(self.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        got: list[Message] = []
        while True:
            got += self.pull_messages(ids)
            ids = [mid for mid in ids if mid in self._futures]
            if not ids or (deadline is not None and time.monotonic() > deadline):
                return got
            time.sleep(0.005)

    def close(self) -> None:
        """Stop the node threads of an ``async_replies`` grid (waits for running calls)."""
        for worker in (self._workers or {}).values():
            worker.shutdown(wait=True)

