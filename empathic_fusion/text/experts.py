"""Ridge experts stacked under the text regressor's head (stacked generalisation, Wolpert 1992).

Why: on real empathy texts no single representation wins everywhere. On EmpatheticExchanges a ridge
on frozen sentence embeddings beats TF-IDF + ridge; on short self-rated essays TF-IDF + ridge beat
the frozen encoder with an MLP head, and their average beat both. A ridge on each, combined with
weights learned on held-out predictions, is at least as good as the better one wherever the two
carry different signal, and costs seconds on a CPU.

An expert is an nn.Module with `needs_embeddings`, `expand(fields, dim)` (the experts it stands for,
e.g. one per field), `fit(batch, targets, groups) -> out-of-fold predictions` and
`forward(batch) -> N x labels` on the standardised target scale. `fit` picks the
ridge penalty by grouped K-fold CV on the training rows (folds never split a writer or
conversation), keeps those held-out (cross-fitted) predictions, which are what the stack weights and
the head's training see (an expert's predictions on its own training rows would be overfitted),
then refits on every training row. The fitted state (vocabularies, coefficients) travels in the
checkpoint as PyTorch extra state, so a checkpoint scores new text without the training data.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import torch
from scipy.linalg import LinAlgWarning
from scipy.optimize import nnls
from scipy.sparse import csr_matrix, hstack
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import Ridge
from sklearn.model_selection import GroupKFold

from empathic_fusion.text.fitted import FittedModule

log = logging.getLogger(__name__)
RIDGE_ALPHAS = tuple(float(10 ** (k / 2)) for k in range(-2, 11))  # 0.1 .. 1e5: features are not scaled alike


class FieldTfidf:
    """Per text field a word 1-2-gram TF-IDF (sublinear tf), fitted on the given texts; the fields'
    matrices side by side. A field with no vocabulary (e.g. empty everywhere) is left out."""

    def __init__(self, min_df: int = 2, max_features: int | None = None):
        self.min_df, self.max_features = min_df, max_features
        self.vectorizers: dict[str, TfidfVectorizer] = {}

    def fit(self, fields: dict[str, list[str]]) -> "FieldTfidf":
        self.vectorizers = {}
        for name, texts in fields.items():
            vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=self.min_df, sublinear_tf=True,
                                         max_features=self.max_features, dtype=np.float32)
            try:
                self.vectorizers[name] = vectorizer.fit(texts)
            except ValueError:  # no vocabulary in this field
                continue
        return self

    def transform(self, fields: dict[str, list[str]]) -> csr_matrix | None:
        """None when no field has a vocabulary."""
        blocks = [v.transform(fields[name]) for name, v in self.vectorizers.items()]
        return hstack(blocks).tocsr() if blocks else None


class RidgeExpert(FittedModule):
    """Ridge regression on features of a batch; subclasses say which features (`_features`)."""

    needs_embeddings = False
    label = "ridge"

    def __init__(self, alphas: tuple[float, ...] = RIDGE_ALPHAS, inner_folds: int = 5):
        super().__init__()
        self.alphas = tuple(float(a) for a in alphas)
        self.inner_folds = int(inner_folds)

    @property
    def alpha(self) -> float | None:
        return self._state["alpha"] if self._state else None

    def expand(self, fields: list[str], dim: int) -> list["RidgeExpert"]:
        """The experts this one stands for over these text fields (encoder width `dim`): itself."""
        return [self]

    def _fit_features(self, batch: dict) -> Any:
        """Fit any feature transform on `batch` (the training rows) and return their features."""
        return self._features(batch)

    def _features(self, batch: dict) -> Any:
        raise NotImplementedError

    def fit(self, batch: dict, targets: np.ndarray, groups: list[str] | np.ndarray) -> np.ndarray:
        """Fit on the training rows in `batch`; returns their cross-fitted predictions (N x labels)."""
        targets = np.asarray(targets, dtype=np.float64).reshape(len(targets), -1)
        groups = np.asarray(groups)
        if len(set(groups.tolist())) < 2:  # a tiny table: rows of the one group, with a warning
            log.warning("%s: the training rows hold one group, so its held-out predictions split rows of that "
                        "group (too few groups for grouped folds)", type(self).__name__)
            groups = np.arange(len(targets))
        k = min(self.inner_folds, len(set(groups.tolist())))
        if k < 2:
            raise ValueError(f"{type(self).__name__}: {len(targets)} training row(s); stacking needs at least 2 "
                             "(or train the encoder + head recipe: model.net.experts=[] model.net.head_input=embeddings)")
        folds = list(GroupKFold(n_splits=k).split(np.zeros(len(targets)), groups=groups))
        held_out = np.zeros((len(self.alphas), *targets.shape))
        for train, test in folds:
            x_train = self._fit_features(_select(batch, train))
            x_test = self._features(_select(batch, test))
            if x_train is None:  # no features on this fold: the fold's training mean
                held_out[:, test] = targets[train].mean(0)
                continue
            for i, alpha in enumerate(self.alphas):
                with warnings.catch_warnings():  # a tiny penalty on collinear features: ill-conditioned, still fine
                    warnings.simplefilter("ignore", LinAlgWarning)
                    model = Ridge(alpha=alpha).fit(x_train, targets[train])
                held_out[i, test] = np.asarray(model.predict(x_test)).reshape(len(test), -1)
        errors = ((held_out - targets[None]) ** 2).mean(axis=(1, 2))
        best = int(np.argmin(errors))
        x_all = self._fit_features(batch)
        if x_all is None:
            self._state = {"alpha": self.alphas[best], "coef": None, "intercept": targets.mean(0)}
        else:
            model = Ridge(alpha=self.alphas[best]).fit(x_all, targets)
            self._state = {**self._state_extra(), "alpha": self.alphas[best],
                           "coef": np.asarray(model.coef_, dtype=np.float32).reshape(targets.shape[1], -1),
                           "intercept": np.asarray(model.intercept_, dtype=np.float32).reshape(-1)}
        return held_out[best]

    def _state_extra(self) -> dict[str, Any]:
        return {}

    def forward(self, batch: dict) -> torch.Tensor:
        if self._state is None:
            raise RuntimeError(f"{type(self).__name__} used before fit (the module fits it at the start of training)")
        state = self._state
        n = _batch_size(batch)
        out = np.tile(state["intercept"], (n, 1)).astype(np.float32)
        if state["coef"] is not None:
            x = self._features(batch)
            if x is not None:
                out += np.asarray(x @ state["coef"].T, dtype=np.float32).reshape(n, -1)
        return self._as_batch_tensor(out, batch)


class TfidfRidgeExpert(RidgeExpert):
    """Ridge on word 1-2-gram TF-IDF of every field (the TF-IDF + ridge baseline's features)."""

    label = "TF-IDF ridge"

    def __init__(self, alphas: tuple[float, ...] = RIDGE_ALPHAS, inner_folds: int = 5, min_df: int = 2,
                 max_features: int | None = 200000):
        super().__init__(alphas, inner_folds)
        self.min_df, self.max_features = min_df, max_features
        self._tfidf: FieldTfidf | None = None

    def _fit_features(self, batch: dict):
        self._tfidf = FieldTfidf(self.min_df, self.max_features).fit(batch["texts"])
        return self._tfidf.transform(batch["texts"])

    def _features(self, batch: dict):
        return self._tfidf.transform({f: [t or "" for t in texts] for f, texts in batch["texts"].items()})

    def _state_extra(self) -> dict[str, Any]:
        return {"tfidf": self._tfidf}

    def set_extra_state(self, state: dict[str, Any] | None) -> None:
        super().set_extra_state(state)
        self._tfidf = (state or {}).get("tfidf")


class EmbeddingRidgeExpert(RidgeExpert):
    """Ridge on the frozen encoder's embeddings (`batch["embeddings"]`, fields side by side), each
    dimension centred and scaled by the training rows' statistics. `per_field` (default): one ridge
    per text field, each with its own penalty, so the stack weighs the fields (on
    EmpatheticExchanges the reply, the turn it answers, the situation and the previous exchange)
    instead of one penalty shrinking them alike."""

    needs_embeddings = True
    label = "embedding ridge"

    def __init__(self, alphas: tuple[float, ...] = RIDGE_ALPHAS, inner_folds: int = 5, per_field: bool = True,
                 columns: tuple[int, int] | None = None, field: str | None = None):
        super().__init__(alphas, inner_folds)
        self.per_field, self.columns, self.field = per_field, columns, field
        if field:
            self.label = f"embedding ridge ({field})"
        self._scale: tuple[np.ndarray, np.ndarray] | None = None

    def expand(self, fields: list[str], dim: int) -> list[RidgeExpert]:
        if not self.per_field or len(fields) < 2:
            return [self]
        return [EmbeddingRidgeExpert(self.alphas, self.inner_folds, False, (k * dim, (k + 1) * dim), field)
                for k, field in enumerate(fields)]

    def _x(self, batch: dict) -> np.ndarray:
        x = _embeddings(batch)
        return x[:, self.columns[0]:self.columns[1]] if self.columns else x

    def _fit_features(self, batch: dict):
        x = self._x(batch)
        std = x.std(0)
        self._scale = (x.mean(0), np.where(std > 0, std, 1.0).astype(np.float32))
        return (x - self._scale[0]) / self._scale[1]

    def _features(self, batch: dict):
        return (self._x(batch) - self._scale[0]) / self._scale[1]

    def _state_extra(self) -> dict[str, Any]:
        return {"scale": self._scale}

    def set_extra_state(self, state: dict[str, Any] | None) -> None:
        super().set_extra_state(state)
        if state and "scale" in state:
            self._scale = state["scale"]


def _embeddings(batch: dict) -> np.ndarray:
    if "embeddings" not in batch:
        raise ValueError("the embedding ridge expert reads batch['embeddings'], which only a frozen encoder gives "
                         "(with trainable_layers > 0 use experts without it, e.g. TfidfRidgeExpert alone)")
    embeddings = batch["embeddings"]
    return (embeddings.detach().float().cpu().numpy() if torch.is_tensor(embeddings) else np.asarray(embeddings, np.float32))


def _batch_size(batch: dict) -> int:
    if "embeddings" in batch:
        return len(batch["embeddings"])
    return len(next(iter(batch["texts"].values())))


def _select(batch: dict, rows: np.ndarray) -> dict:
    """The part of a (training rows) batch at positions `rows`: texts and embeddings."""
    out: dict[str, Any] = {"texts": {f: [texts[i] for i in rows] for f, texts in batch["texts"].items()}}
    if "embeddings" in batch:
        out["embeddings"] = batch["embeddings"][torch.as_tensor(rows)] if torch.is_tensor(batch["embeddings"]) \
            else np.asarray(batch["embeddings"])[rows]
    return out


def stack_weights(held_out: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative weights per label (labels x experts) and intercepts that best combine the experts'
    held-out predictions (N x labels x experts) into the targets (N x labels), least squares."""
    n_labels, n_experts = held_out.shape[1], held_out.shape[2]
    weights = np.zeros((n_labels, n_experts))
    intercept = np.zeros(n_labels)
    for j in range(n_labels):
        x, y = held_out[:, j, :], targets[:, j]
        weights[j], _ = nnls(x - x.mean(0), y - y.mean())
        intercept[j] = y.mean() - x.mean(0) @ weights[j]
    return weights.astype(np.float32), intercept.astype(np.float32)
