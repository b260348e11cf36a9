"""Names the run config checks against, without importing what they name.

``config.py`` validates every run config, including on the ClientApp's path where each
message may start a fresh process (deployment); importing torch (models.py) or pandas
(data.py) just to know the valid names cost ~1.5 s there. tests/test_performance.py
checks these tuples against ``models.MODELS``/``models.DTYPES`` and ``data.DATASETS``.
"""

DATASET_NAMES = ("adult", "compas", "crime")
MODEL_NAMES = ("linear", "mlp")
DTYPE_NAMES = ("float64", "float32")
