"""Bad inputs a real lab produces, run on a real-media dataset through the real commands.

    python benchmarks/bad_inputs.py            # about 5-8 minutes on 2 cores; root also runs the real full disk

A dataset is built in a temporary folder from the real recordings in ../shared/data/media (the Pexels
clip of a person talking, the single-face clip, CMU ARCTIC speech), with one session per case, each made
from those recordings the way a phone, a second person or a surround microphone would change them:

  vfr          the Pexels clip at 6 fps for its first 12 s, then 23.98 fps (a phone's variable frame rate),
               beside `cfr`, the same pictures at a constant 23.98 fps: every frame of the dataset clock
               must show the same picture in both
  two_faces    a second person (the single-face clip) beside the participant: the tracked face must
               never switch, and the frames with two faces are reported
  covered      the camera covered (black) from 5 s to 12 s: face and CNN masked there, and reported
  crosstalk    a transcript with a nested utterance, two with the same start and two crossing: every
               utterance must reach its frames, and the overlaps are reported
  surround     ARCTIC speech in all six channels of 48 kHz 5.1 audio, beside `mono`, the original
               16 kHz mono file: openSMILE's features must agree (per-feature r)
  clipped      the speech amplified past full scale: reported
  audio_late   an mp4 whose AAC audio (the ARCTIC sentence, repeated) starts 2.5 s after its video, as a phone
               or `ffmpeg -itsoffset 2.5` writes it, beside `audio_clean`, the same file with both at 0: the
               audio features must line up with the clean ones on the session clock (lag 0 after the offset),
               the leading frames without audio masked and reported
  half_face    the Pexels clip shifted 190 px to the right, the face half out of the frame: the frames with
               the face at the edge must be masked and reported, and one clipped face is not two faces
  narrowband   the ARCTIC sentence as 8 kHz mu-law (a telephone recording): resampled, and the empty bands
               above 4 kHz noted with the source rate

then, each on its own copy: two `extract.py` on one store at once, a full disk (a 2 MB tmpfs when run as
root, grown after the failure to show that a rerun completes), a `store_dir` that is a dangling link, a
declared 1-7 rating scale, an unknown dataset.yaml key, a rating outside the scale (the message only,
exit status 1, no traceback), and, when run as root (a read-only bind mount), a store inside a read-only
dataset folder and training on a finished store mounted read-only. Every command runs as a user types it (`python extract.py ...` in a
subprocess); the table goes to docs/results/bad_inputs.md (`--out` elsewhere, `--no-write` to print).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import Measures, add_output_arguments, quiet_machine_guard, write_results  # noqa: E402

MEDIA = ROOT.parent / "shared" / "data" / "media"
PEXELS, SINGLE, SPEECH = MEDIA / "WolfgangLanger_Pexels.mp4", MEDIA / "single_face.mp4", MEDIA / "arctic_a0007.wav"
FPS = 15
VFR_SLOW_UNTIL_S, VFR_SLOW_FPS = 12.0, 6.0
COVERED_S = (5.0, 12.0)
AUDIO_LATE_S = 2.5
SHIFT_PX = 190


# ---- media made from the real recordings ------------------------------------------------------
def decode(path: Path) -> tuple[list[np.ndarray], list[float]]:
    """Every frame of a video (BGR) with its presentation time in seconds."""
    import av

    frames, times = [], []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            frames.append(frame.to_ndarray(format="bgr24"))
            times.append(float(frame.time))
    return frames, times


def encode(path: Path, frames: list[np.ndarray], times: list[float]) -> None:
    """A lossless FFV1 video (Matroska) showing each frame from its time on: pictures stay exact, so two
    files showing the same picture at the same time give the same face features."""
    import av

    time_base = Fraction(1, 24000)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=24)
        stream.width, stream.height = frames[0].shape[1], frames[0].shape[0]
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = time_base
        for image, when in zip(frames, times):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts, frame.time_base = int(round(when / time_base)), time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def write_audio(path: Path, samples: np.ndarray, rate: int, layout: str) -> None:
    """A PCM wav; `samples` is channels x n float in [-1, 1] (values beyond are clipped by the format)."""
    import av

    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype(np.int16)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm.T.reshape(1, -1)), format="s16", layout=layout)
        frame.sample_rate = rate
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def mux_mono_audio(container, stream, samples: np.ndarray, rate: int, start_s: float) -> None:
    """Mono samples encoded into `stream` of an open PyAV output `container`, 1024 at a time, the first at
    start_s on the container's clock (a later start is the gap a muxer writes as an edit list or offset)."""
    import av

    samples = samples.astype(np.float32)
    first = int(round(start_s * rate))
    for start in range(0, len(samples), 1024):
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[None, start:start + 1024]), format="flt",
                                           layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = rate, first + start, Fraction(1, rate)
        container.mux(stream.encode(frame))
    container.mux(stream.encode(None))


def encode_with_audio(path: Path, frames: list[np.ndarray], times: list[float], speech: np.ndarray, rate: int,
                      audio_start_s: float) -> None:
    """An mp4 (MPEG-4 video, AAC mono audio) whose audio stream starts at audio_start_s on the container's
    clock, as a recorder that starts its streams apart (or `ffmpeg -itsoffset`) writes it."""
    import av

    with av.open(str(path), "w") as container:
        video = container.add_stream("mpeg4", rate=24)
        video.width, video.height, video.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        video.codec_context.time_base = Fraction(1, 24000)
        video.codec_context.qscale = 2
        audio = container.add_stream("aac", rate=rate, layout="mono")
        for image, when in zip(frames, times):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts, frame.time_base = int(round(when * 24000)), Fraction(1, 24000)
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
        mux_mono_audio(container, audio, speech, rate, audio_start_s)


def write_mulaw(path: Path, samples: np.ndarray, rate: int) -> None:
    """A mono G.711 mu-law wav (a telephone recording)."""
    import av

    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype(np.int16)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("pcm_mulaw", rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm[None]), format="s16", layout="mono")
        frame.sample_rate = rate
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def speech_at(rate: int) -> np.ndarray:
    """The ARCTIC sentence (16 kHz mono) resampled to `rate`, float in [-1, 1]."""
    from scipy.signal import resample_poly

    from empathic_fusion.features.media import load_audio

    samples = load_audio(SPEECH, 16000).astype(np.float64)  # the file is 16 kHz mono: read as it is
    return resample_poly(samples, rate, 16000) if rate != 16000 else samples


def make_media(media: Path) -> None:
    """Every recording of the case sessions, from the real ones."""
    frames, times = decode(PEXELS)
    period = times[1] - times[0]
    # cfr: the slow part's pictures held at the full rate; vfr: the same pictures, each written once
    slow_step = max(1, round(1.0 / (VFR_SLOW_FPS * period)))
    held = [frames[i - i % slow_step] if t < VFR_SLOW_UNTIL_S else frames[i] for i, t in enumerate(times)]
    encode(media / "cfr.mkv", held, times)
    kept = [i for i, t in enumerate(times) if t >= VFR_SLOW_UNTIL_S or i % slow_step == 0]
    encode(media / "vfr.mkv", [frames[i] for i in kept], [times[i] for i in kept])
    # a second person beside the participant: the single-face clip, played back and forth, on the right
    other, _ = decode(SINGLE)
    loop = other + other[::-1]
    beside = [np.concatenate([frame, loop[i % len(loop)]], axis=1) for i, frame in enumerate(frames)]
    encode(media / "two_faces.mkv", beside, times)
    covered = [np.zeros_like(f) if COVERED_S[0] <= t < COVERED_S[1] else f for f, t in zip(frames, times)]
    encode(media / "covered.mkv", covered, times)
    speech48 = speech_at(48000)
    write_audio(media / "surround.wav", np.repeat(speech48[None], 6, axis=0), 48000, "5.1")
    write_audio(media / "clipped.wav", (speech_at(16000) * 8.0)[None], 16000, "mono")
    (media / "speech.wav").symlink_to(SPEECH)
    (media / "pexels.mp4").symlink_to(PEXELS)
    # the sentence repeated with a second's pause over the clip; in one container with the video, at 0 and late
    speech = speech_at(48000)
    unit = np.concatenate([speech, np.zeros(48000)])
    repeated = np.tile(unit, int(np.ceil(times[-1] * 48000 / len(unit))))[: int((times[-1] - AUDIO_LATE_S) * 48000)]
    encode_with_audio(media / "av_clean.mp4", frames, times, repeated, 48000, 0.0)
    encode_with_audio(media / "av_late.mp4", frames, times, repeated, 48000, AUDIO_LATE_S)
    shifted = [np.concatenate([np.zeros_like(f[:, :SHIFT_PX]), f[:, :-SHIFT_PX]], axis=1) for f in frames]
    encode(media / "half_face.mkv", shifted, times)
    write_mulaw(media / "narrowband.wav", speech_at(8000), 8000)


CASE_SESSIONS = {  # session: (video, audio)
    "cfr": ("cfr.mkv", "speech.wav"), "vfr": ("vfr.mkv", "speech.wav"),
    "two_faces": ("two_faces.mkv", "speech.wav"), "covered": ("covered.mkv", "speech.wav"),
    "crosstalk": ("pexels.mp4", "speech.wav"), "mono": ("pexels.mp4", "speech.wav"),
    "surround": ("pexels.mp4", "surround.wav"), "clipped": ("pexels.mp4", "clipped.wav"),
    "audio_clean": ("av_clean.mp4", ""), "audio_late": ("av_late.mp4", ""),  # audio from the container
    "half_face": ("half_face.mkv", "speech.wav"), "narrowband": ("pexels.mp4", "narrowband.wav"),
}
PLAIN_TRANSCRIPT = [(0.5, 3.5, "I want to tell you about my grandmother."),
                    (4.0, 9.0, "She taught me to bake bread every Sunday."),
                    (10.0, 18.0, "I still think of her when I smell fresh bread.")]
CROSSTALK_TRANSCRIPT = [(0.5, 6.0, "I want to tell you about my grandmother and her kitchen."),
                        (2.0, 3.0, "Oh really?"),                                  # inside the one before
                        (7.0, 7.8, "Honestly it changed me."),                    # same start as the next
                        (7.0, 12.0, "She taught me to bake bread every Sunday morning."),
                        (11.0, 16.0, "And then one day the bakery closed."),       # crosses the one before
                        (16.5, 18.5, "I still think of her.")]


def write_dataset(root: Path, scale: tuple[int, int] | None = None, ratings: dict[str, int] | None = None) -> None:
    """The dataset's tables: one participant per session, one story, story_share utterances."""
    (root / "transcripts").mkdir(parents=True, exist_ok=True)
    (root / "dataset.yaml").write_text("name: real_bad_inputs\nfps: 15\n"
                                       + (f"rating_scale: [{scale[0]}, {scale[1]}]\n" if scale else ""))
    sessions = list(CASE_SESSIONS)
    (root / "participants.csv").write_text("participant_id\n" + "".join(f"p_{s}\n" for s in sessions))
    (root / "sessions.csv").write_text("session_id,participant_id,video,audio\n" + "".join(
        f"{s},p_{s},media/{v},{'media/' + a if a else ''}\n" for s, (v, a) in CASE_SESSIONS.items()))
    (root / "stories.csv").write_text("story_id,text\nst1,My grandmother taught me to bake bread.\n")
    for session in sessions:
        rows = CROSSTALK_TRANSCRIPT if session == "crosstalk" else PLAIN_TRANSCRIPT
        (root / "transcripts" / f"{session}.csv").write_text("start,end,speaker,phase,story_id,text\n" + "".join(
            f"{a},{b},participant,story_share,,{text}\n" for a, b, text in rows))
    ratings = ratings or {s: 1 + i % 5 for i, s in enumerate(sessions)}
    (root / "ratings.csv").write_text("session_id,story_id,empathy\n" + "".join(
        f"{s},st1,{r}\n" for s, r in ratings.items()))


# ---- running the commands as a user does ------------------------------------------------------
def run(script: str, *overrides: str, run_dir: Path | None = None, env: dict[str, str] | None = None,
        background: bool = False):
    """`python <script> overrides...` in the repository; a finished run's (status, output) or the process."""
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix="run-"))
    command = [sys.executable, str(ROOT / script), *overrides, f"hydra.run.dir={run_dir}"]
    full_env = {key: value for key, value in os.environ.items() if key != "HYDRA_FULL_ERROR"}
    full_env.update({"PYTHONPATH": str(ROOT), **(env or {})})
    if background:
        return subprocess.Popen(command, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    done = subprocess.run(command, cwd=ROOT, env=full_env, capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def extract_args(dataset: Path, store: Path | str) -> list[str]:
    return ["data=empathic_stories", f"data.dataset_dir={dataset}", f"data.store_dir={store}", "features=paper",
            "data.allow_shared_media=true", "workers=2", "progress=false"]


def lines_with(output: str, *needles: str) -> list[str]:
    """Log lines that contain every needle, with the logger's prefix cut off."""
    found = []
    for line in output.splitlines():
        if all(n in line for n in needles):
            found.append(line.split("] - ", 1)[-1].strip())
    return found


# ---- the checks: what each case gave -------------------------------------------------------------
def same_pictures_at_same_times(store, media: Path) -> str:
    """vfr against cfr: the picture each frame of the dataset clock shows (media.iter_frames, what the
    video branches read), and the head pose (pitch, yaw, roll) the face branch stored for it."""
    from empathic_fusion.features.media import iter_frames

    shown = [[frame for _, _, frame in iter_frames(media / f"{name}.mkv", FPS)] for name in ("vfr", "cfr")]
    other = sum(not np.array_equal(a, b) for a, b in zip(*shown)) + abs(len(shown[0]) - len(shown[1]))
    vfr, cfr = (np.asarray(store.load(s, "face", "features"), dtype=np.float32) for s in ("vfr", "cfr"))
    both = (np.asarray(store.load("vfr", "face", "mask")) > 0) & (np.asarray(store.load("cfr", "face", "mask")) > 0)
    angle = np.abs(vfr[:, :3] - cfr[:, :3]).max(axis=1)[both]
    return (f"{other} of {len(shown[1])} frames show another picture than the constant-rate copy at the same "
            f"time; head pose within 1 degree of the copy's on {int((angle <= 1.0).sum())} of {int(both.sum())} "
            f"frames (median difference {np.median(angle):.2f}, largest {angle.max():.2f} degrees: the face mesh "
            f"tracks the 6 fps pictures from further apart than the copy's repeated ones)")


def face_switches(store) -> str:
    """two_faces against the participant alone (session `mono`, the same pictures without the second
    person): per frame, the mean distance between the stored landmarks (centred and scaled by the eyes'
    distance, so the wider picture does not matter); the other person's face is far from the participant's
    (0.05 or more), the participant's own within 0.02."""
    from empathic_fusion.features.face_mesh import FACE_FEATURE_NAMES

    first = list(FACE_FEATURE_NAMES).index("lm0_x")
    both, alone = (np.asarray(store.load(s, "face", "features"), dtype=np.float32)[:, first:] for s in ("two_faces", "mono"))
    valid = (np.asarray(store.load("two_faces", "face", "mask")) > 0) & (np.asarray(store.load("mono", "face", "mask")) > 0)
    distance = np.abs(both[valid] - alone[valid]).mean(axis=1)
    return (f"stored landmarks on another face than the participant's (mean distance to the participant alone above "
            f"0.02) in {int((distance > 0.02).sum())} of {int(valid.sum())} frames valid in both (median distance "
            f"{np.median(distance):.4f})")


def covered_masked(store) -> str:
    """covered: frames of the covered stretch that face and CNN still mark valid."""
    span = slice(int(COVERED_S[0] * FPS), int(COVERED_S[1] * FPS))
    valid = {b: int((np.asarray(store.load("covered", b, "mask"))[span] > 0).sum()) for b in ("face", "cnn")}
    total = span.stop - span.start
    return f"valid frames in the covered {total}: face {valid['face']}, cnn {valid['cnn']}"


def surround_agreement(store) -> str:
    """surround (48 kHz 5.1) against mono (16 kHz): per-feature Pearson r over the speech's frames."""
    a, b = (np.asarray(store.load(s, "audio", "features"), dtype=np.float64) for s in ("surround", "mono"))
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    varied = (a.std(axis=0) > 1e-9) & (b.std(axis=0) > 1e-9)
    r = np.array([np.corrcoef(a[:, j], b[:, j])[0, 1] for j in np.flatnonzero(varied)])
    names = store.entry("mono", "audio").get("feature_names", [])
    loudness = names.index("pcm_RMSenergy_sma") if "pcm_RMSenergy_sma" in names else None
    ratio = (f"; RMS energy {a[:, loudness].mean() / max(b[:, loudness].mean(), 1e-12):.2f}x the mono's"
             if loudness is not None else "")
    return f"per-feature r against mono: median {np.median(r):.3f}, min {r.min():.3f} over {len(r)} features{ratio}"


def audio_alignment(store) -> str:
    """audio_late against audio_clean: the lag (in frames) at which their RMS energy agrees best, over the
    frames both have audio; the offset put right gives the true lag, AUDIO_LATE_S * FPS frames."""
    names = store.entry("audio_clean", "audio").get("feature_names", [])
    column = names.index("pcm_RMSenergy_sma")
    late, clean = (np.asarray(store.load(s, "audio", "features"), dtype=np.float64)[:, column]
                   for s in ("audio_late", "audio_clean"))
    late_mask = np.asarray(store.load("audio_late", "audio", "mask")) > 0
    n = min(len(late), len(clean))

    def agreement(lag: int) -> float:
        frames = np.arange(max(lag, 0), min(n, n + lag))
        frames = frames[late_mask[frames]]
        return float(np.corrcoef(late[frames], clean[frames - lag])[0, 1]) if len(frames) > 10 else -1.0

    lags = range(-60, 61)
    best = max(lags, key=agreement)
    leading = int(np.argmax(late_mask)) if late_mask.any() else n
    return (f"audio features agree best with the clean file's at a lag of {best} frames (r {agreement(best):.3f}; "
            f"the audio starts {AUDIO_LATE_S * FPS:g} frames late); the first {leading} frames have audio mask 0")


def half_face_frames(store) -> str:
    """half_face against the unshifted clip (session `mono`): frames still valid, and among them those whose
    head-pose yaw is more than 10 degrees from the whole face's."""
    shifted, whole = (np.asarray(store.load(s, "face", "features"), dtype=np.float32) for s in ("half_face", "mono"))
    valid = np.asarray(store.load("half_face", "face", "mask")) > 0
    both = valid & (np.asarray(store.load("mono", "face", "mask")) > 0)
    off = int((np.abs(shifted[both, 1] - whole[both, 1]) > 10.0).sum())
    return (f"{int(valid.sum())} of {len(valid)} frames valid; {off} of them with a yaw more than 10 degrees from "
            f"the whole face's")


def narrowband_entry(store) -> str:
    """narrowband: what the audio branch's manifest entry records about the source."""
    entry = store.entry("narrowband", "audio") or {}
    recorded = {key: entry[key] for key in sorted(entry) if "rate" in key or key == "channel_layout"}
    return "manifest: " + ", ".join(f"{key} {value}" for key, value in recorded.items())


def warnings_of(output: str, session: str, *needles: str) -> str:
    """The data warnings a run logged about one session (those with every needle), joined; the note that
    the 4 s of speech end before the video does is left out (every case session has it)."""
    found = [line for line in lines_with(output, f"session '{session}'", *needles) if "both start at 0" not in line]
    return " / ".join(dict.fromkeys(found)) if found else "(no warning)"


def first_error(output: str) -> str:
    """The message a failed command printed: its last non-empty line that is not a log line's tail."""
    lines = [line.split("] - ", 1)[-1].strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "(nothing printed)"


def has_traceback(output: str) -> str:
    return "yes" if "Traceback (most recent call last)" in output else "no"


def crosstalk_placed(store) -> str:
    """crosstalk: utterances that reach none of the frames in their own span. A frame in an utterance's
    span shows that utterance's row, or an added row (the mean of every utterance on that frame)."""
    index = np.asarray(store.load("crosstalk", "text", "frame_utterance"))
    lost = []
    for row, (start, end, text) in enumerate(CROSSTALK_TRANSCRIPT):
        centres = (np.arange(len(index)) + 0.5) / FPS
        own = index[(centres >= start) & (centres < end)]
        if not ((own == row) | (own >= len(CROSSTALK_TRANSCRIPT))).any():
            lost.append(f"'{text}'")
    return (f"{len(lost)} of {len(CROSSTALK_TRANSCRIPT)} utterances reach none of their frames"
            + (f": {', '.join(lost)}" if lost else ""))


# ---- the cases that need their own copy or their own run ------------------------------------------
def two_extractions(dataset: Path, work: Path) -> list[tuple[str, str]]:
    """Two extract.py on one new store at once: with lock=fail the second stops naming the first; with the
    default (lock=wait) it waits and then finds every branch written."""
    rows = []
    for mode in ("fail", "wait"):
        store = work / f"lock_{mode}_store"
        first = run("extract.py", *extract_args(dataset, store), "branches=[face,audio]", background=True)
        deadline = time.monotonic() + 120.0
        while not list(store.glob(".extract-holder-*.json")) and time.monotonic() < deadline:
            time.sleep(0.2)  # until the first holds the lock (its record names it), then the second starts
        status, output = run("extract.py", *extract_args(dataset, store), "branches=[face,audio]", f"lock={mode}")
        first_output = first.communicate()[0]
        message = (first_error(output) if mode == "fail"
                   else " / ".join(lines_with(output, "waiting")[:1] + lines_with(output, "feature store:")[:1]))
        rows.append((f"two `extract.py` on one store (`lock={mode}`)",
                     f"first: exit {first.returncode}; second: exit {status}, traceback {has_traceback(output)}: "
                     f"{message}; temp folders left: {len(list(store.rglob('.*.tmp-*')))}"
                     + f"; FileNotFoundError in either: {'yes' if 'FileNotFoundError' in output + first_output else 'no'}"))
    return rows


def full_disk(dataset: Path, work: Path) -> list[tuple[str, str]]:
    """A store on a 2 MB tmpfs (root only): stopped before any work with the space needed and free; the
    same disk grown to 64 MB (remounted, its files kept): the rerun completes."""
    mount = work / "small_disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        return [("a full disk", "not run: mounting a small tmpfs needs root (tests/test_store_disk_full.py "
                                "covers it with a simulated full disk)")]
    try:
        store = mount / "store"
        status, output = run("extract.py", *extract_args(dataset, store), "branches=[face]")
        before = (f"exit {status}, traceback {has_traceback(output)}: {first_error(output)}")
        subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
        status, output = run("extract.py", *extract_args(dataset, store), "branches=[face]")
        after = f"after growing the disk to 64 MB: exit {status}, " + " ".join(lines_with(output, "feature store:")[:1])
        return [("a full disk (2 MB)", before), ("the same disk grown", after)]
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


@contextmanager
def read_only(folder: Path, at: Path):
    """`folder` mounted read-only at `at` (a bind mount: root only); yields False where that cannot be done."""
    at.mkdir(parents=True, exist_ok=True)
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "--bind", str(folder), str(at)],
                                                    capture_output=True).returncode == 0
    try:
        if mounted and subprocess.run(["mount", "-o", "remount,bind,ro", str(at)], capture_output=True).returncode:
            yield False
        else:
            yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(at)], capture_output=True)


def read_only_stores(dataset: Path, store: Path, work: Path) -> list[tuple[str, str]]:
    """A store inside a read-only dataset folder (extraction must stop with one message), and training and
    prediction on the finished store mounted read-only, the frame cache elsewhere (both must work)."""
    rows = []
    with read_only(dataset, work / "ro_dataset") as mounted:
        if not mounted:
            return [("read-only stores", "not run: a read-only bind mount needs root (tests/test_read_only_store.py "
                                         "covers it where it can)")]
        status, output = run("extract.py", *extract_args(work / "ro_dataset", work / "ro_dataset" / "features"))
        rows.append(("store inside a read-only dataset folder",
                     f"exit {status}, traceback {has_traceback(output)}: {first_error(output)}"))
    run_dir = work / "ro_run"
    with read_only(store, work / "ro_store"):
        status, output = run("train.py", "data=empathic_stories", f"data.dataset_dir={dataset}",
                             f"data.store_dir={work / 'ro_store'}", f"data.frame_cache_dir={work / 'frame_cache'}",
                             "features=paper", "data.allow_shared_media=true", "model=tfn", "trainer.max_epochs=1",
                             "data.split_fractions=[0.5,0.25,0.25]", "logger=none", "evaluation.bootstrap=20",
                             "evaluation.plots=false", "trainer.enable_progress_bar=false", run_dir=run_dir)
        trained = status == 0 and (run_dir / "test_metrics.json").exists()
        result = ("exit 0, test_metrics.json written" if trained
                  else f"exit {status}, traceback {has_traceback(output)}: {first_error(output)}")
        if trained:
            status, output = run("predict.py", f"ckpt_path={run_dir}", f"data.dataset_dir={dataset}",
                                 f"data.store_dir={work / 'ro_store'}", f"out_dir={work / 'ro_predict'}", "progress=false")
            result += f"; predict.py exit {status}" + ("" if status == 0 else f": {first_error(output)}")
        rows.append(("training and prediction on a finished store mounted read-only (`data.frame_cache_dir` "
                     "elsewhere)", result))
    return rows


def store_link(dataset: Path, work: Path) -> tuple[str, str]:
    link = work / "unmounted_store"
    link.symlink_to(work / "no_such_drive" / "store")
    status, output = run("extract.py", *extract_args(dataset, link))
    return ("`store_dir` a dangling link", f"exit {status}, traceback {has_traceback(output)}: {first_error(output)}")


def seven_point_scale(dataset: Path, store: Path, work: Path) -> list[tuple[str, str]]:
    """A dataset rated 1-7 that declares it: trained (one epoch), then new recordings scored."""
    seven = Path(shutil.copytree(dataset, work / "seven", symlinks=True))
    write_dataset(seven, scale=(1, 7), ratings={s: 1 + i % 7 for i, s in enumerate(CASE_SESSIONS)})
    run_dir = work / "seven_run"
    status, output = run("train.py", "data=empathic_stories", f"data.dataset_dir={seven}", f"data.store_dir={store}",
                         "features=paper", "data.allow_shared_media=true", "model=tfn", "trainer.max_epochs=1",
                         "data.split_fractions=[0.5,0.25,0.25]", "logger=none", "evaluation.bootstrap=20",
                         "evaluation.plots=false", "trainer.enable_progress_bar=false", run_dir=run_dir)
    if status != 0:
        return [("declared `rating_scale: [1, 7]`", f"train.py exit {status}: {first_error(output)}")]
    metrics = json.loads((run_dir / "test_metrics.json").read_text())
    cut = metrics["thresholds"]["rating"]["prediction_rating"]
    new = work / "seven_new"
    shutil.copytree(seven, new, symlinks=True)
    (new / "ratings.csv").unlink()
    (new / "dataset.yaml").write_text("name: new_recordings\nfps: 15\n")
    status, output = run("predict.py", f"ckpt_path={run_dir}", f"data.dataset_dir={new}", f"data.store_dir={store}",
                         f"out_dir={work / 'seven_predict'}", "progress=false")
    import pandas as pd

    predicted = pd.read_csv(work / "seven_predict" / "predictions.csv")
    scored = predicted[predicted.status == "scored"]
    return [("declared `rating_scale: [1, 7]`",
             f"train.py exit 0: accuracy cut at {cut:g}; predict.py exit {status}: {len(scored)} recordings scored, "
             f"predictions in {scored.predicted.min():.2f}-{scored.predicted.max():.2f} (clipped to 1-7)")]


def contract_errors(dataset: Path, store: Path, work: Path) -> list[tuple[str, str]]:
    """A misspelt dataset.yaml key and a rating off the scale: the message alone and exit status 1, and
    the traceback only with HYDRA_FULL_ERROR=1."""
    rows = []
    typo = Path(shutil.copytree(dataset, work / "typo", symlinks=True))
    (typo / "dataset.yaml").write_text("name: typo\nfps: 15\nrating_scael: [1, 7]\n")
    status, output = run("extract.py", *extract_args(typo, store))
    rows.append(("unknown dataset.yaml key", f"exit {status}, traceback {has_traceback(output)}: {first_error(output)}"))
    off = Path(shutil.copytree(dataset, work / "off_scale", symlinks=True))
    write_dataset(off, ratings={s: 7 if s == "vfr" else 3 for s in CASE_SESSIONS})
    overrides = ["data=empathic_stories", f"data.dataset_dir={off}", f"data.store_dir={store}", "features=paper",
                 "data.allow_shared_media=true", "logger=none"]
    status, output = run("train.py", *overrides)
    rows.append(("a rating of 7 on the default 1-5 scale",
                 f"exit {status}, traceback {has_traceback(output)}: {first_error(output)}"))
    status, output = run("train.py", *overrides, env={"HYDRA_FULL_ERROR": "1"})
    rows.append(("the same with HYDRA_FULL_ERROR=1", f"exit {status}, traceback {has_traceback(output)}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="build everything in this folder and keep it")
    add_output_arguments(parser, "bad_inputs")
    args = parser.parse_args()
    if not PEXELS.exists():
        raise SystemExit(f"needs the real recordings in {MEDIA}")
    quiet_machine_guard(args, Measures.ACCURACY)
    work = args.keep or Path(tempfile.mkdtemp(prefix="bad-inputs-"))
    dataset, store = work / "dataset", work / "store"
    (dataset / "media").mkdir(parents=True)
    make_media(dataset / "media")
    write_dataset(dataset)
    status, output = run("extract.py", *extract_args(dataset, store))
    from empathic_fusion.features.store import FeatureStore

    features = FeatureStore(store)
    rows = [
        ("variable frame rate (6 fps for 12 s, then 23.98)", same_pictures_at_same_times(features, dataset / "media"),
         warnings_of(output, "vfr")),
        ("a second person beside the participant", face_switches(features), warnings_of(output, "two_faces")),
        ("camera covered from 5 s to 12 s", covered_masked(features), warnings_of(output, "covered")),
        ("overlapping utterances", crosstalk_placed(features), warnings_of(output, "crosstalk", "text")),
        ("48 kHz 5.1 audio, speech in all six channels", surround_agreement(features), warnings_of(output, "surround")),
        ("speech amplified past full scale", "kept as recorded", warnings_of(output, "clipped", "clips")),
        (f"audio starting {AUDIO_LATE_S:g} s after the video in one mp4", audio_alignment(features),
         warnings_of(output, "audio_late")),
        (f"the face half out of the frame (shifted {SHIFT_PX} px)", half_face_frames(features),
         warnings_of(output, "half_face")),
        ("8 kHz mu-law audio", narrowband_entry(features), warnings_of(output, "narrowband", "audio")),
    ]
    table = ["| case | what the stored features show | what extraction reported |", "|---|---|---|"]
    table += [f"| {case} | {shown} | {reported} |" for case, shown, reported in rows]
    runs = [*two_extractions(dataset, work), *full_disk(dataset, work), store_link(dataset, work),
            *read_only_stores(dataset, store, work),
            *seven_point_scale(dataset, store, work), *contract_errors(dataset, store, work)]
    table += ["", "| case | what the command did |", "|---|---|"]
    table += [f"| {case} | {result} |" for case, result in runs]
    body = (f"A dataset of {len(CASE_SESSIONS)} sessions made from the real recordings in ../shared/data/media (one "
            f"per case, see the benchmark's docstring), extracted with `python extract.py ... features=paper` "
            f"(exit {status}). Paths are shortened to their file names.\n\n" + "\n".join(table).replace(str(work), "<tmp>"))
    print(body)
    write_results(args, "Bad inputs on real media", body)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
