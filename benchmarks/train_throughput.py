"""Training throughput of each fusion model on synthetic features of the paper's size, and what the
paper's grid would take at that speed.

    python benchmarks/train_throughput.py --device cuda          # float32, as trainer=gpu (--precision bf16-mixed)
    python benchmarks/train_throughput.py --device cpu --steps 3 --batch-size 8 --frames 16   # quick check

Each model (conf/model/<name>.yaml, the paper's hyperparameters) trains through the same
FusionModule and Lightning Trainer as train.py on random windows with video+audio+text (batch 64,
120 frames, dims 2762 / 65 / 384, story 384 by default); batches come pinned from host memory as
from the datamodule, so host-to-device copies are included, store reads are not. Samples/s are
timed over `--steps` optimizer steps after `--warmup` steps; peak GPU memory is
torch.cuda.max_memory_allocated over the timed steps. The grid projection is training time only:
models x modality subsets x seeds x epochs x windows / samples/s, using the v+a+t speed for every
subset (fewer modalities train faster, so it is an upper bound on that part); validation and test
passes add their windows at the inference speed, also printed. The table goes to
docs/results/train_throughput.md (`--out` elsewhere, `--no-write` to print only; `--json` for the raw values).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from empathic_fusion.models.base import build_module  # noqa: E402
from empathic_fusion.models.fusion_module import FusionModule  # noqa: E402
from empathic_fusion.pipeline import run_config  # noqa: E402
from empathic_fusion.compose import compose_config  # noqa: E402
from results import (Measures, add_output_arguments, quiet_machine_guard, trained_fusion_models,  # noqa: E402
                     write_results)

MODALITIES = ("video", "audio", "text")


class SyntheticBatches(Dataset):
    """`n` copies of a few pre-made random batches in the datamodule's batch-dict contract."""

    def __init__(self, n: int, batch_size: int, frames: int, dims: dict[str, int], pool: int = 4, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.n = n
        self.batches = [self._batch(batch_size, frames, dims, generator) for _ in range(pool)]

    @staticmethod
    def _batch(batch_size: int, frames: int, dims: dict[str, int], generator: torch.Generator) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        for modality in MODALITIES:
            lengths = torch.randint(frames // 2, frames + 1, (batch_size,), generator=generator)
            mask = torch.arange(frames)[None, :] < lengths[:, None]
            x = torch.randn(batch_size, frames, dims[modality], generator=generator) * mask[..., None]
            batch[modality] = {"x": x, "mask": mask, "lengths": lengths}
        batch["story"] = torch.randn(batch_size, dims["story"], generator=generator)
        batch["traits"] = torch.randn(batch_size, dims["traits"], generator=generator)
        batch["traits_mask"] = torch.ones(batch_size, dims["traits"], dtype=torch.bool)
        batch["target"] = torch.rand(batch_size, generator=generator) * 2 - 1
        batch["rating_index"] = torch.arange(batch_size)
        return batch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.batches[i % len(self.batches)]


class StepTimer(L.Callback):
    """Wall time and peak GPU memory over the optimizer steps after the warm-up, counted across
    epochs (a small training split ends its epoch before the timed steps are done)."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.start: float | None = None
        self.stop: float | None = None
        self.timed_steps = 0
        self.seen = 0
        self.ends: list[float] = []  # time.perf_counter() at the end of every timed step (one clock for all processes)

    def _sync(self, module: L.LightningModule) -> None:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if self.seen == self.warmup:
            self._sync(module)
            if module.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(module.device)
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.seen += 1
        if self.seen > self.warmup:
            self._sync(module)
            self.stop = time.perf_counter()
            self.timed_steps = self.seen - self.warmup
            self.ends.append(self.stop)


def fusion_module(name: str, modalities: list[str], input_dims: dict[str, int],
                  module_overrides: dict[str, Any] | None = None, **net_overrides: Any) -> FusionModule:
    """conf/model/<name>.yaml's module, built as train.py builds it (module settings, e.g. compile, and net
    overrides applied)."""
    config = run_config(compose_config([f"model={name}"], ROOT / "logs" / "benchmarks"))
    model_cfg = config["model"]
    return build_module({**model_cfg, **(module_overrides or {}), "net": {**model_cfg["net"], **net_overrides}},
                        {"modalities": list(modalities), "input_dims": dict(input_dims)}, config)


def measure(name: str, args: argparse.Namespace, dims: dict[str, int]) -> dict[str, Any]:
    """Train one model for warmup + steps batches; samples/s, eval samples/s, peak memory, parameters."""
    L.seed_everything(0, workers=False)
    module = fusion_module(name, list(MODALITIES), dims)
    cuda = args.device == "cuda"
    precision = args.precision or "32-true"  # trainer=gpu's and trainer=cpu's
    timer = StepTimer(args.warmup)
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, precision=precision, max_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                        callbacks=[timer])
    data = SyntheticBatches(args.warmup + args.steps, args.batch_size, args.frames, dims)
    loader = DataLoader(data, batch_size=None, shuffle=False, pin_memory=cuda)
    trainer.fit(module, train_dataloaders=loader)
    train_sps = timer.timed_steps * args.batch_size / (timer.stop - timer.start)
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None

    device = torch.device("cuda" if cuda else "cpu")
    module = module.to(device).eval()
    batch = {k: ({kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict) else v.to(device))
             for k, v in data.batches[0].items()}
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision.startswith("bf16"))
    with torch.no_grad(), autocast:
        for _ in range(args.warmup):
            module(batch)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            module(batch)
        if cuda:
            torch.cuda.synchronize()
    eval_sps = args.steps * args.batch_size / (time.perf_counter() - start)
    return {"model": name, "train_samples_per_s": train_sps, "eval_samples_per_s": eval_sps,
            "peak_gpu_memory_gib": peak, "parameters": sum(p.numel() for p in module.parameters()),
            "precision": precision}


def project(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Hours for the grid: per model, subsets x seeds x epochs x windows at its training speed."""
    runs = args.subsets * args.seeds
    per_model = {}
    for row in rows:
        train_s = args.epochs * args.windows / row["train_samples_per_s"]
        eval_s = (args.epochs * args.val_fraction + args.test_fraction) * args.windows / row["eval_samples_per_s"]
        per_model[row["model"]] = {"train_hours": runs * train_s / 3600, "with_eval_hours": runs * (train_s + eval_s) / 3600}
    return {"runs_per_model": runs, "per_model": per_model,
            "train_hours": sum(v["train_hours"] for v in per_model.values()),
            "with_eval_hours": sum(v["with_eval_hours"] for v in per_model.values())}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu", "auto"), default="auto")
    parser.add_argument("--models", default=",".join(trained_fusion_models()),
                        help="comma-separated conf/model names (default: every trained fusion model)")
    parser.add_argument("--precision", default=None, help="Lightning precision (default: 32-true, as trainer=gpu and trainer=cpu)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--dims", default="video=2762,audio=65,text=384,story=384,traits=6")
    parser.add_argument("--steps", type=int, default=50, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--windows", type=int, default=99_357, help="training windows per epoch (Story Share)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--subsets", type=int, default=5, help="modality subsets in the grid")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--val-fraction", type=float, default=0.2, help="validation windows per epoch, as a fraction of --windows")
    parser.add_argument("--test-fraction", type=float, default=0.1)
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results as JSON here")
    add_output_arguments(parser, "train_throughput")
    args = parser.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU (install a CUDA build of torch)")
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    quiet_machine_guard(args, Measures.TIME)
    dims = {k: int(v) for k, v in (item.split("=") for item in args.dims.split(","))}
    rows = [measure(name, args, dims) for name in args.models.split(",")]
    grid = project(rows, args)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    lines = [f"{device}, batch {args.batch_size}, {args.frames} frames, dims {dims}, v+a+t, {rows[0]['precision']}; "
             f"{args.steps} timed steps after {args.warmup} warm-up", "",
             "| model | params | train samples/s | eval samples/s | peak GPU GiB | grid train h | grid h with val/test |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        peak = f"{row['peak_gpu_memory_gib']:.2f}" if row["peak_gpu_memory_gib"] is not None else "-"
        hours = grid["per_model"][row["model"]]
        lines.append(f"| {row['model']} | {row['parameters']:,} | {row['train_samples_per_s']:,.0f} | "
                     f"{row['eval_samples_per_s']:,.0f} | {peak} | {hours['train_hours']:.2f} | "
                     f"{hours['with_eval_hours']:.2f} |")
    lines += ["", f"Grid: {len(rows)} models x {args.subsets} subsets x {args.seeds} seeds x {args.epochs} epochs x "
              f"{args.windows:,} windows: {grid['train_hours']:.2f} h training, {grid['with_eval_hours']:.2f} h with "
              f"validation ({args.val_fraction:.0%}/epoch) and test ({args.test_fraction:.0%}), one device, runs in "
              "sequence (every subset at the v+a+t speed: an upper bound)."]
    print("\n" + "\n".join(lines))
    write_results(args, "Training throughput per fusion model", "\n".join(lines))
    result = {"device": device, "args": {k: str(v) for k, v in vars(args).items()}, "dims": dims,
              "models": rows, "grid": grid}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
