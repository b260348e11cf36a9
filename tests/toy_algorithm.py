"""A toy algorithm, as a plug-in would write it: its whole module (tests/test_algorithms.py registers it).

Every party, active or passive, takes one gradient step a round on the ν the server sends,
under message types of its own (its start message included), and counts its steps in a
record of its node's state; each handler is declared with its message's kind and the
records it keeps. Nothing else of the app is edited for it: one registration line runs it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.serverapp import Grid

from fairvfl_flwr.config import algorithms as registry
from fairvfl_flwr.core.step import server_step
from fairvfl_flwr.flower import checks
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.party import MODEL_STATE, Handles, PartyRuntime, handlers
from fairvfl_flwr.flower.server import VFLServer

TOY_INIT = "query.toyinit"  # its own start message
TOY_STEP = "train.toystep"
TOY_STATE = "toy.count"  # each party's count of its steps


class ToyVFL(VFLServer):
    """The server: FairVFL's dual step, then the same ν to every party under the toy's type."""

    init_type = TOY_INIT

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        c = self.cfg
        self.lam, nu = server_step(self.lam, self.labels.y_train, self.z("train"), self.constraint,
                                   epsilon=c.epsilon, beta=c.beta, c=c.c, fairness=c.fairness)
        nu = self.hooks.nu(server_round, nu)
        content = msgs.passive_content(nu, server_round, self.evaluates(server_round), self.wire_dtype)
        return [Message(content.copy(), dst_node_id=nid, message_type=TOY_STEP, group_id=str(server_round))
                for nid in self.nodes]


def _count(context: Context) -> int:
    record = context.state.config_records.get(TOY_STATE)
    return 0 if record is None else int(record["steps"])


def toy_init(message: Message, context: Context) -> Message:
    """Start this party's model and count afresh; reply its first partial logits."""
    rt = PartyRuntime(context)
    rt.reset()
    context.state.config_records[TOY_STATE] = ConfigRecord({"steps": 0})
    party = rt.party()
    rt.save(party)
    return rt.reply(message, party, steps=0)


def toy_step(message: Message, context: Context) -> Message:
    """One gradient step on the ν received, whatever this party's role."""
    rt = PartyRuntime(context)
    nu = checks.check_payload(message.content, rt.who, {"nu": (rt.n_train, False)})["nu"].astype(np.float64)
    party = rt.party()
    party.step(nu)
    rt.save(party)
    context.state.config_records[TOY_STATE] = ConfigRecord({"steps": _count(context) + 1})
    return rt.reply(message, party, steps=1)


# each handler declared with its message's kind (a re-sent step is answered from θ) and the
# records it keeps between rounds (a restarted party continues from them)
KEEPS = (MODEL_STATE, TOY_STATE)
TOY = registry.Algorithm("toy", server=ToyVFL, handlers=handlers({TOY_INIT: Handles(msgs.Kind.START, toy_init, KEEPS),
                                                                    TOY_STEP: Handles(msgs.Kind.STEP, toy_step, KEEPS)}),
                         reason=lambda cfg, passed: "the toy: one gradient step a round for every party")
