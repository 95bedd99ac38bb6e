"""One decode of a video feeds every video branch: the face tracker and the frame CNN.

Decoding is the floor of the video path's cost, so a session's frames are read once, on the dataset
clock (media.iter_frames), and each new source frame goes to the face mesh and/or into the CNN's
next batch. Frames that are held (slower input) reuse the source frame's result. T covers the
video stream's duration; frames that cannot be decoded stay zero with mask 0.

What is reported per session, in the branches' warnings: the stream's irregularities (media.iter_frames),
a truncated video, frames with more than one face (face), and masked stretches longer than
MASKED_STRETCH_SECONDS (face: no participant face; cnn: masked, with the reasons of cnn_frames.py).
"""
from __future__ import annotations

import time
from collections import deque
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from empathic_fusion.features.media import MediaError, iter_frames, probe_video

_EMBEDDERS: dict[tuple, Any] = {}  # one loaded CNN per worker process and config, reused across sessions


def cached_embedder(cnn_cfg: dict[str, Any]):
    """The FrameEmbedder for this config, loaded once per process."""
    from empathic_fusion.features.cnn_frames import FrameEmbedder

    key = tuple(sorted((k, str(v)) for k, v in cnn_cfg.items()))
    if key not in _EMBEDDERS:
        _EMBEDDERS[key] = FrameEmbedder(**cnn_cfg)
    return _EMBEDDERS[key]


# Frames decoded at once, and prepared frames the CNN buffer holds before it embeds them (in batches of
# batch_size, one after another): decoder, face tracker and network each run this many frames in a row with
# their own code and weights warm in the CPU's caches, instead of evicting each other every frame
# (benchmarks/extract.py measures each branch beside its network alone). Held: the chunk's decoded frames
# (640 x 360: 0.7 MB each; 1080p: 6 MB) and up to as many 224 x 224 CNN inputs (0.15 MB each).
CHUNK_FRAMES = 16


class _CnnBuffer:
    """Collects prepared frames and embeds them batch_size at a time, CHUNK_FRAMES frames at once."""

    def __init__(self, embedder):
        self.embedder = embedder
        self.rows: dict[int, int] = {}  # target frame -> row of the embedded outputs
        self.pending: list[np.ndarray] = []
        self.outputs: list[np.ndarray] = []
        self.count = 0
        self.chunk = max(CHUNK_FRAMES, embedder.batch_size)

    def add(self, target: int, image: np.ndarray) -> None:
        self.rows[target] = self.count
        self.pending.append(image)
        self.count += 1
        if len(self.pending) >= self.chunk:
            self.flush()

    def flush(self) -> None:
        size = self.embedder.batch_size
        for start in range(0, len(self.pending), size):  # asynchronous on a GPU
            self.outputs.append(self.embedder.submit(self.pending[start:start + size]))
        self.pending = []

    def matrix(self) -> np.ndarray:
        self.flush()
        return self.embedder.collect(self.outputs) if self.outputs else np.zeros((0, self.embedder.dim), np.float32)


# A session's masked stretches longer than this are reported, per branch (face: no participant face; cnn:
# masked, with the reasons): a covered camera, a participant out of view.
MASKED_STRETCH_SECONDS = 3.0
STRETCHES_LISTED = 5  # the longest ones are named in the warning, the rest counted


def _track(tracker, chunk: deque, n_frames: int, last_source: int,
           fps: float) -> dict[int, tuple[np.ndarray | None, int]]:
    """The participant's face landmarks and the number of faces found in each new source frame of a decoded
    chunk, in video order (the mesh tracks, and follows the participant by position)."""
    found: dict[int, tuple[np.ndarray | None, int]] = {}
    for target, source, frame in chunk:
        if n_frames and target >= n_frames:
            break
        if source != last_source and source not in found:
            found[source] = (tracker.landmarks(frame, target / fps), tracker.faces_found)
        last_source = source
    return found


def _stretches(masked: np.ndarray, min_frames: int) -> list[tuple[int, int]]:
    """[start, end) of the runs of True in masked longer than min_frames, in time order."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], masked.astype(np.int8), [0]])))
    return [(int(start), int(end)) for start, end in zip(edges[::2], edges[1::2]) if end - start > min_frames]


def _stretch_note(what: str, runs: list[tuple[int, int]], fps: float, detail=None) -> str:
    """`<what> for more than N s at a time: a-b s (n frames[: detail]), ...`: the longest STRETCHES_LISTED
    named in time order, the others counted."""
    named = []
    for start, end in sorted(sorted(runs, key=lambda run: run[0] - run[1])[:STRETCHES_LISTED]):
        extra = f": {detail(start, end)}" if detail is not None else ""
        named.append(f"{start / fps:.2f}-{end / fps:.2f} s ({end - start} frames{extra})")
    more = f" and {len(runs) - STRETCHES_LISTED} more" if len(runs) > STRETCHES_LISTED else ""
    return f"{what} for more than {MASKED_STRETCH_SECONDS:g} s at a time: {', '.join(named)}{more}"


def extract_video(video: Path, fps: float, face_cfg: dict[str, Any] | None = None,
                  cnn_cfg: dict[str, Any] | None = None, embedder=None, timings: dict[str, float] | None = None,
                  tracker_cfg: dict[str, Any] | None = None) -> dict[str, tuple[dict, dict, list[str]]]:
    """{"face": ..., "cnn": ...} (each: arrays, info, warnings) for the branches whose config is given.

    face_cfg: the face mesh's settings (features.face's TRACKER_KEYS) for the face branch. tracker_cfg: the
    mesh's settings when only the CNN needs it (crop `face` or mask_without_face); face_cfg's win.
    cnn_cfg keys: model, weights_path, device, precision, batch_size, crop, frame_stride (embed every
    n-th frame on the dataset clock and hold it in between; after a frame without an embedding the next
    frame that can be embedded is), mask_without_face and min_frame_std (masked frames: cnn_frames.py;
    features.cnn's defaults when absent). `embedder` reuses a loaded FrameEmbedder. `timings`, when given,
    gets the seconds spent decoding and in each branch added to its "decode", "face" and "cnn" keys
    (and the frames each processed to "decode_frames", "face_frames", "cnn_frames"), so a benchmark
    can set a branch beside its network alone.
    """
    from empathic_fusion.config.features import CnnConfig
    from empathic_fusion.features.cnn_frames import grey_std
    from empathic_fusion.features.face_mesh import FACE_DIM, FaceMeshTracker, frame_features

    if face_cfg is None and cnn_cfg is None:
        raise ValueError("extract_video needs face_cfg and/or cnn_cfg")
    info = probe_video(video)
    n_frames = info.frames_at(fps)
    cnn_cfg = dict(cnn_cfg) if cnn_cfg is not None else None
    stride, mask_without_face, min_std = 1, False, 0.0
    if cnn_cfg is not None:
        stride = max(int(cnn_cfg.pop("frame_stride", 1)), 1)
        mask_without_face = bool(cnn_cfg.pop("mask_without_face", CnnConfig.mask_without_face))
        min_std = float(cnn_cfg.pop("min_frame_std", CnnConfig.min_frame_std))
        if embedder is None:
            embedder = cached_embedder(cnn_cfg)
    cnn_needs_face = embedder is not None and (embedder.crop == "face" or mask_without_face)
    need_tracker = face_cfg is not None or cnn_needs_face
    tracker = FaceMeshTracker(**{**(tracker_cfg or {}), **(face_cfg or {})}) if need_tracker else None
    buffer = _CnnBuffer(embedder) if embedder is not None else None
    faces: dict[int, np.ndarray] = {}
    held: dict[int, int] = {}  # CNN: target frame -> the embedded target frame it repeats
    constant_frames: list[int] = []  # CNN: target frames with a near-constant image
    multi_face = other_face_only = 0  # target frames with more than one face; with only others' faces
    decoded = 0
    spent = {"decode": 0.0, "face": 0.0, "cnn": 0.0, "face_frames": 0, "cnn_frames": 0}
    clock = time.perf_counter
    decode_notes: list[str] = []
    frames = iter_frames(video, fps, decode_notes)
    try:
        last_source, last_vector, last_points, last_embedded, found, constant = -1, None, None, -1, 0, False
        ahead: deque = deque()
        tracked: dict[int, tuple[np.ndarray | None, int]] = {}  # source frame -> (landmarks (pixels), faces found)
        while True:
            if not ahead:  # decode CHUNK_FRAMES at once, then track their faces in a row (caches stay warm)
                started = clock()
                ahead.extend(islice(frames, CHUNK_FRAMES))
                spent["decode"] += clock() - started
                if tracker is not None:
                    started = clock()
                    tracked = _track(tracker, ahead, n_frames, last_source, fps)
                    spent["face"] += clock() - started
                    spent["face_frames"] += len(tracked)
            if not ahead:
                break
            target, source, frame = ahead.popleft()
            if n_frames and target >= n_frames:
                break
            new_source = source != last_source
            if tracker is not None and new_source:
                started = clock()
                last_points, found = tracked[source]
                last_vector = None if last_points is None else frame_features(last_points, frame.shape[1],
                                                                               frame.shape[0])
                spent["face"] += clock() - started
            if tracker is not None:
                multi_face += found > 1
                other_face_only += found > 0 and last_points is None
            if buffer is not None:
                started = clock()
                if new_source:
                    constant = min_std > 0 and grey_std(frame) < min_std
                if constant:
                    constant_frames.append(target)
                    last_embedded = -1  # masked; never an earlier frame's embedding held over it
                elif cnn_needs_face and last_points is None:
                    last_embedded = -1  # no participant face: mask 0, never a stale frame held over
                elif (target % stride == 0 and new_source) or last_embedded < 0:
                    image = embedder.prepare(frame, last_points)
                    if image is not None:
                        buffer.add(target, image)
                        last_embedded = target
                        spent["cnn_frames"] += 1
                    else:
                        last_embedded = -1
                if last_embedded >= 0:
                    held[target] = last_embedded
                spent["cnn"] += clock() - started
            last_source = source
            decoded += 1
            if last_vector is not None:
                faces[target] = last_vector
    finally:
        frames.close()  # its notes about the stream are complete once it is closed
        if tracker is not None:
            tracker.close()
    if decoded == 0:
        raise MediaError(f"no frame of {video} could be decoded")
    n_frames = max(n_frames, decoded)
    stream_notes = list(decode_notes)
    if decoded < n_frames:
        stream_notes.append(f"video truncated: decoded {decoded} of {n_frames} frames; frames {decoded}-{n_frames - 1} "
                            f"are masked")
    long_run = int(round(MASKED_STRETCH_SECONDS * fps))
    results: dict[str, tuple[dict, dict, list[str]]] = {}
    base = {"n_frames": n_frames, "decoded_frames": decoded, "source_fps": info.fps}
    if tracker is not None:
        base["multi_face_frames"] = multi_face
    if face_cfg is not None:
        features = np.zeros((n_frames, FACE_DIM), dtype=np.float32)
        mask = np.zeros(n_frames, dtype=np.uint8)
        for target, vector in faces.items():
            features[target], mask[target] = vector, 1
        notes = list(stream_notes)
        if not faces:
            notes.append(f"no face found in any of {n_frames} frames; face features are masked")
        else:
            runs = _stretches(mask[:decoded] == 0, long_run)
            if runs:
                notes.append(_stretch_note("no participant face", runs, fps) + "; those frames are masked")
        if multi_face:
            share = 100 * multi_face / n_frames
            notes.append(f"more than one face in {multi_face} of {n_frames} frames ({share:.1f}%); "
                         f"the participant's face is followed by its position from frame to frame, the others "
                         f"are not used" + (f"; {other_face_only} frames showed only other faces and are masked"
                                             if other_face_only else ""))
        results["face"] = ({"features": features.astype(np.float16), "mask": mask},
                           {**base, "face_frames": len(faces)}, notes)
    if buffer is not None:
        started = clock()
        embedded = buffer.matrix()
        spent["cnn"] += clock() - started
        features = np.zeros((n_frames, embedder.dim), dtype=np.float16)
        mask = np.zeros(n_frames, dtype=np.uint8)
        if held:
            targets = np.fromiter(held.keys(), dtype=np.int64)
            rows = np.array([buffer.rows[t] for t in held.values()], dtype=np.int64)
            features[targets] = embedded[rows].astype(np.float16)
            mask[targets] = 1
        notes = list(stream_notes)
        is_constant = np.zeros(n_frames, dtype=bool)
        is_constant[constant_frames] = True
        runs = _stretches(mask[:decoded] == 0, long_run)
        if runs:
            def reasons(start: int, end: int) -> str:
                dark = int(is_constant[start:end].sum())
                parts = [f"{dark} near-constant image (black or covered camera)"] if dark else []
                if end - start > dark:
                    parts.append(f"{end - start - dark} no participant face")
                return ", ".join(parts)

            notes.append(_stretch_note("CNN frames masked", runs, fps, reasons) + "; those frames get CNN mask 0")
        results["cnn"] = ({"features": features, "mask": mask},
                          {**base, "embedded_frames": int(len(embedded)), "constant_frames": len(constant_frames),
                           "model": embedder.model_name, "device": embedder.device, "precision": embedder.precision,
                           "batch_size": embedder.batch_size}, notes)
    if timings is not None:
        spent["decode_frames"] = decoded
        for key, value in spent.items():
            timings[key] = timings.get(key, 0) + value
    return results
