"""Voiced, speech-like audio with controllable pitch, pitch range, loudness and syllable rate.

There is no text-to-speech engine offline, and the demo only needs audio whose prosody an acoustic
front end (openSMILE) measures the way it would on speech. So we synthesize source-filter "speech":

* a band-limited glottal pulse train (closed-form sum of equal harmonics, then a one-pole low-pass
  for the natural -6 dB/octave tilt) at a time-varying F0: per-phrase declination, accents on
  stressed syllables, a final fall (or rise), and slow jitter;
* a cascade of four formant resonators whose frequencies glide between vowel targets, one vowel per
  syllable (run block-wise with carried filter state so the coefficients can vary smoothly);
* a syllable-rate amplitude envelope (attack/decay per syllable, gaps between words, longer pauses
  between phrases), plus band-passed noise bursts for fricative and stop onsets and faint aspiration;
* a very low noise floor everywhere else.

Everything is drawn from one numpy Generator seeded by the caller, so a track is reproducible.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.io import wavfile
from scipy.signal import butter, lfilter, sosfilt

SAMPLE_RATE = 16000

# Vowel formants F1, F2, F3 (Hz) of an adult male vocal tract (classic Peterson & Barney style averages);
# voices with a higher F0 get proportionally shorter vocal tracts (see _formant_scale).
_VOWELS = np.array([(730, 1090, 2440), (530, 1840, 2480), (270, 2290, 3010), (570, 840, 2410),
                    (300, 870, 2240), (500, 1500, 2500), (660, 1720, 2410)], dtype=float)
_BANDWIDTHS = (80.0, 100.0, 140.0, 250.0)
_F4 = 3400.0
_BLOCK = 256            # samples per formant-coefficient update (16 ms at 16 kHz)
_HOP = 80               # samples per F0-contour point (5 ms at 16 kHz)
_NOISE_FLOOR = 2e-4     # std of the background noise, about -74 dBFS
# Onset consonants: band edges (Hz) of the noise and burst length (s); None = vowel onset.
_CONSONANTS = (None, None, ("s", 3800.0, 7500.0, 0.09), ("sh", 1800.0, 5000.0, 0.09), ("f", 1200.0, 7000.0, 0.07),
               ("t", 2500.0, 7000.0, 0.025), ("k", 1200.0, 4000.0, 0.03))


@dataclass(frozen=True)
class Voice:
    """How one speaker sounds: the prosodic knobs the demo's acoustic features should pick up."""

    f0_hz: float          # mean pitch, e.g. 210 for the participant, 120 for a robot agent
    pitch_range: float    # relative F0 excursion of intonation, e.g. 0.05 (flat) .. 0.35 (lively)
    loudness: float       # linear peak amplitude scale, e.g. 0.05 (quiet) .. 0.5 (loud)
    rate_hz: float = 4.5  # syllables per second


@dataclass
class _Syllable:
    start: float       # seconds from the segment start (vowel onset)
    dur: float
    vowel: int
    stress: float      # 0.55 .. 1: peak of the amplitude envelope
    pitch: float       # log-F0 target, in units of pitch_range
    consonant: int     # index into _CONSONANTS


def _plan(length_s: float, voice: Voice, rng: np.random.Generator) -> list[_Syllable]:
    """Phrases of words of 1-3 syllables, with word gaps and phrase pauses, filling length_s."""
    syllables: list[_Syllable] = []
    mean_dur = 1.0 / max(voice.rate_hz, 0.5)
    t = rng.uniform(0.03, 0.12)
    while t < length_s - 0.6 * mean_dur:
        phrase_end = min(t + rng.uniform(1.2, 3.2), length_s)
        first = len(syllables)
        while t < phrase_end - 0.6 * mean_dur:
            for _ in range(int(rng.integers(1, 4))):
                dur = mean_dur * rng.uniform(0.75, 1.25)
                if t + dur > length_s:
                    break
                syllables.append(_Syllable(t, dur, int(rng.integers(len(_VOWELS))), rng.uniform(0.55, 1.0), 0.0,
                                           int(rng.integers(len(_CONSONANTS)))))
                t += 0.88 * dur  # syllables of a word overlap a little: the voice does not stop
            t += 0.12 * mean_dur + rng.uniform(0.04, 0.16)  # gap between words
        phrase = syllables[first:]
        for i, syl in enumerate(phrase):  # declination + accents on stressed syllables
            position = i / max(len(phrase) - 1, 1)
            syl.pitch = 0.7 * (0.5 - position) + 1.2 * (syl.stress - 0.775) + rng.normal(0, 0.15)
        if phrase:
            phrase[-1].pitch += -0.6 if rng.random() < 0.75 else 0.8  # statement fall, or question rise
        t += rng.uniform(0.25, 0.6)  # pause between phrases
    return syllables


def _formant_scale(f0_hz: float) -> float:
    return float(np.clip((f0_hz / 120.0) ** 0.3, 0.85, 1.3))


def _resonate(x: np.ndarray, freqs: np.ndarray, active: np.ndarray, sample_rate: int) -> np.ndarray:
    """Cascade of unity-DC-gain two-pole resonators (Klatt style), one biquad section per formant.

    freqs is (n_blocks, n_formants); coefficients change per block of _BLOCK samples while the filter state
    carries over, so formants glide without clicks. Blocks that are not active (silence) are skipped and the
    state restarts from rest after them.
    """
    c = -np.exp(-2 * np.pi * np.asarray(_BANDWIDTHS) / sample_rate)
    b = 2 * np.exp(-np.pi * np.asarray(_BANDWIDTHS) / sample_rate) * np.cos(2 * np.pi * freqs / sample_rate)
    sos = np.zeros((len(freqs), len(_BANDWIDTHS), 6))
    sos[:, :, 0] = 1 - b - c
    sos[:, :, 3] = 1.0
    sos[:, :, 4] = -b
    sos[:, :, 5] = -c
    y = np.zeros(len(x))
    zi = np.zeros((len(_BANDWIDTHS), 2))
    for k in np.flatnonzero(active):
        if k > 0 and not active[k - 1]:
            zi = np.zeros_like(zi)
        block = slice(k * _BLOCK, (k + 1) * _BLOCK)
        y[block], zi = sosfilt(sos[k], x[block], zi=zi)
    return y


def _speech(n: int, voice: Voice, rng: np.random.Generator, sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """n samples of speech in one voice, scaled to peak voice.loudness, and its envelope in [0, 1]."""
    t = np.arange(n) / sample_rate
    syllables = _plan(n / sample_rate, voice, rng)
    envelope = np.zeros(n)
    bursts = np.zeros((len(_CONSONANTS), n))
    for syl in syllables:
        i0, i1 = int(syl.start * sample_rate), min(int((syl.start + syl.dur) * sample_rate), n)
        u = (np.arange(i0, i1) - i0) / max(i1 - i0, 1)
        shape = np.minimum(np.minimum(u / 0.25, (1 - u) / 0.35), 1.0)
        shape = 0.5 - 0.5 * np.cos(np.pi * np.clip(shape, 0, 1))
        envelope[i0:i1] = np.maximum(envelope[i0:i1], syl.stress * shape)
        if _CONSONANTS[syl.consonant] is not None:  # noise burst just before the vowel onset
            length = int(_CONSONANTS[syl.consonant][3] * sample_rate)
            b0 = max(i0 - length + int(0.01 * sample_rate), 0)
            b1 = min(b0 + length, n)
            burst = np.hanning(b1 - b0 + 2)[1:-1] * syl.stress
            bursts[syl.consonant, b0:b1] = np.maximum(bursts[syl.consonant, b0:b1], burst)
    if not syllables:
        return np.zeros(n), envelope

    # F0 at a 5 ms control rate: interpolated per-syllable targets, smoothed, plus slow jitter.
    centres = np.array([s.start + 0.5 * s.dur for s in syllables])
    hop_t = np.arange(n // _HOP + 2) * _HOP / sample_rate
    contour = np.interp(hop_t, centres, [s.pitch for s in syllables])
    window = np.hanning(15)[1:-1]  # 13 points = 65 ms
    contour = np.convolve(np.pad(contour, 6, mode="edge"), window / window.sum(), "valid")
    jitter = np.convolve(rng.normal(0, 0.012, len(hop_t) + 2), np.ones(3) / 3, "valid")
    f0 = voice.f0_hz * np.exp(np.interp(t, hop_t, voice.pitch_range * contour + jitter))

    # Band-limited pulse train: sum_{k=1..K} cos(k*phase) in closed form, then spectral tilt.
    harmonics = max(int(0.45 * sample_rate / f0.max()), 1)
    phase = np.mod(2 * np.pi * np.cumsum(f0) / sample_rate, 2 * np.pi)
    half = np.sin(phase / 2)
    safe = np.abs(half) > 1e-6
    pulses = np.where(safe, np.sin((harmonics + 0.5) * phase) / (2 * np.where(safe, half, 1.0)) - 0.5, harmonics)
    source = lfilter([1.0], [1.0, -0.95], pulses / harmonics)
    source += 0.03 * rng.normal(size=n) * source.std()  # aspiration

    # Formants glide between the vowel targets of successive syllables.
    n_blocks = -(-n // _BLOCK)
    block_t = (np.arange(n_blocks) + 0.5) * _BLOCK / sample_rate
    scale = _formant_scale(voice.f0_hz)
    targets = _VOWELS[[s.vowel for s in syllables]] * scale
    freqs = np.column_stack([np.interp(block_t, centres, targets[:, j]) for j in range(3)]
                            + [np.full(n_blocks, _F4 * scale)])
    freqs = np.minimum(freqs, 0.45 * sample_rate)
    pad = n_blocks * _BLOCK - n
    active = np.pad(envelope, (0, pad)).reshape(n_blocks, _BLOCK).max(axis=1) > 0
    voiced = _resonate(np.pad(source, (0, pad)), freqs, active, sample_rate)[:n] * envelope
    voiced /= max(np.abs(voiced).max(), 1e-12)

    noise = np.zeros(n)
    for kind, consonant in enumerate(_CONSONANTS):
        if consonant is None or not bursts[kind].any():
            continue
        _, lo, hi, _ = consonant
        sos = butter(4, [lo, min(hi, 0.45 * sample_rate)], btype="bandpass", fs=sample_rate, output="sos")
        band = sosfilt(sos, rng.normal(size=n))
        noise += 0.1 * band / band.std() * bursts[kind]
    return voice.loudness * (voiced + noise) / max(1.0, np.abs(voiced + noise).max()), envelope


def synthesize_track(duration_s: float, segments: list[tuple[float, float, Voice]], seed: int,
                     sample_rate: int = SAMPLE_RATE) -> tuple[np.ndarray, np.ndarray]:
    """Renders a mono float32 track of duration_s seconds in [-1, 1] with speech in each (start_s, end_s, voice)
    segment and near-silence elsewhere. Returns (audio, envelope): envelope is the per-sample speech amplitude
    envelope in [0, 1] (0 in silence), which the caller samples at the video frame rate to drive mouth opening.

    The envelope is the syllable envelope before the voice's loudness is applied (a quiet speaker still moves
    the mouth); where segments overlap, audio adds up and the envelope is the maximum. Segments are clipped to
    the track. The same arguments always give the same arrays.
    """
    n = int(round(duration_s * sample_rate))
    rng = np.random.default_rng(seed)
    audio = rng.normal(0.0, _NOISE_FLOOR, n)
    envelope = np.zeros(n)
    for start_s, end_s, voice in segments:
        i0, i1 = max(int(round(start_s * sample_rate)), 0), min(int(round(end_s * sample_rate)), n)
        if i1 - i0 < int(0.1 * sample_rate):
            continue
        speech, env = _speech(i1 - i0, voice, rng, sample_rate)
        audio[i0:i1] += speech
        envelope[i0:i1] = np.maximum(envelope[i0:i1], env)
    return np.clip(audio, -1.0, 1.0).astype(np.float32), np.clip(envelope, 0.0, 1.0).astype(np.float32)


def write_wav(path: Path, audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """16-bit PCM mono wav (scipy.io.wavfile); samples outside [-1, 1] are clipped."""
    pcm = np.round(np.clip(np.asarray(audio, dtype=np.float64).ravel(), -1.0, 1.0) * 32767).astype(np.int16)
    wavfile.write(str(path), int(sample_rate), pcm)
