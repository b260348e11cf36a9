"""Round hooks: how a feature attaches to the server's round loop without editing it.

In the spirit of Flower's strategy wrappers and client mods: the loop
(:class:`~fairvfl_flwr.flower.server.VFLServer`) calls the hooks at fixed points, and a
feature (checkpoints, divergence guard, encrypted or noisy ν, kept scores) is a
:class:`RoundHook` subclass that overrides the points it needs. The loop never names a
feature.

A hook sees the server through a :class:`ServerView`: what it may read, read-only, and
the few things it may do to the run, each an explicit method (exchange messages, fold a
restored reply, restore the state, set λ). The order hooks run in is declared once, by the
app that picks them (``HOOK_ORDER`` in app/training.py); :func:`in_order` puts a list of
hooks in that order and refuses a hook the order does not place.

Points, in the order a run meets them:

* ``begin``: before round 1, every hook; a hook that restores a run returns the first
  round to run (the others return None; when all do, the server initialises the
  parties); two hooks restoring one run are refused;
* ``init_messages``: the ``query.init`` messages, before they go out;
* ``nu``: the masked weights ν of a round, before any passive party gets them (a ν
  channel may transform them, e.g. add noise);
* ``passive_message``: the message that carries ν to a passive party (a ν channel may
  carry it differently, e.g. encrypted); None keeps the plain message;
* ``incoming``: a round's replies (round 0: the first logits), before they are folded into
  the server's state (a channel with a second leg sends it here);
* ``outgoing``: every message of an exchange, just before it goes out (the algorithm's,
  the hooks' own and the restart messages alike), after every other point has shaped it;
* ``record``: a round's history row, before it is stored (the one thing a hook may write
  to directly: its own columns);
* ``end``: after a round is folded and recorded (guards, checkpoints); a hook may exchange
  messages of its own here (every party has answered the round);
* ``recover``: a round failed on a :class:`~fairvfl_flwr.flower.errors.FederationError`
  (a party dropped out); a hook that brings the federation back returns the first round to
  run again (the first hook that does wins; None from all: the run stops);
* ``rejoined``: after a hook recovered, every hook re-establishes what it set up in
  ``begin`` with the federation as it now is (a fresh key set-up);
* ``stopped``: the run is stopping on an error; a hook may say what it leaves on disk.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any, Callable, Generic, TypeVar

import numpy as np
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from fairvfl_flwr.core.constraints import ConstraintSet
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.data.problem import ServerLabels


@dataclass(frozen=True)
class Node:
    """What the server knows about one party: its role and row counts, never its data."""

    node_id: int
    role: str
    partition_id: int
    n_train: int
    n_test: int

    def __str__(self) -> str:
        return f"node {self.node_id} (partition {self.partition_id}, {self.role})"


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


def _read_only_arrays(held: Mapping[int, np.ndarray]) -> Mapping[int, np.ndarray]:
    return MappingProxyType({k: _read_only(v) for k, v in held.items()})


def _read_only_labels(labels: ServerLabels) -> ServerLabels:
    """The labels with every array a non-writeable view (the dataclass itself is frozen)."""
    return replace(labels, **{f.name: _read_only(getattr(labels, f.name)) for f in fields(labels)
                              if isinstance(getattr(labels, f.name), np.ndarray)})


T = TypeVar("T")


class Reads(Generic[T]):
    """A read-only attribute of :class:`ServerView`: the server's attribute of the same name,
    passed through ``wrap`` (a proxy or a non-writeable view where the value is mutable)."""

    def __init__(self, wrap: Callable[[Any], T] | None = None) -> None:
        self.wrap = wrap

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, view: Any, owner: type | None = None) -> T:
        if view is None:  # looked up on the class (help(), documentation tools)
            return self  # type: ignore[return-value]
        value = getattr(view._server, self.name)
        return self.wrap(value) if self.wrap else value

    def __set__(self, view: Any, value: Any) -> None:
        raise AttributeError(f"a round hook may not set the server's {self.name} (ServerView lists what it may do)")


class ServerView:
    """The server as a round hook sees it.

    Reads are read-only (mappings are proxies, arrays are not writeable); a change to the
    run goes through one of the methods under "what a hook may do". ``server`` is the
    :class:`~fairvfl_flwr.flower.server.VFLServer` (not imported: it imports this module).
    """

    def __init__(self, server: Any) -> None:
        self._server = server

    # -- what a hook may read ---------------------------------------------------------
    cfg: Reads[RunConfig] = Reads()
    labels: Reads[ServerLabels] = Reads(_read_only_labels)
    groups: Reads[ConstraintSet] = Reads()
    wire_dtype: Reads[np.dtype] = Reads()
    #: The round training ends with (an algorithm that converged lowers it).
    last_round: Reads[int] = Reads()
    nodes: Reads[Mapping[int, Node]] = Reads(MappingProxyType)
    lam: Reads[np.ndarray] = Reads(_read_only)
    #: Per node, the training logits held.
    u_train: Reads[Mapping[int, np.ndarray]] = Reads(_read_only_arrays)
    #: Per node, the test logits of the round being recorded (empty outside evaluation rounds).
    u_test: Reads[Mapping[int, np.ndarray]] = Reads(_read_only_arrays)

    @property
    def last_row(self) -> Mapping[str, Any]:
        """The history row of the last recorded round."""
        return MappingProxyType(self._server.history[-1])

    def z(self, split: str) -> np.ndarray:
        """The server's scores on ``split`` ("train" or "test"): the sum of the held partial logits."""
        return self._server.z(split)

    def who(self, node_id: int) -> str:
        """A node as the log names it (its partition and role)."""
        return self._server.who(node_id)

    def ordered_nodes(self) -> list[Node]:
        """The run's nodes by partition id, the order every sum over parties takes."""
        return self._server.ordered_nodes()

    def computed(self) -> dict[int, dict[str, np.ndarray]]:
        """Per node, what the algorithm computed for that party in the round just folded beyond ν, z and λ."""
        return self._server.computed()

    def state_dict(self) -> dict:
        """Everything needed to continue after the last recorded round, as a checkpoint saves it."""
        return self._server.state_dict()

    def masked_gradient_message(self, node_id: int, server_round: int,
                                arrays: dict[str, np.ndarray]) -> tuple[RecordDict, str]:
        """The training method's second message of a round to a passive party whose ν went out
        encrypted, carrying ``arrays``."""
        return self._server.masked_gradient_message(node_id, server_round, arrays)

    def hook(self, kind: type[H]) -> H | None:
        """Another hook of this run, of class ``kind`` (or None)."""
        return self._server.hooks.find(kind)

    # -- what a hook may do -----------------------------------------------------------
    def exchange(self, grid: Grid, messages: Iterable[Message], timeout: float) -> list[Message]:
        """Send messages of the hook's own and wait for every reply (retries, envelope checks)."""
        return self._server.exchange(grid, messages, timeout)

    def exchange_init(self, grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
        """Send (re)start messages, with what every hook adds to them (``init_messages``)."""
        return self._server.exchange_init(grid, messages, timeout)

    def fold(self, reply: Message) -> None:
        """Make a reply (every training row) the server's view of its party."""
        self._server.fold(reply)

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved :meth:`state_dict`."""
        self._server.load_state_dict(state)

    def set_lambda(self, lam: np.ndarray) -> None:
        """Replace the multipliers λ (a ν channel that bounds them)."""
        self._server.lam = np.array(lam, dtype=np.float64)

    def snapshot(self) -> dict:
        """A copy of everything the rounds change (the server's ``round_state``), to :meth:`restore` later."""
        return self._server.snapshot()

    def restore(self, snapshot: dict) -> None:
        """Return the server to a :meth:`snapshot` (the round it was taken after)."""
        self._server.restore(snapshot)

    def node_of(self, reply: Message, when: str) -> Node:
        """The node a ``query.info``-shaped reply describes, checked against the server's labels."""
        return self._server.node_of(reply, when)

    def rebind(self, old: int, node: Node) -> None:
        """A party that came back as ``node`` (a new node id) takes the place of node ``old``."""
        self._server.rebind(old, node)

    def exchange_unnamed(self, grid: Grid, messages: Iterable[Message], timeout: float) -> list[Message]:
        """:meth:`exchange` with nodes the run does not know yet (named by their node id)."""
        return self._server.exchange(grid, messages, timeout, named=False)


class RoundHook:
    """A feature on the server's round loop; override only the points it needs."""

    def begin(self, server: ServerView, grid: Grid, timeout: float) -> int | None:
        """Before round 0, after discovery: a hook that resumes a run returns the first round to train;
        None starts at round 1."""
        return None

    def discovered(self, server: ServerView, replies: list[Message]) -> None:
        """Read the discovery replies (one per party, every node known): what a hook asked for on
        the discovery messages (its ``outgoing``) comes back here, before ``begin``."""
        return None

    def init_messages(self, server: ServerView, messages: list[Message]) -> None:
        """Add what the hook's parties need to the (re)start messages, before they are sent."""
        return None

    def nu(self, server: ServerView, server_round: int, nu: np.ndarray) -> np.ndarray:
        """ν of ``server_round`` as the passive parties will get it: a hook may change it (noise,
        clipping) and returns it."""
        return nu

    def passive_message(
        self, server: ServerView, server_round: int, nu: np.ndarray, evaluate: bool
    ) -> tuple[RecordDict, str] | None:
        """Content and message type that carry ν to a passive party instead of the plain message
        (encrypted ν), or None."""
        return None

    def incoming(
        self, server: ServerView, grid: Grid, server_round: int, replies: list[Message], timeout: float
    ) -> list[Message]:
        """The round's replies before they are folded: a hook may check, replace or complete them (a
        second leg) and returns those to fold."""
        return replies

    def outgoing(self, server: ServerView, messages: list[Message]) -> None:
        """See every message the server sends (training, start, a hook's own) just before it goes out;
        a hook may change them in place."""
        return None

    def record(self, server: ServerView, server_round: int, row: dict) -> None:
        """Add the hook's columns to the round's history row (``row``), after the round is folded."""
        return None

    def end(self, server: ServerView, grid: Grid, server_round: int, timeout: float) -> None:
        """After the round is folded and recorded: the hook's own messages or files (checkpoints, saved blocks)."""
        return None

    def recover(self, server: ServerView, grid: Grid, exc: BaseException, timeout: float) -> int | None:
        """A round failed with ``exc``: a hook that brings the federation back returns the first round to
        run again; None leaves the failure to the others (and the run stops)."""
        return None

    def rejoined(self, server: ServerView, grid: Grid, timeout: float, restored: int) -> None:
        """After a recovery: re-establish what ``begin`` set up with the parties, as they now are; every
        party is to continue from its state of round ``restored``."""
        return None

    def stopped(self, server: ServerView, exc: BaseException) -> str | None:
        """The run stopped with ``exc``: a note for the log's stop line (where its checkpoint is), or None."""
        return None


H = TypeVar("H", bound=RoundHook)


def in_order(hooks: Iterable[RoundHook], order: Sequence[type[RoundHook]]) -> list[RoundHook]:
    """``hooks`` sorted by their class's place in ``order``; a hook that is an instance of
    no class in ``order`` is refused."""
    def place(hook: RoundHook) -> int:
        for i, kind in enumerate(order):
            if isinstance(hook, kind):
                return i
        raise ValueError(f"{type(hook).__name__} has no place in the hook order "
                         f"({', '.join(k.__name__ for k in order)}); add it there")
    return sorted(hooks, key=place)


class Hooks:
    """An ordered list of :class:`RoundHook` objects, called as one, each with ``view``."""

    def __init__(self, hooks: Iterable[RoundHook], view: ServerView) -> None:
        self.hooks: list[RoundHook] = list(hooks)
        self.view = view

    def find(self, kind: type[H]) -> H | None:
        """The first hook of class ``kind`` (or None)."""
        return next((h for h in self.hooks if isinstance(h, kind)), None)

    def begin(self, grid: Grid, timeout: float) -> int | None:
        """Every hook's ``begin``, in order; the first round to run, from the hook that restored
        the run (None: a fresh start). Every hook begins on a resume too (a key set-up must run
        whether or not the run restarts); two hooks restoring a run are refused."""
        resumed: list[tuple[RoundHook, int]] = []
        for h in self.hooks:
            first = h.begin(self.view, grid, timeout)
            if first is not None:
                resumed.append((h, first))
        if len(resumed) > 1:
            raise ValueError("more than one round hook restored the run: "
                             + ", ".join(f"{type(h).__name__} (round {r})" for h, r in resumed)
                             + "; one hook may resume a run")
        return resumed[0][1] if resumed else None

    def discovered(self, replies: list[Message]) -> None:
        """Every hook reads the discovery replies, in order."""
        for h in self.hooks:
            h.discovered(self.view, replies)

    def init_messages(self, messages: list[Message]) -> None:
        """Every hook adds to the (re)start messages, in order."""
        for h in self.hooks:
            h.init_messages(self.view, messages)

    def nu(self, server_round: int, nu: np.ndarray) -> np.ndarray:
        """ν passed through every hook in order (each may change it)."""
        for h in self.hooks:
            nu = h.nu(self.view, server_round, nu)
        return nu

    def passive_message(self, server_round: int, nu: np.ndarray, evaluate: bool) -> tuple[RecordDict, str] | None:
        """The first hook's replacement of a passive party's message (encrypted ν), or None: the plain message."""
        for h in self.hooks:
            carried = h.passive_message(self.view, server_round, nu, evaluate)
            if carried is not None:
                return carried
        return None

    def incoming(self, grid: Grid, server_round: int, replies: list[Message], timeout: float) -> list[Message]:
        """The replies passed through every hook in order."""
        for h in self.hooks:
            replies = h.incoming(self.view, grid, server_round, replies, timeout)
        return replies

    def outgoing(self, messages: list[Message]) -> None:
        """Every hook sees the round's messages before they are sent, in order."""
        for h in self.hooks:
            h.outgoing(self.view, messages)

    def record(self, server_round: int, row: dict) -> None:
        """Every hook adds its columns to the round's history row."""
        for h in self.hooks:
            h.record(self.view, server_round, row)

    def end(self, grid: Grid, server_round: int, timeout: float) -> None:
        """Every hook's end of the round, in order."""
        for h in self.hooks:
            h.end(self.view, grid, server_round, timeout)

    def recover(self, grid: Grid, exc: BaseException, timeout: float) -> int | None:
        """The first hook's recovery from ``exc`` (the round to run again), then every hook's
        ``rejoined``; None when no hook recovers."""
        for h in self.hooks:
            first = h.recover(self.view, grid, exc, timeout)
            if first is not None:
                for other in self.hooks:
                    other.rejoined(self.view, grid, timeout, first - 1)
                return first
        return None

    def stopped(self, exc: BaseException) -> list[str]:
        """Each hook's note on a stopped run, in order, those that have one."""
        return [s for s in (h.stopped(self.view, exc) for h in self.hooks) if s]
