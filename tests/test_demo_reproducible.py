"""The README's demo command, run again here, gives a per-rating r within the range over seeds that
docs/results/demo.md records: one run's r moves with the seed and the CPU's kernels, the range says how far."""
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


def test_demo_md_records_the_range_of_the_readme_command_over_seeds():
    recorded = demo_runs.recorded_ranges()["lf_lstm_vat"]
    assert recorded["command"] == README_COMMAND and README_COMMAND in (PROJECT_ROOT / "README.md").read_text()
    rating = recorded["rating_pearson"]
    assert len(recorded["seeds"]) >= 5 and recorded["default_seed"] in recorded["seeds"]
    assert rating["min"] <= rating["default_seed"] <= rating["max"] and rating["sd"] > 0


def test_recorded_ranges_reads_the_json_block_after_its_marker(tmp_path):
    summary = {"lf_lstm_vat": {"rating_pearson": {"min": 0.1, "max": 0.9}}}
    path = tmp_path / "demo.md"
    path.write_text(f"# Demo\n\n```json\n{{}}\n```\n\n{demo_runs.SUMMARY_START}\n```json\n{json.dumps(summary)}\n```\n")
    assert demo_runs.recorded_ranges(path) == summary


@pytest.mark.slow
@pytest.mark.xdist_group("readme_demo")  # its own worker under make test: it generates and extracts the demo
def test_the_readme_demo_command_lands_within_the_recorded_seed_range(tmp_path: Path):
    """`python train.py experiment=demo` as the README types it, from another folder, its outputs in tmp_path;
    the demo data and their features are shared with `make train` (the ignored data/ folder: generated
    there by the first run, reused after)."""
    recorded = demo_runs.recorded_ranges()["lf_lstm_vat"]["rating_pearson"]
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, str(PROJECT_ROOT / "train.py"), *README_COMMAND.split()[2:],
                           f"hydra.run.dir={run_dir}"], cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads((run_dir / "test_metrics.json").read_text())["model"]["rating"]["pearson"]
    printed = re.search(r"^\| LFLSTM \(per rating\)\s*\|\s*(-?[\d.]+) \|", done.stdout + done.stderr, re.M)
    assert printed and float(printed.group(1)) == pytest.approx(r, abs=5e-4)
    rounding = 1e-5  # demo.md records r to 6 decimals
    assert recorded["min"] - rounding <= r <= recorded["max"] + rounding, (
        f"per-rating r {r:.3f} is outside [{recorded['min']:.3f}, {recorded['max']:.3f}], the range over the seeds "
        "in docs/results/demo.md: the demo changed since it was written (run benchmarks/demo_runs.py again)")
