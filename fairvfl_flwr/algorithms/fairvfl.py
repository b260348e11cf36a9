"""FairVFL: dual ascent on λ and masked weights ν (docs/algorithm.md), server and parties.

The server (:class:`FairVFL`) runs the dual step and sends z and λ to active parties and
ν, through whatever ν channel the run's hooks provide, to passive ones. The handlers
(:data:`HANDLERS`) are the algorithm's steps only: checks of what arrives, duplicate
re-sends, checkpoints, transcripts and delays are client mods (``features/``).

Two algorithms share these rounds (config/algorithms.py): :data:`GD`, the paper's gradient
steps (``optimizer = "gd"``), and :data:`ADAGRAD`, whose MLP blocks take AdaGrad steps
(``optimizer = "adagrad"``: its step rule, core/models.AdaGrad, kept by each party with θ).
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.config.algorithms import Algorithm
from fairvfl_flwr.core import batching
from fairvfl_flwr.core.constraints import kind_named
from fairvfl_flwr.core.step import server_step
from fairvfl_flwr.flower import checks
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.party import MODEL_STATE, Handles, PartyRuntime, handlers
from fairvfl_flwr.flower.server import VFLServer


class FairVFL(VFLServer):
    """Fair vertical FL: the server side of one run (or FedBCD with ``fairness = false``)."""

    def summary(self) -> None:
        """Log the run's settings once before round 0: data, model, parties, ε and the constraint (or
        fairness off), η, β, c, μ, Q, rounds, batch."""
        c = self.cfg
        log(
            INFO,
            "FairVFL: %s, %s model, %d parties (%d active), epsilon=%s, fairness=%s (%s), "
            "eta=%s, beta=%s, c=%s, mu=%s, Q=%d, %d rounds, batch %s",
            c.data_name, c.model, c.num_parties, c.num_active, c.epsilon,
            "on" if c.fairness else "off",
            f"{c.constraint} on {c.measure}",
            c.eta, c.beta, c.c, c.mu, c.local_steps, c.num_server_rounds,
            f"{self.batch_size} rows" if self.batch_size else "full",
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Dual step on λ, then z and λ to active parties and ν to passive ones.

        With a mini-batch every quantity is on round ``server_round``'s rows only.
        """
        rows = batching.round_rows(self.cfg, server_round, len(self.labels.y_train))
        if rows is None:
            y, z, constraint = self.labels.y_train, self.z("train"), self.constraint
        else:
            y, z, constraint = self.batch_view(rows)
        c = self.cfg
        # the stop rule's working bound: ε, or tighter where ε bounds the hard gap (core/stopping.py)
        self.lam, nu = server_step(self.lam, y, z, constraint, epsilon=self.stop.epsilon, beta=c.beta, c=c.c,
                                   fairness=c.fairness)
        nu = self.hooks.nu(server_round, nu)
        evaluate = self.evaluates(server_round)
        out = []
        for node in self.nodes.values():
            if node.role == msgs.ROLE_ACTIVE:
                content = msgs.active_content(z, self.lam, server_round, evaluate, self.wire_dtype)
                kind = msgs.TRAIN_ACTIVE
            else:
                carried = self.hooks.passive_message(server_round, nu, evaluate)
                if carried is None:
                    content, kind = msgs.passive_content(nu, server_round, evaluate, self.wire_dtype), msgs.TRAIN_PASSIVE
                else:
                    content, kind = carried
            out.append(Message(content, dst_node_id=node.node_id, message_type=kind, group_id=str(server_round)))
        return out


# -- parties --------------------------------------------------------------------------
def _payload(rt: PartyRuntime, message: Message, role: str, **sizes: int | None) -> dict[str, np.ndarray]:
    """The message's arrays, checked: sent to the right role; float and finite; one value
    per row of the round's batch (size None) or ``size`` non-negative values (λ)."""
    if rt.data.role != role:
        raise checks.ReplyError(f"{rt.who}: got {message.metadata.message_type}, but this party is {rt.data.role}")
    rows = rt.rows(message)
    n = rt.n_train if rows is None else len(rows)
    spec = {key: ((n, False) if size is None else (size, True)) for key, size in sizes.items()}
    return {k: v.astype(np.float64) for k, v in checks.check_payload(message.content, rt.who, spec).items()}


def init(message: Message, context: Context) -> Message:
    """Start (or restart) this party's model and return its first partial logits."""
    rt = PartyRuntime(context)
    rt.reset()
    party = rt.party()
    rt.save(party)
    return rt.reply(message, party, steps=0)


def train_active(message: Message, context: Context) -> Message:
    """Q local steps on z̃ (own logits fresh, the others' stale): One round, step 5."""
    rt = PartyRuntime(context)
    constraint = rt.constraint(message)
    got = _payload(rt, message, msgs.ROLE_ACTIVE, z=None, lam=constraint.num_multipliers if constraint else None)
    party = rt.party(constraint)
    steps = party.local_steps(got["z"], got["lam"], rt.cfg.local_steps, rt.cfg.local_time_budget,
                              rows=rt.rows(message))
    rt.save(party)
    return rt.reply(message, party, steps)


def train_passive(message: Message, context: Context) -> Message:
    """One step from the masked weights ν: One round, step 4."""
    rt = PartyRuntime(context)
    nu = _payload(rt, message, msgs.ROLE_PASSIVE, nu=None)["nu"]
    party = rt.party()
    party.step(nu, rows=rt.rows(message))
    rt.save(party)
    return rt.reply(message, party, steps=1)


#: FairVFL's party handlers (routed on the ClientApp as its algorithms are registered).
#: A round's step is answered again from θ when re-sent (its kind: step); the start message
#: starts θ afresh.
HANDLERS = handlers({msgs.INIT: Handles(msgs.Kind.START, init, keeps=(MODEL_STATE,)),
                     msgs.TRAIN_ACTIVE: Handles(msgs.Kind.STEP, train_active, keeps=(MODEL_STATE,)),
                     msgs.TRAIN_PASSIVE: Handles(msgs.Kind.STEP, train_passive, keeps=(MODEL_STATE,))})


def _gd_reason(cfg, passed: tuple[str, ...] | None) -> str:
    return "gradient descent: " + ", and ".join(passed) if passed else "gradient descent (the paper's steps)"


#: The paper's method: gradient steps; ``auto``'s last resort, it runs with every setting.
GD = Algorithm("gd", server=FairVFL, handlers=HANDLERS, reason=_gd_reason, auto=lambda cfg: None)

_ADAGRAD = "optimizer='adagrad' is per-coordinate adaptive steps for MLP parties (docs/adagrad.md); use optimizer='gd'"


def _adagrad_auto(cfg) -> str | None:
    """Why ``auto`` does not take AdaGrad: a setting it cannot run with, or a constraint kind
    it was not measured to reach the target on (a kind's ``adagrad_by_default``)."""
    refused = ADAGRAD.refusal(cfg)
    if refused is None and not kind_named(cfg.constraint).adagrad_by_default:
        refused = ("constraint", "")
    return None if refused is None else f"AdaGrad does not run with {cfg.key_of(refused[0])}={getattr(cfg, refused[0])!r}"


def _adagrad_reason(cfg, passed: tuple[str, ...] | None) -> str:
    return f"AdaGrad steps kept by each party ({'; '.join((*(passed or ()), 'docs/adagrad.md'))})"


#: FairVFL's rounds with AdaGrad steps on MLP blocks (core/models.AdaGrad; docs/adagrad.md).
ADAGRAD = Algorithm(
    "adagrad", server=FairVFL, handlers=HANDLERS, reason=_adagrad_reason, auto=_adagrad_auto, step_rule="adagrad",
    refuses=(
        ("model", lambda c: c.model == "linear",
         "a linear party's problem is convex and block Newton solves it in tens of rounds; use optimizer='newton' "
         "(or 'auto') for a linear model, or optimizer='gd'"),
        ("mode", lambda c: c.mode == "split", "the split-learning baseline has its own SGD steps; " + _ADAGRAD),
    ),
)

