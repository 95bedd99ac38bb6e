"""The paper's grid end to end from an on-disk store: datamodule -> model -> optimizer, per model.

    python benchmarks/grid.py --device cpu --fraction 0.01 --steps 8          # this machine (CPU)
    python benchmarks/grid.py --device cuda --fraction 0.25 --concurrent 4     # a GPU (bf16 mixed precision)

Writes a synthetic dataset (CSV tables and transcripts in the contract's layout) and a feature store
in the store's real format (`FeatureStore.write_branch`, float16 features, uint8 masks, indexed SBERT
utterances) at `--fraction` of EmpathicStories++ (2.86 M frames on the 15 fps clock, 99,357 Story
Share windows of 120 frames, about 4.2 window-frames per stored frame), then per model prints:
- loader windows/s: the training DataLoader alone, the batched gather (`data.loader=batched`)
  beside the per-window reference (`data.loader=reference`, the old `WindowDataset`);
- training windows/s end to end (Lightning Trainer on the datamodule's loader) and with the same
  batches pre-loaded on the device, and their step-time ratio (the loader's overhead);
- peak memory (GPU: torch.cuda.max_memory_allocated; CPU: the process's peak RSS so far);
- the projected grid time: models x subsets x seeds x epochs x --windows at the end-to-end speed
  (the v+a+t speed for every subset, so an upper bound; training only, as in train_throughput.py).
With --concurrent N it also trains N runs of each model at once on the device (N processes, as
`hydra/launcher=shared_device` runs a sweep) and prints their aggregate windows/s and the grid time
at that rate.
It also prints a memory-copy bandwidth measured in the same process, to say how close the gather
comes to it, and the load average (the machine may be shared). The tables go to docs/results/grid.md
(`--out` elsewhere, `--no-write` to print only; `--json` for the raw values).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
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

from benchmarks.results import Measures, add_output_arguments, quiet_machine_guard, write_results  # noqa: E402
from benchmarks.train_throughput import MODELS, StepTimer, fusion_module  # noqa: E402
from empathic_fusion.dataset import TRAIT_COLUMNS, load_dataset  # noqa: E402
from empathic_fusion.datamodules.empathy_datamodule import EmpathyDataModule  # noqa: E402
from empathic_fusion.config import with_defaults  # noqa: E402
from empathic_fusion.core.branches import BRANCH_MODALITY, INDEXED  # noqa: E402
from empathic_fusion.features.extract import branch_signature  # noqa: E402
from empathic_fusion.core.files import canonical_hash  # noqa: E402
from empathic_fusion.features.store import DATASET_KEY, FeatureStore  # noqa: E402

FULL_FRAMES = 2_860_000  # EmpathicStories++ on the 15 fps clock (about 53 h)
FULL_WINDOWS = 99_357  # Story Share windows
FPS, FRAMES = 15, 120


def write_synthetic(root: Path, fraction: float, sessions: int, branch_dims: dict[str, int], seed: int = 0) -> dict:
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
    spec = {"fraction": fraction, "sessions": sessions, "dims": branch_dims, "seed": seed, "version": 3,
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
    store.write_branch(DATASET_KEY, "stories", {"embeddings": rng.standard_normal((8, 384)).astype(np.float16)},
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
               memory_gb: float) -> EmpathyDataModule:
    """The training datamodule on (dataset folder, store folder), reading `branch_dims`' branches."""
    features = features_config(branch_dims)
    dm = EmpathyDataModule(str(root[0]), str(root[1]), list(features["modalities"]), features,
                           name="grid", batch_size=batch_size, extract_workers=1, loader=loader,
                           device_memory_gb=memory_gb)
    dm.prepare_data = lambda: None  # measure the store as it is: no extraction (the synthetic one has no media)
    dm.setup("fit")
    return dm


def loader_rate(dm: EmpathyDataModule, batches: int, warmup: int = 5) -> tuple[float, float]:
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


def train_rate(name: str, dm: EmpathyDataModule, args: argparse.Namespace, preloaded: list[dict] | None) -> dict[str, Any]:
    """Training windows/s over --steps steps after --warmup: from the datamodule, or from `preloaded` batches.
    Also the peak GPU memory and the timed span (time.perf_counter, the system's monotonic clock)."""
    L.seed_everything(0, workers=False)
    module = fusion_module(name, dm.modalities, dm.input_dims)
    cuda = args.device == "cuda"
    timer = StepTimer(args.warmup)
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, precision=args.precision, max_epochs=-1,
                        max_steps=args.warmup + args.steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, callbacks=[timer])  # over as many epochs as the steps take
    if preloaded is None:
        trainer.fit(module, datamodule=dm)
    else:
        trainer.fit(module, train_dataloaders=DataLoader(Preloaded(preloaded), batch_size=None))
    windows = timer.timed_steps * args.batch_size
    return {"rate": windows / (timer.stop - timer.start), "windows": windows, "start": timer.start, "stop": timer.stop,
            "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None}


def _concurrent_run(name: str, root: tuple[Path, Path], dims: dict[str, int], args: argparse.Namespace, threads: int,
                    barrier: Any, results: Any) -> None:
    """One of --concurrent training processes: its own datamodule and model on the shared device."""
    torch.set_num_threads(threads)
    dm = datamodule(root, dims, "batched", args.batch_size, args.device_memory_gb)
    barrier.wait()
    results.put(train_rate(name, dm, args, None))


def concurrent_rate(name: str, root: tuple[Path, Path], dims: dict[str, int], args: argparse.Namespace) -> dict[str, Any]:
    """--concurrent processes training `name` at once on one device, as a launcher with that many workers
    would (conf/hydra/launcher/shared_device.yaml): the windows they all trained over the span from the
    first timed step to the last (so time one run spends alone counts against the aggregate)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # CUDA cannot be used in forked children
    barrier, results = context.Barrier(args.concurrent), context.Queue()
    threads = max(1, torch.get_num_threads() // args.concurrent)
    runs = [context.Process(target=_concurrent_run, args=(name, root, dims, args, threads, barrier, results))
            for _ in range(args.concurrent)]
    for run in runs:
        run.start()
    done = [results.get() for _ in runs]
    for run in runs:
        run.join()
    span = max(d["stop"] for d in done) - min(d["start"] for d in done)
    peaks = [d["peak_gpu_gib"] for d in done if d["peak_gpu_gib"] is not None]
    return {"rate": sum(d["windows"] for d in done) / span, "runs": [d["rate"] for d in done],
            "peak_gpu_gib": sum(peaks) if peaks else None, "threads_per_run": threads}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--fraction", type=float, default=0.01, help="of EmpathicStories++'s 2.86 M frames")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--branches", default="face=1451,audio=65,text=384",
                        help="store branches and dims (the paper's: face=714,cnn=2048,audio=65,text=384)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8, help="timed training steps per model")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--loader-batches", type=int, default=30, help="timed batches of the batched loader")
    parser.add_argument("--reference-batches", type=int, default=8, help="timed batches of the reference loader")
    parser.add_argument("--device-memory-gb", type=float, default=8.0)
    parser.add_argument("--precision", default=None, help="default: bf16-mixed on cuda, 32-true on cpu")
    parser.add_argument("--subsets", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--windows", type=int, default=FULL_WINDOWS)
    parser.add_argument("--concurrent", type=int, default=1,
                        help="also train this many runs of each model at once on the device, one process each")
    parser.add_argument("--work", type=Path, default=None, help="where the synthetic store goes (default: /tmp)")
    parser.add_argument("--dataset-dir", type=Path, default=None,
                        help="measure on this dataset and its extracted --store-dir instead of a synthetic store "
                             "(e.g. data/demo and data/features/demo; --branches must name its branches)")
    parser.add_argument("--store-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results as JSON here")
    add_output_arguments(parser, "grid")
    args = parser.parse_args(argv)
    quiet_machine_guard(args, Measures.TIME)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU")
    args.precision = args.precision or ("bf16-mixed" if args.device == "cuda" else "32-true")
    dims = {b: int(d) for b, d in (item.split("=") for item in args.branches.split(","))}
    unknown = set(dims) - set(BRANCH_MODALITY)
    if unknown:
        parser.error(f"--branches: unknown {sorted(unknown)}; choose from {sorted(BRANCH_MODALITY)}")
    if (args.dataset_dir is None) != (args.store_dir is None):
        parser.error("--dataset-dir and --store-dir go together")
    if args.dataset_dir is not None:
        root = (args.dataset_dir, args.store_dir)
        print(f"dataset {args.dataset_dir}, store {args.store_dir}")
    else:
        work = args.work or Path("/tmp") / f"empathic_grid_{canonical_hash([args.fraction, args.sessions, dims])}"
        began = time.perf_counter()
        write_synthetic(work, args.fraction, args.sessions, dims)
        root = (work / "dataset", work / "store")
        print(f"synthetic store {work} ({args.fraction:g} of EmpathicStories++) ready in {time.perf_counter() - began:.1f} s")

    device = torch.device(args.device)
    batched = datamodule(root, dims, "batched", args.batch_size, args.device_memory_gb)
    reference = datamodule(root, dims, "reference", args.batch_size, args.device_memory_gb)
    n_train = len(batched.datasets["train"])
    stored = batched.frames.nbytes() / 1e9
    if args.device == "cuda":  # place the arrays as training would (the trainer's device)
        batched.trainer = L.Trainer(accelerator="gpu", devices=1, logger=False)
    new_rate, new_cpu = loader_rate(batched, args.loader_batches)
    old_rate, old_cpu = loader_rate(reference, args.reference_batches)
    where = batched.frames.device
    window_bytes = FRAMES * sum(batched.input_dims[m] for m in batched.modalities) * 4  # float32 output per window
    bandwidth = copy_bandwidth(where)
    load = os.getloadavg()

    preloaded = [b for b in itertools.islice(batched.train_dataloader(), args.warmup + args.steps)]
    preloaded = [move_data_to_device(b, device) for b in preloaded]
    rows = []
    grid_windows = args.subsets * args.seeds * args.epochs * args.windows  # trained per model over the grid
    for name in args.models.split(","):
        end_to_end = train_rate(name, batched, args, None)
        pre = train_rate(name, batched, args, preloaded)
        row = {"model": name, "train_windows_per_s": end_to_end["rate"], "preloaded_windows_per_s": pre["rate"],
               "overhead": pre["rate"] / end_to_end["rate"], "peak_gpu_gib": end_to_end["peak_gpu_gib"],
               "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20,
               "grid_hours": grid_windows / end_to_end["rate"] / 3600}
        if args.concurrent > 1:
            together = concurrent_rate(name, root, dims, args)
            row.update({"concurrent_windows_per_s": together["rate"], "concurrent_runs_windows_per_s": together["runs"],
                        "concurrent_peak_gpu_gib": together["peak_gpu_gib"],
                        "concurrent_threads_per_run": together["threads_per_run"],
                        "concurrent_grid_hours": grid_windows / together["rate"] / 3600})
        rows.append(row)
    grid = sum(r["grid_hours"] for r in rows)
    written = new_rate * window_bytes / 1e9
    lines = [f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, batch {args.batch_size}, {FRAMES} frames, "
             f"branches {dims}, {args.precision}; {n_train} training windows; frame arrays {stored:.2f} GB on {where}; "
             f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min) after the loader runs, "
             f"torch threads {torch.get_num_threads()}", "",
             f"Loader only (training split, batch {args.batch_size}), windows/s:", "",
             "| | batched | reference WindowDataset | ratio |", "|---|---|---|---|",
             f"| per wall second | {new_rate:,.0f} | {old_rate:,.0f} | x{new_rate / old_rate:.1f} |",
             f"| per CPU second | {new_cpu:,.0f} | {old_cpu:,.0f} | x{new_cpu / old_cpu:.1f} |", "",
             f"The batched gather writes {written:.2f} GB/s of float32 windows; a tensor copy on {where} moves "
             f"{bandwidth:.1f} GB/s (read + write), so the gather's output runs at {written / (bandwidth / 2):.0%} of "
             "its write rate.", "",
             "| model | train windows/s (end to end) | pre-loaded windows/s | loader overhead (e2e/pre step time) "
             "| peak GPU GiB | peak RSS GiB | grid h |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        gpu = f"{r['peak_gpu_gib']:.2f}" if r["peak_gpu_gib"] is not None else "-"
        lines.append(f"| {r['model']} | {r['train_windows_per_s']:,.0f} | {r['preloaded_windows_per_s']:,.0f} | "
                     f"{r['overhead']:.3f}x | {gpu} | {r['peak_rss_gib']:.2f} | {r['grid_hours']:.2f} |")
    lines += ["", f"Grid ({len(rows)} models x {args.subsets} subsets x {args.seeds} seeds x {args.epochs} epochs x "
              f"{args.windows:,} windows, training only, runs in sequence on one device): {grid:.2f} h"]
    if args.concurrent > 1:
        lines += ["", f"{args.concurrent} runs at once on one device (separate processes, "
                  f"{rows[0]['concurrent_threads_per_run']} torch thread(s) each on CPU), aggregate over the span from "
                  "the first timed step to the last:", "",
                  "| model | one run windows/s | aggregate windows/s | speed-up | per-run windows/s | peak GPU GiB (sum) "
                  "| grid h |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            gpu = f"{r['concurrent_peak_gpu_gib']:.2f}" if r["concurrent_peak_gpu_gib"] is not None else "-"
            lines.append(f"| {r['model']} | {r['train_windows_per_s']:,.0f} | {r['concurrent_windows_per_s']:,.0f} | "
                         f"x{r['concurrent_windows_per_s'] / r['train_windows_per_s']:.2f} | "
                         f"{', '.join(f'{v:,.0f}' for v in r['concurrent_runs_windows_per_s'])} | {gpu} | "
                         f"{r['concurrent_grid_hours']:.2f} |")
        lines += ["", f"Grid with {args.concurrent} runs at once: {sum(r['concurrent_grid_hours'] for r in rows):.2f} h"]
    source = (f"dataset {args.dataset_dir}, store {args.store_dir}" if args.dataset_dir is not None
              else f"synthetic store at {args.fraction:g} of EmpathicStories++'s size")
    print("\n" + "\n".join(lines))
    write_results(args, f"Grid end to end from the feature store ({source})", "\n".join(lines))
    result = {"device": str(where), "args": {k: str(v) for k, v in vars(args).items()}, "load_average": load,
              "concurrent_grid_hours": sum(r["concurrent_grid_hours"] for r in rows) if args.concurrent > 1 else None,
              "loader": {"batched_windows_per_s": new_rate, "reference_windows_per_s": old_rate,
                         "batched_windows_per_cpu_s": new_cpu, "reference_windows_per_cpu_s": old_cpu,
                         "copy_bandwidth_gb_s": bandwidth, "window_bytes": window_bytes},
              "models": rows, "grid_hours": grid}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
