"""Only the media a run's modalities read are required; a non-UTF-8 file is named with its line and byte."""
from __future__ import annotations

import pandas as pd
import pytest

from empathic_fusion.dataset import load_dataset
from empathic_fusion.dataset.contract import DatasetError


def test_missing_audio_blocks_only_runs_that_read_audio(dataset_copy):
    sessions = pd.read_csv(dataset_copy / "sessions.csv")
    (dataset_copy / sessions.audio[0]).unlink()
    dataset = load_dataset(dataset_copy, ["video", "text"])  # v+t never opens the audio
    assert len(dataset.sessions) == len(sessions)
    with pytest.raises(DatasetError, match=r"sessions.csv, line 2, field 'audio'.*does not exist \(the audio modality reads it\)"):
        load_dataset(dataset_copy, ["audio", "text"])
    with pytest.raises(DatasetError, match="field 'audio'"):
        load_dataset(dataset_copy)  # no modalities given: every media file is checked


def test_missing_video_is_needed_by_video_and_by_audio_without_an_audio_file(dataset_copy):
    sessions = pd.read_csv(dataset_copy / "sessions.csv")
    (dataset_copy / sessions.video[1]).unlink()
    assert load_dataset(dataset_copy, ["audio", "text"])  # the session has its own wav
    with pytest.raises(DatasetError, match=r"line 3, field 'video'.*\(the video modality reads it\)"):
        load_dataset(dataset_copy, ["video"])
    sessions.assign(audio="").to_csv(dataset_copy / "sessions.csv", index=False)
    with pytest.raises(DatasetError, match=r"line 3, field 'video'.*\(the audio modality reads it\)"):
        load_dataset(dataset_copy, ["audio"])


def test_non_utf8_transcript_names_file_line_and_byte(dataset_copy):
    sid = pd.read_csv(dataset_copy / "sessions.csv").session_id[0]
    path = dataset_copy / "transcripts" / f"{sid}.csv"
    lines = path.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b"a", "\u00e4".encode("latin-1"), 1)  # a Latin-1 umlaut on line 4
    column = lines[3].index(b"\xe4") + 1
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(DatasetError, match=rf"transcripts/{sid}.csv, line 4.*not UTF-8: byte {column} of the line is 0xe4"):
        load_dataset(dataset_copy)


@pytest.mark.parametrize("rate", [8000, 44100, 48000])
def test_audio_at_any_rate_and_stereo_becomes_16khz_mono_of_the_same_duration(rate, tmp_path):
    import numpy as np
    import soundfile as sf

    from empathic_fusion.features.media import load_audio

    t = np.arange(int(rate * 2.5)) / rate
    stereo = np.stack([0.5 * np.sin(2 * np.pi * 220 * t), np.zeros_like(t)], axis=1)  # sound on one channel only
    sf.write(tmp_path / "a.wav", stereo, rate)
    mono = load_audio(tmp_path / "a.wav")
    assert mono.ndim == 1 and len(mono) == 40000  # 2.5 s at 16 kHz: time stays aligned with video and text
    assert 0.48 < np.abs(mono).max() < 0.52  # the one-sided channel keeps its level: the silent one is not averaged in


def test_real_48khz_stereo_aac_track_is_read_as_16khz_mono():
    from pathlib import Path

    from empathic_fusion.features.media import load_audio

    clip = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "media" / "WolfgangLanger_Pexels.mp4"
    if not clip.exists():
        pytest.skip("real media not available (../shared is not beside this checkout)")
    samples = load_audio(clip)
    assert samples.ndim == 1 and abs(len(samples) / 16000 - 19.7) < 0.2
