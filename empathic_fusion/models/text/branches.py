"""Extra input branches of the text regressor, concatenated to the encoder's field embeddings.

A branch is an nn.Module with `out_dim`, `fit(texts)` (called once at the start of training on the
training rows' texts, `{field: [text, ...]}`) and `forward(batch) -> Tensor` (N x out_dim) reading
`batch["texts"]`. Its fitted state travels in the checkpoint (PyTorch extra state), so a
checkpoint scores new text without the training data. Pick one with `model.net.branch`.
"""
from __future__ import annotations

import numpy as np
import torch

from empathic_fusion.core.registry import register_model
from empathic_fusion.models.text.fitted import FittedModule


@register_model("tfidf_branch", aliases=("empathic_fusion.text.branches.TfidfBranch",))
class TfidfBranch(FittedModule):
    """Word 1-2-gram TF-IDF (sublinear tf) of all fields joined, reduced to `n_components` by
    truncated SVD (latent semantic analysis) and standardised; fitted on the training rows only.
    Bag-of-words signal next to the encoder (TF-IDF + ridge is a strong baseline on short essays)."""

    def __init__(self, n_components: int = 128, min_df: int = 2, max_features: int | None = 50000, seed: int = 0):
        super().__init__()
        self.out_dim = int(n_components)
        self.min_df, self.max_features, self.seed = min_df, max_features, seed

    @staticmethod
    def _join(texts: dict[str, list[str]]) -> list[str]:
        return [" ".join(parts) for parts in zip(*texts.values())]

    def fit(self, texts: dict[str, list[str]]) -> "TfidfBranch":
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        docs = self._join(texts)
        vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=self.min_df, sublinear_tf=True,
                                     max_features=self.max_features).fit(docs)
        matrix = vectorizer.transform(docs)
        k = min(self.out_dim, matrix.shape[1] - 1, matrix.shape[0] - 1)
        if k < 1:
            raise ValueError(f"TF-IDF branch: {matrix.shape[1]} terms in {matrix.shape[0]} training texts, too few for SVD")
        svd = TruncatedSVD(n_components=k, random_state=self.seed).fit(matrix)
        reduced = svd.transform(matrix)
        std = reduced.std(0)
        self._state = {"vectorizer": vectorizer, "svd": svd, "mean": reduced.mean(0),
                       "std": np.where(std > 0, std, 1.0)}
        return self

    def forward(self, batch: dict) -> torch.Tensor:
        if self._state is None:
            raise RuntimeError("TF-IDF branch used before fit (the module fits it at the start of training)")
        state = self._state
        reduced = (state["svd"].transform(state["vectorizer"].transform(self._join(batch["texts"]))) - state["mean"]) / state["std"]
        out = np.zeros((reduced.shape[0], self.out_dim), dtype=np.float32)  # fewer SVD components: zero-padded
        out[:, :reduced.shape[1]] = reduced
        return self._as_batch_tensor(out, batch)
