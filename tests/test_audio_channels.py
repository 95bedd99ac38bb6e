"""Multichannel audio: a 48 kHz 5.1 file is downmixed by a mean over the channels that carry signal,
never by a sum, so its openSMILE features match the mono original's; clipping input is warned about.
The speech is the real ARCTIC recording (../shared/data/media), written into generated 5.1 files."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from empathic_fusion.utils import PROJECT_ROOT

ARCTIC = PROJECT_ROOT.parent / "shared" / "data" / "media" / "arctic_a0007.wav"
pytestmark = pytest.mark.skipif(not ARCTIC.exists(), reason="../shared/data/media is not beside the checkout")
FPS = 30.0


def mono_speech(rate: int) -> np.ndarray:
    """The ARCTIC recording as float32 mono at `rate` (FFmpeg's resampler, via PyAV)."""
    import av
    import soundfile as sf

    samples, source_rate = sf.read(ARCTIC, dtype="float32")
    frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
    frame.sample_rate = source_rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    out = resampler.resample(frame) + resampler.resample(None)
    return np.concatenate([o.to_ndarray().reshape(-1) for o in out])


def write_surround(path: Path, gains: list[float], rate: int = 48000) -> Path:
    """A 16-bit 5.1 wav (FL FR FC LFE BL BR) whose channel c holds the speech times gains[c]."""
    import av

    speech = mono_speech(rate)
    planar = np.stack([speech * g for g in gains]).astype(np.float32)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=rate, layout="5.1")
        frame = av.AudioFrame.from_ndarray(planar, format="fltp", layout="5.1")
        frame.sample_rate = rate
        for packet in list(stream.encode(frame)) + list(stream.encode(None)):
            container.mux(packet)
    return path


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def test_mono_input_is_passed_through_unchanged():
    import soundfile as sf

    from empathic_fusion.features.media import decode_audio

    track = decode_audio(ARCTIC)
    expected, _ = sf.read(ARCTIC, dtype="float32")
    assert track.channels == ("1",) and track.mixed == ("1",) and track.clipped == (0,)
    assert track.samples.dtype == np.float32 and np.array_equal(track.samples, expected)


def test_51_speech_in_every_channel_gives_the_mono_features(tmp_path):
    from empathic_fusion.features.audio_smile import extract_audio

    surround = write_surround(tmp_path / "surround.wav", [1.0] * 6)
    mono, _, mono_warnings = extract_audio(ARCTIC, FPS)
    five, info, warnings = extract_audio(surround, FPS)
    a, b = mono["features"].astype(np.float64), five["features"].astype(np.float64)
    assert a.shape == b.shape  # the same duration on the frame clock
    varying = [j for j in range(a.shape[1]) if a[:, j].std() > 0]
    assert len(varying) > 60
    r = np.array([np.corrcoef(a[:, j], b[:, j])[0, 1] for j in varying])
    assert r.min() >= 0.99, f"feature {varying[int(r.argmin())]}: r = {r.min():.3f} against the mono original"
    loudness = info["feature_names"].index("pcm_RMSenergy_sma")
    assert 0.97 < b[:, loudness].mean() / a[:, loudness].mean() < 1.03  # a sum would be 3.4x
    assert not mono_warnings and not warnings
    assert info["channel_layout"] == "5.1" and info["channels"] == 6
    assert info["mixed_channels"] == ["FL", "FR", "FC", "LFE", "BL", "BR"]


def test_51_downmix_is_a_mean_never_a_sum(tmp_path):
    from empathic_fusion.features.media import decode_audio

    speech = mono_speech(16000)
    every = decode_audio(write_surround(tmp_path / "every.wav", [1.0] * 6))
    assert 0.99 < rms(every.samples) / rms(speech) < 1.01
    assert np.abs(every.samples).max() <= np.abs(speech).max() + 1e-3  # never louder than one channel
    # channels at different levels: the mean of all six, not their sum
    mixed = decode_audio(write_surround(tmp_path / "mixed.wav", [0.2, 0.4, 0.6, 0.8, 1.0, 1.2]))
    assert 0.69 < rms(mixed.samples) / rms(speech) < 0.71


def test_51_speech_in_the_centre_channel_only_keeps_its_level(tmp_path):
    from empathic_fusion.features.media import decode_audio

    track = decode_audio(write_surround(tmp_path / "centre.wav", [0, 0, 1.0, 0, 0, 0]))
    assert track.channels == ("FL", "FR", "FC", "LFE", "BL", "BR") and track.mixed == ("FC",)
    assert 0.99 < rms(track.samples) / rms(mono_speech(16000)) < 1.01  # silent channels do not dilute it


def test_clipping_input_is_warned_with_its_count_per_channel(tmp_path):
    import soundfile as sf

    from empathic_fusion.features.audio_smile import extract_audio

    hot = write_surround(tmp_path / "hot.wav", [1.0, 1.0, 2.0, 0.5, 1.0, 1.0])  # the centre clips at 16 bits
    written, _ = sf.read(hot, dtype="int16")
    clipped = (np.abs(written.astype(np.int64)) >= 32736).sum(axis=0)
    assert clipped[2] > 100 and clipped[[0, 1, 3, 4, 5]].sum() == 0
    _, _, warnings = extract_audio(hot, FPS)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"hot.wav: audio clips: {clipped[2]:,} sample(s) at 99.9% of full scale or above "
                                  f"in channel(s) FC ({clipped[2]:,}), between ")
    assert warnings[0].endswith("; kept as recorded, so the features of those stretches describe the distortion "
                                "(re-record with lower gain)")
