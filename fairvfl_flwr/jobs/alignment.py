"""Private alignment, the first step of a run whose parties bring their own tables (``tables.own``).

The server relays the PSI messages of data/psi.py and learns no id: set sizes, the
ids' shape (digits, letters), the number of common rows and their labels and split by
position (data/psi.py says what each role learns); the parties keep their keys in their own node state between messages. The steps,
each its own message type (declared below, :data:`ALIGN_STEPS`) and its own function on a party's side (:data:`STEPS`):

===================== =========================================== ======================================
message type           to                                          reply
===================== =========================================== ======================================
query.align_size       every party                                 its number of ids, the ids' shape
query.align_blind      every party                                 its ids blinded with its key (the
                                                                   others' in a secret order)
query.align_raise      other parties (the leader's blinded ids)    the leader's ids raised to its key
query.align_intersect  the leader, as few times as                 the last: the split, the labels of the
                       :data:`INTERSECT_BUDGET` allows (several    common rows, each party's common
                       parties' blinded ids and raisings of the    positions; the others: nothing (the
                       leader's each)                              leader keeps which of its ids every
                                                                   party so far holds, and where)
query.align_finish     other parties (their common positions,      the digest of its aligned rows
                       the split)
query.align_reuse      every party, instead of blind ...           the alignment it kept of these tables
                       finish, when every party kept the same      (its digest; the leader's: the labels)
                       alignment of these tables
===================== =========================================== ======================================

An intersect message carries as many parties' lists as fit in :data:`INTERSECT_BUDGET`
bytes (33 bytes an id, twice: a party and a leader of 1M ids each make 66 MB, which go
alone): a message holds at most the budget or one party's lists, whatever the number of
parties. A message round costs every deployed party a process start, so with all lists
under the budget (Adult: a few MB) the alignment is five message rounds: size, blind,
raise, intersect, finish. The last intersect message is refused unless every other party's
lists came in this session.

Every list a party acts on is signed by the party that made it, with the identity key
secure aggregation pins (node config ``identity-key``, ``peers``; demo keys in simulation
only: a deployed party without both refuses, ``allow-unmasked`` or not), over the session
the server opened at ``size``, the step and a SHA-256 digest of the list: each party's size
answer (its count, its kept alignment or why it has none; the leader and, on reuse, every
party check it), the leader's blinded ids (which the others raise), each party's blinded
and raised lists (which the leader intersects), and each party's common positions and split
(which it keeps). A party refuses anything else, naming the step, so a server cannot have a
party raise ids of its own choosing (a dictionary test of the party's ids) or hand it
positions the leader never sent.

The server chooses the session, so a party takes part in each one once: ``size`` records it
on the party's disk (next to its kept alignments, :func:`psi.claim_session`) and a session
it already took part in is refused, in this run or a later one; only a re-sent ``size`` of
the session in progress gets the answer it already got. A replayed session would otherwise
tell the server, whenever it asks, whether a party's table changed, and let it relay a
label owner's old signatures of a kept alignment that label owner no longer holds. A kept
alignment is taken up only under the peers file (its SHA-256) and the label owner's pinned
key it was made under.

No message holds an id in the clear: only blinded ids (P-256 points), counts, positions
in a party's secretly shuffled list, the split and labels by row position, and digests.
The result is the run's :class:`ServerLabels`; every party keeps its prepared block on its
disk and the round loop's discovery checks that all hold the same rows.

A scoring job (``mode = "score"``) with ``tables.own`` runs the same steps over the
parties' score files (:func:`align_score_rows`): no split, no labels; each party keeps the
common ids of its own file in its node state and scores only those rows.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import secrets
import time
from logging import ERROR, INFO
from pathlib import Path

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.config.node import NodeConfig
from fairvfl_flwr.data import psi
from fairvfl_flwr.data.own_table import id_pattern
from fairvfl_flwr.data.partydata import NodeConfigError, PartySpec, own_table_spec, party_spec
from fairvfl_flwr.data.preflight import Rules, check_party
from fairvfl_flwr.data.encoding import score_file
from fairvfl_flwr.data.problem import ServerLabels, group_options
from fairvfl_flwr.data.tables import ids_digest
from fairvfl_flwr.flower import exchange
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.arrays import to_numpy
from fairvfl_flwr.flower.jobs import Job
from fairvfl_flwr.flower.discovery import discover_nodes
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.party import ALIGNED_STATE, SCORE_COMMON_STATE, Handles, PartyRuntime, handlers
from fairvfl_flwr.flower.progress import Estimate, Progress, Step
from fairvfl_flwr.secure import identity
from fairvfl_flwr.flower.records import array_records, config_records

STEP = "align"  # ConfigRecord of a request: the step's fields (its message type says which step)
REPLY = "aligned"  # ConfigRecord of a reply
KEYS_STATE = "fairvfl.align-keys"  # a party's PSI key between two steps, in its own node state
HITS_STATE = "fairvfl.align-hits"  # the leader's: its ids every party so far holds, where in each party's list
ORDER_STATE = "fairvfl.align-order"  # another party's: the secret order of its blinded ids
SIZE_STATE = "fairvfl.align-size"  # a party's signed size answer of the session in progress (a re-sent size gets it)
LABELS = "labels"  # ArrayRecord of the leader's last reply: split, y, s
POSITIONS = "positions"  # ArrayRecord: each party's common positions (leader's reply: by partition id)

# One message type a step (blinded ids, counts); every party answers each but the leader's
# intersect, which the leader answers alone.
ALIGN_SIZE = "query.align_size"  # every party: its number of ids and their shape
ALIGN_BLIND = "query.align_blind"  # every party: its ids blinded with its own key
ALIGN_RAISE = "query.align_raise"  # every other party: the leader's blinded ids raised to its key
# the leader, as few times as a byte budget allows: which of its ids each party holds; the last also
# the common rows (training: their split and labels)
ALIGN_INTERSECT = "query.align_intersect"
ALIGN_FINISH = "query.align_finish"  # every other party: its common rows
ALIGN_REUSE = "query.align_reuse"  # instead of the PSI, every party: take up the alignment it kept of these tables
ALIGN_STEPS = (ALIGN_SIZE, ALIGN_BLIND, ALIGN_RAISE, ALIGN_INTERSECT, ALIGN_FINISH, ALIGN_REUSE)


# -- the server ---------------------------------------------------------------------------
#: Bytes of parties' lists (blinded ids and raisings of the leader's, 33 bytes an id each) one
#: intersect message carries at most; a party whose lists alone are more goes alone, as every
#: party did before lists were folded. Flower's gRPC limit (flwr.common.GRPC_MAX_MESSAGE_LENGTH)
#: is 2 GiB: this stays 64 times under it, and under a 1M-id party's 66 MB, which go alone.
INTERSECT_BUDGET = 32 * 2**20


#: The server's time left (flower/progress.py): a kind of step's cost per unit as a multiple of
#: another's, until one of its own is done. Preparing a common row costs about half of reading
#: and checking one (the table is read once, at the size step).
RELATIVE = {"raise": ("blind", psi.RAISE_PER_BLIND), "prepare": ("read", 0.5)}
#: Ids in all before the server times the PSI library on CALIBRATION_IDS of its own, for a time
#: left before the first blinding is done (smaller alignments are over in seconds).
CALIBRATE_FROM = 100_000
CALIBRATION_IDS = 500


def _ids(counts) -> str:
    """Id counts in the log's words: "200,000 ids each" or "1,000/2,000 ids"."""
    counts = list(counts)
    if len(set(counts)) == 1:
        return f"{counts[0]:,} ids" + (" each" if len(counts) > 1 else "")
    return "/".join(f"{c:,}" for c in counts) + " ids"


def fold(sizes: dict[int, int], budget: int) -> list[list[int]]:
    """The parties of ``sizes`` (party: bytes of its lists), in order, in as few consecutive
    messages as keep each within ``budget`` bytes; a party over it alone. At least one message
    (the last finds the common rows, even when the leader is the only party)."""
    batches: list[list[int]] = [[]]
    used = 0
    for party, size in sizes.items():
        if batches[-1] and used + size > budget:
            batches.append([])
            used = 0
        batches[-1].append(party)
        used += size
    return batches


TRAIN, SCORE = "train", "score"  # what is aligned: the training tables, or the files a scoring job scores
UNSCORED_PATH = "unscored-path"  # node config: where a party writes the ids of its score file that are not scored


def align_tables(grid: Grid, cfg: RunConfig) -> ServerLabels:
    """Run the alignment of the training tables over ``grid``; return the labels of the aligned rows."""
    t0 = time.perf_counter()
    passes = _Passes(grid, cfg, TRAIN, discover_nodes(grid, cfg.num_parties, cfg.round_timeout, "alignment"))
    if passes.kept:  # every party holds the same alignment of these tables: no PSI
        signed = {k: v for nid in passes.sizes for k, v in passes.signed_size(nid).items()}
        with passes.progress.step(len(passes.sizes)):
            replies = passes.send(ALIGN_REUSE, {nid: passes.step(digest=passes.kept, **signed)
                                                     for nid in passes.sizes})
        passes.check(replies, ConfigRecord({"digest": passes.kept}))
        result = replies[passes.lead]
        common = _reply(result)
    else:
        common, result, positions = passes.intersect()
    arrays = array_records(result.content)[LABELS]
    split = to_numpy(arrays["split"])
    if not passes.kept:
        with passes.progress.step(len(passes.others)):
            done = passes.send(ALIGN_FINISH, {nid: RecordDict({STEP: ConfigRecord({
                                                                        "purpose": TRAIN, "session": passes.session,
                                                                        "signature": passes.signature(common, nid)}),
                                                                    LABELS: msgs.array_record(split=split),
                                                                    POSITIONS: positions[nid]})
                                                   for nid in passes.others})
        passes.check(done, common)
    used = split[split != psi.UNUSED_CODE]
    y, s = to_numpy(arrays["y"]), to_numpy(arrays["s"])
    tr, te = used == psi.TRAIN_CODE, used == psi.TEST_CODE
    labels = ServerLabels(y_train=y[tr].astype(np.int8), s_train=s[tr], y_test=y[te].astype(np.int8), s_test=s[te],
                          protected_label=int(common["protected-label"]), ids_digest=str(common["digest"]),
                          group_names=tuple(common["group-names"]) if "group-names" in common else None,
                          options=group_options(cfg))
    log(INFO, "FairVFL: private alignment%s: %s ids per party, %d common (%d train, %d %s) in %.1f s",
        f" (kept, {passes.kept}, reused)" if passes.kept else "", passes.sizes_by_partition(), len(split),
        int(tr.sum()), int(te.sum()), "validation" if cfg.validation_fraction > 0 else "test",
        time.perf_counter() - t0)
    return labels


def align_score_rows(grid: Grid, cfg: RunConfig, nodes: list[int]) -> int:
    """Align the files a scoring job scores (each party's own ids) on the job's ``nodes``:
    every party then scores only the rows all of them hold. Returns their number."""
    t0 = time.perf_counter()
    passes = _Passes(grid, cfg, SCORE, nodes)
    common, _, positions = passes.intersect()
    with passes.progress.step(len(passes.others)):
        done = passes.send(ALIGN_FINISH, {nid: RecordDict({STEP: ConfigRecord({"purpose": SCORE,
                                                                "n-common": int(common["n-common"]),
                                                                "session": passes.session,
                                                                "signature": passes.signature(common, nid)}),
                                            POSITIONS: positions[nid]}) for nid in passes.others})
    passes.check(done, common)
    n_common = int(common["n-common"])
    log(INFO, "FairVFL: private alignment of the rows to score: %s ids per party, %d common in %.1f s",
        passes.sizes_by_partition(), n_common, time.perf_counter() - t0)
    dropped = {k: n - n_common for k, n in passes.sizes_by_partition().items() if n > n_common}
    if dropped:  # counts the server knows anyway (each party's size and the common count); the ids stay local
        log(INFO, "FairVFL: ids not held by every party are not scored: %s (a party's node config %s writes its "
            "own to a file on its side)", ", ".join(f"party {k}: {n}" for k, n in dropped.items()), UNSCORED_PATH)
    return int(common["n-common"])


class _Passes:
    """The PSI up to the leader's answer: sizes, blinded lists, raised lists, intersect, common."""

    def __init__(self, grid: Grid, cfg: RunConfig, purpose: str, nodes: list[int]) -> None:
        self.grid, self.cfg, self.purpose = grid, cfg, purpose
        started = time.perf_counter()
        if cfg.num_active != 1:
            raise FederationError(f"tables.own=true needs one label owner (num-active=1), got "
                                  f"num-active={cfg.num_active}")
        self.session = secrets.token_hex(16)  # every signature of this alignment is bound to it
        # the parties' tables are read on this machine in simulation (tables.path, score.path): their work adds up
        self.shared = bool(cfg.tables_path if purpose == TRAIN else cfg.score_path)
        self.progress = Progress("private alignment" if purpose == TRAIN else "private alignment of the rows to score",
                                 Estimate(relative=RELATIVE, steps=[Step("the parties sent their sizes", None,
                                                counts=f"{len(nodes)} parties", doing="waiting for the parties to "
                                                "check their tables and send their sizes")]), started)
        with self.progress.step(len(nodes)):
            self.sizes = {nid: _reply(r) for nid, r in self.send(ALIGN_SIZE, {nid: self.step()
                                                                                    for nid in nodes}).items()}
            self.pid = {nid: int(r["partition-id"]) for nid, r in self.sizes.items()}
            refuse_problems({self.pid[nid]: int(r["problems"]) for nid, r in self.sizes.items() if "problems" in r})
            leader = [nid for nid, r in self.sizes.items() if r["role"] == msgs.ROLE_ACTIVE]
            if len(leader) != 1:
                raise FederationError(f"alignment needs exactly one active party (the label owner), found "
                                      f"{len(leader)}")
            self.lead = leader[0]
            self.others = [nid for nid in nodes if nid != self.lead]
            kept = {str(r.get("kept", "")) for r in self.sizes.values()}
            self.kept = kept.pop() if len(kept) == 1 and "" not in kept else ""
            self.n = {nid: int(r["n"]) for nid, r in self.sizes.items()}
            self.progress.estimate.plan(self.plan())
            self.progress.estimate.priors.update(self.priors())
        if purpose == TRAIN and not self.kept:
            self.why_again()

    def why_again(self) -> None:
        """Log which parties cannot reuse a kept alignment, and why (none of it is an id or a value)."""
        why = {self.pid[n]: str(r["why"]) for n, r in self.sizes.items() if r.get("why")}
        if why:
            log(INFO, "FairVFL: aligning: %s", "; ".join(f"party {k}: {w}" for k, w in sorted(why.items())))
        elif len({str(r.get("kept", "")) for r in self.sizes.values()}) > 1:
            log(INFO, "FairVFL: aligning: the parties keep different alignments (one of them was aligned again "
                "without the others)")

    def step(self, **fields) -> RecordDict:
        """A step's request: its fields and what is aligned (the training tables or the score files)."""
        return RecordDict({STEP: ConfigRecord({"purpose": self.purpose, "session": self.session, **fields})})

    def send(self, message_type: str, contents: dict[int, RecordDict]) -> dict[int, Message]:
        """One alignment step (``message_type``, one of ``STEPS``) to the parties of
        ``contents``; their replies by node."""
        out = [Message(c, dst_node_id=nid, message_type=message_type, group_id="align") for nid, c in contents.items()]
        replies = exchange.exchange(self.grid, out, self.cfg.round_timeout, self.cfg.round_retries,
                                    lambda nid: f"node {nid}", on_reply=self.progress.replied)
        return {r.metadata.src_node_id: r for r in replies}

    def plan(self, batches: list[list[int]] | None = None, common: int | None = None) -> list[Step]:
        """Every step of this alignment with its work (:func:`psi.work_units`, in seconds of one core
        per id): size, then reuse, or blind, raise, the intersect messages (``batches``, else as the
        sizes fold them) and finish (on ``common`` rows, else on as many as the smallest table has)."""
        n, lead = self.n, self.n[self.lead]
        cores = psi.cores()  # the parties' machine in simulation; a stand-in for each party's in a deployment

        def units(lanes: list[list[int]]) -> float:
            return psi.work_units(lanes, cores, self.shared)

        size = Step(f"the parties checked their {'tables' if self.purpose == TRAIN else 'files to score'} and sent "
                    "their sizes", "read",
                    sum(n.values()) if self.shared else max(n.values()), counts=f"{len(n)} parties, {_ids(n.values())}")
        if self.kept:
            return [size, Step("every party took up its kept alignment", None,
                               doing="waiting for the parties to take up their kept alignment")]
        others = [n[o] for o in self.others]
        if batches is None:  # honest lists are as long as the sizes say
            batches = fold({o: psi.POINT * (n[o] + lead) for o in self.others}, INTERSECT_BUDGET)
        common = min(n.values()) if common is None else common
        steps = [size,
                 Step("every party blinded its ids", "blind", units([[k] for k in n.values()]),
                      counts=f"{len(n)} parties, {_ids(n.values())}", doing="waiting for the parties to blind their ids"),
                 Step("the other parties raised the label owner's ids", "raise", units([[lead]] * len(others)),
                      counts=f"{len(others)} × {lead:,} ids",
                      doing="waiting for the other parties to raise the label owner's ids")]
        for i, batch in enumerate(batches):
            whose = (f"part{'ies' if len(batch) > 1 else 'y'} " + ", ".join(str(self.pid[o]) for o in batch)
                     if batch else "no other party")
            found = (", found the common rows" + (" and prepared its block" if self.purpose == TRAIN else "")
                     if i == len(batches) - 1 else "")
            steps.append(Step(f"the label owner matched {whose}{found}", "raise", units([[n[o] for o in batch]]),
                              counts=_ids([n[o] for o in batch]) if batch else "",
                              doing=f"waiting for the label owner to raise and match the lists of {whose}"))
        steps.append(Step("every other party prepared its block on the common rows" if self.purpose == TRAIN
                          else "every other party kept its common rows", "prepare",
                          common * len(others) if self.shared else common, counts=f"{common:,} common rows",
                          doing="waiting for the other parties to take their common rows"))
        return steps

    def replan(self, batches: list[list[int]], common: int | None = None) -> None:
        """The steps from the current one on, now that the intersect messages (and the common rows) are known."""
        self.progress.estimate.plan(self.plan(batches, common)[self.progress.estimate.done:])

    def priors(self) -> dict[str, float]:
        """Seconds of a free core per id (this thread's CPU time) to blind and to raise, timed here
        before a PSI long enough to want a time left before its first step is done (simulation:
        the parties' own machine; a deployment: a stand-in for theirs); none without the PSI
        library."""
        if self.kept or sum(self.n.values()) < CALIBRATE_FROM:
            return {}
        try:
            return psi.cost_per_id(CALIBRATION_IDS, time.thread_time)
        except ImportError:  # a deployment's ServerApp need not have openmined-psi
            return {}

    def intersect(self) -> tuple[ConfigRecord, Message, dict[int, ArrayRecord]]:
        """The leader's common rows: (its reply to the last ``intersect``, that message, each other
        party's common positions). Each intersect message carries as many parties' lists as fit in
        :data:`INTERSECT_BUDGET` bytes (:func:`fold`); the last one also finds the common rows."""
        with self.progress.step(len(self.sizes)):
            blinds = {nid: _reply(r) for nid, r in self.send(ALIGN_BLIND, {nid: self.step()
                                                                                 for nid in self.sizes}).items()}
        with self.progress.step(len(self.others)):
            raised = {nid: _reply(r) for nid, r in self.send(ALIGN_RAISE, {
                nid: self.step(blinded=blinds[self.lead]["blinded"], signature=blinds[self.lead]["signature"])
                for nid in self.others}).items()}
        batches = fold({nid: len(blinds[nid]["blinded"]) + len(raised[nid]["raised"]) for nid in self.others},
                       INTERSECT_BUDGET)
        self.replan(batches)
        for i, batch in enumerate(batches):  # the leader raises the lists of a batch's parties in turn
            last = i == len(batches) - 1
            lists = {k: v for nid in batch for k, v in self.lists(nid, blinds[nid], raised[nid]).items()}
            with self.progress.step(1) as step:
                result = self.send(ALIGN_INTERSECT, {self.lead: self.step(
                    peers=[self.pid[nid] for nid in batch], last=last, **lists)})[self.lead]
                common = self.common_count(result) if last else None
                if common is not None:
                    step.found = f"{common:,} rows common to every party"
                    self.replan(batches, common)
        found = array_records(result.content)[POSITIONS]
        positions = {nid: msgs.array_record(rows=to_numpy(found[str(self.pid[nid])])) for nid in self.others}
        return _reply(result), result, positions

    def common_count(self, result: Message) -> int | None:
        """The number of common rows the leader's last reply says (None: it says none; it is checked later)."""
        if self.purpose == SCORE:
            return int(_reply(result).get("n-common", -1)) if "n-common" in _reply(result) else None
        labels = array_records(result.content).get(LABELS)
        return int(to_numpy(labels["split"]).size) if labels is not None and "split" in labels else None

    def lists(self, nid: int, blind: ConfigRecord, raised: ConfigRecord) -> dict:
        """Party ``nid``'s fields of an intersect message: its size answer, its blinded ids and its
        raising of the leader's, each with its signature, by its partition id."""
        pid = self.pid[nid]
        return {**self.signed_size(nid),
                f"blinded-{pid}": blind["blinded"], f"blind-signature-{pid}": blind["signature"],
                f"raised-{pid}": raised["raised"], f"raise-signature-{pid}": raised["signature"]}

    def signed_size(self, nid: int) -> dict:
        """Party ``nid``'s size answer as it signed it, relayed to a party that acts on it."""
        pid = self.pid[nid]
        return {f"size-{pid}": size_blob(self.sizes[nid]), f"size-signature-{pid}": self.sizes[nid]["signature"]}

    def signature(self, common: ConfigRecord, nid: int) -> bytes:
        """The leader's signature of party ``nid``'s positions (and split), relayed with them."""
        return common[f"signature-{self.pid[nid]}"]

    def check(self, done: dict[int, Message], common: ConfigRecord) -> None:
        for nid, reply in done.items():
            if _reply(reply)["digest"] != common["digest"]:
                raise FederationError(f"party {self.pid[nid]} aligned other rows than the label owner (digest "
                                      f"{_reply(reply)['digest']} != {common['digest']}); refused")

    def sizes_by_partition(self) -> dict[int, int]:
        return {self.pid[n]: int(r["n"]) for n, r in sorted(self.sizes.items(), key=lambda kv: self.pid[kv[0]])}


def refuse_problems(problems: dict[int, int]) -> None:
    """Refuse the run when a party's own check of its table found problems: the server hears
    only how many each party found (no column, no id, no value); the party's log has them."""
    found = {k: n for k, n in sorted(problems.items()) if n > 0}
    if not found:
        return
    each = "; ".join(f"party {k}: {n} problem{'s' if n != 1 else ''}" for k, n in found.items())
    raise FederationError(
        f"the parties' own tables were checked before alignment and the run is refused: {each}. "
        f"{'Each of these parties' if len(found) > 1 else 'Party ' + str(next(iter(found)))} lists its problems "
        "(columns, counts, example rows, the fix) in its own log (its SuperNode's output); it sees the same list on its "
        "own machine with fairvfl-preflight --node-config '<its node config>' and can check its fixes there. "
        "Nothing was aligned or trained and no run folder was written")


def _reply(message: Message) -> ConfigRecord:
    return config_records(message.content)[REPLY]


# -- the parties ------------------------------------------------------------------------------
@dataclasses.dataclass
class _Step:
    """One alignment step on a party's side: what every step reads, and its reply."""

    message: Message
    context: Context
    cfg: RunConfig
    spec: PartySpec
    purpose: str  # TRAIN or SCORE
    keys: ConfigRecord  # this party's PSI key (and the leader's pairwise counts) between steps
    signer: "_Signer"  # its signatures of the lists it sends, its checks of those it acts on
    out: dict = dataclasses.field(default_factory=dict)  # the reply's ConfigRecord
    records: dict = dataclasses.field(default_factory=dict)  # the reply's other records
    done: bool = False  # this party's part of the PSI is over: its key is forgotten

    @property
    def fields(self) -> ConfigRecord:
        return config_records(self.message.content)[STEP]

    @property
    def state(self):
        return self.context.state


#: A party's seconds per id of each kind of its own alignment work so far (its time left).
PACE_STATE = "fairvfl.align-pace"


def _progress(step: _Step, *plan: Step, started: float | None = None) -> Progress:
    """This party's log of a message's work (``plan``), its time left from its own pace in the
    alignment's earlier messages (its node state)."""
    priors = {k: float(v) for k, v in (config_records(step.state).get(PACE_STATE) or {}).items()}
    crypto = max((s.units for s in plan if s.kind in ("blind", "raise")), default=0)
    if crypto >= psi.CHUNK and "blind" not in priors:  # its first PSI work: a free core's cost, timed
        priors.update({kind: seconds / psi.workers(int(crypto))
                       for kind, seconds in psi.cost_per_id(CALIBRATION_IDS, time.thread_time).items()})
    return Progress(f"alignment, party {step.spec.partition_id} ({step.spec.role}), step {step.signer.step!r}",
                    Estimate(plan, priors=priors, relative=RELATIVE), started)


def _keep_pace(step: _Step, progress: Progress) -> None:
    """Keep this party's pace of the message's work, for the time left of its next messages."""
    pace = dict(config_records(step.state).get(PACE_STATE) or {})
    config_records(step.state)[PACE_STATE] = ConfigRecord({**pace, **progress.estimate.measured()})


def _size(step: _Step) -> None:
    """Check this party's own table (training), reply its number of ids and their shape (or
    the alignment it kept of these tables), signed for this session, and forget what an
    earlier alignment left."""
    spec, cfg = step.spec, step.cfg
    started = time.perf_counter()
    kept, why = (None, "")
    if step.purpose == TRAIN:
        kept, why = _kept(step) if cfg.tables_reuse_alignment else (None, "")
    rules = dataclasses.asdict(Rules.of(cfg))
    # a kept alignment's table passed the same check: it is not read again
    report = check_party(spec, Rules.of(cfg)) if step.purpose == TRAIN and (kept or {}).get("rules") != rules else None
    if report is not None and not report.ok:  # the details stay here: the server hears the count
        log(ERROR, "FairVFL: this party's own table, checked before alignment (the server is told only the "
            "number of problems):\n%s", report.text())
        step.out = {"problems": len(report.problems), "role": spec.role, "partition-id": spec.partition_id}
    elif kept is not None:
        step.out = {"n": int(kept["n"]), "pattern": str(kept["pattern"]), "kept": str(kept["digest"]),
                    "role": spec.role, "partition-id": spec.partition_id}
    else:
        step.out = {**psi.size_step(spec), "role": spec.role, "partition-id": spec.partition_id, "why": why}
    # whatever it says (a count, a kept digest, that the table changed) holds only for this session: every
    # party that acts on it checks this signature, so an answer from another session is refused
    step.out["signature"] = step.signer.sign("size", spec.partition_id, size_blob(step.out))
    if step.purpose == TRAIN:
        config_records(step.state).pop(ALIGNED_STATE, None)
    array_records(step.state).pop(SCORE_COMMON_STATE, None)
    array_records(step.state).pop(HITS_STATE, None)
    array_records(step.state).pop(ORDER_STATE, None)
    step.keys = ConfigRecord({"session": step.signer.session})
    config_records(step.state)[SIZE_STATE] = ConfigRecord({**step.out, "session": step.signer.session})
    config_records(step.state).pop(PACE_STATE, None)  # a new alignment: its pace is measured afresh
    if "n" in step.out:
        n = int(step.out["n"])
        what = "its file to score" if step.purpose == SCORE else "its table"
        progress = _progress(step, Step(f"checked {what}" if kept is None else "holds a kept alignment of its table",
                                        "read", n if kept is None else 0, counts=f"{n:,} ids"), started=started)
        progress.finish(why)
        _keep_pace(step, progress)


#: The fields of a party's size answer that it signs (:func:`size_blob`).
SIZE_FIELDS = ("n", "pattern", "kept", "why", "problems", "role", "partition-id")


def size_blob(answer) -> bytes:
    """What a party signs of its size answer (``answer``: its reply's fields), in one canonical form
    that the server relays and every party that acts on the answer checks."""
    return json.dumps({k: answer[k] for k in SIZE_FIELDS if k in answer}, sort_keys=True).encode()


def _signed_size(step: _Step, peer: int) -> dict:
    """Party ``peer``'s size answer of this session, once its signature checks out."""
    blob = step.fields.get(f"size-{peer}", b"")
    step.signer.verify("size", peer, blob, step.fields.get(f"size-signature-{peer}", b""),
                       f"party {peer}'s size answer and kept-alignment digest")
    return json.loads(bytes(blob))


def _kept(step: _Step) -> tuple[dict | None, str]:
    """This party's kept alignment of its table, or None and why not: one kept under another peers
    file or another label owner's identity key is not taken up (the parties it was agreed with may
    not be this federation's)."""
    kept, why = psi.kept_alignment(step.spec, step.cfg)
    if kept is None:
        return None, why
    if "peers" not in kept:
        return None, "its kept alignment is bound to no peers file (kept by an earlier version)"
    if kept.get("leader") != step.signer.leader_key:
        return None, "its kept alignment was made with another label owner (another pinned identity key for party 0)"
    if kept["peers"] != step.signer.peers_digest:
        return None, "its kept alignment was made under another peers file (node config peers)"
    return kept, ""


def _blind(step: _Step) -> None:
    """This party's ids blinded with a new key: the leader's in its row order, the others' shuffled."""
    ids, _ = psi.own_table(step.spec)
    shuffle = step.spec.role != msgs.ROLE_ACTIVE
    progress = _progress(step, Step("blinded its ids with a fresh key" + (", in a secret order" if shuffle else ""),
                                    "blind", len(ids), counts=f"{len(ids):,} ids", doing="blinding its ids"))
    with progress.step():
        step.out["blinded"], step.keys["key"], order = psi.blind_step(ids, shuffle, progress.advance)
    _keep_pace(step, progress)
    step.out["signature"] = step.signer.sign("blind", step.spec.partition_id, step.out["blinded"])
    if order is not None:
        array_records(step.state)[ORDER_STATE] = msgs.array_record(order=order)


def _raise(step: _Step) -> None:
    """The leader's blinded ids raised to this party's key: only the leader's own list, signed
    for this session (no dictionary test of this party's ids)."""
    rc = step.fields
    step.signer.verify("blind", LEADER, rc["blinded"], rc.get("signature", b""), "the label owner's blinded ids")
    n = len(rc["blinded"]) // psi.POINT
    progress = _progress(step, Step("raised the label owner's blinded ids to its key", "raise", n,
                                    counts=f"{n:,} ids", doing="raising the label owner's blinded ids"))
    with progress.step():
        step.out["raised"] = psi.psi_raise(rc["blinded"], step.keys["key"], progress.advance)
    _keep_pace(step, progress)
    step.out["signature"] = step.signer.sign("raise", step.spec.partition_id, step.out["raised"])


def _intersect(step: _Step) -> None:
    """The leader with the parties whose lists this message carries: keep which of its ids each
    holds too, and where; the last message: the common rows too (:func:`_common`)."""
    ids, _ = psi.own_table(step.spec)
    peers = [int(peer) for peer in step.fields.get("peers", [])]
    last = bool(step.fields.get("last", False))
    sizes = {peer: len(step.fields.get(f"blinded-{peer}", b"")) // psi.POINT for peer in peers}
    plan = [Step(f"matched party {peer}", "raise", sizes[peer], counts=f"{sizes[peer]:,} ids",
                 doing=f"raising party {peer}'s blinded ids") for peer in peers]
    if last:
        plan.append(Step("found the rows every party holds" + (" and prepared its block on them"
                                                                if step.purpose == TRAIN else ""), "prepare", len(ids),
                         doing="finding the common rows"))
    progress = _progress(step, *plan)
    for peer in peers:
        with progress.step():
            found = _match(step, ids, peer, progress.advance)
            progress.found = f"{found:,} of its {len(ids):,} ids also party {peer}'s"
    if last:
        with progress.step():
            progress.found = f"{_common(step, ids):,} rows common to every party"
    _keep_pace(step, progress)


def _match(step: _Step, ids: np.ndarray, peer: int, done=None) -> int:
    """The leader with party ``peer``: its lists, once the party's signatures of them check out
    (``done(k)``: k more of its ids are raised); how many of the leader's ids it holds."""
    rc = step.fields
    blinded, raised = rc.get(f"blinded-{peer}", b""), rc.get(f"raised-{peer}", b"")
    step.signer.verify("blind", peer, blinded, rc.get(f"blind-signature-{peer}", b""), f"party {peer}'s blinded ids")
    step.signer.verify("raise", peer, raised, rc.get(f"raise-signature-{peer}", b""),
                       f"party {peer}'s raising of this party's ids")
    size = _signed_size(step, peer)
    found = psi.peer_positions(step.spec, ids, peer, int(size.get("n", -1)), str(size.get("pattern", "")), blinded,
                               raised, step.keys["key"], done)
    step.keys[f"pairwise-{peer}"] = int((found >= 0).sum())  # |leader ∩ party|, for a refusal's message
    kept = array_records(step.state).get(HITS_STATE)
    held = {k: to_numpy(v) for k, v in kept.items()} if kept is not None else {"hits": np.ones(len(ids), bool)}
    held["hits"] = held["hits"] & (found >= 0)
    held[f"at-{peer}"] = found
    array_records(step.state)[HITS_STATE] = msgs.array_record(**held)
    return int(step.keys[f"pairwise-{peer}"])


def _common(step: _Step, ids: np.ndarray) -> int:
    """The leader, once every other party's lists came: the rows every party holds, and where
    each party has them; in training, the split and the labels of those rows, and its own
    prepared block. Returns their number."""
    record = array_records(step.state).pop(HITS_STATE, None)  # none: the leader is the only party
    at = {int(k.split("-", 1)[1]): to_numpy(v) for k, v in (record.items() if record else []) if k.startswith("at-")}
    missing = sorted(set(range(step.cfg.num_parties)) - {step.spec.partition_id} - set(at))
    if missing:  # a server that leaves a party out would have the leader agree on rows that party never matched
        raise FederationError(f"{step.spec.name}: alignment step 'intersect': the lists of part"
                              f"{'ies' if len(missing) > 1 else 'y'} {', '.join(map(str, missing))} never came in "
                              "this alignment; refused")
    step.done = True
    hits = np.ones(len(ids), dtype=bool) if record is None else to_numpy(record["hits"])
    pairwise = {int(k.split("-", 1)[1]): int(v) for k, v in step.keys.items() if k.startswith("pairwise-")}
    rows = psi.agreed_rows(ids, hits, pairwise, step.cfg.tables_min_common if step.purpose == TRAIN else 1)
    found = {str(pid): np.sort(v[rows]) for pid, v in at.items()}
    step.records[POSITIONS] = msgs.array_record(**found)
    if step.purpose == SCORE:
        step.out = {"n-common": len(rows), "digest": _keep_score_ids(step.context, ids[rows], ids)}
        _sign_positions(step, found, None)
        return len(rows)
    common = psi.leader_step(step.spec, step.cfg, rows)
    step.out = {"digest": common.digest, "protected-label": common.protected_label}
    if common.group_names:  # the server names the groups by their values (two groups: a's, then b's)
        step.out["group-names"] = list(common.group_names)
    step.records[LABELS] = msgs.array_record(split=common.split, y=common.y.astype(np.int8), s=common.s)
    config_records(step.state)[ALIGNED_STATE] = ConfigRecord({"key": common.key})
    _keep(step, ids, common.key, {"split": common.split, "y": common.y.astype(np.int8), "s": common.s})
    _sign_positions(step, found, common.split)
    return len(rows)


def _sign_positions(step: _Step, found: dict[str, np.ndarray], split: np.ndarray | None) -> None:
    """The leader signs each party's positions (and the split) for that party."""
    step.out.update({f"signature-{pid}": step.signer.sign("positions", int(pid), _positions_blob(rows, split))
                     for pid, rows in found.items()})


def _finish(step: _Step) -> None:
    """Another party: its common rows, from their positions in its shuffled list; in training,
    its prepared block on them."""
    ids, _ = psi.own_table(step.spec)
    positions = to_numpy(array_records(step.message.content)[POSITIONS]["rows"])
    split_in = to_numpy(array_records(step.message.content)[LABELS]["split"]) if step.purpose == TRAIN else None
    step.signer.verify("positions", step.spec.partition_id, _positions_blob(positions, split_in),
                       step.fields.get("signature", b""), "this party's common positions", signer_pid=LEADER)
    order = to_numpy(array_records(step.state).pop(ORDER_STATE)["order"])
    step.done = True
    progress = _progress(step, Step("kept its common rows" if step.purpose == SCORE else
                                    "prepared its block on the common rows", "prepare", len(positions),
                                    counts=f"{len(positions):,} of its {len(ids):,} ids are common to every party",
                                    doing="preparing its block on the common rows"))
    with progress.step():
        if step.purpose == SCORE:
            rows = psi.my_common_rows(step.spec, ids, positions, order, int(step.fields["n-common"]))
            step.out = {"digest": _keep_score_ids(step.context, ids[rows], ids)}
            return
        split = to_numpy(array_records(step.message.content)[LABELS]["split"])
        member, key = psi.member_step(step.spec, step.cfg, positions, order, split)
        step.out = {"digest": member.ids_digest}
        config_records(step.state)[ALIGNED_STATE] = ConfigRecord({"key": key})
        _keep(step, ids, key)
        progress.found = f"{member.n_train:,} training and {member.n_test:,} evaluation rows"


def _reuse(step: _Step) -> None:
    """Every party holds the same kept alignment of these tables: take it up again (no PSI),
    once every party's size answer of this session, signed, names that digest."""
    kept, why = _kept(step)
    if kept is None or str(kept["digest"]) != str(step.fields["digest"]):
        changed = why or "another digest"
        raise FederationError(f"{step.spec.name}: its kept alignment changed since the run began ({changed}); "
                              "submit the run again")
    digest = str(kept["digest"])
    for peer in range(step.cfg.num_parties):  # a server's word that all kept this alignment is not enough
        if _signed_size(step, peer).get("kept") != digest:
            raise FederationError(f"{step.spec.name}: alignment step 'reuse': party {peer}'s signed size answer of "
                                  "this session names no or another kept alignment; refused")
    step.done = True
    config_records(step.state)[ALIGNED_STATE] = ConfigRecord({"key": str(kept["key"])})
    step.out = {k: kept[k] for k in ("digest", "protected-label", "group-names") if k in kept}
    if kept.get("labels"):
        step.records[LABELS] = msgs.array_record(**psi.kept_labels(step.spec, step.cfg))
    _progress(step, Step("took up its kept alignment", None, counts=f"{int(kept['n']):,} ids")).finish()


#: Each alignment message type and the step that answers it on a party's side.
STEPS = {ALIGN_SIZE: _size, ALIGN_BLIND: _blind, ALIGN_RAISE: _raise,
         ALIGN_INTERSECT: _intersect, ALIGN_FINISH: _finish, ALIGN_REUSE: _reuse}


def handle(message: Message, context: Context) -> Message:
    """One step of the alignment on this party's side, by its message type (:data:`STEPS`)."""
    rt = PartyRuntime(context)
    cfg = rt.cfg  # a scoring job's, with its model's training settings
    spec = own_table_spec(party_spec(rt.node, cfg.num_parties, cfg.num_active, registry=cfg.registry), cfg)
    purpose = str(config_records(message.content)[STEP].get("purpose", TRAIN))
    if purpose == SCORE:  # the same passes over the file this party scores
        spec = dataclasses.replace(spec, table_path=str(Path(score_file(spec, rt.node, cfg)[0])))
    keys = config_records(context.state).get(KEYS_STATE) or ConfigRecord()
    fields = config_records(message.content)[STEP]
    session = str(fields.get("session", ""))
    answered = config_records(context.state).get(SIZE_STATE)
    if (message.metadata.message_type == ALIGN_SIZE and session and answered is not None
            and str(answered["session"]) == session == str(keys.get("session", ""))):
        # a re-sent size of the session in progress: the same answer, nothing read or forgotten again
        return Message(RecordDict({REPLY: ConfigRecord({k: v for k, v in answered.items() if k != "session"})}),
                       reply_to=message)
    signer = _Signer(context, cfg, spec, message.metadata.message_type, purpose, session, keys)
    step = _Step(message, context, cfg, spec, purpose, keys, signer)
    STEPS[message.metadata.message_type](step)
    if step.done:  # the key is done with: forget it, and the session with it
        config_records(context.state).pop(KEYS_STATE, None)
        config_records(context.state).pop(SIZE_STATE, None)
    else:
        config_records(context.state)[KEYS_STATE] = step.keys
    return Message(RecordDict({REPLY: ConfigRecord(step.out), **step.records}), reply_to=message)


LEADER = 0  # the label owner's partition id (the one active party, first)
SIGNED = b"fairvfl-flwr alignment v1"  # prefix of what a party signs


def _positions_blob(rows: np.ndarray, split: np.ndarray | None) -> bytes:
    """What the leader signs for one party: its common positions and (training) the split."""
    blob = np.ascontiguousarray(rows, dtype=np.int64).tobytes()
    return blob if split is None else blob + b"\0split\0" + np.ascontiguousarray(split, dtype=np.int64).tobytes()


def signed_text(session: str, purpose: str, made_at: str, about: int, payload: bytes) -> bytes:
    """What a party signs: ``payload`` (its digest), made at step ``made_at`` about party ``about``,
    bound to alignment ``session`` and its ``purpose``."""
    return (SIGNED + b"\0" + session.encode() + b"\0" + purpose.encode() + b"\0" + made_at.encode()
            + b"\0" + str(about).encode() + b"\0" + hashlib.sha256(payload).digest())


class _Signer:
    """A party's signatures of the lists it sends and its checks of those it acts on (the
    identity keys secure aggregation pins: secure/identity.py), within one session that the
    party never took part in before."""

    def __init__(self, context: Context, cfg: RunConfig, spec: PartySpec, message_type: str, purpose: str,
                 session: str, keys: ConfigRecord) -> None:
        self.context, self.cfg, self.spec, self.purpose = context, cfg, spec, purpose
        self.step = message_type.rsplit("_", 1)[-1]  # "raise" of query.align_raise
        if not session:
            raise FederationError(f"{spec.name}: alignment step {self.step!r} names no alignment session; refused")
        self.session = session
        if message_type == ALIGN_SIZE:
            self.check_keys()  # before anything is read: an unauthenticated party answers nothing
            if not psi.claim_session(spec, session):
                raise self.replayed()
        elif session != str(keys.get("session", "")):
            if psi.used_session(spec, session):
                raise self.replayed()
            raise FederationError(f"{spec.name}: alignment step {self.step!r} of another alignment session than "
                                  "this party's; refused")

    def replayed(self) -> FederationError:
        return FederationError(f"{self.spec.name}: alignment session {self.session[:8]}… was already used by this "
                               f"party (step {self.step!r}); a replayed alignment session is refused (every "
                               "alignment needs a fresh session)")

    def check_keys(self) -> None:
        """A deployed party signs with its own identity key and checks every peer against its pinned
        peers file, whatever its node config says about masking: the demo keys anyone can derive
        would let a server forge the lists it acts on (a dictionary test of its ids)."""
        node = NodeConfig.of(self.context)
        missing = [k for k, v in ((identity.IDENTITY_KEY, node.identity_key), (identity.PEERS, node.peers)) if not v]
        if node.deployed and missing:
            raise NodeConfigError(
                f"{self.spec.name}: private alignment: this node reads its own data but its node config names no "
                f"{' and no '.join(repr(k) for k in missing)}: every list of the alignment is signed with the "
                f"party's own identity key and checked against the pinned peers file, and "
                f"{identity.ALLOW_UNMASKED}=true does not waive that (demo keys exist only in simulation). Set node "
                f"config {identity.IDENTITY_KEY} and {identity.PEERS}; make them with {identity.KEY_TOOL} (docs/deploy.md, "
                "section 0); refused before any id was read")
        if _raw(self._peers[self.spec.partition_id]) != _raw(self._identity.public_key()):
            raise NodeConfigError(f"{self.spec.name}: node config {identity.PEERS}={node.peers} pins another "
                                  f"key for this party than its own {identity.IDENTITY_KEY}: the peers file is not this "
                                  f"federation's, or {identity.IDENTITY_KEY} is not this party's key; refused")

    def _text(self, made_at: str, about: int, payload: bytes) -> bytes:
        return signed_text(self.session, self.purpose, made_at, about, payload)

    @functools.cached_property
    def _identity(self):
        return identity.identity(self.context)

    @functools.cached_property
    def _peers(self):
        return identity.peer_keys(self.context, self.cfg.num_parties)

    @functools.cached_property
    def peers_digest(self) -> str:
        """SHA-256 of the node config's peers file (of the demo keys in simulation): a kept
        alignment is bound to it."""
        path = NodeConfig.of(self.context).peers
        if path:
            return hashlib.sha256(Path(path).read_bytes()).hexdigest()
        raw = {str(j): _raw(k) for j, k in sorted(self._peers.items())}
        return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()

    @property
    def leader_key(self) -> str:
        """The label owner's pinned public identity key (hex): a kept alignment is bound to it."""
        return _raw(self._peers[LEADER])

    def sign(self, made_at: str, about: int, payload: bytes) -> bytes:
        """This party's signature of ``payload`` (made at step ``made_at``, about party ``about``)."""
        return self._identity.sign(self._text(made_at, about, payload))

    def verify(self, made_at: str, about: int, payload: bytes, signature: bytes, what: str,
               signer_pid: int | None = None) -> None:
        """Refuse unless party ``signer_pid`` (default ``about``) signed ``payload`` for this session."""
        signer = about if signer_pid is None else signer_pid
        try:
            self._peers[signer].verify(bytes(signature), self._text(made_at, about, payload))
        except (InvalidSignature, KeyError, TypeError):
            raise FederationError(f"{self.spec.name}: alignment step {self.step!r}: {what} are not signed by party "
                                  f"{signer}'s pinned identity key for this alignment; refused (a server's own list, "
                                  "e.g. a dictionary test of this party's ids)") from None


def _raw(public) -> str:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def _keep(step: _Step, ids: np.ndarray, key: str, labels: dict | None = None) -> None:
    """Keep this party's new alignment on its disk (data/psi.py), for the next run on the same
    tables under the same peers file and label owner."""
    spec, cfg = step.spec, step.cfg
    if not cfg.tables_reuse_alignment:
        return
    record = {**step.out, "key": key, "n": int(len(ids)), "pattern": id_pattern(str(ids[0])) if len(ids) else "",
              "rules": dataclasses.asdict(Rules.of(cfg)), "labels": labels is not None,
              "peers": step.signer.peers_digest, "leader": step.signer.leader_key}
    psi.keep_alignment(spec, cfg, record, labels)


def _keep_score_ids(context: Context, common: np.ndarray, ids: np.ndarray) -> str:
    """Keep the common ids of this party's score file in its own state; their digest. With node
    config ``unscored-path``, this party's other ids (not held by every party, so not scored)
    go to that file on its own disk."""
    array_records(context.state)[SCORE_COMMON_STATE] = msgs.array_record(ids=np.sort(common))
    path = NodeConfig.of(context).unscored_path
    if path:
        unscored = np.sort(np.setdiff1d(ids, common))
        target = Path(path).expanduser()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("id\n" + "".join(f"{i}\n" for i in unscored))
        log(INFO, "FairVFL: %d ids of this party's score file are not held by every party and are not scored: "
            "written to %s", len(unscored), target)
    return ids_digest(np.sort(common))


#: The private alignment of the parties' own tables (before training, and a scoring job's files).
# set-up outside any view (blinded ids and counts, no value a round's sum depends on); the aligned
# block's key is part of a party's state from one round to the next
JOB = Job("alignment", handlers({step: Handles(msgs.Kind.SETUP, handle, keeps=(ALIGNED_STATE,), in_view=False)
                                 for step in STEPS}))
