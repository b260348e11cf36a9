"""Encrypted groups: the registry's group indicators under its own CKKS key, and the server's sums over them.

Where a registry holds the sensitive column (run config ``groups.holder = "registry"``),
everything the server computes from the groups is a sum over rows of a value the server
computes itself, split by group: a gap is Σ_i Σ_g 1[g_i] P_g(i) with P_g(i) the row's term
as if it were in group g (its loss over that group's size, signed by the gap's side), a
group size is Σ_i 1[g_i = g] 1[i ∈ S]. This module is that oracle, the registry holding
the only key:

====================== ====================================== =======================================
message type            from server                            reply (the registry's)
====================== ====================================== =======================================
query.groups_encrypt    (nothing)                              CKKS parameters (no key), the group
                                                               names, Enc(1[g]) per group, training
                                                               and test rows, 4096 rows a ciphertext
query.groups_sum        the round; ciphertexts, each           two numbers per ciphertext: the real
                        Σ_g Σ_chunks Enc(1[g]) ⊙ P + r         and imaginary slot sums, plus noise
====================== ====================================== =======================================

* The registry makes its secret key on its node, once per run, and keeps it in the node's
  state (never in a reply, never on disk); it encrypts each group's indicator column once
  (``query.groups_encrypt``: a re-ask gets fresh encryptions of the same columns).
* The server multiplies each encrypted indicator by its plaintext P (complex slots: two
  values per ciphertext, as features/ckks.py packs two columns), sums over groups and chunks,
  rescales, and adds a fresh uniform mask r per slot in [−2^16, 2^16] (real and imaginary).
  It scales its plaintext so that no slot's value exceeds 2^10 (:data:`VALUE_BOUND`, 1/64 of
  the mask's range, so that a slot the registry decrypts says next to nothing of the value
  under its mask) and divides the sums back.
* The registry decrypts each ciphertext, refuses one whose slot exceeds 2^17
  (:data:`SLOT_BOUND`: an honest slot is a mask plus at most 2^10), and returns only the
  sums of its slots, each plus Gaussian noise of its node config's ``sum-noise``. It counts
  every sum against its node config's ``sums-per-round`` (the round the request names,
  which may only advance), ``sums-per-run`` and ``sums-lifetime`` (its ledger on its own
  disk, secure/ledger.py, which no fresh run resets), and refuses a request beyond any.

Training on them (run config ``groups.release = "ckks"``): :func:`encrypted_labels` gives the
server its labels with this oracle in place of the groups (its constraint:
core/constraints/cells.py; small groups pooled by :func:`pooled_by_sizes` from their sizes), and :class:`RegistryChannel` is the round's ν channel: Enc(n·ν) as
Σ_g Enc(1[g]) ⊙ n·ν_g to every passive party, the label owner's weights as if in each group,
and the legs of a round (every party's masked products to the registry in one request, its
sums back to each party; the label owner takes each of its Q steps in a leg of its own:
:func:`active_mod`, :func:`active_leg`).

So the registry sees masked slots only, and the server the sums of its own plaintexts over
each group, never a row's group. A server that lies chooses P (one row alone, or rows at
weights 2^j): the registry cannot see P, so what bounds that server is the budget (sums a
round), the slot bound with the noise (bits a sum), and nothing else; measured by
bench/registry_isolation.py (docs/results/privacy/registry-isolation.md, docs/privacy.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import dataclasses
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fairvfl_flwr.algorithms import newton
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.core.constraints import Pooling, SensitiveGroups, SizedGroups, kind_named, pooled_members
from fairvfl_flwr.core.constraints.groups import pooled_names
from fairvfl_flwr.core.constraints.measures import measure as measure_named
from fairvfl_flwr.core.errors import ConfigError
from fairvfl_flwr.core.newton import in_row_space, with_bias
from fairvfl_flwr.data.problem import ServerLabels
from fairvfl_flwr.features import ckks
from fairvfl_flwr.features.registry import active_payloads
from fairvfl_flwr.flower import checks, exchange
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.arrays import to_array, to_numpy
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.hooks import RoundHook, ServerView
from fairvfl_flwr.flower.jobs import Job
from fairvfl_flwr.flower.party import MODEL_STATE, Handles, PartyRuntime, handlers
from fairvfl_flwr.jobs.group_release import find_registry
from fairvfl_flwr.secure import ledger
from fairvfl_flwr.flower.records import array_records, config_records

#: The registry's group indicators under its key, once per run.
GROUPS_ENCRYPT = "query.groups_encrypt"
#: Masked ciphertexts of the server's, whose slot sums the registry decrypts.
GROUPS_SUM = "query.groups_sum"
#: The node state record of the registry's secret key and its parameters (never sent, never saved).
KEY_STATE = "fairvfl.groups-key"
#: The node state record of the registry's count of decrypted sums: the round, its sums, the run's.
BUDGET_STATE = "fairvfl.groups-budget"
#: The registry's lifetime ledger's account of its decrypted sums (secure/ledger.py).
LEDGER_ACCOUNT = "groups-decrypted-sums"
#: The largest |value| of a decrypted slot the registry answers for (real and imaginary part).
SLOT_BOUND = 2.0**17
#: The largest |value| of a slot the honest server's plaintext gives, before its mask.
VALUE_BOUND = 2.0**10
SPLITS = ("train", "test")
#: The registry's coefficient primes: two rescales, the server's product with the indicators and a
#: passive party's with its columns (ν under its key); 200 bits at N = 8192, within 128-bit security.
BIT_SIZES = (60, 40, 40, 60)


# -- the registry's side --------------------------------------------------------------------
def _key(context: Context):
    """(parameters, secret key) of this registry for the run: made on the first request, kept in the node's state."""
    seal = ckks.seal_api()
    kept = array_records(context.state).get(KEY_STATE)
    if kept is None:
        params = ckks.parameters(BIT_SIZES)
        ctx, _, _ = ckks.seal_context(params)
        secret = seal.KeyGenerator(ctx).secret_key()
        array_records(context.state)[KEY_STATE] = ArrayRecord({"params": ckks.to_bytes_array(params),
                                                              "key": ckks.to_bytes_array(ckks.dump_seal(secret))})
        return params, secret
    params = ckks.from_bytes_array(kept["params"])
    ctx, _, _ = ckks.seal_context(params)
    return params, ckks.load_seal(ctx, ckks.from_bytes_array(kept["key"]), seal.SecretKey, "the registry's key")


def encrypt_groups(message: Message, context: Context) -> Message:
    """Every group's indicator column of the training and test rows, encrypted under this registry's key."""
    rt = PartyRuntime(context)
    held = rt.data.held
    if held is None:
        raise FederationError(f"{rt.who}: asked to encrypt the groups, but this party holds no sensitive column")
    seal = ckks.seal_api()
    params, secret = _key(context)
    ctx, encoder, _ = ckks.seal_context(params)
    encryptor = seal.Encryptor(ctx, secret)
    out = {}
    rows = {}
    for split, s in (("train", held.train), ("test", held.test)):
        codes = SensitiveGroups.of(s, held.names).codes
        rows[split] = len(codes)
        padded = np.full(ckks.chunks(len(codes)) * ckks.SLOTS, -1, dtype=np.int64)
        padded[: len(codes)] = codes
        blobs = {}
        for g in range(len(held.names)):
            column = (padded == g).astype(np.float64)
            for c in range(ckks.chunks(len(codes))):
                pt = seal.Plaintext()
                encoder.encode(column[c * ckks.SLOTS:(c + 1) * ckks.SLOTS].tolist(), ckks.SCALE, pt)
                blobs[f"g{g}-c{c}"] = ckks.to_bytes_array(ckks.dump_seal(encryptor.encrypt_symmetric(pt)))
        out[split] = ArrayRecord(blobs)
    said = ConfigRecord({"names": list(held.names), "train-rows": rows["train"], "test-rows": rows["test"],
                         "sums-per-round": _limits(rt)[0]})  # what the server's search may plan with
    return Message(RecordDict({ckks.CONTEXT_RECORD: ArrayRecord({"context": ckks.to_bytes_array(params)}),
                               "groups": said, **out}), reply_to=message)


def _limits(rt: PartyRuntime) -> tuple[int, int]:
    """(sums a round, sums a run) this registry decrypts; 0: no limit."""
    per_round, per_run = rt.node.sums_per_round, rt.node.sums_per_run
    if per_run == 0 and per_round > 0:
        per_run = per_round * (rt.cfg.num_server_rounds + 2)
    return per_round, per_run


def spend(context: Context, rt: PartyRuntime, server_round: int, sums: int) -> None:
    """Count ``sums`` decrypted sums against round ``server_round``'s, the run's and the registry's
    lifetime budget, or refuse the request: a round below the last one asked for, one past the
    run's, or a count beyond any budget (its node config ``sums-per-round``, ``sums-per-run``,
    ``sums-lifetime``). The lifetime count is on its own disk (secure/ledger.py), written before
    anything is decrypted: the run's count is reset by a fresh run, and the run's budget follows
    the rounds the server's run config names; the lifetime one is neither."""
    kept = config_records(context.state).get(BUDGET_STATE)
    last, used_round, used_run = ((int(kept["round"]), int(kept["round-used"]), int(kept["run-used"]))
                                  if kept is not None else (0, 0, 0))
    if server_round < last:
        raise ConfigError(f"{rt.who}: asked for sums of round {server_round} after round {last}: rounds only advance "
                          "(a budget is per round): refused")
    if server_round > rt.cfg.num_server_rounds + 1:
        raise ConfigError(f"{rt.who}: asked for sums of round {server_round}; the run has "
                          f"{rt.cfg.num_server_rounds} rounds: refused")
    if server_round > last:
        used_round = 0
    per_round, per_run = _limits(rt)
    if per_round and used_round + sums > per_round:
        raise ConfigError(f"{rt.who}: asked for {sums} sums in round {server_round}, which already had {used_round}; "
                          f"its node config sums-per-round={per_round}: refused")
    if per_run and used_run + sums > per_run:
        raise ConfigError(f"{rt.who}: asked for {sums} sums after {used_run} in this run; its budget is {per_run} "
                          "(node config sums-per-run, or sums-per-round times the rounds + 2): refused")
    with ledger.opened(context, rt.node, rt.who) as book:
        book.spend(LEDGER_ACCOUNT, sums, rt.node.sums_lifetime, "decrypted sums over its groups")
    config_records(context.state)[BUDGET_STATE] = ConfigRecord(
        {"round": server_round, "round-used": used_round + sums, "run-used": used_run + sums})


def decrypt_sums(message: Message, context: Context) -> Message:
    """The slot sums of the server's masked ciphertexts (two a ciphertext), each with this registry's
    noise, once the request is within its budget and every slot within :data:`SLOT_BOUND`."""
    rt = PartyRuntime(context)
    if array_records(context.state).get(KEY_STATE) is None:
        raise ConfigError(f"{rt.who}: asked to decrypt sums before it encrypted its groups ({GROUPS_ENCRYPT})")
    said = config_records(message.content).get("sum")
    record = array_records(message.content).get("masked")
    if said is None or record is None or "round" not in said or not len(record):
        raise ConfigError(f"{rt.who}: a {GROUPS_SUM} request needs the round and one or more ciphertexts")
    keys = sorted(record, key=lambda k: int(k.split("-")[1]))
    spend(context, rt, int(said["round"]), 2 * len(keys))
    seal = ckks.seal_api()
    params, secret = _key(context)
    ctx, encoder, _ = ckks.seal_context(params)
    decryptor = seal.Decryptor(ctx, secret)
    sums = []
    for k in keys:
        pt = seal.Plaintext()
        decryptor.decrypt(ckks.load_ciphertext(ctx, ckks.from_bytes_array(record[k]), f"ciphertext {k!r}"), pt)
        slots = np.asarray(encoder.decode_complex(pt))
        top = max(float(np.abs(slots.real).max()), float(np.abs(slots.imag).max()))
        if not top <= SLOT_BOUND:
            raise ConfigError(f"{rt.who}: ciphertext {k!r} holds a slot of {top:.3g}, beyond the bound 2^17 of a "
                              "masked slot: refused (an honest slot is a mask within 2^16 plus a value within 2^10)")
        total = complex(slots.sum())
        sums += [total.real, total.imag]
    noisy = np.asarray(sums) + np.random.default_rng().normal(0.0, rt.node.sum_noise, size=len(sums))
    return Message(RecordDict({"sums": msgs.array_record(sums=noisy)}), reply_to=message)


# -- the server's side ----------------------------------------------------------------------
@dataclass(frozen=True)
class Indicators:
    """What the registry's ``query.groups_encrypt`` reply holds: its CKKS parameters, the group
    names, and per split and group the indicator's ciphertexts, one a chunk of 4096 rows."""

    params: bytes
    names: tuple[str, ...]
    rows: dict[str, int]
    blobs: dict[str, list[list[bytes]]]  # split -> group -> chunk
    per_round: int = 0  # the registry's sums a round (its node config sums-per-round; 0: no limit)


def indicators_of(reply: Message, who: str, rows: dict[str, int] | None = None) -> Indicators:
    """The registry's reply, refused unless it holds two or more distinct groups and, per split,
    one ciphertext per group and chunk of ``rows`` (default: the rows it says)."""
    said = config_records(reply.content).get("groups")
    context = array_records(reply.content).get(ckks.CONTEXT_RECORD)
    if said is None or context is None or any(s not in array_records(reply.content) for s in SPLITS):
        raise FederationError(f"{who}: its reply holds no encrypted groups")
    names = tuple(str(n) for n in said["names"])
    if len(names) < 2 or len(set(names)) != len(names):
        raise FederationError(f"{who}: encrypted groups need two or more distinct groups, got {list(names)}")
    counts = {s: int(said[f"{s}-rows"]) for s in SPLITS}
    if rows is not None and counts != rows:
        raise FederationError(f"{who} encrypted the groups of {counts} rows, the server holds {rows}")
    blobs = {}
    for split in SPLITS:
        record = array_records(reply.content)[split]
        want = {f"g{g}-c{c}" for g in range(len(names)) for c in range(ckks.chunks(counts[split]))}
        if set(record) != want:
            raise FederationError(f"{who}: its {split} indicators are not one ciphertext per group and chunk")
        blobs[split] = [[ckks.from_bytes_array(record[f"g{g}-c{c}"]) for c in range(ckks.chunks(counts[split]))]
                        for g in range(len(names))]
    per_round = int(said["sums-per-round"]) if "sums-per-round" in said else 0
    return Indicators(ckks.from_bytes_array(context["context"]), names, counts, blobs, per_round)


#: How the oracle asks the registry: (ciphertexts, round) -> the slot sums, two a ciphertext.
Ask = Callable[[list[bytes], int], np.ndarray]


def slot_scales(P: np.ndarray) -> np.ndarray:
    """Per value k of ``P`` (K × G × rows), the factor that makes its largest slot :data:`VALUE_BOUND`
    (a slot's value: over its chunks, the largest of its rows' terms over the groups), so that the
    registry's noise falls on a sum of that scale (1 for a value 0 on every row)."""
    n = P.shape[2]
    padded = np.zeros((*P.shape[:2], ckks.chunks(n) * ckks.SLOTS))
    padded[:, :, :n] = np.abs(P)
    per_slot = padded.max(axis=1).reshape(len(P), -1, ckks.SLOTS).sum(axis=1).max(axis=1)
    return VALUE_BOUND / np.where(per_slot > 0, per_slot, VALUE_BOUND)


class GroupSums:
    """The server's oracle of sums over the registry's groups: Σ_i Σ_g 1[g_i] P[k, g, i] for
    plaintexts P of its own, the registry decrypting masked slot sums only (module docstring)."""

    def __init__(self, indicators: Indicators, ask: Ask | None, pooling: Pooling | None = None,
                 spent: dict[int, int] | None = None) -> None:
        self.indicators = indicators
        self._ask = ask
        #: the sums asked for so far, by round (shared with a pooled copy: one registry, one budget)
        self.spent: dict[int, int] = {} if spent is None else spent
        #: per round, the sums spent when its Taylor model was asked for (:meth:`told`)
        self.marks: dict[int, int] = {}
        self._model_kind: str | None = None
        #: the small groups merged into one (:meth:`pooled`), said in the log and the model card
        self.pooling = pooling
        #: the round the server's next sums are asked for (the registry's budget is per round):
        #: the set-up's and round 0's are 0, and the channel's hook moves it on as each round ends
        self.round = 0
        self.ctx, self.encoder, self.evaluator = ckks.seal_context(indicators.params)
        self._loaded = {split: [[ckks.load_ciphertext(self.ctx, b, f"the {split} indicator of group {g}")
                                 for b in chunks] for g, chunks in enumerate(blobs)]
                        for split, blobs in indicators.blobs.items()}

    @property
    def names(self) -> tuple[str, ...]:
        """The registry's groups, in the order of P's second axis."""
        return self.indicators.names

    def pooled(self, members: list[int], pooling: Pooling) -> "GroupSums":
        """The oracle over the groups with ``members`` merged into one (placed last, as
        :meth:`SensitiveGroups.pooled` places it): each chunk's Enc(1[pooled]) is the sum of the
        members' Enc(1[g]), added by the server under the registry's key. Nothing is asked of the
        registry and no row's group is learnt; every party that gets the indicators gets these."""
        seal = ckks.seal_api()
        keep, names = pooled_names(self.names, members)
        blobs = {}
        for split, groups in self._loaded.items():
            merged = []
            for c in range(len(groups[members[0]])):
                acc = seal.Ciphertext()  # a pool has two members or more (core/constraints/pooling.py)
                self.evaluator.add(groups[members[0]][c], groups[members[1]][c], acc)
                for g in members[2:]:
                    self.evaluator.add_inplace(acc, groups[g][c])
                merged.append(ckks.dump_seal(acc))
            blobs[split] = [self.indicators.blobs[split][g] for g in keep] + [merged]
        pooled = GroupSums(dataclasses.replace(self.indicators, names=names, blobs=blobs), self._ask, pooling,
                           self.spent)
        pooled.round = self.round
        return pooled

    def ask(self, blobs: list[bytes], server_round: int) -> np.ndarray:
        """The registry's slot sums of ``blobs`` (two a ciphertext), counted against round ``server_round``."""
        self.spent[server_round] = self.spent.get(server_round, 0) + 2 * len(blobs)
        return self._ask(blobs, server_round)

    def room(self) -> int | None:
        """How many more sums this round's Taylor model may take (core/constraints/cells.EncryptedConstraint.taylor):
        the registry's sums a round less those asked already and those the rest of the round asks
        (the most any earlier round asked after its search; before one, all of round 0's). None: no limit."""
        if not self.indicators.per_round:
            return None
        tails = [self.spent.get(r, 0) - m for r, m in self.marks.items() if r < self.round]
        tail = max(tails + [self.spent.get(0, 0)])
        return self.indicators.per_round - self.spent.get(self.round, 0) - tail

    def told(self, model, directions: int) -> None:
        """A Taylor model was asked for (log whether it carries the gaps' Hessian whenever that changes),
        or (``model`` None) the round's search has ended: mark where the round's sums stand."""
        if model is None:
            self.marks[self.round] = self.spent.get(self.round, 0)
            return
        kind = "quadratic" if model.W is not None else "linear"
        if kind != self._model_kind:
            budget = self.indicators.per_round or "no limit"
            log(INFO, "[round %d] Newton's search models the gaps on its %d directions from %d sums of the registry "
                "(%s model%s; sums-per-round %s)", self.round, directions, model.sums, kind,
                "" if model.W is not None else ": the gaps' Hessian would not fit this round's budget", budget)
            self._model_kind = kind

    def _summed(self, terms) -> object | None:
        """Σ enc ⊙ encode(block) over the (ciphertext, block) pairs whose block is not 0 (a zero
        plaintext's product SEAL refuses as transparent), rescaled once; None when every block is 0."""
        seal = ckks.seal_api()
        acc, part, started = seal.Ciphertext(), seal.Ciphertext(), False
        for enc, block in terms:
            if not block.any():
                continue
            pt = seal.Plaintext()
            self.encoder.encode(block.tolist(), enc.parms_id(), ckks.SCALE, pt)
            self.evaluator.multiply_plain(enc, pt, part if started else acc)
            if started:
                self.evaluator.add_inplace(acc, part)
            started = True
        if not started:
            return None
        self.evaluator.rescale_to_next_inplace(acc)
        return acc

    def products(self, split: str, P: np.ndarray, masks: np.ndarray) -> list[bytes]:
        """One ciphertext per pair of values k: Σ_g Σ_chunks Enc(1[g]) ⊙ (P[2j] + i·P[2j+1]) + masks[j],
        rescaled once. ``P`` is K × G × rows (K even), ``masks`` K/2 × 4096 complex. A pair whose
        plaintext is 0 throughout is refused (its sum is known without asking)."""
        seal = ckks.seal_api()
        K, G, n = P.shape
        if n != self.indicators.rows[split] or G != len(self.names) or K % 2:
            raise ValueError(f"P is {P.shape}: expected an even count × {len(self.names)} groups × "
                             f"{self.indicators.rows[split]} {split} rows")
        padded = np.zeros((K, G, ckks.chunks(n) * ckks.SLOTS))
        padded[:, :, :n] = P
        cplx = padded[0::2] + 1j * padded[1::2]
        out = []
        for j in range(K // 2):
            acc = self._summed((enc, cplx[j, g, c * ckks.SLOTS:(c + 1) * ckks.SLOTS])
                               for g in range(G) for c, enc in enumerate(self._loaded[split][g]))
            if acc is None:
                raise ValueError(f"values {2 * j} and {2 * j + 1} of P are 0 on every row: nothing to ask for")
            mask = seal.Plaintext()
            self.encoder.encode(masks[j].tolist(), acc.parms_id(), acc.scale, mask)
            self.evaluator.add_plain_inplace(acc, mask)
            out.append(ckks.dump_seal(acc))
        return out

    def encrypt_mixture(self, split: str, M: np.ndarray) -> list[bytes]:
        """Enc(Σ_g 1[g_i] M[g, i]) in chunks of 4096 rows, rescaled once: a per-row array the server
        knows for every group (ν as if each row were in each group: core/constraints/cells.py),
        under the registry's key, without learning which value each row takes. A passive party
        multiplies it by its columns as it does the server's Enc(n·ν) (features/ckks.py); the
        registry decrypts its masked products' slot sums (``query.groups_sum``)."""
        M = np.asarray(M, dtype=np.float64)
        G, n = M.shape
        if n != self.indicators.rows[split] or G != len(self.names):
            raise ValueError(f"M is {M.shape}: expected {len(self.names)} groups × {self.indicators.rows[split]} rows")
        padded = np.zeros((G, ckks.chunks(n) * ckks.SLOTS))
        padded[:, :n] = M
        out = []
        for c in range(ckks.chunks(n)):
            acc = self._summed((self._loaded[split][g][c], padded[g, c * ckks.SLOTS:(c + 1) * ckks.SLOTS])
                               for g in range(G))
            if acc is None:
                raise ValueError(f"M is 0 on every row of chunk {c}: nothing to encrypt")
            out.append(ckks.dump_seal(acc))
        return out

    def mixed(self, split: str, P: np.ndarray, server_round: int) -> np.ndarray:
        """Σ_i Σ_g 1[g_i] P[k, g, i] for each k (``P``: K × G × rows): each value scaled so that no
        slot exceeds :data:`VALUE_BOUND` (the registry's noise then falls on the scaled sum),
        masked with fresh uniform masks, decrypted by the registry, unmasked and scaled back.
        A value that is 0 on every row is 0 without asking."""
        P = np.asarray(P, dtype=np.float64)
        out = np.zeros(P.shape[0])
        asked = np.flatnonzero(np.abs(P).reshape(len(P), -1).max(axis=1) > 0)
        if not len(asked):
            return out
        Q = P[asked] if len(asked) % 2 == 0 else np.concatenate([P[asked], np.zeros((1, *P.shape[1:]))])
        scale = slot_scales(Q)
        rng = np.random.default_rng()  # fresh OS entropy: the registry must not predict the masks
        bound = ckks.MASK_BOUND
        masks = (rng.uniform(-bound, bound, size=(len(Q) // 2, ckks.SLOTS))
                 + 1j * rng.uniform(-bound, bound, size=(len(Q) // 2, ckks.SLOTS)))
        sums = self.ask(self.products(split, Q * scale[:, None, None], masks), server_round)
        if sums.shape != (len(Q),) or not np.all(np.isfinite(sums)):
            raise FederationError(f"the registry's sums have shape {sums.shape}, expected {len(Q)} finite values")
        mask_sums = masks.sum(axis=1)
        unmasked = sums - np.column_stack([mask_sums.real, mask_sums.imag]).reshape(-1)
        out[asked] = (unmasked / scale)[: len(asked)]
        return out

    def by_group(self, split: str, V: np.ndarray, server_round: int) -> np.ndarray:
        """K × G: Σ_{i in group g} V[k, i], for every row vector V[k] and group g."""
        V = np.atleast_2d(np.asarray(V, dtype=np.float64))
        G = len(self.names)
        P = np.zeros((len(V) * G, G, V.shape[1]))
        for k in range(len(V)):
            for g in range(G):
                P[k * G + g, g] = V[k]
        return self.mixed(split, P, server_round).reshape(len(V), G)

    def sizes(self, split: str, rows: np.ndarray, server_round: int) -> np.ndarray:
        """K × G: each group's count among the rows of each mask ``rows[k]`` (rounded: a count is whole)."""
        return np.rint(self.by_group(split, np.atleast_2d(rows).astype(np.float64), server_round)).astype(np.int64)


def connect(grid: Grid, cfg: RunConfig, ids_digest: str, rows: dict[str, int]) -> GroupSums:
    """The registry's encrypted groups of ``rows`` (training and test) and the oracle that asks it
    for sums; refuses a federation without one registry on the server's rows, and a reply that
    does not fit them."""
    node_id, who = find_registry(grid, cfg, ids_digest, "its encrypted groups are asked for")

    def send(content: RecordDict, message_type: str, group_id: str) -> Message:
        message = Message(content, dst_node_id=node_id, message_type=message_type, group_id=group_id)
        reply = exchange.exchange(grid, [message], cfg.round_timeout, cfg.round_retries, lambda nid: who)[0]
        if reply.has_error():
            raise FederationError(f"{who}: {reply.error.reason}")
        return reply

    indicators = indicators_of(send(RecordDict(), GROUPS_ENCRYPT, "groups"), who, rows)

    def ask(blobs: list[bytes], server_round: int) -> np.ndarray:
        content = RecordDict({"sum": ConfigRecord({"round": int(server_round)}),
                              "masked": ArrayRecord({f"ct-{k}": ckks.to_bytes_array(b) for k, b in enumerate(blobs)})})
        reply = send(content, GROUPS_SUM, str(server_round))
        record = array_records(reply.content).get("sums")
        if record is None or "sums" not in record:
            raise FederationError(f"{who}: its reply holds no sums")
        return to_numpy(record["sums"]).astype(np.float64)

    return GroupSums(indicators, ask)


def encrypted_labels(grid: Grid, cfg: RunConfig, labels: ServerLabels) -> ServerLabels:
    """``labels`` without their groups (every code -1) and with the registry's oracle in their
    place: the training job's release where ``groups.release = "ckks"``."""
    rows = {"train": len(labels.y_train), "test": len(labels.y_test)}
    sums = pooled_by_sizes(cfg, labels, connect(grid, cfg, labels.ids_digest, rows))
    log(INFO, "FairVFL: the registry encrypted the groups (%s) of %d training and %d test rows under its own key; "
        "the server gets sums over them, never a row's group", ", ".join(sums.names), rows["train"], rows["test"])
    unknown = {f"s_{split}": np.full(n, -1, dtype=np.int64) for split, n in rows.items()}
    return dataclasses.replace(labels, group_names=sums.names, sums=sums, **unknown)


def pooled_by_sizes(cfg: RunConfig, labels: ServerLabels, sums: GroupSums) -> GroupSums:
    """``sums`` with the groups below min-group-size pooled as a label owner's run pools them
    (core/constraints/pooling.py, on every row of the table, training and test), decided on their
    sizes in the constraint's row sets, which the server asks of the registry (one request of
    round 0) and learns in every run anyway; refused where the rule refuses."""
    kind = kind_named(cfg.constraint)
    y = np.concatenate([labels.y_train, labels.y_test])
    subsets = kind.subsets(y, labels.protected_label)
    sets = tuple(rows for _, rows in subsets) + (np.ones(len(y), dtype=bool),)
    n = len(labels.y_train)
    masks = np.stack(sets)
    counts = sums.sizes("train", masks[:, :n], sums.round) + sums.sizes("test", masks[:, n:], sums.round)
    decided = pooled_members(SizedGroups(sums.names, sets, counts), subsets, cfg.min_group_size,
                             cfg.pool_small_groups, kind.kind, whole_table=True)
    return sums if decided is None else sums.pooled(*decided)


# -- the rounds: ν under the registry's key, every party's gradient through it -------------------
#: The label owner's next step of a round: the registry's masked sums of its last products.
TRAIN_ACTIVE_LEG = "train.active_groups_leg"
#: The label owner's kept state between its legs: the other parties' logits, its weights as if in
#: each group, the masks' sums of its last products, the steps taken.
LEG_STATE = "fairvfl.groups-leg"
#: The node state record of the label owner's copy of the registry's encrypted indicators.
INDICATORS_STATE = "fairvfl.groups-indicators"
MASKED = "masked"  # a reply's record of ciphertexts the registry is to sum (ckks.MASKED_RECORD's name)
SUMS_KEY = "group-sums"  # a leg's payload: the registry's sums of the party's products (masked)
WEIGHTS_KEY = "asif-weights"  # the label owner's payload: its rows' weights as if in each group (G × n)


def _blobs(reply: Message) -> list[bytes]:
    record = array_records(reply.content)[MASKED]
    return [ckks.from_bytes_array(record[k]) for k in sorted(record, key=lambda k: int(k.split("-")[1]))]


def nu_log2(values: np.ndarray, n_chunks: int) -> int:
    """The largest e in 0..ckks.MAX_NU_LOG2 with 2^e · max|n·ν| summed over the chunks within
    :data:`VALUE_BOUND`: a passive party's slot, 2^e n·ν times its column summed over the chunks,
    is then within VALUE_BOUND times its column's largest |value|, and the registry's noise on
    its sums falls on 2^e times its gradient. The party learns e: the order of magnitude of
    max|n·ν| (one integer a round)."""
    top = float(np.max(np.abs(values))) * n_chunks
    if not top > 0:
        return 0
    return int(np.clip(np.floor(np.log2(VALUE_BOUND / top)), 0, ckks.MAX_NU_LOG2))


class RegistryChannel(RoundHook):
    """The server's ν channel where the registry holds the groups under its key: Enc(n·ν) as
    Σ_g Enc(1[g]) ⊙ n·ν_g to every passive party (the registry too), the label owner's rows'
    weights as if in each group (from the labels and the groups' sizes, nothing of a row's
    group), and the legs of each round: every masked product a party returns goes to the
    registry in one request, whose slot sums go back to the party, until each has its logits."""

    def __init__(self, sums: GroupSums, n_rows: int) -> None:
        self.sums = sums
        self.n = n_rows
        self._round: int | None = None
        self._nu: ArrayRecord | None = None
        self._log2 = 0  # ν's scale this round (:func:`nu_log2`)
        self._evaluate = False  # whether this round's parties also return test logits (its legs carry it on)

    def init_messages(self, server: ServerView, messages: list[Message]) -> None:
        """The registry's CKKS parameters (no key) to every party; the encrypted indicators to the label owner."""
        params = ArrayRecord({"context": ckks.to_bytes_array(self.sums.indicators.params)})
        blobs = self.sums.indicators.blobs["train"]
        held = ArrayRecord({f"g{g}-c{c}": ckks.to_bytes_array(b) for g, chunks in enumerate(blobs)
                            for c, b in enumerate(chunks)})
        for m in messages:
            array_records(m.content)[ckks.CONTEXT_RECORD] = params
            node = server.nodes.get(m.metadata.dst_node_id)
            if node is not None and node.role == msgs.ROLE_ACTIVE:
                array_records(m.content)[INDICATORS_STATE] = held

    def passive_message(self, server: ServerView, server_round: int, nu: np.ndarray,
                        evaluate: bool) -> tuple[RecordDict, str]:
        """Enc(2^e·n·ν) from ν as if each row were in each group (G × n), once a round for every passive
        party, with e (:func:`nu_log2`) in the message: the party divides its gradient back."""
        self._evaluate = evaluate
        if self._round != server_round:
            values = self.n * np.asarray(nu, dtype=np.float64)
            self._log2 = nu_log2(values, ckks.chunks(self.n))
            blobs = self.sums.encrypt_mixture("train", 2.0**self._log2 * values)
            self._nu = ArrayRecord({f"nu-ct-{c}": ckks.to_bytes_array(b) for c, b in enumerate(blobs)})
            self._round = server_round
        return (RecordDict({msgs.PAYLOAD: self._nu, msgs.ROUND: msgs.round_config(server_round, evaluate),
                            ckks.NU_SCALE: ConfigRecord({"log2": self._log2})}), msgs.TRAIN_PASSIVE_ENC)

    def outgoing(self, server: ServerView, messages: list[Message]) -> None:
        """The label owner's training message gets its rows' weights as if in each group, at its λ."""
        for payload, lam in active_payloads(server, messages):
            payload[WEIGHTS_KEY] = to_array(np.ascontiguousarray(server.constraint.signed_weights(lam)))

    def incoming(self, server: ServerView, grid: Grid, server_round: int, replies: list[Message],
                 timeout: float) -> list[Message]:
        """Every masked product to the registry (one request a leg), its sums back to each party,
        until every party has replied its logits."""
        done = [r for r in replies if MASKED not in array_records(r.content)]
        pending = [r for r in replies if MASKED in array_records(r.content)]
        leg = 0
        while pending:
            blobs = [_blobs(r) for r in pending]
            sums = self.sums.ask([b for each in blobs for b in each], self.sums.round)
            leg += 1
            follow, at = [], 0
            for reply, each in zip(pending, blobs):
                got, at = sums[at:at + 2 * len(each)], at + 2 * len(each)
                nid = reply.metadata.src_node_id
                if reply.metadata.message_type == msgs.TRAIN_PASSIVE_ENC:
                    content, kind = server.masked_gradient_message(nid, server_round, {msgs.MASKED_SUM: got})
                else:
                    rc = msgs.round_config(server_round, self._evaluate)
                    rc["leg"] = leg  # one message of this type a leg: the guard keeps each leg's own
                    content = RecordDict({msgs.PAYLOAD: msgs.array_record(**{SUMS_KEY: got}), msgs.ROUND: rc})
                    kind = TRAIN_ACTIVE_LEG
                follow.append(Message(content, dst_node_id=nid, message_type=kind, group_id=str(server_round)))
            answered = server.exchange(grid, follow, timeout)
            done += [r for r in answered if MASKED not in array_records(r.content)]
            pending = [r for r in answered if MASKED in array_records(r.content)]
        return done

    def end(self, server: ServerView, grid: Grid, server_round: int, timeout: float) -> None:
        """The next sums are the next round's."""
        self.sums.round = server_round + 1


# -- the label owner's side --------------------------------------------------------------------------
def _indicators(context: Context, rt: PartyRuntime) -> GroupSums:
    kept = array_records(context.state).get(INDICATORS_STATE)
    params = array_records(context.state).get(ckks.CONTEXT_RECORD)
    if kept is None or params is None:
        raise ConfigError(f"{rt.who}: encrypted groups, but its start message carried no encrypted indicators")
    groups = 1 + max(int(k.split("-")[0][1:]) for k in kept)
    n = rt.n_train
    blobs = [[ckks.from_bytes_array(kept[f"g{g}-c{c}"]) for c in range(ckks.chunks(n))] for g in range(groups)]
    names = tuple(str(g) for g in range(groups))
    return GroupSums(Indicators(ckks.from_bytes_array(params["context"]), names, {"train": n, "test": 0},
                                {"train": blobs, "test": [[] for _ in range(groups)]}), None)


def _products(rt: PartyRuntime, context: Context, party, z: np.ndarray, weights: np.ndarray,
              keep: dict[str, np.ndarray]) -> RecordDict:
    """The label owner's masked products of its columns (and its intercept's column of ones) with
    ν at logits ``z``, as if in each group, each column scaled as the server scales its values
    (:func:`slot_scales`: the registry's noise then falls on a sum of the slots' full range); the
    masks' sums and the scales kept with the leg's state (and ``keep``)."""
    x = np.hstack([np.asarray(party.X_train, dtype=np.float64), np.ones((rt.n_train, 1))])
    n = rt.n_train
    q = measure_named(rt.cfg.measure)
    nu = np.stack([q.nu(rt.data.y, z, w, n) for w in weights])
    P = (n * nu)[None, :, :] * x.T[:, None, :]
    if len(P) % 2:
        P = np.concatenate([P, np.zeros((1, *P.shape[1:]))])
    scales = slot_scales(P)
    P = P * scales[:, None, None]
    rng = np.random.default_rng()  # fresh OS entropy: neither the server nor the registry may predict the masks
    bound = ckks.MASK_BOUND
    masks = (rng.uniform(-bound, bound, size=(len(P) // 2, ckks.SLOTS))
             + 1j * rng.uniform(-bound, bound, size=(len(P) // 2, ckks.SLOTS)))
    cts = _indicators(context, rt).products("train", P, masks)
    mask_sums = masks.sum(axis=1)
    array_records(context.state)[LEG_STATE] = msgs.array_record(
        weights=weights, masks=np.column_stack([mask_sums.real, mask_sums.imag]).reshape(-1), scales=scales, **keep)
    return RecordDict({MASKED: ArrayRecord({f"ct-{k}": ckks.to_bytes_array(b) for k, b in enumerate(cts)})})


def active_mod(message: Message, context: Context, call_next) -> Message:
    """Encrypted groups, on the label owner: keep the registry's encrypted indicators its start
    message carries; and a training message whose payload holds its weights as if in each group
    starts its legs: its first masked products, not Q steps (it holds no group to weight them by).
    Block Newton's message (``train.newton_active``) starts one leg: the products at the server's z,
    whose sums give its gradient for its Newton direction (:func:`active_leg`)."""
    mtype = message.metadata.message_type
    arrays = array_records(message.content)
    if msgs.kind_of(mtype) is msgs.Kind.START and INDICATORS_STATE in arrays:
        array_records(context.state)[INDICATORS_STATE] = arrays[INDICATORS_STATE]
    payload = arrays.get(msgs.PAYLOAD)
    if mtype not in (msgs.TRAIN_ACTIVE, msgs.NEWTON_ACTIVE) or payload is None or WEIGHTS_KEY not in payload:
        return call_next(message, context)
    rt = PartyRuntime(context)
    n = rt.n_train
    weights = to_numpy(payload[WEIGHTS_KEY]).astype(np.float64)
    if weights.ndim != 2 or weights.shape[1] != n or not np.all(np.isfinite(weights)):
        raise checks.ReplyError(f"{rt.who}: {WEIGHTS_KEY} must be finite, one row of {n} weights a group; got "
                                f"{weights.shape}")
    if mtype == msgs.NEWTON_ACTIVE:  # its step lengths wait with the leg's state: θ moves once the sums are in
        got = newton.active_round(message, context)
        z = got["z"].astype(np.float64)
        keep = {"newton-alpha": got["alpha"], "newton-z": z}
        return Message(_products(rt, context, rt.party(), z, weights, keep), reply_to=message)
    got = checks.check_payload(message.content, rt.who, {"z": (n, False)})
    party = rt.party()
    z = got["z"].astype(np.float64)
    keep = {"others": z - party.logits("train"), "taken": np.array([0], dtype=np.int64)}
    return Message(_products(rt, context, party, z, weights, keep), reply_to=message)


def active_leg(message: Message, context: Context) -> Message:
    """The label owner's step from the registry's sums of its last products: its gradient
    X_aᵀν (and Σν for its intercept) once its masks are taken off; then the next step's products,
    or, after Q steps, its partial logits."""
    rt = PartyRuntime(context)
    state = array_records(context.state).pop(LEG_STATE, None)
    if state is None:
        raise ConfigError(f"{rt.who}: {TRAIN_ACTIVE_LEG} without products of its own awaiting their sums")
    masks = to_numpy(state["masks"])
    got = checks.check_payload(message.content, rt.who, {SUMS_KEY: (len(masks), False)})[SUMS_KEY]
    m = rt.data.X_train.shape[1]
    g = ((got.astype(np.float64) - masks) / to_numpy(state["scales"]))[: m + 1] / rt.n_train
    # the registry's noise along its columns' null space (the intercept's too) is noise alone (features/ckks.py)
    g = in_row_space(with_bias(np.asarray(rt.data.X_train, dtype=np.float64)), g)
    if "newton-alpha" in state:  # block Newton: one leg, the gradient of its direction
        return newton.active_from_gradient(message, context, to_numpy(state["newton-alpha"]),
                                           to_numpy(state["newton-z"]), g)
    party = rt.party()
    party.block.apply_gradient(g[:m].astype(party.block.weight.dtype), rt.cfg.lr, party.mu, bias_grad=float(g[m]))
    taken = int(to_numpy(state["taken"])[0]) + 1
    rt.save(party)
    if taken < rt.cfg.local_steps:
        others = to_numpy(state["others"])
        keep = {"others": others, "taken": np.array([taken], dtype=np.int64)}
        return Message(_products(rt, context, party, others + party.logits("train"), to_numpy(state["weights"]), keep),
                       reply_to=message)
    return rt.reply(message, party, steps=taken)


#: The encrypted groups' messages: the registry's two, and the label owner's legs.
JOB = Job("encrypted groups", handlers({GROUPS_ENCRYPT: Handles(msgs.Kind.SETUP, encrypt_groups, in_view=False),
                                        # the server's and the registry's alone: no party's masked sum
                                        # depends on it, and its reply is no masked one
                                        GROUPS_SUM: Handles(msgs.Kind.QUERY, decrypt_sums, in_view=False),
                                        TRAIN_ACTIVE_LEG: Handles(msgs.Kind.ROUND, active_leg,
                                                                  keeps=(MODEL_STATE, newton.NEWTON_STATE),
                                                                  leg=True)}))
