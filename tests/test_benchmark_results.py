"""The benchmarks write their results into docs/results/ themselves, with where and how they were measured."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from empathic_fusion.utils import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))

import before_after  # noqa: E402
import results  # noqa: E402
import train_throughput  # noqa: E402

TINY = ["--steps", "2", "--warmup", "1", "--batch-size", "4", "--frames", "8", "--models", "tfn"]


def test_results_file_names_machine_commit_date_and_command(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(PROJECT_ROOT / "benchmarks" / "x.py"), "--steps", "3", "a b"])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "x.md"
    written = results.write_results(type("Args", (), {"out": out, "no_write": False})(), "Title", "| a |\n|---|\n| 1 |")
    text = out.read_text()
    assert written == out and text.startswith("# Title\n")
    assert re.search(r"^- machine: .+\d+ of \d+ cores usable", text, re.M)
    assert re.search(r"^- commit: ([0-9a-f]{40}(-dirty)?|unknown)$", text, re.M)
    assert re.search(r"^- date: \d{4}-\d\d-\d\d \d\d:\d\d UTC$", text, re.M)
    assert "- command: `OMP_NUM_THREADS=1 python benchmarks/x.py --steps 3 'a b'`" in text
    assert text.rstrip().endswith("| 1 |")


def test_no_write_writes_nothing(tmp_path):
    out = tmp_path / "x.md"
    assert results.write_results(type("Args", (), {"out": out, "no_write": True})(), "T", "body") is None
    assert not out.exists()


def test_train_throughput_writes_its_table(tmp_path):
    out = tmp_path / "train_throughput.md"
    result = train_throughput.main(["--device", "cpu", *TINY, "--out", str(out)])
    text = out.read_text()
    (row,) = [line for line in text.splitlines() if line.startswith("| tfn |")]
    assert f"{result['models'][0]['parameters']:,}" in row
    assert "- command: `" in text and "Grid: 1 models" in text


@pytest.mark.gpu
def test_train_throughput_on_the_gpu_in_bf16(tmp_path):
    result = train_throughput.main(["--device", "cuda", *TINY, "--out", str(tmp_path / "gpu.md")])
    (row,) = result["models"]
    assert row["precision"] == "bf16-mixed" and row["peak_gpu_memory_gib"] > 0 and row["train_samples_per_s"] > 0
    assert "GPU: " in (tmp_path / "gpu.md").read_text()


def _report(path: Path, r: float, extra_row: bool = False) -> None:
    metrics = {"pearson": r, "mse": 0.2}
    report = {"model": {"window": metrics, "rating": {**metrics, "pearson": r + 0.1}},
              "constant_baseline": {"rating": {"pearson": 0.0, "mse": 0.3}}, "ci": {"ignored": 1.0}}
    if extra_row:
        report["baselines"] = {"TF-IDF + ridge": {"rating": {"pearson": 0.05}}}
    path.mkdir(parents=True)
    (path / "test_metrics.json").write_text(json.dumps(report))


def test_before_after_shows_every_value_and_the_largest_difference(tmp_path):
    _report(tmp_path / "old" / "0", 0.5)
    _report(tmp_path / "old" / "1", 0.4)
    _report(tmp_path / "new" / "0", 0.5)
    _report(tmp_path / "new" / "1", 0.45, extra_row=True)
    section, largest = before_after.compare("folds", tmp_path / "old", tmp_path / "new")
    assert largest == pytest.approx(0.05)
    assert "| model/rating | 0.6000 / 0.6000 | 0.2000 / 0.2000 | 0 |" in section
    assert "| model/window | 0.4000 / 0.4500 | 0.2000 / 0.2000 | 0.05 |" in section
    assert "| baselines/TF-IDF + ridge/rating | - / 0.0500 | - / - | - |" in section
    assert "ignored" not in section  # confidence intervals are not metric rows


def test_before_after_equal_runs_differ_by_zero(tmp_path):
    _report(tmp_path / "a", 0.3)
    _report(tmp_path / "b", 0.3)
    for side, shift in (("a", 0.0), ("b", 0.25)):
        (tmp_path / side / "test_predictions.csv").write_text(f"rating_index,predicted\n0,{2.5 + shift}\n1,3.5\n")
    out = tmp_path / "before_after.md"
    before_after.main(["--pair", "demo", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)])
    text = out.read_text()
    assert "| demo | 0 |" in text
    assert "test_predictions.csv: 2 rows on both sides; largest absolute difference of a prediction: 0.25" in text


def test_empathetic_exchanges_summary_puts_both_recipes_beside_the_baselines_and_counts_folds_won():
    import empathetic_exchanges

    def fold(model: float, finetuned: float, tfidf: float) -> tuple[dict, dict]:
        rating = lambda r: {"pearson": r, "spearman": r, "mse": 1.3 - r, "qwk": r / 2, "macro_f1": 0.15}  # noqa: E731
        stack = {"TF-IDF ridge": {"weight": 0.2, "held_out_r": 0.1, "fit_seconds": 3.0}}
        base = {"TF-IDF + ridge": {"rating": rating(tfidf)}}
        return ({"model": {"rating": rating(model)}, "baselines": base, "stack": stack},
                {"model": {"rating": rating(finetuned)}, "baselines": base, "stack": stack})

    pairs = [fold(0.22, 0.25, 0.10), fold(0.20, 0.19, 0.12), fold(0.24, 0.30, 0.25)]
    folds = {"default": [p[0] for p in pairs], "finetune": [p[1] for p in pairs]}
    text = empathetic_exchanges.summary_table(folds, {"default": [10, 11, 12], "finetune": [100, 110, 120]})
    cpu, gpu = empathetic_exchanges.RECIPES["default"], empathetic_exchanges.RECIPES["finetune"]
    assert f"| {cpu} | 0.220 ± 0.020 |" in text and f"| {gpu} | 0.247 ± 0.055 |" in text
    assert f"{cpu} vs TF-IDF + ridge: wins on mean r, rho and QWK (higher r on 2/3, rho on 2/3, QWK on 2/3 folds)" in text
    assert f"{gpu} vs {cpu}: wins on mean r, rho and QWK (higher r on 2/3" in text
    assert f"{cpu} vs {gpu}" not in text  # each pair once
    assert f"{gpu}, seconds per fold (CPU): 100, 110, 120" in text
