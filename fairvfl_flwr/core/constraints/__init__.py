"""Fairness constraints as objects, one module per kind, registered here.

The run config's ``constraint`` names a kind; :data:`KINDS` maps the name to its class
(a :class:`~fairvfl_flwr.core.constraints.base.ConstraintSet`). Adding a kind is one new
module with a subclass that says which row subsets it compares the groups on, plus its
entry in the :func:`register` call below (docs/architecture.md, "Adding a constraint kind").
:data:`CONSTRAINTS`, the run config's choices, reads the registry when asked, so a kind
registered later (a plug-in, a test) is a valid ``constraint`` too.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from fairvfl_flwr.core.constraints.base import (
    FORMS, ConstraintSet, Gap, GroupSizeError, Pooling, SensitiveGroups, register,
)
from fairvfl_flwr.core.constraints.demographic_parity import DemographicParity
from fairvfl_flwr.core.constraints.deo import DEO
from fairvfl_flwr.core.constraints.equalized_odds import EqualizedOdds
from fairvfl_flwr.core.constraints.measures import MEASURES

__all__ = ["CONSTRAINTS", "FORMS", "KINDS", "MEASURES", "ConstraintSet", "Gap", "GroupSizeError", "Pooling",
           "RegisteredNames", "SensitiveGroups", "register"]


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


register(DEO, EqualizedOdds, DemographicParity)
#: the registered kinds by name (``ConstraintSet.kinds``)
KINDS = ConstraintSet.kinds
#: the run config's choices for ``constraint``: the registered kinds' names
CONSTRAINTS = RegisteredNames(KINDS)
