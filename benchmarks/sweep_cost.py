"""The paper's grid sweep end to end, as a user runs it, with every cost of every job counted.

    python benchmarks/sweep_cost.py                                  # this machine (CPU), 0.05 of the corpus
    python benchmarks/sweep_cost.py --device cuda --fraction 0.25    # a GPU (trainer=gpu)
    python benchmarks/sweep_cost.py --fraction 0.002 --models tfn,mean --subsets t,v+a+t --seeds 1 --no-write
                                                                     # CI-sized

Writes a synthetic dataset and feature store in the store's real format at `--fraction` of EmpathicStories++
(benchmarks/grid.py's `write_synthetic`), then runs `train.py -m experiment=es_story_share` on it in a fresh
process, with the paper's batch (64) and window stride (1 s) and `--epochs` epochs, and reads back every job's
`timings.json` (empathic_fusion/utils/job_timings.py). Per job: the process's start (first job), the data's
set-up and the frame arrays' fill inside it, the sanity check, training steps, validation, checkpoints, the
test, the report and what Hydra does between jobs; then the sweep's wall time. A job's steps are its training,
validation and test steps; everything else is its fixed cost.

With `--before` the same sweep also runs as it ran before the fixed costs were paid once per sweep: every job
setting up its data itself (`grid.share_setup=false`) and writing the full report with the old grid's
intervals (`evaluation=default evaluation.bootstrap=100 evaluation.plots=false`), side by side.

The projection of the full grid at the paper's recipe (99,357 Story Share windows, 10 epochs, 4 models x 5
subsets x 3 seeds plus the two baselines): each job's steps scale with its windows x epochs (its own subset's
speed per step), the data's set-up with the store's size (paid once per subset), and the other fixed costs
(the report included, which reads the test split) with the corpus too, an upper bound for what is constant.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.grid import FULL_WINDOWS, write_synthetic  # noqa: E402
from benchmarks.results import Measures, add_output_arguments, quiet_machine_guard, write_results  # noqa: E402
from empathic_fusion.core.files import canonical_hash  # noqa: E402

PAPER_SPLIT = (0.7, 0.2, 0.1)  # data=empathic_stories: the paper's participant split
PAPER_EPOCHS, PAPER_BATCH, PAPER_SEEDS = 10, 64, 3
STEP_SPANS = ("train_steps", "validation", "test_steps")


def sweep_command(args: argparse.Namespace, dataset: Path, store: Path, sweep_dir: Path, before: bool) -> list[str]:
    """`train.py -m experiment=es_story_share` on the synthetic store, as a user runs the paper's recipe."""
    modalities = "{video:[face],audio:[audio],text:[text]}"  # the synthetic store's branches
    command = [sys.executable, str(ROOT / "train.py"), "-m", "experiment=es_story_share", "data=empathic_stories",
               f"data.dataset_dir={dataset}", f"data.store_dir={store}", "data.stride_seconds=1",
               f"data.batch_size={PAPER_BATCH}", f"features.modalities={modalities}",
               f"trainer.max_epochs={args.epochs}",
               f"seed={args.seeds}", "logger=none", f"hydra.sweep.dir={sweep_dir}"]
    if args.models:
        command.append(f"model={args.models}")
    if args.subsets:
        command.append(f"modality={args.subsets}")
    if args.device == "cuda":
        command.append("trainer=gpu")
    if before:
        command += ["grid.share_setup=false", "evaluation=default", "evaluation.bootstrap=100",
                    "evaluation.plots=false"]
    return command


def run_sweep(args: argparse.Namespace, dataset: Path, store: Path, before: bool) -> dict[str, Any]:
    sweep_dir = args.work / f"sweep_{'before' if before else 'now'}"
    shutil.rmtree(sweep_dir, ignore_errors=True)
    command = sweep_command(args, dataset, store, sweep_dir, before)
    began = time.time()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - began
    failures = sweep_dir / "failures.json"  # a failed job ends the sweep with status 1; the others are counted
    if done.returncode != 0 and not failures.is_file():
        raise RuntimeError(f"the sweep failed ({done.returncode}):\n{done.stderr[-4000:]}")
    failed = json.loads(failures.read_text()) if failures.is_file() else []
    return {"wall_s": wall, "command": " ".join(command[1:]), "failed": failed,
            "jobs": read_jobs(sweep_dir, began + wall, {int(f["job"]) for f in failed})}


def read_jobs(sweep_dir: Path, ended: float, failed: set[int] = frozenset()) -> list[dict[str, Any]]:
    """Every finished job's timings with its model, subset and seed, in the order they ran (`failed` jobs left
    out); `outside_s` is the time from its end to the next job's start (Hydra's job set-up, the summary); the last
    job, whose own gap is the sweep's end (the paper tables, kept as `sweep_end_s`), gets the others' median."""
    jobs = []
    for folder in sorted((p for p in sweep_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        if int(folder.name) in failed or not (folder / "timings.json").is_file():
            continue  # failed, or a skipped cell (skipped.json): the model needs a modality the cell lacks
        overrides = dict(o.split("=", 1) for o in yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()))
        timings = json.loads((folder / "timings.json").read_text())
        jobs.append({"job": int(folder.name), "model": overrides["model"], "subset": overrides["modality"],
                     "seed": overrides["seed"], **timings})
    jobs.sort(key=lambda j: j["started"])
    gaps = [max(0.0, end - job["started"] - job["total_s"])
            for job, end in zip(jobs, [j["started"] for j in jobs[1:]] + [ended])]
    if jobs:
        jobs[-1]["sweep_end_s"] = gaps[-1]
        gaps[-1] = statistics.median(gaps[:-1]) if len(gaps) > 1 else 0.0
    for job, outside in zip(jobs, gaps):
        job["outside_s"] = outside
        job["steps_s"] = sum(job["seconds"].get(k, 0.0) for k in STEP_SPANS)
        job["wall_s"] = job["total_s"] + outside + (job["process_start_s"] or 0.0)
        job["fixed_s"] = job["wall_s"] - job["steps_s"]
    return jobs


CONSTANT = ("setup/trainer", "setup/model", "sanity_check")  # per job, whatever the corpus's size
PER_EPOCH = ("checkpoint",)  # per epoch (a new best is saved)
PER_TEST = ("report",)  # read the test split: they grow with the corpus


def projection(jobs: list[dict[str, Any]], fraction: float, epochs: int) -> dict[str, Any]:
    """The full grid at the paper's recipe from the measured jobs (see the module's docstring): steps scale with
    windows x epochs, the data's set-up with the store (once per subset), the report and the test's loading with
    the test split, checkpoints with the epochs; the trainer's and model's construction, the sanity check and
    Hydra's time between jobs stay as measured."""
    scale = 1.0 / fraction
    cells: dict[tuple[str, str], list[dict]] = {}
    for job in jobs:
        cells.setdefault((job["model"], job["subset"]), []).append(job)
    steps = other = 0.0
    for runs in cells.values():
        def projected(r: dict) -> tuple[float, float]:
            s = r["seconds"]
            run_steps = ((s.get("train_steps", 0.0) + s.get("validation", 0.0)) * scale * PAPER_EPOCHS / epochs
                         + s.get("test_steps", 0.0) * scale)
            fixed = (sum(s.get(k, 0.0) for k in CONSTANT) + r["outside_s"]
                     + sum(s.get(k, 0.0) for k in PER_EPOCH) * PAPER_EPOCHS / epochs
                     + (sum(s.get(k, 0.0) for k in PER_TEST) + s.get("test", 0.0) - s.get("test_steps", 0.0)) * scale)
            return run_steps, fixed
        measured = [projected(r) for r in runs]
        steps += PAPER_SEEDS * statistics.mean(m[0] for m in measured)
        other += PAPER_SEEDS * statistics.mean(m[1] for m in measured)
    setup = 0.0
    for subset in {j["subset"] for j in jobs}:  # a fresh set-up: once per subset where jobs reuse it, else every job
        runs = [j for j in jobs if j["subset"] == subset]
        fresh = max(j["seconds"].get("setup/data", 0.0) for j in runs) * scale
        shared = any("setup/frames" not in j["seconds"] for j in runs)
        setup += fresh * (1 if shared else PAPER_SEEDS * sum(1 for model, cell in cells if cell == subset))
    start = jobs[0]["process_start_s"] or 0.0
    return {"steps_h": steps / 3600, "setup_h": setup / 3600, "other_h": other / 3600, "start_s": start,
            "total_h": (steps + setup + other + start) / 3600, "cells": len(cells)}


def summary(run: dict[str, Any]) -> dict[str, Any]:
    jobs = run["jobs"]
    later = jobs[1:]
    reused = [j["fixed_s"] for j in later if "setup/frames" not in j["seconds"]]  # the set-up of an earlier job
    return {"jobs": len(jobs), "wall_s": run["wall_s"], "steps_s": sum(j["steps_s"] for j in jobs),
            "fixed_s": sum(j["fixed_s"] for j in jobs), "first_fixed_s": jobs[0]["fixed_s"],
            "later_fixed_mean_s": statistics.mean(j["fixed_s"] for j in later) if later else math.nan,
            "later_fixed_max_s": max((j["fixed_s"] for j in later), default=math.nan),
            "reused_mean_s": statistics.mean(reused) if reused else math.nan,
            "reused_max_s": max(reused, default=math.nan),
            "setups": len(jobs) - len(reused)}


COLUMNS = [("process start", lambda j: j["process_start_s"] or 0.0),
           ("data set-up", lambda j: j["seconds"].get("setup/data", 0.0)),
           ("frame fill", lambda j: j["seconds"].get("setup/frames", 0.0)),
           ("sanity", lambda j: j["seconds"].get("sanity_check", 0.0)),
           ("train steps", lambda j: j["seconds"].get("train_steps", 0.0)),
           ("validation", lambda j: j["seconds"].get("validation", 0.0)),
           ("checkpoints", lambda j: j["seconds"].get("checkpoint", 0.0)),
           ("test steps", lambda j: j["seconds"].get("test_steps", 0.0)),
           ("test other", lambda j: j["seconds"].get("test", 0.0) - j["seconds"].get("test_steps", 0.0)),
           ("report", lambda j: j["seconds"].get("report", 0.0)), ("between jobs", lambda j: j["outside_s"]),
           ("steps", lambda j: j["steps_s"]), ("fixed", lambda j: j["fixed_s"]), ("wall", lambda j: j["wall_s"])]


def job_table(jobs: list[dict[str, Any]]) -> list[str]:
    lines = ["| job | model | subset | seed | " + " | ".join(name for name, _ in COLUMNS) + " |",
             "|" + "---|" * (4 + len(COLUMNS))]
    for j in jobs:
        lines.append(f"| {j['job']} | {j['model']} | {j['subset']} | {j['seed']} | "
                     + " | ".join(f"{value(j):.2f}" for _, value in COLUMNS) + " |")
    return lines


def report(args: argparse.Namespace, store: dict, runs: dict[str, dict]) -> list[str]:
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    lines = [f"{device}, {args.fraction:g} of EmpathicStories++ (synthetic store, {store['sessions']} sessions, "
             f"branches {store['dims']}), batch {PAPER_BATCH}, stride 1 s, {args.epochs} epoch(s), "
             f"seeds {args.seeds}.", "",
             "Seconds per job; steps are the training, validation and test steps, fixed is everything else of the "
             "job's wall time (the first job's includes the process's start; the paper tables after the last job "
             "are the sweep's end).", ""]
    sums = {name: summary(run) for name, run in runs.items()}
    lines += ["| sweep | jobs | sweep wall s | steps s | fixed s | first job fixed s | later jobs fixed s, mean | "
              "later jobs fixed s, max | data set-ups | jobs reusing a set-up: fixed s, mean | their max |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in sums.items():
        lines.append(f"| {name} | {s['jobs']} | {s['wall_s']:.1f} | {s['steps_s']:.1f} | {s['fixed_s']:.1f} | "
                     f"{s['first_fixed_s']:.2f} | {s['later_fixed_mean_s']:.2f} | {s['later_fixed_max_s']:.2f} | "
                     f"{s['setups']} | {s['reused_mean_s']:.2f} | {s['reused_max_s']:.2f} |")
    lines += ["", f"Full grid projected at the paper's recipe ({FULL_WINDOWS:,} windows, {PAPER_EPOCHS} epochs, "
              f"{PAPER_SEEDS} seeds, every cell of the sweep at its own measured speed), hours on this device, one job "
              "at a time:", "",
              "| sweep | cells | steps h | data set-ups h | other fixed h | total h |", "|---|---|---|---|---|---|"]
    for name, run in runs.items():
        p = projection(run["jobs"], args.fraction, args.epochs)
        lines.append(f"| {name} | {p['cells']} | {p['steps_h']:.2f} | {p['setup_h']:.2f} | {p['other_h']:.2f} | "
                     f"{p['total_h']:.2f} |")
    for name, run in runs.items():
        lines += ["", f"### Jobs, {name}", "", f"`{run['command']}`", ""] + job_table(run["jobs"])
        if run["failed"]:
            lines += ["", "Failed jobs (not in the table or the projection; their time counts in the previous "
                      "job's between jobs): "
                      + "; ".join(f"{f['job']} ({' '.join(f['overrides'])}): {f['error']}" for f in run["failed"])]
    return lines + [""]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--fraction", type=float, default=0.05, help="of EmpathicStories++'s frames and windows")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--branches", default="face=1451,audio=65,text=384")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--models", default=None,
                        help="model= of the sweep (default: the experiment's, every fusion model)")
    parser.add_argument("--subsets", default=None, help="modality= of the sweep (default: the experiment's five)")
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--before", action="store_true",
                        help="also run the sweep as it ran before: no shared set-up, the full report")
    parser.add_argument("--work", type=Path, default=None,
                        help="where the store and sweeps go (default: a /tmp folder)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    add_output_arguments(parser, "sweep_cost")
    args = parser.parse_args(argv)
    quiet_machine_guard(args, Measures.TIME)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU")
    dims = {b: int(d) for b, d in (item.split("=") for item in args.branches.split(","))}
    key = canonical_hash([args.fraction, args.sessions, dims])
    args.work = args.work or Path("/tmp") / f"empathic_sweep_cost_{key}"
    os.makedirs(args.work, exist_ok=True)
    store = write_synthetic(args.work / "data", args.fraction, args.sessions, dims)
    runs = {}
    cache = args.work / "data" / "store" / "frame_cache"  # each sweep writes its frame caches itself
    if args.before:
        shutil.rmtree(cache, ignore_errors=True)
        runs["before: every job sets up its data, full report"] = run_sweep(args, args.work / "data" / "dataset",
                                                                            args.work / "data" / "store", True)
    shutil.rmtree(cache, ignore_errors=True)
    runs["now: set-up shared within the sweep, lean report"] = run_sweep(args, args.work / "data" / "dataset",
                                                                         args.work / "data" / "store", False)
    lines = report(args, store, runs)
    print("\n".join(lines))
    write_results(args, f"The paper's grid sweep end to end, every cost of every job ({args.fraction:g} of the corpus)",
                  "\n".join(lines))
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
              "projection": {name: projection(run["jobs"], args.fraction, args.epochs) for name, run in runs.items()}}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str))
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
