"""The job registry: every sequence of messages the app answers, declared once.

A :class:`Job` declares its message types with their party handlers, each type declared with
its kind where the job's module declares the handler (``flower/party.handlers``, as an
algorithm's are), and, for a job a run config selects, the run-config ``mode`` values that
select it, how it reads its settings from the run config (once per run) and its server entry.
A new job is its module in ``jobs/`` plus one line in the :func:`register` call of
``app/jobs.py`` (docs/architecture.md, "Adding a job"); everything else derives from the
registry:

* the protocol's message list (:func:`message_types`): a type is declared by exactly one
  job or by the training algorithms (config/algorithms.py: two algorithms may share a
  handler), so every type has exactly one handler;
* the ClientApp's handlers (:func:`attach`): each type is routed to its job's or its
  algorithm's handler, also for one registered after the app was built (a plug-in, a test);
* the ServerApp's dispatch (:func:`run`): the job whose modes hold the run config's
  ``mode``;
* the run config's ``mode`` choices (``config/run.MODES`` reads them from here).

A job without modes (alignment, key agreement, saving) runs inside another job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

from fairvfl_flwr.config import RunConfig, algorithms
from fairvfl_flwr.config.run import MODES
from fairvfl_flwr.flower import protocol as msgs

Handler = Callable[[Message, Context], Message]
#: A job's server entry: (grid, its settings as ``Job.read`` parsed them, the run id) -> (summary, run folder).
ServerEntry = Callable[[Grid, Any, "int | str | None"], "tuple[dict, Path]"]
CATEGORIES = ("query", "train")


@dataclass(frozen=True)
class Job:
    """A whole sequence of messages: its message types and party handlers; where a run config
    selects it (``modes``), how it reads its settings (``read``: a run config -> an object
    with ``num_parties`` and ``to_flower()``, e.g. a :class:`RunConfig`) and its server
    entry (``run``)."""

    name: str
    handlers: Mapping[str, Handler]
    run: ServerEntry | None = None
    modes: tuple[str, ...] = ()
    read: Callable[[Mapping[str, Any]], Any] = field(default=RunConfig.from_flower)

    @property
    def message_types(self) -> tuple[str, ...]:
        """The message types this job's parties answer."""
        return tuple(self.handlers)


_JOBS: dict[str, Job] = {}
_BY_TYPE: dict[str, Job] = {}
_BY_MODE: dict[str, Job] = {}
#: The registered algorithms' message types: type -> (its handler, the algorithms that declare it).
_BY_ALGORITHM_TYPE: dict[str, tuple[Handler, set[str]]] = {}
_APPS: list[tuple[ClientApp, set[str]]] = []  # every attached ClientApp and the types routed on it


def _check_format(who: str, message_type: str) -> None:
    category, dot, action = message_type.partition(".")
    if category not in CATEGORIES or not dot or not action.isidentifier():
        raise ValueError(f"{who}: message type {message_type!r} is not '<query|train>.<name>'")
    if msgs.kind_of(message_type) is None:  # every mod asks the kind: an undeclared type would pass them all
        raise ValueError(f"{who}: message type {message_type!r} has no declared kind (declare its handler with "
                         "flower/party.handlers)")


def _check_type(job: Job, message_type: str) -> None:
    _check_format(f"job {job.name!r}", message_type)
    if message_type in _BY_TYPE:
        raise ValueError(f"job {job.name!r}: message type {message_type!r} is job {_BY_TYPE[message_type].name!r}'s")
    if message_type in _BY_ALGORITHM_TYPE:
        raise ValueError(f"job {job.name!r}: message type {message_type!r} is algorithm "
                         f"{sorted(_BY_ALGORITHM_TYPE[message_type][1])[0]!r}'s")


def _algorithm_changed(alg: algorithms.Algorithm, added: bool) -> None:
    """An algorithm was registered (``added``) or removed: its handlers join the routing, or
    leave the protocol's list where no other algorithm declares them."""
    who = f"algorithm {alg.name!r}"
    if not added:
        for message_type in alg.handlers:
            handler, names = _BY_ALGORITHM_TYPE[message_type]
            names.discard(alg.name)
            if not names:
                del _BY_ALGORITHM_TYPE[message_type]
        return
    for message_type, handler in alg.handlers.items():
        _check_format(who, message_type)
        if message_type in _BY_TYPE:
            raise ValueError(f"{who}: message type {message_type!r} is job {_BY_TYPE[message_type].name!r}'s")
        held = _BY_ALGORITHM_TYPE.get(message_type)
        if held is not None and held[0] is not handler:
            raise ValueError(f"{who}: message type {message_type!r} has another handler (algorithm "
                             f"{sorted(held[1])[0]!r}'s)")
    for message_type, handler in alg.handlers.items():
        _BY_ALGORITHM_TYPE.setdefault(message_type, (handler, set()))[1].add(alg.name)
    for app, routed in _APPS:
        _route_on(app, routed)


def register(*jobs: Job) -> None:
    """Add ``jobs`` to the registry, route their message types on every attached ClientApp and
    add their modes to the run config's ``mode`` choices. A name, message type or mode that
    another job holds is refused, as is a mode without a server entry."""
    for job in jobs:
        if job.name in _JOBS:
            raise ValueError(f"a job named {job.name!r} is registered already")
        for message_type in job.handlers:
            _check_type(job, message_type)
        for mode in job.modes:
            if mode in _BY_MODE:
                raise ValueError(f"job {job.name!r}: mode {mode!r} selects job {_BY_MODE[mode].name!r}")
        if job.modes and job.run is None:
            raise ValueError(f"job {job.name!r}: a job a mode selects needs its server entry (run)")
        _JOBS[job.name] = job
        _BY_TYPE.update(dict.fromkeys(job.handlers, job))
        _BY_MODE.update(dict.fromkeys(job.modes, job))
    for app, routed in _APPS:
        _route_on(app, routed)


def unregister(*names: str) -> None:
    """Remove the jobs named ``names`` (a plug-in or a test that registered its own). A ClientApp
    built while they were registered keeps answering their message types (Flower's ClientApp
    has no way to drop a handler); the protocol's list and the server's dispatch forget them."""
    for name in names:
        job = _JOBS.pop(name)
        for message_type in job.handlers:
            _BY_TYPE.pop(message_type)
        for mode in job.modes:
            _BY_MODE.pop(mode)


def registered() -> tuple[Job, ...]:
    """Every registered job, in registration order."""
    return tuple(_JOBS.values())


def message_types() -> tuple[str, ...]:
    """Every message type a party answers: the registered jobs' and algorithms' types, each declared once."""
    return (*_BY_TYPE, *_BY_ALGORITHM_TYPE)


def handler_of(message_type: str) -> Handler:
    """The party handler that answers ``message_type`` (its job's, or its algorithms')."""
    job = _BY_TYPE.get(message_type)
    return job.handlers[message_type] if job is not None else _BY_ALGORITHM_TYPE[message_type][0]


def _route_on(app: ClientApp, routed: set[str]) -> None:
    # Each type goes straight to its job's handler, not through a lookup in this registry:
    # Flower's simulation engine pickles the ClientApp into its worker processes, which
    # import a handler's own module but never the module that registered the jobs, so a
    # registry lookup there finds nothing.
    for message_type in [t for t in message_types() if t not in routed]:
        category, _, action = message_type.partition(".")
        getattr(app, category)(action)(handler_of(message_type))  # wrapped in the app's mods
        routed.add(message_type)


def attach(app: ClientApp) -> None:
    """Route every registered job's and algorithm's message types on ``app`` to their handlers,
    now and for those registered later."""
    routed: set[str] = set()
    _APPS.append((app, routed))
    _route_on(app, routed)


def selected(run_config: Mapping[str, Any]) -> Job:
    """The job ``run_config``'s ``mode`` selects (the mode checked as the run config checks it)."""
    mode = RunConfig.mode_of(run_config)
    job = _BY_MODE.get(mode)
    if job is None:
        raise ValueError(f"run config mode={mode!r}: no registered job runs it (app/jobs.py registers the jobs)")
    return job


def run(grid: Grid, run_config: Mapping[str, Any], run_id: int | str | None = None) -> tuple[dict, Path]:
    """The ServerApp's dispatch: the selected job's settings, read once, and its server entry."""
    job = selected(run_config)
    return job.run(grid, job.read(run_config), run_id)


algorithms.subscribe(_algorithm_changed)  # every algorithm's handlers, registered before this module or after
MODES.read_from(lambda: tuple(_BY_MODE))  # the run config's mode choices are the registered jobs' modes
