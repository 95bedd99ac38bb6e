"""benchmarks/suite_time.py: the README's test command timed per worker, per xdist group and per test, from
the phases its pytest plugin (benchmarks/suite_timeline.py) writes."""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace

from empathic_fusion.utils import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))

import suite_time  # noqa: E402
import suite_timeline  # noqa: E402


def _phase(nodeid: str, when: str, start: float, stop: float, worker: str = "gw0") -> dict:
    return {"nodeid": nodeid, "worker": worker, "when": when, "start": start, "stop": stop, "outcome": "passed"}


def test_seconds_are_summed_per_test_worker_and_group_with_setup_apart():
    records = [_phase("t.py::a@tiny", "setup", 0, 100), _phase("t.py::a@tiny", "call", 100, 102),
               _phase("t.py::a@tiny", "teardown", 102, 102.5),
               _phase("t.py::b[x@y]", "call", 0, 30, "gw1"), _phase("u.py::c@tiny", "call", 103, 110)]
    summary = suite_time.summarize(records)
    assert [t["nodeid"] for t in summary["tests"]] == ["t.py::a@tiny", "t.py::b[x@y]", "u.py::c@tiny"]
    first = summary["tests"][0]
    assert (first["total"], first["setup"], first["group"]) == (102.5, 100, "tiny")
    assert summary["groups"] == {"tiny": {"tests": 2, "seconds": 109.5},
                                 suite_time.NO_GROUP: {"tests": 1, "seconds": 30}}
    assert summary["workers"] == {"gw0": {"tests": 2, "busy": 109.5}, "gw1": {"tests": 1, "busy": 30}}
    assert summary["test_seconds"] == 139.5
    assert summary["files"] == {"t.py": {"tests": 2, "seconds": 132.5}, "u.py": {"tests": 1, "seconds": 7}}


def test_the_body_says_whether_the_target_is_met_and_lists_the_slowest_tests():
    summary = suite_time.summarize([_phase("t.py::a", "call", 0, 5), _phase("t.py::b", "call", 0, 1)])
    body = suite_time.render(summary, 599.0, 1100.0, "2 passed", top=1)
    assert "**met**" in body and "| 599 | 1100 | 1.84 | 6 | 2 passed |" in body
    assert "`t.py::a`" in body and "`t.py::b`" not in body
    assert "**not met**" in suite_time.render(summary, 600.0, 1100.0, "2 passed", top=1)


def test_the_group_is_the_suffix_xdist_appends_not_an_at_sign_in_a_parameter():
    assert suite_time.group_of("t.py::a[p-1]@tiny_dataset") == "tiny_dataset"
    assert suite_time.group_of("t.py::b[x@y]") == suite_time.group_of("t.py::c") == suite_time.NO_GROUP


def test_the_summary_line_of_pytest_is_found():
    output = "....\n= 842 passed, 7 skipped, 258 warnings in 758.04s (0:12:38) =\n"
    assert suite_time.SUMMARY_LINE.findall(output)[-1][0] == "842 passed, 7 skipped, 258 warnings"
    assert suite_time.SUMMARY_LINE.findall("2 failed, 10 passed in 12.00s")[-1][2] == "12.00"


def test_the_plugin_writes_a_workers_report_once(tmp_path, monkeypatch):
    timeline = tmp_path / "timeline.jsonl"
    monkeypatch.setenv(suite_timeline.TIMELINE_ENV, str(timeline))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    report = SimpleNamespace(nodeid="t.py::a@g", when="call", start=1.0, stop=3.5, outcome="passed")
    suite_timeline.pytest_runtest_logreport(report)
    suite_timeline.pytest_runtest_logreport(SimpleNamespace(**vars(report), node="gw1"))  # the controller's copy
    assert [json.loads(line) for line in timeline.read_text().splitlines()] == [
        {"nodeid": "t.py::a@g", "worker": "gw1", "when": "call", "start": 1.0, "stop": 3.5, "outcome": "passed"}]


def test_a_real_run_on_two_workers_records_each_phase_of_each_test_once(tmp_path):
    """Under xdist each worker runs the plugin and the controller sees every report again: one line per phase."""
    (tmp_path / "test_few.py").write_text("import pytest\n\n@pytest.mark.parametrize('n', range(6))\n"
                                          "def test_n(n):\n    assert n >= 0\n")
    timeline = tmp_path / "timeline.jsonl"
    status, wall, cpu, outcome = suite_time.run_suite([str(tmp_path / "test_few.py"), "-p", "no:cacheprovider"], 2,
                                                      timeline)
    records = suite_time.read_timeline(timeline)
    assert status == 0 and outcome.startswith("6 passed") and wall > 0 and cpu > 0
    assert len(records) == 3 * 6 and {r["when"] for r in records} == {"setup", "call", "teardown"}
    assert len({(r["nodeid"], r["when"]) for r in records}) == len(records)
    assert {r["worker"] for r in records} <= {"gw0", "gw1"}
