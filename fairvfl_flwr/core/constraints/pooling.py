"""Small groups pooled into one (run config ``min-group-size``, ``pool-small-groups``): which, why, and how it is said.

A gap over a group with a handful of rows cannot be measured reliably: such a group is
refused (:class:`GroupSizeError`), or with ``pool-small-groups`` merged with the other small
ones (:func:`pooled_members`, decided on every row of the table so that a run's groups do
not depend on the seed's split). :class:`Pooling` records who was pooled and why, in the
sentence the log and the pre-flight report print; :func:`constrained_codes` maps rows that
were not constrained (the test rows) onto the constrained groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairvfl_flwr.core.constraints.groups import SensitiveGroups, SizedGroups
from fairvfl_flwr.core.errors import ConfigError


class GroupSizeError(ConfigError):
    """A group is too small to be constrained; the message names it and its count."""


def _has(name: str, count: tuple[str, int]) -> str:
    """A group's smallest count in a constrained row set, as refusals and the pooling note say it."""
    return f"{name!r} has {count[1]} in {count[0]!r}"


@dataclass(frozen=True)
class Pooling:
    """Which groups were pooled into one, and why: each member's smallest count in a
    constrained row set, against ``min_size`` (min-group-size). Decided on the rows
    ``rows`` names (the whole table, or the training rows where no test labels are at hand)."""

    #: the pooled group's name (its members joined by " + ")
    name: str
    #: (member, (row set, its count there)), the members below the minimum first, in name order
    small: tuple[tuple[str, tuple[str, int]], ...]
    #: the next smallest groups that joined while the merged group was still below the minimum
    joined: tuple[tuple[str, tuple[str, int]], ...]
    #: the pooled group's own smallest count
    count: tuple[str, int]
    min_size: int
    kind: str
    rows: str

    def describe(self) -> str:
        """One sentence for the log and the pre-flight's report: who was pooled into what, and why."""
        def counted(members):
            said = [_has(n, c) for n, c in members]
            return " and ".join(filter(None, [", ".join(said[:-1]), said[-1]]))

        joined = (f"; {counted(self.joined)} joined as the next smallest while the merged group was still below "
                  "it") if self.joined else ""
        return (f"pooled {len(self.small) + len(self.joined)} groups into one, {_has(self.name, self.count)}: "
                f"{counted(self.small)}, below min-group-size = {self.min_size} {self.rows} in a constrained row "
                f"set ({self.kind}){joined}; the constraint holds for the pooled group as a whole "
                "(pool-small-groups = false refuses instead)")


def pooled_members(groups: SensitiveGroups | SizedGroups, subsets, min_size: int, pool: bool, kind: str,
                   whole_table: bool = False) -> tuple[list[int], Pooling] | None:
    """The groups to merge into one and why (None: none), decided on the rows of ``groups``
    and ``subsets`` (``SizedGroups``: the sizes of every subset and of all rows); refuses (:class:`GroupSizeError`, naming every small group and its
    count, and a pooled group's members with theirs) what pooling does not fix."""
    def smallest(gr: SensitiveGroups, k: int) -> tuple[str, int]:
        return min(((label, gr.count(rows, k)) for label, rows in subsets), key=lambda t: t[1])

    def small_ones(gr: SensitiveGroups) -> dict[int, tuple[str, int]]:
        # an empty gap side is refused by build; min_size 1 turns the check off
        return {k: c for k in range(len(gr)) if (c := smallest(gr, k))[1] < min_size and min_size > 1}

    rows = "rows of the table" if whole_table else "training rows"
    small = small_ones(groups)
    members: list[int] = []
    merged = groups
    if small and pool:
        # merge the small groups, and the next smallest while the merged one is still small
        members = sorted(small)
        while True:
            merged = groups.pooled(members)
            if not small_ones(merged) or len(members) >= len(groups) - 1:
                break
            rest = [k for k in range(len(groups)) if k not in members]
            everyone = np.ones(len(subsets[0][1]), dtype=bool)
            members.append(min(rest, key=lambda k: groups.count(everyone, k)))
        if len(members) < 2:  # two groups: nothing to pool with
            members, merged = [], groups
    still = small_ones(merged)
    if still or (members and len(merged) < 2):
        if still:
            listed = ", ".join(_has(merged.names[k], c) for k, c in sorted(still.items(), key=lambda t: t[1][1]))
            if members and len(merged) - 1 in still:
                listed += (" (pooled from " + ", ".join(_has(groups.names[k], smallest(groups, k))
                                                        for k in members) + "; no group is left to pool with)")
        else:
            listed = (", ".join(_has(groups.names[k], c) for k, c in sorted(small.items(), key=lambda t: t[1][1]))
                      + " (pooled, they make one group: nothing is left to compare it with)")
        # with two groups there is nothing to pool with
        advice = ("; set pool-small-groups = true to merge the small groups into one, or "
                  if not pool and len(groups) > 2 else "; ")
        raise GroupSizeError(
            f"{len(still or small)} group(s) with fewer than min-group-size = {min_size} {rows} in a constrained "
            f"row set ({kind}): {listed}; such a gap cannot be measured reliably{advice}lower min-group-size")
    if len(groups) < 2:
        raise GroupSizeError(f"the sensitive column has {len(groups)} group(s) ({kind} needs two or more)")
    if not members:
        return None
    # in the groups' order, so that the name follows the members only, not which were small
    members = sorted(members)
    merged = groups.pooled(members)
    name = merged.names[-1]
    return members, Pooling(name, tuple((groups.names[k], smallest(groups, k)) for k in members if k in small),
                            tuple((groups.names[k], smallest(groups, k)) for k in members if k not in small),
                            smallest(merged, len(merged) - 1), min_size, kind, rows)


def constrained_codes(constraint, s: np.ndarray, names: tuple[str, ...] | None = None) -> np.ndarray:
    """Each row's group under ``constraint`` (an index into ``constraint.groups.names``) from its
    group ``s`` as the labels hold it (bool a/b, or codes into ``names``): the rows of every
    pooled member go to the pooled group, so other rows (the test rows) are measured over the
    groups the constraint holds for."""
    raw = SensitiveGroups.of(s, names)
    if constraint.pooling is None or constraint.groups is None:
        return raw.codes
    members = {name for name, _ in (*constraint.pooling.small, *constraint.pooling.joined)}
    pooled = len(constraint.groups.names) - 1
    index = {name: k for k, name in enumerate(constraint.groups.names)}
    to_constrained = np.array([pooled if name in members else index[name] for name in raw.names],
                              dtype=np.int64)
    return to_constrained[raw.codes] if len(raw.codes) else raw.codes
