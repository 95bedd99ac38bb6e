"""Where the benchmarks put what they measured: `docs/results/<name>.md`, one file per benchmark.

Each file starts with where and how it was measured, so a number in the docs can always be traced to a
run and re-made by running the command again (`make results` runs them all):

    - machine: CPU model, cores, memory, GPUs, torch, the instruction set torch's CPU kernels use and the
      environment variables that choose kernels (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, OMP_NUM_THREADS)
    - commit: HEAD (`-dirty` when tracked files other than docs/results/ differ from it)
    - date
    - load: the load average when the benchmark started and when it wrote, and whether that is quiet
    - command: the command line, with the environment variables that change its numbers

Paths in the file are written relative to the repository (`<tmp>/...` for temporary folders), so no file
names a folder of the machine that wrote it. The docs link to these files instead of copying numbers.

Timings are only comparable on a quiet machine: `quiet_machine_guard` records the load when a benchmark
starts and refuses to time anything above `BUSY_LOAD_PER_CORE` per usable core, unless `--allow-busy`
is given, and then the file says at its top that the timings were taken on a busy machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "docs" / "results"
# Environment variables that change which CPU kernels run (and so the numbers a run gives).
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")
# Environment variables repeated in the recorded command.
RECORDED_ENV = (*KERNEL_ENV, "CUDA_VISIBLE_DEVICES")
# A 1-minute load average at or above this, per core the benchmark may use, is a busy machine
# (1.5 on 2 cores): timings are slower by an amount nobody can tell afterwards.
BUSY_LOAD_PER_CORE = 0.75
# How long a benchmark waits for a busy machine to calm down before it refuses (seconds), by default.
DEFAULT_QUIET_WAIT_S = 120.0


class Measures(Enum):
    """What a benchmark measures, which decides what a busy machine does to it."""

    TIME = "time"          # timings: refused on a busy machine unless --allow-busy
    ACCURACY = "accuracy"  # metrics that do not depend on speed: a busy machine is only noted
    LOAD = "load"          # the effect of load itself: busy on purpose, never refused


@dataclass
class LoadRecord:
    """The load when the benchmark started and what it made of it."""

    start: tuple[float, float, float]
    cores: int
    busy: bool
    measures: Measures
    allowed_busy: bool = False


def trained_fusion_models() -> list[str]:
    """The fusion models whose training step the benchmarks time: every registered one (`list_models("fusion")`,
    the paper's first) but the baselines whose net needs a head of its own (`required_head`: the cosine of story
    similarity, the mean's constant), which have no step to train."""
    from empathic_fusion.core.registry import model_class
    from empathic_fusion.models import list_models

    return [name for name in list_models("fusion") if model_class(name).required_head is None]


def add_output_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """`--out` (default docs/results/<name>.md), `--no-write` (print only), and the quiet-machine options
    `--allow-busy` and `--quiet-wait`."""
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / f"{name}.md",
                        help=f"markdown file for the results (default: docs/results/{name}.md)")
    parser.add_argument("--no-write", action="store_true", help="print the results, write no file")
    parser.add_argument("--allow-busy", action="store_true",
                        help=f"time even when the 1-minute load is at or above {BUSY_LOAD_PER_CORE} per usable "
                             "core; the results file then says that its timings were taken on a busy machine")
    parser.add_argument("--quiet-wait", type=float, default=DEFAULT_QUIET_WAIT_S,
                        help="seconds to wait for a busy machine to become quiet before refusing "
                             f"(default {DEFAULT_QUIET_WAIT_S:.0f})")


def usable_cores() -> int:
    """Cores this process may run on (its affinity), else all the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15-minute load averages; None where the system has none."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def is_busy(load: tuple[float, float, float] | None, cores: int) -> bool:
    """Whether the 1-minute load is at or above `BUSY_LOAD_PER_CORE` per usable core."""
    return load is not None and load[0] >= BUSY_LOAD_PER_CORE * cores


def quiet_machine_guard(args: argparse.Namespace, measures: Measures) -> LoadRecord:
    """Record the load before measuring (kept on `args` for the results file's header).

    A benchmark that times (`Measures.TIME`) waits up to `args.quiet_wait` seconds for the load to drop
    below the threshold and then refuses (SystemExit) unless `args.allow_busy`; one that measures
    accuracy only warns; one that measures load itself (`Measures.LOAD`) goes on and says so.
    """
    cores = usable_cores()
    load = load_average()
    threshold = BUSY_LOAD_PER_CORE * cores
    allow_busy = bool(getattr(args, "allow_busy", False))
    if measures is Measures.TIME and not allow_busy:
        deadline = time.monotonic() + float(getattr(args, "quiet_wait", 0.0) or 0.0)
        while is_busy(load, cores) and time.monotonic() < deadline:
            print(f"waiting for a quiet machine: 1-minute load {load[0]:.2f} >= {threshold:.2f} "
                  f"({BUSY_LOAD_PER_CORE} x {cores} cores)", file=sys.stderr, flush=True)
            time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
            load = load_average()
    busy = is_busy(load, cores)
    if busy and measures is Measures.TIME and not allow_busy:
        raise SystemExit(f"refusing to time on a busy machine: 1-minute load {load[0]:.2f} >= {threshold:.2f} "
                         f"({BUSY_LOAD_PER_CORE} per core x {cores} usable cores). Wait for a quiet machine, "
                         "or pass --allow-busy (the results file then says its timings were taken on a busy "
                         "machine).")
    if busy and measures is not Measures.LOAD:
        print(f"warning: busy machine, 1-minute load {load[0]:.2f} >= {threshold:.2f}: "
              + ("timings will be marked as taken on a busy machine" if measures is Measures.TIME
                 else "metrics are unaffected, the seconds recorded are slower than on a quiet machine"),
              file=sys.stderr, flush=True)
    record = LoadRecord(start=load or (float("nan"),) * 3, cores=cores, busy=busy, measures=measures,
                        allowed_busy=allow_busy)
    args.load_record = record
    return record


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_capability() -> str:
    """The instruction set torch dispatches its CPU kernels to here (e.g. AVX2, AVX512, DEFAULT)."""
    try:
        import torch

        return torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        return "unknown"


def kernel_environment(env: dict[str, str] | None = None) -> str:
    """The kernel-choosing environment variables as `NAME=value`, `NAME unset` where not set."""
    env = os.environ if env is None else env
    return ", ".join(f"{key}={env[key]}" if key in env else f"{key} unset" for key in KERNEL_ENV)


def machine() -> str:
    """CPU model, cores this process may use (of all), memory, GPUs torch sees, torch, its CPU kernels'
    instruction set and the environment variables that choose kernels."""
    parts = [f"{cpu_model()}, {usable_cores()} of {os.cpu_count()} cores usable"]
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
    parts.append(f"CPU kernels: {cpu_capability()} (torch.backends.cpu.get_cpu_capability())")
    parts.append(kernel_environment())
    return "; ".join(parts)


def _load_text(load: tuple[float, float, float]) -> str:
    return "%.2f / %.2f / %.2f" % load


def load_line(record: LoadRecord | None) -> str:
    """The header's load entry: at the start (from the guard) and now, on how many cores, and the verdict."""
    now = load_average()
    cores = record.cores if record else usable_cores()
    parts = []
    if record is not None:
        parts.append(f"{_load_text(record.start)} at the start")
    if now is not None:
        parts.append(f"{_load_text(now)} when written")
    text = (" and ".join(parts) or "not available") + f" (1 / 5 / 15-minute load average, {cores} usable cores; "
    threshold = BUSY_LOAD_PER_CORE * cores
    if record is None:
        return text + "load not checked before measuring)"
    verdict = f"busy at {threshold:.2f} or above" if record.busy else f"quiet: below {threshold:.2f} at the start"
    return text + verdict + ")"


def busy_notice(record: LoadRecord | None) -> str:
    """A line under the header that says loudly what a busy or deliberately loaded machine means here."""
    if record is None:
        return ""
    if record.measures is Measures.LOAD:
        return ("> **Load is what this benchmark measures**: it is exempt from the quiet-machine refusal, and "
                "the load above is part of its result.\n")
    if not record.busy:
        return ""
    if record.measures is Measures.TIME:
        return ("> **BUSY MACHINE: the timings in this file were taken on a busy machine** (`--allow-busy`, "
                f"1-minute load {record.start[0]:.2f} on {record.cores} cores at the start). They are slower "
                "than on a quiet machine, by an amount that cannot be told afterwards.\n")
    return ("> **Busy machine** (1-minute load %.2f on %d cores at the start): the metrics do not depend on "
            "it, but any seconds in this file are slower than on a quiet machine.\n" % (record.start[0], record.cores))


# Runs of this benchmark that run_resumable read from an earlier invocation's run folder instead of running:
# the 1-minute load when each started, or None where its record has none.
REUSED_RUN_LOADS: list[float | None] = []


def reused_notice() -> str:
    """A line under the header when some runs were read from an earlier invocation (`--run-dir`): their
    seconds were timed then, so the load above does not apply to them."""
    if not REUSED_RUN_LOADS:
        return ""
    known = ", ".join(f"{load:.2f}" for load in REUSED_RUN_LOADS if load is not None)
    unknown = sum(load is None for load in REUSED_RUN_LOADS)
    said = "; ".join(part for part in (known and f"1-minute load at their start: {known}",
                                        unknown and f"{unknown} with no load recorded") if part)
    return (f"> **{len(REUSED_RUN_LOADS)} run(s) were read from an earlier invocation's run folder** (`--run-dir`): "
            f"their seconds were timed then, under the load of that time ({said}), not under the load above. "
            "The metrics do not depend on it.\n")


def _path_prefixes() -> list[tuple[str, str]]:
    """(absolute prefix, what it becomes): the checkout, its parent folder, the temporary folder, home.
    Both the given and the resolved form of each, longest first."""
    pairs = {}
    for path, replacement in ((ROOT, "."), (ROOT.parent, ".."), (Path(tempfile.gettempdir()), "<tmp>"),
                              (Path("/tmp"), "<tmp>"), (Path.home(), "~")):
        for form in {str(path), os.path.realpath(path)}:
            if form not in ("/", "") and form not in pairs:
                pairs[form] = replacement
    return sorted(pairs.items(), key=lambda pair: len(pair[0]), reverse=True)


def portable(text: str) -> str:
    """`text` with every absolute path of this machine made relative: under the checkout relative to it,
    beside it as `../name`, temporary folders as `<tmp>/name`, home as `~/name`."""
    for prefix, replacement in _path_prefixes():
        nested = "" if replacement == "." else replacement + "/"
        text = re.sub(re.escape(prefix) + r"/", lambda _: nested, text)
        text = re.sub(re.escape(prefix) + r"(?![\w.\-/])", lambda _: replacement, text)
    return text


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
    return portable(" ".join([*env, "python", shlex.join([script_text, *argv[1:]])]))


def commit() -> str:
    """HEAD's commit, `-dirty` when tracked files other than docs/results/ differ from it (the results
    files themselves change with every benchmark run); 'unknown' outside a git checkout. A copy sent to a
    GPU machine gives the commit it was made from in $EMPATHIC_FUSION_COMMIT (benchmarks/gpu_pack.py)."""
    if os.environ.get("EMPATHIC_FUSION_COMMIT"):  # a copy whose .git, if any, is not the checkout's
        return os.environ["EMPATHIC_FUSION_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)docs/results"], cwd=ROOT, capture_output=True, text=True,
                               timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def header(title: str, record: LoadRecord | None = None) -> str:
    """The lines every results file starts with: title, machine, commit, date, load, command, and the
    busy-machine notice where there is one."""
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# {title}", "",
             f"- machine: {machine()}",
             f"- commit: {commit()}",
             f"- date: {date}",
             f"- load: {load_line(record)}",
             f"- command: `{command()}`", ""]
    notices = [text for text in (busy_notice(record), reused_notice()) if text]
    return "\n".join(lines + notices)


def write_results(args: argparse.Namespace, title: str, body: str) -> Path | None:
    """Write `header(title)` + `body` to `args.out` unless `args.no_write`, with every path of this machine
    made relative (`portable`); returns the path written."""
    if getattr(args, "no_write", False):
        return None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(portable(header(title, getattr(args, "load_record", None)) + "\n" + body.rstrip() + "\n"))
    print(f"results written to {out}")
    return out


def run_resumable(command: list[str], run_dir: Path, marker: str, env: dict[str, str], shown: str,
                  failure: str) -> float:
    """Run a benchmark's `command` (`[python, script, args...]`) in a subprocess from the repository root,
    output streamed, and record it in `run_dir/marker`; the seconds it took. When that record holds the
    same command (an interrupted benchmark given the same `--run-dir`), the finished run is reused
    instead. `shown` is the command as a user types it; a failed run stops the benchmark with `failure`."""
    finished = run_dir / marker
    record = json.loads(finished.read_text()) if finished.is_file() else None
    if record is not None and record["command"] == command[1:]:
        print(f"reusing the finished run in {run_dir}", flush=True)
        REUSED_RUN_LOADS.append(record.get("load_at_start"))
        return record["seconds"]
    print(f"$ {shown}  ({run_dir})", flush=True)
    load = load_average()
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{failure} failed with exit status {done.returncode}: see {run_dir}")
    finished.write_text(json.dumps({"command": command[1:], "seconds": seconds,
                                    "load_at_start": None if load is None else load[0]}))
    return seconds
