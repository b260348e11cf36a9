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
  with ``TruePositiveRateParity`` on a logistic regression over all columns at once;
  :func:`eg_predict` is the same with the moment matching a run's ``constraint``
  (:data:`EG_MOMENTS`) and any difference bound, and :func:`group_metrics` measures any
  predictions on group codes. :func:`eg_expected` gives the probabilities its randomised
  classifier draws with, which :func:`expected_metrics` scores in expectation
  (:func:`eg_predictors`: the predictors it draws from, and their weights).
* :func:`threshold_predict`: fairlearn's ``ThresholdOptimizer`` (a threshold per group, so it
  needs the group of every row it predicts; :func:`threshold_expected` in expectation);
  :func:`plain_predict`: the unconstrained logistic regression both start from.

Every function returns the paper's test metrics (ACC, DFP, DFN), computed by
``metrics.fairness_metrics`` like FairVFL's own numbers. Labels are in {-1, +1}; ``s`` is
``True`` for group a, or each row's group code with several groups.
"""

from __future__ import annotations

import numpy as np

from fairvfl_flwr.core.constraints import SensitiveGroups
from fairvfl_flwr.core.metrics import fairness_metrics, positive_rate_gaps

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
    """Whether the baselines' packages (fairlearn, aif360, scikit-learn) are installed."""
    try:
        for m in ("fairlearn", "aif360", "sklearn"):
            _require(m)
    except MissingExtras:
        return False
    return True


def metrics_of(y: np.ndarray, s: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """ACC, DFP, DFN of predictions ``pred`` in {-1, +1} (or {0, 1})."""
    return fairness_metrics(y, s, np.where(np.asarray(pred) > 0, 1.0, -1.0))  # s: a/b, or group codes


def group_metrics(y: np.ndarray, codes: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """ACC; DFP, DFN and the demographic-parity difference as the largest pairwise gap over the
    groups in ``codes`` (``dfp``, ``dfn``, ``dpd``) and as the largest gap to the rate over all
    rows (``*_overall``). ``codes``: each row's group index, or a boolean column (two groups)."""
    codes = SensitiveGroups.of(codes).codes
    pred = np.where(np.asarray(pred) > 0, 1, -1)
    return {**fairness_metrics(y, codes, pred), **positive_rate_gaps(codes, pred)}


def regroup(raw_train: np.ndarray, grouped_train: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """Rows ``raw`` (data groups: codes or a boolean column) in the grouping a run's constraint
    made of the training rows (``grouped_train``: its codes, small groups pooled or not), so
    that test metrics use the groups the run constrained."""
    raw_train, raw = SensitiveGroups.of(raw_train).codes, SensitiveGroups.of(raw).codes
    grouped_train = np.asarray(grouped_train)
    out = np.empty(len(raw), dtype=np.int64)
    for k in np.unique(raw):
        into = np.unique(grouped_train[raw_train == k])
        if len(into) != 1:
            where = f"in constraint groups {into.tolist()}" if len(into) else "none"
            raise ValueError(f"data group {k}: its training rows must be in one constraint group, found {where}")
        out[raw == k] = into[0]
    return out


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


#: run-config ``constraint`` -> the fairlearn moment ExponentiatedGradient takes for it (fairlearn's
#: moments compare each group with the overall rate; FairVFL's default form compares pairs)
EG_MOMENTS = {"deo": "TruePositiveRateParity", "equalized-odds": "EqualizedOdds",
              "demographic-parity": "DemographicParity"}


def eg_moment(constraint: str, bound: float | None = None):
    """A new fairlearn moment object for the run-config ``constraint`` (:data:`EG_MOMENTS`);
    ``bound``: its ``difference_bound`` (None: fairlearn's default, 0.01)."""
    if constraint not in EG_MOMENTS:
        raise ValueError(f"constraint {constraint!r} has no fairlearn moment here; choose one of "
                         f"{', '.join(EG_MOMENTS)}")
    if bound is not None and not bound > 0:
        raise ValueError(f"difference bound must be > 0, got {bound}")
    reductions = _require("fairlearn.reductions")
    moment = getattr(reductions, EG_MOMENTS[constraint])
    return moment() if bound is None else moment(difference_bound=bound)


def _protected_target(y: np.ndarray, protected_label: int) -> np.ndarray:
    """Labels as fairlearn's 0/1 with the *protected* label (the class whose rows define N^a,
    N^b and DEO) as its positive class: TPR parity is then equal opportunity on the rows FairVFL
    constrains. Equalized odds and demographic parity do not depend on which class is positive."""
    if protected_label not in (-1, 1):
        raise ValueError(f"protected_label must be -1 or +1, got {protected_label}")
    return (np.asarray(y) == protected_label).astype(int)


def _from_target(hit: np.ndarray, protected_label: int) -> np.ndarray:
    return np.where(np.asarray(hit) == 1, protected_label, -protected_label)


def _eg_fit(X_train, y_train, s_train, protected_label: int, constraint: str, max_iter: int, bound: float | None):
    """ExponentiatedGradient(LogisticRegression, the moment of ``constraint``) fitted on rows
    recoded as :func:`_protected_target` says."""
    target = _protected_target(y_train, protected_label)
    moment = eg_moment(constraint, bound)
    from fairlearn.reductions import ExponentiatedGradient
    from sklearn.linear_model import LogisticRegression

    eg = ExponentiatedGradient(LogisticRegression(max_iter=1000), constraints=moment, max_iter=max_iter)
    return eg.fit(np.asarray(X_train), target, sensitive_features=np.asarray(s_train, dtype=int))


@_single_threaded
def eg_predict(X_train, y_train, s_train, X_test, protected_label: int = 1, constraint: str = "deo",
               seed: int = 0, max_iter: int = 50, bound: float | None = None) -> np.ndarray:
    """Test predictions in {-1, +1} of ExponentiatedGradient(LogisticRegression, the moment of
    ``constraint`` with ``difference_bound`` ``bound``) trained on all columns, groups ``s_train``
    (codes or a boolean column); labels recoded as :func:`_protected_target` says, predictions
    mapped back to {-1, +1}: one draw of its randomised classifier (:func:`eg_expected` gives
    the probabilities the draw is made with)."""
    eg = _eg_fit(X_train, y_train, s_train, protected_label, constraint, max_iter, bound)
    return _from_target(eg.predict(np.asarray(X_test), random_state=seed), protected_label)


def _positive_share(p_target: np.ndarray, protected_label: int) -> np.ndarray:
    """P(prediction = +1) from P(prediction = the protected label)."""
    return p_target if protected_label == 1 else 1.0 - p_target


@_single_threaded
def eg_predictors(X_train, y_train, s_train, X_eval: list, protected_label: int = 1, constraint: str = "deo",
                  max_iter: int = 50, bound: float | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """ExponentiatedGradient's randomised classifier (:func:`eg_predict`'s) taken apart: the
    weights of the predictors it draws from (those above 0, summing to 1) and, for each matrix
    of ``X_eval``, each predictor's hard predictions as P(+1) in {0, 1} (predictors × rows)."""
    eg = _eg_fit(X_train, y_train, s_train, protected_label, constraint, max_iter, bound)
    used = eg.weights_[eg.weights_ > 0]
    hits = [np.array([_positive_share(np.asarray(eg.predictors_[t].predict(np.asarray(X)), dtype=float),
                                      protected_label) for t in used.index]) for X in X_eval]
    return used.to_numpy(dtype=float), hits


def eg_expected(X_train, y_train, s_train, X_eval: list, protected_label: int = 1, constraint: str = "deo",
                max_iter: int = 50, bound: float | None = None) -> list[np.ndarray]:
    """For each matrix of ``X_eval``, every row's probability that ExponentiatedGradient's
    randomised classifier predicts +1: its predictors' predictions weighted by its ``weights_``
    (:func:`eg_predictors`). Scored by :func:`expected_metrics`, these are the accuracy and the
    rates in expectation over the classifier's draws, which are what its difference bound
    holds; one draw (``predict``) scatters around them."""
    weights, hits = eg_predictors(X_train, y_train, s_train, X_eval, protected_label, constraint, max_iter, bound)
    return [np.clip(weights @ h, 0.0, 1.0) for h in hits]


def expected_metrics(y: np.ndarray, codes: np.ndarray, p_positive: np.ndarray) -> dict[str, float]:
    """ACC and fairlearn's demographic parity and equalized odds differences of a randomised
    classifier that predicts +1 on row i with probability ``p_positive[i]``, in expectation over
    its draws: each rate is the mean probability over its rows, and each difference the largest
    minus the smallest of those expected rates over the groups in ``codes`` (a group with no rows
    of a label value counts that rate as 0, as fairlearn does). With probabilities in {0, 1} it
    is :func:`group_metrics`' ``acc``, ``dp_diff`` and ``eo_diff``."""
    y, p = np.asarray(y), np.clip(np.asarray(p_positive, dtype=float), 0.0, 1.0)
    codes = SensitiveGroups.of(codes).codes
    pos = y == 1

    def spread(rows: np.ndarray) -> float:
        rates = [float(p[rows & (codes == k)].mean()) if (rows & (codes == k)).any() else 0.0
                 for k in np.unique(codes)]
        return max(rates) - min(rates)

    return {"acc": float(np.where(pos, p, 1.0 - p).mean()), "dp_diff": spread(np.ones(len(y), dtype=bool)),
            "eo_diff": max(spread(pos), spread(~pos))}


@_single_threaded
def plain_predict(X_train, y_train, X_test) -> np.ndarray:
    """Test predictions in {-1, +1} of an unconstrained LogisticRegression on all columns: the
    estimator :func:`eg_predict` and :func:`threshold_predict` start from."""
    from sklearn.linear_model import LogisticRegression

    fit = LogisticRegression(max_iter=1000).fit(np.asarray(X_train), np.asarray(y_train) > 0)
    return np.where(fit.predict(np.asarray(X_test)), 1, -1)


#: run-config ``constraint`` -> ThresholdOptimizer's ``constraints``
THRESHOLD_CONSTRAINTS = {"deo": "true_positive_rate_parity", "equalized-odds": "equalized_odds",
                         "demographic-parity": "demographic_parity"}


def _threshold_fit(X_train, y_train, s_train, protected_label: int, constraint: str):
    if constraint not in THRESHOLD_CONSTRAINTS:
        raise ValueError(f"constraint {constraint!r} has no ThresholdOptimizer constraint here; choose one of "
                         f"{', '.join(THRESHOLD_CONSTRAINTS)}")
    target = _protected_target(y_train, protected_label)
    _require("fairlearn")
    from fairlearn.postprocessing import ThresholdOptimizer
    from sklearn.linear_model import LogisticRegression

    opt = ThresholdOptimizer(estimator=LogisticRegression(max_iter=1000), constraints=THRESHOLD_CONSTRAINTS[constraint],
                             predict_method="predict_proba")
    return opt.fit(np.asarray(X_train), target, sensitive_features=np.asarray(s_train, dtype=int))


@_single_threaded
def threshold_predict(X_train, y_train, s_train, X_test, s_test, protected_label: int = 1,
                      constraint: str = "equalized-odds", seed: int = 0) -> np.ndarray:
    """Test predictions in {-1, +1} of fairlearn's ThresholdOptimizer over a LogisticRegression
    on all columns, one randomised threshold per group for ``constraint``
    (:data:`THRESHOLD_CONSTRAINTS`). It needs each test row's group (``s_test``) at prediction
    time: a model that does not take the sensitive attribute as input cannot do this."""
    opt = _threshold_fit(X_train, y_train, s_train, protected_label, constraint)
    hit = opt.predict(np.asarray(X_test), sensitive_features=np.asarray(s_test, dtype=int), random_state=seed)
    return _from_target(hit, protected_label)


@_single_threaded
def threshold_expected(X_train, y_train, s_train, X_eval: list, s_eval: list, protected_label: int = 1,
                       constraint: str = "equalized-odds") -> list[np.ndarray]:
    """:func:`threshold_predict`'s classifier in expectation: for each (rows, groups) pair of
    ``X_eval`` and ``s_eval``, every row's probability of a +1 (fairlearn's probability mass of
    its randomised thresholds; :func:`expected_metrics` scores them)."""
    opt = _threshold_fit(X_train, y_train, s_train, protected_label, constraint)
    return [_positive_share(opt._pmf_predict(np.asarray(X), sensitive_features=np.asarray(s, dtype=int))[:, 1],
                            protected_label) for X, s in zip(X_eval, s_eval)]


def centralised_reference(X_train, y_train, s_train, X_test, y_test, s_test, protected_label: int = 1,
                          seed: int = 0, max_iter: int = 50) -> dict:
    """ExponentiatedGradient(LogisticRegression, TruePositiveRateParity) on all columns
    (:func:`eg_predict` with ``constraint="deo"``): test ACC, DFP, DFN."""
    pred = eg_predict(X_train, y_train, s_train, X_test, protected_label, "deo", seed=seed, max_iter=max_iter)
    return metrics_of(np.asarray(y_test), s_test, pred)
