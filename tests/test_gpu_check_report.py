"""benchmarks/gpu_check_report.py writes docs/results/gpu/gpu_check.md from the logs a GPU check brought
back: a part still running when the whole call was stopped gets a row, the timing parts' tables come
from their logs (without warnings), linked to their results file only when that file is this check's, and
the fine-tuned text recipe's sweep says per fold whether it took 60 s or less."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from empathic_fusion.utils import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
import gpu_check_report  # noqa: E402

COMMIT = "4929513dd2325c49d0212f3eb8199edf8f31c8d4"


def _logs(root: Path) -> Path:
    logs = root / "logs"
    logs.mkdir()
    (logs / "header.md").write_text(f"# GPU check\n\n- machine: GPU X\n- commit: {COMMIT}\n\n| part | outcome | seconds |\n")
    (logs / "summary.md").write_text("| models_vs_mmsa | passed | 27 s |\n| step_overhead | passed | 86 s |\n")
    (logs / "models_vs_mmsa.log").write_text(
        "GPU X, batch 64\n\n| precision | model | ours ms/step |\n|---|---|---|\n"
        "/site-packages/torch/nn/modules/rnn.py:1169: UserWarning: RNN module weights are not contiguous\n"
        "  result = _VF.lstm(\n| 32 | tfn | 7.31 |\nresults written to docs/results/gpu/models_vs_mmsa.md\n")
    (logs / "step_overhead.log").write_text(
        "round 1/1 (after) done\nGPU available: True (cuda), used: True\nTPU available: False, using: 0 TPU cores\n"
        "\U0001f4a1 Tip: For seamless cloud logging, try installing litlogger\nSeed set to 0\n"
        "You are using a CUDA device ('GPU X') that has Tensor Cores.\nLOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0]\n"
        "USDT:2026-11-28 00:01:10 18916:18916 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
        "/venv/lib/python3.12/site-packages/lightning/pytorch/utilities/_pytree.py:21: `isinstance(treespec, "
        "LeafSpec)` is deprecated\n\n| model | net ms |\n|---|---|\n| tfn | 8.54 |\n")
    (logs / "grid.log").write_text("Synthetic store: 0.44 GB on disk\n")
    return logs


def test_the_report_keeps_the_timing_tables_and_a_part_cut_by_the_call(tmp_path):
    logs = _logs(tmp_path)
    out = tmp_path / "results" / "gpu_check.md"
    out.parent.mkdir()
    (out.parent / "models_vs_mmsa.md").write_text(f"# ours vs MMSA\n\n- commit: {COMMIT}\n")
    (out.parent / "step_overhead.md").write_text("# steps\n\n- commit: d149dcf62406c44ba6e5d4b777f9f01859e6b69c\n")
    assert gpu_check_report.main([str(logs), str(out)]) == 0
    report = out.read_text()
    assert "| grid | stopped with the whole check (no outcome recorded) | - |" in report
    mmsa = report.split("## Our nets against MMSA's")[1].split("## ")[0]
    assert "[models_vs_mmsa.md](models_vs_mmsa.md)" in mmsa
    assert "| 32 | tfn | 7.31 |" in mmsa and "| precision | model | ours ms/step |" in mmsa
    assert "Warning" not in mmsa and "_VF.lstm" not in mmsa and "results written" not in mmsa
    steps = report.split("## The step overhead")[1].split("## ")[0]
    assert "its results file (step_overhead.md) is not this check's" in steps and "| tfn | 8.54 |" in steps
    assert not any(banner in steps for banner in ("available:", "Tip:", "Seed set", "Tensor Cores", "LOCAL_RANK",
                                                  "USDT", "_pytree"))  # Lightning's and the profiler's banners
    assert "round 1/1" not in steps
    assert "## The grid" not in report  # no outcome, so no tables to read: the row says what happened


def _report_of_one_part(root: Path, part: str, outcome: str, log: str) -> str:
    """The report of the logs with one more part: its summary row (outcome and seconds) and its log."""
    logs = _logs(root)
    with (logs / "summary.md").open("a") as summary:
        summary.write(f"| {part} | {outcome} |\n")
    (logs / f"{part}.log").write_text(log)
    out = root / "results" / "gpu_check.md"
    assert gpu_check_report.main([str(logs), str(out)]) == 0
    return out.read_text()


def test_the_report_says_whether_a_run_captured_its_step(tmp_path):
    report = _report_of_one_part(
        tmp_path, "train_tfn_step_graph", "passed | 41 s",
        "frame arrays (0.17 GB in bfloat16): in memory on cuda:0 (they fit 50% of the 79.1 GB free on cuda:0 at setup)\n"
        "step graph: the training step for batches of 64 windows is captured as one CUDA graph after 3 warm-up steps "
        "(a batch of another size runs eagerly)\n")
    section = report.split("model.step_graph=true")[1].split("## ")[0]
    assert "`step graph: the training step for batches of 64 windows is captured as one CUDA graph" in section
    assert "in bfloat16): in memory on cuda:0" in section and "(no test table)" in section


def test_the_report_says_where_a_whole_corpus_store_put_its_frames(tmp_path):
    report = _report_of_one_part(
        tmp_path, "train_full_corpus", "passed | 201 s",
        "synthetic store (1.0, 200: fraction of EmpathicStories++, sessions): 10.79 GB on disk, written in 97 s\n"
        "GPU available: True (cuda), used: True\n"
        "frame arrays (8.10 GB in bfloat16): in memory on cuda:0 (they fit 50% of the 79.1 GB free on cuda:0 at setup)\n")
    section = report.split("## A store of the whole corpus's size")[1].split("## ")[0]
    assert "`synthetic store (1.0, 200: fraction of EmpathicStories++, sessions): 10.79 GB on disk" in section
    assert "`frame arrays (8.10 GB in bfloat16): in memory on cuda:0" in section
    assert "| " not in section  # a short epoch's metrics say nothing: no table


def test_a_whole_corpus_run_cut_before_its_setup_says_so(tmp_path):
    report = _report_of_one_part(tmp_path, "train_full_corpus", "stopped at its 240 s limit | 240 s", "")
    assert "(no frame-array line in the log: the run stopped before its setup)" in report


def _fold(sweep: Path, job: int, seconds: float | None, fit_seconds: float = 21.0) -> None:
    """A job folder of the text sweep: its config written `seconds` before its test metrics (None: never finished)."""
    folder = sweep / str(job)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
    if seconds is None:
        return
    metrics = folder / "test_metrics.json"
    metrics.write_text(json.dumps({"model": {"rating": {"pearson": 0.3}},
                                   "baselines": {"training mean": {"rating": {"pearson": 0.0}}},
                                   "stack": {"fine-tuned encoder": {"fit_seconds": fit_seconds}}}))
    started = (folder / ".hydra" / "config.yaml").stat().st_mtime
    os.utime(metrics, (started + seconds, started + seconds))


def test_the_text_sweep_says_whether_each_fold_is_within_60_seconds(tmp_path):
    """The recipe as shipped, one fold at a time: per fold its seconds, the verdict against 60 s and the
    fine-tuned expert's fit seconds; the section also alone in gpu_check_text.md beside the report."""
    logs = _logs(tmp_path)
    with (logs / "summary.md").open("a") as summary:
        summary.write("| text_finetune_sweep | passed | 150 s |\n")
    (logs / "text_command.txt").write_text("train.py -m experiment=text_empathetic_exchanges_finetune trainer=gpu "
                                           "hydra/launcher=shared_device data.cv_fold=0,1,2 hydra.launcher.n_jobs=1\n")
    sweep = logs / "text_finetune_sweep"
    for job, seconds in enumerate((48.0, 71.0, None)):
        _fold(sweep, job, seconds)
    out = tmp_path / "results" / "gpu_check.md"
    assert gpu_check_report.main([str(logs), str(out)]) == 0
    section = out.read_text().split("## The fine-tuned text recipe")[1].split("\n## ")[0]
    assert "the recipe as shipped (conf/model/text_finetune.yaml)" in section and "one fold at a time" in section
    assert "| job | seconds | within 60 s | fine-tuning s | model r | training mean r |" in section
    assert "| 0 | 48 | yes | 21 | 0.300 | 0.000 |" in section and "| 1 | 71 | no | 21 | 0.300 | 0.000 |" in section
    assert "| 2 | - | no (did not finish) |" in section
    assert "Target 60 s per fold: 1 of 3 folds within it (1 without seconds" in section
    alone = (out.parent / "gpu_check_text.md").read_text()
    assert "| text_finetune_sweep | passed | 150 s |" in alone and "| 0 | 48 | yes | 21 |" in alone
    assert f"- commit: {COMMIT}" in alone and "## Our nets against MMSA's" not in alone


def test_a_reduced_text_sweep_says_so(tmp_path):
    logs = _logs(tmp_path)
    with (logs / "summary.md").open("a") as summary:
        summary.write("| text_finetune_sweep | passed | 90 s |\n")
    (logs / "text_command.txt").write_text("train.py -m experiment=text_empathetic_exchanges_finetune data.cv_fold=0,1 "
                                           "hydra.launcher.n_jobs=2 model.net.experts.2.inner_folds=2\n")
    _fold(logs / "text_finetune_sweep", 0, 30.0)
    out = tmp_path / "results" / "gpu_check.md"
    assert gpu_check_report.main([str(logs), str(out)]) == 0
    report = out.read_text()
    assert "the recipe reduced (`model.net.experts.2.inner_folds=2`)" in report and "the folds at once" in report
    assert "Target 60 s per fold: 1 of 1 folds within it." in report


def test_a_sweep_with_no_finished_fold_writes_a_table_of_even_rows(tmp_path):
    """No fold finished, so no baseline is known: the header has as many cells as the rows (it had one more)."""
    logs = _logs(tmp_path)
    with (logs / "summary.md").open("a") as summary:
        summary.write("| text_finetune_sweep | stopped at its 217 s limit | 218 s |\n")
    _fold(logs / "text_finetune_sweep", 0, None)
    out = tmp_path / "results" / "gpu_check.md"
    assert gpu_check_report.main([str(logs), str(out)]) == 0
    section = out.read_text().split("## The fine-tuned text recipe")[1].split("\n## ")[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert len(table) == 3 and len({line.count("|") for line in table}) == 1, table
