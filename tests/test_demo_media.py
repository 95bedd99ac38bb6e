"""The synthetic demo media must be read by the real feature extractors the way real media would be.

Face frames go through MediaPipe face mesh (the tracker the video features use) and speech goes through
openSMILE ComParE_2016 LLDs; the tests check that the controls we set come back out of those tools.
"""
from __future__ import annotations

import cv2
import numpy as np
import pytest
from scipy.io import wavfile
from scipy.stats import pearsonr, spearmanr

from empathic_fusion.demo.face import FACE_CONTROLS, render_face_frames, write_face_video
from empathic_fusion.demo.speech import SAMPLE_RATE, Voice, synthesize_track, write_wav

N_FRAMES = 60
HIDDEN = slice(40, 46)  # face_visible = 0 here


def _sweep() -> dict[str, np.ndarray]:
    """All controls vary at once, at unrelated rates, so each measure must pick out its own control."""
    t = np.arange(N_FRAMES)
    visible = np.ones(N_FRAMES)
    visible[HIDDEN] = 0
    return {
        "mouth_open": 0.5 - 0.5 * np.cos(2 * np.pi * t / 12),
        "smile": 0.5 - 0.5 * np.cos(2 * np.pi * t / 50 + 1),
        "brow_raise": (np.sin(2 * np.pi * t / 17) > 0.5).astype(float),
        "eye_open": (t % 9 != 4).astype(float),
        "yaw": 10 * np.sin(2 * np.pi * t / 23 + 2),
        "pitch": 8 * np.sin(2 * np.pi * t / 29 + 0.5),
        "roll": 15 * np.sin(2 * np.pi * t / 37),
        "shift_x": 0.05 * np.sin(2 * np.pi * t / 41),
        "shift_y": 0.04 * np.sin(2 * np.pi * t / 31),
        "face_visible": visible,
    }


@pytest.fixture(scope="module")
def tracked():
    """(controls, frames, landmarks per frame in pixels or None) from MediaPipe face mesh in video mode."""
    import mediapipe as mp
    controls = _sweep()
    frames = list(render_face_frames(controls))
    landmarks = []
    with mp.solutions.face_mesh.FaceMesh(static_image_mode=False, max_num_faces=1, refine_landmarks=True) as mesh:
        for frame in frames:
            result = mesh.process(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
            if result.multi_face_landmarks:
                h, w = frame.shape[:2]
                landmarks.append(np.array([(p.x * w, p.y * h) for p in result.multi_face_landmarks[0].landmark]))
            else:
                landmarks.append(None)
    return controls, frames, landmarks


def _measures(lm: np.ndarray) -> dict[str, float]:
    """Face-size-normalized measures in the face's own frame (x along the eye line, y down the face)."""
    left, right = (lm[33] + lm[133]) / 2, (lm[362] + lm[263]) / 2
    iod = np.linalg.norm(right - left)
    ex = (right - left) / iod
    ey = np.array([-ex[1], ex[0]])
    return {
        "mouth": np.linalg.norm(lm[13] - lm[14]) / iod,
        "corner_lift": (lm[13] - (lm[61] + lm[291]) / 2) @ ey / iod,  # corners above the upper lip: smile
        "roll": np.degrees(np.arctan2(lm[263, 1] - lm[33, 1], lm[263, 0] - lm[33, 0])),
        "eye": (np.linalg.norm(lm[159] - lm[145]) + np.linalg.norm(lm[386] - lm[374])) / 2 / iod,
        "brow": ((left + right) / 2 - (lm[105] + lm[334]) / 2) @ ey / iod,
    }


def _table(tracked):
    controls, _, landmarks = tracked
    found = [i for i, lm in enumerate(landmarks) if lm is not None and controls["face_visible"][i] > 0.5]
    rows = [_measures(landmarks[i]) for i in found]
    measured = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    return {k: v[found] for k, v in controls.items()}, measured


def test_face_found_in_visible_frames_only(tracked):
    controls, _, landmarks = tracked
    found = np.array([lm is not None for lm in landmarks])
    visible = controls["face_visible"] > 0.5
    assert found[visible].mean() >= 0.95
    assert not found[~visible].any()


def test_mouth_opening_follows_control(tracked):
    ctrl, meas = _table(tracked)
    assert spearmanr(ctrl["mouth_open"], meas["mouth"])[0] > 0.8
    assert meas["mouth"].max() > 1.8 * meas["mouth"].min()


def test_lip_corners_follow_smile(tracked):
    ctrl, meas = _table(tracked)
    assert spearmanr(ctrl["smile"], meas["corner_lift"])[0] > 0.8


def test_roll_follows_control(tracked):
    ctrl, meas = _table(tracked)
    assert pearsonr(ctrl["roll"], meas["roll"])[0] > 0.95
    assert np.median(np.abs(meas["roll"] - ctrl["roll"])) < 2.5  # degrees; roll=0 means a level eye line


def test_blinks_and_brow_raises_are_seen(tracked):
    ctrl, meas = _table(tracked)
    closed, raised = ctrl["eye_open"] < 0.5, ctrl["brow_raise"] > 0.5
    assert closed.any() and raised.any()
    assert meas["eye"][closed].mean() < 0.7 * meas["eye"][~closed].mean()
    assert meas["brow"][raised].mean() > meas["brow"][~raised].mean() + 0.015


def test_pose_signs_match_the_docs():
    """+yaw turns the face to the image right, +pitch nods the chin down (the face moves with its pivot)."""
    import mediapipe as mp
    poses = {"yaw": np.array([0.0, 15.0, 0.0]), "pitch": np.array([0.0, 0.0, 15.0])}
    noses = []
    with mp.solutions.face_mesh.FaceMesh(static_image_mode=True, max_num_faces=1) as mesh:
        for frame in render_face_frames(poses):
            landmark = mesh.process(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)).multi_face_landmarks[0].landmark[1]
            noses.append(np.array([landmark.x, landmark.y]) * frame.shape[0])
    assert noses[1][0] > noses[0][0] + 10
    assert noses[2][1] > noses[0][1] + 10


def test_frames_are_deterministic_and_defaults_fill_in():
    controls = {"mouth_open": np.linspace(0, 1, 4), "roll": np.array([0.0, 5.0, -5.0, 10.0])}
    first = list(render_face_frames(controls, size=128))
    second = list(render_face_frames(controls, size=128))
    assert len(first) == 4
    assert all(f.shape == (128, 128, 3) and f.dtype == np.uint8 for f in first)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    explicit = {name: np.full(4, v) for name, v in
                zip(FACE_CONTROLS, (0, 0, 0, 1, 0, 0, 0, 0, 0, 1))} | controls
    assert all(np.array_equal(a, b) for a, b in zip(first, render_face_frames(explicit, size=128)))
    with pytest.raises(ValueError):
        list(render_face_frames({"smiel": np.zeros(2)}))
    with pytest.raises(ValueError):
        list(render_face_frames({"smile": np.zeros(2), "roll": np.zeros(3)}))


def test_write_face_video_round_trips(tmp_path):
    n = 20
    controls = {"mouth_open": np.linspace(0, 1, n), "yaw": np.linspace(-10, 10, n)}
    path = tmp_path / "face.avi"
    assert write_face_video(path, controls, fps=15.0) == n
    cap = cv2.VideoCapture(str(path))
    frames = []
    ok, frame = cap.read()
    while ok:
        frames.append(frame)
        ok, frame = cap.read()
    assert cap.get(cv2.CAP_PROP_FPS) == pytest.approx(15.0)
    cap.release()
    assert len(frames) == n
    assert all(f.shape == (256, 256, 3) for f in frames)
    reference = next(render_face_frames({k: v[:1] for k, v in controls.items()}))
    assert np.abs(frames[0].astype(float) - reference).mean() < 6  # only JPEG loss
    with pytest.raises(RuntimeError):
        write_face_video(tmp_path / "missing" / "face.avi", controls)


# ---- speech ---------------------------------------------------------------------------------------------------
SPEECH = (0.3, 3.3)  # seconds; silence from 3.3 s to the end of the 5 s track


@pytest.fixture(scope="module")
def smile():
    import opensmile
    return opensmile.Smile(feature_set=opensmile.FeatureSet.ComParE_2016,
                           feature_level=opensmile.FeatureLevel.LowLevelDescriptors)


def _lld(smile, voice: Voice, seed: int = 3):
    audio, envelope = synthesize_track(5.0, [(*SPEECH, voice)], seed=seed)
    lld = smile.process_signal(audio, SAMPLE_RATE)
    start = lld.index.get_level_values("start").total_seconds().to_numpy()
    speech = (start > SPEECH[0] + 0.1) & (start < SPEECH[1] - 0.1)
    silence = start > SPEECH[1] + 0.3
    return audio, envelope, lld, speech, silence


@pytest.mark.parametrize("f0", [200.0, 120.0])
def test_opensmile_tracks_pitch_and_voicing(smile, f0):
    audio, envelope, lld, speech, silence = _lld(smile, Voice(f0_hz=f0, pitch_range=0.2, loudness=0.3))
    assert lld.shape[1] == 65
    pitch = lld["F0final_sma"].to_numpy()
    voicing = lld["voicingFinalUnclipped_sma"].to_numpy()
    assert (pitch[speech] > 0).mean() > 0.6  # mostly voiced, with pauses and consonants in between
    assert np.median(pitch[speech][pitch[speech] > 0]) == pytest.approx(f0, rel=0.15)
    assert np.median(voicing[speech]) > 0.6
    assert np.median(voicing[silence]) < 0.3 and (pitch[silence] == 0).all()


def test_louder_voice_measures_louder(smile):
    loudness = {}
    for peak in (0.05, 0.4):
        _, _, lld, speech, silence = _lld(smile, Voice(f0_hz=200.0, pitch_range=0.2, loudness=peak))
        loudness[peak] = lld["audspec_lengthL1norm_sma"].to_numpy()[speech].mean()
        assert loudness[peak] > 3 * lld["audspec_lengthL1norm_sma"].to_numpy()[silence].mean()
    assert loudness[0.4] > 2 * loudness[0.05]


def test_pitch_range_widens_measured_f0_spread(smile):
    spread = {}
    for pitch_range in (0.05, 0.35):
        _, _, lld, speech, _ = _lld(smile, Voice(f0_hz=200.0, pitch_range=pitch_range, loudness=0.3), seed=0)
        f0 = lld["F0final_sma"].to_numpy()[speech]
        low, high = np.percentile(np.log(f0[f0 > 0]), [10, 90])
        spread[pitch_range] = high - low
    assert spread[0.35] > 2 * spread[0.05]


def test_track_shape_envelope_and_determinism(tmp_path):
    voice = Voice(f0_hz=210.0, pitch_range=0.2, loudness=0.25)
    audio, envelope = synthesize_track(4.0, [(0.5, 2.5, voice)], seed=7)
    again, envelope_again = synthesize_track(4.0, [(0.5, 2.5, voice)], seed=7)
    other, _ = synthesize_track(4.0, [(0.5, 2.5, voice)], seed=8)
    assert audio.dtype == np.float32 and audio.shape == envelope.shape == (4 * SAMPLE_RATE,)
    assert np.array_equal(audio, again) and np.array_equal(envelope, envelope_again)
    assert not np.array_equal(audio, other)
    inside = slice(int(0.5 * SAMPLE_RATE), int(2.5 * SAMPLE_RATE))
    outside = np.r_[0:int(0.5 * SAMPLE_RATE), int(2.5 * SAMPLE_RATE):len(audio)]
    assert envelope[outside].max() == 0 and 0.5 < envelope[inside].max() <= 1
    assert (envelope[inside] == 0).mean() > 0.05  # pauses between words
    assert np.abs(audio[inside]).max() == pytest.approx(0.25, rel=0.05)
    assert np.abs(audio[outside]).max() < 0.01
    write_wav(tmp_path / "a.wav", audio)
    rate, pcm = wavfile.read(tmp_path / "a.wav")
    assert rate == SAMPLE_RATE and pcm.dtype == np.int16 and len(pcm) == len(audio)
