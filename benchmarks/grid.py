"""The paper's grid end to end from an on-disk store, up to the whole corpus: datamodule -> model -> optimizer.

    python benchmarks/grid.py --device cpu --fraction 0.05,0.25,1.0 --concurrent 1,2,4  # this machine (CPU)
    python benchmarks/grid.py --device cpu --fraction 1.0 --branches face=714,cnn=2048,audio=65,text=384 \
        --models tfn --out docs/results/grid_paper_dims.md               # the paper's dims
    python benchmarks/grid.py --device cuda --fraction 0.25 --concurrent 1,2,4 --steps 300  # a GPU

Writes a synthetic dataset (CSV tables and transcripts in the contract's layout) and a feature store
in the store's real format (`FeatureStore.write_branch`, float16 features, uint8 masks, indexed SBERT
utterances) at each `--fraction` of EmpathicStories++ (2.86 M frames on the 15 fps clock, 99,357 Story
Share windows of 120 frames, about 4.2 window-frames per stored frame), stating its disk use and how
long it took, then prints:
- side by side at `--compare-fraction` (where the frame arrays fit in memory), in this process: loader
  windows/s of the training DataLoader alone with the frame arrays in memory (`data.frames=memory`),
  out of core (`data.frames=disk`) and per window (`data.loader=reference`), and training windows/s end
  to end per model in memory and out of core, each with its ratio, rounds alternated;
- at each `--fraction`, every model trained for `--steps` in a fresh process, as train.py runs
  (`data.frames=--frames`, by default auto: out of core on a CPU): its windows/s, the seconds its setup
  took (statistics, frame cache), and its peak RSS (the process's high-water mark, everything it ever held);
  with `--concurrent 1,2,4`, that many runs of each of `--concurrent-models` at once (as
  `hydra/launcher=shared_device` runs a sweep): their aggregate windows/s in the steady state (the span in
  which every run is past its warm-up and none has stopped; set --steps so each has at least 200 steps
  there) beside one run's, and the sum of their peak RSS;
- the frame cache's size on disk, and a memory model: the RAM a run needs in memory and out of core
  at each corpus size, from the measured peak RSS and the arrays' bytes;
- the projected grid time: models x subsets x seeds x epochs x --windows at the end-to-end speed (the
  v+a+t speed for every subset, so an upper bound; training only, as in train_throughput.py).
The tables go to docs/results/grid.md (`--out` elsewhere, `--no-write` to print only; `--json` for the
raw values). `--keep` keeps the synthetic stores (in `--work`, default /tmp) for the next run.
"""
from __future__ import annotations

import argparse
import itertools
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch
import yaml
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import (Measures, add_output_arguments, quiet_machine_guard,  # noqa: E402
                                trained_fusion_models, write_results)
from benchmarks.train_throughput import StepTimer, fusion_module  # noqa: E402
from empathic_fusion.dataset import TRAIT_COLUMNS, load_dataset  # noqa: E402
from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule  # noqa: E402
from empathic_fusion.config import with_defaults  # noqa: E402
from empathic_fusion.core.branches import BRANCH_MODALITY, INDEXED  # noqa: E402
from empathic_fusion.features.extract import branch_signature  # noqa: E402
from empathic_fusion.core.files import canonical_hash  # noqa: E402
from empathic_fusion.features.store import DATASET_KEY, FeatureStore  # noqa: E402
from empathic_fusion.datamodules.build import set_up  # noqa: E402

FULL_FRAMES = 2_860_000  # EmpathicStories++ on the 15 fps clock (about 53 h)
FULL_WINDOWS = 99_357  # Story Share windows
FPS, FRAMES = 15, 120


def write_synthetic(root: Path, fraction: float, sessions: int, branch_dims: dict[str, int], seed: int = 0,
                    story_dim: int = 384) -> dict:
    """Dataset tables + store at `fraction` of the corpus; the store is reused when `root` already holds the
    same one. Each branch is recorded with the signature a real extraction would record now
    (`branch_signature`), so the datamodule reads it as fresh; when the extractors' signatures change,
    the store is rebuilt instead of being masked as stale."""
    rng = np.random.default_rng(seed)
    data, store = root / "dataset", FeatureStore(root / "store")
    (data / "transcripts").mkdir(parents=True, exist_ok=True)
    (data / "media").mkdir(exist_ok=True)
    n_frames = int(round(FULL_FRAMES * fraction / sessions))
    windows_per_session = max(1, int(round(FULL_WINDOWS * fraction / sessions)))
    span = (windows_per_session - 1 + FRAMES // FPS) + 1  # seconds of Story Share per session
    if span * FPS + 2 * FPS > n_frames:
        raise ValueError(f"{n_frames} frames per session cannot hold a {span} s Story Share phase; use fewer --sessions")
    ids = [f"s{i:04d}" for i in range(sessions)]
    for sid in ids:  # the contract wants a video file per session (the store is already filled); distinct
        (data / "media" / f"{sid}.avi").write_text(sid)  # bytes, or the sessions would share one recording
    traits = rng.uniform(1, 5, size=(sessions, len(TRAIT_COLUMNS))).round(2)
    pd.DataFrame({"participant_id": [f"p{i:04d}" for i in range(sessions)],
                  **{c: traits[:, j] for j, c in enumerate(TRAIT_COLUMNS)}}).to_csv(data / "participants.csv", index=False)
    pd.DataFrame({"session_id": ids, "participant_id": [f"p{i:04d}" for i in range(sessions)],
                  "video": [f"media/{sid}.avi" for sid in ids]}).to_csv(data / "sessions.csv", index=False)
    stories = [f"story{i}" for i in range(8)]
    pd.DataFrame({"story_id": stories, "text": [f"synthetic story {i}" for i in range(8)]}).to_csv(data / "stories.csv", index=False)
    pd.DataFrame({"session_id": ids, "story_id": [stories[i % 8] for i in range(sessions)],
                  "empathy": rng.integers(1, 6, size=sessions)}).to_csv(data / "ratings.csv", index=False)
    (data / "dataset.yaml").write_text(yaml.safe_dump({"name": "synthetic", "fps": FPS}))
    transcripts = {}
    for i, sid in enumerate(ids):
        start = 1.0  # participant utterances of 6 s with 2 s pauses over the Story Share phase
        rows = [(0.0, 1.0, "agent", "warm_up", "", "hello")]
        rows += [(t, min(t + 6.0, start + span), "participant", "story_share", stories[i % 8], f"utterance {j}")
                 for j, t in enumerate(np.arange(start, start + span, 8.0))]
        transcripts[sid] = pd.DataFrame(rows, columns=["start", "end", "speaker", "phase", "story_id", "text"])
        transcripts[sid].to_csv(data / "transcripts" / f"{sid}.csv", index=False)
    dataset, cfg = load_dataset(data), with_defaults(features_config(branch_dims))
    signatures = {sid: {b: branch_signature(store, dataset, sid, b, cfg) for b in branch_dims} for sid in ids}
    spec = {"fraction": fraction, "sessions": sessions, "dims": branch_dims, "seed": seed, "version": 3, "story": story_dim,
            "signatures": canonical_hash(signatures)}
    done = root / "spec.json"
    if done.exists() and json.loads(done.read_text()) == spec:
        return spec
    done.unlink(missing_ok=True)
    for sid in ids:
        utterances = transcripts[sid]
        frame_utterance = np.full(n_frames, -1, dtype=np.int32)
        for j, row in enumerate(utterances.itertuples()):
            frame_utterance[int(row.start * FPS): int(row.end * FPS)] = j
        for branch, dim in branch_dims.items():
            signature, info = signatures[sid][branch], {"n_frames": n_frames}
            if branch in INDEXED:  # one row per utterance (per word for GloVe) and a per-frame index into them
                table, index = INDEXED[branch]
                arrays = {table: rng.standard_normal((len(utterances), dim)).astype(np.float16),
                          index: frame_utterance, "mask": (frame_utterance >= 0).astype(np.uint8)}
            else:
                arrays = {"features": rng.standard_normal((n_frames, dim), dtype=np.float32).astype(np.float16),
                          "mask": (rng.random(n_frames) < 0.9).astype(np.uint8)}
            store.write_branch(sid, branch, arrays, signature, info)
    store.write_branch(DATASET_KEY, "stories", {"embeddings": rng.standard_normal((8, story_dim)).astype(np.float16)},
                       {"extractor": "synthetic"}, {"story_ids": stories})
    done.write_text(json.dumps(spec))
    return spec


def features_config(branch_dims: dict[str, int]) -> dict:
    """The `features` config that reads these branches: each modality's branches, in the order given."""
    modalities: dict[str, list[str]] = {}
    for branch in branch_dims:
        modalities.setdefault(BRANCH_MODALITY[branch], []).append(branch)
    return {"modalities": modalities}


def datamodule(root: tuple[Path, Path], branch_dims: dict[str, int], loader: str, batch_size: int,
               memory_gb: float | None, frames: str = "auto", trainer: L.Trainer | None = None) -> FusionDataModule:
    """The training datamodule on (dataset folder, store folder), reading `branch_dims`' branches, its frame
    arrays where `frames` says (for `trainer`'s device when given, as in train.py)."""
    features = features_config(branch_dims)
    dm = FusionDataModule(str(root[0]), str(root[1]), list(features["modalities"]), features,
                           name="grid", batch_size=batch_size, extract_workers=1, loader=loader,
                           frames=frames, device_memory_gb=memory_gb)
    dm.prepare_data = lambda: None  # measure the store as it is: no extraction (the synthetic one has no media)
    set_up(dm, trainer, "fit")  # as train.py: placed for the trainer's device
    return dm


def loader_rate(dm: FusionDataModule, batches: int, warmup: int = 5) -> tuple[float, float]:
    """Training windows per wall second and per CPU second of this process over `batches` batches after
    `warmup` (workers, first touch of the arrays and of the reused batch buffers), drawn over as many
    epochs as that takes, as a run of several epochs would (the CPU figure is what a quiet machine would
    give with num_workers=0; on a GPU it counts only the launching thread)."""
    loader = dm.train_dataloader()
    endless = itertools.chain.from_iterable(iter(loader) for _ in itertools.count())
    for _ in itertools.islice(endless, warmup):
        pass
    start, cpu, seen = time.perf_counter(), time.process_time(), 0
    for batch in itertools.islice(endless, batches):
        seen += len(batch["target"])
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - start), seen / (time.process_time() - cpu)


def copy_bandwidth(device: torch.device, megabytes: int = 256) -> float:
    """GB/s of a tensor copy (bytes read + written) on `device`: the ceiling for a gather."""
    source = torch.ones(megabytes * 2 ** 20 // 4, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    best = float("inf")
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        target.copy_(source)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() * 4 / best / 1e9


class Preloaded(Dataset):
    def __init__(self, batches: list[dict]):
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict:
        return self.batches[i]


def _trainer(args: argparse.Namespace, callbacks: list) -> L.Trainer:
    cuda = args.device == "cuda"
    return L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, precision=args.precision, max_epochs=-1,
                     max_steps=args.warmup + args.steps, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                     limit_val_batches=0, callbacks=callbacks)  # over as many epochs as the steps take


def train_rate(name: str, dm: FusionDataModule, args: argparse.Namespace, preloaded: list[dict] | None,
               trainer: L.Trainer | None = None) -> dict[str, Any]:
    """Training windows/s over --steps steps after --warmup: from the datamodule, or from `preloaded` batches.
    Also the peak GPU memory and the timed span (time.perf_counter, the system's monotonic clock).
    `trainer`: the one the datamodule was set up for (its callbacks hold a StepTimer); None: a new one."""
    L.seed_everything(0, workers=False)
    module = fusion_module(name, dm.modalities, dm.input_dims, {"compile": args.compile} if args.compile else None)
    trainer = trainer or _trainer(args, [StepTimer(args.warmup)])
    timer = next(c for c in trainer.callbacks if isinstance(c, StepTimer))
    if preloaded is None:
        trainer.fit(module, datamodule=dm)
    else:
        trainer.fit(module, train_dataloaders=DataLoader(Preloaded(preloaded), batch_size=None))
    windows = timer.timed_steps * args.batch_size
    return {"rate": windows / (timer.stop - timer.start), "windows": windows, "start": timer.start, "stop": timer.stop,
            "ends": timer.ends, "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if args.device == "cuda" else None}


def _run(name: str, root: tuple[Path, Path], dims: dict[str, int], args: argparse.Namespace, threads: int,
         barrier: Any, results: Any) -> None:
    """One training run in its own process, as train.py runs one: datamodule (statistics, frame arrays where
    --frames says), model, --steps steps; with its setup time and the process's peak RSS."""
    torch.set_num_threads(threads)
    began = time.perf_counter()
    trainer = _trainer(args, [StepTimer(args.warmup)])  # first, as in train.py: the data is placed for its device
    dm = datamodule(root, dims, "batched", args.batch_size, args.device_memory_gb, args.frames, trainer)
    setup = time.perf_counter() - began
    barrier.wait()
    result = train_rate(name, dm, args, None, trainer)
    results.put({**result, "setup_s": setup, "frames": dm.frames.where or f"in memory on {dm.frames.device}",
                 "in_memory_gb": dm.frames.nbytes() / 1e9, "disk_gb": dm.frames.disk_nbytes() / 1e9,
                 "peak_rss_gib": peak_rss_gib()})


def peak_rss_gib() -> float:
    """This process's peak resident set size, GiB: Linux's VmHWM, the high-water mark of this process's own
    memory since it started (ru_maxrss would also count the parent's memory when it was spawned: the mark
    survives fork and exec); ru_maxrss elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2 ** 20
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2 ** 30


def steady_state(runs: list[dict[str, Any]], batch_size: int) -> dict[str, Any]:
    """Aggregate windows/s over the window in which every run is in its steady state: from the latest first
    timed step (every run past its warm-up) to the earliest last one (none has stopped), counting each run's
    steps that end inside it; with the steps each run had there."""
    low, high = max(r["start"] for r in runs), min(r["stop"] for r in runs)
    inside = [sum(1 for end in r["ends"] if low < end <= high) for r in runs]
    return {"rate": sum(inside) * batch_size / (high - low) if high > low else float("nan"),
            "steps": inside, "seconds": max(0.0, high - low)}


def runs_at_once(name: str, root: tuple[Path, Path], dims: dict[str, int], args: argparse.Namespace,
                 count: int) -> dict[str, Any]:
    """`count` fresh processes training `name` at once on one device, as a launcher with that many workers
    would (conf/hydra/launcher/shared_device.yaml): their aggregate windows/s in the window where all of them
    are in their steady state (`steady_state`), and over the span from the first timed step to the last (start-up
    skew counts against that one), and each one's peak RSS."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # CUDA cannot be used in forked children
    barrier, results = context.Barrier(count), context.Queue()
    threads = max(1, torch.get_num_threads() // count)
    runs = [context.Process(target=_run, args=(name, root, dims, args, threads, barrier, results))
            for _ in range(count)]
    for run in runs:
        run.start()
    done = [results.get() for _ in runs]
    for run in runs:
        run.join()
    span = max(d["stop"] for d in done) - min(d["start"] for d in done)
    peaks = [d["peak_gpu_gib"] for d in done if d["peak_gpu_gib"] is not None]
    return {"rate": sum(d["windows"] for d in done) / span, "runs": [d["rate"] for d in done],
            "steady": steady_state(done, args.batch_size),
            "peak_gpu_gib": sum(peaks) if peaks else None, "threads_per_run": threads,
            "peak_rss_gib": [d["peak_rss_gib"] for d in done], "setup_s": [d["setup_s"] for d in done],
            "frames": done[0]["frames"], "in_memory_gb": done[0]["in_memory_gb"], "disk_gb": done[0]["disk_gb"]}


def disk_gb(path: Path) -> float:
    """Bytes a folder takes on disk (allocated blocks: sparse files count what they hold), in GB."""
    try:
        return int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True)
                   .stdout.split()[0]) * 1024 / 1e9
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 1e9


def synthetic(args: argparse.Namespace, fraction: float, dims: dict[str, int]) -> tuple[tuple[Path, Path], dict]:
    """The synthetic dataset and store at `fraction` (reused when already written): paths and what it took.
    With --dataset-dir/--store-dir, that dataset and its extracted store instead (never removed)."""
    if args.dataset_dir is not None:
        store_gb = disk_gb(args.store_dir / "sessions") + disk_gb(args.store_dir / "dataset")
        print(f"dataset {args.dataset_dir}, store {args.store_dir}: {store_gb:.2f} GB on disk")
        return (args.dataset_dir, args.store_dir), {"fraction": 0.0, "work": None, "store_gb": store_gb,
                                                    "seconds": 0.0, "reused": True}
    work = (args.work or Path("/tmp")) / f"empathic_grid_{canonical_hash([fraction, args.sessions, dims])}"
    began = time.perf_counter()
    reused = (work / "spec.json").exists()
    write_synthetic(work, fraction, args.sessions, dims)
    seconds = time.perf_counter() - began
    store_gb = disk_gb(work / "store" / "sessions") + disk_gb(work / "store" / "dataset")  # not its frame caches
    info = {"fraction": fraction, "work": work, "store_gb": store_gb, "seconds": seconds,
            "reused": reused and seconds < 60}
    print(f"synthetic store {work} ({fraction:g} of EmpathicStories++): {info['store_gb']:.2f} GB on disk, "
          f"{'reused' if info['reused'] else 'written'} in {seconds:.1f} s")
    return (work / "dataset", work / "store"), info


def alternate(measures: dict[str, Any], rounds: int) -> dict[str, list]:
    """Each measure `rounds` times, in turn (a, b, a, b, ...), so a drift of the machine hits all alike."""
    out: dict[str, list] = {key: [] for key in measures}
    for _ in range(rounds):
        for key, measure in measures.items():
            out[key].append(measure())
    return out


def compare(args: argparse.Namespace, dims: dict[str, int], models: list[str]) -> dict[str, Any]:
    """In memory beside out of core (and the per-window reference) at --compare-fraction, in this process."""
    root, store = synthetic(args, args.compare_fraction, dims)
    trainer = _trainer(args, []) if args.device == "cuda" else None
    memory = datamodule(root, dims, "batched", args.batch_size, args.device_memory_gb, "memory", trainer)
    disk = datamodule(root, dims, "batched", args.batch_size, args.device_memory_gb, "disk", trainer)
    reference = datamodule(root, dims, "reference", args.batch_size, args.device_memory_gb)
    loaders = alternate({"memory": lambda: loader_rate(memory, args.loader_batches),
                         "disk": lambda: loader_rate(disk, args.loader_batches)}, args.rounds)
    loaders["reference"] = [loader_rate(reference, args.reference_batches)]
    best = {key: max(values, key=lambda v: v[0]) for key, values in loaders.items()}
    where = memory.frames.device
    window_bytes = FRAMES * sum(memory.input_dims[m] for m in memory.modalities) * 4  # float32 output per window
    bandwidth = copy_bandwidth(where)
    device = torch.device(args.device)
    preloaded = [move_data_to_device(b, device)
                 for b in itertools.islice(memory.train_dataloader(), args.warmup + args.steps)]
    rows = []
    for name in models:
        rates = alternate({"memory": lambda: train_rate(name, memory, args, None)["rate"],
                           "disk": lambda: train_rate(name, disk, args, None)["rate"],
                           "preloaded": lambda: train_rate(name, memory, args, preloaded)["rate"]}, args.rounds)
        rows.append({"model": name, **{key: max(values) for key, values in rates.items()}})
    return {"store": store, "windows": len(memory.datasets["train"]), "memory_gb": memory.frames.nbytes() / 1e9,
            "cache_gb": disk.frames.disk_nbytes() / 1e9, "device": str(where), "loaders": best,
            "loader_rounds": loaders, "bandwidth": bandwidth, "window_bytes": window_bytes, "models": rows}


def at_fraction(args: argparse.Namespace, fraction: float, dims: dict[str, int], models: list[str]) -> dict[str, Any]:
    """Every model in a fresh process at `fraction`, then --concurrent runs at once."""
    root, store = synthetic(args, fraction, dims)
    single = {name: runs_at_once(name, root, dims, args, 1) for name in models}
    together = {}
    for count in args.concurrent:
        for name in args.concurrent_models.split(",") if args.concurrent_models else models:
            run = single[name] if count == 1 else runs_at_once(name, root, dims, args, count)
            together[f"{name} x{count}"] = {**run, "model": name, "count": count}
    cache = root[1] / "frame_cache"
    return {"store": store, "single": single, "together": together,
            "cache_disk_gb": disk_gb(cache) if cache.exists() else 0.0}


def _gb(value: float) -> str:
    return f"{value:.2f}"


def report(args: argparse.Namespace, dims: dict[str, int], compared: dict | None, fractions: list[dict]) -> list[str]:
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    lines = [f"{device}, batch {args.batch_size}, {FRAMES} frames, branches {dims}, {args.precision}, "
             f"compile {'on (model.compile=true)' if args.compile else 'off'}, {args.sessions} sessions, "
             f"torch threads {torch.get_num_threads()}", ""]
    if compared is not None:
        loaders, c = compared["loaders"], compared
        written = loaders["memory"][0] * c["window_bytes"] / 1e9
        where = f"{args.compare_fraction:g} of the corpus" if c["store"]["work"] is not None else "the given store"
        lines += [f"### In memory beside out of core ({where}, {c['windows']:,} training windows)", "",
                  f"Store {c['store']['store_gb']:.2f} GB on disk; frame arrays {c['memory_gb']:.2f} GB in memory on "
                  f"{c['device']} (`data.frames=memory`), or a {c['cache_gb']:.2f} GB frame cache read out of core "
                  f"(`data.frames=disk`). Best of {args.rounds} alternated rounds.", "",
                  f"Loader only (training split, batch {args.batch_size}), windows/s:", "",
                  "| | in memory | out of core | out of core / in memory | per-window reference |",
                  "|---|---|---|---|---|",
                  f"| per wall second | {loaders['memory'][0]:,.0f} | {loaders['disk'][0]:,.0f} | "
                  f"{loaders['disk'][0] / loaders['memory'][0]:.2f}x | {loaders['reference'][0]:,.0f} |",
                  f"| per CPU second | {loaders['memory'][1]:,.0f} | {loaders['disk'][1]:,.0f} | "
                  f"{loaders['disk'][1] / loaders['memory'][1]:.2f}x | {loaders['reference'][1]:,.0f} |", "",
                  f"The in-memory gather writes {written:.2f} GB/s of float32 windows; a tensor copy on {c['device']} "
                  f"moves {c['bandwidth']:.1f} GB/s (read + write), so it runs at {written / (c['bandwidth'] / 2):.0%} "
                  "of its write rate.", "",
                  "Training windows/s end to end (Lightning Trainer on the datamodule's loader):", "",
                  "| model | in memory | out of core | out of core / in memory | pre-loaded batches | "
                  "loader overhead (in memory) |", "|---|---|---|---|---|---|"]
        for r in c["models"]:
            lines.append(f"| {r['model']} | {r['memory']:,.0f} | {r['disk']:,.0f} | {r['disk'] / r['memory']:.2f}x | "
                         f"{r['preloaded']:,.0f} | {r['preloaded'] / r['memory']:.3f}x |")
        lines.append("")
    grid_windows = args.subsets * args.seeds * args.epochs * args.windows  # trained per model over the grid
    for f in fractions:
        store = f["store"]
        title = f"{store['fraction']:g} of the corpus" if store["work"] is not None else "The given store"
        lines += [f"### {title}: one run per process", "",
                  f"{'Synthetic store' if store['work'] is not None else 'Store'}: {store['store_gb']:.2f} GB on disk, "
                  f"{_made(store)}; "
                  f"frame cache: {f['cache_disk_gb']:.2f} GB on disk.", "",
                  "| model | frame arrays | setup s | train windows/s | peak RSS GiB | peak GPU GiB | grid h |",
                  "|---|---|---|---|---|---|---|"]
        for name, r in f["single"].items():
            gpu = f"{r['peak_gpu_gib']:.2f}" if r["peak_gpu_gib"] is not None else "-"
            lines.append(f"| {name} | {_where(r)} | {r['setup_s'][0]:.0f} | {r['rate']:,.0f} | "
                         f"{r['peak_rss_gib'][0]:.2f} | {gpu} | {grid_windows / r['rate'] / 3600:.2f} |")
        lines += ["", f"Grid ({len(f['single'])} models x {args.subsets} subsets x {args.seeds} seeds x {args.epochs} "
                  f"epochs x {args.windows:,} windows, training only, runs in sequence on one device): "
                  f"{sum(grid_windows / r['rate'] / 3600 for r in f['single'].values()):.2f} h", ""]
        if f["together"]:
            lines += ["Runs at once (separate processes, each with its own frame arrays, torch threads split between "
                      "them on CPU). Steady state: windows/s of all runs over the span in which every one is past its "
                      "warm-up and none has stopped, with the steps each had in it; first to last: over the span from "
                      "the first timed step to the last.", "",
                      "| model | runs | steady-state windows/s | / one run | steps per run in the window | "
                      "first to last windows/s | per-run windows/s | per-run setup s | sum of peak RSS GiB | "
                      "peak GPU GiB (sum) |", "|---|---|---|---|---|---|---|---|---|---|"]
            for r in f["together"].values():
                name, count = r["model"], r["count"]
                gpu = f"{r['peak_gpu_gib']:.2f}" if r["peak_gpu_gib"] is not None else "-"
                steady, one = r["steady"], f["single"][name]["steady"]
                lines.append(f"| {name} | {count} | {steady['rate']:,.0f} | {steady['rate'] / one['rate']:.2f}x | "
                             f"{', '.join(map(str, steady['steps']))} | {r['rate']:,.0f} | "
                             f"{', '.join(f'{v:,.0f}' for v in r['runs'])} | {', '.join(f'{v:.0f}' for v in r['setup_s'])} | "
                             f"{sum(r['peak_rss_gib']):.2f} | {gpu} |")
            lines.append("")
    lines += memory_model(dims, fractions)
    return lines


def _made(store: dict) -> str:
    if store["work"] is None:
        return "extracted before"
    return "reused from an earlier run" if store["reused"] else f"written in {store['seconds']:.0f} s"


def _where(run: dict) -> str:
    return "out of core" if run["frames"].startswith("out of core") else run["frames"]


def memory_model(dims: dict[str, int], fractions: list[dict]) -> list[str]:
    """RAM a run needs at each corpus size, from the runs measured: out of core, the largest peak RSS at the
    largest fraction measured (what grows with the corpus in a run is a few bytes a frame and a window),
    plus a page cache as large as the frame cache to read at memory speed; in memory, that plus the float32
    frame arrays (4 bytes x frames x dense input dims), which a GPU holds in its own memory instead."""
    peaks = {f["store"]["fraction"]: max(r["peak_rss_gib"][0] for r in f["single"].values())
             for f in fractions if f["store"]["work"] is not None  # synthetic stores: their fraction is known
             and all(r["frames"].startswith("out of core") for r in f["single"].values())}
    if not peaks:
        return []
    low, high = min(peaks), max(peaks)
    base = peaks[high]
    width = sum(d for b, d in dims.items() if b not in INDEXED)  # indexed branches keep small tables instead
    lines = ["### Memory model (from the runs above)", "",
             f"Out of core the largest peak RSS of a run was {base:.2f} GiB at {high:g} of the corpus"
             + (f" and {peaks[low]:.2f} GiB at {low:g}" if low != high else "") + ". The frame arrays "
             f"(4 bytes x frames x {width} dense input dims) are a frame cache on disk, which the operating system "
             "keeps in its page cache as far as RAM allows and shares between all runs; runs still train when it "
             "does not fit, reading from disk. In memory each run holds the arrays itself; on a GPU they are held in "
             "its memory while they fit data.device_memory_gb.", "",
             "| corpus | frames | frame arrays, float32: frame cache on disk, page cache for full speed (shared), or "
             "GPU memory | CPU, out of core: RAM per run | CPU, in memory: RAM per run |", "|---|---|---|---|---|"]
    for fraction in sorted({0.05, 0.25, 0.5, 1.0, *peaks}):
        frames = FULL_FRAMES * fraction
        arrays = 4 * frames * width / 2 ** 30
        per_run = f"{base:.1f} GiB" if fraction <= high else f"{base:.1f} GiB + a few bytes a frame beyond {high:g}"
        lines.append(f"| {fraction:g} x EmpathicStories++ | {frames / 1e6:.2f} M | {arrays:.1f} GiB | {per_run} | "
                     f"{base + arrays:.1f} GiB |")
    return lines + [""]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--models", default=",".join(trained_fusion_models()))
    parser.add_argument("--fraction", default="0.01",
                        help="of EmpathicStories++'s 2.86 M frames; several, comma-separated, run one after another")
    parser.add_argument("--compare-fraction", type=float, default=0.05,
                        help="where frame arrays in memory and out of core are timed side by side (0: skip)")
    parser.add_argument("--rounds", type=int, default=2, help="alternated rounds of the side-by-side measures")
    parser.add_argument("--frames", choices=("auto", "memory", "disk"), default="auto",
                        help="data.frames of the runs at --fraction (auto: out of core on a CPU)")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--branches", default="face=1451,audio=65,text=384",
                        help="store branches and dims (the paper's: face=714,cnn=2048,audio=65,text=384)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8, help="timed training steps per model")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--loader-batches", type=int, default=30, help="timed batches of the batched loader")
    parser.add_argument("--reference-batches", type=int, default=8, help="timed batches of the reference loader")
    parser.add_argument("--device-memory-gb", type=float, default=None,
                        help="data.device_memory_gb (default: as train.py, half of the GPU's free memory at setup)")
    parser.add_argument("--precision", default=None, help="Lightning precision (default: 32-true, as trainer=gpu and trainer=cpu)")
    parser.add_argument("--compile", action="store_true", help="train with model.compile=true (torch.compile)")
    parser.add_argument("--subsets", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--windows", type=int, default=FULL_WINDOWS)
    parser.add_argument("--concurrent", default="",
                        help="numbers of runs to train at once on the device, one process each, comma-separated "
                             "(e.g. 1,2,4; 1 is the single run); compared in their steady state")
    parser.add_argument("--concurrent-models", default=None, help="the models run --concurrent at once (default: all)")
    parser.add_argument("--work", type=Path, default=None, help="where the synthetic stores go (default: /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the synthetic stores (and frame caches) afterwards")
    parser.add_argument("--dataset-dir", type=Path, default=None,
                        help="measure on this dataset and its extracted --store-dir instead of synthetic stores "
                             "(e.g. data/demo and data/features/demo; --branches must name its branches; "
                             "--fraction is then ignored)")
    parser.add_argument("--store-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results as JSON here")
    add_output_arguments(parser, "grid")
    args = parser.parse_args(argv)
    quiet_machine_guard(args, Measures.TIME)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU")
    args.precision = args.precision or "32-true"
    dims = {b: int(d) for b, d in (item.split("=") for item in args.branches.split(","))}
    unknown = set(dims) - set(BRANCH_MODALITY)
    if unknown:
        parser.error(f"--branches: unknown {sorted(unknown)}; choose from {sorted(BRANCH_MODALITY)}")
    if (args.dataset_dir is None) != (args.store_dir is None):
        parser.error("--dataset-dir and --store-dir go together")
    if args.dataset_dir is not None:
        args.fraction = "0"  # one pass over the given store
    models = args.models.split(",")
    args.concurrent = [int(n) for n in str(args.concurrent).split(",") if n.strip()]
    compared = compare(args, dims, models) if args.compare_fraction > 0 else None
    fractions = []
    for fraction in (float(f) for f in args.fraction.split(",")):
        fractions.append(at_fraction(args, fraction, dims, models))
        if not args.keep and fractions[-1]["store"]["work"] is not None:
            shutil.rmtree(fractions[-1]["store"]["work"], ignore_errors=True)
    if compared is not None and not args.keep and compared["store"]["work"] is not None:
        shutil.rmtree(compared["store"]["work"], ignore_errors=True)
    lines = report(args, dims, compared, fractions)
    print("\n" + "\n".join(lines))
    write_results(args, f"Grid end to end from the feature store (synthetic stores at {args.fraction} of "
                        "EmpathicStories++'s size)", "\n".join(lines))
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "compared": compared, "fractions": fractions}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
