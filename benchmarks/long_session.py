"""Peak memory of feature extraction per branch, for one session of 10 minutes, 1 hour and 2 hours.

    python benchmarks/long_session.py --jobs 2           # about 30 minutes on 2 cores
    python benchmarks/long_session.py --minutes 1,5 --no-write   # a quick look

For each length a one-session dataset is made from the real recordings in ../shared/data/media: the
Pexels clip of a person talking, scaled to 320x180 and played forward and backward at SOURCE_FPS (MPEG-4
in mp4) on the dataset's 15 fps clock (each picture held for 3 of its frames: the branches hold and write
what 15 fps gives, while the face mesh and the CNN run on a third of the frames, which keeps 2 hours
within a reasonable time on 2 cores), the CMU ARCTIC sentence repeated with a second of silence between (16 kHz wav), and a transcript
with one utterance per sentence. Each branch is then extracted alone, as a user types it (`python
extract.py branches=[<branch>] features=paper ...`, in a fresh store), and the peak resident memory of
that process and of every process it started (wait4's ru_maxrss) is recorded with its wall time.

The cnn branch embeds every `--cnn-stride`-th frame (features.cnn.frame_stride, the setting CPU users
take) without the face mesh (features.cnn.mask_without_face=false: the mesh's memory is the face branch's);
what it holds per frame does not depend on either. `--jobs 2` extracts two branches at once (their peaks
are their own; only the seconds depend on it). Memory bounded by design means the 2-hour
peak is at most GOAL times the 10-minute one for every branch; the table gives that ratio.
The table goes to docs/results/long_session.md (`--out` elsewhere, `--no-write` to print).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import Measures, add_output_arguments, quiet_machine_guard, write_results  # noqa: E402

MEDIA = ROOT.parent / "shared" / "data" / "media"
PEXELS, SPEECH = MEDIA / "WolfgangLanger_Pexels.mp4", MEDIA / "arctic_a0007.wav"
FPS = 15         # the dataset's clock
SOURCE_FPS = 5   # the video's own rate
SIZE = (320, 180)
SAMPLE_RATE = 16000
PAUSE_S = 1.0  # silence after each sentence
GOAL = 1.3     # the longest session's peak over the shortest's, per branch
SENTENCES = ("I want to tell you about my grandmother.", "She taught me to bake bread every Sunday.",
             "I still think of her when I smell fresh bread.", "It was the first time I felt really understood.")


def clip_frames() -> list[np.ndarray]:
    """The Pexels clip's frames at SIZE (BGR), played forward then backward: a loop without a jump."""
    import av
    import cv2

    with av.open(str(PEXELS)) as container:
        frames = [cv2.resize(frame.to_ndarray(format="bgr24"), SIZE, interpolation=cv2.INTER_AREA)
                  for frame in container.decode(video=0)]
    return frames + frames[-2:0:-1]


def write_video(path: Path, loop: list[np.ndarray], seconds: float) -> None:
    """`seconds` of the loop at SOURCE_FPS, written frame by frame (MPEG-4: cheap to encode and decode)."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=SOURCE_FPS)
        stream.width, stream.height, stream.pix_fmt = SIZE[0], SIZE[1], "yuv420p"
        stream.codec_context.time_base = Fraction(1, SOURCE_FPS)
        stream.codec_context.qscale = 4
        for index in range(int(round(seconds * SOURCE_FPS))):
            frame = av.VideoFrame.from_ndarray(loop[index % len(loop)], format="bgr24")
            frame.pts = index
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def speech_unit() -> np.ndarray:
    """The ARCTIC sentence (16 kHz mono int16) followed by PAUSE_S of silence."""
    from empathic_fusion.features.media import load_audio

    speech = (np.clip(load_audio(SPEECH, SAMPLE_RATE), -1, 1) * 32767).astype(np.int16)
    return np.concatenate([speech, np.zeros(int(PAUSE_S * SAMPLE_RATE), np.int16)])


def write_audio(path: Path, unit: np.ndarray, seconds: float) -> None:
    """`seconds` of the repeated unit as a 16 kHz mono PCM wav, written a minute at a time."""
    import av

    total = int(round(seconds * SAMPLE_RATE))
    block = np.tile(unit, int(np.ceil(60 * SAMPLE_RATE / len(unit))))  # whole units: the pattern stays in step
    with av.open(str(path), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=SAMPLE_RATE, layout="mono")
        for start in range(0, total, len(block)):
            part = block[: min(len(block), total - start)]
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(part[None]), format="s16", layout="mono")
            frame.sample_rate, frame.pts = SAMPLE_RATE, start
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def write_dataset(root: Path, loop: list[np.ndarray], unit: np.ndarray, minutes: float) -> None:
    """A one-session dataset of `minutes` (the tables as docs/dataset.md describes them)."""
    seconds = minutes * 60
    (root / "media").mkdir(parents=True)
    (root / "transcripts").mkdir()
    write_video(root / "media" / "session.mp4", loop, seconds)
    write_audio(root / "media" / "session.wav", unit, seconds)
    (root / "dataset.yaml").write_text(f"name: long_session_{minutes:g}min\nfps: {FPS}\n")
    (root / "participants.csv").write_text("participant_id\np1\n")
    (root / "sessions.csv").write_text("session_id,participant_id,video,audio\ns1,p1,media/session.mp4,media/session.wav\n")
    (root / "stories.csv").write_text("story_id,text\nst1,My grandmother taught me to bake bread.\n")
    (root / "ratings.csv").write_text("session_id,story_id,empathy\ns1,st1,4\n")
    period = len(unit) / SAMPLE_RATE
    speech_s = period - PAUSE_S
    rows = [f"{k * period:.3f},{k * period + speech_s:.3f},participant,story_share,,{SENTENCES[k % len(SENTENCES)]}\n"
            for k in range(int(seconds // period))]
    (root / "transcripts" / "s1.csv").write_text("start,end,speaker,phase,story_id,text\n" + "".join(rows))


def extract_args(cnn_stride: int) -> list[str]:
    """The settings every extraction here runs with (the dataset, store and branch come on top)."""
    return ["data=empathic_stories", "features=paper", f"features.cnn.frame_stride={cnn_stride}",
            "features.cnn.mask_without_face=false", "workers=1", "progress=false"]


def extract_peak(dataset: Path, store: Path, branch: str, cnn_stride: int, run_dir: Path) -> tuple[int, float, str]:
    """(peak RSS in bytes of `extract.py branches=[branch]` and its workers, wall seconds, its output)."""
    shutil.rmtree(store, ignore_errors=True)
    command = [sys.executable, str(ROOT / "extract.py"), *extract_args(cnn_stride), f"data.dataset_dir={dataset}",
               f"data.store_dir={store}", f"branches=[{branch}]", f"hydra.run.dir={run_dir}"]
    env = {key: value for key, value in os.environ.items() if key != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = str(ROOT)
    started = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as output:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(process.pid, 0)  # ru_maxrss: the largest of it and its waited-for children
        process.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - started
        output.seek(0)
        text = output.read()
    if process.returncode != 0:
        raise SystemExit(f"extract.py branches=[{branch}] on {dataset.name} failed (exit {process.returncode}):\n"
                         f"{text[-3000:]}")
    shutil.rmtree(store, ignore_errors=True)
    return usage.ru_maxrss * 1024, seconds, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", default="10,60,120", help="session lengths, shortest first")
    parser.add_argument("--branches", default="face,cnn,audio,text", help="branches, each extracted alone")
    parser.add_argument("--cnn-stride", type=int, default=5, help="features.cnn.frame_stride of the cnn branch")
    parser.add_argument("--jobs", type=int, default=1, help="branches extracted at once")
    parser.add_argument("--keep", type=Path, help="make the datasets in this folder and keep them (reused when there)")
    add_output_arguments(parser, "long_session")
    args = parser.parse_args()
    if not PEXELS.exists():
        raise SystemExit(f"needs the real recordings in {MEDIA}")
    quiet_machine_guard(args, Measures.ACCURACY)  # memory, not time: a busy machine is only noted
    lengths = [float(m) for m in args.minutes.split(",")]
    branches = args.branches.split(",")
    work = args.keep or Path(tempfile.mkdtemp(prefix="long-session-"))
    loop, unit = None, None
    peaks: dict[tuple[str, float], tuple[int, float]] = {}
    try:
        for minutes in lengths:
            dataset = work / f"dataset_{minutes:g}min"
            if not (dataset / "transcripts" / "s1.csv").exists():
                shutil.rmtree(dataset, ignore_errors=True)
                loop = loop if loop is not None else clip_frames()
                unit = unit if unit is not None else speech_unit()
                write_dataset(dataset, loop, unit, minutes)

        def measure(minutes: float, branch: str) -> None:
            name = f"{minutes:g}min_{branch}"
            peaks[branch, minutes] = extract_peak(work / f"dataset_{minutes:g}min", work / f"store_{name}", branch,
                                                  args.cnn_stride, work / f"run_{name}")[:2]
            print(f"{minutes:g} min, {branch}: peak {peaks[branch, minutes][0] / 2**30:.2f} GiB in "
                  f"{peaks[branch, minutes][1]:.0f} s", flush=True)

        with ThreadPoolExecutor(max(args.jobs, 1)) as pool:  # each task waits on its own process
            for done in [pool.submit(measure, m, b) for m in lengths for b in branches]:
                done.result()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    names = [f"{m:g} min" if m < 60 else f"{m / 60:g} h" for m in lengths]
    table = ["| branch | " + " | ".join(f"peak RSS, {n}" for n in names) + f" | {names[-1]} / {names[0]} | "
             + " | ".join(f"seconds, {n}" for n in names) + " |",
             "|---|" + "---|" * (2 * len(lengths) + 1)]
    for branch in branches:
        row = [peaks[branch, m] for m in lengths]
        ratio = row[-1][0] / row[0][0]
        table.append(f"| {branch} | " + " | ".join(f"{p / 2**30:.2f} GiB" for p, _ in row)
                     + f" | {ratio:.2f}x{'' if ratio <= GOAL else ' (over ' + str(GOAL) + 'x)'} | "
                     + " | ".join(f"{s:.0f}" for _, s in row) + " |")
    body = (f"One session per length ({', '.join(names)}) at {SIZE[0]}x{SIZE[1]}, {SOURCE_FPS} fps video on the "
            f"dataset's {FPS} fps clock, made from the real "
            f"recordings (see the benchmark's docstring); each branch extracted alone with `python extract.py "
            f"branches=[<branch>] {' '.join(extract_args(args.cnn_stride))}`, {args.jobs} at a time. Peak "
            f"RSS is the largest resident memory of the command and every process it started (GiB = 2^30 bytes). "
            f"Goal: the longest session's peak at most {GOAL}x the shortest's, per branch.\n\n" + "\n".join(table))
    print(body)
    write_results(args, "Peak memory of extraction for long sessions", body)


if __name__ == "__main__":
    main()
