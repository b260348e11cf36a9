"""Fairness baselines that are not training protocols: post-processing and a central reference.

All of them need the optional extras: ``pip install -e ".[baselines]"`` (fairlearn,
aif360, scikit-learn).

* :func:`eo_postprocess`: FedBCD + EO, equalized-odds post-processing (Hardt et al.
  2016) with fairlearn's ``ThresholdOptimizer(constraints="equalized_odds",
  prefit=True)``. Its input is the trained VFL model's *scores* z, the labels and the
  groups: that is the server, which holds y and s and sees z every round; no party's
  features are involved.
* :func:`ceo_postprocess`: FedBCD + CEO, calibrated equalized odds (Pleiss et al.
  2017) with aif360's ``CalibratedEqOddsPostprocessing`` on σ(z), also at the server,
  equalising the error rate on the protected label's rows.
* :func:`centralised_reference`: not federated. fairlearn's ``ExponentiatedGradient``
  with ``TruePositiveRateParity`` on a logistic regression over all columns at once.

Every function returns the paper's test metrics (ACC, DFP, DFN), computed by
``metrics.fairness_metrics`` like FairVFL's own numbers. Labels are in {-1, +1}; ``s`` is
``True`` for group a, or each row's group code with several groups.
"""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.metrics import fairness_metrics

EXTRAS_HINT = 'the baselines need the optional extras: pip install -e ".[baselines]"'


class MissingExtras(ImportError):
    """fairlearn / aif360 / scikit-learn are not installed."""


def _one_thread():
    """BLAS/OpenMP pools at one thread: on 2 shared cores, sklearn's default pools make a
    small logistic regression many times slower."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(1)


def _require(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtras(f"{module} is not installed: {EXTRAS_HINT}") from exc


def _single_threaded(fn):
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _require("sklearn")
        with _one_thread():
            return fn(*args, **kwargs)

    return wrapper


def extras_available() -> bool:
    try:
        for m in ("fairlearn", "aif360", "sklearn"):
            _require(m)
    except MissingExtras:
        return False
    return True


def metrics_of(y: np.ndarray, s: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """ACC, DFP, DFN of predictions ``pred`` in {-1, +1} (or {0, 1})."""
    return fairness_metrics(y, s, np.where(np.asarray(pred) > 0, 1.0, -1.0))  # s: a/b, or group codes


def eo_gap(y: np.ndarray, s: np.ndarray, pred: np.ndarray) -> float:
    """Equalized-odds gap: max(DFP, DFN)."""
    m = metrics_of(y, s, pred)
    return max(m["dfp"], m["dfn"])


def _check(name: str, z: np.ndarray, y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    z, y, s = np.asarray(z, dtype=float).ravel(), np.asarray(y).ravel(), np.asarray(s, dtype=bool).ravel()
    if not (len(z) == len(y) == len(s)):
        raise ValueError(f"{name}: scores, labels and groups differ in length ({len(z)}, {len(y)}, {len(s)})")
    if not set(np.unique(y)) <= {-1, 1}:
        raise ValueError(f"{name}: labels must be in {{-1, +1}}, got {sorted(set(np.unique(y)))[:5]}")
    if not np.isfinite(z).all():
        raise ValueError(f"{name}: scores contain NaN or inf")
    return z, y, s


def _score_estimator():
    """A fitted 'classifier' whose decision function is its single input column (the score)."""
    from sklearn.base import BaseEstimator, ClassifierMixin

    class ScoreModel(ClassifierMixin, BaseEstimator):
        def __init__(self):
            self.classes_ = np.array([0, 1])
            self.n_features_in_ = 1

        def fit(self, X, y=None):
            return self

        def decision_function(self, X):
            return np.asarray(X, dtype=float)[:, 0]

        def predict(self, X):
            return (self.decision_function(X) >= 0).astype(int)

    return ScoreModel()


@_single_threaded
def eo_postprocess(z_train, y_train, s_train, z_test, y_test, s_test, seed: int = 0) -> dict:
    """FedBCD + EO: fit equalized-odds thresholds on the training scores, apply to test.

    Returns the test metrics and, under ``"train"``, the metrics on the rows it was fit on
    (with ``"train_before"`` for the unprocessed classifier sign(z)).
    """
    _require("fairlearn")
    from fairlearn.postprocessing import ThresholdOptimizer

    z_train, y_train, s_train = _check("eo_postprocess (train)", z_train, y_train, s_train)
    z_test, y_test, s_test = _check("eo_postprocess (test)", z_test, y_test, s_test)
    opt = ThresholdOptimizer(estimator=_score_estimator(), constraints="equalized_odds", prefit=True,
                             predict_method="decision_function")
    opt.fit(z_train[:, None], (y_train > 0).astype(int), sensitive_features=s_train.astype(int))
    pred_test = opt.predict(z_test[:, None], sensitive_features=s_test.astype(int), random_state=seed)
    pred_train = opt.predict(z_train[:, None], sensitive_features=s_train.astype(int), random_state=seed)
    return {**metrics_of(y_test, s_test, pred_test), "train": metrics_of(y_train, s_train, pred_train),
            "train_before": metrics_of(y_train, s_train, z_train)}


@_single_threaded
def ceo_postprocess(z_train, y_train, s_train, z_test, y_test, s_test, seed: int = 0,
                    protected_label: int = 1, cost_constraint: str | None = None) -> dict:
    """FedBCD + CEO: aif360's calibrated equalized odds on σ(z) (group a = unprivileged).

    Calibration and equalized odds cannot both hold (Pleiss et al. 2017), so CEO equalises
    one error rate: by default the one on the *protected* label's rows, the rows DEO is
    measured on (FNR when the protected label is +1, as Adult's >50K; FPR when it is -1,
    as COMPAS' non-recidivists and Crime's low-crime communities): the paper's "calibrated
    equal opportunity". ``cost_constraint`` ("fnr", "fpr", "weighted") overrides it.
    """
    _require("aif360")
    import logging

    import pandas as pd

    logging.getLogger("aif360").setLevel(logging.ERROR)
    from aif360.algorithms.postprocessing import CalibratedEqOddsPostprocessing
    from aif360.datasets import BinaryLabelDataset

    if cost_constraint is None:
        cost_constraint = "fnr" if protected_label == 1 else "fpr"
    if cost_constraint not in ("fnr", "fpr", "weighted"):
        raise ValueError(f"cost_constraint={cost_constraint!r}: choose fnr, fpr or weighted")
    z_train, y_train, s_train = _check("ceo_postprocess (train)", z_train, y_train, s_train)
    z_test, y_test, s_test = _check("ceo_postprocess (test)", z_test, y_test, s_test)

    def datasets(z, y, s):
        df = pd.DataFrame({"s": s.astype(float), "y": (y > 0).astype(float)})
        true = BinaryLabelDataset(df=df, label_names=["y"], protected_attribute_names=["s"],
                                  favorable_label=1.0, unfavorable_label=0.0)
        pred = true.copy(deepcopy=True)
        p = 1.0 / (1.0 + np.exp(-np.clip(z, -500, 500)))
        pred.scores = p.reshape(-1, 1)
        pred.labels = (p >= 0.5).astype(float).reshape(-1, 1)
        return true, pred

    train_true, train_pred = datasets(z_train, y_train, s_train)
    _, test_pred = datasets(z_test, y_test, s_test)
    ceo = CalibratedEqOddsPostprocessing(unprivileged_groups=[{"s": 1.0}], privileged_groups=[{"s": 0.0}],
                                         cost_constraint=cost_constraint, seed=seed)
    ceo.fit(train_true, train_pred)
    pred_test = ceo.predict(test_pred).labels.ravel()
    pred_train = ceo.predict(train_pred).labels.ravel()
    return {**metrics_of(y_test, s_test, pred_test), "train": metrics_of(y_train, s_train, pred_train),
            "cost_constraint": cost_constraint}


@_single_threaded
def centralised_reference(X_train, y_train, s_train, X_test, y_test, s_test, protected_label: int = 1,
                          seed: int = 0, max_iter: int = 50) -> dict:
    """ExponentiatedGradient(LogisticRegression, TruePositiveRateParity) on all columns.

    TPR parity is taken on the *protected* label (the class whose rows define N^a, N^b
    and DEO): labels are recoded so that the protected label is fairlearn's positive
    class, which makes the constraint equal opportunity on the same rows FairVFL
    constrains. Predictions are mapped back before ACC/DFP/DFN are measured.
    """
    _require("fairlearn")
    _require("sklearn")
    from fairlearn.reductions import ExponentiatedGradient, TruePositiveRateParity
    from sklearn.linear_model import LogisticRegression

    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    if protected_label not in (-1, 1):
        raise ValueError(f"protected_label must be -1 or +1, got {protected_label}")
    target = (y_train == protected_label).astype(int)
    eg = ExponentiatedGradient(LogisticRegression(max_iter=1000), constraints=TruePositiveRateParity(),
                               max_iter=max_iter)
    eg.fit(np.asarray(X_train), target, sensitive_features=np.asarray(s_train, dtype=int))
    hit = eg.predict(np.asarray(X_test), random_state=seed)
    pred = np.where(hit == 1, protected_label, -protected_label)
    return metrics_of(y_test, s_test, pred)
