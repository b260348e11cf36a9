"""Privacy defences: CKKS-encrypted ν and PSI row alignment. Need .[privacy]."""

import numpy as np
import pytest
import torch

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.config import ConfigError, RunConfig


def _grid_run(cfg: RunConfig, **grid_kwargs):
    from fairvfl_flwr.app.client import app as client_app
    from fairvfl_flwr.flower.inprocess import InProcessGrid
    from fairvfl_flwr.app.server import run_server

    grid = InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties, **grid_kwargs)
    summary, _ = run_server(grid, cfg.to_flower())
    return grid, summary


def _thetas(grid):
    from fairvfl_flwr.app.client import MODEL_STATE

    return {int(c.node_config["partition-id"]): c.state.array_records[MODEL_STATE].to_torch_state_dict()
            for c in grid.contexts.values()}


def test_ckks_refused_for_mlp_and_unknown_values():
    with pytest.raises(ConfigError, match="secure-nu.*linear"):
        RunConfig(model="mlp", secure_nu="ckks").validate()
    with pytest.raises(ConfigError, match="privacy.secure-nu"):
        RunConfig(secure_nu="paillier").validate()


def test_masked_gradient_unmasks_to_xt_nu_and_hides_it_from_the_server():
    pytest.importorskip("tenseal")
    from fairvfl_flwr.features import ckks as secure

    rng = np.random.default_rng(1)
    n, m = 5000, 3  # two chunks, the second one padded
    X, nu = rng.random((n, m)), rng.normal(size=n) / n
    server = secure.CkksServer(n)
    record = server.passive_content(nu, 1, False)[msgs.PAYLOAD]
    blobs = [secure.from_bytes_array(record[f"nu-ct-{c}"]) for c in range(secure.chunks(n))]
    cts, mask_sums = secure.masked_column_sums(server.public, blobs, X, rng)

    class Reply:  # what the server reads off the party's reply
        content = msgs.RecordDict({secure.MASKED_RECORD: msgs.ArrayRecord(
            {f"col-{j}": secure.to_bytes_array(c) for j, c in enumerate(cts)})})

    seen = server.masked_sums(Reply())  # the server's view: n·g + Σ masks
    g = (seen - mask_sums) / n
    assert np.allclose(g, X.T @ nu, rtol=1e-5, atol=1e-9)
    assert np.all(np.abs(seen / n - X.T @ nu) > 1e-2)  # the server's decryption is far from the gradient
    import tenseal as ts

    assert not ts.context_from(server.public).is_private()  # what parties get holds no secret key


@pytest.fixture(scope="module")
def ckks_vs_plain(tmp_path_factory):
    pytest.importorskip("tenseal")
    out = str(tmp_path_factory.mktemp("runs"))
    seen = []
    base = dict(optimizer="gd", dataset="crime", num_server_rounds=4, eval_every=4, output_dir=out, epsilon=0.01, beta=1.0)
    plain_grid, plain = _grid_run(RunConfig(**base))
    ckks_grid, ckks = _grid_run(RunConfig(**base, secure_nu="ckks"), tap=seen.append)
    return plain_grid, plain, ckks_grid, ckks, seen


def test_ckks_gives_the_plain_theta_within_ckks_precision(ckks_vs_plain):
    plain_grid, plain, ckks_grid, ckks, _ = ckks_vs_plain
    a, b = _thetas(plain_grid), _thetas(ckks_grid)
    for k in a:
        for name, p in a[k].items():
            assert torch.allclose(b[k][name], p, rtol=1e-5, atol=1e-8), (k, name, (b[k][name] - p).abs().max())
    assert ckks["test_acc"] == pytest.approx(plain["test_acc"], abs=1e-9)


def test_under_ckks_passive_messages_hold_no_plaintext_nu(ckks_vs_plain):
    from fairvfl_flwr.features import ckks as secure

    _, _, grid, _, seen = ckks_vs_plain
    n = 1200
    passive_ids = {nid for nid, c in grid.contexts.items() if c.node_config["partition-id"] >= 1}
    passive = [m for m in seen if m.metadata.dst_node_id in passive_ids]
    types = {m.metadata.message_type for m in passive}
    assert types == {msgs.INFO, msgs.INIT, secure.TRAIN_PASSIVE_ENC, secure.TRAIN_PASSIVE_UNMASK, msgs.SAVE}
    for m in passive:
        assert not m.content.metric_records
        for record in m.content.config_records.values():  # query.save: where to save, no data
            assert set(record) <= ({"run-id", "run-folder", "round", "checkpoint"} if m.metadata.message_type == msgs.SAVE
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


def test_audit_under_ckks_has_nothing_to_attack():
    pytest.importorskip("tenseal")
    from fairvfl_flwr.tools.audit import run_audit, table

    r = run_audit("crime", rounds=3, noise=0.0, overrides={"privacy.secure-nu": "ckks"})
    assert r["view"] == "ciphertext" and r["rounds_recorded"] == 3
    assert np.isnan(r["label_attack_acc"]) and np.isnan(r["group_attack_auc"])
    assert "n/a (ciphertext)" in table([r])


# -- PSI row alignment ------------------------------------------------------------------
def test_psi_pair_finds_exactly_the_intersection_and_sends_no_ids():
    pytest.importorskip("private_set_intersection")
    from fairvfl_flwr.tools.psi import psi_pair

    client = [f"person-{i}" for i in range(0, 300, 2)]
    server = [f"person-{i}" for i in range(0, 300, 3)]
    idx, t = psi_pair(client, server)
    assert sorted(client[i] for i in idx) == sorted(set(client) & set(server))
    for blob in (t.setup, t.request, t.response):
        assert b"person-" not in blob  # ids travel blinded only
    size, _ = psi_pair(client, server, reveal=False)  # cardinality-only mode: the client learns just the size
    assert size == len(set(client) & set(server))


def test_align_several_parties():
    pytest.importorskip("private_set_intersection")
    from fairvfl_flwr.tools.psi import align

    rng = np.random.default_rng(0)
    universe = [f"id{i}" for i in range(400)]
    parties = [list(rng.choice(universe, size=300, replace=False)) for _ in range(4)]
    result = align(parties)
    assert result.common == sorted(set.intersection(*map(set, parties)))
    assert len(result.pairs) == 3 and result.bytes > 0
