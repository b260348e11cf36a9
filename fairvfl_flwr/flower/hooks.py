"""Round hooks: how a feature attaches to the server's round loop without editing it.

In the spirit of Flower's strategy wrappers and client mods: the loop
(:class:`~fairvfl_flwr.flower.server.VFLServer`) calls the hooks at fixed points, and a
feature (checkpoints, divergence guard, encrypted or noisy ν, kept scores) is a
:class:`RoundHook` subclass that overrides the points it needs. The loop never names a
feature. Hooks run in the order they were added.

Points, in the order a run meets them:

* ``begin``: before round 1; a hook that restores a run returns the first round to
  run (the others return None and the server initialises the parties);
* ``init_messages``: the ``query.init`` messages, before they go out;
* ``nu``: the masked weights ν of a round, before any passive party gets them (a ν
  channel may transform them, e.g. add noise);
* ``passive_message``: the message that carries ν to a passive party (a ν channel may
  carry it differently, e.g. encrypted); None keeps the plain message;
* ``incoming``: a round's replies (round 0: the first logits), before they are folded into the server's state
  (a channel with a second leg sends it here);
* ``record``: a round's history row, before it is stored;
* ``end``: after a round is folded and recorded (guards, checkpoints); a hook may exchange
  messages of its own here (every party has answered the round);
* ``stopped``: the run is stopping on an error; a hook may say what it leaves on disk.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict

VFLServer = Any  # flower.server.VFLServer, which imports this module


class RoundHook:
    """A feature on the server's round loop; override only the points it needs."""

    def begin(self, server: "VFLServer", grid: Any, timeout: float) -> int | None:
        return None

    def init_messages(self, server: "VFLServer", messages: list[Message]) -> None:
        return None

    def nu(self, server: "VFLServer", server_round: int, nu: np.ndarray) -> np.ndarray:
        return nu

    def passive_message(
        self, server: "VFLServer", server_round: int, nu: np.ndarray, evaluate: bool
    ) -> tuple[RecordDict, str] | None:
        return None

    def incoming(
        self, server: "VFLServer", grid: Any, server_round: int, replies: list[Message], timeout: float
    ) -> list[Message]:
        return replies

    def record(self, server: "VFLServer", server_round: int, row: dict) -> None:
        return None

    def end(self, server: "VFLServer", grid: Any, server_round: int, timeout: float) -> None:
        return None

    def stopped(self, server: "VFLServer", exc: BaseException) -> str | None:
        return None


class Hooks:
    """An ordered list of :class:`RoundHook` objects, called as one."""

    def __init__(self, hooks: Iterable[RoundHook] = ()) -> None:
        self.hooks: list[RoundHook] = list(hooks)

    def add(self, hook: RoundHook) -> None:
        self.hooks.append(hook)

    def find(self, kind: type) -> Any:
        """The first hook of class ``kind`` (or None)."""
        return next((h for h in self.hooks if isinstance(h, kind)), None)

    def begin(self, server: "VFLServer", grid: Any, timeout: float) -> int | None:
        for h in self.hooks:
            first = h.begin(server, grid, timeout)
            if first is not None:
                return first
        return None

    def init_messages(self, server: "VFLServer", messages: list[Message]) -> None:
        for h in self.hooks:
            h.init_messages(server, messages)

    def nu(self, server: "VFLServer", server_round: int, nu: np.ndarray) -> np.ndarray:
        for h in self.hooks:
            nu = h.nu(server, server_round, nu)
        return nu

    def passive_message(
        self, server: "VFLServer", server_round: int, nu: np.ndarray, evaluate: bool
    ) -> tuple[RecordDict, str] | None:
        for h in self.hooks:
            carried = h.passive_message(server, server_round, nu, evaluate)
            if carried is not None:
                return carried
        return None

    def incoming(
        self, server: "VFLServer", grid: Any, server_round: int, replies: list[Message], timeout: float
    ) -> list[Message]:
        for h in self.hooks:
            replies = h.incoming(server, grid, server_round, replies, timeout)
        return replies

    def record(self, server: "VFLServer", server_round: int, row: dict) -> None:
        for h in self.hooks:
            h.record(server, server_round, row)

    def end(self, server: "VFLServer", grid: Any, server_round: int, timeout: float) -> None:
        for h in self.hooks:
            h.end(server, grid, server_round, timeout)

    def stopped(self, server: "VFLServer", exc: BaseException) -> list[str]:
        return [s for s in (h.stopped(server, exc) for h in self.hooks) if s]
