"""Transcripts for every role, the attacks per role, and secure aggregation of partial logits."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.secure import agreement, ring
from fairvfl_flwr.jobs import key_agreement
from fairvfl_flwr.features import transcripts as tr
from fairvfl_flwr.features.noise import NuNoise
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.tools import attacks
from fairvfl_flwr.tools.audit import run_audit

# -- secure aggregation: the arithmetic -------------------------------------------------------


def _pair_keys(k: int, seed: int = 0) -> list[dict[int, bytes]]:
    rng = np.random.default_rng(seed)
    shared = {(i, j): rng.bytes(32) for i in range(k) for j in range(i + 1, k)}
    return [{j: shared[min(i, j), max(i, j)] for j in range(k) if j != i} for i in range(k)]


def test_masks_cancel_exactly_and_the_sum_is_plain_z_at_the_wire_dtype():
    k, n = 6, 5000
    rng = np.random.default_rng(1)
    u = [rng.normal(scale=3.0, size=n).astype(np.float32) for _ in range(k)]
    u[0][:10] = 0.0
    keys = _pair_keys(k)
    words = [ring.masked(u[i], i, keys[i], 7, "train", k, f"party {i}") for i in range(k)]
    total = np.sum(words, axis=0, dtype=np.uint64)  # wraps mod 2^64, as the server sums
    # the integer sum is exactly the sum of the fixed-point encodings: the masks cancel
    assert np.array_equal(total, np.sum([ring.encode(x, k, "") for x in u], axis=0, dtype=np.uint64))
    plain = np.sum([x.astype(np.float64) for x in u], axis=0)
    assert np.array_equal(ring.decode(total).astype(np.float32), plain.astype(np.float32))
    assert np.max(np.abs(ring.decode(total) - plain)) < 1e-12
    # each party's words on their own are far from its logits (uniform 64-bit words)
    for i in range(k):
        assert np.median(np.abs(ring.decode(words[i]) - u[i])) > 100.0


def test_masks_depend_on_round_and_split_only():
    keys = _pair_keys(3)
    u = np.linspace(-1, 1, 100).astype(np.float32)
    a = ring.masked(u, 1, keys[1], 4, "train", 3, "p")
    assert np.array_equal(a, ring.masked(u, 1, keys[1], 4, "train", 3, "p"))  # a re-send: the same words
    assert not np.array_equal(a, ring.masked(u, 1, keys[1], 5, "train", 3, "p"))
    assert not np.array_equal(a, ring.masked(u, 1, keys[1], 4, "test", 3, "p"))


def test_out_of_range_logits_are_refused_naming_the_party():
    with pytest.raises(ValueError, match="party 3.*beyond the secure-aggregation range"):
        ring.encode(np.array([0.0, 1e6]), 6, "party 3")


def test_refused_combinations():
    with pytest.raises(ConfigError, match="privacy.secure-aggregation=.true.: not supported with staleness.max-staleness"):
        RunConfig().replace(secure_aggregation="true", max_staleness=2)
    assert RunConfig().replace(secure_aggregation="true", resume_from="/tmp/x").masked  # a signed rollback resumes it


# -- a whole run ---------------------------------------------------------------------------------
class LosingGrid(InProcessGrid):
    """Loses the first reply of one node in one round; keeps it to compare with the re-send."""

    def __init__(self, *a, node=2, rnd="3", **kw):
        super().__init__(*a, **kw)
        self.node, self.rnd, self.lost = node, rnd, None

    def push_messages(self, messages):
        ids = super().push_messages(messages)
        for mid, msg in zip(ids, messages):
            if (self.lost is None and msg.metadata.group_id == self.rnd
                    and msg.metadata.dst_node_id == self.node_ids[self.node]):
                self.lost = self._replies.pop(mid)
        return ids


def _run(tmp_path, name, grid_cls=InProcessGrid, **extra):
    rc = RunConfig.from_flower({**RunConfig().to_flower(), "optimizer": "gd", "dataset": "crime", "num-server-rounds": 8,
                                "eval-every": 4, "output-dir": str(tmp_path / "runs"),
                                "privacy.transcript-dir": str(tmp_path / name), "privacy.record-first": 3,
                                "privacy.record-every": 5, "reliability.round-timeout": 0.5, **extra}).to_flower()
    grid = grid_cls(client_app, rc, rc["num-parties"])
    summary, _ = run_server(grid, rc)
    return summary, grid


def test_transcripts_hold_what_each_role_received(tmp_path):
    _run(tmp_path, "plain")
    server = {int(r["round"]): r for r in tr.load(tmp_path / "plain", tr.SERVER)}
    assert sorted(server) == [0, 1, 2, 3, 4, 5, 6]  # 0..3, then 5 with 4 and 6
    assert "nu" not in server[0] and {"nu", "z", "lam", "u-0", "u-5"} <= set(server[2])
    assert "u-test-1" in server[4] and "u-test-1" not in server[3]  # eval-every = 4
    active = {int(r["round"]): r for r in tr.load(tmp_path / "plain", 0)}
    passive = {int(r["round"]): r for r in tr.load(tmp_path / "plain", 3)}
    assert set(active[2]) == {"round", "z", "lam", "own-u"} and set(passive[2]) == {"round", "nu", "own-u"}
    for t in (1, 2, 5):
        assert np.array_equal(passive[t]["nu"], server[t]["nu"])  # what was sent is what arrived
        assert np.array_equal(active[t]["z"], server[t]["z"])
        assert np.array_equal(active[t]["lam"], server[t]["lam"])
        assert np.array_equal(passive[t]["own-u"], server[t]["u-3"])
    z_next = sum(server[2][f"u-{k}"].astype(np.float64) for k in range(6))
    assert np.array_equal(server[3]["z"], z_next.astype(np.float32))  # z(t + 1) = Σ_k u_k(t)


def test_secure_aggregation_same_run_server_sees_noise_and_a_lost_reply_is_resent_identically(tmp_path):
    plain, _ = _run(tmp_path, "plain")
    masked, grid = _run(tmp_path, "masked", LosingGrid, **{"privacy.secure-aggregation": True})
    for key in ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn"):
        assert masked[key] == pytest.approx(plain[key], rel=1e-9, abs=1e-12)
    p = {int(r["round"]): r for r in tr.load(tmp_path / "plain", tr.SERVER)}
    m = {int(r["round"]): r for r in tr.load(tmp_path / "masked", tr.SERVER)}
    for t in (1, 3, 6):
        assert np.array_equal(m[t]["z"], p[t]["z"])  # the summed logits the active party gets: bit for bit
        assert m[t]["u-2"].dtype == np.uint64
        assert np.median(np.abs(ring.decode(m[t]["u-2"]) - p[t]["u-2"])) > 100.0
    # the lost reply of round 3 was re-sent and came back as the same masked words
    assert grid.lost is not None
    lost = grid.lost.content.array_records["logits"]["train"].numpy()
    pid = 2  # InProcessGrid node i holds partition i
    assert np.array_equal(lost, m[3][f"u-{pid}"])


def test_each_attack_beats_chance_undefended_and_secure_aggregation_stops_the_server():
    r = run_audit("crime", rounds=40, noise=0.0)
    assert r["label_attack_acc"] == 1.0 and r["group_attack_auc"] > 0.9
    assert r["server_gram_error"] < 0.1  # the server rebuilds X_k X_kᵀ (guessing 0 scores 1.0)
    assert r["active_gram_error"] < 0.6  # the active party: Σ of the passive Gram matrices, from z
    assert r["coalition_gram_error"] < 0.6  # server + active party: the same sum with the ν as sent
    # distances between people from their logit trajectories (any model): far above shuffled rows
    assert r["server_traj_rho"] > r["server_traj_rho_chance"] + 0.3
    s = run_audit("crime", rounds=40, noise=0.0, overrides={"privacy.secure-aggregation": True})
    assert min(s["server_gram_errors"]) >= 0.9
    assert abs(s["server_traj_rho"]) < 0.2  # masked words: no trajectory to read
    assert s["coalition_gram_error"] < 0.6  # z and the active party's own logits are not masked from it
    assert s["test_acc"] == pytest.approx(r["test_acc"], abs=1e-12)


def test_a_passive_party_cannot_redraw_the_noise_from_the_run_seed():
    r = run_audit("crime", rounds=12, noise=4.0)
    assert r["label_attack_acc"] < 0.7  # one noisy round: near chance
    # the noise is seeded with a secret of the server's too: redrawn from the run seed
    # alone it is another draw, and subtracting it only adds noise
    assert r["label_attack_acc_seeded"] < 0.7


def test_noise_from_the_public_seed_alone_would_be_redrawn_exactly():
    nu = np.linspace(-1, 1, 50) / 50
    public, secret = NuNoise(4.0, 0), NuNoise(4.0, 0, "ab" * 32)
    assert np.allclose(public.nu(None, 1, nu) - public.nu(None, 1, np.zeros(50)), nu)
    assert not np.allclose(secret.nu(None, 1, nu) - public.nu(None, 1, np.zeros(50)), nu, atol=1e-3)
    assert np.array_equal(secret.nu(None, 1, nu), NuNoise(4.0, 0, "ab" * 32).nu(None, 1, nu))  # reproducible


@pytest.mark.slow
def test_the_server_reads_distances_off_an_mlp_partys_logit_trajectories():
    r = run_audit("crime", rounds=40, noise=0.0, overrides={"model": "mlp", "optimizer": "adagrad"})
    assert "server_gram_error" not in r  # the Gram attack assumes a linear party
    assert r["server_traj_rho"] > r["server_traj_rho_chance"] + 0.2


@pytest.mark.parametrize("extra", [{"batching.batch-size": 256},
                                   pytest.param({"model": "mlp"}, marks=pytest.mark.slow),
                                   pytest.param({"privacy.nu-noise": 1.0}, marks=pytest.mark.slow),
                                   {"reliability.checkpoint-every": 2}])
def test_secure_aggregation_gives_the_plain_run_with_other_features(tmp_path, extra):
    def run(on):
        rc = RunConfig.from_flower({**RunConfig().to_flower(), "optimizer": "gd", "dataset": "crime", "num-server-rounds": 4,
                                    "eval-every": 2, "output-dir": str(tmp_path / f"runs{on}"),
                                    "reliability.checkpoint-dir": str(tmp_path / f"ckpt{on}"),
                                    "privacy.secure-aggregation": on, **extra}).to_flower()
        return run_server(InProcessGrid(client_app, rc, rc["num-parties"]), rc)[0]

    plain, masked = run(False), run(True)
    for key in ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn"):
        assert masked[key] == pytest.approx(plain[key], rel=1e-6, abs=1e-9)


def test_a_resent_key_request_gets_the_same_key_and_a_new_setup_a_new_one():
    ctx = Context(run_id=1, node_id=5, node_config={"partition-id": 0}, state=RecordDict(), run_config={})

    def ask(session):
        m = Message(RecordDict({"secagg": ConfigRecord({"session": session})}), dst_node_id=5,
                    message_type="query.sakeys")
        m.metadata.__dict__["_message_id"] = f"m-{session}"
        return key_agreement.sakeys(m, ctx).content.config_records["secagg"]["public"]

    first = ask("a")
    assert ask("a") == first and ask("b") != first


def test_masks_that_do_not_cancel_stop_the_run_without_revealing_anyone(tmp_path, monkeypatch):
    rc = RunConfig.from_flower({**RunConfig().to_flower(), "dataset": "crime", "num-server-rounds": 2,
                                "output-dir": str(tmp_path), "privacy.secure-aggregation": True}).to_flower()
    derive = agreement.pair_key

    def lost(private, peer_public, a, b, session=""):  # party 3 holds another key for party 0 than party 0 does
        return bytes(32) if (a, b) == (3, 0) else derive(private, peer_public, a, b, session)

    monkeypatch.setattr(agreement, "pair_key", lost)
    with pytest.raises(FederationError, match="round 0: the masks of the .* logits did not cancel"):
        run_server(InProcessGrid(client_app, rc, rc["num-parties"]), rc)


def test_secure_aggregation_with_encrypted_nu_gives_the_encrypted_run(tmp_path):
    pytest.importorskip("tenseal")

    def run(on):
        rc = RunConfig.from_flower({**RunConfig().to_flower(), "optimizer": "gd", "dataset": "crime",
                                    "num-server-rounds": 3, "eval-every": 3, "output-dir": str(tmp_path / f"runs{on}"),
                                    "privacy.secure-nu": "ckks", "privacy.secure-aggregation": on}).to_flower()
        return run_server(InProcessGrid(client_app, rc, rc["num-parties"]), rc)[0]

    plain, masked = run(False), run(True)
    for key in ("train_loss", "train_deo", "test_acc"):  # CKKS adds ~1e-9 noise to each gradient
        assert masked[key] == pytest.approx(plain[key], rel=1e-8, abs=1e-10)


def test_every_attack_beats_chance_on_newton_transcripts():
    """Under Newton each role's attack still works undefended: the server rebuilds each passive
    party's Gram matrix from its replies X_k s_k (one exact equation a round), the passive party
    reads labels and groups off ν, the active party ranks distances from the passive sum's
    trajectory, the coalition sums the server's estimates."""
    r = run_audit("crime", rounds=25, noise=0.0, overrides={"optimizer": "newton", "stop-tolerance": 0.0})
    assert r["optimizer"] == "newton" and r["rounds_run"] == 25
    assert r["label_attack_acc"] == 1.0 and r["group_attack_auc"] > 0.9
    assert max(r["server_gram_errors"]) < 1e-3  # guessing 0 scores 1.0
    assert r["server_traj_rho"] > r["server_traj_rho_chance"] + 0.3
    assert r["active_traj_rho"] > r["active_traj_rho_chance"] + 0.2
    # ... and the span of the passive columns its logit sums reach (a random span leaves ≈ 0.99)
    assert r["active_span_residual"] < 0.7 and r["active_span_rank"] > 20
    assert r["coalition_gram_error"] < 1e-3


def test_the_column_space_attack_is_exact_on_logits_and_at_chance_on_noise():
    """span_residual: logits X θ_t span col(X) once there are as many independent θ_t as
    columns (residual 0), fewer span part of it; vectors not made from X leave ≈ all of X."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(500, 8))
    thetas = rng.normal(size=(8, 12))
    full, rank = attacks.span_residual(X @ thetas, X)
    assert full < 1e-10 and rank == 8
    part, rank = attacks.span_residual(X @ thetas[:, :4], X)
    assert 0.3 < part < 0.95 and rank == 4
    noise, rank = attacks.span_residual(rng.normal(size=(500, 12)), X)
    assert noise > 0.97 and rank == 12  # √(1 − 12/500) ≈ 0.988: the guess
    # the float32 wire's rounding does not count as directions
    wired, rank = attacks.span_residual((X @ thetas).astype(np.float32), X)
    assert wired < 1e-5 and rank == 8


@pytest.mark.parametrize("curvature", ["nu", "const"])
def test_newton_gram_attack_needs_the_true_equation(curvature):
    """The attack's identity is exact: on a random party it recovers X Xᵀ once the rounds cover
    its columns, and a wrong μ, a wrong curvature (or fewer rounds than columns) does not.
    "const" is the passive curvature under encrypted ν: CKKS hides ν from the party, not X from the server."""
    from fairvfl_flwr.core.newton import block_direction, party_curvature

    other = {"nu": "const", "const": "nu"}[curvature]
    rng = np.random.default_rng(3)
    n, m, mu = 300, 6, 2 / 300
    X = rng.normal(size=(n, m))
    theta = rng.normal(size=m)
    dirs, u, nu = {}, {}, {}
    for t in range(1, 11):
        nu[t] = rng.normal(size=n) / n
        u[t] = X @ theta
        s = block_direction(X, nu[t], party_curvature(nu[t], n, curvature), theta, mu)
        dirs[t] = X @ s
        theta = theta + 0.5 * s
    rows = np.arange(50)
    assert attacks.gram_error(attacks.newton_gram_attack(dirs, u, nu, mu, curvature=curvature), X, rows) < 1e-8
    assert attacks.gram_error(attacks.newton_gram_attack(dirs, u, nu, 3 * mu, curvature=curvature), X, rows) > 0.5
    assert attacks.gram_error(attacks.newton_gram_attack(dirs, u, nu, mu, curvature=other), X, rows) > 0.1
    few = {t: dirs[t] for t in range(1, 4)}
    assert attacks.gram_error(attacks.newton_gram_attack(few, u, nu, mu, curvature=curvature), X, rows) > 0.1


def test_coalition_peels_a_lone_passive_party_exactly():
    """Server + active party under secure aggregation with one passive party: the active party's
    pair key is that party's only mask, so the coalition reads its logits exactly and its
    attacks score what the server's score without secure aggregation."""
    both = {"num-parties": 2}
    plain = run_audit("crime", rounds=40, noise=0.0, overrides=both)
    r = run_audit("crime", rounds=40, noise=0.0, overrides={**both, "privacy.secure-aggregation": True})
    assert min(r["server_gram_errors"]) >= 0.9  # the server alone: masked words
    assert r["coalition_party_gram_error"] == pytest.approx(plain["server_gram_error"], abs=1e-9)
    assert plain["server_gram_error"] < 0.5
    assert r["coalition_traj_rho"] == pytest.approx(plain["server_traj_rho"], abs=1e-9)


@pytest.mark.slow  # the coalition's peeling runs in the fast loop on a lone passive party
def test_coalition_cannot_peel_two_passive_parties():
    """With two passive parties their mutual mask remains: the peeled words are still noise."""
    r = run_audit("crime", rounds=40, noise=0.0, overrides={"privacy.secure-aggregation": True, "num-parties": 3})
    assert min(r["coalition_party_gram_errors"]) >= 0.9
    assert abs(r["coalition_traj_rho"]) < 0.2
    assert r["coalition_gram_error"] < 0.6  # the passive sum is still the coalition's (z is not masked from it)
