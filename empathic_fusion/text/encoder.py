"""Transformer text encoder with mean or CLS pooling and, when frozen, a per-text embedding cache.

Frozen (the frozen-BERT recipe of Haleas, "Exploring the Empathy of Leading Large Language Models"): every text is encoded once; later epochs, folds and perturbation reports read the
cache, so training a head over a frozen encoder costs nothing after the first pass. The cache can be
persisted to a folder (one .npy per encoder identity) so benchmark reruns skip encoding entirely.
Fine-tuned: the top `trainable_layers` transformer layers (and the pooler) get gradients; nothing
is cached then because the representation changes while training.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

import empathic_fusion  # noqa: F401  (HF_HUB_OFFLINE: never reach a hub)
from empathic_fusion.features.text_sbert import resolve_model_path


POOLINGS = ("mean", "cls")


def _text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class TextEncoder(nn.Module):
    """AutoModel + tokenizer from a local folder; `forward(texts)` gives mean-pooled embeddings."""

    def __init__(self, model_path: str | None = None, trainable_layers: int = 0, max_length: int = 128,
                 batch_size: int = 64, cache_dir: str | None = None, pooling: str = "mean"):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        path = resolve_model_path(model_path)
        self.model_path = str(path)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModel.from_pretrained(str(path))
        self.max_length = max_length
        if pooling not in POOLINGS:
            raise ValueError(f"encoder pooling must be one of {POOLINGS}, got {pooling!r}")
        self.pooling = pooling
        self.batch_size = batch_size
        self.trainable_layers = int(trainable_layers)
        self.dim = int(self.model.config.hidden_size)
        self._set_trainable(self.trainable_layers)
        self._cache: dict[str, np.ndarray] = {}
        self.identity = self._identity(path)
        self.cache_file = Path(cache_dir) / f"{self.cache_identity}.npz" if cache_dir and self.frozen else None
        self._disk_count = 0
        if self.cache_file is not None and self.cache_file.exists():
            stored = np.load(self.cache_file)
            self._cache = dict(zip(stored["keys"].tolist(), stored["values"]))
            self._disk_count = len(self._cache)

    @staticmethod
    def _identity(path: Path) -> str:
        config = (path / "config.json").read_text() if (path / "config.json").exists() else str(path)
        weights = sorted(p.name + str(p.stat().st_size) for p in path.iterdir() if p.suffix in {".safetensors", ".bin"})
        return hashlib.sha1(json.dumps([config, weights]).encode()).hexdigest()[:16]

    @property
    def cache_identity(self) -> str:
        """Cache files are per encoder and pooling (the max length changes embeddings of long texts too)."""
        return self.identity if (self.pooling, self.max_length) == ("mean", 128) else \
            f"{self.identity}-{self.pooling}-{self.max_length}"

    @property
    def frozen(self) -> bool:
        return self.trainable_layers == 0

    def _set_trainable(self, n_top: int) -> None:
        for p in self.model.parameters():
            p.requires_grad = False
        layers = getattr(getattr(self.model, "encoder", None), "layer", None)
        if n_top <= 0:
            return
        if layers is None:
            raise ValueError(f"cannot fine-tune top layers of {type(self.model).__name__}: no encoder.layer list")
        if n_top > len(layers):
            raise ValueError(f"trainable_layers={n_top} but the encoder has only {len(layers)} layers")
        for layer in list(layers)[-n_top:]:
            for p in layer.parameters():
                p.requires_grad = True

    def _encode(self, texts: list[str]) -> torch.Tensor:
        """Mean pooling over non-padding tokens (the sentence-transformers recipe for MiniLM) or the
        first token's state (`cls`, the bge recipe)."""
        device = next(self.model.parameters()).device
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        batch = {k: v.to(device) for k, v in batch.items()}
        hidden = self.model(**batch).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    def forward(self, texts: list[str]) -> torch.Tensor:
        if not self.frozen:
            return self._encode([t if t else "" for t in texts])
        keys = [_text_key(t) for t in texts]
        missing = sorted({k: t for k, t in zip(keys, texts) if k not in self._cache}.items())
        if missing:
            was_training = self.model.training
            self.model.eval()
            with torch.no_grad():
                for start in range(0, len(missing), self.batch_size):
                    chunk = missing[start:start + self.batch_size]
                    vectors = self._encode([t for _, t in chunk]).float().cpu().numpy()
                    self._cache.update({k: v for (k, _), v in zip(chunk, vectors)})
            self.model.train(was_training)
        device = next(self.model.parameters()).device
        return torch.from_numpy(np.stack([self._cache[k] for k in keys])).to(device)

    def warm(self, texts: list[str]) -> None:
        """Encode (and cache) all texts up front in large batches."""
        unique = list(dict.fromkeys(texts))
        for start in range(0, len(unique), self.batch_size * 8):
            self.forward(unique[start:start + self.batch_size * 8])

    def save_cache(self) -> None:
        """Persist new cache entries to cache_dir (frozen mode only)."""
        if self.cache_file is None or len(self._cache) == self._disk_count:
            return
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        keys = list(self._cache)
        tmp = self.cache_file.with_suffix(".tmp.npz")
        np.savez(tmp, keys=np.array(keys), values=np.stack([self._cache[k] for k in keys]))
        tmp.replace(self.cache_file)
        self._disk_count = len(keys)
