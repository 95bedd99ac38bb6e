"""Ridge experts stacked under the text regressor's head (stacked generalisation, Wolpert 1992).

Why: on real empathy texts no single representation wins everywhere. On EmpatheticExchanges a ridge
on frozen sentence embeddings beats TF-IDF + ridge; on short self-rated essays TF-IDF + ridge beat
the frozen encoder with an MLP head, and their average beat both. A ridge on each, combined with
weights learned on held-out predictions, is at least as good as the better one wherever the two
carry different signal, and costs seconds on a CPU.

An expert is an nn.Module with `needs_embeddings`, `expand(fields, dim, encoder_layers)` (the experts
it stands for, e.g. one per field and layer set), `fit(batch, targets, groups) -> out-of-fold predictions` and
`forward(batch) -> N x labels` on the standardised target scale. `fit` picks the
ridge penalty by grouped K-fold CV on the training rows (scikit-learn's GroupKFold: folds never split
a writer or conversation; `cross_val_predict` of a feature transform + Ridge pipeline, so the
transform is fitted inside each fold), keeps those held-out (cross-fitted) predictions, which are
what the stack weights and the head's training see (an expert's predictions on its own training rows
would be overfitted), then refits on every training row. The stack weights are non-negative least
squares (scipy's nnls). The fitted state (vocabularies, coefficients) travels in the
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
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import Ridge
from sklearn.model_selection import GroupKFold, cross_val_predict
from sklearn.pipeline import Pipeline

from empathic_fusion.core.registry import register_model
from empathic_fusion.models.text.fitted import FittedModule

log = logging.getLogger(__name__)
RIDGE_ALPHAS = tuple(float(10 ** (k / 2)) for k in range(-2, 11))  # 0.1 .. 1e5: features are not scaled alike
WIDEN_STEPS = 8  # penalties a ridge expert may add beyond an end of its grid, one grid step each (4 decades)
GRID_END_NOTES = {  # what a penalty at an end of the widened grid means, for the stack report
    "upper": " (at the upper end of the widened grid: the expert predicts about the training mean)",
    "lower": " (at the lower end of the widened grid: hardly penalised)"}


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
    """Ridge regression on features of a batch; subclasses say which features: `_fit_transform`
    fits their transform on the given rows and returns it with their features, `_transform` applies
    a fitted transform. `state_key` names that transform in the fitted state (and the checkpoint).

    The penalty grid is never the limit: when the held-out error is lowest at an end of `alphas`, the
    grid grows past that end one step at a time (the ratio of its last two penalties), up to
    `widen_steps` penalties, until the best penalty is inside. A penalty still at an end after that
    is recorded (`grid_end`: "upper", which means the expert predicts about the training mean, or
    "lower") and the stack report says so."""

    needs_embeddings = False
    label = "ridge"
    state_key = "transform"
    layer_sets: tuple[int, ...] = ()  # no encoder layers read (models/contracts.py TextExpert)

    def __init__(self, alphas: tuple[float, ...] = RIDGE_ALPHAS, inner_folds: int = 5, widen_steps: int = WIDEN_STEPS):
        super().__init__()
        self.alphas = tuple(sorted(float(a) for a in alphas))
        if not self.alphas or self.alphas[0] <= 0:
            raise ValueError(f"{type(self).__name__} alphas={list(alphas)}: give positive ridge penalties")
        self.inner_folds, self.widen_steps = int(inner_folds), int(widen_steps)

    @property
    def alpha(self) -> float | None:
        return self._state["alpha"] if self._state else None

    @property
    def grid_end(self) -> str | None:
        """Which end of the (widened) grid the chosen penalty sits at: "upper", "lower" or None (inside)."""
        return self._state.get("grid_end") if self._state else None

    def expand(self, fields: list[str], dim: int, encoder_layers: int | None = None) -> list["RidgeExpert"]:
        """The experts this one stands for over these text fields (encoder width `dim`, with
        `encoder_layers` transformer layers): itself."""
        return [self]

    def _fit_transform(self, batch: dict) -> tuple[Any, Any]:
        """The feature transform fitted on `batch` (the training rows) and their features (None: no features)."""
        raise NotImplementedError

    def _transform(self, transform: Any, batch: dict) -> Any:
        """The features of `batch` under a fitted transform (None: no features)."""
        raise NotImplementedError

    def _inputs(self, batch: dict) -> dict:
        """The part of `batch` this expert reads, which its inner folds copy rows of: the texts."""
        return {"texts": batch["texts"]}

    def fit(self, batch: dict, targets: np.ndarray, groups: list[str] | np.ndarray) -> np.ndarray:
        """Fit on the training rows in `batch`; returns their cross-fitted predictions (N x labels)."""
        targets = np.asarray(targets, dtype=np.float64).reshape(len(targets), -1)
        batch = self._inputs(batch)
        folds = grouped_folds(groups, self.inner_folds, type(self).__name__)
        rows = np.arange(len(targets)).reshape(-1, 1)
        cache: dict = {}
        model = Pipeline([("features", _ExpertFeatures(self, batch, cache)), ("ridge", Ridge())])
        with warnings.catch_warnings():  # a tiny penalty on collinear features: ill-conditioned, still fine
            warnings.simplefilter("ignore", LinAlgWarning)
            dense = self._dense_folds(batch, targets, folds)

            def held_out_of(alphas: list[float]) -> np.ndarray:
                if dense is not None:
                    return _dense_held_out(dense, alphas, targets.shape)
                return np.stack([np.asarray(cross_val_predict(model.set_params(ridge__alpha=alpha), rows, targets,
                                                              cv=folds), dtype=np.float64).reshape(targets.shape)
                                 for alpha in alphas])  # sparse features: scikit-learn's ridge per penalty

            alphas, held_out, best, grid_end = self._search(held_out_of, targets)
            model.set_params(ridge__alpha=alphas[best]).fit(rows, targets)
        features, ridge = model.named_steps["features"], model.named_steps["ridge"]
        chosen = {"alpha": alphas[best], "grid_end": grid_end, "grid": (alphas[0], alphas[-1])}
        if features.empty_:  # no features on the training rows: their mean
            self._state = {**chosen, "grid_end": None, "coef": None, "intercept": targets.mean(0)}
        else:
            self._state = {self.state_key: features.transform_, **chosen,
                           "coef": np.asarray(ridge.coef_, dtype=np.float32).reshape(targets.shape[1], -1),
                           "intercept": np.asarray(ridge.intercept_, dtype=np.float32).reshape(-1)}
        return held_out[best]

    def _search(self, held_out_of, targets: np.ndarray) -> tuple[list[float], np.ndarray, int, str | None]:
        """The penalty with the lowest held-out error over the grid, widened past an end while the best
        sits there (up to `widen_steps` penalties): (penalties, their held-out predictions, the best
        one's index, "upper"/"lower" when it still sits at that end, else None). Errors equal for every
        penalty (no features) widen nothing."""
        alphas = list(self.alphas)
        held_out = held_out_of(alphas)
        widened = 0
        while True:
            errors = ((held_out - targets[None]) ** 2).mean(axis=(1, 2))
            best = int(np.argmin(errors))
            flat = np.ptp(errors) <= 1e-12 * max(float(errors.max()), 1e-300)
            grid_end = None if flat or len(alphas) < 2 else "lower" if best == 0 else \
                "upper" if best == len(alphas) - 1 else None
            if grid_end is None or widened == self.widen_steps:
                return alphas, held_out, best, grid_end
            widened += 1
            if grid_end == "lower":
                alphas.insert(0, alphas[0] * alphas[0] / alphas[1])
                held_out = np.concatenate([held_out_of(alphas[:1]), held_out])
            else:
                alphas.append(alphas[-1] * alphas[-1] / alphas[-2])
                held_out = np.concatenate([held_out, held_out_of(alphas[-1:])])

    def _dense_folds(self, batch: dict, targets: np.ndarray,
                     folds: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple] | None:
        """Per inner fold, what `_dense_held_out` needs to give every penalty's held-out predictions
        at once; None (the default: sparse features) runs scikit-learn per penalty instead."""
        return None

    def forward(self, batch: dict) -> torch.Tensor:
        if self._state is None:
            raise RuntimeError(f"{type(self).__name__} used before fit (the module fits it at the start of training)")
        state = self._state
        n = _batch_size(batch)
        out = np.tile(state["intercept"], (n, 1)).astype(np.float32)
        if state["coef"] is not None:
            x = self._transform(state[self.state_key], batch)
            if x is not None:
                out += np.asarray(x @ state["coef"].T, dtype=np.float32).reshape(n, -1)
        return self._as_batch_tensor(out, batch)


def _dense_held_out(parts: list[tuple], alphas: list[float], shape: tuple[int, ...]) -> np.ndarray:
    """Held-out predictions (penalties x N x labels) of each penalty from the folds' eigendecompositions."""
    held_out = np.zeros((len(alphas), *shape))
    for test, projected, vty, eigenvalues, y_mean in parts:
        for a, alpha in enumerate(alphas):
            held_out[a, test] = projected @ (vty / (eigenvalues + alpha)[:, None]) + y_mean
    return held_out


def grouped_folds(groups: list[str] | np.ndarray, inner_folds: int, owner: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train rows, held-out rows) of up to `inner_folds` GroupKFold folds of the training rows: a
    group (writer, conversation) is never split. One group only: folds of rows, with a warning."""
    groups = np.asarray(groups)
    if len(set(groups.tolist())) < 2:  # a tiny table: rows of the one group, with a warning
        log.warning("%s: the training rows hold one group, so its held-out predictions split rows of that "
                    "group (too few groups for grouped folds)", owner)
        groups = np.arange(len(groups))
    k = min(int(inner_folds), len(set(groups.tolist())))
    if k < 2:
        raise ValueError(f"{owner}: {len(groups)} training row(s); stacking needs at least 2 "
                         "(or train the encoder + head recipe: model.net.experts=[] model.net.head_input=embeddings)")
    return list(GroupKFold(n_splits=k).split(np.zeros(len(groups)), groups=groups))


class _ExpertFeatures(TransformerMixin, BaseEstimator):
    """An expert's feature transform as a scikit-learn step over row positions of `batch`, so that
    `cross_val_predict` fits it inside each fold (on the fold's training rows only). Fitted transforms
    and features are cached by their rows in `cache`, shared by clones: a penalty grid over the same
    folds fits each fold's transform once (a TF-IDF fit costs seconds, a ridge fit milliseconds). Rows
    without features (e.g. TF-IDF with no vocabulary) get one zero column, which a ridge with an
    intercept turns into the training mean; `empty_` says so."""

    def __init__(self, expert: RidgeExpert, batch: dict, cache: dict):
        self.expert, self.batch, self.cache = expert, batch, cache

    def __sklearn_clone__(self) -> "_ExpertFeatures":
        return _ExpertFeatures(self.expert, self.batch, self.cache)  # the data and the cache are shared, not copied

    def fit(self, X: np.ndarray, y: Any = None) -> "_ExpertFeatures":
        self.fit_transform(X, y)
        return self

    def fit_transform(self, X: np.ndarray, y: Any = None, **params: Any) -> Any:
        rows = np.asarray(X).ravel()
        self.fit_key_ = rows.tobytes()
        if self.fit_key_ not in self.cache:
            self.cache[self.fit_key_] = self.expert._fit_transform(_select(self.batch, rows))
        self.transform_, x = self.cache[self.fit_key_]
        self.empty_ = x is None
        return _or_zero_column(x, len(rows))

    def transform(self, X: np.ndarray) -> Any:
        rows = np.asarray(X).ravel()
        key = (self.fit_key_, rows.tobytes())
        if key not in self.cache:
            self.cache[key] = self.expert._transform(self.transform_, _select(self.batch, rows))
        return _or_zero_column(self.cache[key], len(rows))


def _or_zero_column(x: Any, n: int) -> Any:
    return csr_matrix((n, 1), dtype=np.float64) if x is None else x


@register_model("tfidf_ridge_expert", aliases=("empathic_fusion.text.experts.TfidfRidgeExpert",))
class TfidfRidgeExpert(RidgeExpert):
    """Ridge on word 1-2-gram TF-IDF of every field (the TF-IDF + ridge baseline's features)."""

    label = "TF-IDF ridge"
    state_key = "tfidf"

    def __init__(self, alphas: tuple[float, ...] = RIDGE_ALPHAS, inner_folds: int = 5, min_df: int = 2,
                 max_features: int | None = 200000, widen_steps: int = WIDEN_STEPS):
        super().__init__(alphas, inner_folds, widen_steps)
        self.min_df, self.max_features = min_df, max_features

    def _fit_transform(self, batch: dict) -> tuple[FieldTfidf, csr_matrix | None]:
        tfidf = FieldTfidf(self.min_df, self.max_features).fit(batch["texts"])
        return tfidf, tfidf.transform(batch["texts"])

    def _transform(self, transform: FieldTfidf, batch: dict) -> csr_matrix | None:
        return transform.transform({f: [t or "" for t in texts] for f, texts in batch["texts"].items()})


@register_model("embedding_ridge_expert", aliases=("empathic_fusion.text.experts.EmbeddingRidgeExpert",))
class EmbeddingRidgeExpert(RidgeExpert):
    """Ridge on the frozen encoder's embeddings (`batch["embeddings"]`, fields side by side), each
    dimension centred and scaled by the training rows' statistics. `per_field` (default): one ridge
    per text field, each with its own penalty, so the stack weighs the fields (on
    EmpatheticExchanges the reply, the turn it answers, the situation and the previous exchange)
    instead of one penalty shrinking them alike.

    `layers` makes it representation experts: for each k in the list, a ridge on the mean of the last
    k layers' pooled vectors (`batch["layer_embeddings"][k]`, SentenceEncoder.layer_embeddings), per
    field; `all` stands for every layer the encoder has (6 in MiniLM, 12 in mpnet). Which layers
    serve a data set best varies with its texts (the last layer is what sentence encoders are trained
    for; lower ones keep more of the wording), so the stack weighs the sets on
    held-out predictions instead of a constant choosing one. Sets deeper than the encoder are left
    out; an encoder without layers (the multilingual one) reads its embeddings."""

    needs_embeddings = True
    label = "embedding ridge"
    state_key = "scale"

    def __init__(self, alphas: tuple[float, ...] = RIDGE_ALPHAS, inner_folds: int = 5, per_field: bool = True,
                 columns: tuple[int, int] | None = None, field: str | None = None,
                 layers: list[int | str] | int | None = None, widen_steps: int = WIDEN_STEPS,
                 encoder_layers: int | None = None):
        super().__init__(alphas, inner_folds, widen_steps)
        self.per_field, self.columns, self.field = per_field, columns, field
        self.layers = layers if layers is None or isinstance(layers, int) else tuple(_layer_set(k) for k in layers)
        parts = [field] if field else []
        if isinstance(self.layers, int):
            parts.append("last layer" if self.layers == 1 else
                         f"all {self.layers} layers" if self.layers == encoder_layers else f"last {self.layers} layers")
        if parts:
            self.label = f"embedding ridge ({', '.join(parts)})"

    @property
    def layer_sets(self) -> tuple[int, ...]:
        """The layer sets this expert reads from `batch["layer_embeddings"]` (none: the embeddings)."""
        return (self.layers,) if isinstance(self.layers, int) else ()

    def expand(self, fields: list[str], dim: int, encoder_layers: int | None = None) -> list[RidgeExpert]:
        """One expert per field (with `per_field` and several fields) and per layer set (with `layers`:
        those the encoder's `encoder_layers` allow)."""
        layer_sets: list[int | None] = [self.layers]
        if isinstance(self.layers, tuple):
            wanted = list(dict.fromkeys(encoder_layers if k == ALL_LAYERS else k for k in self.layers))
            layer_sets = [k for k in wanted if k is not None and k <= encoder_layers] if encoder_layers else [None]
            if len(layer_sets) < len(wanted):
                log.info("embedding ridge experts: layer sets %s left out (%s)", [k for k in wanted if k not in layer_sets],
                         f"deeper than the encoder's {encoder_layers} layers" if encoder_layers
                         else "the encoder has no layers: its embeddings are read instead")
        if self.layers is None and (not self.per_field or len(fields) < 2):
            return [self]
        parts = [(None, None)] if not self.per_field or len(fields) < 2 else \
            [((k * dim, (k + 1) * dim), field) for k, field in enumerate(fields)]
        return [EmbeddingRidgeExpert(self.alphas, self.inner_folds, False, columns, field, k, self.widen_steps,
                                     encoder_layers) for columns, field in parts for k in layer_sets]

    def _inputs(self, batch: dict) -> dict:
        """Its own matrix alone (one field's columns of one layer set) as `features`: the inner folds then
        copy rows of N x dim, not of every layer set of every field (17 experts over mpnet's layers
        spent most of their fit copying those)."""
        return {"texts": {}, "features": self._x(batch)}

    def _x(self, batch: dict) -> np.ndarray:
        if "features" in batch:  # narrowed by _inputs
            return batch["features"]
        x = _embeddings(batch) if self.layers is None else _layer_embeddings(batch, self.layers)
        return x[:, self.columns[0]:self.columns[1]] if self.columns else x

    def _fit_transform(self, batch: dict) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
        """Centre and scale (zero-variance dimensions keep scale 1), as StandardScaler does; float32
        statistics, which the checkpoints hold."""
        x = self._x(batch)
        std = x.std(0)
        scale = (x.mean(0), np.where(std > 0, std, 1.0).astype(np.float32))
        return scale, (x - scale[0]) / scale[1]

    def _transform(self, transform: tuple[np.ndarray, np.ndarray], batch: dict) -> np.ndarray:
        return (self._x(batch) - transform[0]) / transform[1]

    def _dense_folds(self, batch: dict, targets: np.ndarray,
                     folds: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple]:
        """Per inner fold, one eigendecomposition of the fold's standardised, centred Gram matrix
        Z'Z = V diag(l) V': the ridge solution for any penalty is then V diag(1 / (l + alpha)) V'Z'y,
        what scikit-learn's StandardScaler + Ridge with an intercept solve, so a grid of penalties (and
        its widening) costs one factorisation per fold. Every fold's Gram matrix, means and scales come
        from one Gram matrix of all training rows minus the fold's held-out rows, so no fold copies
        its training rows (17 experts over mpnet's 768-d layers spent most of their fit doing that)."""
        x = np.asarray(self._x(batch), dtype=np.float64)
        gram, xty, total, n = x.T @ x, x.T @ targets, x.sum(0), len(x)
        parts = []
        for train, test in folds:
            x_test, n_train = x[test], n - len(test)
            sums = total - x_test.sum(0)
            mean, y_mean = sums / n_train, targets[train].mean(0)
            centred = gram - x_test.T @ x_test - n_train * np.outer(mean, mean)
            variance = np.diag(centred) / n_train
            # constant dimensions (an empty field) keep scale 1, as StandardScaler does; rounding leaves
            # their variance a tiny fraction of the squared mean instead of 0
            scale = np.where(variance > 1e-10 * mean ** 2 + 1e-300, np.sqrt(np.clip(variance, 0.0, None)), 1.0)
            eigenvalues, vectors = np.linalg.eigh(centred / np.outer(scale, scale))
            eigenvalues = np.clip(eigenvalues, 0.0, None)                        # rounding below zero
            xy = ((xty - x_test.T @ targets[test]) - np.outer(sums, y_mean)) / scale[:, None]  # Z'(y - mean)
            parts.append((test, ((x_test - mean) / scale) @ vectors, vectors.T @ xy, eigenvalues, y_mean))
        return parts


ALL_LAYERS = "all"


def _layer_set(k: int | str) -> int | str:
    """A layer count >= 1, or `all` (every layer of the encoder)."""
    if k == ALL_LAYERS:
        return k
    if isinstance(k, bool) or not isinstance(k, (int, str)) or not str(k).isdigit() or int(k) < 1:
        raise ValueError(f"EmbeddingRidgeExpert layers: {k!r} is neither a layer count >= 1 nor '{ALL_LAYERS}' "
                         "(e.g. [1, 2, 4, all])")
    return int(k)


def _embeddings(batch: dict) -> np.ndarray:
    if "embeddings" not in batch:
        raise ValueError("the embedding ridge expert reads batch['embeddings'], which only a frozen encoder gives "
                         "(with trainable_layers > 0 use experts without it, e.g. TfidfRidgeExpert alone)")
    return _as_float32(batch["embeddings"])


def _layer_embeddings(batch: dict, k: int) -> np.ndarray:
    """The fields' mean of the last k layers' pooled vectors, side by side (N x fields*dim)."""
    sets = batch.get("layer_embeddings") or {}
    if k not in sets:
        raise ValueError(f"this embedding ridge expert reads the last {k} layers (batch['layer_embeddings'][{k}]), "
                         f"which the batch lacks (it has {sorted(sets) or 'none'}): the text module asks its "
                         "datamodule for the layer sets its experts read")
    return _as_float32(sets[k])


def _as_float32(x: Any) -> np.ndarray:
    """A float32 array of a tensor (on any device) or of anything numpy reads."""
    return x.detach().float().cpu().numpy() if torch.is_tensor(x) else np.asarray(x, np.float32)


def _batch_size(batch: dict) -> int:
    if "embeddings" in batch:
        return len(batch["embeddings"])
    return len(next(iter(batch["texts"].values())))


def _select(batch: dict, rows: np.ndarray) -> dict:
    """The part of a (training rows) batch at positions `rows`: texts, embeddings and an expert's features."""
    out: dict[str, Any] = {"texts": {f: [texts[i] for i in rows] for f, texts in batch["texts"].items()}}
    if "features" in batch:
        out["features"] = _rows_of(batch["features"], rows)
    if "embeddings" in batch:
        out["embeddings"] = _rows_of(batch["embeddings"], rows)
    if "layer_embeddings" in batch:
        out["layer_embeddings"] = {k: _rows_of(x, rows) for k, x in batch["layer_embeddings"].items()}
    return out


def _rows_of(x: Any, rows: np.ndarray) -> Any:
    return x[torch.as_tensor(rows)] if torch.is_tensor(x) else np.asarray(x)[rows]


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
