"""benchmarks/sweep_cost.py at CI size (the real train.py sweep on a synthetic store), and grid.py's steady-state
window for runs at once."""
from __future__ import annotations

import sys

import pytest

from empathic_fusion.utils import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))

import grid  # noqa: E402
import sweep_cost  # noqa: E402


def test_the_sweep_benchmark_counts_every_job_and_projects_the_grid(tmp_path):
    result = sweep_cost.main(["--fraction", "0.002", "--sessions", "4", "--models", "tfn,mean", "--subsets", "t,v+a+t",
                              "--seeds", "1", "--no-write", "--allow-busy", "--work", str(tmp_path / "work"), "--keep"])
    [run] = result["runs"].values()
    jobs = run["jobs"]
    assert [(j["model"], j["subset"]) for j in jobs] == [("tfn", "t"), ("mean", "t"), ("tfn", "v+a+t"),
                                                         ("mean", "v+a+t")]  # the subset varies slowest
    assert jobs[0]["process_start_s"] > 0 and all(j["process_start_s"] is None for j in jobs[1:])
    # the second job of each subset reuses the first one's set-up (no frame fill of its own)
    assert ["setup/frames" in j["seconds"] for j in jobs] == [True, False, True, False]
    for job in jobs:
        assert job["steps_s"] > 0 and job["fixed_s"] > 0
        assert job["wall_s"] == pytest.approx(job["steps_s"] + job["fixed_s"])
    assert sum(j["wall_s"] for j in jobs) <= run["wall_s"]
    projection = result["projection"][next(iter(result["runs"]))]
    assert projection["cells"] == 4 and projection["steps_h"] > 0 and projection["setup_h"] > 0
    assert projection["total_h"] == pytest.approx(projection["steps_h"] + projection["setup_h"] + projection["other_h"]
                                                  + projection["start_s"] / 3600)


def test_runs_at_once_are_measured_where_every_run_is_in_its_steady_state():
    # run a starts first and stops first; b starts 1 s later: the window is [1, 3] s, where each ends 2 steps
    runs = [{"start": 0.0, "stop": 3.0, "ends": [0.5, 1.5, 2.5, 3.0]},
            {"start": 1.0, "stop": 4.0, "ends": [1.2, 2.2, 3.5, 4.0]}]
    steady = grid.steady_state(runs, batch_size=10)
    assert steady["steps"] == [3, 2] and steady["seconds"] == pytest.approx(2.0)
    assert steady["rate"] == pytest.approx(5 * 10 / 2.0)
