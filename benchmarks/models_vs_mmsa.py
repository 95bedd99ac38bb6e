"""Training speed of our TFN and EF-LSTM against MMSA's (thuiar/MMSA) at MMSA's own MOSI
hyperparameters and equal dims, plus our LF-LSTM and AMER on their own, on one device.

    OMP_NUM_THREADS=1 python benchmarks/models_vs_mmsa.py                 # CPU, 1 thread
    python benchmarks/models_vs_mmsa.py --steps 20 --threads 2            # CPU, 2 threads
    python benchmarks/models_vs_mmsa.py --device cuda --out docs/results/models_vs_mmsa_gpu.md
                                        # a GPU: fp32, fp32 with TF32 matmuls, bf16 autocast, bf16 weights

Same batch for both sides (64 windows x 120 frames, text 384, audio 65, video 2762, random features
with a valid prefix per window as in benchmarks/train_throughput.py), same optimizer (AdamW, lr 1e-4),
MSE loss; one step = forward + backward + optimizer step, in each `--precisions` (32: float32 matmuls
in full precision; 32-tf32: TF32 matmuls, torch.set_float32_matmul_precision("high"); bf16-mixed: bf16
autocast; bf16-true: weights and inputs in bf16). Each step's count of ATen ops that compute (views left
out; on a GPU about one kernel launch each) is given beside its time. Our models run through EmpathyModule with
the similarity head (story 384); MMSA's through their own output layer. MMSA's TFN takes audio and
video already time-averaged: the plain mean over time is part of its step, as the masked mean is
part of ours. Steps of the models being compared are interleaved in one process (ours, theirs,
theirs, ours, ...) so machine load hits both sides alike and the ratio stays fair on a shared machine.

MMSA's model files are read at run time from ../shared/anchors/mmsa (MIT; see its README): they are
copied to a temporary folder as a package, never into this project. The table goes to
docs/results/models_vs_mmsa.md (`--out` elsewhere, `--no-write` to print only).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import Measures, add_output_arguments, quiet_machine_guard, write_results  # noqa: E402
from train_throughput import SyntheticBatches, fusion_module  # noqa: E402

MMSA_DIR = ROOT.parent / "shared" / "anchors" / "mmsa"
MODALITIES = ["video", "audio", "text"]
# MMSA's MOSI defaults (config_regression.json), mapped onto our configs' names.
MMSA_TFN = {"hidden_dims": (128, 32, 128), "text_out": 32, "post_fusion_dim": 64, "dropouts": (0.3, 0.3, 0.3, 0.5)}
MMSA_EF_LSTM = {"hidden_dims": 128, "num_layers": 4, "dropout": 0.5}
OUR_TFN = {"hidden_sizes": {"text": 128, "audio": 32, "video": 128}, "text_out": 32, "post_fusion_dim": 64,
           "dropouts": {"audio": 0.3, "video": 0.3, "text": 0.3, "post_fusion": 0.5},
           "max_fused_size": 33 * 129 * 33}  # MMSA has no bound; 140,481 here
OUR_EF_LSTM = {"hidden_size": 128, "num_layers": 4, "dropout": 0.5}


def import_mmsa(source: Path = MMSA_DIR) -> Any:
    """MMSA's singleTask models as a package `mmsa_models`, from a temporary copy of `source`."""
    if not (source / "singleTask" / "TFN.py").is_file():
        raise FileNotFoundError(f"MMSA's model files are not at {source} (expected singleTask/TFN.py; "
                                "see ../shared/anchors/README.md)")
    package = Path(tempfile.mkdtemp(prefix="mmsa_")) / "mmsa_models"
    shutil.copytree(source, package)
    (package / "__init__.py").write_text("")
    (package / "singleTask" / "__init__.py").write_text("")
    (package / "subNets" / "__init__.py").write_text("from .FeatureNets import SubNet, TextSubNet\n")
    sys.path.insert(0, str(package.parent))
    import mmsa_models.singleTask.EF_LSTM as ef_lstm
    import mmsa_models.singleTask.TFN as tfn
    return SimpleNamespace(TFN=tfn.TFN, EF_LSTM=ef_lstm.EF_LSTM)


PRECISIONS = ("32", "32-tf32", "bf16-mixed", "bf16-true")


def _cast(batch: dict, dtype: torch.dtype | None) -> dict:
    """The batch with its float tensors in `dtype` (None: as they are)."""
    if dtype is None:
        return batch
    return {k: (_cast(v, dtype) if isinstance(v, dict) else v.to(dtype) if v.is_floating_point() else v)
            for k, v in batch.items()}


def _precision(precision: str, device: torch.device) -> tuple[Any, torch.dtype | None]:
    """(autocast context, dtype of the model and inputs) for a precision; sets the float32 matmul mode."""
    torch.set_float32_matmul_precision("high" if precision == "32-tf32" else "highest")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    return autocast, torch.bfloat16 if precision == "bf16-true" else None


def our_step(name: str, overrides: dict[str, Any], dims: dict[str, int], device: torch.device,
             precision: str) -> tuple[Callable[[dict], None], torch.nn.Module]:
    autocast, dtype = _precision(precision, device)
    module = fusion_module(name, MODALITIES, dims, **overrides).to(device).train()
    if dtype is not None:
        module = module.to(dtype)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)

    def step(batch: dict) -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = F.mse_loss(module(batch).float(), batch["target"].float())
        loss.backward()
        optimizer.step()
    return step, module


def mmsa_step(model: torch.nn.Module, pooled: bool, device: torch.device,
              precision: str) -> tuple[Callable[[dict], None], torch.nn.Module]:
    autocast, dtype = _precision(precision, device)
    model = model.to(device).train()
    if dtype is not None:
        model = model.to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch: dict) -> None:
        text, audio, video = (batch[m]["x"] for m in ("text", "audio", "video"))
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            if pooled:  # MMSA's TFN reads audio/video averaged over time, (B, 1, F)
                audio, video = audio.mean(dim=1, keepdim=True), video.mean(dim=1, keepdim=True)
            loss = F.mse_loss(model(text, audio, video)["M"].squeeze(-1).float(), batch["target"].float())
        loss.backward()
        optimizer.step()
    return step, model


class _OpCount(TorchDispatchMode):
    """ATen ops dispatched that compute (views, which only relabel memory, left out): on a GPU about one
    kernel launch each."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        returns = func._schema.returns
        view = bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write
        self.count += not view
        return func(*args, **(kwargs or {}))


def ops_per_step(step: Callable[[dict], None], batch: dict) -> int:
    with _OpCount() as ops:
        step(batch)
    return ops.count


def interleaved(steps: dict[str, Callable[[dict], None]], batch: dict, n: int, warmup: int,
                device: torch.device) -> dict[str, float]:
    """Seconds per step of each callable, taking turns (order reversed every round); on a GPU each step is
    timed with CUDA events (the host runs ahead of the device otherwise)."""
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name](batch)
    total = dict.fromkeys(names, 0.0)
    for i in range(n):
        for name in (names if i % 2 == 0 else names[::-1]):
            if device.type == "cuda":
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                steps[name](batch)
                stop.record()
                stop.synchronize()
                total[name] += start.elapsed_time(stop) / 1e3
            else:
                began = time.perf_counter()
                steps[name](batch)
                total[name] += time.perf_counter() - began
    return {name: seconds / n for name, seconds in total.items()}


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precisions", default=None,
                        help=f"comma-separated, of {list(PRECISIONS)} (default: 32 on cpu, all four on cuda)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--models", default="tfn,ef_lstm,lf_lstm,amer")
    parser.add_argument("--mmsa", type=Path, default=MMSA_DIR, help="folder with MMSA's singleTask/ and subNets/")
    add_output_arguments(parser, "models_vs_mmsa")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU")
    args.precisions = (args.precisions or ("32" if args.device == "cpu" else ",".join(PRECISIONS))).split(",")
    unknown = set(args.precisions) - set(PRECISIONS)
    if unknown:
        parser.error(f"--precisions: unknown {sorted(unknown)}; choose from {list(PRECISIONS)}")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    quiet_machine_guard(args, Measures.TIME)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dims = {"video": 2762, "audio": 65, "text": 384, "story": 384, "traits": 6}
    host_batch = SyntheticBatches(1, args.batch_size, args.frames, dims).batches[0]
    models = args.models.split(",")
    mmsa = import_mmsa(args.mmsa) if {"tfn", "ef_lstm"} & set(models) else None
    mmsa_args = {"feature_dims": (dims["text"], dims["audio"], dims["video"]), "train_mode": "regression",
                 "seq_lens": args.frames}
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    lines = [f"{where}, batch {args.batch_size} x {args.frames} frames, dims {dims}, {args.steps} timed steps after "
             f"{args.warmup} warm-up{' (CUDA events)' if device.type == 'cuda' else ''}, {load()} at start. "
             "ops/step: ATen ops that compute in one training step, views left out (about one kernel launch each on a "
             "GPU); the optimizer is AdamW on both sides.", "",
             "| precision | model | ours ms/step | MMSA ms/step | ours / MMSA speed | ours ops/step | MMSA ops/step | "
             "load (1/5/15 min) |", "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines))
    rows = []
    for precision in args.precisions:
        _, dtype = _precision(precision, device)
        batch = _cast({k: ({kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict) else v.to(device))
                       for k, v in host_batch.items()}, dtype)
        for name in models:
            torch.manual_seed(0)
            if name == "tfn":
                steps = {"ours": our_step("tfn", OUR_TFN, dims, device, precision)[0],
                         "mmsa": mmsa_step(mmsa.TFN(SimpleNamespace(**mmsa_args, **MMSA_TFN)), True, device, precision)[0]}
            elif name == "ef_lstm":
                steps = {"ours": our_step("ef_lstm", OUR_EF_LSTM, dims, device, precision)[0],
                         "mmsa": mmsa_step(mmsa.EF_LSTM(SimpleNamespace(**mmsa_args, **MMSA_EF_LSTM)), False, device,
                                           precision)[0]}
            else:  # no MMSA counterpart: our own speed with the conf/model settings
                steps = {"ours": our_step(name, {}, dims, device, precision)[0]}
            _precision(precision, device)
            seconds = interleaved(steps, batch, args.steps, args.warmup, device)
            ops = {side: ops_per_step(step, batch) for side, step in steps.items()}
            row = {"precision": precision, "model": name, **{f"{k}_ms": v * 1e3 for k, v in seconds.items()},
                   **{f"{k}_ops": v for k, v in ops.items()}}
            ours, theirs = row["ours_ms"], row.get("mmsa_ms")
            ratio = f"{theirs / ours:.2f}x" if theirs else "-"
            lines.append(f"| {precision} | {name} | {ours:.2f} | {f'{theirs:.2f}' if theirs else '-'} | {ratio} | "
                         f"{row['ours_ops']} | {row.get('mmsa_ops', '-')} | {load()} |")
            print(lines[-1], flush=True)
            rows.append(row)
    torch.set_float32_matmul_precision("highest")
    lines += ["", "ours / MMSA speed: MMSA's ms per step over ours (above 1: ours is faster)."]
    write_results(args, "Fusion models against MMSA's at equal dims", "\n".join(lines))
    return rows


if __name__ == "__main__":
    main()
