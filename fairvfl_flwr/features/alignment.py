"""Private alignment, the first step of a run whose parties bring their own tables (``tables.own``).

The server relays the PSI messages of data/align.py and learns set sizes only; the
parties keep their keys in their own node state between messages. Four exchanges:

======== ======================================== ======================================
step      to                                       reply
======== ======================================== ======================================
size      every party                              its number of ids, the ids' shape
setup     other parties (leader's set size);       setup (ids blinded with its key);
          the leader                               request (its ids blinded)
respond   other parties (the leader's request)     response; its pass-2 request
intersect the leader (every party's three)         pass-2 setup and responses, the split,
                                                   the labels of the common rows
finish    other parties (pass-2 setup, response,   the digest of its aligned rows
          the split)
======== ======================================== ======================================

No message holds an id in the clear: only blinded ids (P-256 points or their compressed
hashes), counts, the split and labels by row position, and digests. The result is the
run's :class:`ServerLabels`; every party keeps its prepared block on its disk and the
round loop's discovery checks that all hold the same rows.
"""

from __future__ import annotations

import time
from logging import INFO

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.data import align
from fairvfl_flwr.data.partydata import own_table_spec, party_spec
from fairvfl_flwr.data.problem import ServerLabels
from fairvfl_flwr.flower import exchange
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.party import ALIGNED_STATE, run_config

STEP = "align"  # ConfigRecord of a request: the step and its fields
REPLY = "aligned"  # ConfigRecord of a reply
KEYS_STATE = "fairvfl.align-keys"  # a party's PSI keys between two steps, in its own node state
LABELS = "labels"  # ArrayRecord of the leader's last reply: split, y, s


# -- the server ---------------------------------------------------------------------------
def align_tables(grid: Grid, cfg: RunConfig) -> ServerLabels:
    """Run the alignment over ``grid``; return the labels of the aligned rows."""
    timeout, t0 = cfg.round_timeout, time.perf_counter()
    deadline = time.monotonic() + timeout
    while len(list(grid.get_node_ids())) < cfg.num_parties and time.monotonic() < deadline:
        time.sleep(0.5)
    nodes = list(grid.get_node_ids())
    if len(nodes) != cfg.num_parties:
        raise FederationError(f"alignment needs num-parties={cfg.num_parties} nodes, the federation has {len(nodes)}")
    if cfg.num_active != 1:
        raise FederationError(f"tables.own=true needs one label owner (num-active=1), got num-active={cfg.num_active}")

    def send(contents: dict[int, RecordDict]) -> dict[int, Message]:
        out = [Message(c, dst_node_id=nid, message_type=msgs.ALIGN, group_id="align") for nid, c in contents.items()]
        replies = exchange.exchange(grid, out, timeout, cfg.round_retries, lambda nid: f"node {nid}")
        return {r.metadata.src_node_id: r for r in replies}

    sizes = {nid: _reply(r) for nid, r in send({nid: _step("size") for nid in nodes}).items()}
    pid = {nid: int(r["partition-id"]) for nid, r in sizes.items()}
    leader = [nid for nid, r in sizes.items() if r["role"] == msgs.ROLE_ACTIVE]
    if len(leader) != 1:
        raise FederationError(f"alignment needs exactly one active party (the label owner), found {len(leader)}")
    lead = leader[0]
    others = [nid for nid in nodes if nid != lead]
    n_lead = int(sizes[lead]["n"])
    first = send({**{nid: _step("setup", **{"n-client": n_lead}) for nid in others}, lead: _step("request")})
    request = _reply(first[lead])["request"]
    second = send({nid: _step("respond", request=request) for nid in others})
    fields: dict = {}
    for nid in others:
        k = pid[nid]
        fields.update({f"n-{k}": int(sizes[nid]["n"]), f"pattern-{k}": str(sizes[nid]["pattern"]),
                       f"setup-{k}": _reply(first[nid])["setup"], f"response-{k}": _reply(second[nid])["response"],
                       f"request-{k}": _reply(second[nid])["request"]})
    result = send({lead: _step("intersect", parties=[pid[n] for n in others], **fields)})[lead]
    common = _reply(result)
    arrays = result.content.array_records[LABELS]
    split = arrays["split"].numpy()
    done = send({nid: RecordDict({STEP: ConfigRecord({"step": "finish", "setup": common["setup"],
                                                      "response": common[f"response-{pid[nid]}"]}),
                                  LABELS: msgs.array_record(split=split)}) for nid in others})
    for nid, reply in done.items():
        if _reply(reply)["digest"] != common["digest"]:
            raise FederationError(f"party {pid[nid]} aligned other rows than the label owner (digest "
                                  f"{_reply(reply)['digest']} != {common['digest']}); refused before round 1")
    used = split[split != align.UNUSED_CODE]
    y, s = arrays["y"].numpy(), arrays["s"].numpy()
    tr, te = used == align.TRAIN_CODE, used == align.TEST_CODE
    labels = ServerLabels(y_train=y[tr].astype(np.int8), s_train=s[tr], y_test=y[te].astype(np.int8), s_test=s[te],
                          protected_label=int(common["protected-label"]), ids_digest=str(common["digest"]))
    log(INFO, "FairVFL: private alignment: %s ids per party, %d common (%d train, %d %s) in %.1f s",
        {pid[n]: int(r["n"]) for n, r in sorted(sizes.items(), key=lambda kv: pid[kv[0]])}, len(split),
        int(tr.sum()), int(te.sum()), "validation" if cfg.validation_fraction > 0 else "test",
        time.perf_counter() - t0)
    return labels


def _step(step: str, **fields) -> RecordDict:
    return RecordDict({STEP: ConfigRecord({"step": step, **fields})})


def _reply(message: Message) -> ConfigRecord:
    return message.content.config_records[REPLY]


# -- the parties ------------------------------------------------------------------------------
def handle(message: Message, context: Context) -> Message:
    """One step of the alignment on this party's side (see the module doc)."""
    cfg = run_config(tuple(sorted(context.run_config.items())))
    spec = own_table_spec(party_spec(context.node_config, cfg.num_parties, cfg.num_active), cfg)
    rc = message.content.config_records[STEP]
    step = str(rc["step"])
    keys = context.state.config_records.get(KEYS_STATE) or ConfigRecord()
    out: dict = {}
    arrays = None
    if step == "size":
        out = {**align.size_step(spec), "role": spec.role, "partition-id": spec.partition_id}
        context.state.config_records.pop(ALIGNED_STATE, None)  # a new alignment: the old block no longer counts
    elif step == "setup":
        ids, _ = align.own_table(spec)
        out["setup"], keys["server"] = align.psi_setup(ids, int(rc["n-client"]))
    elif step == "request":
        ids, _ = align.own_table(spec)
        out["request"], keys["client"] = align.psi_request(ids)
    elif step == "respond":
        ids, _ = align.own_table(spec)
        out["response"] = align.psi_response(rc["request"], keys["server"])
        out["request"], keys["client"] = align.psi_request(ids)
    elif step == "intersect":
        peers = [align.Peer(k, int(rc[f"n-{k}"]), str(rc[f"pattern-{k}"]), rc[f"setup-{k}"], rc[f"response-{k}"],
                            rc[f"request-{k}"]) for k in rc["parties"]]
        common = align.leader_step(spec, cfg, peers, keys["client"])
        out = {"setup": common.setup, "digest": common.digest, "protected-label": common.protected_label,
               **{f"response-{k}": r for k, r in common.responses.items()}}
        arrays = msgs.array_record(split=common.split, y=common.y.astype(np.int8), s=common.s)
        context.state.config_records[ALIGNED_STATE] = ConfigRecord({"key": common.key})
    elif step == "finish":
        split = message.content.array_records[LABELS]["split"].numpy()
        member, key = align.member_step(spec, cfg, rc["setup"], rc["response"], split, keys["client"])
        out = {"digest": member.ids_digest}
        context.state.config_records[ALIGNED_STATE] = ConfigRecord({"key": key})
    else:
        raise ValueError(f"{spec.name}: unknown alignment step {step!r}")
    if step in ("intersect", "finish"):  # the keys are done with: forget them
        context.state.config_records.pop(KEYS_STATE, None)
    else:
        context.state.config_records[KEYS_STATE] = keys
    content = RecordDict({REPLY: ConfigRecord(out)})
    if arrays is not None:
        content[LABELS] = arrays
    return Message(content, reply_to=message)


def register(app: ClientApp) -> None:
    app.query(msgs.ALIGN.split(".", 1)[1])(handle)
