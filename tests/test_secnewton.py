"""Block Newton under secure aggregation ("shared step lengths", algorithms/newton.SharedNewtonVFL):
masked sums equal the plain sums, one party is centralised Newton, the masked run is the
plain shared-step run, the server receives no per-party vector, a lost reply is re-sent
as the same words, and ``optimizer = "auto"`` picks it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fairvfl_flwr.algorithms import newton
from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config.algorithms import resolve
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.core.newton import SHARED_MEMORY, CentralisedNewton
from fairvfl_flwr.data.problem import constraint_groups, load_data, party_columns
from fairvfl_flwr.features import secagg
from fairvfl_flwr.secure import ring, view
from fairvfl_flwr.features import transcripts as tr
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.jobs import saving
from fairvfl_flwr.secure import agreement
from fairvfl_flwr.flower.errors import PartyUnavailable
from fairvfl_flwr.flower.inprocess import InProcessGrid

EXACT = {"dataset": "crime", "optimizer": "newton", "wire-dtype": "float64", "eval-every": 3,
         "stop-tolerance": 0.0}


pytestmark = pytest.mark.usefixtures("private_party_cache")


def _pair_keys(k: int, seed: int = 0) -> list[dict[int, bytes]]:
    rng = np.random.default_rng(seed)
    shared = {(i, j): rng.bytes(32) for i in range(k) for j in range(i + 1, k)}
    return [{j: shared[min(i, j), max(i, j)] for j in range(k) if j != i} for i in range(k)]


def _history(folder: Path) -> list[dict]:
    return json.loads((folder / "history.json").read_text())


# -- the arithmetic ----------------------------------------------------------------------------
def test_masked_sums_equal_the_plain_sums_at_the_fixed_point_encoding():
    k, n, w = 6, 3000, 3
    rng = np.random.default_rng(3)
    keys = _pair_keys(k)
    dirs = [rng.normal(scale=2.0, size=n).astype(np.float32) for _ in range(k)]
    # a and the Gram matrix: float64 of any scale, down to the tiny values near convergence
    small = [rng.normal(size=w + w * w) * 10.0 ** rng.integers(-14, 4, size=w + w * w) for _ in range(k)]
    words = [ring.masked(dirs[i], i, keys[i], 5, "dir", k, f"party {i}") for i in range(k)]
    total = np.sum(words, axis=0, dtype=np.uint64)
    assert np.array_equal(total, np.sum([ring.encode(d, k, "") for d in dirs], axis=0, dtype=np.uint64))
    plain = np.sum([d.astype(np.float64) for d in dirs], axis=0)
    assert np.array_equal(ring.decode(total).astype(np.float32), plain.astype(np.float32))
    wide = [ring.masked_wide(small[i], i, keys[i], 5, "dir-gram", k, f"party {i}", "gram") for i in range(k)]
    encodings = [ring.encode_wide(s, k, "", "") for s in small]
    assert ring.sum_wide(wide) == [sum(col) % 2**128 for col in zip(*encodings)]  # bit for bit
    np.testing.assert_allclose(ring.decode_wide(ring.sum_wide(wide)), np.sum(small, axis=0), rtol=1e-15,
                               atol=1e-19)
    for i in range(k):  # one party's words alone are noise
        assert np.median(np.abs(ring.decode(words[i]) - dirs[i])) > 100.0
        assert np.median(np.abs(ring.decode_wide(ring.sum_wide([wide[i]])))) > 1e6


def test_plain_values_summed_on_the_grid_are_the_masked_sum_bit_for_bit():
    """ring.grid_sum: what a server summing plain replies gets, equal to the decoded masked sum
    to the last bit, where a float sum is not (values below the grid's step, float64 rounding)."""
    k, n, w = 3, 2000, 4
    rng = np.random.default_rng(5)
    keys = _pair_keys(k)
    dirs = [(rng.normal(size=n) * 10.0 ** rng.integers(-10, 1, size=n)).astype(np.float32) for _ in range(k)]
    small = [rng.normal(size=w * w) * 10.0 ** rng.integers(-14, 4, size=w * w) for _ in range(k)]
    masked = ring.decode(np.sum([ring.masked(dirs[i], i, keys[i], 5, "dir", k, "") for i in range(k)], axis=0,
                                dtype=np.uint64))
    masked_wide = ring.decode_wide(ring.sum_wide([ring.masked_wide(small[i], i, keys[i], 5, "dir-gram", k, "", "")
                                                  for i in range(k)]))
    assert np.array_equal(ring.grid_sum(dirs), masked)
    assert np.array_equal(ring.grid_sum([s.reshape(w, w) for s in small], wide=True), masked_wide.reshape(w, w))
    assert not np.array_equal(np.sum(dirs, axis=0, dtype=np.float64), masked)  # what the float sum would differ in
    assert not np.array_equal(np.sum(small, axis=0), masked_wide)
    huge = [np.array([1e9]), np.array([1.0]), np.array([2.0])]  # beyond the ring, where a masked run stops
    assert ring.grid_sum(huge)[0] == 1e9 + 3.0


def test_every_vector_of_a_round_has_its_own_mask():
    keys = _pair_keys(2)[0]
    streams = [ring.mask(keys[1], 7, label, 4).tobytes() for label in ring.SPLITS]
    assert len(set(streams)) == len(ring.SPLITS)


def test_a_wide_value_out_of_range_is_refused_naming_the_party():
    with pytest.raises(ValueError, match="party 2: Newton 'gram'.*not finite or beyond"):
        ring.masked_wide(np.array([1.0, np.nan]), 2, _pair_keys(3)[2], 1, "dir-gram", 3, "party 2", "Newton 'gram'")


# -- whole runs --------------------------------------------------------------------------------
def test_one_party_under_secure_aggregation_is_centralised_newton(tmp_path):
    rc = {**EXACT, "num-parties": 1, "num-server-rounds": 6, "privacy.secure-aggregation": True}
    _, folder = run_inprocess({**rc, "output-dir": str(tmp_path)}, quiet=True)
    history = _history(folder)
    cfg = RunConfig.from_flower(rc)
    ds = load_data(cfg)
    (cols,) = party_columns(cfg, ds)
    constraint = constraint_groups(cfg, ds.y_train, ds.s_train, ds.protected_label)
    ref = CentralisedNewton(ds.X_train[:, cols], ds.y_train, constraint, epsilon=cfg.epsilon, beta=cfg.beta, c=cfg.c,
                            mu=cfg.mu_value(len(ds.y_train)), memory=SHARED_MEMORY)
    for t in range(1, cfg.num_server_rounds + 1):
        ref.round()
        np.testing.assert_allclose(history[t]["lambdas"], ref.lam, rtol=0, atol=1e-9)
        assert history[t]["deo"] == pytest.approx(abs(constraint.gaps(ds.y_train, ref.z())[0]), abs=1e-9)
    with np.load(folder / "parties" / "partition-0" / "block.npz") as f:
        np.testing.assert_allclose(np.append(f["weight"], f["bias"]), ref.theta, rtol=0, atol=1e-9)


class Recording(InProcessGrid):
    """Keeps every message the server pushes and every reply it pulls."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sent, self.received = [], []

    def push_messages(self, messages):
        messages = list(messages)
        self.sent += messages
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        got = list(super().pull_messages(message_ids))
        for m in got:  # a copy: the round hooks rewrite the received records in place
            self.received.append((m.metadata.message_type, m.metadata.group_id, m.metadata.src_node_id,
                                  {name: {k: v.numpy().copy() for k, v in rec.items()}
                                   for name, rec in m.content.array_records.items()},
                                  {name: dict(rec) for name, rec in m.content.metric_records.items()},
                                  {name: dict(rec) for name, rec in m.content.config_records.items()}))
        return got


def _secure_run(tmp_path, name, grid_cls=Recording, **extra):
    rc = RunConfig.from_flower({"dataset": "crime", "optimizer": "newton", "num-parties": 3, "num-server-rounds": 5,
                                "eval-every": 2, "stop-tolerance": 0.0, "privacy.secure-aggregation": True,
                                "output-dir": str(tmp_path / name / "runs"),
                                "privacy.transcript-dir": str(tmp_path / name / "t"), **extra}).to_flower()
    grid = grid_cls(client_app, rc, rc["num-parties"])
    summary, folder = run_server(grid, rc)
    return summary, folder, grid


def test_the_server_never_receives_a_per_party_vector(tmp_path):
    summary, folder, grid = _secure_run(tmp_path, "masked")
    types = {t for t, *_ in grid.received}
    assert {msgs.NEWTON_INIT, msgs.NEWTON_ACTIVE, msgs.NEWTON_PASSIVE, msgs.NEWTON_APPLY} <= types
    for mtype, group, src, arrays, metrics, configs in grid.received:
        if mtype in (msgs.INFO, agreement.SAKEYS, agreement.SAPEERS, saving.SAVE):
            continue  # role and row counts, a public key, digests
        assert set(arrays) in ({msgs.LOGITS}, {msgs.DIRECTIONS}), (mtype, arrays)
        assert len(configs[secagg.SQ_NORM]["sq-norm"]) == 16  # ‖θ_k‖²: one masked 128-bit word
        assert metrics[msgs.STATS]["sq-norm"] == 0.0  # ‖θ_k‖² travels masked
        confirmations = configs[view.CONFIRM]  # one 32-byte HMAC of the round's view per peer
        assert len(confirmations) == 2 and all(isinstance(t, bytes) and len(t) == 32 for t in confirmations.values())
        for record in arrays.values():
            for key, words in record.items():
                assert words.dtype == np.uint64, (mtype, key)
        if msgs.DIRECTIONS in arrays:
            assert set(arrays[msgs.DIRECTIONS]) <= {"dir", "a", "gram", "test", "test-dirs"}
            assert np.median(np.abs(ring.decode(arrays[msgs.DIRECTIONS]["dir"]))) > 100.0  # X_k s_k is O(1)
    # every party gets the same step lengths: one α shared by all
    for t in range(2, 6):
        alphas = [m.content.array_records[msgs.PAYLOAD]["alpha"].numpy() for m in grid.sent if m.metadata.group_id == str(t)]
        assert len(alphas) == 3 and all(np.array_equal(a, alphas[0]) for a in alphas)
        assert len(alphas[0]) == min(t - 1, 1 + SHARED_MEMORY)  # the combined direction and its last moves
    server = {int(r["round"]): r for r in tr.load(tmp_path / "masked" / "t", tr.SERVER)}
    assert server[3]["dir-1"].dtype == np.uint64 and "a-1" in server[3]
    assert {"dir-1", "u-1", "nu", "z"} <= set(server[5])  # the last round's file keeps its directions and the apply leg


def test_the_masked_run_is_the_plain_shared_step_run(tmp_path, monkeypatch):
    """Secure aggregation changes nothing but what the server sees: the same λ, and the same z
    at the wire dtype for the active party, as the shared-step method summing plain replies."""
    masked, m_folder, m_grid = _secure_run(tmp_path, "masked")
    monkeypatch.setattr(newton, "NewtonVFL", newton.SharedNewtonVFL)  # the shared steps without the masks
    # the same number of combined moves as the masked run keeps (newton-shared-memory)
    plain, p_folder, p_grid = _secure_run(tmp_path, "plain", **{"privacy.secure-aggregation": False,
                                                                "newton-memory": SHARED_MEMORY})
    for key in ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn"):
        assert masked[key] == pytest.approx(plain[key], rel=1e-9, abs=1e-12), key
    for a, b in zip(_history(m_folder), _history(p_folder)):
        np.testing.assert_allclose(a["lambdas"], b["lambdas"], rtol=1e-9, atol=1e-12)

    def z_sent(grid):
        return [m.content.array_records[msgs.PAYLOAD]["z"].numpy() for m in grid.sent
                if m.metadata.message_type == msgs.NEWTON_ACTIVE]

    for a, b in zip(z_sent(m_grid), z_sent(p_grid), strict=True):
        assert np.array_equal(a, b)


class LosingGrid(Recording):
    """Loses the first reply of node 2 in round 3; keeps it to compare with the re-send."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.lost = None

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for mid, msg in zip(ids, messages):
            if self.lost is None and msg.metadata.group_id == "3" and msg.metadata.dst_node_id == self.node_ids[2]:
                self.lost = self._replies.pop(mid)
        return ids


def test_a_lost_reply_is_resent_as_the_same_words_and_nobody_is_unmasked(tmp_path):
    clean, _, _ = _secure_run(tmp_path, "clean")
    lossy, _, grid = _secure_run(tmp_path, "lossy", LosingGrid, **{"reliability.round-timeout": 0.5})
    for key in ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn"):
        assert lossy[key] == clean[key], key
    assert grid.lost is not None
    server = {int(r["round"]): r for r in tr.load(tmp_path / "lossy" / "t", tr.SERVER)}
    lost = grid.lost.content.array_records[msgs.DIRECTIONS]
    assert np.array_equal(lost["dir"].numpy(), server[3]["dir-2"])  # the re-sent reply: the same masked words
    assert np.array_equal(lost["gram"].numpy(), server[3]["gram-2"])
    round3 = [r for r in grid.received if r[1] == "3" and r[0] != msgs.NEWTON_APPLY]
    assert len(round3) == 3  # the lost reply never arrived; the re-sent one did, nothing else
    assert all(set(r[3]) == {msgs.DIRECTIONS} and {view.CONFIRM, secagg.SQ_NORM} <= set(r[5]) for r in round3)


def test_auto_picks_shared_step_newton_under_secure_aggregation():
    cfg = RunConfig(optimizer="auto", secure_aggregation="true")
    cfg.validate()
    assert cfg.optimizer_in_use == "newton"
    assert "shared step lengths" in resolve(cfg).reason
    assert "shared step lengths" not in resolve(RunConfig(optimizer="auto")).reason
    mlp = RunConfig(optimizer="auto", model="mlp")  # MLP parties share them masked or not
    assert mlp.shared_steps and "shared step lengths" in resolve(mlp).reason
    assert mlp.newton_moves == mlp.newton_shared_memory
    RunConfig(optimizer="newton", secure_aggregation="true").validate()  # not refused: the steps are shared


class SilentGrid(Recording):
    """Node 2 stops answering from round 3 on (its node is gone)."""

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for mid, msg in zip(ids, messages):
            if msg.metadata.group_id == "3" and msg.metadata.dst_node_id == self.node_ids[2]:
                self._replies.pop(mid)
        return ids


def test_a_party_that_stays_silent_stops_the_run_and_nothing_is_unmasked(tmp_path):
    with pytest.raises(PartyUnavailable, match="partition 2"):
        _secure_run(tmp_path, "silent", SilentGrid, **{"reliability.round-timeout": 0.3,
                                                        "reliability.round-retries": 1})
    rounds = {int(r["round"]) for r in tr.load(tmp_path / "silent" / "t", tr.SERVER)}
    assert rounds == {0, 1, 2}  # round 3's two replies were never summed nor recorded


def test_a_direction_whose_images_would_pass_the_masking_ring_is_scaled_to_a_quarter_of_its_range():
    """Its length is the search's to choose, so only its scale changes, and only past the cap."""
    rng = np.random.default_rng(0)
    x, x_test = rng.normal(size=(50, 2)), rng.normal(size=(20, 2))
    cap = newton.DIRECTION_RANGE * ring.value_bound(4)
    small = np.array([1.0, -2.0])
    assert newton.within_ring(small, x, x_test, 4) is small
    big = small * 10 * cap
    scaled = newton.within_ring(big, x, x_test, 4)
    assert np.max(np.abs(np.concatenate([x @ scaled, x_test @ scaled]))) == pytest.approx(cap)
    assert scaled / np.linalg.norm(scaled) == pytest.approx(big / np.linalg.norm(big))
    ring.encode(x @ scaled, 4, "party 3")  # within the ring: no refusal
    with pytest.raises(ValueError, match="beyond the secure-aggregation range"):
        ring.encode(x @ big, 4, "party 3")
