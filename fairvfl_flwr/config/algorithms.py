"""The algorithm registry: every training algorithm declared once, with what a run config asks of it.

An algorithm's module (``algorithms/``) declares an :class:`Algorithm`: its name (a value of
the run config's ``optimizer``, or the ``mode`` that selects it), its server, its parties'
handlers, the settings it cannot run with, whether ``optimizer = "auto"`` may pick it (and
why not), its blocks' own step rule, whether its parties save their blocks and whether the
server keeps its final scores. A new algorithm is its module plus its entry in the
:func:`register` call of ``algorithms/__init__.py`` (docs/architecture.md, "Adding an
algorithm"); everything else reads the registry:

* the run config: ``optimizer``'s choices (:data:`OPTIMIZERS`), each algorithm's refused
  settings (:func:`refused`, checked with config/sections.REFUSED) and what ``auto`` picks
  (:func:`resolve`, the one place it is resolved);
* the training job: the run's server (``build_server``), whether it saves blocks and keeps
  scores;
* the parties: their block's step rule (flower/party.py) and their handlers, which the job
  registry routes on every ClientApp as an algorithm is registered (flower/jobs.py).

No module outside an algorithm's own compares the run config's ``optimizer`` with its name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from fairvfl_flwr.core.errors import ConfigError

#: The ``optimizer`` value that lets :func:`resolve` choose.
AUTO = "auto"

#: One setting an algorithm cannot run with: (its field, is it on for this config?, why).
Refusal = tuple[str, Callable[[Any], bool], str]


@dataclass(frozen=True, eq=False)
class Algorithm:
    """One training algorithm, as the registry and the run config see it.

    ``server``: called as ``server(cfg, labels, on_round=..., hooks=..., scheduler=...)``, it
    returns the run's server (a ``flower/server.VFLServer``; a server class is such a call).
    ``handlers``: the parties' handlers by message type (each type declared with its kind,
    flower/protocol.py); two algorithms may share a handler, never a type with another one.
    ``reason(cfg, passed)``: the log's line on why the run trains this way; ``passed`` is
    None when the run config named the algorithm, else why ``auto`` passed over the
    algorithms registered before it.
    ``auto(cfg)``: why ``auto`` may not pick it for ``cfg`` (None: it may); without it ``auto``
    never does. ``mode``: a run-config ``mode`` that selects it whatever ``optimizer`` says.
    ``step_rule``: its blocks' own step rule (core/blocks.build_block; "" the paper's
    gradient step), whose state the block's ``state_dict`` carries.
    ``summary(cfg)``: what the run's summary records of its own settings.
    """

    name: str
    server: Callable[..., Any]
    handlers: Mapping[str, Callable[..., Any]]
    reason: Callable[[Any, "tuple[str, ...] | None"], str]
    refuses: tuple[Refusal, ...] = ()
    auto: Callable[[Any], str | None] | None = None
    mode: str = ""
    step_rule: str = ""
    saves_blocks: bool = True
    keeps_scores: bool = False
    summary: Callable[[Any], dict] | None = None

    def refusal(self, cfg: Any) -> tuple[str, str] | None:
        """(field, why) of the first setting of ``cfg`` this algorithm cannot run with, or None."""
        return next(((field, why) for field, on, why in self.refuses if on(cfg)), None)

    def __repr__(self) -> str:
        return f"Algorithm({self.name!r})"


_REGISTERED: dict[str, Algorithm] = {}
_LISTENERS: list[Callable[[Algorithm, bool], None]] = []


def register(*algorithms: Algorithm) -> None:
    """Add ``algorithms``, in ``auto``'s order of preference. A name or mode another algorithm
    holds is refused, as is a message type another handler answers (flower/jobs.py)."""
    for alg in algorithms:
        if not alg.name or alg.name == AUTO or alg.name in _REGISTERED:
            raise ValueError(f"an algorithm named {alg.name!r} is registered already (or the name is reserved)")
        if alg.mode and any(other.mode == alg.mode for other in _REGISTERED.values()):
            raise ValueError(f"algorithm {alg.name!r}: mode {alg.mode!r} selects another algorithm already")
        _REGISTERED[alg.name] = alg
        try:
            for listener in _LISTENERS:
                listener(alg, True)
        except Exception:  # refused where it is routed (a message type another handler answers)
            _REGISTERED.pop(alg.name)
            raise


def unregister(*names: str) -> None:
    """Remove the algorithms named ``names`` (a plug-in or a test that registered its own)."""
    for name in names:
        alg = _REGISTERED.pop(name)
        for listener in _LISTENERS:
            listener(alg, False)


def subscribe(listener: Callable[[Algorithm, bool], None]) -> None:
    """Call ``listener(algorithm, True)`` for every registered algorithm, now and as one is
    registered, and ``listener(algorithm, False)`` as one is removed (the job registry routes
    their handlers so)."""
    _LISTENERS.append(listener)
    for alg in tuple(_REGISTERED.values()):
        listener(alg, True)


def registered() -> tuple[Algorithm, ...]:
    """Every registered algorithm, in registration order (``auto``'s order of preference)."""
    return tuple(_REGISTERED.values())


def named(name: str) -> Algorithm:
    """The registered algorithm ``name``."""
    alg = _REGISTERED.get(name)
    if alg is None:
        raise ConfigError(f"no algorithm named {name!r} is registered (registered: "
                          f"{', '.join(_REGISTERED) or 'none: import fairvfl_flwr.algorithms'})")
    return alg


class OptimizerNames(Sequence):
    """The run config's ``optimizer`` choices: ``auto`` and the registered algorithms a mode
    does not select, read from the registry on every use (a plug-in's too)."""

    def _names(self) -> tuple[str, ...]:
        return (AUTO, *(a.name for a in _REGISTERED.values() if not a.mode))

    def __getitem__(self, index):
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __repr__(self) -> str:
        return repr(self._names())


OPTIMIZERS = OptimizerNames()


class Choice(NamedTuple):
    """The algorithm a run trains with, and why (the run's log says both)."""

    algorithm: Algorithm
    reason: str

    @property
    def name(self) -> str:
        """The algorithm's name."""
        return self.algorithm.name


def resolve(cfg: Any) -> Choice:
    """The one place the run's algorithm is chosen: the algorithm ``mode`` selects, else the one
    ``optimizer`` names, else (``auto``) the first registered one whose ``auto`` lets it run,
    with why the ones before it did not."""
    for alg in _REGISTERED.values():
        if alg.mode and alg.mode == cfg.mode:
            return Choice(alg, alg.reason(cfg, None))
    if cfg.optimizer != AUTO:
        alg = named(cfg.optimizer)
        return Choice(alg, alg.reason(cfg, None))
    passed: list[str] = []
    for alg in _REGISTERED.values():
        if alg.mode or alg.auto is None:
            continue
        why = alg.auto(cfg)
        if why is None:
            return Choice(alg, alg.reason(cfg, tuple(passed)))
        passed.append(why)
    raise ConfigError(f"run config optimizer={AUTO!r}: no registered algorithm runs with these settings"
                      + (f" ({'; '.join(passed)})" if passed else " (none is registered: import fairvfl_flwr.algorithms)"))


def refused() -> list[tuple[str, Callable[[Any], bool], str, Callable[[Any], bool], str]]:
    """Every registered algorithm's refusals as rows of config/sections.REFUSED: (setting, on?,
    other setting, on?, why). One ``optimizer`` selects names ``optimizer`` first; one a mode
    selects names the refused setting first, then ``mode``."""
    rows = []
    for alg in _REGISTERED.values():
        for field, on, why in alg.refuses:
            if alg.mode:
                rows.append((field, on, "mode", _mode_is(alg.mode), why))
            else:
                rows.append(("optimizer", _optimizer_is(alg.name), field, on, why))
    return rows


def _mode_is(mode: str) -> Callable[[Any], bool]:
    return lambda c: c.mode == mode


def _optimizer_is(name: str) -> Callable[[Any], bool]:
    return lambda c: c.optimizer == name
