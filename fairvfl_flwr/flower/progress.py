"""Progress of a long job on either side: a log line per step, with its counts and the time left.

A job's steps cost differently: the private alignment reads the tables, blinds every party's
ids at once, raises the label owner's, and the label owner alone raises the others'. A share
of the steps or of the seconds so far is then no measure of what is left. :class:`Estimate`
keeps, for each *kind* of step, the seconds per unit of work (an id, a row) that the steps
of that kind took so far, and sums over the steps still to come their work times their
kind's rate. A kind not seen yet takes its rate from the kind it is tied to (``relative``:
a raise costs about 0.7 of a blinding), else from a prior (``priors``: seconds per unit
measured before the job), else the time left is not known yet. The step under way counts
with what it has done (``done_units``). One that says nothing of it and has run past its
estimate raises its kind's rate: to what it has taken so far when the rate was measured,
and to twice that when it was only a prior (a free core's cost, a floor that a busy machine
or slower cores exceed by any factor: the step is then taken to be half done, the median
when nothing else is known). The caller says what a unit of work is: when
parties work at once on one machine their work adds up, on machines of their own the
largest share sets the pace.

:class:`Progress` logs it: a line when a step ends (its name, counts, seconds, the time
left) and, while one runs, every little while (10 s, then less often, at most a minute
apart) what it waits for, the replies or units done so far and the time left. A line with
an estimate carries it in its log record (attribute :data:`RECORD`: ``what``, ``at``, the
clock's time, and ``left``, seconds) for a bench to hold against what happened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from logging import INFO

from flwr.supercore import log

RECORD = "fairvfl_progress"  # the log record's attribute of a line with an estimate
EVERY = 10.0  # seconds before a running step's first line; later lines come at most MAX_GAP apart
MAX_GAP = 60.0


@dataclass(frozen=True)
class Step:
    """One step of a job: its name once done, its kind (steps of a kind cost alike per unit of
    work; None: not estimated), its work in units, its counts and, while it runs, what the job
    waits for."""

    name: str
    kind: str | None
    units: float = 0.0
    counts: str = ""
    doing: str = ""


class Estimate:
    """The time left of a sequence of steps whose costs differ (see the module's docstring).

    ``priors``: seconds per unit of a kind before any step of it is done; ``relative``: kind →
    (another kind, factor), the kind's rate as a multiple of the other's."""

    def __init__(self, steps: Iterable[Step], priors: dict[str, float] | None = None,
                 relative: dict[str, tuple[str, float]] | None = None) -> None:
        self.steps = list(steps)
        self.priors = dict(priors or {})
        self.relative = dict(relative or {})
        self.done = 0  # steps done
        self._seconds: dict[str, float] = {}
        self._units: dict[str, float] = {}

    @property
    def current(self) -> Step | None:
        """The step under way (None once all are done)."""
        return self.steps[self.done] if self.done < len(self.steps) else None

    def plan(self, steps: Iterable[Step]) -> None:
        """The steps from the current one on are ``steps`` (what is left became known)."""
        self.steps = self.steps[:self.done] + list(steps)

    def finished(self, seconds: float) -> None:
        """The current step took ``seconds``: its kind's rate takes them in."""
        step = self.steps[self.done]
        if step.kind is not None and step.units > 0:
            self._seconds[step.kind] = self._seconds.get(step.kind, 0.0) + seconds
            self._units[step.kind] = self._units.get(step.kind, 0.0) + step.units
        self.done += 1

    def measured(self) -> dict[str, float]:
        """Seconds per unit of each kind done so far."""
        return {k: self._seconds[k] / u for k, u in self._units.items() if u > 0}

    def seen(self, kind: str) -> bool:
        """Whether ``kind``'s rate is measured: a step of it, or of the kind it is tied to, is done."""
        tie = self.relative.get(kind)
        return bool(self._units.get(kind)) or bool(tie and self._units.get(tie[0]))

    def rate(self, kind: str, override: dict[str, float] | None = None) -> float | None:
        """Seconds per unit of ``kind``: measured (``override`` first: the step under way's), else
        tied to a measured kind, else its prior, else tied to a kind with a prior; None: unknown."""
        override = override or {}

        def seen(k: str) -> float | None:
            if k in override:
                return override[k]
            return self._seconds[k] / self._units[k] if self._units.get(k) else None

        tie = self.relative.get(kind)
        for rate in (seen(kind), tie and seen(tie[0]) is not None and tie[1] * seen(tie[0]),
                     self.priors.get(kind), tie and tie[0] in self.priors and tie[1] * self.priors[tie[0]]):
            if rate:
                return float(rate)
        return None

    def left(self, elapsed: float = 0.0, done_units: float = 0.0) -> float | None:
        """Seconds left: of the current step (``elapsed`` seconds in, ``done_units`` of its work
        done) and of those after it; None while a step's kind has no rate yet."""
        current = self.current
        if current is None:
            return 0.0
        override: dict[str, float] = {}
        total = 0.0
        if current.kind is not None and current.units > 0:
            rate = self.rate(current.kind)
            if done_units > 0:  # its own pace so far
                rate = elapsed / done_units
                override[current.kind] = rate
            elif rate is None:
                return None
            elif elapsed > rate * current.units:  # past its estimate (see the module's docstring)
                rate = (elapsed if self.seen(current.kind) else 2 * elapsed) / current.units
                override[current.kind] = rate
            total = max(0.0, rate * current.units - elapsed)
        for step in self.steps[self.done + 1:]:
            if step.kind is None or step.units <= 0:
                continue
            rate = self.rate(step.kind, override)
            if rate is None:
                return None
            total += rate * step.units
        return total


def duration(seconds: float) -> str:
    """Seconds in the log's words: "42 s", "7 min", "1.5 h"."""
    if seconds < 100:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """The log lines of a job's steps (:class:`Estimate`'s plan): one when a step ends, and
    while one runs (:meth:`step`), what it waits for every little while.

    ``what``: the job in the log's words ("private alignment", "party 2's alignment");
    ``started``: when its first step began (``clock``'s time); ``every``: seconds before a
    running step's first waiting line (default :data:`EVERY`); ``min_gap``: a step that ends within these seconds of
    the last line is not logged, unless it is the first or the last (many short steps)."""

    def __init__(self, what: str, estimate: Estimate, started: float | None = None,
                 clock: Callable[[], float] = time.perf_counter, every: float | None = None, min_gap: float = 0.0) -> None:
        self.what, self.estimate, self.clock, self.min_gap = what, estimate, clock, min_gap
        self.every = EVERY if every is None else every
        self.step_started = clock() if started is None else started
        self._said = float("-inf")  # when the last line was logged
        self.replies = self.expected = 0
        self.units_done = 0.0
        self.found = ""
        self._lock = threading.Lock()

    def left(self) -> float | None:
        """Seconds left now (None: not known yet)."""
        return self.estimate.left(self.clock() - self.step_started, self.units_done)

    def replied(self, *_: object) -> None:
        """One more reply to the step under way came in."""
        self.replies += 1

    def advance(self, units: float) -> None:
        """``units`` more of the step under way's work are done."""
        self.units_done += units

    @contextmanager
    def step(self, expected: int = 0) -> Iterator[Progress]:
        """The current step runs in the body: its waiting lines meanwhile (``expected``: replies
        it waits for), its line once the body is through (not when it raises), with what the body
        set ``found`` to."""
        self.replies, self.expected, self.found = 0, expected, ""
        stop = threading.Event()
        ticker = threading.Thread(target=self._tick, args=(stop,), daemon=True, name="fairvfl-progress")
        ticker.start()
        try:
            yield self
        finally:
            stop.set()
            ticker.join()
        self.finish(self.found)

    def finish(self, found: str = "") -> float:
        """End the current step: log it, with ``found`` (what it found) and the time left; return
        its seconds."""
        now = self.clock()
        took, self.step_started = now - self.step_started, now
        with self._lock:
            step, index = self.estimate.current, self.estimate.done + 1
            self.estimate.finished(took)
            self.units_done = 0.0
        total = len(self.estimate.steps)
        if 1 < index < total and now - self._said < self.min_gap:
            return took
        left = self.estimate.left() if index < total else None
        tail = "" if index >= total else self._left_words(left)
        counts = f" ({step.counts})" if step.counts else ""
        self._log(left, "FairVFL: %s: %s%s%s (%.1f s)%s", self._where(index), step.name, counts,
                  f"; {found}" if found else "", took, tail)
        return took

    def _where(self, index: int) -> str:
        total = len(self.estimate.steps)
        return f"{self.what}, step {index}/{total}" if total > 1 else self.what

    def _tick(self, stop: threading.Event) -> None:
        begun = self.step_started
        while not stop.wait(max(self.every, min(MAX_GAP, (self.clock() - begun) / 4))):
            with self._lock:
                step, index, left = self.estimate.current, self.estimate.done + 1, self.left()
            if step is None:
                return
            said = [(step.doing or step.name) + (f" ({step.counts})" if step.counts else "")]
            if self.expected:
                said.append(f"{self.replies} of {self.expected} replied")
            if self.units_done and step.units:
                said.append(f"{self.units_done:,.0f} of {step.units:,.0f} done")
            self._log(left, "FairVFL: %s: %s: %s so far%s", self._where(index), ", ".join(said),
                      duration(self.clock() - begun), self._left_words(left))

    @staticmethod
    def _left_words(left: float | None) -> str:
        return "; the time left is not known yet" if left is None else f"; about {duration(left)} left"

    def _log(self, left: float | None, message: str, *args: object) -> None:
        self._said = self.clock()
        extra = None if left is None else {RECORD: {"what": self.what, "at": self._said, "left": left}}
        log(INFO, message, *args, extra=extra)
