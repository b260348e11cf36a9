"""The constraint object: everything the rest of the code asks of a fairness constraint.

A constraint kind (``deo``, ``equalized-odds``, ``demographic-parity``; the registry in
``core/constraints/__init__.py``) says only which row subsets it compares the groups on
(:meth:`ConstraintSet.subsets`) and how many of them a label decides. Everything else
is shared and lives here, in the shape of fairlearn's reductions ``Moment``
(``fairlearn/reductions/_moments/utility_parity.py``):

=================================  ===========================================
fairlearn ``Moment``               here
=================================  ===========================================
``load_data(X, y, sensitive)``     :meth:`ConstraintSet.build` (rows, groups, masks)
``gamma(predictor)``               :meth:`ConstraintSet.gaps` (every D_c)
``bound()``                        ε, one run setting for every gap
``project_lambda(λ)``              :meth:`ConstraintSet.project`
``signed_weights(λ)``              :meth:`ConstraintSet.signed_weights` (w_i = 1/n + m_i)
=================================  ===========================================

plus the paper's dual step (:meth:`ConstraintSet.dual_step`), Newton's derivatives
(:meth:`ConstraintSet.gap_directions`, :meth:`ConstraintSet.curvature`,
:meth:`ConstraintSet.smooth_part`, :meth:`ConstraintSet.gap_weights`). What uses these
lives with its feature, as fairlearn keeps its solver apart from its moments: block
Newton's dual step in core/dual_newton.py, the label-DP sensitivity (from a kind's
``label_subsets`` and :meth:`ConstraintSet.gaps_per_row`) in features/labeldp.py.

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

from fairvfl_flwr.core.constraints.measures import Measure, logistic_loss
from fairvfl_flwr.core.errors import ConfigError
from fairvfl_flwr.core.constraints.measures import measure as measure_named

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

    @property
    def size_a(self) -> int | float:
        """Rows on the gap's first side (its mean is compared with side b's); soft: their estimated count."""
        return int(self.in_a.sum()) if self.weight_a is None else float(self.weight_a.sum())

    @property
    def size_b(self) -> int | float:
        """Rows on the gap's second side; soft: their estimated count."""
        return int(self.in_b.sum()) if self.weight_b is None else float(self.weight_b.sum())

    def value(self, q: np.ndarray) -> float:
        """D = mean q over side a − mean q over side b."""
        return _side_mean(q, self.in_a, self.weight_a) - _side_mean(q, self.in_b, self.weight_b)

    def add_to(self, w: np.ndarray, d: float) -> None:
        """w += d ∂D/∂q, in place: d/|A| on side a's rows, −d/|B| on side b's (soft: scaled by each row's weight)."""
        for mask, weight, size, sign in ((self.in_a, self.weight_a, self.size_a, 1.0),
                                         (self.in_b, self.weight_b, self.size_b, -1.0)):
            if weight is None:
                if sign > 0:
                    w[mask] += d / size
                else:
                    w[mask] -= d / size
            else:
                w += (sign * d / size) * weight

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


def _side_mean(q: np.ndarray, mask: np.ndarray, weight: np.ndarray | None) -> float:
    if weight is None:
        return q[mask].mean()
    return float(weight @ q) / float(weight.sum())


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
        keep = [k for k in range(len(self.names)) if k not in small]
        names = (*(self.names[k] for k in keep), " + ".join(self.names[k] for k in small))
        if self.weights is not None:
            merged = np.column_stack([self.weights[:, keep], self.weights[:, small].sum(axis=1)])
            return SensitiveGroups(self.codes, names, merged)
        new = np.empty(len(self.names), dtype=np.int64)
        new[keep] = np.arange(len(keep))
        new[small] = len(keep)
        return SensitiveGroups(new[self.codes], names)


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


@dataclass(frozen=True)
class ConstraintSet:
    """The run's constraint: its gaps, measure and rows. Subclasses are the kinds.

    ``in_a`` / ``in_b`` are the first gap's masks (N^a, N^b of the paper's DEO).
    """

    in_a: np.ndarray
    in_b: np.ndarray
    n: int
    constraints: tuple[Gap, ...] = ()
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
    #: block Newton's dual step: True (with two groups) takes the clipped dual Newton step and,
    #: at the weight bound, the paper's gradient step past it (measured with ``deo`` only);
    #: False takes the constrained search, which returns λ with the step lengths
    #: (core/dual_newton.py)
    newton_past_bound = False

    #: the registered kinds by name (:func:`register`; the package registers the built-in ones)
    kinds: ClassVar[dict[str, type["ConstraintSet"]]] = {}

    def __post_init__(self) -> None:
        if not self.constraints:
            object.__setattr__(self, "constraints", (Gap(self.kind or "deo", self.in_a, self.in_b),))
        object.__setattr__(self, "q", measure_named(self.measure, self.temperature))

    # -- building (fairlearn's load_data) ----------------------------------------------
    @classmethod
    def kind_named(cls, name: str) -> type["ConstraintSet"]:
        """The registered class of the kind ``name`` (run-config ``constraint``)."""
        if name not in cls.kinds:
            raise ValueError(f"unknown constraint {name!r}: choose one of {', '.join(cls.kinds)}")
        return cls.kinds[name]

    @classmethod
    def from_labels(cls, y: np.ndarray, s: np.ndarray, protected_label: int, constraint: str = "deo",
                    measure: str = "loss", **options) -> "ConstraintSet":
        """The constraint of kind ``constraint`` on rows (y, s) (``options``: :meth:`build`'s)."""
        return cls.kind_named(constraint).build(y, s, protected_label, measure, **options)

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
        (:class:`GroupSizeError`), or with ``pool_small_groups`` merged with the other small ones.

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
        pooling = cls.pooled_members(SensitiveGroups.of(table[1], names, weights), cls.subsets(table[0], protected_label),
                                     min_group_size, pool_small_groups, whole is not None)
        if pooling is not None:
            groups = groups.pooled(pooling[0])
        cons = tuple(cls._gaps(groups, subsets, form))
        for c in cons:
            if c.size_a <= 0 or c.size_b <= 0:
                protected = cls.label_subsets and c.name.startswith(subsets[0][0] + ":")
                what = "the protected label" if protected else c.name
                raise ValueError(f"both groups need rows with {what} ({cls.kind}): |A|={c.size_a}, |B|={c.size_b}")
        return cls(in_a=cons[0].in_a, in_b=cons[0].in_b, n=len(y), constraints=cons, measure=measure,
                   groups=groups, form=form, pooling=None if pooling is None else pooling[1])

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

    @classmethod
    def pooled_members(cls, groups: SensitiveGroups, subsets, min_size: int, pool: bool,
                       whole_table: bool = False) -> tuple[list[int], Pooling] | None:
        """The groups to merge into one and why (None: none), decided on the rows of ``groups``
        and ``subsets``; refuses (:class:`GroupSizeError`, naming every small group and its
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
                everyone = np.ones(len(groups.codes), dtype=bool)
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
                f"row set ({cls.kind}): {listed}; such a gap cannot be measured reliably{advice}lower min-group-size")
        if len(groups) < 2:
            raise GroupSizeError(f"the sensitive column has {len(groups)} group(s) ({cls.kind} needs two or more)")
        if not members:
            return None
        # in the groups' order, so that the name follows the members only, not which were small
        members = sorted(members)
        merged = groups.pooled(members)
        name = merged.names[-1]
        return members, Pooling(name, tuple((groups.names[k], smallest(groups, k)) for k in members if k in small),
                                tuple((groups.names[k], smallest(groups, k)) for k in members if k not in small),
                                smallest(merged, len(merged) - 1), min_size, cls.kind, rows)

    def coded(self, s: np.ndarray, names: tuple[str, ...] | None = None) -> np.ndarray:
        """Each row's constrained group (an index into ``groups.names``) from its group ``s`` as
        the labels hold it (bool a/b, or codes into ``names``): the rows of every pooled member
        go to the pooled group, so other rows (the test rows) are measured over the groups this
        constraint holds for."""
        raw = SensitiveGroups.of(s, names)
        if self.pooling is None or self.groups is None:
            return raw.codes
        members = {name for name, _ in (*self.pooling.small, *self.pooling.joined)}
        pooled = len(self.groups.names) - 1
        index = {name: k for k, name in enumerate(self.groups.names)}
        to_constrained = np.array([pooled if name in members else index[name] for name in raw.names],
                                  dtype=np.int64)
        return to_constrained[raw.codes] if len(raw.codes) else raw.codes

    def restrict(self, rows: np.ndarray | None) -> "ConstraintSet":
        """The same constraint on the rows ``rows`` (a batch: sizes and the 1/n weight become the batch's)."""
        if rows is None:
            return self
        cons = tuple(c.restrict(rows) for c in self.constraints)
        groups = None if self.groups is None else self.groups.take(rows)
        return type(self)(in_a=cons[0].in_a, in_b=cons[0].in_b, n=len(rows), constraints=cons,
                          measure=self.measure, groups=groups, form=self.form, pooling=self.pooling,
                          temperature=self.temperature)

    # -- sizes ---------------------------------------------------------------------------
    @property
    def size_a(self) -> int:
        """Rows on side a of the first gap (the paper's group a, for the two-group DEO)."""
        return self.constraints[0].size_a

    @property
    def size_b(self) -> int:
        """Rows on side b of the first gap."""
        return self.constraints[0].size_b

    @property
    def num_multipliers(self) -> int:
        """Two multipliers per gap, one for each sign of the gap's bound |gap| <= ε."""
        return 2 * len(self.constraints)

    def smallest_group(self) -> int:
        """The smallest row set any gap compares."""
        return min(min(c.size_a, c.size_b) for c in self.constraints)

    def gaps_per_row(self) -> int:
        """The most gap sides one row sits on (1 for two groups; G−1 pairwise, G+1 overall)."""
        count = np.zeros(self.n, dtype=np.int64)
        for c in self.constraints:
            count += c.rows_on()
        return int(count.max()) if self.n else 0

    # -- what a history row names ----------------------------------------------------------
    #: the log's name of the largest gap |D_c| (the quantity ε bounds)
    gap_label = "max gap"

    def gaps_by_name(self, gaps) -> dict[str, float]:
        """Every gap D_c by its name ('y=+1: Female vs Male'), in multiplier order."""
        return {c.name: float(g) for c, g in zip(self.constraints, gaps)}

    def own_columns(self, gaps, lam: np.ndarray) -> dict[str, float]:
        """History columns only this kind has (DEO: the paper's D, |D|, λ1 and λ2); none by default."""
        return {}

    # -- gaps (fairlearn's gamma) --------------------------------------------------------
    def values(self, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        """Per-row q_i the gaps compare, in this constraint's measure."""
        return self.q.values(y, z)

    def gaps_of(self, q: np.ndarray) -> np.ndarray:
        """D_c of every gap, in multiplier order, from the per-row values q."""
        return np.array([c.value(q) for c in self.constraints])

    def gaps(self, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        """D_c at scores ``z`` for every gap, in multiplier order."""
        return self.gaps_of(self.values(y, z))

    def hard_gaps(self, y: np.ndarray, z: np.ndarray) -> np.ndarray | None:
        """D_c of every gap with the hard prediction in place of the measure's smooth value: under
        the rate measure, fairlearn's parity differences over the gaps' groups (the largest is
        ``demographic_parity_difference`` or ``equalized_odds_difference`` in the pairwise
        form). None for the loss measure, whose gaps have no hard counterpart."""
        q = self.q.hard_values(y, z)
        return None if q is None else self.gaps_of(q)

    # -- multipliers: dual step and projection ------------------------------------------
    def check_multipliers(self, lam: np.ndarray) -> np.ndarray:
        """``lam`` as float64, refused unless it has two multipliers per gap."""
        lam = np.asarray(lam, dtype=np.float64)
        if lam.shape != (self.num_multipliers,):
            raise ValueError(
                f"{len(self.constraints)} constraint(s) need {self.num_multipliers} multipliers, got {lam.shape}")
        return lam

    def signed_weights(self, lam: np.ndarray) -> np.ndarray:
        """Per-row w_i = 1/n + m_i, m_i = Σ_c (λ_c+ − λ_c−)([i ∈ A_c]/|A_c| − [i ∈ B_c]/|B_c|)."""
        lam = self.check_multipliers(lam)
        w = np.full(self.n, 1.0 / self.n)
        for k, con in enumerate(self.constraints):
            con.add_to(w, float(lam[2 * k] - lam[2 * k + 1]))
        return w

    def masked_weights(self, y: np.ndarray, z: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """ν = ∂f̃/∂z: the only thing a passive party receives."""
        return self.q.nu(y, z, self.signed_weights(lam), self.n)

    @staticmethod
    def dual_step(lam: np.ndarray, gap, epsilon: float, beta: float, c: float) -> np.ndarray:
        """Projected ascent on f̃: ``λ_c± ← max(0, λ_c± + β (-c λ_c± ± D_c - ε))`` for every gap."""
        lam = np.asarray(lam, dtype=np.float64)
        gaps = np.atleast_1d(np.asarray(gap, dtype=np.float64))
        if lam.shape != (2 * len(gaps),):
            raise ValueError(f"{len(gaps)} constraint(s) need {2 * len(gaps)} multipliers, got {lam.shape}")
        grad = np.empty_like(lam)
        grad[0::2] = -c * lam[0::2] + gaps - epsilon
        grad[1::2] = -c * lam[1::2] - gaps - epsilon
        return np.maximum(0.0, lam + beta * grad)

    def weight_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per gap, the interval of d_c = λ_c+ − λ_c− that keeps every row weight w_i >= 0.

        For the loss measure, w_i < 0 makes f̃ concave in those rows' logits and unbounded below
        in θ (up to the tiny μ-term): the primal has no minimiser and a descent method diverges.
        A row on P gap sides gets P terms ±d_c/|side|; keeping each above −1/(nP) keeps
        the sum above −1/n: −|A_c|/(nP) <= d_c <= |B_c|/(nP). With two groups P = 1 and
        these are the exact bounds. Groups from a noisy release give rows coefficients
        ∂w_i/∂d_c of either sign on every gap they enter (:meth:`gap_weights`): then
        −1/(nP max_i col_ic) <= d_c <= 1/(nP max_i(−col_ic)).
        """
        per_row = max(self.gaps_per_row(), 1)
        if self.groups is not None and not self.groups.exact:
            # soft sides: the rows' coefficients ∂w_i/∂d_c are the gap's column, of either sign
            cols = self.gap_weights()
            top = np.maximum(cols.max(axis=0, initial=0.0), 1e-300)
            bottom = np.maximum((-cols).max(axis=0, initial=0.0), 1e-300)
            lo, hi = -1.0 / (self.n * top), 1.0 / (self.n * bottom)
        else:
            lo = np.array([-c.size_a / self.n for c in self.constraints])
            hi = np.array([c.size_b / self.n for c in self.constraints])
        return (lo, hi) if per_row == 1 else (lo / per_row, hi / per_row)

    def project(self, lam: np.ndarray) -> np.ndarray:
        """λ >= 0 with each d_c within :meth:`weight_bounds` where the measure needs
        w >= 0 (λ_c± scaled down together)."""
        lam = np.maximum(np.asarray(lam, dtype=np.float64), 0.0)
        if not self.q.needs_nonnegative_weights:
            return lam
        lo, hi = self.weight_bounds()
        d = lam[0::2] - lam[1::2]
        scale = np.ones(len(d))
        pos, neg = d > hi, d < lo
        scale[pos] = hi[pos] / d[pos]
        scale[neg] = lo[neg] / d[neg]
        return lam * np.repeat(scale, 2)

    def at_weight_bound(self, lam: np.ndarray) -> np.ndarray:
        """Per gap: does d_c sit at (or past) :meth:`weight_bounds`? (None where the measure allows w < 0.)

        From there block Newton's dual step is the paper's projected gradient step with β,
        unclipped: where the constraint needs some rows' weights below 0 (Crime), λ moves past
        the bound by β(|D_c| − ε) per round, and back once the gap is met. Small steps, because
        past the bound f̃ is not convex in those rows' logits and the Newton step's sensitivity
        J, taken at weights >= 0, says nothing about how far the primal then moves.
        """
        if not self.q.needs_nonnegative_weights:
            return np.zeros(len(self.constraints), dtype=bool)
        lo, hi = self.weight_bounds()
        d = np.asarray(lam, dtype=np.float64)[0::2] - np.asarray(lam, dtype=np.float64)[1::2]
        rel = 1e-9  # project puts d on the bound up to rounding
        return (d >= hi * (1 - rel)) | (d <= lo * (1 - rel))

    # -- the row weights' structure (block Newton's dual step) -------------------------
    def gap_weights(self) -> np.ndarray:
        """n × C: column c is ∂w/∂d_c = 1_A/|A| − 1_B/|B| (the row weights are affine in d).
        Built once: the dual step and :meth:`gap_directions` read it every round (read-only)."""
        cols = self.__dict__.get("_gap_weights")
        if cols is None:
            cols = np.zeros((self.n, len(self.constraints)))
            for k, con in enumerate(self.constraints):
                con.add_to(cols[:, k], 1.0)
            cols.setflags(write=False)
            self.__dict__["_gap_weights"] = cols
        return cols

    # -- Newton's derivatives ------------------------------------------------------------
    def smooth_part(self, y: np.ndarray, z: np.ndarray, lam: np.ndarray) -> float:
        """φ(z) = (1/n)Σ l_i + Σ_i m_i q_i: the z-dependent part of f̃ at λ (its gradient in z is ν)."""
        m = self.signed_weights(lam) - 1.0 / self.n
        return float(logistic_loss(y, z).mean() + m @ self.values(y, z))

    def curvature(self, y: np.ndarray, z: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """φ''(z_i) clipped at 0: the PSD per-row curvature of f̃ in z.

        Loss measure: max(w_i, 0) σ'(z_i); rate measure: max(σ'/n + m_i σ'(1 − 2σ), 0).
        Sent to a passive party (``curvature = "exact"``), h_i with ν_i gives w_i = ν_i²/(|ν_i| − h_i)
        on the loss measure: the row's group weight, hence its group among the constrained
        rows once λ ≠ 0, and σ(z_i)(1 − σ(z_i)), hence |z_i|.
        """
        return self.q.curvature(y, z, self.signed_weights(lam), self.n)

    def gap_directions(self, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        """n × C: column c is ∂D_c/∂z = dq/dz ⊙ (1_A/|A| − 1_B/|B|) (also ∂ν/∂(λ_c+ − λ_c−))."""
        return self.q.slope(y, z)[:, None] * self.gap_weights()


def register(*classes: type[ConstraintSet]) -> None:
    """Make constraint kinds available by their ``kind`` name (run-config ``constraint``)."""
    for cls in classes:
        if not cls.kind or cls.kind in ConstraintSet.kinds:
            raise ValueError(f"constraint kind {cls.__name__}: its name {cls.kind!r} is empty or taken")
        ConstraintSet.kinds[cls.kind] = cls

