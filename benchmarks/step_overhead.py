"""What a training step costs beyond its network, per fusion model, on the CPU or a GPU.

    OMP_NUM_THREADS=1 python benchmarks/step_overhead.py --baseline d424cec    # CPU, before and after
    python benchmarks/step_overhead.py --device cuda --out docs/results/step_overhead_gpu.md

The same training step, four ways, timed in turn in one process:
- net: the bare network and head (forward, MSE, backward, AdamW step): the floor;
- training_step: FusionModule.training_step called directly, without a Trainer (what the module adds);
- trainer: the Lightning Trainer as train.py builds it (the trainer group's settings, no logger, no
  checkpoints, no progress bar, as in a batch job) over batches already on the device (what the loop adds);
- store: that Trainer on the datamodule over a synthetic feature store in the real format (what the
  loader adds), with its frame arrays where train.py puts them (in a GPU's memory; out of core on a CPU).
With `--graphed`, the trainer and store modes again with `model.step_graph=true`: the whole step (and, with
the frames in a GPU's memory, the batch's gather) one CUDA graph; on a CPU the same step function, eagerly.
At `tiny` dims (small inputs, short windows, small batches: the models' own layers, where fixed costs
show as they do on a GPU) and at the paper's dims; ms per step and the ratio to the net's, with the host syncs per training step
(benchmarks/host_syncs.py). With `--baseline REF` the package at git REF (a temporary worktree) is
measured too, in alternating subprocess rounds with the checkout's, so the file shows before and after.
The table goes to docs/results/step_overhead.md (`--out` elsewhere, `--no-write` to print only).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = ("net", "training_step", "trainer", "store")
COMPILED = "trainer, compiled"  # with --compile: the trainer mode with model.compile=true
GRAPHED = ("trainer, graphed", "store, graphed")  # with --graphed: model.step_graph=true (the step one CUDA graph)
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"batch": 8, "frames": 16, "dims": {"video": 16, "audio": 8, "text": 16, "story": 384, "traits": 6},
             "branches": {"face": 16, "audio": 8, "text": 16}, "fraction": 0.005},
    "paper": {"batch": 64, "frames": 120, "dims": {"video": 2762, "audio": 65, "text": 384, "story": 384, "traits": 6},
              "branches": {"face": 714, "cnn": 2048, "audio": 65, "text": 384}, "fraction": 0.01},
}


# ---- one round, in a worker process (the checkout's package or the baseline's) ---------------------
def _worker(args: argparse.Namespace) -> dict[str, Any]:
    """Every size x model x mode once (`--warmup` + `--steps` steps each), on the package in
    --package-root; host syncs per step where --count-syncs."""
    sys.path.insert(0, str(args.package_root))
    import empathic_fusion  # noqa: F401  (the measured package, before any benchmark module puts ROOT first)

    sys.path.insert(1, str(ROOT / "benchmarks"))
    import lightning as L
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from host_syncs import SyncsPerStep
    from train_throughput import StepTimer, SyntheticBatches

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    stores = json.loads(args.stores)
    counted = max(1, min(args.sync_steps, args.steps - 1))  # within the timed steps: not the epoch's end
    out: dict[str, Any] = {}

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def on_device(batch: dict) -> dict:
        return {k: ({kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict) else v.to(device))
                for k, v in batch.items()}

    def timed(step, batches: list[dict]) -> float:
        for i in range(args.warmup):
            step(batches[i % len(batches)], i)
        sync()
        start = time.perf_counter()
        for i in range(args.steps):
            step(batches[i % len(batches)], i)
        sync()
        return (time.perf_counter() - start) / args.steps * 1e3

    import hydra

    from empathic_fusion.compose import compose_config

    trainer_cfg = compose_config([f"trainer={'gpu' if device.type == 'cuda' else 'cpu'}"],
                                 Path(tempfile.gettempdir())).trainer
    trainer_precision = str(trainer_cfg.precision)  # the bare-net modes use the same precision as the Trainer

    def trainer(callbacks: list, steps: int) -> L.Trainer:
        cfg = trainer_cfg
        overrides = {"max_steps": steps, "max_epochs": -1, "limit_val_batches": 0, "num_sanity_val_steps": 0,
                     "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
                     **({"precision": args.precision} if args.precision else {})}
        return hydra.utils.instantiate(cfg, callbacks=callbacks, logger=False, **overrides)

    for size_name in args.sizes.split(","):
        size = SIZES[size_name]
        dims = size["dims"]
        prebuilt = SyntheticBatches(10_000, size["batch"], size["frames"], dims)  # 4 batches, handed out in turn
        prebuilt.batches = batches = [on_device(b) for b in prebuilt.batches]
        for name in args.models.split(","):
            key = f"{size_name}/{name}"
            out[key] = {}
            compiling = args.compile and name in args.compile_models.split(",")
            for mode in MODES + ((COMPILED,) if compiling else ()) + (GRAPHED if args.graphed else ()):
                module = _module(name, dims, compiled=mode == COMPILED, graphed=mode in GRAPHED).to(device).train()
                if mode in ("net", "training_step"):
                    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
                    autocast = torch.autocast(device.type, dtype=torch.bfloat16,
                                              enabled="bf16" in (args.precision or trainer_precision))

                    def step(batch, i, module=module, optimizer=optimizer, mode=mode, autocast=autocast):
                        with autocast:
                            if mode == "net":
                                loss = F.mse_loss(module.head(module.net(batch), batch["story"]), batch["target"])
                            else:
                                loss = module.training_step(batch, i)
                        loss.backward()
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                    out[key][mode] = timed(step, batches)
                    continue
                timer = StepTimer(args.warmup)
                counting = SyncsPerStep(device, skip=args.warmup, steps=counted) if args.count_syncs else None
                fit = trainer([timer] + ([counting] if counting else []), args.warmup + args.steps)
                if mode == COMPILED:
                    try:  # torch.compile's failure is reported in the table, not the end of the measurement
                        fit.fit(module, train_dataloaders=DataLoader(prebuilt, batch_size=None))
                    except Exception as error:  # noqa: BLE001
                        out[key][f"{COMPILED} error"] = f"{type(error).__name__}: {str(error)[:300]}"
                        continue
                elif mode in ("trainer", GRAPHED[0]):
                    fit.fit(module, train_dataloaders=DataLoader(prebuilt, batch_size=None))
                else:
                    dm = _datamodule(stores[size_name], size, fit)
                    fit.fit(module, datamodule=dm)
                out[key][mode] = (timer.stop - timer.start) / timer.timed_steps * 1e3
                if counting is not None and len(counting.counts) == counted:
                    out[key][f"{mode}_syncs"] = sum(counting.counts) / counted
                    out[key][f"{mode}_sync_sites"] = dict(counting.by_caller.most_common(4))
    return out


def _module(name: str, dims: dict[str, int], compiled: bool = False, graphed: bool = False):
    """conf/model/<name>.yaml's module (the model's own layers), built as train.py builds it, seeded;
    `compiled`: with model.compile=true; `graphed`: with model.step_graph=true."""
    import torch
    from train_throughput import fusion_module

    torch.manual_seed(0)
    return fusion_module(name, ["video", "audio", "text"], dims,
                         {**({"compile": True} if compiled else {}), **({"step_graph": True} if graphed else {})})


def _datamodule(root: str, size: dict[str, Any], trainer):
    """The training datamodule over a synthetic store, placed for `trainer`'s device (as train.py does)."""
    from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule

    modalities: dict[str, list[str]] = {}
    for branch in size["branches"]:
        modalities.setdefault({"face": "video", "cnn": "video"}.get(branch, branch), []).append(branch)
    features = {"modalities": modalities}
    dm = FusionDataModule(str(Path(root) / "dataset"), str(Path(root) / "store"), list(modalities), features,
                           name="step_overhead", window_frames=size["frames"], batch_size=size["batch"],
                           extract_workers=1, split_fractions=(0.8, 0.1, 0.1))
    dm.prepare_data = lambda: None  # the synthetic store has no media to extract from
    dm.trainer = trainer
    dm.setup("fit")
    return dm


# ---- the parent: stores, rounds, report ------------------------------------------------------------
def _stores(args: argparse.Namespace, work: Path) -> dict[str, str]:
    sys.path.insert(0, str(ROOT))
    from benchmarks.grid import write_synthetic

    stores = {}
    for size_name in args.sizes.split(","):
        size = SIZES[size_name]
        root = work / f"store_{size_name}"
        write_synthetic(root, size["fraction"], 10, size["branches"], story_dim=size["dims"]["story"])
        stores[size_name] = str(root)
    return stores


def _baseline_tree(ref: str, work: Path) -> Path:
    tree = work / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), ref], cwd=ROOT, check=True, capture_output=True)
    return tree


def _round(args: argparse.Namespace, tree: Path, stores: dict[str, str], count_syncs: bool) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--package-root", str(tree),
               "--stores", json.dumps(stores), "--device", args.device, "--sizes", args.sizes, "--models", args.models,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--sync-steps", str(args.sync_steps),
               *(["--threads", str(args.threads)] if args.threads else []),
               *(["--precision", args.precision] if args.precision else []),
               *(["--compile", "--compile-models", args.compile_models] if args.compile and tree == ROOT else []),
               *(["--graphed"] if args.graphed and tree == ROOT else []),
               *(["--count-syncs"] if count_syncs else [])]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tree,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))})
    if done.returncode != 0:
        raise SystemExit(f"a measuring round failed ({tree}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per size/model: the median over rounds of each mode's ms per step, and the syncs counted."""
    out: dict[str, dict[str, float]] = {}
    for key in rounds[0]:
        out[key] = {mode: statistics.median(r[key][mode] for r in rounds) for mode in (*MODES, COMPILED, *GRAPHED)
                    if mode in rounds[0][key]}
        for r in rounds:
            out[key].update({k: v for k, v in r[key].items() if k.endswith(("_syncs", "_sync_sites", " error"))})
    return out


def _table(summary: dict[str, dict[str, float]], size: str) -> list[str]:
    compiled = any(COMPILED in row for row in summary.values())
    graphed = any(GRAPHED[0] in row for row in summary.values())
    lines = ["| model | net ms | training_step ms | trainer ms | store ms | training_step / net | trainer / net | "
             "store / net |" + (" compiled trainer ms | compiled / net |" if compiled else "")
             + (" graphed trainer ms | graphed store ms | graphed trainer / net | graphed store / net |" if graphed else "")
             + " host syncs per step (trainer, store) |", "|---|---|---|---|---|---|---|---|" + "---|" * (2 * compiled)
             + "---|" * (4 * graphed) + "---|"]
    for key, row in summary.items():
        if not key.startswith(f"{size}/"):
            continue
        syncs = ", ".join(f"{row[m]:g}" if f"{m}" in row else "-" for m in ("trainer_syncs", "store_syncs"))
        extra = (f" {row[COMPILED]:.2f} | {row[COMPILED] / row['net']:.2f}x |" if COMPILED in row else " - | - |"
                 ) if compiled else ""
        if graphed:
            extra += (f" {row[GRAPHED[0]]:.2f} | {row[GRAPHED[1]]:.2f} | {row[GRAPHED[0]] / row['net']:.2f}x | "
                      f"{row[GRAPHED[1]] / row['net']:.2f}x |" if GRAPHED[0] in row else " - | - | - | - |")
        lines.append(f"| {key.split('/')[1]} | {row['net']:.2f} | {row['training_step']:.2f} | {row['trainer']:.2f} | "
                     f"{row['store']:.2f} | {row['training_step'] / row['net']:.2f}x | {row['trainer'] / row['net']:.2f}x | "
                     f"{row['store'] / row['net']:.2f}x |{extra} {syncs} |")
    return lines


def _sites(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Where the counted syncs came from (file:line outside torch), per model and size."""
    lines = []
    for key, row in summary.items():
        for mode in ("trainer", "store"):
            sites = row.get(f"{mode}_sync_sites") or {}
            if sites:
                lines.append(f"- {key} ({mode}): " + ", ".join(f"{site} x{n}" for site, n in sites.items()))
    return lines


def report(args: argparse.Namespace, after: dict, before: dict | None) -> list[str]:
    import torch

    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    precision = args.precision or "the trainer group's (32-true)"
    lines = [f"{device}, torch threads {args.threads or torch.get_num_threads()}, {precision}; median over "
             f"{args.rounds} rounds of {args.steps} timed steps after {args.warmup} warm-up; host syncs counted over "
             f"{max(1, min(args.sync_steps, args.steps - 1))} steps ({'CUDA sync debug mode' if args.device == 'cuda' else 'CPU proxy: ops that read a device value on the host'})", ""]
    for size in args.sizes.split(","):
        spec = SIZES[size]
        lines += [f"### {size} dims: batch {spec['batch']} x {spec['frames']} frames, inputs {spec['dims']}, "
                  "the models' own layers (conf/model)", ""]
        if before is not None:
            lines += [f"Before ({args.baseline}):", "", *_table(before, size), "", "After (this checkout):", ""]
        lines += [*_table(after, size), ""]
    if before is not None:
        lines += ["Trainer step / bare net, before and after:", "", "| size | model | before | after |", "|---|---|---|---|"]
        for key, row in after.items():
            size, model = key.split("/")
            lines.append(f"| {size} | {model} | {before[key]['trainer'] / before[key]['net']:.2f}x | "
                         f"{row['trainer'] / row['net']:.2f}x |")
        lines.append("")
    errors = [f"- {key}: {row[f'{COMPILED} error']}" for key, row in after.items() if f"{COMPILED} error" in row]
    if errors:
        lines += ["model.compile=true failed:", "", *errors, ""]
    sites = _sites(after)
    if sites:
        lines += ["Where the remaining host syncs are (after):", "", *sites, ""]
    if before is not None and _sites(before):
        lines += ["Where they were (before):", "", *_sites(before), ""]
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results import trained_fusion_models

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--models", default=",".join(trained_fusion_models()))
    parser.add_argument("--sizes", default="tiny,paper", help=f"of {list(SIZES)}")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per package, alternated with the baseline's")
    parser.add_argument("--sync-steps", type=int, default=10, help="training steps over which host syncs are counted")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--precision", default=None, help="Lightning precision (default: the trainer group's)")
    parser.add_argument("--compile", action="store_true",
                        help="also the trainer mode with model.compile=true (reduce-overhead on a GPU)")
    parser.add_argument("--compile-models", default="tfn,ef_lstm", help="the models --compile measures")
    parser.add_argument("--graphed", action="store_true",
                        help="also the trainer and store modes with model.step_graph=true (one CUDA graph per step)")
    parser.add_argument("--baseline", default=None, help="git ref to measure beside the checkout (before/after)")
    parser.add_argument("--work", type=Path, default=None, help="where the synthetic stores go (default: a temp dir)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--package-root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--stores", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--count-syncs", action="store_true", help=argparse.SUPPRESS)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results import add_output_arguments

    add_output_arguments(parser, "step_overhead")
    args = parser.parse_args(argv)
    unknown = set(args.sizes.split(",")) - set(SIZES)
    if unknown:
        parser.error(f"--sizes: unknown {sorted(unknown)}; choose from {list(SIZES)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args)))
        return {}
    from results import Measures, quiet_machine_guard, write_results

    quiet_machine_guard(args, Measures.TIME)
    work = args.work or Path(tempfile.mkdtemp(prefix="step_overhead_"))
    baseline = None
    try:
        stores = _stores(args, work)
        if args.baseline:
            baseline = _baseline_tree(args.baseline, work)
        trees = {"after": ROOT, **({"before": baseline} if baseline else {})}
        rounds: dict[str, list] = {k: [] for k in trees}
        for r in range(args.rounds):
            for label, tree in (trees.items() if r % 2 == 0 else reversed(list(trees.items()))):
                rounds[label].append(_round(args, tree, stores, count_syncs=r == 0))
                print(f"round {r + 1}/{args.rounds} ({label}) done", file=sys.stderr, flush=True)
    finally:
        if baseline is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, capture_output=True)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    after = _summary(rounds["after"])
    before = _summary(rounds["before"]) if baseline else None
    lines = report(args, after, before)
    print("\n" + "\n".join(lines))
    write_results(args, "Training step overhead beyond the network", "\n".join(lines))
    return {"after": after, "before": before}


if __name__ == "__main__":
    main()
