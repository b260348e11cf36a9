"""Label DP on ν: the accountant, the sensitivity bound, the noise key, a run with it on."""

import json

import numpy as np
import pytest

from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.core.constraints import from_labels
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.features import labeldp
from fairvfl_flwr.features import transcripts as tr
from fairvfl_flwr.features.labeldp import smallest_group


def test_the_accountant_gives_opacus_own_documented_values():
    # Opacus's own tests (opacus/tests/accountants_test.py): σ = 1.5, q = 0.04, 90 epochs,
    # δ = 1e-5 -> ε = 7.32911117143; the noise multiplier for ε = 8 at q = 0.04 is 1.416
    # over 90 epochs and 1.3562 over 2,000 steps (to 4 places).
    steps = int(90 / 0.04)
    assert labeldp.epsilon_spent(1.5, steps, 1e-5, sample_rate=0.04) == pytest.approx(7.32911117143, abs=1e-7)
    sigma = labeldp.noise_multiplier_for(8.0, 1e-5, steps, sample_rate=0.04)
    assert sigma == pytest.approx(1.416, abs=5e-5)
    assert labeldp.noise_multiplier_for(8.0, 1e-5, 2000, sample_rate=0.04) == pytest.approx(1.3562, abs=5e-5)
    assert labeldp.epsilon_spent(sigma, steps, 1e-5, sample_rate=0.04) <= 8.0


def test_full_batch_rounds_compose_as_the_gaussian_mechanism():
    # q = 1: T releases at multiplier z are one Gaussian release at z/√T (RDP α T / (2 z²))
    assert labeldp.epsilon_spent(20.0, 400, 1e-5) == pytest.approx(labeldp.epsilon_spent(1.0, 1, 1e-5), rel=1e-9)
    z = labeldp.noise_multiplier_for(2.0, 1e-5, 1000)
    assert 1.9 < labeldp.epsilon_spent(z, 1000, 1e-5) <= 2.0
    assert labeldp.epsilon_spent(z, 20, 1e-5) < 0.25  # the same σ, 20 rounds instead of 1,000


def _groups(y, s, kind, measure):
    return from_labels(y, s, 1, kind, measure)


@pytest.mark.parametrize("kind", ["deo", "equalized-odds", "demographic-parity"])
@pytest.mark.parametrize("measure", ["loss", "rate"])
def test_flipping_one_label_moves_nu_by_at_most_the_bound(kind, measure):
    rng = np.random.default_rng(3)
    n, lam_bound = 300, 0.8
    y = np.where(rng.random(n) < 0.4, 1.0, -1.0)
    s = rng.random(n) < 0.3
    constraint = _groups(y, s, kind, measure)
    m = smallest_group(constraint) - 1
    bound = labeldp.label_sensitivity(constraint, lam_bound, m)
    worst = 0.0
    for trial in range(40):
        z = rng.normal(scale=3.0, size=n)
        lam = rng.uniform(0, lam_bound, size=constraint.num_multipliers)
        lam[trial % 2::2] = 0.0  # one of each pair at 0: |λ+ − λ−| reaches the bound
        lam[(trial + 1) % 2::2] = lam_bound * (trial % 3 != 0)
        nu = constraint.masked_weights(y, z, lam)
        # flip rows of the smallest groups first: their flips move the group weights most
        for j in rng.choice(n, size=15, replace=False):
            y2 = y.copy()
            y2[j] = -y2[j]
            nu2 = _groups(y2, s, kind, measure).masked_weights(y2, z, lam)
            worst = max(worst, float(np.linalg.norm(nu2 - nu)) / bound)
    assert worst <= 1.0
    assert worst > 0.3  # and the bound is not vacuous


def test_the_noise_is_keyed_on_a_fresh_server_secret_not_on_anything_a_party_holds():
    rng = np.random.default_rng(0)
    y = np.where(rng.random(400) < 0.5, 1.0, -1.0)
    constraint = from_labels(y, rng.random(400) < 0.5, 1)
    make = lambda secret=None: labeldp.LabelDP(constraint, epsilon=4.0, delta=1e-5, rounds=50,  # noqa: E731
                                               lambda_bound=0.5, secret=secret)
    a, b = make(), make()  # same config, same labels: the run seed and the labels do not fix the noise
    assert not np.allclose(a.noise(1, 400), b.noise(1, 400))
    c, d = make(b"k" * 32), make(b"k" * 32)
    assert np.array_equal(c.noise(3, 400), d.noise(3, 400))  # the secret alone fixes it (tests, resume)
    assert not np.allclose(c.noise(3, 400), c.noise(4, 400))
    assert np.std(c.noise(1, 400)) == pytest.approx(c.sigma, rel=0.15)
    state = c.state_dict()
    e = make()
    e.load_state_dict(json.loads(json.dumps(state)))
    assert np.array_equal(e.noise(2, 400), c.noise(2, 400))


def test_bad_settings_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match="privacy.label-dp-delta=0.0"):
        RunConfig().replace(label_dp_epsilon=1.0, label_dp_delta=0.0)
    with pytest.raises(ConfigError, match="privacy.label-dp-lambda-bound"):
        RunConfig().replace(label_dp_lambda_bound=0.0)
    with pytest.raises(ConfigError, match="privacy.label-dp-epsilon=1.0: not supported with batching.batch-size"):
        RunConfig().replace(label_dp_epsilon=1.0, batch_size=64)
    constraint = from_labels(np.array([1.0, 1, -1, -1]), np.array([True, False, True, False]), 1)
    with pytest.raises(ConfigError, match="privacy.label-dp-min-group=5"):
        labeldp.LabelDP(constraint, epsilon=1.0, delta=1e-5, rounds=5, lambda_bound=0.5, min_group=5)


def test_a_run_with_label_dp_reports_its_epsilon_and_passive_parties_get_noisy_nu(tmp_path):
    rc = {**RunConfig().to_flower(), "dataset": "crime", "num-server-rounds": 12, "eval-every": 6,
          "output-dir": str(tmp_path / "runs"), "privacy.transcript-dir": str(tmp_path / "tr"),
          "privacy.label-dp-epsilon": 2.0, "privacy.label-dp-lambda-bound": 0.05}
    summary, folder = run_inprocess(rc, quiet=True)
    dp = summary["label_dp"]
    assert 1.9 < dp["epsilon"] <= 2.0 and dp["rounds"] == 12 and dp["delta"] == 1e-5
    history = json.loads((folder / "history.json").read_text())
    spent = [r["dp_epsilon"] for r in history[1:]]
    assert spent == sorted(spent) and spent[-1] == pytest.approx(dp["epsilon"])
    server = {int(r["round"]): r for r in tr.load(tmp_path / "tr", tr.SERVER)}
    # every released ν was computed at λ clipped to the public bound (the search's own λ, which the
    # history records, may be larger: the next round's ν clips it again)
    released = [float(np.max(r["lam"])) for r in server.values() if "lam" in r]
    assert len(released) >= 11 and max(released) <= 0.05
    assert max(max(r["lambdas"]) for r in history) > 0.05  # the bound bit: the check above could fail
    passive = {int(r["round"]): r for r in tr.load(tmp_path / "tr", 3)}
    # round 1: z = 0, λ = 0, so the clean ν is -y/(2n); what arrived is that plus noise of std σ
    assert not np.any(server[1]["z"])
    y = load_data(RunConfig.from_flower(rc)).y_train
    resid = passive[1]["nu"].astype(np.float64) - (-y / (2 * len(y)))
    assert np.std(resid) == pytest.approx(dp["noise_std"], rel=0.15)
