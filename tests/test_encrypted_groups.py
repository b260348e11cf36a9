"""Encrypted groups (jobs/encrypted_groups.py): the server's sums over the registry's encrypted
group indicators are the true per-group sums; every message of the exchange holds no row's
group for anyone but the registry; the registry refuses what its budget and slot bound
refuse; a lying server isolates rows only within them (tools/registry_attack.py)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

pytest.importorskip("tenseal")

from flwr.app import Array, Message  # noqa: E402

from fairvfl_flwr.app.client import app as client_app  # noqa: E402
from fairvfl_flwr.app.run import run_inprocess  # noqa: E402
from fairvfl_flwr.algorithms import newton  # noqa: E402
from fairvfl_flwr.config import ConfigError, RunConfig  # noqa: E402
from fairvfl_flwr.config.algorithms import resolve  # noqa: E402
from fairvfl_flwr.core.constraints.cells import EncryptedConstraint, model_sums  # noqa: E402
from fairvfl_flwr.core.newton import SHARED_MEMORY, ModelledSpace, RowwiseSpace  # noqa: E402
from fairvfl_flwr.core.stopping import GAP_SLACK  # noqa: E402
from fairvfl_flwr.config.node import NodeConfig  # noqa: E402
from fairvfl_flwr.core.constraints import SensitiveGroups, gap_weights, gaps_per_row, kind_named  # noqa: E402
from fairvfl_flwr.core.constraints.cells import GroupCells  # noqa: E402
from fairvfl_flwr.data.partydata import server_labels_for  # noqa: E402
from fairvfl_flwr.data.problem import constraint_groups, load_data, party_problem, whole_table  # noqa: E402
from fairvfl_flwr.features import ckks  # noqa: E402
from fairvfl_flwr.flower import protocol as msgs  # noqa: E402
from fairvfl_flwr.flower.arrays import to_array, to_numpy  # noqa: E402
from fairvfl_flwr.flower.errors import FederationError  # noqa: E402
from fairvfl_flwr.flower.inprocess import InProcessGrid  # noqa: E402
from fairvfl_flwr.flower.party import MODEL_STATE  # noqa: E402
from fairvfl_flwr.jobs import encrypted_groups as eg  # noqa: E402
from fairvfl_flwr.tools import registry_attack  # noqa: E402
from fairvfl_flwr.tools.malicious import LyingGrid  # noqa: E402

from .conftest import assert_masked_run_is_plain  # noqa: E402
from .test_registry import Recording, guessing_accuracy  # noqa: E402

ROUNDS = 5


def federation(**registry):
    """COMPAS with 6 parties, the last the registry with node config ``registry``: the grid, the
    oracle, the run config, the data and the registry's node id."""
    cfg = RunConfig.from_flower({"groups.holder": "registry", "dataset": "compas", "num-server-rounds": ROUNDS})
    configs = [{"partition-id": k, "num-partitions": 6} for k in range(6)]
    configs[-1].update(registry)
    grid = Recording(client_app, cfg.to_flower(), 6, node_configs=configs)
    ds = load_data(cfg)
    labels = server_labels_for(cfg, ds)
    oracle = eg.connect(grid, cfg, labels.ids_digest, {"train": len(ds.y_train), "test": len(ds.y_test)})
    return grid, oracle, cfg, ds, grid.node_ids[-1]


@pytest.fixture(scope="module")
def exact():
    return federation(**{"sum-noise": 0.0, "sums-per-round": 0})


def _registry_key(grid: InProcessGrid, node_id: int):
    """The registry's own key, read off its node's state (only a test can: it is never sent)."""
    seal = ckks.seal_api()
    kept = grid.contexts[node_id].state.array_records[eg.KEY_STATE]
    params = ckks.from_bytes_array(kept["params"])
    ctx, encoder, _ = ckks.seal_context(params)
    key = ckks.load_seal(ctx, ckks.from_bytes_array(kept["key"]), seal.SecretKey, "key")
    return ctx, encoder, seal.Decryptor(ctx, key)


def _decrypt(grid, node_id, blob: bytes) -> np.ndarray:
    seal = ckks.seal_api()
    ctx, encoder, decryptor = _registry_key(grid, node_id)
    pt = seal.Plaintext()
    decryptor.decrypt(ckks.load_ciphertext(ctx, blob, "blob"), pt)
    return np.asarray(encoder.decode_complex(pt))


def test_the_sums_are_the_true_groups_sums_and_give_the_exact_gap(exact):
    grid, oracle, cfg, ds, _ = exact
    truth = SensitiveGroups.of(ds.s_train).codes
    V = np.random.default_rng(0).normal(size=(3, len(truth)))
    want = np.stack([[V[k][truth == g].sum() for g in range(2)] for k in range(3)])
    assert np.allclose(oracle.by_group("train", V, 1), want, atol=1e-5)
    y = ds.y_train
    rows = y == ds.protected_label
    sizes = oracle.sizes("train", rows[None, :], 1)[0]
    assert list(sizes) == [int(np.sum(rows & (truth == g))) for g in range(2)]
    # the DEO loss gap at a model's scores: the row's loss over its group's size, signed by side
    constraint = constraint_groups(cfg, y, ds.s_train, ds.protected_label,
                                   whole=whole_table(y, ds.s_train, ds.y_test, ds.s_test))
    z = ds.X_train @ np.random.default_rng(1).normal(scale=0.2, size=ds.X_train.shape[1])
    q = constraint.q.values(y, z)
    P = np.stack([np.where(rows, q / sizes[0], 0.0), np.where(rows, -q / sizes[1], 0.0)])[None]
    assert abs(oracle.mixed("train", P, 2)[0] - constraint.gaps(y, z)[0]) < 1e-9
    # the test rows' indicators too (the test metrics by group)
    test = SensitiveGroups.of(ds.s_test).codes
    assert list(oracle.sizes("test", np.ones((1, len(test)), bool), 2)[0]) == list(np.bincount(test))


def test_no_role_but_the_registry_receives_a_rows_group(exact):
    """Every message of the exchange: the server's replies from the registry hold its parameters,
    ciphertexts and sums, never a value per row; the ciphertexts are the true indicators (under a
    key only the registry holds); what the registry receives decrypts to masked slots that do not
    follow the server's plaintexts."""
    grid, oracle, _, ds, registry = exact
    truth = SensitiveGroups.of(ds.s_train).codes
    V = np.random.default_rng(2).normal(size=(1, len(truth)))
    grid.sent.clear()
    grid.received.clear()
    oracle.by_group("train", V, 3)
    assert {m.metadata.dst_node_id for m in grid.sent} == {registry}
    asked = 2 * len(grid.sent[0].content.array_records["masked"])  # two sums a ciphertext
    for reply in grid.received:
        for name, record in reply.content.array_records.items():
            for key, array in record.items():
                a = array.numpy()
                assert a.dtype == np.uint8 or a.size <= asked, (name, key)
    # the indicators the server was given at the start are the groups, encrypted
    blobs = oracle.indicators.blobs["train"]
    first = np.rint(_decrypt(grid, registry, blobs[0][0]).real).astype(int)
    assert np.array_equal(first[: ckks.SLOTS], (truth[: ckks.SLOTS] == 0).astype(int))
    # what the registry decrypts: slots masked within 2^16 that tell nothing of V ⊙ 1[g]
    (request,) = grid.sent
    slots = _decrypt(grid, registry, ckks.from_bytes_array(request.content.array_records["masked"]["ct-0"]))
    plain = (V[0] * (truth == 0))[: ckks.SLOTS]
    assert np.abs(slots.real).max() <= ckks.MASK_BOUND + eg.VALUE_BOUND
    assert np.std(slots.real) > 0.4 * ckks.MASK_BOUND
    assert abs(np.corrcoef(slots.real[: len(plain)], plain)[0, 1]) < 0.05


def test_the_registry_refuses_what_its_budget_refuses():
    grid, oracle, _, ds, _ = federation(**{"sums-per-round": 4, "sums-per-run": 10})
    V = np.ones((1, len(ds.y_train)))
    oracle.by_group("train", V, 1)  # 2 sums: one ciphertext
    oracle.by_group("train", V, 1)  # 4
    with pytest.raises(FederationError, match="sums-per-round=4: refused"):
        oracle.by_group("train", V, 1)
    oracle.by_group("train", V, 2)  # a new round: 6 in the run
    with pytest.raises(FederationError, match="rounds only advance"):
        oracle.by_group("train", V, 1)
    with pytest.raises(FederationError, match=f"the run has {ROUNDS} rounds"):
        oracle.by_group("train", V, ROUNDS + 2)
    oracle.by_group("train", V, 3)  # 8
    oracle.by_group("train", V, 4)  # 10: the run's budget spent
    with pytest.raises(FederationError, match="after 10 in this run; its budget is 10"):
        oracle.by_group("train", V, 5)
    # the run's budget defaults to a round's times the rounds + 2
    assert NodeConfig.from_flower({}).sums_per_round == 256 and NodeConfig.from_flower({}).sums_per_run == 0


def test_a_slot_beyond_the_bound_is_refused(exact):
    grid, oracle, _, ds, _ = exact
    P = np.zeros((2, 2, len(ds.y_train)))
    P[0, 0, 0] = 2.0 * eg.SLOT_BOUND
    with pytest.raises(FederationError, match="beyond the bound 2\\^17"):
        oracle.ask(oracle.products("train", P, np.zeros((1, ckks.SLOTS), dtype=complex)), 4)


def test_a_lying_server_isolates_rows_only_within_the_budget_and_the_noise():
    """The attack can fail: without noise a packed sum carries 17 rows right, one past the bound
    is refused; with the registry's noise of 256 a sum carries 7, and the round's budget stops
    it after its sums."""
    _, oracle, _, ds, _ = federation(**{"sum-noise": 0.0, "sums-per-round": 0})
    truth = SensitiveGroups.of(ds.s_train).codes
    got = registry_attack.attack(oracle, truth, 17, 8, noise=0.0, server_round=1)
    assert (got.sums, got.attempted, got.correct) == (8, 8 * 17, 8 * 17)
    refused = registry_attack.attack(oracle, truth, 19, 2, noise=0.0, server_round=2)
    assert refused.sums == 0 and "beyond the bound" in refused.refused
    _, oracle, _, _, _ = federation(**{"sum-noise": 256.0, "sums-per-round": 8})
    b = registry_attack.capacity(256.0)
    assert b == 7
    got = registry_attack.attack(oracle, truth, b, 12, noise=256.0, server_round=1, per_request=2)
    assert got.sums == 8 and "sums-per-round=8" in got.refused  # the budget's 8, then refused
    # within the budget the attack does work (what the page measures); the registry's noise is fresh
    # on every sum, as it must be, so a sum now and then decodes a few rows wrong (0.89 to 1.0 over
    # 40 draws, mean 0.99): guessing is right on half
    assert got.accuracy > 0.8
    # one row a sum under the noise is right only as often as 4σ margins allow, never for free
    one = registry_attack.attack(oracle, truth, 1, 2, noise=256.0, server_round=2)
    assert one.sums == 2 and one.attempted == 2


# -- the constraint as the server computes it from sizes and sums --------------------------------
@pytest.mark.parametrize("kind", ["deo", "equalized-odds", "demographic-parity"])
@pytest.mark.parametrize("form", ["pairwise", "overall"])
@pytest.mark.parametrize("groups,measure", [(2, "loss"), (3, "rate")])
def test_the_as_if_constraint_is_the_label_owners(kind, form, groups, measure):
    """Every per-row array of the constraint, mixed by the true groups (Σ_g 1[g_i] x_g(i)), is the
    label owner's exact one; the gaps through the sums, the weight bounds and the projection too."""
    rng = np.random.default_rng(groups)
    n = 600
    y = np.where(rng.random(n) < 0.4, 1, -1)
    s = rng.integers(0, groups, size=n)
    names = tuple(f"g{k}" for k in range(groups))
    exact = kind_named(kind).build(y, s, 1, measure, form=form, names=names)
    onehot = np.stack([s == g for g in range(groups)]).astype(np.float64)  # G × n

    def sizes(masks):
        return np.stack([[int(np.sum(m & (s == g))) for g in range(groups)] for m in masks])

    cells = GroupCells.build(kind_named(kind), y, 1, names, sizes, measure, form=form)
    assert [g.name for g in cells.gap_list] == [g.name for g in exact.gap_list]
    assert np.allclose((onehot[:, :, None] * cells.columns()).sum(axis=0), gap_weights(exact), atol=1e-15)
    z = rng.normal(size=n)
    lo, hi = exact.weight_bounds()
    d = 0.5 * np.where(rng.random(len(lo)) < 0.5, lo, hi)
    lam = np.column_stack([np.maximum(d, 0), np.maximum(-d, 0)]).reshape(-1)
    assert np.allclose((onehot * cells.masked_weights(y, z, lam)).sum(axis=0), exact.masked_weights(y, z, lam),
                       rtol=1e-12, atol=1e-15)
    assert np.allclose(cells.gaps(y, z, lambda P: (P * onehot[None]).sum(axis=(1, 2))), exact.gaps(y, z), atol=1e-12)
    assert cells.rows_on() == gaps_per_row(exact)
    for mine, theirs in zip(cells.weight_bounds(), exact.weight_bounds()):
        assert np.allclose(mine, theirs)
    assert np.allclose(cells.project(50 * lam), exact.project(50 * lam))


def test_the_gaps_through_the_registry_are_the_exact_ones(exact):
    """Equalized odds on COMPAS (two subsets, two gaps): the server's gaps from the registry's sizes
    and sums are the label owner's, to CKKS precision."""
    _, oracle, cfg, ds, _ = exact
    y = ds.y_train
    owner = constraint_groups(cfg.replace(constraint="equalized-odds"), y, ds.s_train, ds.protected_label,
                              whole=whole_table(y, ds.s_train, ds.y_test, ds.s_test))
    cells = GroupCells.build(kind_named("equalized-odds"), y, ds.protected_label, oracle.names,
                             lambda masks: oracle.sizes("train", masks, ROUNDS), owner.measure)
    z = ds.X_train @ np.random.default_rng(3).normal(scale=0.2, size=ds.X_train.shape[1])
    got = cells.gaps(y, z, lambda P: oracle.mixed("train", P, ROUNDS))
    assert np.allclose(got, owner.gaps(y, z), atol=1e-9) and len(got) == 2


@pytest.mark.parametrize("kind", ["equalized-odds", "demographic-parity"])
def test_small_groups_are_pooled_from_their_sizes_as_the_label_owners_run_pools_them(kind):
    """COMPAS race, six values, three below min-group-size: the server decides the pooling on the
    sizes it asks (every row, training and test), sums the members' encrypted indicators into
    the pooled one, and holds the label owner's pooled constraint: the same groups, sizes and
    gaps, and the pooled indicator decrypts to the members' rows."""
    rc = {"groups.holder": "registry", "dataset": "compas-race", "constraint": kind, "num-server-rounds": ROUNDS}
    cfg = RunConfig.from_flower(rc)
    grid = Recording(client_app, cfg.to_flower(), 6, node_configs=[
        {"partition-id": k, "num-partitions": 6, **({"sum-noise": 0.0} if k == 5 else {})} for k in range(6)])
    ds = load_data(cfg)
    labels = server_labels_for(cfg, ds)
    owner = labels.constraint_for(kind)
    encrypted = eg.encrypted_labels(grid, cfg, labels)
    got = encrypted.constraint_for(kind)
    assert owner.pooling is not None and got.pooling is not None  # COMPAS race is pooled by default
    assert got.pooling.describe() == owner.pooling.describe()
    assert encrypted.group_names == owner.groups.names
    assert [(g.name, g.size_a, g.size_b) for g in got.gap_list] == [(g.name, g.size_a, g.size_b)
                                                                     for g in owner.gap_list]
    z = ds.X_train @ np.random.default_rng(4).normal(scale=0.2, size=ds.X_train.shape[1])
    assert np.allclose(got.gaps(ds.y_train, z), owner.gaps(ds.y_train, z), atol=1e-8)
    # the pooled indicator (the last group) is the members' rows, under the registry's key
    pooled = encrypted.sums.indicators.blobs["train"][-1][0]
    slots = _decrypt(grid, grid.node_ids[-1], pooled).real[: min(ckks.SLOTS, len(ds.y_train))]
    want = owner.groups.codes[: len(slots)] == len(owner.groups.names) - 1
    assert np.allclose(slots, want.astype(float), atol=1e-4)
    refused = cfg.replace(pool_small_groups=False)
    with pytest.raises(ConfigError, match="fewer than min-group-size"):
        eg.encrypted_labels(Recording(client_app, refused.to_flower(), 6, node_configs=[
            {"partition-id": k, "num-partitions": 6} for k in range(6)]), refused, labels)


def test_a_masked_encrypted_run_is_the_unmasked_one(tmp_path):
    """Under secure aggregation (on by default with own tables) the label owner's legs continue the
    round's view and the registry's sums stay outside it: the same run, to fixed-point precision."""
    nodes = [{"partition-id": k, "num-partitions": 6, **({"sum-noise": 0.0} if k == 5 else {})} for k in range(6)]
    rc = {"dataset": "compas", "constraint": "equalized-odds", "groups.holder": "registry", "groups.release": "ckks",
          "optimizer": "gd", "num-server-rounds": 3}
    assert_masked_run_is_plain(rc, tmp_path, nodes, atol=1e-9)


class ReplayedLeg(LyingGrid):
    """A lying server that keeps the label owner's first leg of round 1 and sends it again, its view
    resealed, in place of round 2's first leg: an old leg's sums against the party's new products."""

    kept = None

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            if m.metadata.message_type != eg.TRAIN_ACTIVE_LEG:
                continue
            r = int(m.content.config_records[msgs.ROUND]["round"])
            if r == 1 and self.kept is None:
                self.kept = copy.deepcopy(m.content)
            elif r == 2 and self.kept is not None:
                m.content = copy.deepcopy(self.kept)
        return super().push_messages(messages)


def test_a_leg_replayed_into_a_later_round_is_refused(tmp_path):
    """Legs continue their round's view: one of an earlier round does not continue the label
    owner's view of this one, and it refuses it, naming the round, before any step."""
    rc = RunConfig.from_flower({"dataset": "compas", "groups.holder": "registry", "groups.release": "ckks",
                                "num-server-rounds": 3, "privacy.secure-aggregation": True,
                                "output-dir": str(tmp_path)})
    grid = ReplayedLeg(client_app, rc.to_flower(), 6)
    with pytest.raises(FederationError, match="does not continue the view this party holds"):
        run_inprocess(rc.to_flower(), quiet=True, grid=grid)
    assert grid.kept is not None


class LyingScale(LyingGrid):
    """A lying server that names a passive party's ν scale 2^e out of the range the channel uses
    (or not as an integer) in round 2's first leg: the party must refuse, not unmask its gradient
    by a scale the server picked."""

    def __init__(self, *args, said, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.said = said

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            said = m.content.config_records.get(ckks.NU_SCALE)
            if said is not None and int(m.content.config_records[msgs.ROUND]["round"]) == 2:
                said["log2"] = self.said
        return super().push_messages(messages)


@pytest.mark.parametrize("said", [ckks.MAX_NU_LOG2 + 1, -1, 2.5, True])
def test_a_passive_party_refuses_a_nu_scale_out_of_range(tmp_path, said):
    rc = RunConfig.from_flower({**RUN, **ENCRYPTED, "output-dir": str(tmp_path)})
    grid = LyingScale(client_app, rc.to_flower(), 6, said=said)
    with pytest.raises(FederationError, match="names ν's scale"):
        run_inprocess(rc.to_flower(), quiet=True, grid=grid)


def test_a_passive_partys_gradient_from_nu_under_the_registrys_key(exact):
    """ν as the server can send it: Σ_g Enc(1[g]) ⊙ n·ν_g (ν as if each row were in each group); a
    passive party's masked products of it with its columns (features/ckks.py, unchanged), the
    registry's slot sums and the party's unmasking give X_kᵀν of the label owner's exact ν."""
    _, oracle, cfg, ds, _ = exact
    y, n = ds.y_train, len(ds.y_train)
    owner = constraint_groups(cfg, y, ds.s_train, ds.protected_label,
                              whole=whole_table(y, ds.s_train, ds.y_test, ds.s_test))
    cells = GroupCells.build(kind_named("deo"), y, ds.protected_label, oracle.names,
                             lambda masks: oracle.sizes("train", masks, ROUNDS), owner.measure)
    z = ds.X_train @ np.random.default_rng(4).normal(scale=0.2, size=ds.X_train.shape[1])
    lam = np.array([0.4, 0.0]) * owner.weight_bounds()[1][0]
    blobs = oracle.encrypt_mixture("train", n * cells.masked_weights(y, z, lam))
    X = np.ascontiguousarray(ds.X_train[:, 3:8])  # a passive party's five columns
    cts, mask_sums = ckks.masked_column_sums(oracle.indicators.params, blobs, X, np.random.default_rng())
    gradient = ckks.unmask(oracle.ask(cts, ROUNDS), mask_sums, n, X.shape[1])
    assert np.allclose(gradient, X.T @ owner.masked_weights(y, z, lam), rtol=1e-6, atol=1e-9)
    # scaled by 2^e as the channel sends it (nu_log2): every slot within 2^10 times the column's largest value,
    # and the party's gradient divided back
    values = n * cells.masked_weights(y, z, lam)
    e = eg.nu_log2(values, ckks.chunks(n))
    assert e > 0 and 2.0**e * np.abs(values).max() * ckks.chunks(n) <= eg.VALUE_BOUND
    cts, mask_sums = ckks.masked_column_sums(oracle.indicators.params, oracle.encrypt_mixture("train", 2.0**e * values),
                                             X, np.random.default_rng())
    scaled = ckks.unmask(oracle.ask(cts, ROUNDS), mask_sums, n, X.shape[1]) / 2.0**e
    assert np.allclose(scaled, X.T @ owner.masked_weights(y, z, lam), rtol=1e-6, atol=1e-9)


# -- a whole run: gradient descent with the groups under the registry's key ----------------------------
ENCRYPTED = {"groups.holder": "registry", "groups.release": "ckks"}
RUN = {"dataset": "compas", "optimizer": "gd", "num-server-rounds": 4, "eval-every": 2, "stop-tolerance": 0}


def _history(folder) -> list[dict]:
    return json.loads((folder / "history.json").read_text())


def encrypted_run(folder, leak: bool = False):
    """COMPAS, 6 parties, 4 rounds of gradient descent with the registry's groups encrypted (its noise
    off), every message recorded; ``leak``: the server's channel also sends the label owner the true
    groups (a planted leak the attack below must catch)."""
    rc = RunConfig.from_flower({**RUN, **ENCRYPTED, "output-dir": str(folder)})
    configs = [{"partition-id": k, "num-partitions": 6} for k in range(6)]
    configs[-1]["sum-noise"] = 0.0
    grid = Recording(client_app, rc.to_flower(), 6, node_configs=configs)
    if leak:
        truth = SensitiveGroups.of(load_data(rc).s_train).codes
        honest = eg.RegistryChannel.outgoing

        def leaking(self, server, messages):
            honest(self, server, messages)
            for m in messages:
                payload = m.content.array_records.get(msgs.PAYLOAD)
                if payload is not None and eg.WEIGHTS_KEY in payload:
                    payload["leak"] = Array(truth.astype(np.float64))

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(eg.RegistryChannel, "outgoing", leaking)
            summary, out = run_inprocess(rc.to_flower(), quiet=True, grid=grid)
    else:
        summary, out = run_inprocess(rc.to_flower(), quiet=True, grid=grid)
    return grid, rc, summary, out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    exact_summary, exact_folder = run_inprocess({**RUN, "output-dir": str(tmp_path_factory.mktemp("exact"))},
                                                quiet=True)
    grid, rc, summary, folder = encrypted_run(tmp_path_factory.mktemp("encrypted"))
    return (exact_summary, _history(exact_folder)), (grid, rc, summary, _history(folder), folder)


@pytest.mark.slow  # whole in-process runs: the oracle's own tests stay in the fast loop
def test_an_encrypted_run_is_the_label_owners_run(runs):
    """The same gradient-descent run, to CKKS precision: every round's loss, gaps, λ and test metrics."""
    (exact_summary, exact), (_, _, summary, encrypted, _) = runs
    assert len(exact) == len(encrypted) == RUN["num-server-rounds"] + 1
    for a, b in zip(exact, encrypted):
        assert abs(a["loss"] - b["loss"]) < 1e-8
        assert np.allclose(list(a["gaps"].values()), list(b["gaps"].values()), atol=1e-8)
        assert np.allclose(a["lambdas"], b["lambdas"], atol=1e-8)
        for k in ("acc", "dfp", "dfn", "dp_diff", "eo_diff"):
            assert (a[k] is None and b[k] is None) or abs(a[k] - b[k]) < 1e-8, k
    assert abs(exact_summary["test_acc"] - summary["test_acc"]) < 1e-9
    assert abs(exact_summary["train_dp_diff"] - summary["train_dp_diff"]) < 1e-8


def _roles(grid, rc) -> dict[str, list[np.ndarray]]:
    """Every array each role received, a 2-D one row by row, but the logits, partial or summed (z):
    COMPAS's few categorical columns make them proxies of race that take few values, in every run
    whoever holds the groups. The server (every reply), the label owner, the passive parties and
    the registry (every message sent to them)."""
    roles = {0: "label owner", rc.num_parties - 1: "registry"}
    out: dict[str, list[np.ndarray]] = {"server": [], "label owner": [], "passive": [], "registry": []}

    def rows(message):
        if message.has_error():
            return []
        arrays = [a.numpy() for name, record in message.content.array_records.items() if name != msgs.LOGITS
                  for key, a in record.items() if key != "z"]
        return [r for a in arrays for r in (a if a.ndim == 2 else [a])]

    for reply in grid.received:
        out["server"] += rows(reply)
    for message in grid.sent:
        out[roles.get(grid.partition(message.metadata.dst_node_id), "passive")] += rows(message)
    return out


@pytest.mark.slow
def test_no_role_but_the_registry_receives_a_rows_group_in_a_whole_run(runs):
    """Every message of the run: no array any role but the registry receives is a group column, and
    the best guess of a row's group from any one of them (per (label, value) cell, both groups
    equally often) is no better than from the labels alone; what the label owner and the passive
    parties are sent is as listed."""
    _, (grid, rc, _, _, _) = runs
    ds = load_data(rc)
    truth, y = SensitiveGroups.of(ds.s_train).codes, np.asarray(ds.y_train)
    test_truth = SensitiveGroups.of(ds.s_test).codes
    received = _roles(grid, rc)
    # the guess from the labels alone (a constant array): COMPAS's labels differ by race
    labels_alone = guessing_accuracy([np.zeros(len(y))], truth, y)
    for role in ("server", "label owner", "passive"):
        for a in received[role]:
            for t in (truth, test_truth):
                assert not (a.shape == t.shape and np.array_equal(a, t)), role
        assert guessing_accuracy(received[role], truth, y) <= labels_alone + 0.01, role
    keys: dict[tuple[str, str], set] = {}
    for message in grid.sent:
        role = {0: "label owner"}.get(grid.partition(message.metadata.dst_node_id), "other")
        payload = message.content.array_records.get(msgs.PAYLOAD)
        if payload is not None:
            keys.setdefault((role, message.metadata.message_type), set()).update(
                k if not k.startswith("nu-ct-") else "nu-ct" for k in payload)
    assert keys[("label owner", msgs.TRAIN_ACTIVE)] == {"z", "lam", eg.WEIGHTS_KEY}
    assert keys[("label owner", eg.TRAIN_ACTIVE_LEG)] == {eg.SUMS_KEY}
    assert keys[("other", msgs.TRAIN_PASSIVE_ENC)] == {"nu-ct"}
    assert keys[("other", msgs.TRAIN_PASSIVE_UNMASK)] == {msgs.MASKED_SUM}
    # the label owner's weights as if in each group depend on its rows' labels only
    weights = [m for m in grid.sent if m.metadata.message_type == msgs.TRAIN_ACTIVE][-1]
    w = weights.content.array_records[msgs.PAYLOAD][eg.WEIGHTS_KEY].numpy()
    for g in range(len(w)):
        for label in (-1, 1):
            assert len(np.unique(w[g][y == label])) == 1


@pytest.mark.slow
def test_a_planted_leak_is_caught(tmp_path):
    """The attack can fail: a channel that also sends the label owner the true groups makes the
    same guess from what the label owner received exact."""
    grid, rc, _, _ = encrypted_run(tmp_path, leak=True)
    ds = load_data(rc)
    truth, y = SensitiveGroups.of(ds.s_train).codes, np.asarray(ds.y_train)
    assert guessing_accuracy(_roles(grid, rc)["label owner"], truth, y) > 0.95


def test_run_config_refuses_what_encrypted_groups_cannot_run_with_and_auto_takes_newton():
    cfg = RunConfig.from_flower(ENCRYPTED)
    assert cfg.encrypted_groups and cfg.optimizer_in_use == "newton"
    assert "per-round Taylor model" in resolve(cfg).reason
    RunConfig.from_flower({**ENCRYPTED, "optimizer": "newton"}).validate()
    for bad, key in (({"privacy.secure-nu": "ckks"}, "privacy.secure-nu"),
                     ({"privacy.nu-noise": 1.0}, "privacy.nu-noise"),
                     ({"model": "mlp", "optimizer": "gd"}, "model")):
        with pytest.raises(ConfigError, match=key):
            RunConfig.from_flower({**ENCRYPTED, **bad})
    assert RunConfig.from_flower({**ENCRYPTED, "privacy.secure-aggregation": "true"}).masked
    # a deployment's default waits for parties that drop out, which encrypted groups cannot: off, not refused
    own = RunConfig.from_flower({**ENCRYPTED, "tables.own": True})
    assert own.masked and own.rejoin_wait == 0 and RunConfig.from_flower({"tables.own": True}).rejoin_wait > 0


@pytest.mark.slow
def test_the_model_card_says_the_registry_held_the_groups_encrypted(runs):
    _, (_, _, _, _, folder) = runs
    manifest = json.loads((folder / "model.json").read_text())
    assert manifest["groups-release"] == {"holder": "registry", "mechanism": "ckks"}
    assert manifest["metrics"]["groups"] == {} and manifest["metrics"]["intervals"] == {}
    assert "under its own CKKS key" in (folder / "model-card.md").read_text()


# -- block Newton on encrypted groups: the search's Taylor model of the gaps -------------------------
def _cells_and_truth(kind: str, measure: str, seed: int = 0):
    """A constraint over two groups on 500 rows, as the server holds it (sizes only) and as the label
    owner does, with the true sums as the oracle."""
    rng = np.random.default_rng(seed)
    n = 500
    y = np.where(rng.random(n) < 0.45, 1, -1)
    s = rng.integers(0, 2, size=n)
    onehot = np.stack([s == g for g in range(2)]).astype(np.float64)
    exact = kind_named(kind).build(y, s, 1, measure, names=("a", "b"))
    cells = GroupCells.build(kind_named(kind), y, 1, ("a", "b"),
                             lambda masks: np.stack([[int(np.sum(m & (s == g))) for g in range(2)] for m in masks]),
                             measure)
    return y, exact, cells, lambda P: (P * onehot[None]).sum(axis=(1, 2)), rng


@pytest.mark.parametrize("kind,measure", [("deo", "loss"), ("equalized-odds", "rate")])
def test_the_taylor_model_of_the_gaps_is_exact_at_its_point_and_of_second_order_around_it(kind, measure):
    """The registry's sums give every gap's value, slopes and (room allowing) Hessian in the step
    lengths: the modelled gaps, ν's part and the multipliers' slopes are the label owner's at α = 0,
    and off by O(|α|³) around it (O(|α|²) for the linear model)."""
    y, exact, cells, sums, rng = _cells_and_truth(kind, measure)
    n, J = len(y), 4
    z, du = rng.normal(size=n), rng.normal(scale=0.3, size=(n, J))
    encrypted = EncryptedConstraint(cells, sums)
    rows = RowwiseSpace(exact, y, z, du)
    lam = np.abs(rng.normal(scale=0.2, size=exact.num_multipliers))
    errors = {}
    for room, hessian in ((None, True), (model_sums(len(exact.gap_list), J, False), False)):
        space = ModelledSpace(EncryptedConstraint(cells, sums, room=lambda r=room: r).taylor(y, z, du), y, z, du)
        assert (space.model.W is not None) == hessian
        zero = np.zeros(J)
        assert np.allclose(space.gaps(zero), rows.gaps(zero), atol=1e-12)
        assert np.allclose(space.slopes(zero), rows.slopes(zero), atol=1e-12)
        assert abs(space.value(zero, lam) - rows.value(zero, lam)) < 1e-12
        assert np.allclose(space.gradient(zero, lam), rows.gradient(zero, lam), atol=1e-12)
        step = rng.normal(size=J)
        errors[hessian] = [float(np.max(np.abs(space.gaps(t * step) - rows.gaps(t * step)))) for t in (0.1, 0.05)]
    assert errors[True][1] < errors[True][0] / 6  # third order: halving the step cuts the error by about 8
    assert 2.5 < errors[False][0] / errors[False][1] < 6  # second order: by about 4
    assert encrypted.taylor(y, z, du).W is not None  # no limit: the Hessian
    with pytest.raises(ValueError, match="sums-per-round"):
        EncryptedConstraint(cells, sums, room=lambda: 3).taylor(y, z, du)


def test_a_step_where_the_model_does_not_hold_is_searched_again_on_the_corrected_model():
    """The search checks its step against the true gaps (one sum a gap): where the model is off by
    more than the tolerance it takes the true gaps there as a secant and searches again; the step
    it keeps has every modelled gap within the tolerance of the true one."""
    from fairvfl_flwr.core.newton import MODEL_TOLERANCE, search_step
    y, exact, cells, sums, rng = _cells_and_truth("equalized-odds", "rate", seed=3)
    n, J = len(y), 3
    z, du = rng.normal(size=n), rng.normal(scale=1.5, size=(n, J))
    asked = []

    def counted(P):
        asked.append(len(P))
        return sums(P)

    encrypted = EncryptedConstraint(cells, counted, room=lambda: model_sums(2, J, False) + 10)  # linear
    a, b, lam = np.zeros(J), np.eye(J), np.zeros(exact.num_multipliers)
    alpha, new, _ = search_step(y, z, du, a, b, lam, encrypted, 1e-3, epsilon=0.01)
    assert len(asked) > 2  # the model, then at least one check that failed and one that held
    assert np.max(np.abs(exact.gaps(y, z + du @ alpha))) <= 0.01 + MODEL_TOLERANCE + 1e-9
    exact_alpha, _, _ = search_step(y, z, du, a, b, lam, exact, 1e-3, epsilon=0.01)
    assert np.max(np.abs(du @ (alpha - exact_alpha))) < 0.05


@pytest.mark.parametrize("seed", [0, 5])
def test_a_missed_step_takes_the_true_slopes_there_and_lands_on_the_exact_constrained_step(seed):
    """Where the round's budget holds the gaps' slopes at the step, the constrained search on a linear
    model whose step misses (a gap held at its bound left short of it counts) takes them, and lands
    where the label owner's search does: its loss within 2e-4 of that step's and its logits within
    0.1, the registry asked for no more than the budget. On the value secant alone it stopped where
    the model, not the true gap, met the bound: 1e-3 of loss short, its logits 0.3 apart."""
    from fairvfl_flwr.core.newton import MODEL_TOLERANCE, search_step
    from fairvfl_flwr.core.constraints.measures import logistic_loss
    y, exact, cells, sums, rng = _cells_and_truth("equalized-odds", "rate", seed=seed)
    n, J, C = len(y), 6, 2
    z, du = rng.normal(size=n), rng.normal(size=(n, J))
    budget, asked = model_sums(C, J, False) + 3 * C * (3 + J), []

    def counted(P):
        asked.append(len(P))
        return sums(P)

    encrypted = EncryptedConstraint(cells, counted, room=lambda: budget - sum(asked))  # the linear model
    a, b, lam = np.zeros(J), np.eye(J), np.zeros(exact.num_multipliers)
    alpha, _, _ = search_step(y, z, du, a, b, lam, encrypted, 1e-3, epsilon=0.01)
    exact_alpha, _, _ = search_step(y, z, du, a, b, lam, exact, 1e-3, epsilon=0.01)
    assert sum(asked) <= budget
    assert np.max(np.abs(exact.gaps(y, z + du @ alpha))) <= 0.01 + MODEL_TOLERANCE
    loss = [logistic_loss(y, z + du @ s).mean() for s in (alpha, exact_alpha)]
    assert abs(loss[0] - loss[1]) < 2e-4
    assert np.max(np.abs(du @ (alpha - exact_alpha))) < 0.1


def test_noise_along_the_directions_null_space_moves_no_modelled_gap():
    """Directions that repeat one another (a party's memory move along its new direction) leave Δu a
    null space, where the registry's sums carry only their noise: the model drops it, so the search
    cannot meet the bound by moving α along directions that change no logit. Its step has every true
    gap within the bound and its logits near the label owner's; with the noise kept there a search
    ended at a true gap of 0.08 against ε = 0.01, its logits 4.5 from the label owner's."""
    from fairvfl_flwr.core.newton import MODEL_TOLERANCE, search_step
    for seed in (0, 1):
        y, exact, cells, sums, rng = _cells_and_truth("deo", "loss", seed=seed)
        z, base = rng.normal(size=len(y)), rng.normal(scale=0.5, size=(len(y), 3))
        du = np.column_stack([base, base[:, 0] + base[:, 1]])
        noise = np.random.default_rng(100 + seed)
        noisy = EncryptedConstraint(cells, lambda P: sums(P) + noise.normal(0.0, 1e-6, size=len(P)))
        a, b, lam = np.zeros(4), 1e-8 * np.eye(4), np.zeros(exact.num_multipliers)
        alpha, _, _ = search_step(y, z, du, a, b, lam, noisy, 1e-3, epsilon=0.01)
        exact_alpha, _, _ = search_step(y, z, du, a, b, lam, exact, 1e-3, epsilon=0.01)
        assert np.max(np.abs(exact.gaps(y, z + du @ alpha))) <= 0.01 + MODEL_TOLERANCE + 1e-5, seed
        assert np.max(np.abs(du @ (alpha - exact_alpha))) < 0.2, seed


def test_a_budget_that_holds_the_model_over_some_directions_searches_those_first():
    """Where the round's sums hold the linear model over only some directions (several gaps), the
    search keeps the first of the server's priority (every party's new direction first) and steps 0
    along the rest; where they hold it over all, it keeps all."""
    from fairvfl_flwr.core.newton import kept_directions, search_step
    y, exact, cells, sums, rng = _cells_and_truth("equalized-odds", "rate", seed=5)
    n, J, C = len(y), 6, 2
    z, du = rng.normal(size=n), rng.normal(scale=0.3, size=(n, J))
    priority = np.array([0, 3, 1, 4, 2, 5])  # two parties' [new, moves]: the new directions first
    tight = EncryptedConstraint(cells, sums, room=lambda: C * (2 + 3))
    assert list(kept_directions(tight, J, priority)) == [0, 1, 3]
    assert kept_directions(EncryptedConstraint(cells, sums, room=lambda: C * (2 + J)), J, priority) is None
    assert kept_directions(exact, J, priority) is None  # row by row: every direction
    alpha, _, _ = search_step(y, z, du, np.zeros(J), np.eye(J), np.zeros(4), tight, 1e-3, epsilon=0.01,
                              priority=priority)
    assert np.all(alpha[[2, 4, 5]] == 0) and np.any(alpha[[0, 1, 3]] != 0)


NEWTON_RUNS = {
    # the constrained search (ConstrainedSearch) on both sides, ε on the loss gap or the smooth rates: both
    # runs end by the stop rule
    "deo": {"constraint": "deo", "num-server-rounds": 100},
    "equalized-odds": {"constraint": "equalized-odds", "hard-epsilon": False, "num-server-rounds": 40},
    "demographic-parity": {"constraint": "demographic-parity", "hard-epsilon": False, "num-server-rounds": 40},
}


def _newton_runs(tmp_path, rc: dict, **nodes):
    """The label owner's block Newton run on COMPAS and the same run on the registry's encrypted groups
    (its noise off; ``nodes``: its node config besides), recorded: (summaries, histories, grid)."""
    exact, exact_folder = run_inprocess({"dataset": "compas", **rc, "output-dir": str(tmp_path / "exact")}, quiet=True)
    run = RunConfig.from_flower({"dataset": "compas", **rc, **ENCRYPTED, "output-dir": str(tmp_path / "encrypted")})
    configs = [{"partition-id": k, "num-partitions": 6} for k in range(6)]
    configs[-1].update({"sum-noise": 0.0, **nodes})
    grid = Recording(client_app, run.to_flower(), 6, node_configs=configs)
    encrypted, folder = run_inprocess(run.to_flower(), quiet=True, grid=grid)
    return (exact, encrypted), (_history(exact_folder), _history(folder)), grid


def _sums_by_round(grid) -> dict[int, int]:
    out: dict[int, int] = {}
    for m in grid.sent:
        if m.metadata.message_type == eg.GROUPS_SUM:
            r = int(m.content.config_records["sum"]["round"])
            out[r] = out.get(r, 0) + 2 * len(m.content.array_records["masked"])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(NEWTON_RUNS))
def test_an_encrypted_newton_run_is_the_label_owners_run(tmp_path, name):
    """Block Newton on the registry's encrypted groups against the label owner's run on the same
    rows, the registry's noise off: at most 2 rounds more or fewer, every final training gap within 0.002,
    the same test accuracy (one of COMPAS's 478 test rows is 0.21 points), and no
    round asks the registry for more than its sums-per-round (256)."""
    (exact, encrypted), (h_exact, h_enc), grid = _newton_runs(tmp_path, {**NEWTON_RUNS[name], "optimizer": "auto"})
    assert any(m.metadata.message_type == msgs.NEWTON_ACTIVE for m in grid.sent)  # auto took block Newton
    assert len(h_exact) - 2 <= len(h_enc) <= len(h_exact) + 2
    for key, value in h_exact[-1]["gaps"].items():
        assert abs(h_enc[-1]["gaps"][key] - value) <= 0.002, key
    assert encrypted["test_acc"] == exact["test_acc"]
    spent = _sums_by_round(grid)
    assert max(spent.values()) <= 256 and len(spent) >= len(h_enc) - 1


@pytest.mark.slow
def test_under_the_registrys_noise_a_deo_run_holds_its_gap_every_round_and_ends_with_the_label_owners(tmp_path):
    """The registry's default noise (sum-noise 4) on every sum, the parties' gradients included: the
    encrypted DEO run's constrained search holds the training gap within ε + GAP_SLACK from round 1 on
    (a search at fixed multipliers follows the noise in the parties' directions wherever it costs F
    little, and its gaps swing past ε round after round), and it ends, by the stop rule, no later than
    2 rounds after the label owner's, its final gap within 0.002 and its test accuracy within one row."""
    rc = {**NEWTON_RUNS["deo"], "optimizer": "auto"}
    (exact, encrypted), (h_exact, h_enc), grid = _newton_runs(tmp_path, rc, **{"sum-noise": 4.0})
    assert len(h_enc) - 1 < rc["num-server-rounds"]  # the stop rule ended it
    assert max(row["max_gap"] for row in h_enc[1:]) <= 0.01 + GAP_SLACK
    assert len(h_enc) <= len(h_exact) + 2
    for key, value in h_exact[-1]["gaps"].items():
        assert abs(h_enc[-1]["gaps"][key] - value) <= 0.002, key
    one_row = 1.0 / len(load_data(RunConfig.from_flower({"dataset": "compas"})).y_test)
    assert abs(encrypted["test_acc"] - exact["test_acc"]) <= max(0.001, one_row) + 1e-12


@pytest.mark.slow
def test_a_tight_budget_drops_the_gaps_hessian_and_is_never_passed(tmp_path):
    """A registry that decrypts 160 sums a round: the search's model fits within them (linear where the
    gaps' Hessian would not fit, over fewer directions where the linear one would not), no round asks
    for more, and the run still meets ε within two rounds of the label owner's, its accuracy within half
    a point."""
    (exact, encrypted), (h_exact, h_enc), grid = _newton_runs(
        tmp_path, NEWTON_RUNS["equalized-odds"], **{"sums-per-round": 160})
    spent = _sums_by_round(grid)
    assert max(spent.values()) <= 160
    assert abs(len(h_enc) - len(h_exact)) <= 2
    assert max(abs(v) for v in h_enc[-1]["gaps"].values()) <= 0.01 + 1e-3
    assert abs(encrypted["test_acc"] - exact["test_acc"]) <= 0.005


@pytest.mark.slow
def test_a_budget_too_small_for_a_round_is_refused_naming_it(tmp_path):
    """Where the registry's sums a round cannot hold a round (its parties' products and the search's
    model over one direction), the run stops with the reason, naming the node config to raise."""
    with pytest.raises(Exception, match="sums-per-round"):
        _newton_runs(tmp_path, NEWTON_RUNS["equalized-odds"], **{"sums-per-round": 40})


@pytest.mark.slow
def test_a_masked_encrypted_newton_run_is_the_unmasked_shared_step_run(tmp_path, monkeypatch):
    """Under secure aggregation (shared step lengths) the encrypted-groups Newton run is the same
    shared-step run over plain replies: the label owner's leg continues the round's view."""
    rc = {"dataset": "compas", **NEWTON_RUNS["equalized-odds"], **ENCRYPTED}
    nodes = [{"partition-id": k, "num-partitions": 6, **({"sum-noise": 0.0} if k == 5 else {})} for k in range(6)]
    masked, m_folder = run_inprocess({**rc, "privacy.secure-aggregation": True, "output-dir": str(tmp_path / "m")},
                                     quiet=True, node_configs=nodes)
    monkeypatch.setattr(newton, "NewtonVFL", newton.SharedNewtonVFL)  # the shared steps without the masks
    plain, p_folder = run_inprocess({**rc, "newton-memory": SHARED_MEMORY, "output-dir": str(tmp_path / "p")},
                                    quiet=True, node_configs=nodes)
    assert len(_history(m_folder)) == len(_history(p_folder))
    assert masked["test_acc"] == plain["test_acc"]
    assert abs(masked["train_max_gap"] - plain["train_max_gap"]) < 1e-6


class NullSpaceNoise(LyingGrid):
    """A server (or a registry's noise) that adds ``size`` along the null space of a passive
    party's columns (COMPAS's partition 1: two collinear columns) to the masked sums it relays."""

    def __init__(self, *args, size: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        ds, blocks, _ = party_problem(RunConfig.from_flower({**RUN, **ENCRYPTED}))
        w, v = np.linalg.eigh(blocks[1].T @ blocks[1])
        assert w[0] <= 1e-10 * w[-1] < w[1]  # one null direction
        self.added = size * v[:, 0]

    def tamper(self, msg: Message) -> None:
        payload = msg.content.array_records.get(msgs.PAYLOAD)
        node = self.contexts.get(msg.metadata.dst_node_id)
        if payload is not None and msgs.MASKED_SUM in payload and int(node.node_config["partition-id"]) == 1:
            payload[msgs.MASKED_SUM] = to_array(to_numpy(payload[msgs.MASKED_SUM]) + self.added)


def test_a_partys_gradient_keeps_nothing_along_its_columns_null_space(tmp_path):
    """X_kᵀν has no part along X_k's null space, so whatever the registry's sums carry there is noise
    (which a Newton step takes at 1/μ): the party's model is the one without it, bit for bit."""
    def theta(size: float) -> np.ndarray:
        rc = RunConfig.from_flower({**RUN, **ENCRYPTED, "output-dir": str(tmp_path / str(size))})
        configs = [{"partition-id": k, "num-partitions": 6, **({"sum-noise": 0.0} if k == 5 else {})}
                   for k in range(6)]
        grid = NullSpaceNoise(client_app, rc.to_flower(), 6, node_configs=configs, size=size)
        run_inprocess(rc.to_flower(), quiet=True, grid=grid)
        (ctx,) = [c for c in grid.contexts.values() if int(c.node_config["partition-id"]) == 1]
        return np.concatenate([to_numpy(a).ravel() for a in ctx.state.array_records[MODEL_STATE].values()])

    assert np.allclose(theta(0.0), theta(1e4), rtol=0, atol=1e-9)
