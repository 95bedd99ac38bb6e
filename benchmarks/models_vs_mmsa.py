"""Training speed of our TFN and EF-LSTM against MMSA's (thuiar/MMSA) at MMSA's own MOSI
hyperparameters and equal dims, plus our LF-LSTM and AMER on their own, on one device.

    OMP_NUM_THREADS=1 python benchmarks/models_vs_mmsa.py                 # CPU, 1 thread
    python benchmarks/models_vs_mmsa.py --steps 20 --threads 2            # CPU, 2 threads
    python benchmarks/models_vs_mmsa.py --device cuda --out docs/results/models_vs_mmsa_gpu.md
                                        # a GPU: fp32, fp32 with TF32 matmuls, bf16 autocast, bf16 weights

Same batch for both sides (64 windows x 120 frames, text 384, audio 65, video 2762, random features
with a valid prefix per window as in benchmarks/train_throughput.py), same optimizer (AdamW, lr 1e-4,
fused as on a GPU), MSE loss; one step = forward + backward + optimizer step, in each `--precisions` (32:
float32 matmuls in full precision; 32-tf32: TF32 matmuls, torch.set_float32_matmul_precision("high");
bf16-mixed: bf16 autocast; bf16-true: weights and inputs in bf16) and, for ours, each `--modes`: eager,
compiled (`model.compile=true`) and graphed (`model.step_graph=true`, the whole step one CUDA graph).
Each side's kernels per eager step (benchmarks/kernel_count.py) are given beside its time, per part (net,
masks, norms, head, loss, optimizer: forward+backward), so where a side spends its launches shows. Our models run
through FusionModule with the similarity head (story 384); MMSA's through their own output layer. MMSA's TFN takes audio and
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import kernel_count  # noqa: E402
from empathic_fusion.models.step_graph import GraphedStep, rate_on_device  # noqa: E402
from results import (Measures, add_output_arguments, quiet_machine_guard, trained_fusion_models,  # noqa: E402
                     write_results)
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


class Side:
    """One side of a comparison: a model, its forward (a batch -> one prediction per window, under the precision's
    autocast) and its training step (forward, MSE, backward, AdamW fused as on a GPU), whose kernels
    `kernels()` counts per part (benchmarks/kernel_count.py)."""

    def __init__(self, model: torch.nn.Module, forward: Callable[[dict], torch.Tensor], device: torch.device,
                 precision: str, module_parts: dict[type, str] | None = None):
        autocast, dtype = _precision(precision, device)
        self.model = model.to(device).train()
        if dtype is not None:
            self.model = self.model.to(dtype)
        self.module_parts = module_parts
        self.autocast = autocast
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)

        def predict(batch: dict) -> torch.Tensor:
            with autocast:
                return forward(batch)
        self.forward = predict

    def step(self, batch: dict) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        kernel_count.mse(self.forward(batch), batch).backward()
        self.optimizer.step()

    def kernels(self, batch: dict) -> kernel_count.KernelCount:
        return kernel_count.step_kernels(self.model, batch, kernel_count.mse, forward=self.forward,
                                         module_parts=self.module_parts, optimizer=self.optimizer)


def our_side(name: str, overrides: dict[str, Any], dims: dict[str, int], device: torch.device, precision: str) -> Side:
    module = fusion_module(name, MODALITIES, dims, **overrides)
    return Side(module, lambda batch: module(batch), device, precision)


def mmsa_side(model: torch.nn.Module, pooled: bool, device: torch.device, precision: str) -> Side:
    """MMSA's net; its BatchNorm is the norms part and its output layer the head (as our heads are)."""
    def forward(batch: dict) -> torch.Tensor:
        text, audio, video = (batch[m]["x"] for m in ("text", "audio", "video"))
        if pooled:  # MMSA's TFN reads audio/video averaged over time, (B, 1, F)
            audio, video = audio.mean(dim=1, keepdim=True), video.mean(dim=1, keepdim=True)
        return model(text, audio, video)["M"].squeeze(-1)
    head = getattr(model, "post_fusion_layer_3", None) or model.out  # TFN's, EF_LSTM's
    return Side(model, forward, device, precision, module_parts={torch.nn.BatchNorm1d: "norms", head: "head"})


def parts_text(count: kernel_count.KernelCount) -> str:
    """e.g. "net 50+47, norms 33+9, head 9+6, loss 1+2, optimizer 2" (forward+backward)."""
    return ", ".join(f"{part} {f}+{b}" if part != "optimizer" else f"{part} {f}" for part, (f, b) in count.table().items())


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
    parser.add_argument("--models", default=",".join(trained_fusion_models()))
    parser.add_argument("--modes", default=None,
                        help=f"comma-separated, of {list(MODES)} (default: eager on cpu, all three on cuda)")
    parser.add_argument("--mmsa", type=Path, default=MMSA_DIR, help="folder with MMSA's singleTask/ and subNets/")
    add_output_arguments(parser, "models_vs_mmsa")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU")
    args.precisions = (args.precisions or ("32" if args.device == "cpu" else ",".join(PRECISIONS))).split(",")
    args.modes = (args.modes or ("eager" if args.device == "cpu" else ",".join(MODES))).split(",")
    if set(args.modes) - set(MODES) or "eager" not in args.modes:
        parser.error(f"--modes: of {list(MODES)}, eager among them")
    unknown = set(args.precisions) - set(PRECISIONS)
    if unknown:
        parser.error(f"--precisions: unknown {sorted(unknown)}; choose from {list(PRECISIONS)}")
    return args


def graphed_step(side: Side) -> Callable[[dict], None]:
    """Our whole step (forward, MSE, backward, AdamW) through models/step_graph.py's GraphedStep: captured as one
    CUDA graph after its warm-up on a GPU, eager on a CPU (the module's `model.step_graph=true` without Lightning)."""
    def body(batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        pred = side.forward(batch)
        return kernel_count.mse(pred, batch), {"pred": pred}

    rate_on_device(side.optimizer)
    return GraphedStep(body, side.optimizer, torch.zeros(2, device=next(side.model.parameters()).device))


def compiled_step(side: Side, device: torch.device) -> Callable[[dict], None]:
    """Our step with the net and head through torch.compile, as `model.compile=true` runs them (reduce-overhead:
    CUDA graphs of the forward and backward on a GPU; the optimizer eager)."""
    scores = torch.compile(side.model.scores, mode="reduce-overhead" if device.type == "cuda" else "default",
                           dynamic=False)
    autocast = side.autocast

    def step(batch: dict) -> None:
        side.optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        with autocast:
            pred = scores(batch)
        kernel_count.mse(pred, batch).backward()
        side.optimizer.step()
    return step


MODES = ("eager", "compiled", "graphed")


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
    modes = [m for m in MODES if m in args.modes]
    lines = [f"{where}, batch {args.batch_size} x {args.frames} frames, dims {dims}, {args.steps} timed steps after "
             f"{args.warmup} warm-up{' (CUDA events)' if device.type == 'cuda' else ''}, {load()} at start. "
             "One step: forward, MSE, backward, AdamW (fused on both sides). Ours eager, compiled (`model.compile=true`: "
             "the net and head through torch.compile) and graphed (`model.step_graph=true`: the whole step as one CUDA "
             "graph; on a CPU the same function runs eagerly); MMSA's eager. kernels: kernel-launching ATen ops of "
             "one eager step (benchmarks/kernel_count.py: views, allocations and host reads left out), per part as "
             "forward+backward; inside a graph they launch as one.", "",
             "| precision | model | " + " | ".join(f"ours {m} ms" for m in modes) + " | MMSA ms | ours eager / MMSA "
             "speed | " + ("ours graphed / MMSA speed | " if "graphed" in modes else "") + "ours kernels | MMSA kernels | "
             "ours per part | MMSA per part | load (1/5/15 min) |",
             "|---|---|" + "---|" * (len(modes) + 7 + ("graphed" in modes))]
    print("\n".join(lines))
    rows = []
    for precision in args.precisions:
        _, dtype = _precision(precision, device)
        batch = _cast({k: ({kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict) else v.to(device))
                       for k, v in host_batch.items()}, dtype)
        for name in models:
            sides = {}
            for mode in modes:  # a model of its own per mode: each trains its own weights
                torch.manual_seed(0)
                side = our_side(name, {"tfn": OUR_TFN, "ef_lstm": OUR_EF_LSTM}.get(name, {}), dims, device, precision)
                sides[f"ours {mode}"] = side
            theirs = None
            if name in ("tfn", "ef_lstm"):
                torch.manual_seed(0)
                net = (mmsa.TFN(SimpleNamespace(**mmsa_args, **MMSA_TFN)) if name == "tfn"
                       else mmsa.EF_LSTM(SimpleNamespace(**mmsa_args, **MMSA_EF_LSTM)))
                theirs = mmsa_side(net, name == "tfn", device, precision)
            steps = {label: (side.step if label == "ours eager" else graphed_step(side) if label == "ours graphed"
                             else compiled_step(side, device)) for label, side in sides.items()}
            if theirs is not None:
                steps["mmsa"] = theirs.step
            _precision(precision, device)
            seconds = interleaved(steps, batch, args.steps, args.warmup, device)
            counts = {"ours": sides["ours eager"].kernels(batch)}  # counting takes one more (eager) step
            if theirs is not None:
                counts["mmsa"] = theirs.kernels(batch)
            row = {"precision": precision, "model": name, **{f"{k}_ms": v * 1e3 for k, v in seconds.items()},
                   **{f"{k}_kernels": c.total for k, c in counts.items()},
                   **{f"{k}_parts": {p: list(fb) for p, fb in c.table().items()} for k, c in counts.items()}}
            mmsa_ms = row.get("mmsa_ms")
            speed = (lambda ours: f"{mmsa_ms / ours:.2f}x" if mmsa_ms else "-")
            cells = [f"{row[f'ours {m}_ms']:.2f}" for m in modes]
            graphed = [speed(row["ours graphed_ms"])] if "graphed" in modes else []
            lines.append(f"| {precision} | {name} | " + " | ".join(cells) + f" | {f'{mmsa_ms:.2f}' if mmsa_ms else '-'} | "
                         + " | ".join([speed(row["ours eager_ms"]), *graphed])
                         + f" | {row['ours_kernels']} | {row.get('mmsa_kernels', '-')} | {parts_text(counts['ours'])} | "
                         f"{parts_text(counts['mmsa']) if 'mmsa' in counts else '-'} | {load()} |")
            print(lines[-1], flush=True)
            rows.append(row)
    torch.set_float32_matmul_precision("highest")
    lines += ["", "speed: MMSA's ms per step over ours (above 1: ours is faster). MMSA's norms are BatchNorm1d over "
              "frame positions (all frames, masks ignored), its nets read no mask and its head is one linear layer; "
              "ours are masked per-feature norms, masks (pooling over the valid frames, masked frames zeroed, each "
              "window's last valid LSTM state) and the paper's similarity head, so those parts cost more kernels by "
              "design: the per-part columns show where each side's kernels go."]
    write_results(args, "Fusion models against MMSA's at equal dims", "\n".join(lines))
    return rows


if __name__ == "__main__":
    main()
