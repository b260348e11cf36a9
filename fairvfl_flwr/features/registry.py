"""The label owner's row weights where a registry holds the groups (run config groups.holder = "registry").

The label owner then holds labels but no group column, so it cannot form the fairness term
of its local steps itself. The server, which holds the registry's noisy release of the
groups (jobs/group_release.py), puts the rows' signed weights w = 1/n + m at the message's λ
beside z and λ in every training message to an active party (``outgoing``); the party takes
its steps from them (``PartyRuntime.constraint``, core/constraints/release.RowWeights).
What w tells the label owner about a row's group is a function of the row's randomized
release, so no more than ε_S-local privacy allows (docs/privacy.md).

Every gap the server computes from the release is an estimate of the true groups' gap, off by
the release's noise. :class:`ReleaseError` puts that error beside the gaps in every history row
and in the summary, so that a run says how far its true gaps may be from the ones it held.
"""

from __future__ import annotations

from logging import INFO

import numpy as np
from flwr.app import Message
from flwr.supercore import log

from fairvfl_flwr.core.constraints.release import MARGIN_DEVIATIONS, ErrorPlan, error_plan, estimates, gap_errors

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.arrays import to_array, to_numpy
from fairvfl_flwr.flower.hooks import RoundHook, ServerView
from fairvfl_flwr.flower.records import array_records


def active_payloads(server: ServerView, messages: list[Message]):
    """(payload, λ) of every message to an active party whose payload carries λ: where a channel adds
    the rows' weights at that λ (this hook's, and the encrypted groups' as if in each group)."""
    for message in messages:
        node = server.nodes.get(message.metadata.dst_node_id)
        payload = array_records(message.content).get(msgs.PAYLOAD)
        if node is None or node.role != msgs.ROLE_ACTIVE or payload is None or "lam" not in payload:
            continue
        yield payload, to_numpy(payload["lam"]).astype(np.float64)


class LabelOwnerWeights(RoundHook):
    """Adds ``weights`` (the rows' signed weights at the message's λ) to each active party's training message."""

    def outgoing(self, server: ServerView, messages: list[Message]) -> None:
        """Every message to an active party that carries λ gets the rows' weights at that λ."""
        for payload, lam in active_payloads(server, messages):
            w = server.constraint.signed_weights(lam).astype(server.wire_dtype)
            payload["weights"] = to_array(np.ascontiguousarray(w))


class ReleaseError(RoundHook):
    """Each history row gets ``release_error``: per gap the standard deviation the registry's
    release adds to the server's estimate of it (core/constraints/release.gap_errors), the largest
    over the gaps; ``estimated_gap``: the largest |estimate| over the gaps; and ``gap_within``: the
    largest |estimate| + 2 errors over the gaps, where the
    true groups' largest gap in the constraint's measure (the smooth gaps ε holds; the hard-gap
    rule's hard gaps are not covered) is likely to lie below (a model trained on the release leans
    on its noise somewhat, so this is a guide, not a bound). The gaps are those that compare groups:
    a release margin's spread gaps (``groups.release-margin``) bound these errors, they are not
    estimates. The summary carries the last round's (``train_release_error``,
    ``train_estimated_gap``, ``train_gap_within``)."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        self.plan: tuple[object, ErrorPlan | None] | None = None  # (the first gap of the constraint it is of, its plan)

    def record(self, server: ServerView, server_round: int, row: dict) -> None:
        """The round's errors at its training scores (the release's rows: every training row)."""
        constraint, y, z = server.constraint, server.labels.y_train, server.z("train")
        # the plan is of the gaps that compare groups, which a sharpened rate or a new slope keeps as they are
        if self.plan is None or self.plan[0] is not constraint.gap_list[0]:
            self.plan = (constraint.gap_list[0], error_plan(constraint, server.labels.release))
        errors = gap_errors(constraint, server.labels.release, constraint.q.values(y, z), self.plan[1])
        gaps = np.abs(constraint.gaps(y, z))[estimates(constraint)]
        row["release_error"] = float(errors.max())
        row["estimated_gap"] = float(gaps.max())
        row["gap_within"] = float((gaps + MARGIN_DEVIATIONS * errors).max())
        self.last = {f"train_{key}": row[key] for key in ("release_error", "estimated_gap", "gap_within")}

    def summary(self) -> dict:
        """The last round's errors; logged, as what the run's gaps say of the true groups."""
        if self.last:
            log(INFO, "FairVFL: the gaps above are the server's estimates from the registry's release; the release "
                "adds an error of up to %.4g (one standard deviation) to them: the true groups' largest smooth gap is "
                "likely below %.4g (the estimates plus two errors)", self.last["train_release_error"],
                self.last["train_gap_within"])
        return dict(self.last)
