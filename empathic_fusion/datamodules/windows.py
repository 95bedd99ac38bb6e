"""Context windows of k frames (the paper's k = 120 at 15 fps, 8 s) slid every second over a phase.

A rating's phase is the span of its session's Story Share utterances, or of the Reflection
utterances naming the rated story, cut at the end of the session's media (transcript times past it
have no frames to read). A phase at least k frames long gets windows starting at its
first frame and every stride frames while the window fits; a shorter phase gets one window
centred on it (its neighbours fill the context, as with the paper's [t - k/2, t + k/2]).
Media shorter than one window (a 2.4 s clip, 8 s windows) follow one rule, in training, `empathic-predict`
and the app alike (`short_media_note`): one window from the first frame, its frames past the media's end
padded and masked as every loader masks them, with a note; no window time runs past the media's end
(`window_ends`).
Windows are (rating, session, start frame) index rows; features are never copied.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd


def phase_span(transcript: pd.DataFrame, scenario: str, story_id: str) -> tuple[float, float] | None:
    """Seconds (start, end) of the rating's phase, or None when the transcript has none. `scenario` is
    the checked data.scenario (story_share | reflection; empathic_fusion/config/data.py)."""
    rows = transcript[transcript.phase == scenario]
    if scenario == "reflection":
        rows = rows[rows.story_id == story_id]
    if rows.empty:
        return None
    return float(rows.start.min()), float(rows.end.max())


def window_starts(span_frames: tuple[int, int], n_frames: int, length: int, stride: int) -> np.ndarray:
    """First frames of the windows over a phase of [start, end) frames in a session of n_frames."""
    start, end = span_frames
    if end - start >= length:
        return np.arange(start, end - length + 1, stride, dtype=np.int64)
    centred = (start + end) // 2 - length // 2
    return np.array([min(max(centred, 0), max(n_frames - length, 0))], dtype=np.int64)


def window_ends(starts: np.ndarray, n_frames: np.ndarray | int, length: int) -> np.ndarray:
    """The frame after the last one each window reads: start + length, cut at its media's end (a window over
    shorter media is padded and masked past it, so its real span ends there)."""
    return np.minimum(np.asarray(starts, dtype=np.int64) + int(length), np.asarray(n_frames, dtype=np.int64))


def short_media_note(n_frames: int, length: int, fps: float) -> str | None:
    """The one rule for media shorter than one window: scored (and trained on) as one window from its first
    frame over all of it, the frames past its end padded and masked as in every window that runs past a
    session's end. The note that says so, or None when a window fits in the media."""
    if n_frames >= length:
        return None
    return (f"the media is {n_frames / fps:.1f} s long, shorter than one window ({length / fps:g} s): it is "
            f"one window of its {n_frames / fps:.1f} s, the rest padded and masked")


def rating_frames(session_id: str, story_id: str, transcripts: dict[str, pd.DataFrame],
                  session_frames: dict[str, int], scenario: str, fps: float) -> tuple[int, int] | str:
    """The [start, end) frames of a (session, story) pair's phase, or why it has none: the one place
    that decides whether a rating gets windows (training skips it with a warning; prediction lists it
    with the reason)."""
    if session_id not in transcripts:
        return f"no transcript (transcripts/{session_id}.csv is missing), so its phases are unknown"
    if session_id not in session_frames:
        return "none of the model's modalities could be read for this session (see the feature store's failures.json)"
    span = phase_span(transcripts[session_id], scenario, story_id)
    if span is None:
        return f"no {scenario} utterances" + (f" naming story '{story_id}'" if scenario == "reflection" else "")
    n_frames = session_frames[session_id]
    frames = (int(math.floor(span[0] * fps)), min(int(math.ceil(span[1] * fps)), n_frames))
    if frames[0] >= n_frames:
        return (f"the {scenario} utterances start at {span[0]:.1f} s, after the session's media end "
                f"({n_frames / fps:.1f} s)")
    return frames


def build_windows(ratings: pd.DataFrame, transcripts: dict[str, pd.DataFrame], session_frames: dict[str, int],
                  scenario: str, fps: float, length: int, stride_seconds: float) -> tuple[pd.DataFrame, list[str]]:
    """Window index (rating_index, session_id, start) for every rating that has its phase; warnings."""
    stride = max(int(round(stride_seconds * fps)), 1)
    rows, warnings, short = [], [], set()
    for rating_index, rating in ratings.iterrows():
        sid = rating.session_id
        if sid not in transcripts or sid not in session_frames:
            continue  # excluded upstream, with its own warning
        frames = rating_frames(sid, rating.story_id, transcripts, session_frames, scenario, fps)
        if isinstance(frames, str):
            warnings.append(f"session '{sid}', story '{rating.story_id}': {frames}; rating skipped")
            continue
        for start in window_starts(frames, session_frames[sid], length, stride):
            rows.append((rating_index, sid, int(start)))
        note = short_media_note(session_frames[sid], length, fps)
        if note and sid not in short:  # once per session
            short.add(sid)
            warnings.append(f"session '{sid}': {note}")
    return pd.DataFrame(rows, columns=["rating_index", "session_id", "start"]), warnings
