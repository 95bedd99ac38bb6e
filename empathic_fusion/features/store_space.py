"""The disk space an extraction will take in the store, estimated before it starts, so that a disk that is
too small stops the run before any work instead of part way through.

The estimate, per session and branch to extract: its frames times the bytes a frame takes, plus the rows
of the indexed branches and 4 kB per file (the .npy header, the last file-system block):
- frames: a media branch's medium's duration (media.probe_video, as extraction reads it, for the video; the
  audio's, else the video's when the session has no audio file) x the dataset's fps; the transcript's last
  end for a transcript branch;
- per frame: the branch's `frame_bytes` (its unit, branch_unit.py: face 1451 float16 (MediaPipe) or 253
  (OpenFace) + a mask byte; cnn 1280 (EfficientNet-Lite0) or 2048 (ResNet50) float16 + a mask byte; audio
  65 (ComParE_2016) or 25 (eGeMAPSv02) float32 + mask and voiced bytes); a transcript branch's 4-byte row
  index + a mask byte;
- rows: a transcript branch's `row_bytes` (text 1024 float16 per participant utterance, an upper bound on
  sentence encoders' widths; glove 300 (a GloVe file) or 50 (the packaged vectors) float16 per word), the
  stories 1024 float16 each.
A branch that is redone replaces its files, so it counts less the bytes its current files take (never
below zero; the largest branch counts whole, as its new files are written before the old ones go). A
medium whose duration cannot be read counts nothing here: its extraction fails and is reported as usual.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from pathlib import Path

from empathic_fusion.core.files import format_bytes, free_bytes
from empathic_fusion.dataset import EmpathyDataset
from empathic_fusion.features.branch_unit import branch_unit
from empathic_fusion.features.media import MediaError, probe_video
from empathic_fusion.features.store import DATASET_KEY, FeatureStore, StoreSpaceError

FILE_OVERHEAD = 4096  # per array file: its header and a partly used last block
TEXT_WIDTH = 1024     # an upper bound on a sentence encoder's width (MiniLM 384, mpnet 768, large models 1024)
INDEX_BYTES = 4 + 1   # an indexed branch's int32 row per frame and its mask byte


def media_seconds(path: Path, kind: str) -> float | None:
    """Duration of a file's video (media.probe_video's, the one extraction reads) or first audio stream
    (its container header, else the container's); None when the file cannot be opened or tells none."""
    if kind == "video":
        try:
            return probe_video(path).duration or None
        except MediaError:
            return None
    import av

    try:
        with av.open(str(path)) as container:
            streams = container.streams.audio
            if streams and streams[0].duration and streams[0].time_base:
                return float(streams[0].duration * streams[0].time_base)
            return container.duration / 1e6 if container.duration else None
    except Exception:  # noqa: BLE001 - PyAV raises several error types; extraction reports the file
        return None


def branch_bytes(dataset: EmpathyDataset, session_id: str, branch: str, cfg: dict) -> int:
    """The estimated size of one session's branch once extracted (see the module docstring); an unknown
    branch is an error (UnknownBranchError), never sized like another."""
    unit = branch_unit(branch)
    session = dataset.sessions.loc[session_id]
    if unit.spec.source == "media":
        kind, source = ("audio", session.audio or session.video) if unit.spec.medium == "audio" else \
            ("video", session.video)
        seconds = media_seconds(Path(source), kind) if isinstance(source, (str, Path)) and str(source) else None
        if seconds is None:
            return 0
        return int(math.ceil(seconds * dataset.fps)) * unit.frame_bytes(cfg) + 3 * FILE_OVERHEAD
    transcript = dataset.transcripts.get(session_id)
    if transcript is None or not len(transcript):
        return 3 * FILE_OVERHEAD
    frames = int(math.ceil(float(transcript.end.max()) * dataset.fps))
    return frames * INDEX_BYTES + unit.row_bytes(transcript, cfg) + 3 * FILE_OVERHEAD


def _recorded_bytes(store: FeatureStore, owner: str, branch: str) -> int:
    """What a branch's current files take (0 when it has none on record)."""
    entry = store.manifest(owner, strict=False).get(branch) or {}
    return sum(int(record.get("bytes", 0)) for record in entry.get("arrays", {}).values())


def needed_bytes(store: FeatureStore, dataset: EmpathyDataset, sessions: Mapping[str, Collection[str]], stories: bool,
                 cfg: dict) -> int:
    """The estimated growth of the store when the given sessions' branches (and the stories) are extracted."""
    sizes = [(owner, branch, branch_bytes(dataset, owner, branch, cfg))
             for owner, branches in sessions.items() for branch in branches]
    if stories:
        sizes.append((DATASET_KEY, "stories", len(dataset.stories) * TEXT_WIDTH * 2 + FILE_OVERHEAD))
    growth = sum(max(size - _recorded_bytes(store, owner, branch), 0) for owner, branch, size in sizes)
    return max([growth, *(size for _, _, size in sizes)])


def check_free_space(store: FeatureStore, dataset: EmpathyDataset, sessions: Mapping[str, Collection[str]],
                     stories: bool, cfg: dict) -> int:
    """Stop with StoreSpaceError, before any work, when the store's disk has clearly not room for what is
    to be extracted (the estimate exceeds the free space); returns the estimate."""
    needed = needed_bytes(store, dataset, sessions, stories, cfg)
    free = free_bytes(store.root)
    if needed > free:
        count = sum(len(branches) for branches in sessions.values()) + int(stories)
        raise StoreSpaceError(f"feature store {store.root}: extracting {count} branch(es) of {len(sessions)} "
                              f"session(s) needs about {format_bytes(needed)} and {format_bytes(free)} are free on "
                              f"its disk; nothing was extracted. Free space there (or set data.store_dir to a larger "
                              f"disk) and run extract.py again (how the space is estimated: docs/features.md)")
    return needed
