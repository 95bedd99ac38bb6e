"""Training speed of our TFN and EF-LSTM against MMSA's (thuiar/MMSA) at MMSA's own MOSI
hyperparameters and equal dims, plus our LF-LSTM and AMER on their own, on one device.

    OMP_NUM_THREADS=1 python benchmarks/models_vs_mmsa.py                 # CPU, 1 thread
    python benchmarks/models_vs_mmsa.py --steps 20 --threads 2            # CPU, 2 threads

Same batch for both sides (64 windows x 120 frames, text 384, audio 65, video 2762, random features
with a valid prefix per window as in benchmarks/train_throughput.py), same optimizer (AdamW, lr 1e-4),
MSE loss; one step = forward + backward + optimizer step. Our models run through EmpathyModule with
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


def our_step(name: str, overrides: dict[str, Any], dims: dict[str, int]) -> Callable[[dict], None]:
    module = fusion_module(name, MODALITIES, dims, **overrides).train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)

    def step(batch: dict) -> None:
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(module(batch), batch["target"]).backward()
        optimizer.step()
    return step


def mmsa_step(model: torch.nn.Module, pooled: bool) -> Callable[[dict], None]:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch: dict) -> None:
        text, audio, video = (batch[m]["x"] for m in ("text", "audio", "video"))
        if pooled:  # MMSA's TFN reads audio/video averaged over time, (B, 1, F)
            audio, video = audio.mean(dim=1, keepdim=True), video.mean(dim=1, keepdim=True)
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(text, audio, video)["M"].squeeze(-1), batch["target"]).backward()
        optimizer.step()
    return step


def interleaved(steps: dict[str, Callable[[dict], None]], batch: dict, n: int, warmup: int) -> dict[str, float]:
    """Seconds per step of each callable, taking turns (order reversed every round)."""
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name](batch)
    total = dict.fromkeys(names, 0.0)
    for i in range(n):
        for name in (names if i % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            steps[name](batch)
            total[name] += time.perf_counter() - start
    return {name: seconds / n for name, seconds in total.items()}


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    quiet_machine_guard(args, Measures.TIME)
    if args.threads:
        torch.set_num_threads(args.threads)
    dims = {"video": 2762, "audio": 65, "text": 384, "story": 384, "traits": 6}
    batch = SyntheticBatches(1, args.batch_size, args.frames, dims).batches[0]
    models = args.models.split(",")
    mmsa = import_mmsa(args.mmsa) if {"tfn", "ef_lstm"} & set(models) else None
    mmsa_args = {"feature_dims": (dims["text"], dims["audio"], dims["video"]), "train_mode": "regression",
                 "seq_lens": args.frames}
    lines = [f"cpu, {torch.get_num_threads()} threads, batch {args.batch_size} x {args.frames} frames, dims {dims}, "
             f"{args.steps} timed steps after {args.warmup} warm-up, {load()} at start", "",
             "| model | ours samples/s | MMSA samples/s | ours / MMSA | load (1/5/15 min) |",
             "|---|---|---|---|---|"]
    print("\n".join(lines))
    rows = []
    for name in models:
        torch.manual_seed(0)
        if name == "tfn":
            steps = {"ours": our_step("tfn", OUR_TFN, dims),
                     "mmsa": mmsa_step(mmsa.TFN(SimpleNamespace(**mmsa_args, **MMSA_TFN)), pooled=True)}
        elif name == "ef_lstm":
            steps = {"ours": our_step("ef_lstm", OUR_EF_LSTM, dims),
                     "mmsa": mmsa_step(mmsa.EF_LSTM(SimpleNamespace(**mmsa_args, **MMSA_EF_LSTM)), pooled=False)}
        else:  # no MMSA counterpart: our own speed with the conf/model settings
            steps = {"ours": our_step(name, {}, dims)}
        seconds = interleaved(steps, batch, args.steps, args.warmup)
        row = {"model": name, **{f"{k}_samples_per_s": args.batch_size / v for k, v in seconds.items()}}
        ours, theirs = row["ours_samples_per_s"], row.get("mmsa_samples_per_s")
        ratio = f"{ours / theirs:.2f}x" if theirs else "-"
        lines.append(f"| {name} | {ours:,.0f} | {f'{theirs:,.0f}' if theirs else '-'} | {ratio} | {load()} |")
        print(lines[-1], flush=True)
        rows.append(row)
    write_results(args, "Fusion models against MMSA's at equal dims", "\n".join(lines))
    return rows


if __name__ == "__main__":
    main()
