"""The constraint kinds by name (run config ``constraint``): register, look up, build.

:data:`KINDS` maps a kind's name to its class (a
:class:`~fairvfl_flwr.core.constraints.base.ConstraintSet` subclass); the package registers
the built-in kinds, a plug-in or a test may :func:`register` more. :data:`CONSTRAINTS`, the
run config's choices, reads the registry when asked, so a kind registered later is a valid
``constraint`` too.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from fairvfl_flwr.core.constraints.base import ConstraintSet

#: the registered kinds by name
KINDS: dict[str, type[ConstraintSet]] = {}


def register(*classes: type[ConstraintSet]) -> None:
    """Make constraint kinds available by their ``kind`` name (run-config ``constraint``)."""
    for cls in classes:
        if not cls.kind or cls.kind in KINDS:
            raise ValueError(f"constraint kind {cls.__name__}: its name {cls.kind!r} is empty or taken")
        KINDS[cls.kind] = cls


def kind_named(name: str) -> type[ConstraintSet]:
    """The registered class of the kind ``name`` (run-config ``constraint``)."""
    if name not in KINDS:
        raise ValueError(f"unknown constraint {name!r}: choose one of {', '.join(KINDS)}")
    return KINDS[name]


def from_labels(y: np.ndarray, s: np.ndarray, protected_label: int, kind: str = "deo",
                measure: str = "loss", **options) -> ConstraintSet:
    """The constraint of kind ``kind`` on rows (y, s) (``options``: ``ConstraintSet.build``'s)."""
    return kind_named(kind).build(y, s, protected_label, measure, **options)


class RegisteredNames(Sequence):
    """The registered kinds' names, in registration order, read from the registry on every use."""

    def __init__(self, kinds: dict[str, type[ConstraintSet]]) -> None:
        self.kinds = kinds

    def __getitem__(self, index):
        return tuple(self.kinds)[index]

    def __len__(self) -> int:
        return len(self.kinds)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self.kinds))

    def __contains__(self, name: object) -> bool:
        return name in self.kinds

    def __repr__(self) -> str:
        return repr(tuple(self.kinds))


#: the run config's choices for ``constraint``: the registered kinds' names
CONSTRAINTS = RegisteredNames(KINDS)
