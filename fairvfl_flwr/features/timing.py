"""Where a deployed round's seconds go: an opt-in timing log, off unless the environment asks.

Set ``FAIRVFL_TIMING_LOG=<folder>`` in the environment of the SuperLink and of every
SuperNode (their ServerApp and ClientApp processes inherit it). Each process then appends
JSON lines to ``<folder>/<role>-<pid>.jsonl`` on its own machine; nothing is added to any
message, so the bytes on the wire and the replies are those of an untimed run.

* ClientApp (:func:`timing_mod`, the outermost mod): one ``message`` line per message with
  the process start (``/proc/self/stat``), when the app's import began and ended
  (:data:`IMPORT_STARTED`, :func:`imported`), when the SuperLink delivered the message to
  the SuperNode (Flower's ``delivered_at``), and when the mods and handler started and
  ended; one ``exit`` line when the process exits (after Flower has pushed the reply).
* ServerApp (:class:`TimedGrid`, wrapping the Grid): a ``push`` line per message sent and a
  ``pull`` line per reply received, each with its wall time, message id, round (group id)
  and the bytes of the arrays it carries.

Every time is ``time.time()`` (seconds since the epoch), so logs from processes on one
machine line up; ``bench/deploy_time.py`` joins them by message id into a round's parts.
docs/deploy-time.md has the measured table.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

# app/client.py imports this module before any other of the app's modules: this is when the
# app's import began, as close as the app itself can see it.
IMPORT_STARTED = time.time()
IMPORT_STARTED_CPU = time.process_time()  # CPU seconds this process spent before: Flower's start-up

# after the clock above: reading the node config is part of the app's import it times
from fairvfl_flwr.config.node import NodeConfig, NodeConfigError  # noqa: E402
from fairvfl_flwr.flower.records import array_records

ENV = "FAIRVFL_TIMING_LOG"

_state: dict[str, Any] = {"import_done": None, "import_done_cpu": None, "messages": 0}


def folder() -> Path | None:
    """The timing log folder, or None when timing is off."""
    value = os.environ.get(ENV, "")
    return Path(value) if value else None


def imported() -> None:
    """Note that the ClientApp's import has finished (called at the end of app/client.py)."""
    _state["import_done"] = time.time()
    _state["import_done_cpu"] = time.process_time()


def process_started(pid: int | str = "self") -> float | None:
    """Wall time this process started, to the kernel's clock tick (10 ms).

    /proc gives the start in ticks on the boot-time clock; it is converted through the
    process's age, not through the boot time, because the wall clock may have been
    adjusted since boot.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# read once at import, as IMPORT_STARTED is: a start computed from the wall clock at each message
# moves with a clock stepped since (a VM resumed, NTP), past the process's own import in the log
PROCESS_STARTED = process_started()


def _write(role: str, record: dict) -> None:
    where = folder()
    if where is None:
        return
    where.mkdir(parents=True, exist_ok=True)
    with open(where / f"{role}-{os.getpid()}.jsonl", "a") as fh:
        fh.write(json.dumps(record) + "\n")


def _epoch(iso: str) -> float | None:
    try:
        return datetime.fromisoformat(iso).timestamp() if iso else None
    except ValueError:
        return None


def array_bytes(content) -> int:
    """Bytes of the arrays a message carries (the payload; Flower's envelope not counted)."""
    if content is None:
        return 0
    return sum(len(arr.data) for record in array_records(content).values() for arr in record.values())


def _partition(context) -> int | None:
    """The node's partition id for the log, or None where its node config gives none or cannot
    be read (the handler has already refused that; the log line still records the message)."""
    try:
        config = NodeConfig.of(context)
    except NodeConfigError:
        return None
    return config.partition_id if "partition-id" in config.given else None


def timing_mod(message, context, call_next):
    """ClientApp mod: time the mods and handler of this message, and this process's start-up."""
    if folder() is None:
        return call_next(message, context)
    started, started_cpu = time.time(), time.process_time()
    reply = call_next(message, context)
    ended, ended_cpu = time.time(), time.process_time()
    meta = message.metadata
    _state["messages"] += 1
    if _state["messages"] == 1:
        atexit.register(lambda: _write("clientapp", {"event": "exit", "pid": os.getpid(), "t": time.time(),
                                                     "cpu": time.process_time()}))
    _write("clientapp", {
        "event": "message", "pid": os.getpid(), "first": _state["messages"] == 1,
        "message_id": meta.message_id, "node_id": context.node_id, "type": meta.message_type,
        "group": meta.group_id, "partition": _partition(context),
        "created": meta.created_at, "delivered": _epoch(meta.delivered_at),
        "process_start": PROCESS_STARTED, "import_start": IMPORT_STARTED, "import_done": _state["import_done"],
        "handler_start": started, "handler_end": ended, "error": reply.has_error(),
        # CPU seconds of this process at each of those moments (user + system)
        "cpu_import_start": IMPORT_STARTED_CPU, "cpu_import_done": _state["import_done_cpu"],
        "cpu_handler_start": started_cpu, "cpu_handler_end": ended_cpu,
        "bytes_in": array_bytes(message.content), "bytes_out": 0 if reply.has_error() else array_bytes(reply.content),
        "app": __file__,
    })
    return reply


class TimedGrid:
    """A ServerApp Grid that logs every push and every reply received; otherwise the Grid itself."""

    def __init__(self, grid) -> None:
        self._grid = grid
        _write("serverapp", {"event": "start", "pid": os.getpid(), "process_start": process_started(),
                             "t": time.time(), "app": __file__})

    def __getattr__(self, name: str):
        return getattr(self._grid, name)

    def push_messages(self, messages: Iterable) -> Iterable[str]:
        messages = list(messages)
        called = time.time()
        ids = list(self._grid.push_messages(messages))
        done = time.time()
        for mid, m in zip(ids, messages):
            _write("serverapp", {"event": "push", "message_id": mid, "node_id": m.metadata.dst_node_id,
                                 "type": m.metadata.message_type, "group": m.metadata.group_id,
                                 "t_call": called, "t": done, "bytes": array_bytes(m.content)})
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable:
        got = list(self._grid.pull_messages(message_ids))
        now = time.time()
        for reply in got:
            meta = reply.metadata
            _write("serverapp", {"event": "pull", "message_id": meta.message_id, "reply_to": meta.reply_to_message_id,
                                 "node_id": meta.src_node_id,
                                 "group": meta.group_id, "t": now, "created": meta.created_at,
                                 "error": reply.has_error(),
                                 "bytes": 0 if reply.has_error() else array_bytes(reply.content)})
        return got


def timed(grid):
    """``grid`` wrapped in :class:`TimedGrid` when timing is on, else ``grid`` itself."""
    return TimedGrid(grid) if folder() is not None else grid
