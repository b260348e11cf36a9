"""Names the run config checks against, without importing what they name.

``config/run.py`` validates every run config, including on the ClientApp's path where
each message may start a fresh process (deployment); importing torch (core/models.py) or
pandas (data/tables.py) just to know the valid names would be paid there on every
message. tests/test_performance.py checks these tuples against ``models.MODELS``,
``models.DTYPES`` and ``tables.DATASETS``.
"""

DATASET_NAMES = ("adult", "adult-race", "adult-sex-race", "compas", "compas-race", "crime")
MODEL_NAMES = ("linear", "mlp")
DTYPE_NAMES = ("float64", "float32")
