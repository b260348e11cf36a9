"""The stop rule every optimizer shares: when a run's training has converged.

A round is *quiet* when its step barely moved the objective F at the round's λ
(relative decrease ``(F_before − F_after) / (1 + |F_after|)`` at most ``tolerance``) and,
with the fairness term on, λ sits where the dual step would keep it: every gap within
ε (+ :data:`GAP_SLACK`), and a multiplier pair in use only where its gap is at ε
(− :data:`GAP_SLACK`). Training ends after ``window`` quiet rounds in a row. Without the
fairness term λ stays 0 and the gaps are not the run's business, so only F counts.

The rule sees numbers only (F before and after, the gaps, λ): each algorithm measures
them its own way, and the rule's state round-trips through a checkpoint.

A rate constraint's gaps compare smooth rates (mean σ(z)), which is what the optimizer can
differentiate, while ε is read as fairlearn's difference of the hard predictions sign(z).
The two differ both ways (COMPAS, demographic parity at ε = 0.02: smooth gap 0.020, hard
0.109; Adult: smooth 0.020, hard 0.001), so with a ``target`` the rule holds the smooth gaps
within a working bound (:attr:`StopRule.epsilon`) and calibrates that bound until the hard gap
meets the target without giving away accuracy. Each time the run converges with the largest
hard gap above the target the bound is tightened, unless that gap leans the other way than its
smooth gap (the bound over-corrects it: then the bound is raised); with it well below the target
while a multiplier is in use (the bound, not the loss, holds the model back) the bound is loosened.
Either move keeps going from where the run is (θ and λ stay). When the bound would fall below
:data:`MIN_BOUND_SHARE` of the target, the smooth rates at their temperature cannot carry the
hard gap down: a rule that may ``sharpen`` halves the rates' temperature τ (σ(z/τ) is closer
to the step 1[z ≥ 0]), sets the bound back to the target and keeps going; at
:data:`MIN_TEMPERATURE`, or where it may not, the rule stops and says so
(docs/fairness-constraints.md, "What ε bounds").
"""

from __future__ import annotations

import numpy as np

#: How far a gap may sit above ε in a converged run: the reproduction target
#: (bench/rounds.py) allows ε + 0.005 and the final-quality bar ε + 0.002.
GAP_SLACK = 1e-3
#: The smallest working bound, as a share of the target, that tightening may reach: below it the
#: smooth gaps are all but zero, and a hard gap still above the target is one the smooth rates
#: do not control (a constant classifier would meet it, at the cost of every prediction).
MIN_BOUND_SHARE = 0.05
#: The sharpest temperature of the smooth rates: COMPAS's logits sit within about ±1, so a rate that
#: follows the hard one row by row there needs τ near 1/32 (COMPAS race, equalized odds over 4 groups:
#: hard gap 0.04–0.06 at τ = 1/8, 0.019–0.021 at 1/32, seeds 0–2).
MIN_TEMPERATURE = 1 / 32
#: A calibration move (tighten, loosen, sharpen) waits for F's relative decrease to settle below this
#: multiple of the stop tolerance, with the gaps at rest, for stop-window rounds: the hard gap at a bound
#: is known by then, and F's slow tail (Crime: 18 rounds from 1e-4 to the tolerance) would only delay it.
SETTLE = 20.0
#: Under ``stop-plateau`` the same wait, as a multiple of the plateau share.
SETTLE_PLATEAU = 2.0
#: A converged hard gap above this multiple of the target, on a bound not yet calibrated, sharpens the rates
#: before it tightens the bound: the smooth rates are then too flat at the threshold to follow the hard
#: ones (COMPAS: hard 5x the smooth gap at τ = 1), and a bound tightened by that much costs accuracy.
SHARPEN_ABOVE = 3.0
#: A hard gap above this multiple of the target when the rates sharpen divides τ by 4, not 2.
SHARPEN_FAR = 1.5
#: A tightening's secant reaches at most this many times the last move of the bound past the bound: the hard
#: gap wobbles between converged rounds by a few rows of the smallest group, so two converged points whose hard
#: gaps differ by less than that give a slope of noise, and the step it asks for can be any length (COMPAS race,
#: equalized odds at ε = 0.1, seed 0: hard 0.1070 at a bound 0.1 and 0.1065 at 0.0934 asked for 0.008, held at a
#: quarter, 0.023, which ended the run at a hard gap of 0.038 and 5 points below the accuracy at 0.1).
SECANT_REACH = 2.0
#: A converged hard gap below this share of the target, with a multiplier in use, loosens the bound:
#: the run gives up accuracy for fairness it was not asked for.
LOOSEN_BELOW = 0.6
#: At most this many loosenings per run, each by at most :data:`MAX_LOOSEN` times: every one costs
#: a few rounds, and the hard gap of a looser bound is known only once the run converges again.
MAX_LOOSENINGS = 2
MAX_LOOSEN = 4.0
#: A loosening starts only within this many rounds: it buys accuracy, and a run that has spent its
#: rounds meeting ε (tightening, sharpening) should end rather than search again.
LOOSEN_WITHIN = 20


class StopRule:
    """``window`` quiet rounds in a row end training; ``tolerance`` 0 never stops."""

    def __init__(self, tolerance: float, window: int, epsilon: float, fairness: bool,
                 target: float | None = None, plateau: float = 0.0, sharpen: bool = False) -> None:
        self.tolerance = tolerance
        # > 0: F's decrease counts as quiet below this share of its decrease since the first round
        # fed, not below ``tolerance`` (a network's F keeps falling as it fits the training rows)
        self.plateau = plateau
        self.start: float | None = None  # F before the first round fed
        self.window = window
        self.epsilon = epsilon  # the bound the smooth gaps are held within (the working bound)
        self.fairness = fairness
        # what the largest hard gap must meet before training may end (None: the smooth gaps are what ε bounds)
        self.target = target if fairness else None
        self.quiet_rounds = 0  # quiet rounds in a row so far
        self.settled_rounds = 0  # rounds in a row settled enough for a calibration move (:data:`SETTLE`)
        self.rounds = 0  # rounds fed
        self.last_decrease = float("nan")  # the last round's relative decrease of F
        self.tightenings = 0  # times the working bound was lowered
        self.loosenings = 0  # times the working bound was raised
        # may the rates' temperature fall? (only where every fairness term is the server's to compute)
        self.sharpen = sharpen
        self.temperature = 1.0  # the smooth rates' temperature τ
        self.sharpenings = 0  # times τ was halved
        self.met_at: float | None = None  # the largest working bound whose converged hard gap met the target
        self.gave_up = False  # stopped with the hard gap above the target at the smallest working bound
        self.best: dict | None = None  # the round with the smallest hard gap seen: round, hard gap, accuracy
        self.last_hard: float | None = None  # the largest hard gap of the last round fed
        self.converged_at: tuple[float, float] | None = None  # (working bound, hard gap) at the last tightening
        # where a search that holds the gaps inside the working bound aimed them (Gauss-Newton blocks:
        # core/newton's search on linearised logits); a multiplier is at rest where its gap is there
        self.aim: float | None = None
        # the largest hard gap of each settled round in a row (the last ``window``): a network's calibration
        # move reads them all, since its hard gap still wobbles by rows of a small group once F has
        # settled (Crime, equalized odds: 0.0019 to 0.011 in three settled rounds)
        self.settled_hard: list[float] = []
        # rounds in a row, under a plateau, whose smooth gaps were within the bound and hard gap beyond
        # SHARPEN_ABOVE times the target (:meth:`far_above`)
        self.far_rounds = 0

    def update(self, f_before: float, f_after: float, gaps: np.ndarray, lam: np.ndarray,
               hard: float | None = None, over: bool = False) -> bool:
        """Feed one round; True once training should end with it. ``hard``: the round's largest
        hard gap, which decides, with a target, whether a converged run may end or must tighten;
        ``over``: that gap leans the other way than its smooth gap (the bound over-corrects it,
        :meth:`overshot`)."""
        self.last_decrease = (f_before - f_after) / (1.0 + abs(f_after))
        self.last_hard = hard
        self.rounds += 1
        if self.start is None:
            self.start = f_before
        if self.tolerance <= 0:
            return False
        small = (f_before - f_after <= self.plateau * (self.start - f_after) if self.plateau > 0
                 else self.last_decrease <= self.tolerance)
        rest = not self.fairness or self.at_rest(gaps, lam)
        quiet = small and rest
        self.quiet_rounds = self.quiet_rounds + 1 if quiet else 0
        # a network's F keeps falling as it fits its rows: it has settled, for a calibration move, once its
        # fall is a small share of its fall since round 1, as for its stop
        settled = (f_before - f_after <= SETTLE_PLATEAU * self.plateau * (self.start - f_after) if self.plateau > 0
                   else self.last_decrease <= SETTLE * self.tolerance) and rest
        self.settled_rounds = self.settled_rounds + 1 if settled else 0
        self.settled_hard = ([*self.settled_hard, hard][-self.window:] if settled and hard is not None else [])
        if self.far_above(gaps, hard):
            return False
        if self.target is None or hard is None:
            return self.quiet_rounds >= self.window
        # what a calibration move reads: a network's every settled round (its θ still moves once F has
        # settled, and its hard gap wobbles with it); a linear model's last round, where θ has come to rest
        readings = (self.settled_hard or [hard]) if self.plateau > 0 else [hard]
        if self.settled_rounds >= self.window:
            # the hard gap at this bound is known once the run has settled: move now, not after F's tail
            if min(readings) > self.target + GAP_SLACK:
                return not self.above(hard, over)
            if self.loosen(max(readings), lam):
                return False
        if self.quiet_rounds < self.window:
            return False
        if hard <= self.target + GAP_SLACK:
            return not self.loosen(max(readings), lam)
        # above the target now but not in every settled round: the wobble, not the bound; the next round decides
        return False if min(readings) <= self.target + GAP_SLACK else not self.above(hard, over)

    def far_above(self, gaps: np.ndarray, hard: float | None) -> bool:
        """Under a plateau, sharpen the rates without waiting for F to settle when, ``window`` rounds in a
        row after the first, the smooth gaps are within the bound and the hard gap beyond SHARPEN_ABOVE times
        the target: the smooth rates then do not carry the hard gap, whatever F does next, and a network's
        F falls for tens of rounds more (COMPAS, equalized odds: hard 5 to 8 times the target from round 5,
        the first move at round 19). Only as the run's first move. A linear model's F settles within rounds
        of its gaps: it waits."""
        far = (self.plateau > 0 and self.target is not None and hard is not None and self.rounds > 1
               and hard > SHARPEN_ABOVE * self.target
               and bool(np.all(np.abs(np.asarray(gaps, dtype=np.float64)) <= self.epsilon + GAP_SLACK)))
        self.far_rounds = self.far_rounds + 1 if far else 0
        # once, from the rates' first temperature: after that the settled calibration reads a hard gap that
        # jumps by rows of a small group (Crime) no faster than it can tell the jump from the trend
        if self.far_rounds < self.window or self.converged_at is not None or self.sharpenings or self.loosenings:
            return False
        return self.sharpened(give_up=False, by=self.sharpen_by(hard))

    def wait_again(self) -> None:
        """After a calibration move: the run has to settle, and be quiet, at the new bound or temperature."""
        self.quiet_rounds = self.settled_rounds = 0
        self.settled_hard = []

    def above(self, hard: float, over: bool) -> bool:
        """The move for a converged hard gap above the target: raise the bound where it over-corrects
        the gap (:meth:`overshot`), else tighten it (:meth:`tighten`, which may sharpen instead)."""
        return self.overshot(hard) if over else self.tighten(hard)

    def overshot(self, hard: float) -> bool:
        """Raise the working bound where the largest hard gap is above the target with the sign
        opposite to its smooth gap's: the bound over-corrects it, so a tighter one would push it
        further (Adult, demographic parity, below a smooth bound of about 0.02: women are then
        predicted positive more often than men). The step follows the secant through the last
        converged point (hard gaps signed, negative where over-corrected) where it slopes up, else
        raises the bound by the excess plus half the target: there the hard gap moves about one
        for one with the bound. Always True: raising the bound can always be tried."""
        signed = -hard
        bound = self.epsilon + hard + 0.5 * self.target
        if self.converged_at is not None:
            b0, h0 = self.converged_at
            slope = (signed - h0) / (self.epsilon - b0) if self.epsilon != b0 else 0.0
            if slope > 0:
                bound = self.epsilon + (0.5 * self.target - signed) / slope
        self.converged_at = (self.epsilon, signed)
        self.epsilon = bound
        self.loosenings += 1
        self.wait_again()
        return True

    def observe(self, server_round: int, hard: float, accuracy: float) -> None:
        """Note a round's largest hard gap and training accuracy (the smallest gap is what a run
        that cannot meet the target reports)."""
        if self.best is None or hard < self.best["hard_gap"]:
            self.best = {"round": server_round, "hard_gap": hard, "accuracy": accuracy}

    def tighten(self, hard: float) -> bool:
        """Lower the working bound toward where the hard gap meets the target; False (and
        :attr:`gave_up`) when that would take it below :data:`MIN_BOUND_SHARE` of the target.

        The first step scales the bound by target / hard: the hard gap is several times the
        smooth one (COMPAS: 0.109 at a smooth 0.020), so lowering it by the excess alone would
        overshoot below zero. Later steps take the secant through the last two converged
        (bound, hard gap) pairs, which also fits a hard gap that does not vanish with the
        smooth one; the proportional step stands in where the secant does not point down or
        would end below the smallest bound."""
        if (hard > SHARPEN_ABOVE * self.target and self.converged_at is None
                and self.sharpened(give_up=False, by=self.sharpen_by(hard))):
            return True
        bound = self.epsilon * self.target / hard
        if self.met_at is not None:  # a looser bound overshot: go back between it and one that met
            bound = max(bound, 0.5 * (self.met_at + self.epsilon)) if self.met_at < self.epsilon else self.met_at
        if self.converged_at is not None:
            b0, h0 = self.converged_at
            slope = (hard - h0) / (self.epsilon - b0) if self.epsilon != b0 else 0.0
            secant = self.epsilon - (hard - self.target) / slope if slope > 0 else -1.0
            if secant < max(MIN_BOUND_SHARE * self.target, self.met_at or 0.0):
                # the hard gap no longer follows the bound (or the secant is too steep to trust)
                self.converged_at = (self.epsilon, hard)
                return self.sharpened(by=self.sharpen_by(hard))
            # a step past a quarter of the bound, or past SECANT_REACH times the last move, extrapolates beyond
            # what two converged points say
            bound = max(min(secant, self.epsilon), self.epsilon / 4,
                        self.epsilon - SECANT_REACH * abs(self.epsilon - b0))
        self.converged_at = (self.epsilon, hard)
        if bound < MIN_BOUND_SHARE * self.target:
            return self.sharpened(by=self.sharpen_by(hard))
        self.epsilon = bound
        self.tightenings += 1
        self.wait_again()
        return True

    def sharpen_by(self, hard: float) -> float:
        """How much to divide τ by: a hard gap still well above the target skips a step, since each
        step costs the run a settling (COMPAS race, equalized odds: τ from 1 to 1/32 in five halvings,
        each followed by a tightening, took 39 rounds)."""
        return 4.0 if hard > SHARPEN_FAR * self.target else 2.0

    def sharpened(self, give_up: bool = True, by: float = 2.0) -> bool:
        """Divide the smooth rates' temperature ``by`` (a hard gap far above the target skips a
        step), at most down to :data:`MIN_TEMPERATURE`, and start the bound's calibration again at
        the target; False (and, with ``give_up``, :attr:`gave_up`) where the rule may not or τ is
        already there."""
        if not self.sharpen or self.temperature <= MIN_TEMPERATURE:
            self.gave_up = give_up
            return False
        self.temperature = max(self.temperature / by, MIN_TEMPERATURE)
        self.sharpenings += 1
        self.epsilon = self.target
        self.converged_at = self.met_at = None
        self.wait_again()
        self.far_rounds = 0
        return True

    def loosen(self, hard: float, lam: np.ndarray) -> bool:
        """Raise the working bound toward where the hard gap meets the target, when the run converged
        with it below :data:`LOOSEN_BELOW` of the target and a multiplier in use; False (the run may
        end) otherwise, after :data:`MAX_LOOSENINGS` or past round :data:`LOOSEN_WITHIN`.

        The step is the secant through the last two converged (bound, hard gap) pairs where one
        exists (after a tightening that overshot, it lands between the two bounds), else
        proportional (target / hard), at most :data:`MAX_LOOSEN` times the bound."""
        self.met_at = max(self.met_at or 0.0, self.epsilon)
        lam = np.asarray(lam, dtype=np.float64)
        in_use = bool(np.any((lam[0::2] - lam[1::2]) != 0))
        if (not in_use or hard >= LOOSEN_BELOW * self.target or self.loosenings >= MAX_LOOSENINGS
                or self.rounds > LOOSEN_WITHIN):
            return False
        bound = self.epsilon * min(self.target / max(hard, 1e-12), MAX_LOOSEN)
        if self.converged_at is not None:
            b0, h0 = self.converged_at
            slope = (hard - h0) / (self.epsilon - b0) if self.epsilon != b0 else 0.0
            if slope > 0:
                bound = min(self.epsilon + (self.target - hard) / slope, bound)
        self.converged_at = (self.epsilon, hard)
        self.epsilon = bound
        self.loosenings += 1
        self.wait_again()
        return True

    def met(self) -> bool:
        """Whether the last round fed meets the target (no target: always)."""
        return self.target is None or (self.last_hard is not None and self.last_hard <= self.target + GAP_SLACK)

    def at_rest(self, gaps: np.ndarray, lam: np.ndarray) -> bool:
        """Every gap within ε, and a multiplier in use only where its gap is at ε (or at :attr:`aim`)."""
        gaps = np.abs(np.asarray(gaps, dtype=np.float64))
        lam = np.asarray(lam, dtype=np.float64)
        in_use = (lam[0::2] - lam[1::2]) != 0
        low = self.epsilon if self.aim is None else min(self.aim, self.epsilon)
        return bool(np.all(gaps <= self.epsilon + GAP_SLACK)
                    and np.all(~in_use | (gaps >= low - GAP_SLACK)))

    def describe(self) -> str:
        """The rule in words, for the log line of a run it ended."""
        fair = f" with every gap within epsilon + {GAP_SLACK:g}" if self.fairness else ""
        if self.target is not None:
            hard = ("the largest hard gap still above epsilon, which the smooth gaps no longer move" if self.gave_up
                    else f"the largest hard gap within epsilon + {GAP_SLACK:g}")
            fair = f" with every smooth gap within the working bound {self.epsilon:.4g} + {GAP_SLACK:g} and {hard}"
        fell = (f"F fell by less than stop-plateau={self.plateau:g} of its fall since round 1" if self.plateau > 0
                else f"F decreased by less than stop-tolerance={self.tolerance:g} (relative)")
        return f"{fell} for stop-window={self.window} round(s) in a row{fair}"

    def state_dict(self) -> dict:
        """The count of quiet rounds so far, which a checkpoint keeps: a resumed run stops where the
        uninterrupted one did."""
        return {"quiet-rounds": self.quiet_rounds, "settled-rounds": self.settled_rounds, "rounds": self.rounds,
                "bound": self.epsilon, "tightenings": self.tightenings,
                "loosenings": self.loosenings, "met-at": self.met_at, "converged-at": list(self.converged_at or ()),
                "temperature": self.temperature, "sharpenings": self.sharpenings, "start": self.start,
                "settled-hard": list(self.settled_hard), "far-rounds": self.far_rounds}

    def load_state_dict(self, state: dict) -> None:
        """Continue the count of quiet rounds and the working bound from a checkpoint (0 and the
        run's ε for one that holds none)."""
        self.quiet_rounds = int(state.get("quiet-rounds", 0))
        self.settled_rounds = int(state.get("settled-rounds", 0))
        self.rounds = int(state.get("rounds", 0))
        self.epsilon = float(state.get("bound", self.epsilon))
        self.tightenings = int(state.get("tightenings", 0))
        self.loosenings = int(state.get("loosenings", 0))
        self.temperature = float(state.get("temperature", 1.0))
        self.sharpenings = int(state.get("sharpenings", 0))
        self.met_at = None if state.get("met-at") is None else float(state["met-at"])
        at = state.get("converged-at") or ()
        self.converged_at = (float(at[0]), float(at[1])) if len(at) == 2 else None
        self.settled_hard = [float(h) for h in state.get("settled-hard", [])]
        self.far_rounds = int(state.get("far-rounds", 0))
        start = state.get("start")
        self.start = None if start is None else float(start)
