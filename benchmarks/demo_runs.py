"""The demo runs the README shows, over several seeds and with other CPU kernels: how far one run's test
metrics are from what another seed or another CPU gives.

    OMP_NUM_THREADS=1 python benchmarks/demo_runs.py                # docs/results/demo.md (about an hour)
    OMP_NUM_THREADS=1 python benchmarks/demo_runs.py --quick        # seeds 0 and the default, print only
    OMP_NUM_THREADS=1 python benchmarks/demo_runs.py --runs tfn_vt --seeds 0,1,2

Runs (`python train.py experiment=demo ...`, the demo's recipe on the generated demo data, which is
made on first use and then shared by every run through the feature store in data/features):
  lf_lstm_vat  python train.py experiment=demo                           (`make train`: LF-LSTM, v+a+t)
  tfn_vt       python train.py experiment=demo model=tfn modality=v+t
Each command runs once as typed (the config's default seed: what `make train` runs) and once per
seed in `--seeds` (default 0-9, `seed=N`), each in its own process, and the default-seed command runs again
with other CPU kernels: ATEN_CPU_CAPABILITY=default (torch's plain C++ kernels instead of AVX2/AVX512)
and ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN limited to AVX2). Window and rating-level test metrics go into
docs/results/demo.md as mean ± sd and min-max over seeds, beside the test table of the default-seed run
as `make train` prints it; a JSON block at its end holds the ranges that
tests/test_demo_reproducible.py checks a new run against. Run folders go under
logs/benchmarks/demo_runs/<time>/ (`--run-dir` to choose; given again, the runs that finished there
are read, not repeated). `--before FILE` (an earlier docs/results/demo.md, e.g. from `git show`) adds a
before/after table of the metrics. Extra Hydra overrides after `--` go to every
run. With `--quick` (seeds 0 and the default, no kernel variants) nothing is written unless `--out` is
given.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import (  # noqa: E402
    RESULTS_DIR, Measures, add_output_arguments, kernel_environment, portable, quiet_machine_guard, run_resumable,
    write_results)

RUNS = {
    "lf_lstm_vat": ("LF-LSTM, video + audio + text (`make train`)", ["experiment=demo"]),
    "tfn_vt": ("TFN, video + text", ["experiment=demo", "model=tfn", "modality=v+t"]),
}
DEFAULT_SEEDS = tuple(range(10))
QUICK_SEEDS = (0,)
# The default-seed command again with other CPU kernels: name -> environment variables set for the run.
KERNEL_VARIANTS = {
    "ATEN_CPU_CAPABILITY=default": {"ATEN_CPU_CAPABILITY": "default"},
    "ONEDNN_MAX_CPU_ISA=AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
}
LEVELS = ("window", "rating")
METRICS = {"pearson": "r", "spearman": "rho", "accuracy": "Acc", "f1": "F1", "mse": "MSE"}
SUMMARY_START = "<!-- demo-ranges -->"
# A new run (another seed, another CPU, features extracted with other threads) is expected within the mean
# ± this many sample sd of every recorded run's per-rating r, seeds and kernel variants together: each is a
# small perturbation of one training, and the extremes of a handful of runs are no bound (a new draw falls
# outside the min-max of n earlier ones with probability 2 / (n + 1)).
EXPECTED_SDS = 3.0
# Written into a run folder when its run finished: the command and its seconds (to resume a benchmark).
FINISHED = "demo_run.json"


@dataclass
class DemoRun:
    """One train.py process: which command, seed and kernels, what it measured and how long it took."""

    run: str
    seed: int             # the seed the run used (from its run_info.json)
    default_seed: bool    # run without `seed=`, as a user types the command
    kernels: str          # "" for this machine's own, else a KERNEL_VARIANTS name
    capability: str       # torch's CPU capability in that environment
    seconds: float
    metrics: dict         # test_metrics.json's "model" entry: level -> metric -> value
    folder: Path

    @property
    def rating_r(self) -> float:
        return self.metrics["rating"]["pearson"]


def train_command(run: str, run_dir: Path, seed: int | None, extra: Sequence[str]) -> list[str]:
    """The train.py command line of one demo run (`seed=` only when `seed` is given), outputs in `run_dir`."""
    seed_part = [] if seed is None else [f"seed={seed}"]
    return [sys.executable, "train.py", *RUNS[run][1], *seed_part, "logger=none", *extra, f"hydra.run.dir={run_dir}"]


def shown_command(run: str, seed: int | None = None, kernels: str = "", extra: Sequence[str] = ()) -> str:
    """The command as a user types it (no `seed=` for the default seed, as `make train` runs it)."""
    seed_part = [] if seed is None else [f"seed={seed}"]
    return " ".join([*([kernels] if kernels else []), "python train.py", *RUNS[run][1], *seed_part, *extra])


def run_environment(kernels: str) -> dict[str, str]:
    """This process's environment (OMP_NUM_THREADS=1 unless set) plus the kernel variant's variables."""
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **KERNEL_VARIANTS.get(kernels, {})}


def capability_in(env: dict[str, str]) -> str:
    """The instruction set torch's CPU kernels dispatch to in a process with this environment."""
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                          env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def run_one(run: str, run_dir: Path, seed: int | None, kernels: str, extra: Sequence[str]) -> DemoRun:
    """Train and test one demo run in a subprocess (output streamed); what it measured. A folder that holds
    a finished run of the same command (from an interrupted benchmark given the same `--run-dir`) is
    read instead of trained again."""
    env = run_environment(kernels)
    command = train_command(run, run_dir, seed, extra)
    seconds = run_resumable(command, run_dir, FINISHED, env, shown_command(run, seed, kernels, extra),
                            f"run {run} (seed {seed or 'default'}, {kernels or 'default kernels'})")
    report = json.loads((run_dir / "test_metrics.json").read_text())
    used_seed = int(json.loads((run_dir / "run_info.json").read_text())["config"]["seed"])
    return DemoRun(run, used_seed, seed is None, kernels, capability_in(env), seconds, report["model"], run_dir)


def spread(values: list[float]) -> dict[str, float]:
    """Mean, sample sd (0 for one value), min and max."""
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def expected_range(runs: list[DemoRun]) -> dict[str, float]:
    """Where a new run's per-rating r is expected: mean ± EXPECTED_SDS sample sd over every run given."""
    every = spread([r.rating_r for r in runs])
    return {"low": every["mean"] - EXPECTED_SDS * every["sd"], "high": every["mean"] + EXPECTED_SDS * every["sd"],
            "mean": every["mean"], "sd": every["sd"], "runs": len(runs)}


def seed_table(runs: list[DemoRun], default: DemoRun) -> str:
    """Every metric at both levels over the seeds: mean ± sd, min, max, and the default-seed run."""
    lines = [f"| level | metric | mean ± sd over {len(runs)} seeds | min | max | seed {default.seed} (as typed) |",
             "|---|---|---|---|---|---|"]
    for level in LEVELS:
        for key, name in METRICS.items():
            s = spread([r.metrics[level][key] for r in runs])
            lines.append(f"| {level} | {name} | {s['mean']:.3f} ± {s['sd']:.3f} | {s['min']:.3f} | {s['max']:.3f} "
                         f"| {default.metrics[level][key]:.3f} |")
    return "\n".join(lines)


def runs_table(runs: list[DemoRun], first_fills_store: bool) -> str:
    """One row per process: seed, kernels, torch's CPU capability, r at both levels, wall seconds."""
    lines = ["| seed | kernels | torch CPU capability | window r | rating r | seconds |", "|---|---|---|---|---|---|"]
    for index, r in enumerate(runs):
        note = " (data generation and feature extraction included)" if index == 0 and first_fills_store else ""
        kernels = r.kernels or "this machine's"
        seed = f"{r.seed} (default)" if r.default_seed else str(r.seed)
        lines.append(f"| {seed} | {kernels} | {r.capability} | "
                     f"{r.metrics['window']['pearson']:.3f} | {r.rating_r:.3f} | {r.seconds:.0f}{note} |")
    return "\n".join(lines)


def kernel_sentence(default: DemoRun, variants: list[DemoRun], seed_sd: float) -> str:
    """How far the default-seed run's per-rating r moves when only the CPU kernels change."""
    if not variants:
        return ""
    values = [default.rating_r] + [v.rating_r for v in variants]
    moves = ", ".join(f"{v.rating_r:.4f} with {v.kernels} ({v.capability})" for v in variants)
    return (f"Only the CPU kernels changed (seed {default.seed}): per-rating r {default.rating_r:.4f} with this "
            f"machine's ({default.capability}), {moves}: a range of {max(values) - min(values):.4f}, against a "
            f"standard deviation of {seed_sd:.3f} over seeds.\n")


def section(run: str, runs: list[DemoRun], first_fills_store: bool, extra: list[str]) -> tuple[str, dict]:
    """One command's part of the results file and its entry in the machine-readable summary."""
    own = [r for r in runs if not r.kernels]
    (default,) = [r for r in own if r.default_seed]
    variants = [r for r in runs if r.kernels]
    seeds = sorted(r.seed for r in own)
    rating = spread([r.rating_r for r in own])
    table = (default.folder / "test_metrics.md").read_text().strip()
    expected = expected_range(runs)
    text = (f"## {RUNS[run][0]}\n\n`{shown_command(run, extra=extra)}` with `seed=N` for N in "
            f"{', '.join(map(str, seeds))}:\n\n{seed_table(own, default)}\n\n"
            f"{kernel_sentence(default, variants, rating['sd'])}\n"
            f"Over all {expected['runs']} runs (seeds and kernels), per-rating r {expected['mean']:.3f} ± "
            f"{expected['sd']:.3f}: a new run, on any CPU, is expected within {EXPECTED_SDS:g} sd of the mean, "
            f"[{expected['low']:.3f}, {expected['high']:.3f}].\n\n"
            f"Every run:\n\n{runs_table(runs, first_fills_store)}\n\n"
            f"One run, the test table `{shown_command(run, extra=extra)}` prints (seed {default.seed}, this "
            f"machine's kernels):\n\n{table}\n")
    summary = {"command": shown_command(run, extra=extra), "seeds": seeds, "default_seed": default.seed,
               **{f"{level}_pearson": {**spread([r.metrics[level]["pearson"] for r in own]),
                                       "default_seed": default.metrics[level]["pearson"]} for level in LEVELS},
               "kernels": {v.kernels: {"capability": v.capability, "rating_pearson": v.rating_r} for v in variants},
               "capability": default.capability, "expected_rating_pearson": expected_range(runs)}
    return text, summary


def _rounded(value):
    """Floats to 6 decimals, for a summary that is read by eye as well as by the test."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    return [_rounded(item) for item in value] if isinstance(value, list) else value


def test_split_sentence(default: DemoRun) -> str:
    """How many ratings (and participants, where the predictions name them) the test split has."""
    import pandas as pd

    predictions = pd.read_csv(default.folder / "test_predictions.csv")
    people = f" from {predictions['participant_id'].nunique()} participants" if "participant_id" in predictions else ""
    return f"{len(predictions)} test ratings{people}"


def before_after(before: Path, summary: dict) -> str:
    """Each command's per-window and per-rating r over seeds and its expected range, as an earlier results file
    of this benchmark recorded them (`--before`) and now, with the shift of the mean in the earlier sd."""
    text = before.read_text()
    commit = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("- commit:")), "?")
    earlier = recorded_ranges(before)
    lines = [f"## Before and after\n\nThe same commands and seeds as recorded at {commit[:7]} (`--before`), and now:\n",
             "| command | metric | before: mean ± sd over seeds | after | shift of the mean (before's sd) |",
             "|---|---|---|---|---|"]
    for run, now in summary.items():
        was = earlier.get(run)
        if was is None:
            continue
        for key, name in (("window_pearson", "window r"), ("rating_pearson", "rating r")):
            b, a = was[key], now[key]
            shift = (a["mean"] - b["mean"]) / b["sd"] if b["sd"] else float("nan")
            lines.append(f"| `{now['command']}` | {name} | {b['mean']:.3f} ± {b['sd']:.3f} | {a['mean']:.3f} ± "
                         f"{a['sd']:.3f} | {shift:+.2f} |")
        b, a = was["expected_rating_pearson"], now["expected_rating_pearson"]
        lines.append(f"| `{now['command']}` | rating r expected (every run) | [{b['low']:.3f}, {b['high']:.3f}] | "
                     f"[{a['low']:.3f}, {a['high']:.3f}] | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    parser.add_argument("--seeds", default=None,
                        help=f"comma-separated seeds (default {','.join(map(str, DEFAULT_SEEDS))}); the command "
                             "without `seed=` (the config's default seed) always runs too")
    parser.add_argument("--quick", action="store_true",
                        help=f"seeds {','.join(map(str, QUICK_SEEDS))} and the default, no kernel variants; "
                             "prints only unless --out is given")
    parser.add_argument("--no-kernels", action="store_true", help="skip the runs with other CPU kernels")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="folder for the runs' folders (default: logs/benchmarks/demo_runs/<time>)")
    parser.add_argument("--before", type=Path, default=None,
                        help="an earlier results file of this benchmark: a before/after table of the metrics")
    add_output_arguments(parser, "demo")
    args = parser.parse_args(argv)
    quiet_machine_guard(args, Measures.ACCURACY)
    runs = args.runs.split(",")
    unknown = [run for run in runs if run not in RUNS]
    if unknown:
        parser.error(f"unknown run(s) {unknown}; choose from {list(RUNS)}")
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(QUICK_SEEDS if args.quick else DEFAULT_SEEDS)
    kernels = [] if args.quick or args.no_kernels else list(KERNEL_VARIANTS)
    if args.quick and args.out == RESULTS_DIR / "demo.md":
        args.no_write = True
    root = (args.run_dir or ROOT / "logs" / "benchmarks" / "demo_runs" / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    store_was_empty = not (ROOT / "data" / "features").is_dir()
    sections, summary, done = [], {}, {}
    for run in runs:
        default = run_one(run, root / run / "default_seed", None, "", extra)
        done[run] = [default] + [run_one(run, root / run / f"seed_{seed}", seed, "", extra)
                                 for seed in dict.fromkeys(seeds) if seed != default.seed]
        done[run] += [run_one(run, root / run / f"default_seed_{name.split('=')[0].lower()}", None, name, extra)
                      for name in kernels]
    for index, run in enumerate(runs):
        text, summary[run] = section(run, done[run], store_was_empty and index == 0, extra)
        sections.append(text)
    default = done[runs[0]][0]
    body = (f"Test split of the generated demo data (Story Share scenario, {test_split_sentence(default)}), the best "
            f"validation checkpoint of each run; MSE is on the 1-5 rating scale. Each command ran once "
            f"per seed in its own process ({kernel_environment(run_environment(''))})"
            + (f", and the command as typed (seed {default.seed}) again with other CPU kernels" if kernels else "")
            + ". One run's r moves with the seed, the CPU's kernels and the threads its features were "
            "extracted with; the spread over seeds and kernels is what another machine should expect.\n\n"
            + "\n".join(sections)
            + ("\n" + before_after(args.before, summary) if args.before else "")
            + f"\n## Ranges for the reproduction test\n\nRead by tests/test_demo_reproducible.py: a new run of each "
              f"command (seed {default.seed}) must give a per-rating r within `expected_rating_pearson`, the mean ± "
              f"{EXPECTED_SDS:g} sd over every run above (seeds and kernels).\n\n"
            + f"{SUMMARY_START}\n```json\n{json.dumps(_rounded(summary), indent=1)}\n```\n")
    print("\n" + portable(body))
    write_results(args, "Demo training runs over seeds and CPU kernels", body)
    return 0


def recorded_ranges(path: Path = RESULTS_DIR / "demo.md") -> dict:
    """The machine-readable summary a results file written by this benchmark ends with."""
    text = path.read_text()
    block = text[text.index(SUMMARY_START) + len(SUMMARY_START):]
    return json.loads(block[block.index("```json") + len("```json"): block.index("```", block.index("```json") + 7)])


if __name__ == "__main__":
    sys.exit(main())
