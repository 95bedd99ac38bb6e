"""Where the benchmarks put what they measured: `docs/results/<name>.md`, one file per benchmark.

Each file starts with where and how it was measured (machine, commit, date, the exact command), so a
number in the docs can always be traced to a run and re-made by running the command again. The docs
link to these files instead of copying numbers, so nothing there is typed by hand or goes stale.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "docs" / "results"
# Environment variables that change what a benchmark measures; repeated in the recorded command.
RECORDED_ENV = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def add_output_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """`--out` (default docs/results/<name>.md) and `--no-write` (print only)."""
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / f"{name}.md",
                        help=f"markdown file for the results (default: docs/results/{name}.md)")
    parser.add_argument("--no-write", action="store_true", help="print the results, write no file")


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine() -> str:
    """CPU model, cores this process may use (of all), memory, GPUs torch sees, load average."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parts = [f"{cpu_model()}, {usable} of {os.cpu_count()} cores usable"]
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        parts.append(f"{pages * page_size / 2 ** 30:.0f} GiB memory")
    except (ValueError, OSError, AttributeError):
        pass
    try:
        import torch

        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        parts.append("GPU: " + ", ".join(gpus) if gpus else "no GPU")
        parts.append(f"torch {torch.__version__}")
    except ImportError:
        parts.append("no torch")
    if hasattr(os, "getloadavg"):
        parts.append("load average %.1f / %.1f / %.1f (1 / 5 / 15 min) when written" % os.getloadavg())
    return "; ".join(parts)


def command(argv: list[str] | None = None) -> str:
    """The command line that ran this benchmark, relative to the repository, with the environment
    variables that change its numbers."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve() if argv else Path("?")
    try:
        script_text = str(script.relative_to(ROOT))
    except ValueError:
        script_text = str(script)
    env = [f"{key}={os.environ[key]}" for key in RECORDED_ENV if key in os.environ]
    return " ".join([*env, "python", shlex.join([script_text, *argv[1:]])])


def commit() -> str:
    """HEAD's commit, `-dirty` when tracked files other than docs/results/ differ from it (the results
    files themselves change with every benchmark run); 'unknown' outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)docs/results"], cwd=ROOT, capture_output=True, text=True,
                               timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def header(title: str) -> str:
    """The lines every results file starts with: title, machine, commit, date, command."""
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([f"# {title}", "",
                      f"- machine: {machine()}",
                      f"- commit: {commit()}",
                      f"- date: {date}",
                      f"- command: `{command()}`", ""])


def write_results(args: argparse.Namespace, title: str, body: str) -> Path | None:
    """Write `header(title)` + `body` to `args.out` unless `args.no_write`; returns the path written."""
    if getattr(args, "no_write", False):
        return None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header(title) + "\n" + body.rstrip() + "\n")
    print(f"results written to {out}")
    return out
