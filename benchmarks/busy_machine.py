"""The demo run on a quiet machine and on one busy with a CPU hog per core, with torch's CPU threads
chosen by the project (`threads: null`: the cores not busy now) and as torch chose them before (one per
core, whatever the load).

    python benchmarks/busy_machine.py                     # docs/results/busy_machine.md
    python benchmarks/busy_machine.py --epochs 3 --participants 12

The demo data are generated and their features extracted once first (not timed); then each timed run
is `python train.py experiment=demo` on a small demo (`--participants` participants, one session each)
with `--epochs` epochs, in its own process, with OMP_NUM_THREADS unset. "old" passes `threads=N` with N
torch's own default on this machine; "new" passes nothing. The busy runs start one spinning process per
core this process may use, which runs for the whole run.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import Measures, add_output_arguments, quiet_machine_guard, write_results  # noqa: E402


def _spin() -> None:
    while True:
        pass


def torch_default_threads(env: dict[str, str]) -> int:
    """The intra-op threads torch picks on its own here (what every run used before `threads`)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def train_command(base: Path, run_dir: Path, args: argparse.Namespace, extra: list[str],
                  epochs: int | None = None) -> list[str]:
    return [sys.executable, "train.py", "experiment=demo", "logger=none", f"paths.data_dir={base / 'data'}",
            f"hydra.run.dir={run_dir}", f"trainer.max_epochs={epochs or args.epochs}",
            f"data.demo.n_participants={args.participants}", "data.demo.sessions_per_participant=1",
            "evaluation.bootstrap=0", "evaluation.plots=false", *extra]


def timed_run(command: list[str], env: dict[str, str], timeout: float) -> tuple[float | None, str]:
    """Seconds the run took (None when it ran past `timeout` and was stopped) and the threads it logged."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "?"
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-3000:]}")
    run_dir = Path(next(a.split("=", 1)[1] for a in command if a.startswith("hydra.run.dir=")))
    logged = "".join(p.read_text() for p in run_dir.glob("*.log"))
    found = re.search(r"torch uses (\d+) CPU thread", logged)
    return seconds, found.group(1) if found else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10, help="training epochs of each timed run (demo: 10)")
    parser.add_argument("--participants", type=int, default=12, help="demo participants, one session each")
    parser.add_argument("--timeout", type=float, default=900, help="seconds after which a run is stopped")
    add_output_arguments(parser, "busy_machine")
    args = parser.parse_args()
    quiet_machine_guard(args, Measures.LOAD)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    old_threads = torch_default_threads(env)
    base = Path(tempfile.mkdtemp(prefix="busy_machine-"))
    print(f"generating the demo data and extracting its features in {base} (not timed)", flush=True)
    warmup = subprocess.run(train_command(base, base / "warmup", args, [], epochs=1), cwd=ROOT, env=env,
                            capture_output=True, text=True)
    if warmup.returncode != 0:
        raise SystemExit(f"the warm-up run failed:\n{warmup.stderr[-3000:]}")
    settings = {"new (threads: null)": [], f"old (torch default, threads={old_threads})": [f"threads={old_threads}"]}
    times: dict[tuple[str, str], tuple[float | None, str]] = {}
    for load in ("quiet", "busy"):
        hogs = []
        if load == "busy":
            hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(cores)]
            for hog in hogs:
                hog.start()
            time.sleep(1.0)
        try:
            for name, extra in settings.items():
                run_dir = base / f"{load}-{len(times)}"
                times[(load, name)] = timed_run(train_command(base, run_dir, args, extra), env, args.timeout)
                seconds, threads = times[(load, name)]
                print(f"{load:5s} {name}: {'>%.0f' % args.timeout if seconds is None else '%.1f' % seconds} s "
                      f"({threads} thread(s))", flush=True)
        finally:
            for hog in hogs:
                hog.terminate()
            for hog in hogs:
                hog.join()

    def shown(seconds: float | None) -> str:
        return f"> {args.timeout:.0f}" if seconds is None else f"{seconds:.1f}"

    lines = ["| threads | quiet: s (threads) | busy, a hog per core: s (threads) | busy / quiet |", "|---|---|---|---|"]
    for name in settings:
        (quiet, quiet_threads), (busy, busy_threads) = times[("quiet", name)], times[("busy", name)]
        ratio = "-" if quiet is None or busy is None else f"{busy / quiet:.2f}x"
        if busy is None and quiet is not None:
            ratio = f"> {args.timeout / quiet:.1f}x"
        lines.append(f"| {name} | {shown(quiet)} ({quiet_threads}) | {shown(busy)} ({busy_threads}) | {ratio} |")
    table = "\n".join(lines)
    print("\n" + table)
    body = (f"`python train.py experiment=demo` on a demo of {args.participants} participants (one session each), "
            f"{args.epochs} epochs, features already extracted; wall seconds of the whole command (start-up, "
            f"training, test). Quiet: no process started by the benchmark (other jobs on the machine run on: the "
            f"load average above says how busy it was). Busy: {cores} processes spinning, one per core this "
            f"process may use. Threads: what "
            f"the run logged (`torch uses N CPU thread(s)`).\n\n{table}\n")
    write_results(args, "Training on a busy machine: CPU threads", body)


if __name__ == "__main__":
    main()
