"""Which group each row is in: the sensitive column as the constraints read it.

A boolean column is the paper's two groups; an integer column holds group codes. Groups
known only through a noisy release carry membership weights (core/constraints/release.py),
so that every sum over a group's rows is an unbiased estimate of the true group's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


def pooled_names(names: tuple[str, ...], small: list[int]) -> tuple[list[int], tuple[str, ...]]:
    """The groups kept as they are, and the names after merging ``small`` into one group, placed
    last and named after its members joined by " + "."""
    keep = [k for k in range(len(names)) if k not in small]
    return keep, (*(names[k] for k in keep), " + ".join(names[k] for k in small))


@dataclass(frozen=True)
class SizedGroups:
    """Groups known only by their sizes in a few row sets (a registry's encrypted groups: the
    server asks their sums, never a row's group): what :func:`~fairvfl_flwr.core.constraints.
    pooling.pooled_members` reads to decide which to pool, as it reads :class:`SensitiveGroups`.
    ``counts[j, g]``: group g's rows among the rows of ``sets[j]``."""

    names: tuple[str, ...]
    sets: tuple[np.ndarray, ...]
    counts: np.ndarray

    def __len__(self) -> int:
        return len(self.names)

    def count(self, rows: np.ndarray, k: int) -> int:
        """Group ``k``'s rows among ``rows``, one of the row sets whose sizes were asked."""
        for j, known in enumerate(self.sets):
            if known.shape == rows.shape and np.array_equal(known, rows):
                return int(self.counts[j, k])
        raise KeyError("the sizes of these rows' groups were not asked")

    def pooled(self, small: list[int]) -> "SizedGroups":
        """The groups with those in ``small`` merged into one (placed last), as :meth:`SensitiveGroups.pooled`."""
        keep, names = pooled_names(self.names, small)
        counts = np.column_stack([self.counts[:, keep], self.counts[:, small].sum(axis=1)])
        return SizedGroups(names, self.sets, counts)


@dataclass(frozen=True)
class SensitiveGroups:
    """Which group each row is in: ``codes[i]`` indexes ``names``.

    A boolean column is the two-group case of the paper: True is group a (index 0),
    False group b (index 1).

    ``weights`` (m × G): the groups are known only through a noisy release (a group
    registry's randomized response, core/constraints/release.py): ``codes[i]`` is row i's
    released value 0..m-1 and ``weights[codes[i], g]`` its membership weight in group g, chosen
    so that a weighted sum over the rows estimates the sum over group g's true rows without
    bias. None: the codes are the groups (weight 1 in its own group, 0 elsewhere).
    """

    codes: np.ndarray
    names: tuple[str, ...]
    weights: np.ndarray | None = None

    @classmethod
    def of(cls, s: np.ndarray, names: tuple[str, ...] | None = None,
           weights: np.ndarray | None = None) -> "SensitiveGroups":
        """The groups of a sensitive column: a boolean column is the paper's two groups (True is a), an
        integer column holds group codes 0..k-1 (with ``weights``: released values, see the class)."""
        if isinstance(s, SensitiveGroups):
            return s
        s = np.asarray(s)
        names = None if names is None else tuple(map(str, names))  # a table's values may be numpy strings
        if s.dtype == bool:
            return cls(np.where(s, 0, 1), names or ("a", "b"), weights)
        codes = s.astype(np.int64)
        count = weights.shape[1] if weights is not None else int(codes.max()) + 1 if len(codes) else 0
        return cls(codes, names or tuple(str(k) for k in range(count)), weights)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def exact(self) -> bool:
        """Whether each row's group is known (not only a noisy release of it)."""
        return self.weights is None

    def mask(self, k: int) -> np.ndarray:
        """The rows of group ``k`` (from a noisy release: every row with a weight in it)."""
        return self.codes == k if self.weights is None else self.weights[self.codes, k] != 0

    def weight(self, k: int) -> np.ndarray:
        """Each row's membership weight in group ``k`` (exact: 1 in its group, else 0)."""
        return self.mask(k).astype(np.float64) if self.weights is None else self.weights[self.codes, k]

    def count(self, rows: np.ndarray, k: int) -> int:
        """Group ``k``'s rows among ``rows`` (from a noisy release: the estimate, rounded)."""
        if self.weights is None:
            return int((rows & self.mask(k)).sum())
        return int(round(float(self.weight(k)[rows].sum())))

    def take(self, rows: np.ndarray) -> "SensitiveGroups":
        """The groups of the rows ``rows``."""
        return dataclasses.replace(self, codes=self.codes[rows])

    def pooled(self, small: list[int]) -> "SensitiveGroups":
        """The groups with those in ``small`` merged into one (placed last), named after its
        members joined by " + " ('Female & Amer-Indian-Eskimo + Female & Other'); from a noisy
        release, the merged group's weights are the sum of its members'."""
        keep, names = pooled_names(self.names, small)
        if self.weights is not None:
            merged = np.column_stack([self.weights[:, keep], self.weights[:, small].sum(axis=1)])
            return SensitiveGroups(self.codes, names, merged)
        new = np.empty(len(self.names), dtype=np.int64)
        new[keep] = np.arange(len(keep))
        new[small] = len(keep)
        return SensitiveGroups(new[self.codes], names)
