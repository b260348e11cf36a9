"""The constraint as a server that holds the labels and each group's size, but no row's group, computes it.

Where a registry holds the groups under its own key (jobs/encrypted_groups.py), the server
knows each row's label, hence the kind's row subsets, and from the registry's sums the count
of every group in every subset: not which group a row is in. Every per-row quantity of the
constraint is then a mixture over the groups,

    x_i = Σ_g 1[g_i] x_g(i),

where x_g(i) is row i's value *as if* it were in group g, computed from its label, its
scores and the subsets' sizes alone: a gap's column ∂w_i/∂d_c = [i ∈ A_c]/|A_c| − [i ∈ B_c]/|B_c|,
the signed row weight w_i = 1/n + Σ_c d_c col_ic, ν_i = q.nu(y_i, z_i, w_i). ν's measures are
row-wise in w, so ν itself is such a mixture (the server encrypts it as Σ_g Enc(1[g]) ⊙ ν_g),
and a gap is Σ_i Σ_g 1[g_i] col_g(i, c) q_i, one sum the registry's oracle returns.
:class:`GroupCells` gives these as-if arrays, G × n each, and the gap structure (names,
weight bounds, projection) that core/constraints/base.py derives from the groups; the tests
hold each to the label owner's exact constraint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from fairvfl_flwr.core.constraints.base import FORMS, ConstraintSet, as_multipliers, project_multipliers
from fairvfl_flwr.core.constraints.measures import Measure
from fairvfl_flwr.core.constraints.measures import measure as measure_named
from fairvfl_flwr.core.constraints.pooling import Pooling

#: The oracle of sums over the groups: P (K × G × n, each row's term as if in each group) -> the K
#: sums Σ_i Σ_g 1[g_i] P[k, g, i] (jobs/encrypted_groups.GroupSums.mixed, bound to its split and round).
Sums = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class CellGap:
    """One gap: group ``a`` against group ``b`` (None: every row of the subset, the ``overall``
    form) on subset ``subset``; its sides' sizes."""

    name: str
    subset: int
    a: int
    b: int | None
    size_a: int
    size_b: int


@dataclass(frozen=True)
class GroupCells:
    """A constraint kind's gaps over groups whose sizes per subset are known and whose rows are not."""

    kind: type[ConstraintSet]
    n: int
    subsets: tuple[np.ndarray, ...]  # each subset's rows (bool masks, from the labels)
    names: tuple[str, ...]
    sizes: np.ndarray  # subsets × groups: how many rows of each group each subset holds
    gap_list: tuple[CellGap, ...]
    measure: str = "loss"
    form: str = "pairwise"
    temperature: float = 1.0  # the rate measure's (core/stopping.py sharpens it)
    q: Measure = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "q", measure_named(self.measure, self.temperature))

    @classmethod
    def build(cls, kind: type[ConstraintSet], y: np.ndarray, protected_label: int, names: tuple[str, ...],
              sizes: Callable[[np.ndarray], np.ndarray], measure: str = "loss", *,
              form: str = "pairwise") -> "GroupCells":
        """The kind's gaps on labels ``y`` over the groups ``names``, whose sizes ``sizes(masks)``
        gives (subsets × groups, for the subsets' row masks: the registry's counts). A gap with an
        empty side is refused as ConstraintSet.build refuses it."""
        if form not in FORMS:
            raise ValueError(f"unknown constraint form {form!r}: choose one of {', '.join(FORMS)}")
        labelled = kind.subsets(np.asarray(y), protected_label)
        masks = tuple(np.asarray(rows, dtype=bool) for _, rows in labelled)
        counts = np.asarray(sizes(np.stack(masks)), dtype=np.int64).reshape(len(masks), len(names))
        gaps = []
        for s, (label, rows) in enumerate(labelled):
            whole = int(rows.sum())
            pairs = ([(g, h) for g in range(len(names)) for h in range(g + 1, len(names))] if form == "pairwise"
                     else [(g, None) for g in range(len(names))])
            for g, h in pairs:
                other = f"{names[h]}" if h is not None else "all"
                gap = CellGap(f"{label}: {names[g]} vs {other}", s, g, h, int(counts[s, g]),
                              int(counts[s, h]) if h is not None else whole)
                if gap.size_a <= 0 or gap.size_b <= 0:
                    raise ValueError(f"both groups need rows with {gap.name} ({kind.kind}): |A|={gap.size_a}, "
                                     f"|B|={gap.size_b}")
                gaps.append(gap)
        return cls(kind, len(y), masks, tuple(names), counts, tuple(gaps), measure, form)

    @property
    def num_multipliers(self) -> int:
        """Two multipliers per gap, as ConstraintSet.num_multipliers."""
        return 2 * len(self.gap_list)

    def columns(self) -> np.ndarray:
        """G × n × C: ∂w_i/∂d_c of row i as if it were in group g (ConstraintSet's gap_weights, per group)."""
        G = len(self.names)
        out = np.zeros((G, self.n, len(self.gap_list)))
        for c, gap in enumerate(self.gap_list):
            rows = self.subsets[gap.subset]
            out[gap.a, rows, c] += 1.0 / gap.size_a
            if gap.b is None:
                out[:, rows, c] -= 1.0 / gap.size_b
            else:
                out[gap.b, rows, c] -= 1.0 / gap.size_b
        return out

    def signed_weights(self, lam: np.ndarray) -> np.ndarray:
        """G × n: w_i = 1/n + Σ_c (λ_c+ − λ_c−) col_ic of row i as if in group g."""
        lam = as_multipliers(lam, len(self.gap_list))
        return 1.0 / self.n + self.columns() @ (lam[0::2] - lam[1::2])

    def masked_weights(self, y: np.ndarray, z: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """G × n: ν of row i as if in group g; ν itself is Σ_g 1[g_i] of it (module docstring)."""
        return np.stack([self.q.nu(y, z, w, self.n) for w in self.signed_weights(lam)])

    def gap_terms(self, q: np.ndarray) -> np.ndarray:
        """C × G × n: each gap's term of row i as if in group g, col_g(i, c) q_i: what the oracle sums."""
        return np.moveaxis(self.columns(), 2, 0) * np.asarray(q)[None, None, :]

    def gaps(self, y: np.ndarray, z: np.ndarray, sums: Sums, *, hard: bool = False) -> np.ndarray | None:
        """Every D_c at scores ``z`` through the oracle ``sums`` (``hard``: the measure's hard values,
        None where it has none), in multiplier order."""
        q = self.q.hard_values(y, z) if hard else self.q.values(y, z)
        return None if q is None else np.asarray(sums(self.gap_terms(q)), dtype=np.float64)

    def rows_on(self) -> int:
        """The most gap sides a row sits on, over the groups a row of its subsets can be in
        (ConstraintSet's gaps_per_row)."""
        G = len(self.names)
        count = np.zeros((G, self.n), dtype=np.int64)
        possible = np.ones((G, self.n), dtype=bool)
        for s, rows in enumerate(self.subsets):
            possible[:, rows] &= (self.sizes[s] > 0)[:, None]
        for gap in self.gap_list:
            rows = self.subsets[gap.subset]
            count[gap.a, rows] += 1
            if gap.b is None:
                count[:, rows] += 1
            else:
                count[gap.b, rows] += 1
        return int(count[possible].max()) if possible.any() else 0

    def weight_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """ConstraintSet.weight_bounds from the sizes: −|A_c|/(nP) <= d_c <= |B_c|/(nP)."""
        per_row = max(self.rows_on(), 1)
        lo = np.array([-g.size_a / self.n for g in self.gap_list])
        hi = np.array([g.size_b / self.n for g in self.gap_list])
        return (lo, hi) if per_row == 1 else (lo / per_row, hi / per_row)

    def project(self, lam: np.ndarray) -> np.ndarray:
        """λ >= 0 with each d_c within :meth:`weight_bounds` where the measure needs w >= 0."""
        return project_multipliers(lam, self.weight_bounds, self.q.needs_nonnegative_weights)


@dataclass(frozen=True)
class GapModel:
    """Every gap's Taylor model in the step lengths α of a search over J directions, at α = 0:
    D_c(α) ≈ D[c] + V[:, c]·α + αᵀ W[c] α / 2 (``W`` None: the linear model), from ``sums`` sums."""

    D: np.ndarray  # C
    V: np.ndarray  # J × C
    W: np.ndarray | None  # C × J × J
    sums: int


def model_sums(gaps: int, directions: int, hessian: bool) -> int:
    """The sums a :class:`GapModel` of ``gaps`` gaps over ``directions`` directions takes: per gap
    its value and J slopes, and with the Hessian its J(J + 1)/2 entries."""
    per_gap = 1 + directions + (directions * (directions + 1) // 2 if hessian else 0)
    return gaps * per_gap


#: The most values one request of a Taylor model carries (each a G × n plaintext on the server).
MODEL_BATCH = 64


@dataclass(frozen=True)
class EncryptedConstraint:
    """The run's constraint on a server that reaches the groups only through sums (a registry's
    encrypted groups): :class:`GroupCells`' as-if arrays, and the gaps and the constraint's part
    of f̃ through the oracle ``sums`` (the training rows'). Its ν (:meth:`masked_weights`) is the
    G × n mixture, which only a ν channel that encrypts it can send (jobs/encrypted_groups.py)."""

    cells: GroupCells
    sums: Sums
    temperature: float = 1.0
    #: the small groups the server pooled, from their sizes, by summing their encrypted indicators
    pooling: Pooling | None = None
    #: how many more sums the oracle may ask this round (None: no limit): what sizes a Taylor model
    room: Callable[[], int | None] | None = field(default=None, compare=False)
    #: told of every Taylor model asked for (its size and whether it has the Hessian), to log it
    told: Callable[[GapModel, int], None] | None = field(default=None, compare=False)
    #: the last constraint term asked for (:meth:`constraint_term`)
    _last: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    #: groups known by their sizes only: no row's group to count or report per row
    groups = None
    #: block Newton takes the constrained search here whatever the kind wrapped declares
    #: (core/newton.rule_for): the parties' gradients come through the registry's noisy sums, so
    #: their directions carry noise that a search at fixed multipliers follows wherever it costs F
    #: little, however far it moves the gaps, and the dual step then chases the gaps round after
    #: round; the constrained search holds the gaps within ε at every step, checked against the
    #: true gaps, so the noise costs only loss (docs/newton.md, "On a registry's encrypted groups")
    newton_past_bound = False
    #: every gap is linear in q (ConstraintSet.linear): nothing to take again at each round's scores
    linear = True

    def __post_init__(self) -> None:
        if self.cells.temperature != self.temperature:  # the stop rule sharpened the rates
            object.__setattr__(self, "cells", replace(self.cells, temperature=self.temperature))

    @property
    def n(self) -> int:
        """The training rows."""
        return self.cells.n

    @property
    def gap_list(self) -> tuple[CellGap, ...]:
        """The gaps, in multiplier order (named as ConstraintSet names them)."""
        return self.cells.gap_list

    @property
    def q(self) -> Measure:
        """The gaps' measure."""
        return self.cells.q

    @property
    def measure(self) -> str:
        """The measure's name."""
        return self.cells.measure

    @property
    def form(self) -> str:
        """``pairwise`` or ``overall``."""
        return self.cells.form

    @property
    def history(self):
        """What the kind calls its gaps in the history (core/constraints/history.py)."""
        return self.cells.kind.history

    @property
    def num_multipliers(self) -> int:
        """Two multipliers per gap."""
        return self.cells.num_multipliers

    def __getattr__(self, name: str):
        # the kind's declarations (kind, label_subsets, default_measure, ...)
        if name.startswith("_") or name in ("cells", "sums", "room", "told"):
            raise AttributeError(name)
        return getattr(self.cells.kind, name)

    def restrict(self, rows: np.ndarray | None) -> "EncryptedConstraint":
        """Full batch only: the registry's sums are over every training row."""
        if rows is not None:
            raise ValueError("encrypted groups' sums are over every training row: full-batch rounds only")
        return self

    def gaps(self, y: np.ndarray, z: np.ndarray, *, hard: bool = False,
             losses: np.ndarray | None = None) -> np.ndarray | None:
        """Every D_c through the oracle (ConstraintSet.gaps)."""
        q = self.q.hard_values(y, z) if hard else self.q.values(y, z, losses)
        return None if q is None else np.asarray(self.sums(self.cells.gap_terms(q)), dtype=np.float64)

    def taylor(self, y: np.ndarray, z: np.ndarray, du: np.ndarray, hessian: bool | None = None, *,
               reserve: int = 0, say: bool = True) -> GapModel:
        """Every gap's Taylor model in α on the span of ``du`` (n × J) at z, from one request of the
        oracle: D_c = Σ col q, V_cj = Σ col q' Δu_j and, where :attr:`room` holds them too,
        W_cjk = Σ col q'' Δu_j Δu_k (:func:`model_sums`), with ``reserve`` sums left for what the
        round asks after it. The linear model where it does not (or ``hessian`` is False); a room
        too small for even that is refused, naming the registry's budget. ``say``: tell
        :attr:`told` (the round's model, not a later one at its step)."""
        du = np.asarray(du, dtype=np.float64).reshape(len(z), -1)
        C, J = len(self.gap_list), du.shape[1]
        room = None if self.room is None else self.room()
        linear = model_sums(C, J, False)
        if room is not None and room < linear:
            raise ValueError(f"a Taylor model of {C} gap(s) over {J} directions takes {linear} sums, but the "
                             f"registry's budget leaves {room} this round: raise its node config sums-per-round")
        if hessian is None:
            hessian = room is None or model_sums(C, J, True) + reserve <= room
        q, slope = self.q.values(y, z), self.q.slope(y, z)
        values = [q] + [slope * du[:, j] for j in range(J)]
        pairs = [(j, k) for j in range(J) for k in range(j, J)] if hessian else []
        if pairs:
            bend = self.q.bend(y, z)
            values += [bend * du[:, j] * du[:, k] for j, k in pairs]
        step = max(MODEL_BATCH // C, 1)
        got = np.concatenate([self.sums(np.concatenate([self.cells.gap_terms(v) for v in values[i:i + step]]))
                              for i in range(0, len(values), step)]).reshape(len(values), C)
        W = None
        if pairs:
            W = np.zeros((C, J, J))
            for (j, k), row in zip(pairs, got[1 + J:]):
                W[:, j, k] = W[:, k, j] = row
        model = GapModel(got[0], got[1:1 + J], W, C * len(values))
        if say and self.told is not None:
            self.told(model, J)
        return model

    def gaps_per_row(self) -> int:
        """The most gap sides a row sits on (core/constraints/base.gaps_per_row), from the sizes."""
        return self.cells.rows_on()

    def signed_weights(self, lam: np.ndarray) -> np.ndarray:
        """G × n: each row's weight as if in each group."""
        return self.cells.signed_weights(lam)

    def masked_weights(self, y: np.ndarray, z: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """G × n: ν as if each row were in each group."""
        return self.cells.masked_weights(y, z, lam)

    def constraint_term(self, lam: np.ndarray, q: np.ndarray) -> float:
        """Σ_i m_i q_i through the oracle: one sum; at the λ of the last one asked, that value plus
        the sum of m_i times the change of q_i since, so that the difference of two values at one λ
        (the stop rule's decrease of F within a round) carries the noise of one sum of the
        change, which shrinks as the run settles, not that of two sums of the whole."""
        lam, q = np.asarray(lam, dtype=np.float64), np.asarray(q, dtype=np.float64)
        m = self.cells.signed_weights(lam) - 1.0 / self.n
        last = self._last.get("term")
        if last is not None and np.array_equal(last[0], lam) and last[1].shape == q.shape:
            value = last[2] + float(self.sums((m * (q - last[1])[None, :])[None])[0])
        else:
            value = float(self.sums((m * q[None, :])[None])[0])
        self._last["term"] = (lam.copy(), q.copy(), value)
        return value

    def weight_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """From the sizes (GroupCells.weight_bounds)."""
        return self.cells.weight_bounds()

    def project(self, lam: np.ndarray) -> np.ndarray:
        """From the sizes (GroupCells.project)."""
        return self.cells.project(lam)
