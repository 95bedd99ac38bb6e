"""How long the README's test command (`make test`: pytest on 2 workers, tests of one xdist group in one
worker) takes on this machine, and where the time goes: per worker, per xdist group and per test.

    python benchmarks/suite_time.py                     # the whole suite, as `make test` runs it
    python benchmarks/suite_time.py -- -m "not slow"    # pytest arguments after --

The suite runs in a subprocess with the plugin benchmarks/suite_timeline.py, which writes every test's
setup, call and teardown times; CPU seconds are those of pytest and every process it started (user +
system, from getrusage). The target is 10 minutes of wall time on 2 cores. `make test` leaves out the
reproduction of the README demo (`make reproduce`, marker `reproduction`), and so does this command unless
its pytest arguments select it. Writes docs/results/suite_time.md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import Measures, add_output_arguments, quiet_machine_guard, write_results  # noqa: E402
from suite_timeline import TIMELINE_ENV  # noqa: E402

TARGET_S = 600.0  # the suite under 10 minutes on 2 cores
NO_GROUP = "(none: any worker)"
GROUP_SUFFIX = re.compile(r"@([^@\[\]]+)$")  # xdist's `--dist loadgroup` appends `@<group>` to a node id
SUMMARY_LINE = re.compile(r"^=*\s*(\d+ (passed|failed|error).*) in ([\d.]+)s", re.M)


def read_timeline(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def file_of(nodeid: str) -> str:
    """The test file a node id names."""
    return nodeid.split("::", 1)[0]


def group_of(nodeid: str) -> str:
    """The xdist group a node id names (`...::test[params]@group`), or NO_GROUP."""
    found = GROUP_SUFFIX.search(nodeid)
    return found.group(1) if found else NO_GROUP


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Seconds per test (its phases summed, setup apart), per worker, per xdist group and per test file."""
    tests: dict[str, dict[str, Any]] = {}
    for record in records:
        test = tests.setdefault(record["nodeid"], {"nodeid": record["nodeid"], "worker": record["worker"],
                                                   "group": group_of(record["nodeid"]), "setup": 0.0, "total": 0.0})
        seconds = max(0.0, record["stop"] - record["start"])
        test["total"] += seconds
        if record["when"] == "setup":
            test["setup"] += seconds
    return {"tests": sorted(tests.values(), key=lambda t: -t["total"]),
            "workers": dict(sorted(_tally(tests.values(), lambda t: t["worker"], "busy").items())),
            "groups": _by_seconds(_tally(tests.values(), lambda t: t["group"])),
            "files": _by_seconds(_tally(tests.values(), lambda t: file_of(t["nodeid"]))),
            "test_seconds": sum(t["total"] for t in tests.values())}


def _tally(tests: Iterable[dict[str, Any]], key: Callable[[dict[str, Any]], str],
           seconds: str = "seconds") -> dict[str, dict[str, float]]:
    """Tests and their seconds summed per key(test), the seconds under the name `seconds`."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: {"tests": 0, seconds: 0.0})
    for test in tests:
        totals[key(test)]["tests"] += 1
        totals[key(test)][seconds] += test["total"]
    return dict(totals)


def _by_seconds(totals: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return dict(sorted(totals.items(), key=lambda item: -item[1]["seconds"]))


def render(summary: dict[str, Any], wall_s: float, cpu_s: float, outcome: str, top: int) -> str:
    """The results file's body: the target, the totals, then workers, groups, the slowest files and tests."""
    met = "met" if wall_s < TARGET_S else "not met"
    total = summary["test_seconds"] or 1.0
    lines = [f"Target: the suite under {TARGET_S / 60:.0f} minutes ({TARGET_S:.0f} s) of wall time on 2 cores: "
             f"**{met}**.", "",
             "| wall s | CPU s (user + system) | cores busy | test seconds (summed over workers) | pytest |",
             "|---|---|---|---|---|",
             f"| {wall_s:.0f} | {cpu_s:.0f} | {cpu_s / wall_s:.2f} | {summary['test_seconds']:.0f} | {outcome} |", "",
             "## Workers", "", "| worker | tests | busy s |", "|---|---|---|"]
    lines += [f"| {name} | {w['tests']} | {w['busy']:.0f} |" for name, w in summary["workers"].items()]
    lines += ["", "## xdist groups (each runs in one worker)", "", "| group | tests | seconds | share |",
              "|---|---|---|---|"]
    lines += [f"| {name} | {g['tests']} | {g['seconds']:.0f} | {100 * g['seconds'] / total:.0f}% |"
              for name, g in summary["groups"].items()]
    lines += ["", f"## The {top} slowest test files (their tests' seconds summed)", "",
              "| seconds | tests | file |", "|---|---|---|"]
    lines += [f"| {f['seconds']:.0f} | {f['tests']} | `{name}` |" for name, f in list(summary["files"].items())[:top]]
    lines += ["", f"## The {top} slowest tests (setup includes the fixtures they build first)", "",
              "| seconds | of which setup | worker | test |", "|---|---|---|---|"]
    lines += [f"| {t['total']:.1f} | {t['setup']:.1f} | {t['worker']} | `{t['nodeid']}` |"
              for t in summary["tests"][:top]]
    return "\n".join(lines)


def run_suite(pytest_args: list[str], workers: int, timeline: Path) -> tuple[int, float, float, str]:
    """pytest as `make test` runs it, with the timeline plugin: (exit status, wall s, CPU s, its summary line)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", TIMELINE_ENV: str(timeline),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "pytest", "-q", "-n", str(workers), "--dist", "loadgroup", "-p", "suite_timeline",
               *pytest_args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    for line in process.stdout:
        sys.stdout.write(line)
        output.append(line)
    status = process.wait()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = SUMMARY_LINE.findall("".join(output[-200:]))
    return status, wall, cpu, found[-1][0] if found else f"exit status {status}, no summary line"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (make test: 2)")
    parser.add_argument("--top", type=int, default=20, help="the slowest tests listed")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    add_output_arguments(parser, "suite_time")
    args = parser.parse_args(argv)
    quiet_machine_guard(args, Measures.TIME)
    with tempfile.TemporaryDirectory(prefix="suite_time_") as folder:
        timeline = Path(folder) / "timeline.jsonl"
        status, wall, cpu, outcome = run_suite(args.pytest_args, args.workers, timeline)
        summary = summarize(read_timeline(timeline))
    body = render(summary, wall, cpu, outcome, args.top)
    print(body)
    write_results(args, "Test suite time (make test)", body)
    return status


if __name__ == "__main__":
    sys.exit(main())
