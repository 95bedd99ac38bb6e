"""Trivial and classical baselines every text model is compared with, fitted per training fold."""
from __future__ import annotations

import numpy as np
from scipy import sparse
from sklearn.linear_model import Ridge
from sklearn.model_selection import GridSearchCV, PredefinedSplit

from empathic_fusion.models.text.experts import RIDGE_ALPHAS, FieldTfidf


def train_mean(train_targets: np.ndarray, n_test: int) -> np.ndarray:
    """The training mean of every label, for every test row."""
    return np.repeat(train_targets.mean(0, keepdims=True), n_test, axis=0)


def majority_class(train_targets: np.ndarray, n_test: int) -> np.ndarray:
    """The most frequent (rounded) training value of every label; ties go to the smaller level."""
    modes = []
    for column in np.rint(train_targets).T:
        values, counts = np.unique(column, return_counts=True)
        modes.append(values[np.argmax(counts)])
    return np.repeat(np.asarray(modes, dtype=float)[None, :], n_test, axis=0)


def _tfidf(fields: dict[str, list[str]], fit_rows: np.ndarray, rows: list[np.ndarray]):
    """Per field a word uni+bigram TF-IDF (sublinear tf) fitted on fit_rows; stacked matrices for `rows`
    (None each when no field has a vocabulary)."""
    tfidf = FieldTfidf().fit({f: [values[i] for i in fit_rows] for f, values in fields.items()})
    return [tfidf.transform({f: [values[i] for i in r] for f, values in fields.items()}) for r in rows]


def _pick_alpha(x_train, y_train: np.ndarray, x_val, y_val: np.ndarray) -> float:
    """The RIDGE_ALPHAS value (0.1 .. 1e5, the experts' grid: raw sentence embeddings need penalties
    far above 100) with the lowest validation MSE: a grid search over the one train/validation split."""
    x = sparse.vstack([x_train, x_val]).tocsr() if sparse.issparse(x_train) else np.concatenate([x_train, x_val])
    split = PredefinedSplit(np.r_[np.full(len(y_train), -1), np.zeros(len(y_val), dtype=int)])
    search = GridSearchCV(Ridge(), {"alpha": list(RIDGE_ALPHAS)}, scoring="neg_mean_squared_error", cv=split,
                          refit=False, error_score="raise")
    return float(search.fit(x, np.concatenate([y_train, y_val])).best_params_["alpha"])


def embedding_ridge(embeddings: np.ndarray, targets: np.ndarray, train_rows: np.ndarray, test_rows: np.ndarray,
                    val_rows: np.ndarray | None = None) -> np.ndarray:
    """Ridge on (frozen-encoder) embeddings; alpha picked on the validation rows, refitted on train + val."""
    val_rows = np.asarray(val_rows if val_rows is not None else [], dtype=int)
    alpha = _pick_alpha(embeddings[train_rows], targets[train_rows], embeddings[val_rows], targets[val_rows]) \
        if len(val_rows) else 1.0
    fit_rows = np.concatenate([train_rows, val_rows])
    model = Ridge(alpha=alpha).fit(embeddings[fit_rows], targets[fit_rows])
    return np.asarray(model.predict(embeddings[test_rows])).reshape(len(test_rows), -1)


def tfidf_ridge(fields: dict[str, list[str]], targets: np.ndarray, train_rows: np.ndarray, test_rows: np.ndarray,
                alpha: float | None = None, val_rows: np.ndarray | None = None) -> np.ndarray:
    """TF-IDF of every field, stacked -> ridge, one output per label, fitted on train (+ val) rows.
    alpha None: picked from RIDGE_ALPHAS by validation MSE (fit on train_rows, scored on val_rows),
    then refitted on train + val; without val_rows alpha None means 1."""
    val_rows = np.asarray(val_rows if val_rows is not None else [], dtype=int)
    if alpha is None and len(val_rows):
        x_train, x_val = _tfidf(fields, train_rows, [train_rows, val_rows])
        if x_train is None:
            return train_mean(targets[train_rows], len(test_rows))
        alpha = _pick_alpha(x_train, targets[train_rows], x_val, targets[val_rows])
    fit_rows = np.concatenate([train_rows, val_rows])
    x_fit, x_test = _tfidf(fields, fit_rows, [fit_rows, test_rows])
    if x_fit is None:
        return train_mean(targets[fit_rows], len(test_rows))
    model = Ridge(alpha=1.0 if alpha is None else alpha).fit(x_fit, targets[fit_rows])
    return np.asarray(model.predict(x_test)).reshape(len(test_rows), -1)
