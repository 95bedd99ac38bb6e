"""A torch.profiler trace of a few training steps, eager and graphed, summarised: where a step's time goes.

    python benchmarks/step_profile.py --device cuda                  # TFN, the paper's dims, on a GPU
    python benchmarks/step_profile.py --device cpu --steps 3 --batch-size 8 --no-write   # try it on a CPU

Each model trains through FusionModule and the Lightning Trainer on synthetic batches already on the device
(benchmarks/train_throughput.py), once as usual (eager) and once with `model.step_graph=true`; after the warm-up
(`--warmup` steps, which include the graph's capture) `--steps` steps are profiled. Per step: the kernels the
device ran and their time, the host's time in ATen ops and in the step, the device's idle share of the step's
wall time (launch gaps: a step bound by launches leaves the device idle between short kernels), and the ops
with the most device time. The table goes to docs/results/gpu/step_profile.md (`--out`; `--no-write` prints).
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import Measures, add_output_arguments, quiet_machine_guard, write_results  # noqa: E402
from train_throughput import MODALITIES, SyntheticBatches, fusion_module  # noqa: E402

DIMS = {"video": 2762, "audio": 65, "text": 384, "story": 384, "traits": 6}


class Profiled(L.Callback):
    """torch.profiler around the training steps after `warmup`, for `steps` steps; the wall time of those steps."""

    def __init__(self, warmup: int, steps: int, device: torch.device):
        self.warmup, self.steps, self.device = warmup, steps, device
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.profiler = profile(activities=activities)
        self.began = self.wall = 0.0
        self.done = 0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step == self.warmup:
            self._sync()
            self.profiler.__enter__()
            self.began = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if self.warmup <= trainer.global_step - 1 < self.warmup + self.steps:
            self.done += 1
            if self.done == self.steps:
                self._sync()
                self.wall = time.perf_counter() - self.began
                self.profiler.__exit__(None, None, None)


def profile_run(name: str, graphed: bool, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    torch.manual_seed(0)
    module = fusion_module(name, list(MODALITIES), DIMS, module_overrides={"step_graph": graphed})
    data = SyntheticBatches(args.warmup + args.steps, args.batch_size, args.frames, DIMS)
    data.batches = [{k: ({kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict) else v.to(device))
                     for k, v in b.items()} for b in data.batches]
    callback = Profiled(args.warmup, args.steps, device)
    trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, precision=args.precision,
                        max_steps=args.warmup + args.steps, max_epochs=-1, logger=False, limit_val_batches=0,
                        num_sanity_val_steps=0, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback])
    trainer.fit(module, train_dataloaders=DataLoader(data, batch_size=None))
    return summarise(callback, args.steps, device)


def device_work(events: list) -> list:
    """The device's own work among a trace's events: kernels, copies and fills, without the profiler ranges
    (`record_function`, e.g. `Optimizer.step#AdamW.step`) that a trace also places on the device's timeline."""
    return [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
            and not getattr(e, "is_user_annotation", False)]


def busy_us(work: list) -> float:
    """Microseconds the device ran anything: the union of the work's intervals (kernels on several streams
    overlap, so their summed times may exceed the wall time)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted((e.time_range.start, e.time_range.end) for e in work):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def summarise(callback: Profiled, steps: int, device: torch.device) -> dict[str, Any]:
    """Per step: device kernels and their time, host time in ATen ops, wall time, the device's idle share."""
    events = callback.profiler.events()
    kernels = device_work(events)
    device_us = sum(e.device_time for e in kernels)
    host_ops = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("aten::")]
    top = collections.Counter()
    for e in kernels:
        top[e.name[:60]] += e.device_time
    wall_ms = callback.wall * 1e3 / steps
    busy_ms = busy_us(kernels) / 1e3 / steps
    return {"kernels": len(kernels) / steps, "device_ms": device_us / 1e3 / steps,
            "host_ops": len(host_ops) / steps, "wall_ms": wall_ms,
            "idle": max(0.0, 1 - busy_ms / wall_ms) if kernels and wall_ms else None,
            "top": [(n, t / 1e3 / steps) for n, t in top.most_common(5)], "device": str(device)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--models", default="tfn,ef_lstm")
    parser.add_argument("--steps", type=int, default=10, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=8, help="steps before (the graph is captured in them)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--precision", default="32-true", help="Lightning precision")
    add_output_arguments(parser, "gpu/step_profile")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    quiet_machine_guard(args, Measures.TIME)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    lines = [f"{where}, batch {args.batch_size} x {args.frames} frames, dims {DIMS}, {args.precision}; {args.steps} "
             f"steps profiled after {args.warmup} through the Lightning Trainer, per step. idle: the share of a "
             "step's wall time the device ran no kernel (launch gaps, host work), from the union of the kernels' intervals; "
             "device ms: the kernels' summed times; profiler ranges are no kernels and are left out.", "",
             "| model | step | wall ms | device kernels | device ms | idle | host ATen ops | most device time (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    results = {}
    for name in args.models.split(","):
        for graphed in (False, True):
            got = results[f"{name}/{'graphed' if graphed else 'eager'}"] = profile_run(name, graphed, args, device)
            idle = f"{got['idle']:.0%}" if got["idle"] is not None else "-"
            top = ", ".join(f"{n} {t:.2f}" for n, t in got["top"]) or "-"
            lines.append(f"| {name} | {'graphed' if graphed else 'eager'} | {got['wall_ms']:.2f} | {got['kernels']:.0f} | "
                         f"{got['device_ms']:.2f} | {idle} | {got['host_ops']:.0f} | {top} |")
            print(lines[-1], flush=True)
    write_results(args, "A training step profiled, eager and graphed", "\n".join(lines))
    return results


if __name__ == "__main__":
    main()
