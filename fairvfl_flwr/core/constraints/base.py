"""The constraint object, in the shape of fairlearn's reductions ``Moment``.

A constraint kind (``deo``, ``equalized-odds``, ``demographic-parity``; registered in
core/constraints/registry.py) says only which row subsets it compares the groups on
(:meth:`ConstraintSet.subsets`) and how many of them a label decides. Everything else is
shared and lives here, as fairlearn's ``utility_parity.py`` holds it:

=================================  ===========================================
fairlearn ``Moment``               here
=================================  ===========================================
``load_data(X, y, sensitive)``     :meth:`ConstraintSet.build` (rows, groups, gaps)
``gamma(predictor)``               :meth:`ConstraintSet.gaps` (every D_c)
``bound()``                        ε, one run setting for every gap
``project_lambda(λ)``              :meth:`ConstraintSet.project`
``signed_weights(λ)``              :meth:`ConstraintSet.signed_weights` (w_i = 1/n + m_i)
=================================  ===========================================

plus ν (:meth:`ConstraintSet.masked_weights`, what a passive party receives) and the
weights' bounds the projection keeps. What uses these lives with its user, as fairlearn
keeps its solver apart from its moments: the paper's dual step in core/step.py, block
Newton's derivatives and dual step in core/newton.py, small
groups pooled in core/constraints/pooling.py, the history's names in
core/constraints/history.py, the label-DP sensitivity in features/labeldp.py.

Each gap c compares two row sets, ``D_c = mean q over A_c − mean q over B_c``, held
within ``|D_c| <= ε`` by two multipliers ``(λ_c+, λ_c−)``; the multiplier vector is
``[λ_1+, λ_1−, λ_2+, λ_2−, ...]``. With G groups on a subset S (``constraint-form``):

* ``pairwise``: every pair of groups g < h, A = S ∩ g, B = S ∩ h: G(G−1)/2 gaps per
  subset. With two groups this is the paper's DEO (one gap, group a against group b).
* ``overall``: each group against all rows of S, A = S ∩ g, B = S (fairlearn's
  ``difference_bound``): G gaps per subset. With two groups, group a's gap is the
  pairwise gap times |S ∩ b|/|S|, so it is a looser constraint than DEO at the same ε.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fairvfl_flwr.core.constraints.groups import SensitiveGroups
from fairvfl_flwr.core.constraints.history import HistoryNames
from fairvfl_flwr.core.constraints.measures import Measure
from fairvfl_flwr.core.constraints.measures import measure as measure_named
from fairvfl_flwr.core.constraints.pooling import Pooling, pooled_members

FORMS = ("pairwise", "overall")


@dataclass(frozen=True)
class Gap:
    """One gap: rows of ``in_a`` against rows of ``in_b`` (the masks may overlap).

    Groups known only through a noisy release (:class:`SensitiveGroups` with ``weights``) give
    each side a soft membership: ``weight_a[i]`` is row i's weight in side a (it may be
    negative), and a side's mean is the weighted mean ``Σ w_i q_i / Σ w_i``; the masks then
    hold every row whose weight is not 0. None: the exact case, weight 1 on the mask.
    """

    name: str
    in_a: np.ndarray
    in_b: np.ndarray
    weight_a: np.ndarray | None = None
    weight_b: np.ndarray | None = None
    #: D is linear in q: its slope (:meth:`add_to`) is the same wherever it is taken
    linear: ClassVar[bool] = True

    @property
    def size_a(self) -> int | float:
        """Rows on the gap's first side (its mean is compared with side b's); soft: their estimated count."""
        return len(self.rows_of("a")) if self.weight_a is None else float(self.weight_a.sum())

    @property
    def size_b(self) -> int | float:
        """Rows on the gap's second side; soft: their estimated count."""
        return len(self.rows_of("b")) if self.weight_b is None else float(self.weight_b.sum())

    def rows_of(self, side: str) -> np.ndarray:
        """Side ``"a"``'s or ``"b"``'s rows as indices, found once per gap: the weights and the gaps are
        computed hundreds of times a run, and with many groups a boolean mask scans every row for
        every gap while the sides together hold each row only a few times (the same values, in the
        same order, as the mask selects)."""
        key = "_rows_" + side
        rows = self.__dict__.get(key)
        if rows is None:
            rows = np.flatnonzero(self.in_a if side == "a" else self.in_b)
            self.__dict__[key] = rows  # a frozen dataclass still has its __dict__; fields stay unchanged
        return rows

    def value(self, q: np.ndarray) -> float:
        """D = mean q over side a − mean q over side b."""
        return (_side_mean(q, self.rows_of("a"), self.weight_a)
                - _side_mean(q, self.rows_of("b"), self.weight_b))

    def add_to(self, w: np.ndarray, d: float) -> None:
        """w += d ∂D/∂q, in place: d/|A| on side a's rows, −d/|B| on side b's (soft: scaled by each row's weight)."""
        for side, weight, size, sign in (("a", self.weight_a, self.size_a, 1.0),
                                         ("b", self.weight_b, self.size_b, -1.0)):
            if weight is None:
                if sign > 0:
                    w[self.rows_of(side)] += d / size
                else:
                    w[self.rows_of(side)] -= d / size
            else:
                w += (sign * d / size) * weight

    def at(self, q: np.ndarray) -> "Gap":
        """The gap with its slope taken at the rows' values ``q``: itself (it is linear in q)."""
        return self

    def rows_on(self) -> np.ndarray:
        """Per row, how many of this gap's terms it enters (exact: its sides; soft: 1 where it enters the gap)."""
        if self.weight_a is None and self.weight_b is None:
            return self.in_a.astype(np.int64) + self.in_b
        return (self.in_a | self.in_b).astype(np.int64)

    def restrict(self, rows: np.ndarray) -> "Gap":
        """The same gap on the rows ``rows``."""
        return Gap(self.name, self.in_a[rows], self.in_b[rows],
                   None if self.weight_a is None else self.weight_a[rows],
                   None if self.weight_b is None else self.weight_b[rows])


def _side_mean(q: np.ndarray, rows: np.ndarray, weight: np.ndarray | None) -> float:
    if weight is None:
        return q[rows].mean()
    return float(weight @ q) / float(weight.sum())


@dataclass(frozen=True)
class ConstraintSet:
    """The run's constraint: its gaps, measure and rows. Subclasses are the kinds."""

    n: int
    gap_list: tuple[Gap, ...]
    measure: str = "loss"
    groups: SensitiveGroups | None = None
    form: str = "pairwise"
    #: the groups pooled into one (pool-small-groups), and why; None: none were
    pooling: Pooling | None = field(default=None, compare=False)
    #: the rate measure's temperature (core/stopping.py sharpens it; the loss measure has none)
    temperature: float = 1.0
    q: Measure = field(init=False, repr=False, compare=False)

    #: registry name (run-config ``constraint``)
    kind = ""
    #: how many of :meth:`subsets` a row's label decides (a label flip moves the row
    #: between them, or into or out of one): label DP's count of changed subsets
    #: (features/labeldp.label_sensitivity)
    label_subsets = 0
    #: what its gaps compare under ``constraint-measure = "auto"``: fairlearn's parity
    #: constraints compare rates; the paper's DEO compares losses
    default_measure = "loss"
    #: does ``optimizer = "auto"`` pick AdaGrad for its MLP runs? (measured with ``deo`` only:
    #: docs/adagrad.md; block Newton, for linear runs, is picked for every kind)
    adagrad_by_default = False
    #: block Newton's dual step: False (every built-in kind) takes the constrained search, which
    #: returns λ with the step lengths and holds the gaps within ε from round 1; True (with two
    #: groups) takes the clipped dual Newton step and, at the weight bound, the paper's gradient
    #: step past it, which creeps where the target needs weights below 0 (docs/newton.md, "The
    #: dual rule of two-group deo")
    newton_past_bound = False

    #: what the history, the log and a run's summary call its gaps (core/constraints/history.py)
    history: ClassVar[HistoryNames] = HistoryNames()

    def __post_init__(self) -> None:
        object.__setattr__(self, "q", measure_named(self.measure, self.temperature))

    # -- building (fairlearn's load_data) ----------------------------------------------
    @classmethod
    def subsets(cls, y: np.ndarray, protected_label: int) -> list[tuple[str, np.ndarray]]:
        """The named row subsets the groups are compared on (a kind's one decision)."""
        raise NotImplementedError

    @classmethod
    def build(cls, y: np.ndarray, s: np.ndarray, protected_label: int, measure: str = "loss", *,
              form: str = "pairwise", names: tuple[str, ...] | None = None, min_group_size: int = 1,
              pool_small_groups: bool = False, whole: tuple[np.ndarray, np.ndarray] | None = None,
              weights: np.ndarray | None = None) -> "ConstraintSet":
        """The constraint on rows with labels ``y`` and groups ``s`` (bool: a/b, or int codes
        into ``names``). A group with fewer than ``min_group_size`` rows in a subset is refused
        (a ``GroupSizeError``), or with ``pool_small_groups`` merged with the other small ones
        (core/constraints/pooling.py).

        ``whole``: (labels, groups) of every row of the table (training and test), coded as
        ``s``. Which groups are small, and which are pooled, is decided on those counts, so a
        run's groups do not depend on the seed's split; default: the rows given.

        ``weights``: ``s`` (and ``whole``'s groups) are a noisy release of the groups, with these
        membership weights (:class:`SensitiveGroups`): every gap compares the weighted means,
        which estimate the true groups' means.
        """
        y = np.asarray(y)
        groups = SensitiveGroups.of(s, names, weights)
        if form not in FORMS:
            raise ValueError(f"unknown constraint form {form!r}: choose one of {', '.join(FORMS)}")
        measure_named(measure)  # refuse an unknown measure before any gap is built
        subsets = cls.subsets(y, protected_label)
        if weights is not None:  # from a release: small groups are decided where the gaps divide by their estimates
            whole = None
        table = (y, s) if whole is None else (np.asarray(whole[0]), np.asarray(whole[1]))
        pooling = pooled_members(SensitiveGroups.of(table[1], names, weights), cls.subsets(table[0], protected_label),
                                 min_group_size, pool_small_groups, cls.kind, whole is not None)
        if pooling is not None:
            groups = groups.pooled(pooling[0])
        cons = tuple(cls._gaps(groups, subsets, form))
        for c in cons:
            if c.size_a <= 0 or c.size_b <= 0:
                protected = cls.label_subsets and c.name.startswith(subsets[0][0] + ":")
                what = "the protected label" if protected else c.name
                raise ValueError(f"both groups need rows with {what} ({cls.kind}): |A|={c.size_a}, |B|={c.size_b}")
        return cls(n=len(y), gap_list=cons, measure=measure, groups=groups, form=form,
                   pooling=None if pooling is None else pooling[1])

    @staticmethod
    def _gaps(groups: SensitiveGroups, subsets, form: str):
        G = len(groups)

        def side(rows: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray | None]:
            if groups.exact:
                return rows & groups.mask(g), None
            return rows & groups.mask(g), np.where(rows, groups.weight(g), 0.0)

        for label, rows in subsets:
            if form == "pairwise":
                for g in range(G):
                    for h in range(g + 1, G):
                        (in_a, w_a), (in_b, w_b) = side(rows, g), side(rows, h)
                        yield Gap(f"{label}: {groups.names[g]} vs {groups.names[h]}", in_a, in_b, w_a, w_b)
            else:
                for g in range(G):
                    in_a, w_a = side(rows, g)
                    yield Gap(f"{label}: {groups.names[g]} vs all", in_a, rows.copy(), w_a)

    def restrict(self, rows: np.ndarray | None) -> "ConstraintSet":
        """The same constraint on the rows ``rows`` (a batch: sizes and the 1/n weight become the batch's)."""
        if rows is None:
            return self
        cons = tuple(c.restrict(rows) for c in self.gap_list)
        groups = None if self.groups is None else self.groups.take(rows)
        return type(self)(n=len(rows), gap_list=cons, measure=self.measure, groups=groups, form=self.form,
                          pooling=self.pooling, temperature=self.temperature)

    @property
    def num_multipliers(self) -> int:
        """Two multipliers per gap, one for each sign of the gap's bound |gap| <= ε."""
        return 2 * len(self.gap_list)

    @property
    def linear(self) -> bool:
        """Whether every gap is linear in the rows' values q (not so a release's spread:
        core/constraints/release.SpreadGap), so that the rows' weights ∂D/∂q are the same at every
        model and :meth:`linearised` is the constraint itself."""
        return all(gap.linear for gap in self.gap_list)

    def linearised(self, y: np.ndarray, z: np.ndarray) -> "ConstraintSet":
        """The constraint whose gaps take their slopes at scores ``z``: a gap that is not linear in q
        enters the rows' weights (ν, the multipliers' steps, a label owner's weights) by its slope,
        which follows the model only where the server takes it again at the model's scores."""
        if self.linear:
            return self
        q = self.q.values(y, z)
        return dataclasses.replace(self, gap_list=tuple(gap.at(q) for gap in self.gap_list))

    # -- gaps (fairlearn's gamma) --------------------------------------------------------
    def gaps(self, y: np.ndarray, z: np.ndarray, *, hard: bool = False,
             losses: np.ndarray | None = None) -> np.ndarray | None:
        """D_c at scores ``z`` for every gap, in multiplier order, in this constraint's measure
        (``losses``: the rows' logistic losses, where the caller has them).

        ``hard``: with the hard prediction in place of the measure's smooth value: under the
        rate measure, fairlearn's parity differences over the gaps' groups (the largest is
        ``demographic_parity_difference`` or ``equalized_odds_difference`` in the pairwise
        form); None for the loss measure, whose gaps have no hard counterpart. A gap that is not
        linear in q (a release margin's spread) has no hard counterpart either: it reads 0 there."""
        q = self.q.hard_values(y, z) if hard else self.q.values(y, z, losses)
        if q is None:
            return None
        return np.array([c.value(q) if c.linear or not hard else 0.0 for c in self.gap_list])

    # -- multipliers: signed weights and projection ------------------------------------------
    def signed_weights(self, lam: np.ndarray) -> np.ndarray:
        """Per-row w_i = 1/n + m_i, m_i = Σ_c (λ_c+ − λ_c−)([i ∈ A_c]/|A_c| − [i ∈ B_c]/|B_c|)."""
        lam = as_multipliers(lam, len(self.gap_list))
        w = np.full(self.n, 1.0 / self.n)
        for k, con in enumerate(self.gap_list):
            con.add_to(w, float(lam[2 * k] - lam[2 * k + 1]))
        return w

    def masked_weights(self, y: np.ndarray, z: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """ν = ∂f̃/∂z: the only thing a passive party receives."""
        return self.q.nu(y, z, self.signed_weights(lam), self.n)

    def constraint_term(self, lam: np.ndarray, q: np.ndarray) -> float:
        """Σ_i m_i q_i, m = w − 1/n: the constraint's part of f̃ at λ for the per-row values ``q``."""
        return float((self.signed_weights(lam) - 1.0 / self.n) @ q)

    def weight_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per gap, the interval of d_c = λ_c+ − λ_c− that keeps every row weight w_i >= 0.

        For the loss measure, w_i < 0 makes f̃ concave in those rows' logits and unbounded below
        in θ (up to the tiny μ-term): the primal has no minimiser and a descent method diverges.
        A row on P gap sides gets P terms ±d_c/|side|; keeping each above −1/(nP) keeps
        the sum above −1/n: −|A_c|/(nP) <= d_c <= |B_c|/(nP). With two groups P = 1 and
        these are the exact bounds. Groups from a noisy release give rows coefficients
        ∂w_i/∂d_c of either sign on every gap they enter (:func:`gap_weights`): then
        −1/(nP max_i col_ic) <= d_c <= 1/(nP max_i(−col_ic)).
        """
        per_row = max(gaps_per_row(self), 1)
        if self.groups is not None and not self.groups.exact:
            # soft sides: the rows' coefficients ∂w_i/∂d_c are the gap's column, of either sign
            cols = gap_weights(self)
            top = np.maximum(cols.max(axis=0, initial=0.0), 1e-300)
            bottom = np.maximum((-cols).max(axis=0, initial=0.0), 1e-300)
            lo, hi = -1.0 / (self.n * top), 1.0 / (self.n * bottom)
        else:
            lo = np.array([-c.size_a / self.n for c in self.gap_list])
            hi = np.array([c.size_b / self.n for c in self.gap_list])
        return (lo, hi) if per_row == 1 else (lo / per_row, hi / per_row)

    def project(self, lam: np.ndarray) -> np.ndarray:
        """λ >= 0 with each d_c within :meth:`weight_bounds` where the measure needs
        w >= 0 (λ_c± scaled down together)."""
        return project_multipliers(lam, self.weight_bounds, self.q.needs_nonnegative_weights)


def project_multipliers(lam: np.ndarray, bounds, needs_nonnegative: bool) -> np.ndarray:
    """λ >= 0 and, where ``needs_nonnegative``, each d_c = λ_c+ − λ_c− within ``bounds()`` = (lo, hi),
    λ_c± scaled down together (ConstraintSet.project, and the same for groups known by size only)."""
    lam = np.maximum(np.asarray(lam, dtype=np.float64), 0.0)
    if not needs_nonnegative:
        return lam
    lo, hi = bounds()
    d = lam[0::2] - lam[1::2]
    scale = np.ones(len(d))
    pos, neg = d > hi, d < lo
    scale[pos] = hi[pos] / d[pos]
    scale[neg] = lo[neg] / d[neg]
    return lam * np.repeat(scale, 2)


def as_multipliers(lam: np.ndarray, gaps: int) -> np.ndarray:
    """``lam`` as float64, refused unless it has two multipliers for each of ``gaps`` gaps."""
    lam = np.asarray(lam, dtype=np.float64)
    if lam.shape != (2 * gaps,):
        raise ValueError(f"{gaps} constraint(s) need {2 * gaps} multipliers, got {lam.shape}")
    return lam


def gaps_per_row(constraint: ConstraintSet) -> int:
    """The most gap sides one row sits on (1 for two groups; G−1 pairwise, G+1 overall)."""
    own = getattr(constraint, "gaps_per_row", None)  # a constraint over groups known by their sizes
    if own is not None:
        return own()
    count = np.zeros(constraint.n, dtype=np.int64)
    for c in constraint.gap_list:
        count += c.rows_on()
    return int(count.max()) if constraint.n else 0


def gap_weights(constraint: ConstraintSet) -> np.ndarray:
    """n × C: column c is ∂w/∂d_c = 1_A/|A| − 1_B/|B| (the row weights are affine in d).
    Built once per constraint: the weight bounds and block Newton read it every round (read-only)."""
    cols = constraint.__dict__.get("_gap_weights")
    if cols is None:
        cols = np.zeros((constraint.n, len(constraint.gap_list)))
        for k, con in enumerate(constraint.gap_list):
            con.add_to(cols[:, k], 1.0)
        cols.setflags(write=False)
        constraint.__dict__["_gap_weights"] = cols
    return cols
