"""Audio is read as a stream and openSMILE runs on overlapping chunks (audio_smile's module docstring), so
memory does not grow with a recording's length: the chunked features equal one call's bit for bit on real
speech (the ARCTIC sentence looped), the chunks tile the signal on the 10 ms LLD step, and a recording
shorter than a chunk is one call, as before. The source's sample rate is recorded, and a rate below
openSMILE's 16 kHz is warned about with its empty bands."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from empathic_fusion.utils import PROJECT_ROOT

ARCTIC = PROJECT_ROOT.parent / "shared" / "data" / "media" / "arctic_a0007.wav"
real_speech = pytest.mark.skipif(not ARCTIC.exists(), reason="../shared/data/media is not beside the checkout")
FPS = 15.0


def looped_speech(path: Path, seconds: float) -> Path:
    """The ARCTIC sentence (16 kHz mono) followed by half a second of silence, repeated for `seconds`."""
    import soundfile as sf

    speech, rate = sf.read(ARCTIC, dtype="int16")
    unit = np.concatenate([speech, np.zeros(rate // 2, dtype=np.int16)])
    sf.write(path, np.tile(unit, int(np.ceil(seconds * rate / len(unit))))[: int(seconds * rate)], rate)
    return path


def test_chunk_windows_tile_the_signal_on_the_lld_step():
    """Every sample's LLD frame belongs to exactly one chunk; windows are the signal's own samples with the
    context around their chunk; blocks of any size give the same windows; a short signal is one window."""
    from empathic_fusion.features.audio_smile import HOP_SAMPLES, chunk_windows

    rng = np.random.default_rng(0)
    signal = rng.standard_normal(16000 * 7 + 123).astype(np.float32)
    cuts = np.sort(rng.choice(len(signal), 40, replace=False))
    blocks = np.split(signal, cuts)
    windows = list(chunk_windows(iter(blocks), chunk_seconds=1.0, before_seconds=0.5, after_seconds=0.25))
    assert len(windows) == 7  # 6 cut chunks; the seventh keeps the last 1.0077 s (a cut needs 0.25 s after it)
    kept_from = [keep_from for _, _, keep_from, _ in windows]
    assert kept_from == [16000 * k for k in range(7)] and all(k % HOP_SAMPLES == 0 for k in kept_from)
    for (window, first, keep_from, keep_to), following in zip(windows, kept_from[1:] + [None]):
        assert keep_to == following  # chunks follow each other: nothing kept twice, nothing left out
        assert first == max(keep_from - 8000, 0)
        assert np.array_equal(window, signal[first:first + len(window)])
        assert len(window) <= 8000 + 16000 + 4000 if keep_to is not None else first + len(window) == len(signal)
    same = list(chunk_windows(iter([signal]), chunk_seconds=1.0, before_seconds=0.5, after_seconds=0.25))
    assert [(f, k, t) for _, f, k, t in same] == [(f, k, t) for _, f, k, t in windows]
    (window, first, keep_from, keep_to), = chunk_windows(iter(blocks), chunk_seconds=60.0)
    assert (first, keep_from, keep_to) == (0, 0, None) and np.array_equal(window, signal)


@real_speech
@pytest.mark.parametrize("feature_set, seconds, chunk_seconds",
                         [("ComParE_2016", 180.0, 40.0), ("eGeMAPSv02", 50.0, 15.0)])
def test_chunked_opensmile_equals_one_call(feature_set, seconds, chunk_seconds, tmp_path):
    """Several chunks (5 and 4) against one call over the whole signal: equal bit for bit, features, masks
    and voicing. The 10 s of context before a chunk is what makes it exact: measured on this speech, ComParE's
    RASTA-filtered bands (an IIR filter) still differ by 5e-7 relative with 2 s, by nothing from 3 s on (5 s
    on overlapping speech with noise); pitch smoothing, _sma and _de need less. eGeMAPS is exact from 1 s."""
    from empathic_fusion.features.audio_smile import extract_audio

    wav = looped_speech(tmp_path / "speech.wav", seconds)
    chunked, chunked_info, chunked_warnings = extract_audio(wav, FPS, feature_set, chunk_seconds=chunk_seconds)
    whole, whole_info, whole_warnings = extract_audio(wav, FPS, feature_set, chunk_seconds=2 * seconds)
    assert chunked_info == whole_info and chunked_warnings == whole_warnings == []
    assert chunked_info["n_frames"] == int(seconds * FPS) and 0 < chunked["voiced"].mean() < 1
    for name in ("features", "mask", "voiced"):
        assert chunked[name].dtype == whole[name].dtype
        assert np.array_equal(chunked[name], whole[name]), name


def write_wav(path: Path, samples: np.ndarray, rate: int) -> Path:
    """A mono 16-bit wav written with PyAV."""
    import av

    pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(pcm[None], format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
        for packet in list(stream.encode(frame)) + list(stream.encode(None)):
            container.mux(packet)
    return path


@real_speech
def test_audio_recorded_below_16_khz_is_recorded_and_its_empty_bands_named(tmp_path):
    import soundfile as sf

    from empathic_fusion.features.audio_smile import extract_audio

    speech, _ = sf.read(ARCTIC, dtype="float32")
    narrow = write_wav(tmp_path / "phone.wav", speech[::2], 8000)  # 8 kHz (the 16 kHz file decimated)
    arrays, info, warnings = extract_audio(narrow, FPS)
    assert info["source_sample_rate"] == 8000 and info["n_frames"] == 60 and arrays["mask"].all()
    assert warnings == ["phone.wav: audio recorded at 8000 Hz (narrowband): the bands above 4000 Hz (of the 8000 Hz "
                        "openSMILE analyses) are empty, so the spectral features there describe nothing; resampled to "
                        "16000 Hz and kept"]
    _, info, warnings = extract_audio(ARCTIC, FPS)
    assert info["source_sample_rate"] == 16000 and warnings == []
