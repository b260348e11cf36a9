"""Privacy defences: CKKS-encrypted ν and PSI row alignment. Need .[privacy]."""

import numpy as np
import pytest
import torch

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.jobs import saving
from fairvfl_flwr.config import ConfigError, RunConfig


def test_ckks_refused_for_mlp_and_unknown_values():
    with pytest.raises(ConfigError, match="secure-nu.*linear"):
        RunConfig(model="mlp", secure_nu="ckks").validate()
    with pytest.raises(ConfigError, match="privacy.secure-nu"):
        RunConfig(secure_nu="paillier").validate()


def ckks_slot_sum_std() -> float:
    """The standard deviation of CKKS's error on one decrypted slot sum (n·(X_kᵀν)_j), from
    the parameters; the error is absolute, so a tolerance on X_kᵀν is a multiple of this / n.

    It is the one rescale after the products: its rounding leaves an error polynomial
    τ0 + τ1·s, each coefficient of variance (1 + h)/12, h ≈ 2N/3 the nonzero coefficients
    of SEAL's uniform ternary secret s. The sum of the real (or the imaginary) parts of the
    N/2 slots weighs the N coefficients with weights whose squares sum to N²/4 (Parseval),
    so its standard deviation is (N/2)·sqrt((1 + h)/12)/Δ at the scale Δ: 8e-8 at N = 8192,
    Δ = 2^40 (25 draws: 8.6e-8). The encryption noise carried through the product by the
    plaintext X (σ = 3.2 times |X|'s norm, X in [0, 1]) adds 3 % of that variance; the
    masks' encoding less. Six of these miss one value in 10^9.
    """
    from fairvfl_flwr.features import ckks as secure

    degree, scale = secure.POLY_MODULUS_DEGREE, secure.SCALE
    return degree / 2 * np.sqrt((1 + 2 * degree / 3) / 12) / scale


def test_masked_gradient_unmasks_to_xt_nu_and_hides_it_from_the_server():
    pytest.importorskip("tenseal")
    from fairvfl_flwr.features import ckks as secure

    rng = np.random.default_rng(1)
    n, m = 5000, 3  # two chunks, the second one padded; two column pairs, the second one padded
    X, nu = rng.random((n, m)), rng.normal(size=n) / n
    server = secure.CkksServer(n)
    record = server.passive_content(nu, 1, False)[msgs.PAYLOAD]
    blobs = [secure.from_bytes_array(record[f"nu-ct-{c}"]) for c in range(secure.chunks(n))]
    cts, mask_sums = secure.masked_column_sums(server.public, blobs, X, rng)
    assert len(cts) == 2 and mask_sums.shape == (4,)

    class Reply:  # what the server reads off the party's reply
        content = msgs.RecordDict({secure.MASKED_RECORD: msgs.ArrayRecord(
            {f"pair-{p}": secure.to_bytes_array(c) for p, c in enumerate(cts)})})

    seen = server.masked_sums(Reply())  # the server's view: n·g + Σ masks, two per pair
    g = secure.unmask(seen, mask_sums, n, m)
    np.testing.assert_allclose(g, X.T @ nu, rtol=0, atol=6 * ckks_slot_sum_std() / n)
    assert np.all(np.abs(seen[:m] / n - X.T @ nu) > 1e-2)  # the server's decryption is far from the gradient
    # what parties get is N and the primes: no key of any kind
    assert len(server.public) == 8 * (1 + len(secure.COEFF_MOD_BIT_SIZES))
    # the party's columns are encoded once: a second round reuses the plaintexts
    assert secure._encoded_block(server.public, X) is secure._encoded_block(server.public, X)


@pytest.fixture(scope="module")
def ckks_vs_plain(tmp_path_factory, run_app):
    pytest.importorskip("tenseal")
    out = str(tmp_path_factory.mktemp("runs"))
    seen = []
    base = dict(optimizer="gd", dataset="crime", num_server_rounds=4, eval_every=4, output_dir=out, epsilon=0.01, beta=1.0)
    plain = run_app(RunConfig(**base))
    ckks = run_app(RunConfig(**base, secure_nu="ckks"), tap=seen.append)
    return plain, ckks, seen


def test_ckks_gives_the_plain_theta_within_ckks_precision(ckks_vs_plain):
    plain_run, ckks_run, _ = ckks_vs_plain
    plain, ckks = plain_run.summary, ckks_run.summary
    a, b = plain_run.thetas(), ckks_run.thetas()
    for k in a:
        for name, p in a[k].items():
            assert torch.allclose(b[k][name], p, rtol=1e-5, atol=1e-8), (k, name, (b[k][name] - p).abs().max())
    assert ckks["test_acc"] == pytest.approx(plain["test_acc"], abs=1e-9)


def test_under_ckks_passive_messages_hold_no_plaintext_nu(ckks_vs_plain):
    from fairvfl_flwr.features import ckks as secure

    _, ckks_run, seen = ckks_vs_plain
    grid = ckks_run.grid
    n = 1200
    passive_ids = {nid for nid, c in grid.contexts.items() if c.node_config["partition-id"] >= 1}
    passive = [m for m in seen if m.metadata.dst_node_id in passive_ids]
    types = {m.metadata.message_type for m in passive}
    assert types == {msgs.INFO, msgs.INIT, secure.TRAIN_PASSIVE_ENC, secure.TRAIN_PASSIVE_UNMASK, saving.SAVE}
    for m in passive:
        assert not m.content.metric_records
        for record in m.content.config_records.values():  # query.save: where to save, no data
            assert set(record) <= ({"run-id", "run-folder", "round", "checkpoint"} if m.metadata.message_type == saving.SAVE
                                   else {"round", "evaluate"})
        for name, record in m.content.array_records.items():
            for key, array in record.items():
                a = array.numpy()
                if a.dtype == np.uint8:  # serialized ciphertext or public context: bytes, not floats
                    assert name in (msgs.PAYLOAD, secure.CONTEXT_RECORD)
                    continue
                # the only float array a passive party gets is m masked slot sums, never n per-row values
                assert m.metadata.message_type == secure.TRAIN_PASSIVE_UNMASK and key == "masked-sum"
                assert a.shape[0] < n
    enc = [m for m in passive if m.metadata.message_type == secure.TRAIN_PASSIVE_ENC]
    assert enc and all(set(m.content.array_records[msgs.PAYLOAD]) == {"nu-ct-0"} for m in enc)  # 1200 rows: 1 chunk


def test_ckks_parameters_are_checked_for_128_bit_security():
    pytest.importorskip("tenseal")
    from fairvfl_flwr.features import ckks as secure

    primes = np.frombuffer(secure.parameters(), dtype="<u8")[1:]
    weak = np.array([2048, *primes], dtype="<u8").tobytes()  # 160 bits of modulus at N = 2048
    with pytest.raises(ValueError, match="128-bit security"):
        secure.seal_context(weak)


def test_newton_under_ckks_is_newton_with_the_constant_curvature(tmp_path, run_app):
    """optimizer='newton' with encrypted ν: the run equals the one-process reference whose passive
    parties use h = 1/(4n), within CKKS precision; passive parties never get ν in the clear."""
    pytest.importorskip("tenseal")
    from fairvfl_flwr.core.reference import NewtonFloor

    from fairvfl_flwr.data.problem import party_problem

    rc = {"dataset": "crime", "optimizer": "auto", "privacy.secure-nu": "ckks", "wire-dtype": "float64",
          "eval-every": 4, "stop-tolerance": 0.0, "num-parties": 6, "num-server-rounds": 8,
          "output-dir": str(tmp_path)}
    cfg = RunConfig.from_flower(rc)
    assert cfg.optimizer_in_use == "newton"  # auto picks Newton under encrypted ν
    seen = []
    run = run_app(cfg, tap=seen.append)
    grid, folder, history = run.grid, run.folder, run.history

    ds, blocks, constraint = party_problem(cfg)
    n = len(ds.y_train)
    floor = NewtonFloor(blocks, ds.y_train, constraint, curvature="const", epsilon=cfg.epsilon, beta=cfg.beta, c=cfg.c,
                        mu=cfg.mu_value(n), lr=cfg.lr, Q=cfg.local_steps, active=cfg.num_active)
    plain = NewtonFloor(blocks, ds.y_train, constraint, curvature="nu", epsilon=cfg.epsilon, beta=cfg.beta, c=cfg.c,
                        mu=cfg.mu_value(n), lr=cfg.lr, Q=cfg.local_steps, active=cfg.num_active)
    for t in range(1, cfg.num_server_rounds + 1):
        floor.round(), plain.round()
        # CKKS noise is fresh in every run (ckks_slot_sum_std() / n ≈ 5e-11 in X_kᵀν here); Newton's solves and
        # search carry it to 0.7-1.9e-7 in θ and 1-4e-9 in DEO (4 runs), 5 and 25 times below these tolerances
        np.testing.assert_allclose(history[t]["lambdas"], floor.lam, rtol=1e-5, atol=1e-8)
        assert history[t]["deo"] == pytest.approx(abs(constraint.gaps(ds.y_train, floor.z())[0]), abs=1e-7)
    assert max(abs(history[t]["lambda1"]) for t in range(1, 9)) > 0  # the constraint was active
    assert np.max(np.abs(floor.theta[1] - plain.theta[1])) > 1e-3  # the curvature made a difference
    for k in range(6):
        with np.load(folder / "parties" / f"partition-{k}" / "block.npz") as f:
            np.testing.assert_allclose(f["weight"], floor.theta[k], rtol=0, atol=1e-6)

    passive_ids = {nid for nid, c in grid.contexts.items() if c.node_config["partition-id"] >= cfg.num_active}
    passive = [m for m in seen if m.metadata.dst_node_id in passive_ids]
    assert {secure_type for secure_type in (m.metadata.message_type for m in passive)} == {
        msgs.INFO, msgs.NEWTON_INIT, msgs.TRAIN_PASSIVE_ENC, msgs.NEWTON_PASSIVE, msgs.NEWTON_APPLY, saving.SAVE}
    for m in passive:
        for name, record in m.content.array_records.items():
            for key, array in record.items():
                a = array.numpy()
                # floats: the masked sums (2 per column pair) and the step lengths, never n per-row values
                assert a.dtype == np.uint8 or (key in ("masked-sum", "alpha") and a.shape[0] < 20), (name, key)

    pytest.importorskip("tenseal")
    from fairvfl_flwr.tools.audit import run_audit, table

    r = run_audit("crime", rounds=3, noise=0.0, overrides={"privacy.secure-nu": "ckks"})
    assert r["view"] == "ciphertext" and r["rounds_recorded"] == 3
    assert np.isnan(r["label_attack_acc"]) and np.isnan(r["group_attack_auc"])
    assert "n/a (ciphertext)" in table([r])


