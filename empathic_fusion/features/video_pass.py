"""One decode of a video feeds every video branch: the face tracker and the frame CNN.

Decoding is the floor of the video path's cost, so a session's frames are read once, on the dataset
clock (media.iter_frames), and each new source frame goes to the face mesh and/or into the CNN's
next batch. Frames that are held (slower input) reuse the source frame's result. T covers the
video stream's duration; frames that cannot be decoded stay zero with mask 0.

What is reported per session, in the branches' warnings: the stream's irregularities (media.iter_frames),
a truncated video, frames with more than one face, frames where which face is the participant's is
ambiguous and frames with the participant's face at the frame's edge (face: face_mesh.py), and masked
stretches longer than MASKED_STRETCH_SECONDS (face: no participant face; cnn: masked, with the reasons of
cnn_frames.py).

Memory stays bounded for long sessions: each branch's features go, row by row as they are computed and in
their stored dtype (float16), into a FrameRows (frame_rows.py): one array in memory for a short session, a
.npy file in `rows_dir` written a buffer at a time for a long one (returned as an NpyFile for the store to
move into place). The CNN's embeddings are brought from the device one chunk behind the batches in flight
and written in frame order, each frame that repeats an embedded one (held input, frame_stride) getting its
row then. What is held per frame for the whole session is a few bytes: masks, the CNN's held frame index.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from empathic_fusion.core.branches import branch_settings
from empathic_fusion.features.cnn_frames import grey_std
from empathic_fusion.features.face_mesh import (AMBIGUOUS, AT_EDGE, FACE_DIM, NO_FACE, OTHER_FACES, OUTCOMES,
                                                FaceMeshTracker, frame_features)
from empathic_fusion.features.frame_rows import GROWTH_ROWS, FrameRows, NpyFile
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


def _room(array: np.ndarray, row: int, fill: int = 0) -> np.ndarray:
    """`array`, or a copy with twice its rows (at least row + 1; the new ones `fill`) when it has no row
    `row`: a stream with more frames than its header declares (or none declared)."""
    if row < len(array):
        return array
    grown = np.full((max(2 * len(array), row + 1, GROWTH_ROWS),) + array.shape[1:], fill, dtype=array.dtype)
    grown[:len(array)] = array
    return grown


class _CnnBuffer:
    """Collects prepared frames and embeds them batch_size at a time, CHUNK_FRAMES frames at once. The batches
    of one chunk run (asynchronously on a GPU) while the CPU decodes and tracks the next; they are brought to
    the CPU when the next chunk is submitted, so the device holds at most two chunks' outputs, not the
    session's. Their rows (the float32 outputs cast to float16) go into `rows` in frame order: each embedded
    frame's own, then the frames that repeat it (`held`) the same row, until the next embedded frame's."""

    def __init__(self, embedder, rows: FrameRows, n_frames: int):
        self.embedder = embedder
        self.rows = rows
        self.held = np.full(n_frames, -1, dtype=np.int64)  # per target frame: the embedded frame it shows, -1: none
        self.pending: list[np.ndarray] = []
        self.pending_targets: list[int] = []
        self.in_flight: list[tuple[Any, list[int]]] = []  # (a submitted batch's output, its target frames)
        self.count = 0
        self.chunk = max(CHUNK_FRAMES, embedder.batch_size)
        self.written = 0  # the target frames before this one have their rows in `rows`
        self.last: np.ndarray | None = None  # the row of the last embedded frame written: the frames after it repeat it

    def add(self, target: int, image: np.ndarray) -> None:
        self.pending.append(image)
        self.pending_targets.append(target)
        self.count += 1
        if len(self.pending) >= self.chunk:
            self.flush()

    def hold(self, target: int, embedded: int) -> None:
        """Target frame `target` shows embedded frame `embedded` (itself, or an earlier one it repeats; -1: none,
        masked). Embedded frames only grow from frame to frame: a frame never repeats an earlier one than its
        predecessor did."""
        self.held = _room(self.held, target, -1)
        self.held[target] = embedded

    def flush(self) -> None:
        earlier = len(self.in_flight)  # the previous chunk's batches: done while this chunk was decoded
        size = self.embedder.batch_size
        for start in range(0, len(self.pending), size):  # asynchronous on a GPU
            self.in_flight.append((self.embedder.submit(self.pending[start:start + size]),
                                   self.pending_targets[start:start + size]))
        self.pending, self.pending_targets = [], []
        self.collect(earlier)

    def collect(self, batches: int | None = None) -> None:
        """Wait for the first `batches` in flight (all: None) and write their frames' rows, and those of the
        frames before each that repeat the embedded frame before it."""
        done, self.in_flight = self.in_flight[:batches], self.in_flight[len(self.in_flight[:batches]):]
        if not done:
            return
        rows = self.embedder.collect([output for output, _ in done]).astype(np.float16)
        for target, row in zip((t for _, batch in done for t in batch), rows):
            self._repeat_until(target)
            self.rows.put(target, row)
            self.last, self.written = row, target + 1

    def _repeat_until(self, end: int) -> None:
        """Write the rows of the frames from `written` to `end` that repeat the last embedded frame (the others
        are masked: zero rows)."""
        repeats = np.flatnonzero(self.held[self.written:end] >= 0) + self.written
        if len(repeats):
            self.rows.put(repeats, self.last)
        self.written = end

    def finish(self, n_frames: int) -> tuple[np.ndarray | NpyFile, np.ndarray]:
        """The `n_frames` rows (an array, or the file they were written to) and each frame's embedded frame."""
        self.flush()
        self.collect()
        self.held = _room(self.held, n_frames - 1, -1)[:n_frames]
        self._repeat_until(n_frames)
        return self.rows.finish(n_frames), self.held


# A session's masked stretches longer than this are reported, per branch (face: no participant face; cnn:
# masked, with the reasons): a covered camera, a participant out of view.
MASKED_STRETCH_SECONDS = 3.0
STRETCHES_LISTED = 5  # the longest ones are named in the warning, the rest counted


def _track(tracker, chunk: deque, n_frames: int, last_source: int,
           fps: float) -> dict[int, tuple[np.ndarray | None, int, str]]:
    """The participant's face landmarks, the number of distinct faces found and the tracker's outcome
    (face_mesh.OUTCOMES) in each new source frame of a decoded chunk, in video order (the mesh tracks, and
    the tracker follows the participant from frame to frame)."""
    found: dict[int, tuple[np.ndarray | None, int, str]] = {}
    for target, source, frame in chunk:
        if n_frames and target >= n_frames:
            break
        if source != last_source and source not in found:
            found[source] = (tracker.landmarks(frame, target / fps), tracker.faces_found, tracker.outcome)
        last_source = source
    return found


def _face_notes(multi_face: int, outcomes: dict[str, int], n_frames: int) -> list[str]:
    """The face branch's warnings about whose face was used (face_mesh.py), worded `<what>: <numbers>; <what
    was done>`."""
    notes = []
    if multi_face:
        notes.append(f"more than one face in {multi_face} of {n_frames} frames ({100 * multi_face / n_frames:.1f}%); "
                     f"only the participant's face is used: the largest and most central face, then followed from "
                     f"frame to frame by its position, size and landmark shape, never switched for another")
    if outcomes[OTHER_FACES]:
        notes.append(f"no face that continues the participant's in {outcomes[OTHER_FACES]} of {n_frames} frames (only "
                     f"other people's faces, or a face too far from where the participant's was); masked")
    if outcomes[AMBIGUOUS]:
        notes.append(f"ambiguous which face is the participant's in {outcomes[AMBIGUOUS]} of {n_frames} frames (two "
                     f"faces about equally large and central, or about equally close to where the participant's "
                     f"was); masked")
    if outcomes[AT_EDGE]:
        notes.append(f"face at the frame's edge (partly out of view) in {outcomes[AT_EDGE]} of {n_frames} frames; "
                     f"masked")
    return notes


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
                  tracker_cfg: dict[str, Any] | None = None,
                  rows_dir: Path | None = None) -> dict[str, tuple[dict, dict, list[str]]]:
    """{"face": ..., "cnn": ...} (each: arrays, info, warnings) for the branches whose config is given.

    rows_dir: where a branch's features go while they are computed when they reach frame_rows.SPILL_BYTES
    (created then; one file per branch): that branch's "features" is then an NpyFile there, not an array.
    None: every output is held in memory (callers that do not store, e.g. the app and the benchmarks).

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
    if face_cfg is None and cnn_cfg is None:
        raise ValueError("extract_video needs face_cfg and/or cnn_cfg")
    info = probe_video(video)
    rules, embedder = _cnn_setup(cnn_cfg, embedder)
    cnn_needs_face = embedder is not None and (embedder.crop == "face" or rules.mask_without_face)
    tracker = None
    if face_cfg is not None or cnn_needs_face:
        tracker = FaceMeshTracker(**{**(tracker_cfg or {}), **(face_cfg or {})})
    session = _VideoPass(info.frames_at(fps), fps, tracker, face_cfg is not None, embedder, rules, cnn_needs_face,
                         rows_dir)
    decode_notes: list[str] = []
    frames = iter_frames(video, fps, decode_notes)
    try:
        session.run(frames)
        session.finish(video)
    except BaseException:
        session.discard()  # closed and removed: nothing half-written is left in rows_dir
        raise
    finally:
        frames.close()  # its notes about the stream are complete once it is closed
        if tracker is not None:
            tracker.close()
    results = _branch_results(session, info.fps, decode_notes)
    if timings is not None:
        session.spent["decode_frames"] = session.decoded
        for key, value in session.spent.items():
            timings[key] = timings.get(key, 0) + value
    return results


@dataclass(frozen=True)
class _CnnRules:
    """Which frames the CNN embeds (features.cnn's frame_stride, mask_without_face, min_frame_std): kept apart
    from the embedder's own settings, which decide how a frame is embedded, not whether."""

    stride: int = 1
    mask_without_face: bool = False
    min_std: float = 0.0


def _cnn_setup(cnn_cfg: dict[str, Any] | None, embedder) -> tuple[_CnnRules, Any]:
    """The CNN's frame rules and its embedder (`embedder`, else the cached one for the rest of cnn_cfg);
    no cnn_cfg: the defaults that embed every frame, and `embedder` as given (None: no CNN branch)."""
    if cnn_cfg is None:
        return _CnnRules(), embedder
    cnn_cfg = dict(cnn_cfg)
    defaults = branch_settings("cnn")  # features.cnn's (CnnConfig, video_branches.py)
    rules = _CnnRules(stride=max(int(cnn_cfg.pop("frame_stride", 1)), 1),
                      mask_without_face=bool(cnn_cfg.pop("mask_without_face", defaults.mask_without_face)),
                      min_std=float(cnn_cfg.pop("min_frame_std", defaults.min_frame_std)))
    return rules, embedder if embedder is not None else cached_embedder(cnn_cfg)


class _VideoPass:
    """One session's decode and what its branches gather from it, frame by frame. The loop carries state
    from one frame to the next (the last source frame, its face, the last embedded frame) because held
    frames (slower input) reuse their source frame's results; keeping it here lets each step be read alone."""

    def __init__(self, n_frames: int, fps: float, tracker, face: bool, embedder, rules: _CnnRules,
                 cnn_needs_face: bool, rows_dir: Path | None):
        self.n_frames, self.fps, self.tracker = n_frames, fps, tracker
        self.embedder, self.rules, self.cnn_needs_face = embedder, rules, cnn_needs_face
        # per target frame, in the stored dtypes: the face branch's features (written as they come) and mask;
        # the CNN's rows (written in frame order as they come off the device) and near-constant images
        self.face_rows = FrameRows(n_frames, (FACE_DIM,), np.float16, rows_dir, "face") if face else None
        self.face_mask = np.zeros(n_frames if face else 0, dtype=np.uint8)
        self.buffer = None
        if embedder is not None:
            self.buffer = _CnnBuffer(embedder, FrameRows(n_frames, (embedder.dim,), np.float16, rows_dir, "cnn"),
                                     n_frames)
        self.is_constant = np.zeros(n_frames if self.buffer is not None else 0, dtype=bool)
        self.outcomes = dict.fromkeys(OUTCOMES, 0)  # target frames per tracker outcome
        self.multi_face = 0  # target frames with more than one distinct face
        self.decoded = self.end = 0  # target frames decoded; one past the last (iter_frames starts a late video after 0)
        self.spent = {"decode": 0.0, "face": 0.0, "cnn": 0.0, "face_frames": 0, "cnn_frames": 0}
        self.last_source, self.last_row, self.last_points, self.last_embedded = -1, None, None, -1
        self.found, self.constant, self.outcome = 0, False, NO_FACE
        self.ahead: deque = deque()
        self.tracked: dict[int, tuple[np.ndarray | None, int, str]] = {}  # source frame -> _track's
        self.face_features = self.cnn_features = self.held = None

    def run(self, frames) -> None:
        """Every target frame of the stream (up to the declared count, when there is one), in order."""
        while True:
            if not self.ahead:
                self._decode_chunk(frames)
            if not self.ahead:
                return
            target, source, frame = self.ahead.popleft()
            if self.n_frames and target >= self.n_frames:
                return
            self._take(target, source, frame)

    def _decode_chunk(self, frames) -> None:
        """Decode CHUNK_FRAMES at once, then track their faces in a row, so each stage's caches stay warm."""
        started = time.perf_counter()
        self.ahead.extend(islice(frames, CHUNK_FRAMES))
        self.spent["decode"] += time.perf_counter() - started
        if self.tracker is not None:
            started = time.perf_counter()
            self.tracked = _track(self.tracker, self.ahead, self.n_frames, self.last_source, self.fps)
            self.spent["face"] += time.perf_counter() - started
            self.spent["face_frames"] += len(self.tracked)

    def _take(self, target: int, source: int, frame: np.ndarray) -> None:
        """One target frame: its face (a new source frame's, else the one it holds), its CNN choice, its row."""
        new_source = source != self.last_source
        if self.tracker is not None:
            self._face_of(source, frame, new_source)
        if self.buffer is not None:
            started = time.perf_counter()
            self._cnn_of(target, frame, new_source)
            self.spent["cnn"] += time.perf_counter() - started
        self.last_source = source
        self.decoded, self.end = self.decoded + 1, target + 1
        if self.last_row is not None:
            self.face_mask = _room(self.face_mask, target)
            self.face_rows.put(target, self.last_row)
            self.face_mask[target] = 1

    def _face_of(self, source: int, frame: np.ndarray, new_source: bool) -> None:
        """The tracker's result for the frame's source frame (computed for its chunk) and the face row from it."""
        if new_source:
            started = time.perf_counter()
            self.last_points, self.found, self.outcome = self.tracked[source]
            # float64 -> float32 -> float16, as the stored features always were: the same bits
            self.last_row = None if self.last_points is None or self.face_rows is None else \
                frame_features(self.last_points, frame.shape[1], frame.shape[0]).astype(np.float32).astype(np.float16)
            self.spent["face"] += time.perf_counter() - started
        self.multi_face += self.found > 1
        self.outcomes[self.outcome] += 1

    def _cnn_of(self, target: int, frame: np.ndarray, new_source: bool) -> None:
        """Whether the frame is embedded, holds the last embedding or is masked (near-constant, no participant
        face): a masked frame is never given an earlier frame's embedding."""
        self.is_constant = _room(self.is_constant, target)
        if new_source:
            self.constant = self.rules.min_std > 0 and grey_std(frame) < self.rules.min_std
        if self.constant:
            self.is_constant[target] = True
            self.last_embedded = -1
        elif self.cnn_needs_face and self.last_points is None:
            self.last_embedded = -1
        elif (target % self.rules.stride == 0 and new_source) or self.last_embedded < 0:
            image = self.embedder.prepare(frame, self.last_points)
            if image is not None:
                self.buffer.add(target, image)
                self.last_embedded = target
                self.spent["cnn_frames"] += 1
            else:
                self.last_embedded = -1
        self.buffer.hold(target, self.last_embedded)  # -1: CNN mask 0

    def finish(self, video: Path) -> None:
        """The branches' rows once the stream ends; T grows to the frames decoded past the declared count."""
        if self.decoded == 0:
            raise MediaError(f"no frame of {video} could be decoded")
        self.n_frames = max(self.n_frames, self.end)
        if self.face_rows is not None:
            self.face_features = self.face_rows.finish(self.n_frames)
        if self.buffer is not None:
            started = time.perf_counter()
            self.cnn_features, self.held = self.buffer.finish(self.n_frames)
            self.spent["cnn"] += time.perf_counter() - started

    def discard(self) -> None:
        """Close and remove the rows written so far (a failed or interrupted pass)."""
        for rows in (self.face_rows, self.buffer.rows if self.buffer is not None else None):
            if rows is not None:
                rows.discard()


def _branch_results(session: _VideoPass, source_fps: float,
                    decode_notes: list[str]) -> dict[str, tuple[dict, dict, list[str]]]:
    """Each branch's arrays, info and warnings from a finished pass; the stream's notes go to every branch."""
    n_frames, decoded, end = session.n_frames, session.decoded, session.end
    first = end - decoded  # frames before the video's first (it starts late: iter_frames' note) have no picture
    stream_notes = list(decode_notes)
    if end < n_frames:
        stream_notes.append(f"video truncated: decoded {decoded} of {n_frames - first} frames; "
                            f"frames {end}-{n_frames - 1} are masked")
    pictured = np.zeros(n_frames, dtype=bool)  # the frames a masked stretch is looked for in
    pictured[first:end] = True
    base = {"n_frames": n_frames, "decoded_frames": decoded, "source_fps": source_fps}
    if session.tracker is not None:
        base.update(multi_face_frames=session.multi_face, ambiguous_face_frames=session.outcomes[AMBIGUOUS],
                    edge_face_frames=session.outcomes[AT_EDGE])
    results: dict[str, tuple[dict, dict, list[str]]] = {}
    if session.face_rows is not None:
        results["face"] = _face_result(session, base, stream_notes, pictured)
    if session.buffer is not None:
        results["cnn"] = _cnn_result(session, base, stream_notes, pictured)
    return results


def _face_result(session: _VideoPass, base: dict, stream_notes: list[str],
                 pictured: np.ndarray) -> tuple[dict, dict, list[str]]:
    """The face branch's output: its rows and mask, its frame counts, and why frames are masked."""
    n_frames = session.n_frames
    mask = _room(session.face_mask, n_frames - 1)[:n_frames]
    face_frames = int(mask.sum())
    notes = list(stream_notes)
    if not face_frames:  # the reasons follow when faces were found (at the frame's edge, someone else's)
        found = "face found" if session.outcomes[NO_FACE] == session.decoded else "usable participant face"
        notes.append(f"no {found} in any of {n_frames} frames; face features are masked")
    else:
        runs = _stretches((mask == 0) & pictured, int(round(MASKED_STRETCH_SECONDS * session.fps)))
        if runs:
            notes.append(_stretch_note("no participant face", runs, session.fps) + "; those frames are masked")
    notes.extend(_face_notes(session.multi_face, session.outcomes, n_frames))
    return {"features": session.face_features, "mask": mask}, {**base, "face_frames": face_frames}, notes


def _cnn_result(session: _VideoPass, base: dict, stream_notes: list[str],
                pictured: np.ndarray) -> tuple[dict, dict, list[str]]:
    """The CNN branch's output: its rows and mask, what the embedder was, and the masked stretches with their
    reasons (a near-constant image, no participant face)."""
    is_constant = _room(session.is_constant, session.n_frames - 1)[:session.n_frames]
    mask = (session.held >= 0).astype(np.uint8)
    notes = list(stream_notes)
    runs = _stretches((mask == 0) & pictured, int(round(MASKED_STRETCH_SECONDS * session.fps)))
    if runs:
        def reasons(start: int, end: int) -> str:
            dark = int(is_constant[start:end].sum())
            parts = [f"{dark} near-constant image (black or covered camera)"] if dark else []
            if end - start > dark:
                parts.append(f"{end - start - dark} no participant face")
            return ", ".join(parts)

        notes.append(_stretch_note("CNN frames masked", runs, session.fps, reasons) + "; those frames get CNN mask 0")
    embedder = session.embedder
    return ({"features": session.cnn_features, "mask": mask},
            {**base, "embedded_frames": session.buffer.count, "constant_frames": int(is_constant.sum()),
             "model": embedder.model_name, "device": embedder.device, "precision": embedder.precision,
             "batch_size": embedder.batch_size}, notes)
