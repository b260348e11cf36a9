"""Fairness constraints as objects, one module per kind, registered here.

The run config's ``constraint`` names a kind; :data:`KINDS` maps the name to its class
(a :class:`~fairvfl_flwr.core.constraints.base.ConstraintSet`). Adding a kind is one new
module with a subclass that says which row subsets it compares the groups on, plus its
entry in the :func:`~fairvfl_flwr.core.constraints.registry.register` call below
(docs/architecture.md, "Adding a constraint kind"). :data:`CONSTRAINTS`, the run config's
choices, reads the registry when asked, so a kind registered later (a plug-in, a test) is a
valid ``constraint`` too.
"""

from __future__ import annotations

from fairvfl_flwr.core.constraints.base import FORMS, ConstraintSet, Gap, as_multipliers, gap_weights, gaps_per_row
from fairvfl_flwr.core.constraints.demographic_parity import DemographicParity
from fairvfl_flwr.core.constraints.deo import DEO
from fairvfl_flwr.core.constraints.equalized_odds import EqualizedOdds
from fairvfl_flwr.core.constraints.groups import SensitiveGroups, SizedGroups
from fairvfl_flwr.core.constraints.history import HistoryNames
from fairvfl_flwr.core.constraints.measures import MEASURES
from fairvfl_flwr.core.constraints.pooling import GroupSizeError, Pooling, constrained_codes, pooled_members
from fairvfl_flwr.core.constraints.registry import CONSTRAINTS, KINDS, from_labels, kind_named, register

__all__ = ["CONSTRAINTS", "FORMS", "KINDS", "MEASURES", "ConstraintSet", "Gap", "GroupSizeError", "HistoryNames",
           "Pooling", "SensitiveGroups", "SizedGroups", "as_multipliers", "constrained_codes", "from_labels", "gap_weights",
           "gaps_per_row", "kind_named", "pooled_members", "register"]

register(DEO, EqualizedOdds, DemographicParity)
