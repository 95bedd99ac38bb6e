"""When the participant speaks, per frame: from the transcript, or from openSMILE voicing when the
transcript has no participant speech. The audio modality is masked outside these frames."""
from __future__ import annotations

import numpy as np

from empathic_fusion.features.text_sbert import place_spans


def speaking_frames(transcript, n_frames: int, fps: float) -> np.ndarray:
    """Frames whose centre falls inside a participant utterance, placed as the text branch places them
    (text_sbert.place_spans: overlapping utterances all count, one shorter than a frame is on its midpoint's)."""
    spoken = transcript[transcript.speaker == "participant"]
    return place_spans(spoken.start.to_numpy(), spoken.end.to_numpy(), n_frames, fps).index >= 0


def speech_mask(transcript, n_frames: int, fps: float, voiced: np.ndarray | None,
                policy: str = "transcript_or_voicing") -> np.ndarray:
    """Frames where the participant speaks: per the transcript, per openSMILE voicing, or the transcript
    when it has participant speech and voicing otherwise (the audio mask is ANDed with it)."""
    if policy not in ("transcript", "voicing", "transcript_or_voicing"):
        raise ValueError(f"features.audio.speech_mask must be transcript, voicing or transcript_or_voicing, got '{policy}'")
    from_transcript = speaking_frames(transcript, n_frames, fps)
    if policy == "transcript" or voiced is None or (policy == "transcript_or_voicing" and from_transcript.any()):
        return from_transcript
    mask = np.zeros(n_frames, dtype=bool)
    mask[: min(n_frames, len(voiced))] = np.asarray(voiced[:n_frames]) > 0
    return mask
