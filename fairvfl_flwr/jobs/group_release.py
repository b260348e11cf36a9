"""The group release: a registry gives the server each row's group through randomized response, once per run.

Run config ``groups.holder = "registry"``: a party of its own (in simulation the last one,
a feature holder) holds the sensitive column, and neither the label owner nor the server
holds it. Before the rounds, the server finds the registry (its ``query.info`` reply says
``holds-groups``) and asks it, in one ``query.groups_release`` message, for the release at
ε_S (``groups.epsilon-s``). The registry answers with each training and test row's group
through k-ary randomized response (core/constraints/release.py), drawn from its own secret:

* it refuses an ε_S other than its run config's, and any mechanism but randomized response;
* each row's draw is a keyed hash of its secret, the row's id, ε_S and the groups
  (core/constraints/release.row_draws), so a second request (a retry, a resumed run, a
  fresh run, other aligned rows, another split or order) gets the row's same value:
  nothing to average;
* a release at another ε_S (or under another secret) draws afresh, so releases compose:
  its lifetime ledger on its own disk (secure/ledger.py) records every distinct release
  and refuses one that takes the sum of their ε_S past its node config's
  ``release-epsilon`` (0: the ε_S of its first release, the only one it ever makes). A
  fresh run does not reset the ledger.

The server checks the reply (one code per row, within the groups, the ε_S it asked) and
continues with :class:`~fairvfl_flwr.data.problem.ServerLabels` whose groups are the
release, with its flip rates: every gap, ν weight, stop rule and metric it computes is the
corrected estimate for the true groups. Everything any role derives from the release is
post-processing of it, so each row's true group stays ε_S-locally private against all of
them, a lying server included (docs/privacy.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.config.node import NodeConfigError
from fairvfl_flwr.core.constraints import SensitiveGroups
from fairvfl_flwr.core.constraints.release import RANDOMIZED_RESPONSE, RandomizedResponse, ReleaseMargin, row_draws
from fairvfl_flwr.core.errors import ConfigError
from fairvfl_flwr.data.problem import ServerLabels
from fairvfl_flwr.flower import exchange
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.arrays import to_numpy
from fairvfl_flwr.flower.discovery import discover_nodes
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.jobs import Job
from fairvfl_flwr.flower.party import Handles, PartyRuntime, handlers
from fairvfl_flwr.secure import ledger
from fairvfl_flwr.flower.records import array_records, config_records

#: The node state record of a simulated registry's secret (a deployed one reads its release-secret file).
SECRET_STATE = "fairvfl.registry-secret"
#: The fewest bytes a registry's secret may have.
SECRET_BYTES = 32

#: The registry's release of every training and test row's group, noisy, once per run.
GROUPS_RELEASE = "query.groups_release"
#: The registry's lifetime ledger's kind of its releases (secure/ledger.py): their ε_S add up.
LEDGER_KIND = "groups-randomized-response"


# -- the server's side -------------------------------------------------------------------
def release_groups(grid: Grid, cfg: RunConfig, labels: ServerLabels) -> ServerLabels:
    """``labels`` with their groups replaced by the registry's release at ``groups.epsilon-s``
    (training and test rows), the release's flip rates and the run's bound on its error
    (``groups.release-margin``); refuses a federation with no
    registry or with several, and a release that does not fit the rows or the request."""
    node_id, who = find_registry(grid, cfg, labels.ids_digest, "its groups are asked for")
    request = ConfigRecord({"mechanism": cfg.groups_release, "epsilon-s": float(cfg.groups_epsilon_s)})
    ask = Message(RecordDict({"release": request}), dst_node_id=node_id, message_type=GROUPS_RELEASE,
                  group_id="groups")
    reply = exchange.exchange(grid, [ask], cfg.round_timeout, cfg.round_retries, lambda nid: who)[0]
    rr, train, test, names = _checked(reply, request, who, len(labels.y_train), len(labels.y_test))
    log(INFO, "FairVFL: %s released the groups of %d training and %d test rows by %s at epsilon_S=%g: each row keeps "
        "its group with probability %.3f; the server corrects every group figure for the flip rates",
        who, len(train), len(test), cfg.groups_release, rr.epsilon, rr.keep)
    # without a fairness term nothing is held: no spread gap either, nor a margin the model card could claim
    margin = (ReleaseMargin(cfg.groups_release_margin, cfg.epsilon) if cfg.groups_release_margin > 0 and cfg.fairness
              else None)
    return dataclasses.replace(labels, s_train=train, s_test=test, group_names=names, release=rr, margin=margin)


def find_registry(grid: Grid, cfg: RunConfig, ids_digest: str, before: str) -> tuple[int, str]:
    """The registry's node id and how errors name it: the one party whose ``query.info`` reply says
    it holds the groups, on the same rows as the server (``ids_digest``); refused otherwise,
    ``before`` saying what the refusal comes before."""
    nodes = discover_nodes(grid, cfg.num_parties, cfg.round_timeout, "the group release")
    asked = [Message(RecordDict(), dst_node_id=nid, message_type=msgs.INFO, group_id="groups") for nid in nodes]
    infos = exchange.exchange(grid, asked, cfg.round_timeout, cfg.round_retries, lambda nid: f"node {nid}")
    holders = [r for r in infos if config_records(r.content)["info"].get("holds-groups", False)]
    if len(holders) != 1:
        raise FederationError(f"groups.holder='registry' needs exactly one registry among the {len(nodes)} parties, "
                              f"found {len(holders)} (the registry is the party that holds the sensitive column)")
    info = config_records(holders[0].content)["info"]
    who = f"the registry (node {holders[0].metadata.src_node_id}, partition {info['partition-id']})"
    if str(info["ids-digest"]) != ids_digest:
        raise FederationError(f"{who} holds other rows than the server (row id digest {info['ids-digest']}, the "
                              f"server's {ids_digest}); refused before {before}")
    return holders[0].metadata.src_node_id, who


def _checked(reply: Message, request: ConfigRecord, who: str, n_train: int,
             n_test: int) -> tuple[RandomizedResponse, np.ndarray, np.ndarray, tuple[str, ...]]:
    """The release in ``reply``, refused unless it is what was asked for: the mechanism and ε_S,
    two or more named groups, one code per training and test row within them."""
    said = config_records(reply.content).get("release")
    arrays = array_records(reply.content).get("codes")
    if said is None or arrays is None or "train" not in arrays or "test" not in arrays:
        raise FederationError(f"{who}: its reply holds no release")
    if str(said["mechanism"]) != str(request["mechanism"]) or float(said["epsilon-s"]) != float(request["epsilon-s"]):
        raise FederationError(f"{who} released by {said['mechanism']} at epsilon_S={said['epsilon-s']}, the run asked "
                              f"for {request['mechanism']} at {request['epsilon-s']}")
    names = tuple(str(n) for n in said["names"])
    if len(names) < 2 or len(set(names)) != len(names):
        raise FederationError(f"{who}: a release needs two or more distinct groups, got {list(names)}")
    out = []
    for split, rows in (("train", n_train), ("test", n_test)):
        codes = to_numpy(arrays[split])
        if codes.shape != (rows,) or not np.issubdtype(codes.dtype, np.integer):
            raise FederationError(f"{who}: its {split} release has shape {codes.shape} and dtype {codes.dtype}, "
                                  f"expected {rows} integer codes")
        if rows and (codes.min() < 0 or codes.max() >= len(names)):
            raise FederationError(f"{who}: its {split} release holds codes outside 0..{len(names) - 1}")
        out.append(codes.astype(np.int64))
    return RandomizedResponse(float(request["epsilon-s"]), len(names)), out[0], out[1], names


# -- the registry's side -----------------------------------------------------------------
def release(message: Message, context: Context) -> Message:
    """Release every training and test row's group by randomized response at the ε_S asked for,
    once it is checked against this registry's own settings."""
    rt = PartyRuntime(context)
    held = rt.data.held
    if held is None:
        raise FederationError(f"{rt.who}: asked to release the groups, but this party holds no sensitive column")
    asked = config_records(message.content).get("release", ConfigRecord())
    mechanism, epsilon = str(asked.get("mechanism", "")), float(asked.get("epsilon-s", 0.0))
    if mechanism != RANDOMIZED_RESPONSE:
        raise ConfigError(f"{rt.who}: asked to release the groups by {mechanism!r}; this registry releases them by "
                          f"{RANDOMIZED_RESPONSE} only")
    own, bound = rt.cfg.groups_epsilon_s, rt.node.release_epsilon
    if epsilon != own or (bound > 0 and epsilon > bound):
        limit = f" and its node config release-epsilon={bound:g}" if bound > 0 else ""
        raise ConfigError(f"{rt.who}: asked to release the groups at epsilon_S={epsilon:g}; its run config says "
                          f"groups.epsilon-s={own:g}{limit}: refused")
    rr = RandomizedResponse(epsilon, len(held.names))
    if held.ids_train is None or held.ids_test is None:
        raise FederationError(f"{rt.who}: its aligned block keeps no row ids (prepared by an older version), and its "
                              "release is drawn per row id: align again (reliability or tables.own: a fresh alignment)")
    secret = _secret(rt, context)
    with ledger.opened(context, rt.node, rt.who) as book:
        made = book.releases(LEDGER_KIND)
        limit = bound if bound > 0 else next(iter(made.values()), epsilon)
        fingerprint = hashlib.sha256(secret).hexdigest()[:16]
        book.release(LEDGER_KIND, f"epsilon-s={epsilon!r} groups={','.join(held.names)} secret={fingerprint}",
                     epsilon, limit, f"its groups at epsilon_S={epsilon:g}")
    codes = {"train": (held.train, held.ids_train), "test": (held.test, held.ids_test)}
    released = {split: rr.apply(SensitiveGroups.of(s, held.names).codes, *row_draws(secret, ids, rr)).astype(np.int32)
                for split, (s, ids) in codes.items()}
    said = ConfigRecord({"mechanism": mechanism, "epsilon-s": epsilon, "names": list(held.names)})
    return Message(RecordDict({"release": said, "codes": msgs.array_record(**released)}), reply_to=message)


def _secret(rt: PartyRuntime, context: Context) -> bytes:
    """The registry's own secret: its node config's release-secret file; in simulation one drawn
    for the run and kept in the node's state. A deployed registry without its file is refused:
    a fresh draw per request would let a server average releases."""
    path = rt.node.release_secret
    if path:
        try:
            secret = Path(path).expanduser().read_bytes()
        except OSError as exc:
            raise NodeConfigError(f"{rt.who}: node config release-secret={path!r} cannot be read ({exc})") from None
        if len(secret) < SECRET_BYTES:
            raise NodeConfigError(f"{rt.who}: node config release-secret={path!r} holds {len(secret)} bytes, at least "
                                  f"{SECRET_BYTES} are needed (e.g. head -c 32 /dev/urandom > {path})")
        return secret
    if rt.node.deployed:
        raise NodeConfigError(f"{rt.who}: a deployed registry needs node config release-secret (a file of "
                              f"{SECRET_BYTES}+ random bytes made on its machine)")
    kept = config_records(context.state).get(SECRET_STATE)
    if kept is None:
        kept = ConfigRecord({"secret": os.urandom(SECRET_BYTES).hex()})
        config_records(context.state)[SECRET_STATE] = kept
    return bytes.fromhex(str(kept["secret"]))


#: The group release: its one message type, answered by the registry (run inside training).
JOB = Job("group release", handlers({GROUPS_RELEASE: Handles(msgs.Kind.SETUP, release)}))
