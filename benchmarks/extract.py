"""Frames per second of the video path's stages, on the dataset clock (15 fps by default).

    python benchmarks/extract.py --frames 3000 [--workers 16] [--video PATH] [--cnn-batch 64]

Measures, over a real video (../shared/data/media/WolfgangLanger_Pexels.mp4 by default, 23.98 fps
H.264) read again and again as if it were many sessions until --frames frames are done:
  decode      OpenCV decode + resampling onto the dataset clock (media.iter_frames)
  face        decode + MediaPipe face mesh features (1451 per frame)
  cnn         decode + EfficientNet-Lite0 embeddings (1280), batched; CUDA in fp16 when present
  video path  decode once -> face + cnn (empathic_fusion/features/video_pass.py), what extraction runs
  face+audio+text  decode + face, plus openSMILE LLDs and SBERT of a transcript for the same seconds
and the ratios to decode alone. With --workers N every stage runs N sessions at once in N
processes (as extraction does), so the numbers are the machine's throughput. The table goes to
docs/results/extract.md (`--out` elsewhere, `--no-write` to print only).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import Measures, add_output_arguments, quiet_machine_guard, write_results  # noqa: E402

DEFAULT_VIDEO = Path(__file__).resolve().parents[2] / "shared" / "data" / "media" / "WolfgangLanger_Pexels.mp4"
_EMBEDDER = None


def _init(stage: str, cnn_batch: int, threads: int) -> None:
    """Per worker: few threads each (N processes share the cores), the CNN loaded once."""
    global _EMBEDDER
    import torch

    torch.set_num_threads(threads)
    if stage in ("cnn", "video_path"):
        from empathic_fusion.features.cnn_frames import FrameEmbedder

        _EMBEDDER = FrameEmbedder(batch_size=cnn_batch)


def _session(args: tuple[str, str, float]) -> int:
    """Run one stage over one copy of the video; returns the frames it produced on the dataset clock."""
    stage, video, fps = args
    from empathic_fusion.features.media import iter_frames
    from empathic_fusion.features.video_pass import extract_video

    if stage == "decode":
        return sum(1 for _ in iter_frames(Path(video), fps))
    if stage == "face":
        return extract_video(Path(video), fps, face_cfg={})["face"][1]["n_frames"]
    if stage == "cnn":
        return extract_video(Path(video), fps, cnn_cfg={"frame_stride": 1}, embedder=_EMBEDDER)["cnn"][1]["n_frames"]
    if stage == "video_path":
        out = extract_video(Path(video), fps, face_cfg={}, cnn_cfg={"frame_stride": 1}, embedder=_EMBEDDER)
        return out["face"][1]["n_frames"]
    if stage == "face_audio_text":
        n = extract_video(Path(video), fps, face_cfg={})["face"][1]["n_frames"]
        _audio_text(video, fps, n)
        return n
    raise ValueError(stage)


def _audio_text(video: str, fps: float, n_frames: int) -> None:
    """openSMILE LLDs of the session's audio and SBERT of a transcript as long as the video."""
    import numpy as np
    import pandas as pd

    from empathic_fusion.features.audio_smile import extract_audio
    from empathic_fusion.features.text_sbert import extract_text

    try:
        extract_audio(Path(video), fps)
    except Exception:  # noqa: BLE001 - a video without audio: a 16 kHz wav of the same length instead
        from scipy.io import wavfile

        wav = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_{os.getpid()}.wav"
        wavfile.write(wav, 16000, (np.random.default_rng(0).normal(0, 0.1, int(n_frames / fps * 16000))).astype(np.float32))
        extract_audio(wav, fps)
    seconds = n_frames / fps
    starts = np.arange(0, seconds - 3, 3.0)  # an utterance every 3 s, like a talkative participant
    transcript = pd.DataFrame({"start": starts, "end": starts + 2.5, "speaker": "participant",
                               "text": [f"This is sentence number {i} of a story about my family." for i in range(len(starts))]})
    extract_text(transcript, fps, _text_encoder(), ["participant"])


_ENCODER = None


def _text_encoder():
    global _ENCODER
    if _ENCODER is None:
        from empathic_fusion.core.sentence_encoder import SentenceEncoder

        _ENCODER = SentenceEncoder(device="cuda" if _cuda() else "cpu")
    return _ENCODER


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def measure(stage: str, video: Path, fps: float, frames: int, workers: int, cnn_batch: int) -> tuple[int, float]:
    """(frames, seconds) for enough sessions of the video to reach `frames`, after one warm-up session."""
    from empathic_fusion.features.media import probe_video

    per_session = max(probe_video(video).frames_at(fps), 1)
    sessions = max(math.ceil(frames / per_session), workers)
    threads = max(1, (os.cpu_count() or 1) // workers)
    jobs = [(stage, str(video), fps)] * sessions
    if workers == 1:
        _init(stage, cnn_batch, threads)
        _session(jobs[0])  # warm-up: model loading, first-call costs
        start = time.perf_counter()
        done = sum(_session(job) for job in jobs)
        return done, time.perf_counter() - start
    with get_context("spawn").Pool(workers, initializer=_init, initargs=(stage, cnn_batch, threads)) as pool:
        pool.map(_session, [jobs[0]] * workers)  # warm every worker up
        start = time.perf_counter()
        done = sum(pool.map(_session, jobs, chunksize=1))
        return done, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--video", type=Path, default=DEFAULT_VIDEO)
    parser.add_argument("--frames", type=int, default=600, help="frames per stage on the dataset clock")
    parser.add_argument("--fps", type=float, default=15.0, help="the dataset clock")
    parser.add_argument("--workers", type=int, default=1, help="sessions processed at once, one process each")
    parser.add_argument("--cnn-batch", type=int, default=32)
    parser.add_argument("--stages", default="decode,face,cnn,video_path,face_audio_text")
    add_output_arguments(parser, "extract")
    args = parser.parse_args()
    quiet_machine_guard(args, Measures.TIME)
    if not args.video.exists():
        raise SystemExit(f"{args.video} does not exist: pass --video (any video OpenCV reads)")
    import torch

    from empathic_fusion.features.media import probe_video

    info = probe_video(args.video)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    lines = [f"video {args.video.name}: {info.width}x{info.height} at {info.fps:.2f} fps -> {args.fps:g} fps; "
             f"{args.workers} worker(s) on {os.cpu_count()} CPU cores; CNN on {device}"
             f"{' (fp16)' if torch.cuda.is_available() else ''}", "",
             "| stage | frames | seconds | frames/s | / decode |", "|---|---|---|---|---|"]
    print(lines[0])
    rates = {}
    for stage in args.stages.split(","):
        frames, seconds = measure(stage, args.video, args.fps, args.frames, args.workers, args.cnn_batch)
        rates[stage] = frames / seconds
        ratio = f"{rates[stage] / rates['decode']:.3f}" if "decode" in rates else "-"
        lines.append(f"| {stage} | {frames} | {seconds:.2f} | {rates[stage]:.1f} | {ratio} |")
        print(lines[-1], flush=True)
    if "video_path" in rates:
        hours = 2.9e6 / rates["video_path"] / 3600
        lines += ["", f"EmpathicStories++ (2.9 million frames at 15 fps) through the video path: {hours:.2f} h"]
        print(lines[-1])
    write_results(args, "Feature extraction speed", "\n".join(lines))


if __name__ == "__main__":
    main()
