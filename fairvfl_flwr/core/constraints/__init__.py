"""Fairness constraints as objects, one module per kind, registered here.

The run config's ``constraint`` names a kind; :data:`KINDS` maps the name to its class
(a :class:`~fairvfl_flwr.core.constraints.base.ConstraintSet`). Adding a kind is one new
module with a subclass that says which row subsets it compares the groups on, plus its
entry in the :func:`register` call below (docs/architecture.md, "Adding a constraint kind").
"""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.constraints.base import (
    FORMS, ConstraintSet, Gap, GroupSizeError, SensitiveGroups, register,
)
from fairvfl_flwr.core.constraints.demographic_parity import DemographicParity
from fairvfl_flwr.core.constraints.deo import DEO
from fairvfl_flwr.core.constraints.equalized_odds import EqualizedOdds
from fairvfl_flwr.core.constraints.measures import MEASURES

register(DEO, EqualizedOdds, DemographicParity)
KINDS = ConstraintSet.kinds
#: the run config's choices for ``constraint``
CONSTRAINTS = tuple(KINDS)

__all__ = ["CONSTRAINTS", "FORMS", "KINDS", "MEASURES", "ConstraintSet", "Gap", "GroupSizeError",
           "SensitiveGroups", "build", "kind", "register"]


def kind(name: str) -> type[ConstraintSet]:
    """The class of the constraint kind ``name`` (run-config ``constraint``)."""
    return ConstraintSet.kind_named(name)


def build(name: str, y: np.ndarray, s: np.ndarray, protected_label: int, measure: str = "loss",
          **options) -> ConstraintSet:
    """The constraint of kind ``name`` on rows (y, s); ``options``: ConstraintSet.build's."""
    return ConstraintSet.from_labels(y, s, protected_label, name, measure, **options)
