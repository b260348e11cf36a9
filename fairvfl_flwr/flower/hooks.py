"""Round hooks: how a feature attaches to the server's round loop without editing it.

In the spirit of Flower's strategy wrappers and client mods: the loop
(:class:`~fairvfl_flwr.flower.server.VFLServer`) calls the hooks at fixed points, and a
feature (checkpoints, divergence guard, encrypted or noisy ν, kept scores) is a
:class:`RoundHook` subclass that overrides the points it needs. The loop never names a
feature.

A hook sees the server through a :class:`ServerView`: what it may read, read-only, and
the few things any hook may do to the run, each an explicit method (exchange messages of
its own, set λ). What only some hooks may do is a capability the hook declares in
``needs`` and is then handed a richer view for: ``"recovery"``, the :class:`Recovery`
view (copy, restore and load the server's state, take a returning party in place of the
one that left), for the hooks that restore a run. The order hooks run in is declared
once, by the app that picks them (``HOOK_ORDER`` in app/training.py); :func:`in_order`
puts a list of hooks in that order and refuses a hook the order does not place.

The points are :class:`RoundHook`'s methods, in the order a run meets them; each
method's docstring says when it is called and what it may return (docs/architecture.md
lists them from there: ``python -m fairvfl_flwr.tools.layout --write``). :class:`Hooks`
calls them: at a point that may be answered by one hook only (``recover``,
``passive_message``) two hooks answering it are refused when the run is assembled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
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
    run goes through one of the methods under "what a hook may do". What returns the run to
    an earlier state is not here: a hook that restores declares ``needs = ("recovery",)``
    and gets the :class:`Recovery` view. ``server`` is the
    :class:`~fairvfl_flwr.flower.server.VFLServer` (not imported: it imports this module).
    """

    def __init__(self, server: Any) -> None:
        self._server = server

    def __getattr__(self, name: str) -> Any:
        # only reached when the attribute is not the view's: name the capability that has it
        for capability, view in CAPABILITIES.items():
            if name in vars(view):
                raise AttributeError(f"{name} is part of the {capability!r} capability ({view.__name__}): a round hook "
                                     f"that uses it declares needs = ({capability!r},) (flower/hooks.py)")
        raise AttributeError(f"a round hook's view of the server has no {name!r} (ServerView lists what it may "
                             "read and do)")

    # -- what a hook may read ---------------------------------------------------------
    cfg: Reads[RunConfig] = Reads()
    labels: Reads[ServerLabels] = Reads(_read_only_labels)
    constraint: Reads[ConstraintSet] = Reads()
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

    def masked_gradient_message(self, node_id: int, server_round: int,
                                arrays: dict[str, np.ndarray]) -> tuple[RecordDict, str]:
        """The training method's second message of a round to a passive party whose ν went out
        encrypted, carrying ``arrays``."""
        return self._server.masked_gradient_message(node_id, server_round, arrays)

    # -- what a hook may do -----------------------------------------------------------
    def exchange(self, grid: Grid, messages: Iterable[Message], timeout: float) -> list[Message]:
        """Send messages of the hook's own and wait for every reply (retries, envelope checks)."""
        return self._server.exchange(grid, messages, timeout)

    def set_lambda(self, lam: np.ndarray) -> None:
        """Replace the multipliers λ (a ν channel that bounds them)."""
        self._server.lam = np.array(lam, dtype=np.float64)


class Recovery(ServerView):
    """The server as a hook that restores a run sees it (``needs = ("recovery",)``): the
    :class:`ServerView` and what returning the run to an earlier state takes."""

    def state_dict(self) -> dict:
        """Everything needed to continue after the last recorded round, as a checkpoint saves it."""
        return self._server.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved :meth:`state_dict`."""
        self._server.load_state_dict(state)

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


#: What a hook may ask for in ``needs``: each capability's name and the view that carries it.
CAPABILITIES: dict[str, type[ServerView]] = {"recovery": Recovery}


class RoundHook:
    """A feature on the server's round loop; override only the points it needs.

    ``needs``: the capabilities (:data:`CAPABILITIES`) the hook's points use beyond the
    :class:`ServerView`; its points are then handed that capability's view.
    """

    needs: tuple[str, ...] = ()

    def discovered(self, server: ServerView, replies: list[Message]) -> None:
        """After discovery, every node known: read the discovery replies (one per party), where
        what the hook asked for on the discovery messages (its ``outgoing``) comes back."""
        return None

    def begin(self, server: ServerView, grid: Grid, timeout: float) -> int | None:
        """Before round 1, every hook, a resumed run's too (a key set-up runs either way): a hook
        that restores a run returns the first round to train; None from all: the server
        initialises the parties (round 0). Two hooks restoring one run are refused."""
        return None

    def init_messages(self, server: ServerView, messages: list[Message]) -> None:
        """The (re)start messages (``query.init``), before they go out: add what the hook's
        parties need."""
        return None

    def nu(self, server: ServerView, server_round: int, nu: np.ndarray) -> np.ndarray:
        """ν of ``server_round``, before any passive party gets it: a ν channel may change it (noise,
        clipping) and returns it."""
        return nu

    def passive_message(
        self, server: ServerView, server_round: int, nu: np.ndarray, evaluate: bool
    ) -> tuple[RecordDict, str] | None:
        """The message that carries ν to a passive party: content and message type that carry it
        instead of the plain message (encrypted ν), or None. One hook of a run may answer."""
        return None

    def incoming(
        self, server: ServerView, grid: Grid, server_round: int, replies: list[Message], timeout: float
    ) -> list[Message]:
        """A round's replies (round 0: the first logits) before they are folded, every reply the
        server folds (Newton's last apply round's too): a hook may check, replace or complete them
        (a second leg) and returns those to fold."""
        return replies

    def outgoing(self, server: ServerView, messages: list[Message]) -> None:
        """Every message of an exchange just before it goes out (the algorithm's, a hook's own and
        the restart messages alike), after every other point has shaped it: a hook may change
        them in place."""
        return None

    def record(self, server: ServerView, server_round: int, row: dict) -> None:
        """A round's history row, after the round is folded and before it is stored: add the hook's
        own columns to ``row`` (the one thing a hook may write to directly)."""
        return None

    def end(self, server: ServerView, grid: Grid, server_round: int, timeout: float) -> None:
        """After the round is folded and recorded, every party having answered it: the hook's own
        messages or files (guards, checkpoints, saved blocks); what the algorithm computed per party
        beyond ν, z and λ is ``server.computed()`` here (Newton's α_k, for transcripts)."""
        return None

    def recover(self, server: ServerView, grid: Grid, exc: BaseException, timeout: float) -> int | None:
        """A round failed with ``exc`` (a :class:`~fairvfl_flwr.flower.errors.FederationError`: a party
        dropped out): a hook that brings the federation back returns the first round to run again;
        None: the run stops. One hook of a run may answer."""
        return None

    def rejoined(self, server: ServerView, grid: Grid, timeout: float, restored: int) -> None:
        """After a hook recovered, every hook: re-establish what ``begin`` set up with the parties as
        they now are (a fresh key set-up); every party continues from its state of round
        ``restored``."""
        return None

    def summary(self) -> dict:
        """After the last round: what the hook adds to the run's summary (summary.json), under keys of
        its own; {} adds nothing."""
        return {}

    def files(self, server: ServerView, grid: Grid, folder: Path, summary: Mapping[str, Any], timeout: float) -> None:
        """After the run's summary is written: the hook's own files in the run folder ``folder``
        (``summary``: the run's summary); a hook may exchange messages of its own first (the parties
        save their blocks)."""
        return None

    def stopped(self, server: ServerView, exc: BaseException) -> str | None:
        """The run is stopping on ``exc``: a note for the log's stop line (what the hook leaves on disk,
        e.g. where its checkpoint is), or None."""
        return None


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


#: The points only one hook of a run may answer (the first answer would silently win).
SOLE_ANSWER = ("recover", "passive_message")


def _answers(hook: RoundHook, point: str) -> bool:
    return getattr(type(hook), point) is not getattr(RoundHook, point)


class Hooks:
    """An ordered list of :class:`RoundHook` objects, called as one, each with its view of the
    server: ``view``, or the view of the capability it declares in ``needs``.

    Two hooks answering a point only one may answer (:data:`SOLE_ANSWER`) are refused.
    """

    def __init__(self, hooks: Iterable[RoundHook], view: ServerView) -> None:
        self.hooks: list[RoundHook] = list(hooks)
        self.view = view
        for point in SOLE_ANSWER:
            answering = [type(h).__name__ for h in self.hooks if _answers(h, point)]
            if len(answering) > 1:
                raise ValueError(f"round hooks {' and '.join(answering)} both answer {point}: only one hook of a run "
                                 "may (the first answer would silently win); leave one of their features off")
        self.views = [self._view_for(h) for h in self.hooks]

    def _view_for(self, hook: RoundHook) -> ServerView:
        """The view ``hook`` is handed: the plain one, or its declared capability's."""
        unknown = [n for n in hook.needs if n not in CAPABILITIES]
        if unknown:
            raise ValueError(f"round hook {type(hook).__name__} needs {', '.join(map(repr, unknown))}: the capabilities "
                             f"a hook may declare are {', '.join(map(repr, CAPABILITIES))}")
        kinds = tuple(dict.fromkeys(CAPABILITIES[n] for n in hook.needs))
        if not kinds:
            return self.view
        kind = kinds[0] if len(kinds) == 1 else type("+".join(k.__name__ for k in kinds), kinds, {})
        return kind(self.view._server)

    def _each(self) -> Iterable[tuple[RoundHook, ServerView]]:
        return zip(self.hooks, self.views)

    def begin(self, grid: Grid, timeout: float) -> int | None:
        """Every hook's ``begin``, in order; the first round to run, from the hook that restored
        the run (None: a fresh start). Every hook begins on a resume too (a key set-up must run
        whether or not the run restarts); two hooks restoring a run are refused."""
        resumed: list[tuple[RoundHook, int]] = []
        for h, view in self._each():
            first = h.begin(view, grid, timeout)
            if first is not None:
                resumed.append((h, first))
        if len(resumed) > 1:
            raise ValueError("more than one round hook restored the run: "
                             + ", ".join(f"{type(h).__name__} (round {r})" for h, r in resumed)
                             + "; one hook may resume a run")
        return resumed[0][1] if resumed else None

    def discovered(self, replies: list[Message]) -> None:
        """Every hook reads the discovery replies, in order."""
        for h, view in self._each():
            h.discovered(view, replies)

    def init_messages(self, messages: list[Message]) -> None:
        """Every hook adds to the (re)start messages, in order."""
        for h, view in self._each():
            h.init_messages(view, messages)

    def nu(self, server_round: int, nu: np.ndarray) -> np.ndarray:
        """ν passed through every hook in order (each may change it)."""
        for h, view in self._each():
            nu = h.nu(view, server_round, nu)
        return nu

    def passive_message(self, server_round: int, nu: np.ndarray, evaluate: bool) -> tuple[RecordDict, str] | None:
        """The one hook's replacement of a passive party's message (encrypted ν), or None: the plain message."""
        for h, view in self._each():
            carried = h.passive_message(view, server_round, nu, evaluate)
            if carried is not None:
                return carried
        return None

    def incoming(self, grid: Grid, server_round: int, replies: list[Message], timeout: float) -> list[Message]:
        """The replies passed through every hook in order."""
        for h, view in self._each():
            replies = h.incoming(view, grid, server_round, replies, timeout)
        return replies

    def outgoing(self, messages: list[Message]) -> None:
        """Every hook sees the round's messages before they are sent, in order."""
        for h, view in self._each():
            h.outgoing(view, messages)

    def record(self, server_round: int, row: dict) -> None:
        """Every hook adds its columns to the round's history row."""
        for h, view in self._each():
            h.record(view, server_round, row)

    def end(self, grid: Grid, server_round: int, timeout: float) -> None:
        """Every hook's end of the round, in order."""
        for h, view in self._each():
            h.end(view, grid, server_round, timeout)

    def recover(self, grid: Grid, exc: BaseException, timeout: float) -> int | None:
        """The one recovering hook's recovery from ``exc`` (the round to run again), then every
        hook's ``rejoined``; None when it does not recover (or no hook may)."""
        for h, view in self._each():
            first = h.recover(view, grid, exc, timeout)
            if first is not None:
                for other, other_view in self._each():
                    other.rejoined(other_view, grid, timeout, first - 1)
                return first
        return None

    def summary(self) -> dict:
        """What every hook adds to the run's summary, in order; two hooks giving one key are refused."""
        merged: dict = {}
        given: dict[str, str] = {}
        for h in self.hooks:
            for key, value in h.summary().items():
                if key in given:
                    raise ValueError(f"round hooks {given[key]} and {type(h).__name__} both add {key!r} to the run's "
                                     "summary; each hook adds keys of its own")
                given[key] = type(h).__name__
                merged[key] = value
        return merged

    def files(self, grid: Grid, folder: Path, summary: Mapping[str, Any], timeout: float) -> None:
        """Every hook writes its own files into the run folder, in order, once the summary is written."""
        for h, view in self._each():
            h.files(view, grid, folder, summary, timeout)

    def stopped(self, exc: BaseException) -> list[str]:
        """Each hook's note on a stopped run, in order, those that have one."""
        return [s for s in (h.stopped(view, exc) for h, view in self._each()) if s]
