"""The README's demo command, run again here, gives a per-rating r within the interval that
docs/results/demo.md records: one run's r moves with the seed, the CPU's kernels and the threads its features
were extracted with; the interval (mean ± 3 sd over seeds and kernels) says how far."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from empathic_fusion.utils import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))

import demo_runs  # noqa: E402

README_COMMAND = "python train.py experiment=demo"
STEADY_SPREAD = 0.05  # per-rating r: well under the gap between a model that learned and one that did not


def test_demo_md_records_the_range_of_the_readme_command_over_seeds():
    recorded = demo_runs.recorded_ranges()["lf_lstm_vat"]
    assert recorded["command"] == README_COMMAND and README_COMMAND in (PROJECT_ROOT / "README.md").read_text()
    rating = recorded["rating_pearson"]
    assert len(recorded["seeds"]) >= 5 and recorded["default_seed"] in recorded["seeds"]
    assert rating["min"] <= rating["default_seed"] <= rating["max"] and rating["sd"] > 0
    expected = recorded["expected_rating_pearson"]
    assert expected["runs"] >= len(recorded["seeds"]) + len(recorded["kernels"]) >= 7
    rounding = 0.5e-6 * (2 + demo_runs.EXPECTED_SDS) + 1e-9  # each value is rounded to 6 decimals in the file
    assert expected["low"] == pytest.approx(expected["mean"] - demo_runs.EXPECTED_SDS * expected["sd"], abs=rounding)
    assert expected["low"] <= rating["min"] and rating["max"] <= expected["high"]


def test_the_demo_is_a_steady_yardstick_over_seeds_and_cpu_kernels():
    """One run of `make train` is compared with the recorded range, so its r must travel: its spread over seeds
    (sd) stays under STEADY_SPREAD in per-rating r, and another CPU's kernels move it no further than another
    seed does: each kernel variant of the default seed lies within EXPECTED_SDS sd of the seeds' mean (the
    assumption of the range a new run is checked against)."""
    recorded = demo_runs.recorded_ranges()["lf_lstm_vat"]
    seeds = recorded["rating_pearson"]
    by_kernels = [seeds["default_seed"]] + [variant["rating_pearson"] for variant in recorded["kernels"].values()]
    assert seeds["sd"] < STEADY_SPREAD, seeds
    assert len(by_kernels) >= 3, by_kernels
    assert all(abs(r - seeds["mean"]) <= demo_runs.EXPECTED_SDS * seeds["sd"] for r in by_kernels), (by_kernels, seeds)


def test_the_expected_range_is_the_mean_plus_minus_three_sd_of_every_run():
    runs = [demo_runs.DemoRun("lf_lstm_vat", seed, seed == 42, "", "AVX512", 1.0,
                              {"rating": {"pearson": r}, "window": {"pearson": r}}, Path("."))
            for seed, r in zip((42, 0, 1, 2), (0.40, 0.44, 0.48, 0.52))]
    expected = demo_runs.expected_range(runs)
    sd = 0.05163977794943222  # statistics.stdev of the four values, by hand: sqrt(0.008 / 3)
    assert expected["mean"] == pytest.approx(0.46) and expected["sd"] == pytest.approx(sd)
    assert (expected["low"], expected["high"]) == pytest.approx((0.46 - 3 * sd, 0.46 + 3 * sd))


def test_recorded_ranges_reads_the_json_block_after_its_marker(tmp_path):
    summary = {"lf_lstm_vat": {"rating_pearson": {"min": 0.1, "max": 0.9}}}
    path = tmp_path / "demo.md"
    path.write_text(f"# Demo\n\n```json\n{{}}\n```\n\n{demo_runs.SUMMARY_START}\n```json\n{json.dumps(summary)}\n```\n")
    assert demo_runs.recorded_ranges(path) == summary


@pytest.mark.slow
@pytest.mark.reproduction  # make reproduce (CI, after make test): the whole demo, not a test of one part
def test_the_readme_demo_command_lands_within_the_recorded_seed_range(tmp_path: Path):
    """`python train.py experiment=demo` as the README types it, from another folder, its outputs in tmp_path;
    the demo data and their features are shared with `make train` (the ignored data/ folder: generated
    there by the first run, reused after). Run it with `make reproduce` or `pytest -m reproduction`."""
    recorded = demo_runs.recorded_ranges()["lf_lstm_vat"]["expected_rating_pearson"]
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, str(PROJECT_ROOT / "train.py"), *README_COMMAND.split()[2:],
                           f"hydra.run.dir={run_dir}"], cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads((run_dir / "test_metrics.json").read_text())["model"]["rating"]["pearson"]
    printed = re.search(r"^\| LFLSTM \(per rating\)\s*\|\s*(-?[\d.]+) \|", done.stdout + done.stderr, re.M)
    assert printed and float(printed.group(1)) == pytest.approx(r, abs=5e-4)
    assert recorded["low"] <= r <= recorded["high"], (
        f"per-rating r {r:.3f} is outside [{recorded['low']:.3f}, {recorded['high']:.3f}], the mean ± 3 sd over the "
        "runs in docs/results/demo.md: the demo changed since it was written (run benchmarks/demo_runs.py again)")


def test_make_test_leaves_the_reproduction_out_and_make_reproduce_runs_it_alone():
    """pyproject.toml's addopts deselect the `reproduction` marker; `make reproduce` (run by CI after make test)
    selects it, so the README demo command is still run on every CI run."""
    def collected(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               str(Path(__file__)), *args], cwd=PROJECT_ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout

    demo = test_the_readme_demo_command_lands_within_the_recorded_seed_range.__name__
    other = test_demo_md_records_the_range_of_the_readme_command_over_seeds.__name__
    suite, reproduction = collected(), collected("-m", "reproduction")
    assert demo not in suite and other in suite
    assert demo in reproduction and other not in reproduction
    assert "-m reproduction" in (PROJECT_ROOT / "Makefile").read_text()
    assert "make reproduce" in (PROJECT_ROOT / ".ci" / "run").read_text()
