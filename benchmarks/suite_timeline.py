"""A pytest plugin that writes when each test's setup, call and teardown ran, and in which xdist worker, one
JSON line per phase, to the file $SUITE_TIMELINE names (benchmarks/suite_time.py loads it with
`-p suite_timeline`). Every worker appends to the same file: each line is one small write."""
from __future__ import annotations

import json
import os

TIMELINE_ENV = "SUITE_TIMELINE"


def phase_record(nodeid: str, when: str, start: float, stop: float, outcome: str) -> dict:
    """One phase of one test: its node id (with xdist's `@group` suffix), the worker that ran it, when it
    started and stopped (seconds since the epoch) and how it ended."""
    return {"nodeid": nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "when": when,
            "start": start, "stop": stop, "outcome": outcome}


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get(TIMELINE_ENV)
    if not path or getattr(report, "start", None) is None or hasattr(report, "node"):
        return  # under xdist the controller sees each worker's report again (with .node): the worker wrote it
    line = json.dumps(phase_record(report.nodeid, report.when, report.start, report.stop, report.outcome))
    with open(path, "a", encoding="utf-8") as timeline:
        timeline.write(line + "\n")
