"""The demo training runs the README shows, each in its own process, and their test tables.

    OMP_NUM_THREADS=1 python benchmarks/demo_runs.py                # both runs, docs/results/demo.md
    OMP_NUM_THREADS=1 python benchmarks/demo_runs.py --runs tfn_vt  # one of them

Runs (`python train.py experiment=demo ...`, the demo's recipe on the generated demo data, which is
made on first use):
  lf_lstm_vat  python train.py experiment=demo                           (`make train`: LF-LSTM, v+a+t)
  tfn_vt       python train.py experiment=demo model=tfn modality=v+t
Each run writes its folder under logs/benchmarks/demo_runs/<time>/<run>/ (`--run-dir` to choose);
the test table of each (its test_metrics.md) and the seconds it took go into docs/results/demo.md.
Extra Hydra overrides after `--` go to every run (e.g. `-- seed=2`).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import add_output_arguments, write_results  # noqa: E402

RUNS = {
    "lf_lstm_vat": ("LF-LSTM, video + audio + text (`make train`)", ["experiment=demo"]),
    "tfn_vt": ("TFN, video + text", ["experiment=demo", "model=tfn", "modality=v+t"]),
}


def train_command(run: str, run_dir: Path, extra: list[str]) -> list[str]:
    """The train.py command line of one demo run, its outputs in `run_dir`."""
    return [sys.executable, "train.py", *RUNS[run][1], "logger=none", *extra, f"hydra.run.dir={run_dir}"]


def run_one(run: str, run_dir: Path, extra: list[str]) -> float:
    """Train and test one demo run in a subprocess (output streamed); seconds it took."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    command = train_command(run, run_dir, extra)
    print("$ " + " ".join(command[1:]), flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"run {run} failed with exit status {done.returncode}: see {run_dir}")
    return seconds


def section(run: str, run_dir: Path, seconds: float, extra: list[str]) -> str:
    """One run's part of the results file: what ran and its test table, as the run wrote it."""
    table = run_dir / "test_metrics.md"
    if not table.is_file():
        raise SystemExit(f"run {run} wrote no {table}")
    overrides = " ".join([*RUNS[run][1], *extra])
    return (f"## {RUNS[run][0]}\n\n`python train.py {overrides}`: {seconds:.0f} s wall "
            f"(data generation and feature extraction included when the store was empty)\n\n"
            f"{table.read_text().strip()}\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="folder for the runs' folders (default: logs/benchmarks/demo_runs/<time>)")
    add_output_arguments(parser, "demo")
    args = parser.parse_args(argv)
    runs = args.runs.split(",")
    unknown = [run for run in runs if run not in RUNS]
    if unknown:
        parser.error(f"unknown run(s) {unknown}; choose from {list(RUNS)}")
    root = (args.run_dir or ROOT / "logs" / "benchmarks" / "demo_runs" / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    sections = []
    for run in runs:
        seconds = run_one(run, root / run, extra)
        sections.append(section(run, root / run, seconds, extra))
    body = ("Test split of the generated demo data (Story Share scenario), the best validation checkpoint of "
            "each run. MSE is on the cosine scale (rating - 3) / 2.\n\n" + "\n".join(sections))
    print("\n" + body)
    write_results(args, "Demo training runs", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
