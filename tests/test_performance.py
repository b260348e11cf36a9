"""Float32 wire, cheap config import, presets, the synthetic table and shared-seed batches."""

import os
import subprocess
import sys

import numpy as np
import pytest

from fairvfl_flwr.core import batching

from fairvfl_flwr.core import names

from fairvfl_flwr.data import synthetic
from fairvfl_flwr.data.partydata import CACHE_ENV
from fairvfl_flwr.config import ConfigError, RunConfig


def test_config_names_match_what_they_name():
    from fairvfl_flwr.data.tables import DATASETS
    from fairvfl_flwr.core.models import DTYPES, MODELS

    assert set(names.DATASET_NAMES) == set(DATASETS)
    assert set(names.MODEL_NAMES) == set(MODELS)
    assert set(names.DTYPE_NAMES) == set(DTYPES)


def test_config_imports_neither_torch_nor_pandas_and_client_app_not_pandas():
    code = ("import sys, fairvfl_flwr.config.run; a = [m in sys.modules for m in ('torch', 'pandas')]; "
            "import client_app; print(a, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[False, False] False"


@pytest.mark.slow  # two fresh interpreters, each importing flwr
def test_linear_and_gauss_newton_runs_never_import_torch(tmp_path):
    """The ClientApp's linear paths and an MLP's Gauss–Newton rounds, its first θ included
    (core/mlp_init.py), are numpy only: a deployed party pays no torch import on any message.
    One interpreter runs block Newton (the default for a linear model; float64 on the wire,
    3 parties) and gradient steps; one the MLP under ``auto`` (Gauss–Newton), then builds the
    block gradient steps take, which does load torch (so the check can fail)."""
    runs = [{"num-parties": 3, "wire-dtype": "float64"}, {"optimizer": "gd"}]
    code = ("import sys, json; from fairvfl_flwr.app.run import run_inprocess; "
            f"[run_inprocess({{'dataset': 'crime', 'num-server-rounds': 3, 'eval-every': 3, **extra, "
            f"'output-dir': {str(tmp_path)!r}}}, quiet=True) for extra in {runs!r}]; "
            "print(json.dumps(['torch' in sys.modules, 'client_app' in sys.modules]))")
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip().splitlines()[-1] == "[false, false]"
    mlp = code.replace("'dataset': 'crime'", "'dataset': 'crime', 'model': 'mlp'").replace(repr(runs), "[{}]")
    mlp += ("; from fairvfl_flwr.core.blocks import build_block; build_block('mlp', 3); "
            "print(json.dumps('torch' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", mlp], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip().splitlines()[-2:] == ["[false, false]", "true"]


def test_presets_fill_only_keys_left_at_default():
    fast = RunConfig.from_flower({"preset": "fast"})
    assert (fast.eta, fast.beta, fast.optimizer) == (20.0, 0.5, "gd")
    mine = RunConfig.from_flower({"preset": "fast", "eta": 50.0, "local-steps": 10})
    assert (mine.eta, mine.beta, mine.local_steps) == (50.0, 0.5, 10)
    assert RunConfig.from_flower({"preset": "paper"}) == RunConfig(preset="paper", optimizer="gd", constraint_measure="loss",
                                                                 sensitive_as_input=True)
    assert RunConfig.from_flower({"preset": "paper", "optimizer": "newton"}).optimizer == "newton"
    assert RunConfig.from_flower({}).optimizer == "auto"
    with pytest.raises(ConfigError, match="preset='nope'"):
        RunConfig.from_flower({"preset": "nope"})


def test_wire_dtype_default_float32_and_checked():
    assert RunConfig().wire_dtype == "float32"
    with pytest.raises(ConfigError, match="wire-dtype"):
        RunConfig.from_flower({"wire-dtype": "float16"})


def test_messages_carry_float32_by_default_float64_on_request(tmp_path):
    from fairvfl_flwr.app.client import app as client_app
    from fairvfl_flwr.flower.inprocess import InProcessGrid
    from fairvfl_flwr.app.server import run_server

    for wire, want in (("float32", np.float32), ("float64", np.float64)):
        cfg = RunConfig(dataset="crime", num_server_rounds=2, wire_dtype=wire, output_dir=str(tmp_path))
        seen = []
        grid = InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties, tap=seen.append)
        run_server(grid, cfg.to_flower())
        payloads = [m.content.array_records["payload"] for m in seen if m.metadata.message_type.startswith("train.")]
        # λ and Newton's step lengths are a few scalars that stay float64
        assert payloads and all(a[k].numpy().dtype == want for a in payloads for k in a if k not in ("lam", "alpha"))


def test_batch_rows_shared_seed_sorted_distinct_and_full_batch():
    a = batching.batch_rows(7, 3, 10_000, 500)
    assert np.array_equal(a, batching.batch_rows(7, 3, 10_000, 500))  # every party derives the same rows
    assert not np.array_equal(a, batching.batch_rows(7, 4, 10_000, 500))  # a new batch each round
    assert len(np.unique(a)) == 500 and np.all(np.diff(a) > 0) and a[-1] < 10_000
    assert batching.batch_rows(7, 3, 10_000, 0) is None and batching.batch_rows(7, 3, 100, 500) is None


def test_synthetic_blocks_agree_with_whole_table_and_bias_is_planted():
    n = 5_000
    whole = synthetic.columns(n, range(6), seed=2)
    assert np.array_equal(synthetic.columns(n, [4, 1], seed=2), whole[:, [4, 1]])
    y, s = synthetic.labels(n, 6, seed=2, bias=1.0)
    assert set(np.unique(y)) == {-1, 1}
    assert (y[s] == 1).mean() < (y[~s] == 1).mean() - 0.15  # group a gets fewer positives
    ds = synthetic.make_dataset(n, 6, seed=2)
    assert ds.X_train.shape == (4_500, 6) and ds.X_test.shape == (500, 6)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: BLAS starts one thread anyway")
@pytest.mark.parametrize("env, threads", [({}, 1), ({"OPENBLAS_NUM_THREADS": "2"}, 2)])
def test_app_processes_use_one_blas_thread_unless_the_operator_chose(env, threads):
    """Spinning BLAS threads make a party's products tens of times slower on a busy machine."""
    code = ("import numpy\n"
            "from threadpoolctl import threadpool_info\n"
            "def blas(): return max(i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas')\n"
            "before = blas()\n"
            "import fairvfl_flwr.app.client, fairvfl_flwr.app.server\n"
            "print(before, blas())")
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, check=True)
    before, after = map(int, out.stdout.strip().splitlines()[-1].split())
    assert before >= 2 and after == threads
