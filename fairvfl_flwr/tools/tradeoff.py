"""Accuracy against a fairness gap: a method's curve, and its accuracy at a gap it was not run at.

A method run over a grid of settings (FairVFL's ε, fairlearn's difference bounds) gives
points (gap, accuracy). Two methods' grids do not land on the same gaps, so they are compared
on their curves: :func:`accuracy_at_gap` reads a curve at a common gap g.

How a curve is read at g:

* only the *non-dominated* points count (:func:`frontier`): a point with a larger gap and no
  higher accuracy than another is never the one to deploy;
* between two neighbouring frontier points the accuracy is interpolated linearly. That is
  attainable: a model that predicts with one of the two at random (probability p, 1 − p) has
  exactly the mixed accuracy, and every group's rate is the mixed rate, so its gap (a largest
  difference of rates) is at most the mixed gap;
* at or above the frontier's largest gap, the accuracy of that point (its gap is below g);
* below the frontier's smallest gap: no value (None), the method never got there. No
  extrapolation.
"""

from __future__ import annotations

import numpy as np

Point = tuple[float, float]  # (gap, accuracy)


def frontier(points: list[Point]) -> list[Point]:
    """The non-dominated points, by increasing gap (and so increasing accuracy): each has a
    higher accuracy than every point with a gap at most its own. NaN points are dropped."""
    best: dict[float, float] = {}
    for gap, acc in points:
        if np.isfinite(gap) and np.isfinite(acc):
            best[float(gap)] = max(best.get(float(gap), -np.inf), float(acc))
    kept: list[Point] = []
    for gap in sorted(best):  # by gap; a point stays if it beats every smaller gap
        if not kept or best[gap] > kept[-1][1]:
            kept.append((gap, best[gap]))
    return kept


def accuracy_at_gap(points: list[Point], gap: float) -> float | None:
    """The curve through ``points`` read at ``gap`` (module docstring): linear between
    frontier points, flat beyond the largest gap, None below the smallest."""
    front = frontier(points)
    if not front or gap < front[0][0]:
        return None
    gaps, accs = zip(*front)
    return float(np.interp(gap, gaps, accs))  # np.interp holds the last value beyond the end


def matched_gaps(curves: list[list[Point]]) -> list[float]:
    """The common gaps to read the curves at: every gap at which one of them has a frontier
    point (exact, not rounded: a rounded gap can fall just below a curve's smallest), so that
    each method's own points are compared with the others' curves at the same gap. A curve has
    no value at the gaps below its own smallest: where one method reaches a gap the other never
    does shows as a missing value."""
    return sorted({gap for c in curves for gap, _ in frontier(c)})
