"""Block Newton with the server's subspace search (``optimizer = "newton"``), server and parties.

The math is ``core/newton.py``; docs/newton.md describes the method and this protocol.
One message per party and round, as for gradient descent:

* Server, ``configure_train`` (round t): ν at λ, the last round's constrained search's
  multipliers (a clipped-rule kind's dual Newton step first: core/newton.server_step); to
  each party its step lengths α_k of round t − 1, with z and λ (active) or ν (passive).
* Party: it applies α_k to the directions it sent last round (θ_k += D_k α_k, which
  becomes its newest "move"), then computes its block Newton direction s_k (passive: the
  curvature from ν alone, ``party_curvature(ν, n, "nu")``; active: the exact curvature from
  y, z and λ, with its intercept). It replies X_k s_k, a = θ_kᵀD_k and D_kᵀD_k for
  D_k = [s_k, its last moves], and on evaluation rounds X_test θ_k and X_test D_k.
* Server, ``aggregate_train``: the change of logits of every direction (the parties'
  X_k s_k and its own record of their last moves' changes), the step lengths α that
  minimise the objective on their span with every gap within ε, and that search's multipliers
  (``search_step``; a clipped-rule kind's search at fixed λ also gives the gaps' sensitivity
  to λ there for its next dual step), and every party's partial logits u_k += X_k D_k α_k.

After the last round the parties get ``train.newton_apply`` with their last α_k and reply
their partial logits, so the final scores, the history's last row and the blocks each
party saves (``query.save``) are the same model. Full batch only: the algorithm refuses the
rest (:data:`NEWTON`, config/algorithms.py).

MLP parties run Gauss–Newton blocks (:meth:`NewtonVFL.aggregate_nonlinear`), also one
message per party and round: the party takes the step its message carries from the point
it names, replies its true logits there with its next directions' images, and the server
judges that step before it searches the next.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.config.algorithms import Algorithm
from fairvfl_flwr.core.newton import (
    WIRE_RCOND,
    block_direction,
    held_step,
    curvature,
    damping,
    loss_curvature,
    party_curvature,
    rule_for,
    search_step,
    server_step,
    smooth_part,
    subspace_step,
    with_bias,
)
from fairvfl_flwr.flower import checks
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.arrays import record_of, to_array, to_numpy
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.party import MODEL_STATE, Handles, PartyRuntime, handlers, round_of
from fairvfl_flwr.flower.server import VFLServer
from fairvfl_flwr.secure import ring
from fairvfl_flwr.flower.records import array_records, metric_records

#: What a passive party uses for its curvature: derived from ν, nothing else received.
PASSIVE_CURVATURE = "nu"
#: ... and where ν reaches it encrypted (privacy.secure-nu='ckks'): |ν|(1 − n|ν|) is not
#: linear in ν, so the party uses the fixed 1/(4n), and the direction is linear in X_kᵀν.
ENCRYPTED_NU_CURVATURE = "const"
NEWTON_STATE = "newton.state"  # a party's directions awaiting their α, and its last moves
#: A non-linear round's step is kept when the true F fell by at least this share of the decrease
#: the linearised logits predicted (a trust-region ratio test); else it is taken back.
ACCEPT = 0.1
#: The largest change of any row's logit a non-linear party's direction may show the server: a
#: column of its directions whose image J_k d_j goes beyond it is scaled down to it. σ is flat
#: beyond a few logits, so the linearisation says nothing there; under shared step lengths
#: (secure aggregation) a block whose Gauss–Newton direction is near singular would otherwise
#: swamp the combined direction, and a masked image must fit the fixed-point ring.
IMAGE_CAP = 4.0
#: A kept step that delivered less than this share of the predicted decrease grows the damping.
GOOD = 0.25
#: A kept step whose true gaps ended further than this from where the linearised search put
#: them grows the damping: the search held them within its bound, the true step moved them
#: off by more than the stop rule's slack. δ shrinks only after one whose gaps ended within half of it.
VIOLATION_SLACK = 1e-3
#: The damping's factor per round (squared for a step taken back), and the δ of round 1 and
#: the smallest δ > 0 (below it the search runs undamped): core/newton.damping's scale, where
#: the loss's own curvature is at most 1/4.
GROW = 2.0
DAMPING_START = 0.25
DAMPING_FLOOR = 1e-3
DAMPING_MAX = 1e4
#: Above this δ, within stop-window rounds of a step taken back, a kept step is a small fraction of
#: the linearised model's (a thirtieth at the loss's largest curvature), so F's slow fall is the
#: damping's, not a plateau: the stop rule's quiet rounds wait. Kept steps hold δ between 0.1 and 4
#: (Crime, COMPAS); it rises past 8 after steps taken back, and where the kept steps after them
#: deliver half their predicted fall it stays there (the hold band of next_damping), so a wait
#: for δ itself to fall can outlast the run (COMPAS equalized odds, seed 1: δ 16 from round 41).
PLATEAU_DAMPING = 8.0
#: A run that ends on its plateau with δ above this says so: its steps were at most a ninth of the
#: linearised model's, so its F may still fall where a smaller stop-plateau would have trained on
#: (Adult race, seed 1, newton-warm-rounds = 0: δ 4 to 8 from round 6, stopped at round 35 2.76
#: points below 1,000 rounds of AdaGrad).
DAMPED_STOP = 2.0
#: The ℓ1 merit's penalty on a gap above its bound, as a multiple of the largest multiplier.
MERIT_PENALTY = 2.0
#: A step whose training loss (λ = 0, without the μ-term) ends above this multiple of the loss it
#: started from is taken back, whatever the merit says: at the multipliers of a round whose gaps are
#: out of reach the ℓ1 merit trades any loss for a gap (Adult race, seed 2: 0.859 to 6.76 in one step),
#: and the rounds after it spend themselves winning the loss back.
LOSS_RISE = 2.0
#: The most the search's bound is lowered below ε for the linearisation's overshoot, as a share of ε.
AIM_MARGIN = 0.3


def _single(v: np.ndarray) -> np.ndarray:
    """``v`` rounded to float32, kept as float64."""
    return np.asarray(v, dtype=np.float64).astype(np.float32).astype(np.float64)


def step_share(damping: float) -> float:
    """The most a step damped by δ is of the undamped search's, 1/(1 + 4δ): the loss's curvature
    in a row's logit is at most 1/4 (core/newton.damping)."""
    return 1.0 / (1.0 + 4.0 * damping)


def damped_stop(damping: float) -> str | None:
    """What the log adds where a Gauss–Newton run ends on its plateau with its steps held short by
    the damping (None: δ at most :data:`DAMPED_STOP`)."""
    if not damping > DAMPED_STOP:
        return None
    return (f"the Gauss-Newton damping was {damping:.3g} when F settled, so each step was at most "
            f"1/{1 / step_share(damping):.0f} of the linearised model's (it grows where a true step falls short of the "
            "linearised one or moves a gap off it): F may still be falling, and a smaller stop-plateau trains on")


def damped_wait(damping: float, server_round: int, taken_back_at: int, window: int) -> bool:
    """Whether a kept step's round starts the stop rule's count of quiet rounds again: its δ is past
    :data:`PLATEAU_DAMPING` within ``window`` rounds of a step taken back (``taken_back_at``, 0:
    none yet), where F's slow fall is the damping's, not a plateau."""
    return damping > PLATEAU_DAMPING and taken_back_at > 0 and server_round - taken_back_at <= window


def gap_error(gaps: np.ndarray, predicted: np.ndarray) -> float:
    """How much further from 0 the true gaps ended than the linearised ones (a gap that lands nearer
    0 than predicted asks for no margin)."""
    return float(max(np.max(np.abs(gaps) - np.abs(predicted)), 0.0))


def next_damping(damping: float, predicted: float, achieved: float, gap_error: float) -> float:
    """δ after a kept step that delivered ``achieved`` of the ``predicted`` fall of the merit and whose
    true gaps ended ``gap_error`` further from 0 than the linearised ones (0 where the search did not
    hold the gaps: the fairness term off, or a ``newton-warm-rounds`` round; they are reported, not held). It grows after a step that delivered less than :data:`GOOD`
    of the fall or erred past :data:`VIOLATION_SLACK`, and shrinks after one that delivered three
    quarters with an error within half of it."""
    if predicted <= 0.0:
        return damping
    if achieved < GOOD * predicted or gap_error > VIOLATION_SLACK:
        return min(max(GROW * damping, DAMPING_FLOOR), DAMPING_MAX)
    if achieved >= 0.75 * predicted and gap_error <= 0.5 * VIOLATION_SLACK:
        return damping / GROW if damping > DAMPING_FLOOR else 0.0
    return damping


def sq_norm_after(reply: dict, alpha: np.ndarray) -> float:
    """‖θ + Dα‖² from a reply's ‖θ‖², a = θᵀD and DᵀD: the μ-term after the step, no θ needed."""
    return max(reply["sq-norm"] + 2.0 * float(reply["a"] @ alpha) + float(alpha @ reply["gram"] @ alpha), 0.0)


class NewtonVFL(VFLServer):
    """The server of a FairVFL run trained by block Newton steps (linear parties, full batch)."""

    init_type = msgs.NEWTON_INIT
    sharpens = True  # the parties send directions' images; every fairness term is the server's
    round_state = VFLServer.round_state + ("jac", "previous", "alpha", "computed_alpha", "du_moves", "owner",
                                           "damping", "taken_back_at", "aim", "moves_held", "gap_error", "gap_errors",
                                           "base_round", "base_got", "base_u_train", "base_u_test", "base_sq_norms",
                                           "lam_base", "trial")
    node_keyed = VFLServer.node_keyed + ("alpha", "computed_alpha", "du_moves", "moves_held", "base_got",
                                         "base_u_train", "base_u_test", "base_sq_norms")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.jac: np.ndarray | None = None  # dD/dd in the last round's subspace (None before round 1's)
        self.previous: tuple[np.ndarray, np.ndarray] | None = None  # (d, gaps) at the last dual step
        self.alpha: dict[int, np.ndarray] = {}  # each party's step lengths, sent with its next message
        self.computed_alpha: dict[int, np.ndarray] = {}  # the last round's, kept after the apply message went out
        self.du_moves: dict[int, list[np.ndarray]] = {}  # each party's last moves' change of logits, newest first
        self.grid: Grid | None = None
        self.owner = np.zeros(0, dtype=np.int64)  # the party of each direction of the last search
        # Non-linear (MLP) parties: their logits are not linear in θ_k, so each round's step is
        # applied at once and checked on the true logits (aggregate_nonlinear).
        self.nonlinear = self.cfg.model != "linear"
        self.damping = DAMPING_START  # non-linear: the search's Levenberg–Marquardt δ (core/newton.damping)
        self.taken_back_at = 0  # non-linear: the last round whose step was taken back (0: none)
        self.gap_errors: list[float] = []  # non-linear: the last kept steps' overshoot of the gaps, newest first
        if self.nonlinear:  # a network's F keeps falling: quiet is its plateau
            self.stop.plateau = self.cfg.stop_plateau
        self.aim = self.stop.epsilon  # non-linear: the bound the last search held the linearised gaps within
        self.moves_held: dict[int, int] = {}  # non-linear: the moves each party keeps (it sends their images)
        self.gap_error = 0.0  # non-linear: how far the last kept step's true gaps fell from the linearised ones
        # Non-linear: the point the next step lengths apply to (a step not kept leaves it where it was): the
        # round whose replies held its directions (0: none yet), those replies, and the server's view there
        self.base_round = 0
        self.base_got: dict[int, dict] = {}
        self.base_u_train: dict[int, np.ndarray] = {}
        self.base_u_test: dict[int, np.ndarray] = {}
        self.base_sq_norms: dict[int, float] = {}
        self.lam_base = self.lam
        self.trial: dict | None = None  # non-linear: the step the next replies take, with what judges it

    def summary(self) -> None:
        """Log the run's settings once before round 0, with how many earlier moves each search keeps."""
        c = self.cfg
        log(
            INFO,
            "FairVFL: %s, %s model, %d parties (%d active), epsilon=%s, fairness=%s (%s), optimizer=newton "
            "(block Newton, server subspace search, memory %d; optimizer=%r), %s, c=%s, mu=%s, "
            "%d rounds, full batch",
            c.data_name, c.model, c.num_parties, c.num_active, c.epsilon, "on" if c.fairness else "off",
            f"{c.constraint} on {c.measure}",
            c.newton_moves, c.optimizer,
            # beta is used only by the clipped dual step (round 1 and past the weight bound)
            "lambda 0 (no fairness term)" if not c.fairness
            else "lambda from the constrained search" if self.nonlinear or rule_for(self.constraint).searches
            else f"beta={c.beta} (round 1 and past the weight bound)",
            c.c, c.mu, c.num_server_rounds,
        )

    def log_stop(self, server_round: int) -> None:
        """The stop, and for Gauss–Newton blocks whether the damping held its last steps short."""
        super().log_stop(server_round)
        said = damped_stop(self.damping) if self.nonlinear else None
        if said:
            log(INFO, "[round %d] %s", server_round, said)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """ν at λ (a clipped-rule kind's dual step first), then z, λ and α_k to active parties and ν
        and α_k to passive ones."""
        self.grid = grid  # the last round's apply message goes out from aggregate_train
        c = self.cfg
        y, z = self.labels.y_train, self.z("train")
        if self.nonlinear:  # the constrained search sets λ (aggregate_nonlinear): no dual step between rounds
            nu = self.constraint.masked_weights(y, z, self.lam)
        else:
            self.lam, nu, self.previous = server_step(self.lam, y, z, self.constraint, self.jac, self.previous,
                                                             epsilon=self.stop.epsilon, beta=c.beta, c=c.c,
                                                             fairness=c.fairness)
        nu = self.hooks.nu(server_round, nu)
        evaluate = self.evaluates(server_round)
        base = self.base_round if self.nonlinear else None
        out = []
        for node in self.nodes.values():
            alpha = self.alpha.get(node.node_id, np.zeros(0))
            if node.role == msgs.ROLE_ACTIVE:
                content = msgs.newton_content(server_round, evaluate, alpha, self.wire_dtype, base, z=z, lam=self.lam)
                kind = msgs.NEWTON_ACTIVE
            else:  # a ν channel may carry ν differently (encrypted: α then goes with the second leg)
                carried = self.hooks.passive_message(server_round, nu, evaluate)
                if carried is None:
                    content = msgs.newton_content(server_round, evaluate, alpha, self.wire_dtype, base, nu=nu)
                    kind = msgs.NEWTON_PASSIVE
                else:
                    content, kind = carried
            out.append(Message(content, dst_node_id=node.node_id, message_type=kind, group_id=str(server_round)))
        return out

    def masked_gradient_message(self, node_id: int, server_round: int,
                                arrays: dict[str, np.ndarray]) -> tuple[RecordDict, str]:
        """Encrypted ν: the passive party's Newton message, with the masked X_kᵀν instead of ν."""
        alpha = self.alpha.get(node_id, np.zeros(0))
        content = msgs.newton_content(server_round, self.evaluates(server_round), alpha, np.float64, **arrays)
        return content, msgs.NEWTON_PASSIVE

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The subspace search over every party's directions; the last round also applies it."""
        if server_round == 0:  # the first partial logits, as under gradient descent
            out = super().aggregate_train(server_round, replies)
            self.pool()
            return out
        self.held_rows = None
        replies = list(replies)
        got = {}
        for reply in replies:
            nid = reply.metadata.src_node_id
            got[nid] = self.check_directions(reply, self.width_of(nid))
        if self.nonlinear:
            for reply in replies:  # the true logits where the step this round's message carried landed
                self.fold(reply)
            self.pool()
            return self.aggregate_nonlinear(server_round, got)
        du, a, gram, sq_norm = self.subspace(got)
        y, z, c = self.labels.y_train, self.z("train"), self.cfg
        rcond = WIRE_RCOND[c.wire_dtype]  # the directions' logits came at the wire dtype
        alpha, self.lam, self.jac = search_step(y, z, du, a, gram, self.lam, self.constraint, self.mu,
                                                epsilon=self.stop.epsilon, fairness=c.fairness, rcond=rcond,
                                                priority=self.priority(len(a)))
        f_before = self.objective(z, sq_norm)  # at the λ the search ends with (a searching rule moves it)
        self.take(got, du, alpha)
        if self.converged(f_before, z + du @ alpha):  # the apply message evaluates this round
            self.last_round = server_round
            self.log_stop(server_round)
        if server_round == self.last_round:
            self.apply_last(server_round)
        row = self.record(server_round)
        return None, MetricRecord({k: v for k, v in row.items() if isinstance(v, (int, float))})

    def aggregate_nonlinear(self, server_round: int, got: dict[int, dict]
                            ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """A round of Gauss–Newton blocks (MLP parties), one message per party: the replies hold
        the parties' true logits where the step their message carried landed, and the images
        of their next directions there. The server judges that step (:meth:`judge`), records
        the point the parties hold, and searches the next step (:meth:`search`) from the point
        it kept: the new one, or, for a step not kept, the round's start, whose directions'
        images it still holds (the next message names which, ``base``).

        The cap's last round keeps its step unchecked: the parties take it on
        ``train.newton_apply`` and the final scores are their logits. A round where the stop
        rule ends training ends at its kept point, the one the rule judged: an evaluated round
        sends nothing more (the parties hold that model), another a step of length 0 on
        ``train.newton_apply``, whose replies bring the test logits there (one more step,
        unchecked, could only end elsewhere).

        A step taken back at the largest damping ends training at the kept point: the next
        search would start from the same point with the same λ, bound and damping, so it would
        propose the same step again, and the stop rule, which only kept steps feed, would never
        be asked (Crime, equalized odds, seed 2 ran so to the round cap). The parties return to
        that point with a step of length 0 (``train.newton_apply``)."""
        at_max = self.damping >= DAMPING_MAX
        kept = self.trial is None or self.judge(server_round)
        if kept:
            self.base_round, self.base_got = server_round, got
            self.base_u_train, self.base_u_test = dict(self.u_train), dict(self.u_test)
            self.base_sq_norms, self.lam_base = dict(self.sq_norms), self.lam
        else:
            self.u_train, self.u_test = dict(self.base_u_train), dict(self.base_u_test)
            self.sq_norms, self.lam = dict(self.base_sq_norms), self.lam_base
        evaluated = self.evaluates(server_round)  # whether this round's replies hold test logits
        stuck = not kept and at_max
        ends_here = stuck
        if kept and self.trial is not None and self.stops and self.converged(self.trial["f_before"], self.z("train")):
            self.last_round = server_round
            self.log_stop(server_round)
            ends_here = True
        self.trial = None
        if stuck:
            log(INFO, "[round %d] Gauss-Newton step taken back at the largest damping %.3g: the next search from round "
                "%d's point would propose it again; training ends at that point", server_round, DAMPING_MAX,
                self.base_round)
            self.last_round = server_round
        if ends_here:
            if stuck or not evaluated:  # the parties return to (or stay at) the kept point and reply its test logits
                self.alpha = {nid: np.zeros(len(self.base_got[nid]["a"])) for nid in self.nodes}
                self.computed_alpha = dict(self.alpha)
                self.apply_last(server_round)
            row = self.record(server_round)
        elif server_round == self.last_round:
            self.search(server_round)
            self.trial = None
            self.apply_last(server_round)
            row = self.record(server_round)
        else:
            row = self.record(server_round)
            self.search(server_round)
        return None, MetricRecord({k: v for k, v in row.items() if isinstance(v, (int, float))})

    def search(self, server_round: int) -> None:
        """The step from the kept point: the constrained search (core/newton.held_step,
        whatever the constraint) on the linearised logits z + Σ_j α_j J_k d_j (summed over
        parties where the step lengths are shared) with a Levenberg–Marquardt damping δ on the
        step's logits (core/newton.damping); the server's
        view moves to the predicted logits, which the next message's z and ν are computed from
        (the parties' true logits come with their replies), and :attr:`trial` holds what judges it.

        Every constraint takes the constrained search here, `deo` on two groups too: the dual
        Newton step between rounds measures the gaps' sensitivity on the linearised subspace,
        which a non-linear block's true step does not follow, and the gaps oscillated; the
        search instead holds the linearised gaps within ε and the judgment the true ones.
        The damping shrinks the step, not the constraint: the damped search still holds the
        linearised gaps within its bound, where scaling its step lengths afterwards would not."""
        du, a, gram, sq_norm = self.subspace(self.base_got)
        y, z, c = self.labels.y_train, self.z("train"), self.cfg
        rcond = WIRE_RCOND[c.wire_dtype]
        holds = self.holds_gaps(server_round)
        if holds and c.newton_warm_rounds and server_round == c.newton_warm_rounds + 1:
            # the loss's steps shrank δ to a few hundredths, a step size for the loss alone: at it the
            # first held search moves the logits far past where the linearised gaps hold
            self.damping = max(self.damping, DAMPING_START)
            log(INFO, "[round %d] Gauss-Newton: the loss trained alone for %d round(s) (newton-warm-rounds); the "
                "search now holds the gaps, halving the largest each round down to its aim", server_round,
                c.newton_warm_rounds)
        prox = damping(du, gram, sq_norm, self.damping)
        bound = self.stop.epsilon  # ε, or the tighter bound a hard-gap target has set (core/stopping.py)
        if holds:  # aimed inside the bound by the linearisation's last overshoot of the gaps
            self.aim = self.stop.aim = max(bound - self.gap_error, (1.0 - AIM_MARGIN) * bound)
            # no further than half the largest gap in one round: the linearisation holds for a
            # network's small steps only, and a gap pulled in at once lands far off its linearised
            # value; where even that is out of the subspace's reach (several small groups' gaps
            # against a round's few shared step lengths), the linear path's rule: halfway to it,
            # else no gap above where it is; a step at the round's λ instead let the gaps grow unchecked
            now = float(np.max(np.abs(self.constraint.gaps(y, z)), initial=0.0))
            target = max(self.aim, now / 2.0)
            alpha, self.lam = held_step(y, z, du, a, gram, self.lam, self.constraint, self.mu,
                                        epsilon=target, rcond=rcond, prox=prox)
        else:  # the loss alone: λ is 0 until the first held search sets it
            alpha = subspace_step(y, z, du, a, gram, self.lam, self.constraint, self.mu, rcond=rcond, prox=prox)
        # what the parties get, in single precision: a party's next Gauss–Newton system may be near
        # singular, which turns a last-bit difference in α or λ (sums decoded from the fixed-point
        # ring against float sums) into a difference of 1e-5 in its direction within a round
        alpha, self.lam = _single(alpha), _single(self.lam)
        # judged against the bound the search aimed at: a step that pulls a gap from above it to it
        # is progress, though the gap was within ε already
        bound = self.aim if holds else bound
        penalty = MERIT_PENALTY * float(np.max(self.lam, initial=0.0))
        loss = self.loss(z)
        if self.stop.start is None:
            # the plateau is F's fall against its fall since round 1, so round 1's F is taken at λ = 0: at
            # the multipliers of the first search (30 on Adult race, seed 1) it held their terms too, and
            # a fall of 2 % a round read as a plateau at 81 % accuracy
            self.stop.start = self.merit(z, sq_norm, bound, 0.0, loss)
        trial = {"bound": bound, "penalty": penalty, "holds": holds,
                 "merit_before": self.merit(z, sq_norm, bound, penalty, loss),
                 "f_before": self.objective(z, sq_norm),  # at the λ the search ends with
                 "loss_before": loss}
        self.take(self.base_got, du, alpha)
        trial.update(merit_predicted=self.merit(self.z("train"), None, bound, penalty),
                     gaps_predicted=self.constraint.gaps(y, self.z("train")))
        held = float(np.max(np.abs(trial["gaps_predicted"]), initial=0.0))
        if holds and held > target + 1e-4:
            log(INFO, "[round %d] Gauss-Newton search: %.4g is out of these directions' reach; the linearised gaps "
                "held within %.4g", server_round, target, held)
        self.trial = trial

    def judge(self, server_round: int) -> bool:
        """Whether the step of :attr:`trial` is kept, from the parties' true logits just folded.

        It is kept when its merit at the search's λ fell by at least :data:`ACCEPT` of what the
        linearisation predicted (the trust-region ratio); δ then moves by :func:`next_damping`
        (the merit's fall against the prediction, the gaps' error against :data:`VIOLATION_SLACK`). Otherwise δ
        grows, and the caller returns to the round's start (its logits, ‖θ‖² and λ): the
        parties' next step starts there again, so taking a step back costs no message."""
        t = self.trial
        z = self.z("train")
        loss = self.loss(z)
        merit_after = self.merit(z, None, t["bound"], t["penalty"], loss)
        merit_before = t["merit_before"]
        scale = 1.0 + abs(merit_before)
        predicted, achieved = merit_before - t["merit_predicted"], merit_before - merit_after
        kept = (achieved >= ACCEPT * predicted if predicted > 1e-12 * scale else achieved >= -1e-12 * scale)
        rises = loss > LOSS_RISE * t["loss_before"]
        if not kept or rises:
            grown = min(max(GROW * GROW * self.damping, DAMPING_FLOOR), DAMPING_MAX)
            why = (f"the training loss would rise from {t['loss_before']:.6g} to {loss:.6g}" if rises else
                   f"the merit would rise from {merit_before:.6g} to {merit_after:.6g} (the linearised logits "
                   f"predicted {t['merit_predicted']:.6g})")
            log(INFO, "[round %d] Gauss-Newton step taken back: %s; damping %.3g -> %.3g", server_round, why,
                self.damping, grown)
            self.damping = grown
            self.stop.quiet_rounds = 0
            self.taken_back_at = server_round
            return False
        error = 0.0
        if t["holds"]:
            error = gap_error(self.constraint.gaps(self.labels.y_train, z), t["gaps_predicted"])
            self.gap_errors = [error, *self.gap_errors][:3]
            self.gap_error = max(self.gap_errors)
        if predicted > 1e-12 * scale:
            self.damping = next_damping(self.damping, predicted, achieved, error)
        if damped_wait(self.damping, server_round, self.taken_back_at, self.stop.window):
            self.stop.quiet_rounds = 0
        for nid in self.computed_alpha:
            self.moves_held[nid] = self.moves_after(nid)
        return True

    def holds_gaps(self, server_round: int) -> bool:
        """Whether this round's search holds the gaps: with the fairness term on, after the
        ``newton-warm-rounds`` in which it trains the loss alone. A network fitted first is a better
        start for the gaps' small steps than its random initialisation, where every later step wins
        the loss back within the gaps at the damping their errors grow (newton.md#a-trained-start)."""
        return self.cfg.fairness and server_round > self.cfg.newton_warm_rounds

    def moves_after(self, nid: int) -> int:
        """The moves party ``nid`` keeps at the point the step of :attr:`trial` lands on (a step of
        zero adds none; the party counts the same way)."""
        moved = self.trial is not None and bool(np.any(self.computed_alpha.get(nid, np.zeros(0)) != 0))
        return min(self.moves_held.get(nid, 0) + int(moved), self.cfg.newton_moves)

    def loss(self, z: np.ndarray) -> float:
        """The training loss at logits ``z`` (λ = 0, without the μ-term)."""
        return float(smooth_part(self.constraint, self.labels.y_train, z, np.zeros_like(self.lam)))

    def merit(self, z: np.ndarray, sq_norm: float | None, bound: float, penalty: float,
              loss: float | None = None) -> float:
        """What a non-linear round's step is judged by: the loss with the μ-term, plus
        ``penalty`` times how far each gap is above ``bound`` (an exact ℓ1 penalty: with
        ``penalty`` above every multiplier, a step that lowers it moves toward the constrained
        optimum, whatever λ the search ended with). ``loss``: :meth:`loss` at ``z`` where the
        caller has it (on a registry's groups each one is a sum of its budget)."""
        f = self.loss(z) if loss is None else loss
        f += 0.5 * self.mu * (sum(self.sq_norms.values()) if sq_norm is None else sq_norm)
        if self.cfg.fairness:
            f += penalty * float(np.sum(np.maximum(np.abs(self.constraint.gaps(self.labels.y_train, z)) - bound, 0.0)))
        return f

    def priority(self, directions: int) -> np.ndarray:
        """The search's directions, most needed first, where a budget holds only some of them
        (core/newton.kept_directions): every party's new direction, then their newest moves, and
        so on (the order a party sends them in, :meth:`subspace`'s columns)."""
        if len(self.owner) != directions:  # one owner's columns: their own order
            return np.arange(directions)
        rank = np.zeros(directions, dtype=np.int64)
        for nid in np.unique(self.owner):
            sel = np.flatnonzero(self.owner == nid)
            rank[sel] = np.arange(len(sel))
        return np.argsort(rank, kind="stable")

    def width_of(self, nid: int) -> int:
        """Directions in party ``nid``'s reply: its new one and its last moves."""
        if self.nonlinear:
            return 1 + self.moves_after(nid)
        return 1 + len(self.du_moves.get(nid, []))

    def subspace(self, got: dict[int, dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """(Δu, a, B, Σ_k ‖θ_k‖²) of the search: every party's directions, block-diagonal B."""
        nodes = [n.node_id for n in self.ordered_nodes()]
        du, a, owner = [], [], []
        for nid in nodes:
            du += list(got[nid]["dir"].T) if self.nonlinear else [got[nid]["dir"], *self.du_moves.get(nid, [])]
            a.append(got[nid]["a"])
            owner += [nid] * len(got[nid]["a"])
        du, a, self.owner = np.column_stack(du), np.concatenate(a), np.array(owner)
        gram = np.zeros((len(a), len(a)))
        for nid in nodes:
            sel = np.flatnonzero(self.owner == nid)
            gram[np.ix_(sel, sel)] = got[nid]["gram"]
        return du, a, gram, sum(got[nid]["sq-norm"] for nid in nodes)

    def take(self, got: dict[int, dict], du: np.ndarray, alpha: np.ndarray) -> None:
        """The server's view after the step: each party's logits, ‖θ_k‖², moves and α_k."""
        for nid in [n.node_id for n in self.ordered_nodes()]:
            sel = np.flatnonzero(self.owner == nid)
            al = alpha[sel]
            move = du[:, sel] @ al
            self.u_train[nid] = self.u_train[nid] + move
            if not self.nonlinear:  # a non-linear party sends its moves' images again each round
                self.du_moves[nid] = [move, *self.du_moves.get(nid, [])][:self.cfg.newton_moves]
            self.sq_norms[nid] = sq_norm_after(got[nid], al)
            self.steps[nid] = 1
            self.alpha[nid] = al
            self.computed_alpha[nid] = al
            if "test" in got[nid]:
                self.u_test[nid] = got[nid]["test"] + got[nid]["test-dirs"] @ al

    def apply_last(self, server_round: int) -> None:
        """The parties take the last round's step; their replies (partial logits, train and test)
        become the server's final logits."""
        base = self.base_round if self.nonlinear else None
        messages = [
            Message(msgs.newton_content(server_round, True, self.alpha.get(nid, np.zeros(0)), self.wire_dtype, base),
                    dst_node_id=nid, message_type=msgs.NEWTON_APPLY, group_id=f"{server_round}-apply")
            for nid in self.nodes
        ]
        timeout = self.cfg.round_timeout
        # through the hooks like any round's replies: a transcript keeps these logits as received
        for reply in self.hooks.incoming(self.grid, server_round, self.exchange(self.grid, messages, timeout),
                                         timeout):
            self.fold(reply)
        self.pool()
        self.alpha = {}

    def pool(self) -> None:
        """The server's view once a round's logits are folded: each party's own (per-party step lengths)."""

    def computed(self) -> dict[int, dict[str, np.ndarray]]:
        """The step lengths α_k of the round just folded, per party (sent with its next message)."""
        return {nid: {"alpha": al} for nid, al in self.computed_alpha.items()}

    def check_directions(self, reply: Message, width: int) -> dict:
        """One party's Newton reply, checked: ``width`` directions, one value per row each."""
        nid = reply.metadata.src_node_id
        who = self.who(nid)
        record = array_records(reply.content).get(msgs.DIRECTIONS)
        stats = metric_records(reply.content).get(msgs.STATS)
        try:
            if record is None or stats is None:
                raise checks.ReplyError(f"{who}: a Newton reply needs '{msgs.DIRECTIONS}' arrays and "
                                        f"'{msgs.STATS}' metrics (got {sorted(reply.content.keys())})")
            n, n_test = len(self.labels.y_train), len(self.labels.y_test)
            for key in ("dir", "a", "gram"):
                if key not in record:
                    raise checks.ReplyError(f"{who}: Newton reply has no '{key}' (got {sorted(record)})")
            if self.nonlinear:  # every direction's image J_k d_j, the kept moves' too
                images = checks.check_vector(to_numpy(record["dir"]).reshape(-1), "the directions' images J_k d_j",
                                             n * width, who).astype(np.float64).reshape(n, width)
            else:
                images = checks.check_vector(to_numpy(record["dir"]), "X_k s_k", n, who).astype(np.float64)
            out = {
                "dir": images,
                "a": checks.check_vector(to_numpy(record["a"]), "θ_k·d_j", width, who).astype(np.float64),
                "gram": checks.check_vector(to_numpy(record["gram"]).reshape(-1), "the directions' Gram matrix",
                                            width * width, who).astype(np.float64).reshape(width, width),
            }
            if "test" in record:
                out["test"] = checks.check_vector(to_numpy(record["test"]), "test logits", n_test, who).astype(np.float64)
                out["test-dirs"] = checks.check_vector(to_numpy(record["test-dirs"]).reshape(-1), "test directions",
                                                       n_test * width, who).astype(np.float64).reshape(n_test, width)
            sq = stats.get("sq-norm")
            if not isinstance(sq, (int, float)) or not np.isfinite(sq) or sq < 0:
                raise checks.ReplyError(f"{who}: sq-norm={sq!r} is not a finite number >= 0")
            out["sq-norm"] = float(sq)
        except checks.ReplyError as exc:
            raise FederationError(f"rejected a reply: {exc}") from None
        return out


class SharedNewtonVFL(NewtonVFL):
    """Block Newton with step lengths shared by all parties: every quantity the server's
    search needs is a sum over parties, so it runs under secure aggregation.

    The subspace is spanned by ≤ 1 + ``newton-shared-memory`` *combined* directions:
    d_0 = (s_1, ..., s_K), every party's new direction, and the last combined moves. Their change of logits is
    Σ_k X_k s_k (the server's own record for the moves), a_j = Σ_k θ_k·d_j,k and
    B = Σ_k D_kᵀD_k, and the objective's μ-term needs Σ_k ‖θ_k‖²: the parties' replies summed.
    The search is over these few step lengths, Armijo on the true F as for :class:`NewtonVFL` (so
    α = 0 is admissible and F at fixed λ never increases), the constrained search runs on that
    subspace (a clipped-rule kind's dual step uses its gap Jacobian), and every party gets the
    same α and applies it to its own parts (its handlers are :class:`NewtonVFL`'s: a party's
    memory is its own part of the combined moves). The app runs it under secure aggregation, whose round hook hands this
    server decoded sums only, and for MLP parties over plain replies too, where it is the same
    method (the server sums), so masking an MLP run changes only what the server sees
    (``RunConfig.shared_steps``). The server's per-party view is the sums on the first party
    and zeros on the others.
    """

    round_state = NewtonVFL.round_state + ("dz_moves", "totals")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dz_moves: list[np.ndarray] = []  # the last combined moves' change of z, newest first
        self.totals: dict = {}  # the round's replies summed over parties (set by subspace, used by take)

    def summary(self) -> None:
        """Also log that the step lengths are shared: under secure aggregation the search sees only
        sums over parties."""
        super().summary()
        log(INFO, "FairVFL: block Newton with step lengths shared by all parties: the server's search needs only "
            "sums over parties")

    def pool(self) -> None:
        """Over plain replies, the folded logits and ‖θ_k‖² summed as the ring sums them, on the
        first party with zeros on the others: the view secure aggregation leaves, to the last
        bit, so the judgment and the stop rule decide on the same floats masked or not (under
        secure aggregation the replies hold those sums already)."""
        if self.cfg.masked:
            return
        nodes = [n.node_id for n in self.ordered_nodes()]
        for parts in (self.u_train, self.u_test):
            if all(nid in parts for nid in nodes):
                total = ring.grid_sum([parts[nid] for nid in nodes])
                parts.update({nid: total if nid == nodes[0] else np.zeros_like(total) for nid in nodes})
        total = float(ring.grid_sum([np.array(self.sq_norms[nid]) for nid in nodes], wide=True))
        self.sq_norms.update({nid: total if nid == nodes[0] else 0.0 for nid in nodes})

    def width_of(self, nid: int) -> int:
        """Columns of each party's reply: the new direction plus the shared kept moves (the same for every party)."""
        if self.nonlinear:
            return 1 + self.moves_after(nid)
        return 1 + len(self.dz_moves)

    def subspace(self, got: dict[int, dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """The search's inputs from the replies summed over parties (the only view secure aggregation
        leaves): the moves' logits, θᵀD, DᵀD and ‖θ‖²."""
        nodes = [n.node_id for n in self.ordered_nodes()]
        if self.cfg.masked:  # the decoded sums on the first party, zeros on the others
            self.totals = {key: sum(got[nid][key] for nid in nodes) for key in got[nodes[0]]}
        else:  # summed as the ring sums them, so masking a run changes nothing the search decides on
            self.totals = {key: ring.grid_sum([got[nid][key] for nid in nodes],
                                              wide=key in ring.WIDE_KEYS or key == "sq-norm")
                           for key in got[nodes[0]]}
            self.totals["sq-norm"] = float(self.totals["sq-norm"])
        du = self.totals["dir"] if self.nonlinear else np.column_stack([self.totals["dir"], *self.dz_moves])
        return du, self.totals["a"], self.totals["gram"], self.totals["sq-norm"]

    def take(self, got: dict[int, dict], du: np.ndarray, alpha: np.ndarray) -> None:
        """One combined move: z, Σ‖θ_k‖² and the test logits on the first party, zeros elsewhere."""
        t = self.totals
        move = du @ alpha
        z = self.z("train") + move
        first = self.ordered_nodes()[0].node_id
        if not self.nonlinear:  # non-linear parties send their moves' images again each round
            self.dz_moves = [move, *self.dz_moves][:self.cfg.newton_moves]
        for nid in self.nodes:
            mine = nid == first
            self.u_train[nid] = z if mine else np.zeros_like(z)
            self.sq_norms[nid] = sq_norm_after(t, alpha) if mine else 0.0
            self.steps[nid] = 1
            self.alpha[nid] = alpha
            self.computed_alpha[nid] = alpha
            if "test" in t:
                self.u_test[nid] = t["test"] + t["test-dirs"] @ alpha if mine else np.zeros(len(t["test"]))


# -- parties --------------------------------------------------------------------------
def _params(block) -> np.ndarray:
    """θ_k as one vector (an active party's intercept last, as ``core/newton.with_bias`` puts its column)."""
    theta = np.asarray(block.weight, dtype=np.float64)
    return np.append(theta, float(block.bias)) if block.bias is not None else theta.copy()


def _set_params(block, theta: np.ndarray) -> None:
    if block.bias is not None:
        block.weight = theta[:-1].astype(block.weight.dtype)
        block.bias = np.asarray(theta[-1], dtype=block.weight.dtype)
    else:
        block.weight = theta.astype(block.weight.dtype)


def _memory(rt: PartyRuntime) -> tuple[np.ndarray | None, list[np.ndarray]]:
    """(directions awaiting their α, or None; last moves, newest first)."""
    record = array_records(rt.context.state).get(NEWTON_STATE)
    if record is None:
        return None, []
    pending = to_numpy(record["pending"]) if "pending" in record else None
    moves = [to_numpy(record[f"move-{i}"]) for i in range(rt.cfg.newton_moves) if f"move-{i}" in record]
    return pending, moves


def _remember(rt: PartyRuntime, pending: np.ndarray | None, moves: list[np.ndarray]) -> None:
    arrays = {f"move-{i}": to_array(np.ascontiguousarray(m)) for i, m in enumerate(moves)}
    if pending is not None:
        arrays["pending"] = to_array(np.ascontiguousarray(pending))
    array_records(rt.context.state)[NEWTON_STATE] = ArrayRecord(arrays)


#: A Gauss–Newton party's points the server's next step lengths may start from: its last reply's
#: (``latest``) and the one that reply's step started from (``kept``, where a step not kept
#: returns to). Each is the round whose reply sent its directions' images, θ_k there, the
#: directions and the moves.
POINTS = ("latest", "kept")


def _points(rt: PartyRuntime) -> dict[str, dict]:
    record = array_records(rt.context.state).get(NEWTON_STATE)
    points = {}
    for name in POINTS if record is not None else ():
        if f"{name}-round" in record:
            points[name] = {
                "round": int(to_numpy(record[f"{name}-round"])[0]),
                "theta": to_numpy(record[f"{name}-theta"]),
                "dirs": to_numpy(record[f"{name}-dirs"]),
                "moves": [to_numpy(record[f"{name}-move-{i}"]) for i in range(rt.cfg.newton_moves)
                          if f"{name}-move-{i}" in record],
            }
    return points


def _keep_points(rt: PartyRuntime, points: dict[str, dict]) -> None:
    arrays = {}
    for name, point in points.items():
        arrays[f"{name}-round"] = np.array([point["round"]], dtype=np.int64)
        arrays[f"{name}-theta"], arrays[f"{name}-dirs"] = point["theta"], point["dirs"]
        arrays.update({f"{name}-move-{i}": m for i, m in enumerate(point["moves"])})
    array_records(rt.context.state)[NEWTON_STATE] = record_of(
        {k: to_array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def _base(rt: PartyRuntime, message: Message, points: dict[str, dict]) -> dict | None:
    """The point the message's step lengths start from, as it names it (``base``: the round of its
    directions; 0: none, before the first reply's)."""
    payload = array_records(message.content).get(msgs.PAYLOAD)
    value = to_numpy(payload["base"]) if payload is not None and "base" in payload else None
    if value is None or value.dtype != np.int64 or value.shape != (1,):
        raise checks.ReplyError(f"{rt.who}: {message.metadata.message_type} needs 'base', one int64 (the round of "
                                "the directions its step lengths apply to)")
    base = int(value[0])
    if base == 0:
        return None
    for point in points.values():
        if point["round"] == base:
            return point
    held = sorted(p["round"] for p in points.values())
    raise checks.ReplyError(f"{rt.who}: step lengths for the directions of round {base}, but this party holds those "
                            f"of rounds {held} (was this node's state lost? restart the run)")


def fit_images(directions: np.ndarray, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The directions and their images J_k d_j, each column whose image moves some row's logit by
    more than :data:`IMAGE_CAP` scaled down to it. J_k d is linear in d, so the scaled image is
    exact, and the search's step length along the column grows to match (with per-party step
    lengths the subspace is the same; shared ones combine the parties' scaled parts)."""
    scale = np.minimum(1.0, IMAGE_CAP / np.maximum(np.max(np.abs(images), axis=0), np.finfo(float).tiny))
    return directions * scale, images * scale


def _take_step(rt: PartyRuntime, message: Message, pending: np.ndarray | None, alpha: np.ndarray,
               theta: np.ndarray, moves: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """θ_k += D_k α_k for last round's directions; the move joins the memory."""
    if pending is None:
        if len(alpha):
            raise checks.ReplyError(f"{rt.who}: got {len(alpha)} step lengths in round {round_of(message)[0]} but "
                                    "holds no directions (was this node's state lost? restart the run)")
        return theta, moves
    move = pending @ alpha
    return theta + move, [move, *moves][:rt.cfg.newton_moves]


def _alpha(rt: PartyRuntime, message: Message, pending: np.ndarray | None, **sizes: int) -> dict[str, np.ndarray]:
    spec = {"alpha": (0 if pending is None else pending.shape[1], False)}
    spec.update({k: (size, k == "lam") for k, size in sizes.items()})
    return {k: v.astype(np.float64) for k, v in checks.check_payload(message.content, rt.who, spec).items()}


def init(message: Message, context: Context) -> Message:
    """Start (or restart) this party's model and memory; reply its first partial logits."""
    rt = PartyRuntime(context)
    rt.reset()
    array_records(context.state).pop(NEWTON_STATE, None)
    party = rt.party(steps=False)  # an MLP as numpy (core/mlp_init.py): no torch in a deployed party's process
    rt.save(party)
    return rt.reply(message, party, steps=0)


def _direction(message: Message, context: Context, role: str) -> Message:
    rt = PartyRuntime(context)
    if rt.data.role != role:
        raise checks.ReplyError(f"{rt.who}: got {message.metadata.message_type}, but this party is {rt.data.role}")
    if rt.cfg.model != "linear":
        return _gauss_newton_direction(message, rt, role)
    data, n = rt.data, rt.n_train
    pending, moves = _memory(rt)
    xt_nu = None
    constraint = rt.constraint(message)
    if role == msgs.ROLE_ACTIVE:
        got = _alpha(rt, message, pending, z=n, lam=constraint.num_multipliers)
    else:
        xt_nu = rt.take_gradient()  # encrypted ν: X_kᵀν only, unmasked by the feature's mod
        got = _alpha(rt, message, pending) if xt_nu is not None else _alpha(rt, message, pending, nu=n)
    party = rt.party()
    theta, moves = _take_step(rt, message, pending, got["alpha"], _params(party.block), moves)
    x = np.asarray(data.X_train, dtype=np.float64)
    x_test = np.asarray(data.X_test, dtype=np.float64)
    if role == msgs.ROLE_ACTIVE:
        x, x_test = _owner_columns(data)
        nu = constraint.masked_weights(data.y, got["z"], got["lam"])
        h = curvature(constraint, data.y, got["z"], got["lam"])
    elif xt_nu is None:
        nu = got["nu"]
        h = party_curvature(nu, n, PASSIVE_CURVATURE)
    else:
        nu, h = None, party_curvature(None, n, ENCRYPTED_NU_CURVATURE)
    return _reply_direction(rt, message, party, theta, moves, x, x_test, nu, h, xt_nu)


#: The share of the secure-aggregation ring's range (secure/ring.value_bound) a direction's images may take.
DIRECTION_RANGE = 0.25


def within_ring(s: np.ndarray, x: np.ndarray, x_test: np.ndarray, num_parties: int) -> np.ndarray:
    """The direction ``s`` scaled down where its images on this party's training or test rows would
    take more than :data:`DIRECTION_RANGE` of the masking ring's range; else ``s`` itself.

    A direction's length is the search's to choose (it picks each direction's step length), but an
    image past the ring's range stops a masked run: where the rows' weights leave a block almost no
    curvature (a release margin's spread gaps can), its Newton direction grows past it. Plain runs
    scale alike, so that a masked run and a plain one stay one trajectory."""
    peak = max(float(np.max(np.abs(x @ s), initial=0.0)), float(np.max(np.abs(x_test @ s), initial=0.0)))
    cap = DIRECTION_RANGE * ring.value_bound(num_parties)
    return s if peak <= cap else s * (cap / peak)


def _reply_direction(rt: PartyRuntime, message: Message, party, theta: np.ndarray, moves: list[np.ndarray],
                     x: np.ndarray, x_test: np.ndarray, nu: np.ndarray | None, h: np.ndarray,
                     xt_nu: np.ndarray | None) -> Message:
    """The block Newton direction at θ_k (curvature ``h``; gradient from ``nu``, or ``xt_nu`` = xᵀν),
    its images with the last moves', kept as this party's directions awaiting their α."""
    s = within_ring(block_direction(x, nu, h, theta, party.mu, xt_nu=xt_nu), x, x_test, rt.cfg.num_parties)
    D = np.column_stack([s, *moves])
    dtype = rt.cfg.wire_dtype
    arrays = {"dir": (x @ s).astype(dtype), "a": theta @ D, "gram": D.T @ D}
    if round_of(message)[1]:
        arrays.update({"test": (x_test @ theta).astype(dtype), "test-dirs": (x_test @ D).astype(dtype)})
    _set_params(party.block, theta)
    rt.save(party)
    _remember(rt, D, moves)
    return Message(msgs.directions_reply(arrays, float(theta @ theta), 1), reply_to=message)


def active_round(message: Message, context: Context) -> dict[str, np.ndarray]:
    """The label owner's Newton message where it holds no row's group weight (a registry's encrypted
    groups, jobs/encrypted_groups.py), checked: its step lengths α and z (its weights as if in each
    group beside them are the job's to read)."""
    rt = PartyRuntime(context)
    if rt.data.role != msgs.ROLE_ACTIVE or rt.cfg.model != "linear":
        raise checks.ReplyError(f"{rt.who}: got {message.metadata.message_type} with weights as if in each group, "
                                "but this party is not a linear label owner")
    pending, _ = _memory(rt)
    return _alpha(rt, message, pending, z=rt.n_train)


def active_from_gradient(message: Message, context: Context, alpha: np.ndarray, z: np.ndarray,
                         gradient: np.ndarray) -> Message:
    """The label owner's Newton round from its gradient X_aᵀν (intercept last), which reached it
    through the registry's sums (jobs/encrypted_groups.py): it takes last round's α, and its
    curvature is the loss's own, σ'(z)/n from its labels' logits z, as every row's would be at
    weight 1/n: it holds no row's weight, which depends on the row's group."""
    rt = PartyRuntime(context)
    data, n = rt.data, rt.n_train
    pending, moves = _memory(rt)
    party = rt.party()
    theta, moves = _take_step(rt, message, pending, alpha, _params(party.block), moves)
    x, x_test = _owner_columns(data)
    return _reply_direction(rt, message, party, theta, moves, x, x_test, None, loss_curvature(z, n), gradient)


def _owner_columns(data) -> tuple[np.ndarray, np.ndarray]:
    """The label owner's training and test columns with its intercept's column last."""
    return (with_bias(np.asarray(data.X_train, dtype=np.float64)),
            with_bias(np.asarray(data.X_test, dtype=np.float64)))


def _gauss_newton_direction(message: Message, rt: PartyRuntime, role: str) -> Message:
    """A non-linear party's round: the step its message carries, from the point it names (its
    last reply's, or, for a step the server did not keep, the one before), then its true
    partial logits there and the Gauss–Newton direction of its block with the images J_k d_j
    of it and of its last moves (the linearisation moves with θ_k, so the moves' images are
    sent anew). z and λ, or ν, are the server's at its predicted logits: it learns the true
    ones from these replies. Both points stay until the next message names one."""
    data, n = rt.data, rt.n_train
    points = _points(rt)
    base = _base(rt, message, points)
    constraint = rt.constraint(message)
    sizes = {"z": n, "lam": constraint.num_multipliers} if role == msgs.ROLE_ACTIVE else {"nu": n}
    got = _alpha(rt, message, None if base is None else base["dirs"], **sizes)
    party = rt.party(steps=False)  # numpy (core/gauss_newton.ReluNet): no torch in a round's process
    gn = party.block.gauss_newton(data.X_train)
    moves = []
    if base is not None:
        step = base["dirs"] @ got["alpha"]
        gn.set_flat(base["theta"] + step)
        moves = [step, *base["moves"]][:rt.cfg.newton_moves] if np.any(got["alpha"] != 0) else base["moves"]
    theta = gn.flat()
    if role == msgs.ROLE_ACTIVE:
        nu = constraint.masked_weights(data.y, got["z"], got["lam"])
        h = curvature(constraint, data.y, got["z"], got["lam"])
    else:
        nu = got["nu"]
        h = party_curvature(nu, n, PASSIVE_CURVATURE)
    s = gn.direction(nu, h, party.mu)
    D = np.column_stack([s, *moves])
    D, images = fit_images(D, gn.images(D))
    dtype = rt.cfg.wire_dtype
    arrays = {"dir": images.astype(dtype), "a": theta @ D, "gram": D.T @ D}
    logits = {"train": gn.logits().astype(dtype)}  # the forward pass at θ_k the products used
    if round_of(message)[1]:
        logits["test"] = party.logits("test").astype(dtype)
    rt.save(party)
    latest = {"round": round_of(message)[0], "theta": theta, "dirs": D, "moves": moves}
    _keep_points(rt, {"latest": latest} if base is None else {"latest": latest, "kept": base})
    return Message(msgs.directions_reply(arrays, float(theta @ theta), 1, logits), reply_to=message)


def train_active(message: Message, context: Context) -> Message:
    """Last round's step, then the active party's block Newton direction (exact curvature)."""
    return _direction(message, context, msgs.ROLE_ACTIVE)


def train_passive(message: Message, context: Context) -> Message:
    """Last round's step, then a passive party's block Newton direction (curvature from ν)."""
    return _direction(message, context, msgs.ROLE_PASSIVE)


def apply(message: Message, context: Context) -> Message:
    """After the last round: take its step and reply the final partial logits."""
    rt = PartyRuntime(context)
    if rt.cfg.model != "linear":  # from the point the message names; the points stay, so taking it twice is once
        base = _base(rt, message, _points(rt))
        got = _alpha(rt, message, None if base is None else base["dirs"])
        party = rt.party(steps=False)
        if base is not None:
            gn = party.block.gauss_newton(rt.data.X_train)
            gn.set_flat(base["theta"] + base["dirs"] @ got["alpha"])
            rt.save(party)
        return rt.reply(message, party, steps=0)
    pending, moves = _memory(rt)
    got = _alpha(rt, message, pending)
    party = rt.party()
    theta, moves = _take_step(rt, message, pending, got["alpha"], _params(party.block), moves)
    _set_params(party.block, theta)
    rt.save(party)
    _remember(rt, None, moves)
    return rt.reply(message, party, steps=0)


#: What a Newton party keeps between rounds: θ and its directions and last moves (Gauss–Newton
#: blocks: both points a step may start from), so a restarted party continues from them.
KEEPS = (MODEL_STATE, NEWTON_STATE)
#: The Newton party handlers (routed on the ClientApp as :data:`NEWTON` is registered). Their kinds
#: are round and final, not step: a re-sent message is answered with the kept reply, never by
#: applying α twice. ``train.newton_apply`` follows the last round only (its state is no run's
#: to continue from).
HANDLERS = handlers({
    msgs.NEWTON_INIT: Handles(msgs.Kind.START, init, keeps=KEEPS),
    msgs.NEWTON_ACTIVE: Handles(msgs.Kind.ROUND, train_active, keeps=KEEPS),
    msgs.NEWTON_PASSIVE: Handles(msgs.Kind.ROUND, train_passive, keeps=KEEPS),
    msgs.NEWTON_APPLY: Handles(msgs.Kind.FINAL, apply, keeps=KEEPS),
})


def _server(cfg, labels, **kwargs) -> NewtonVFL:
    """Secure aggregation hides each party's X_k s_k: the search over step lengths every party
    shares; MLP parties take it masked or not (``RunConfig.shared_steps``)."""
    return (SharedNewtonVFL if cfg.shared_steps else NewtonVFL)(cfg, labels, **kwargs)


def _auto(cfg) -> str | None:
    """Why ``auto`` does not take block Newton: a setting it cannot run with. MLP parties take
    it too, as Gauss–Newton blocks (measured: bench/mlp_rounds.py, docs/results/rounds/mlp-rounds.md)."""
    refused = NEWTON.refusal(cfg)
    if refused is not None:
        return f"block Newton does not run with {cfg.key_of(refused[0])}={getattr(cfg, refused[0])!r}"
    return None


def _reason(cfg, passed: tuple[str, ...] | None) -> str:
    """The constraint, its measure, the group count and ``constraint-form`` do not enter
    ``auto``'s choice: the constrained search meets several groups' gaps as it meets two
    (docs/newton.md), so a deployment, whose server learns the groups only from the label
    file, decides as its simulation does."""
    shared = (" with shared step lengths (privacy.secure-aggregation: the server's search sees only sums over "
              "parties)" if cfg.masked else
              " with shared step lengths (MLP parties: the same search as under privacy.secure-aggregation)"
              if cfg.shared_steps else "")
    encrypted = ("; privacy.secure-nu='ckks': passive parties get only X_k^T nu and precondition with the constant "
                 "curvature 1/(4n) (docs/newton.md)" if cfg.nu_as_gradient else
                 "; groups.release='ckks': the search takes the gaps from a per-round Taylor model in its step "
                 "lengths, summed by the registry over its encrypted groups and checked at the step (within its "
                 "sums-per-round); "
                 "passive parties get X_k^T nu through the registry and precondition with 1/(4n), the label owner "
                 "with its loss's own curvature (docs/newton.md)" if cfg.groups_as_sums else "")
    if cfg.model != "linear":
        why = ("; auto: full batch, and the run stops at the plateau of F within tens of rounds" if passed is not None
               else "")
        return (f"block Newton{shared}: Gauss-Newton blocks (MLP parties send the images J_k d of their directions; "
                f"the server's damped search on the linearised logits is checked on their true logits{why}; "
                "docs/newton.md)")
    if passed is None:
        return f"block Newton{shared} (docs/newton.md){encrypted}"
    return (f"block Newton{shared} (linear parties, full batch, constraint={cfg.constraint!r} on the {cfg.measure}; "
            f"docs/newton.md){encrypted}")


#: Block Newton (``optimizer = "newton"``), ``auto``'s first choice (Gauss–Newton blocks for MLP parties).
NEWTON = Algorithm(
    "newton", server=_server, handlers=HANDLERS, reason=_reason, auto=_auto,
    refuses=(
        ("batch_size", lambda c: c.batch_size > 0,
         "the subspace search evaluates the objective on every training row, and the last moves it searches along "
         "lose their meaning when the rows change each round; use batching.batch-size=0 or optimizer='gd'"),
        ("max_staleness", lambda c: c.max_staleness > 0,
         "the subspace search combines every party's direction of the same round; use staleness.max-staleness=0"),
        ("local_time_budget", lambda c: c.local_time_budget > 0,
         "the active party computes one Newton direction per round, not a number of gradient steps; "
         "use staleness.local-time-budget=0"),
        ("mode", lambda c: c.mode == "split", "the split-learning baseline has its own SGD steps; use optimizer='gd'"),
    ),
)
