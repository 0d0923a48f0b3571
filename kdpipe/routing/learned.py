"""The ``learned`` router: a regularised linear classifier that predicts which teacher owns a row's class from
the teachers' features (docs/routing.md, "Routers").

Features: every teacher's pooled state and logits, standardised; fitted on the validation rows by scikit-learn's
``LogisticRegressionCV``, cross-fitted for the validation rows themselves (the train rows: the model fitted on all of
them). The weights are its probabilities.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegressionCV
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from kdpipe.core.store import KdpipeError

C_GRID = np.logspace(-4, 2, 7)  # inverse regularisation strengths tried by the inner cross-validation


def _model(folds: int, seed: int):
    return make_pipeline(
        StandardScaler(),
        LogisticRegressionCV(
            Cs=C_GRID,
            l1_ratios=(0.0,),
            scoring="neg_log_loss",
            use_legacy_attributes=False,
            cv=StratifiedKFold(folds, shuffle=True, random_state=seed),
            max_iter=2000,
        ),
    )


def _probs(model, features: np.ndarray, teachers: int) -> np.ndarray:
    """Predicted probabilities [n, K] over every teacher (a teacher absent from the fit gets 0)."""
    out = np.zeros((len(features), teachers), np.float32)
    out[:, model.classes_] = model.predict_proba(features)
    return out


def learned_router(
    validation: np.ndarray, owners: np.ndarray, train: np.ndarray, teachers: int, *, folds: int, seed: int
) -> tuple[np.ndarray, np.ndarray, dict]:
    """(train weights [N, K], cross-fitted validation weights [N_val, K], the fit's figures) from the features of
    both splits and the owner index of each validation row's gold class."""
    counts = np.bincount(owners, minlength=teachers)
    if (counts < 2).any():
        few = int(np.argmin(counts))
        raise KdpipeError(
            f"the learned router needs at least 2 validation rows of every teacher's classes; teacher {few} has "
            f"{counts[few]}: enlarge dataset.split.validation or choose another router"
        )
    folds = int(max(2, min(folds, counts.min())))
    crossfit = np.zeros((len(validation), teachers), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        outer = StratifiedKFold(folds, shuffle=True, random_state=seed)
        for fit_rows, held_out in outer.split(validation, owners):
            inner = int(max(2, min(folds, np.bincount(owners[fit_rows]).min())))
            model = _model(inner, seed).fit(validation[fit_rows], owners[fit_rows])
            crossfit[held_out] = _probs(model, validation[held_out], teachers)
        final = _model(folds, seed).fit(validation, owners)
    regression = final[-1]
    figures = {"folds": folds, "C": float(np.atleast_1d(regression.C_)[0]), "features": int(validation.shape[1])}
    return _probs(final, train, teachers), crossfit, figures
