"""The benchmarks write their results into docs/results/ themselves, with where and how they were measured."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from empathic_fusion.utils import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))

import results  # noqa: E402
import train_throughput  # noqa: E402

TINY = ["--allow-busy", "--steps", "2", "--warmup", "1", "--batch-size", "4", "--frames", "8", "--models", "tfn"]


def test_results_file_names_machine_commit_date_load_and_command(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(PROJECT_ROOT / "benchmarks" / "x.py"), "--steps", "3", "a b"])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    out = tmp_path / "x.md"
    written = results.write_results(type("Args", (), {"out": out, "no_write": False})(), "Title", "| a |\n|---|\n| 1 |")
    text = out.read_text()
    assert written == out and text.startswith("# Title\n")
    assert re.search(r"^- machine: .+\d+ of \d+ cores usable", text, re.M)
    import torch

    assert f"CPU kernels: {torch.backends.cpu.get_cpu_capability()}" in text
    assert "ATEN_CPU_CAPABILITY unset, ONEDNN_MAX_CPU_ISA=AVX2, OMP_NUM_THREADS=1" in text
    assert re.search(r"^- commit: ([0-9a-f]{40}(-dirty)?|unknown)$", text, re.M)
    assert re.search(r"^- date: \d{4}-\d\d-\d\d \d\d:\d\d UTC$", text, re.M)
    assert re.search(r"^- load: [\d.]+ / [\d.]+ / [\d.]+ when written", text, re.M)
    assert "- command: `ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 python benchmarks/x.py --steps 3 'a b'`" in text
    assert text.rstrip().endswith("| 1 |")


def test_runs_read_from_an_earlier_invocation_are_named_with_the_load_they_were_timed_under(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "REUSED_RUN_LOADS", [])
    monkeypatch.setattr(results, "load_average", lambda: (2.5, 2.0, 1.0))
    command = [sys.executable, "-c", "pass"]
    first = results.run_resumable(command, tmp_path, "done.json", dict(os.environ), "pass", "the run")
    assert results.REUSED_RUN_LOADS == [] and results.reused_notice() == ""
    monkeypatch.setattr(results, "load_average", lambda: (0.1, 0.1, 0.1))
    assert results.run_resumable(command, tmp_path, "done.json", dict(os.environ), "pass", "the run") == first
    other = tmp_path / "older"
    other.mkdir()
    (other / "done.json").write_text('{"command": ["-c", "pass"], "seconds": 3.0}')  # written before loads were kept
    assert results.run_resumable(command, other, "done.json", dict(os.environ), "pass", "the run") == 3.0
    notice = results.reused_notice()
    assert "2 run(s) were read from an earlier invocation's run folder" in notice
    assert "1-minute load at their start: 2.50; 1 with no load recorded" in notice
    assert notice in results.header("Title", None)


def test_paths_of_the_writing_machine_become_relative(tmp_path):
    root, tmp = str(PROJECT_ROOT), tempfile.gettempdir()
    text = (f"run {root}/logs/x and {root} and {tmp}/bench-1/out.md and {PROJECT_ROOT.parent}/shared/video.mp4 "
            f"and {Path.home()}/cache/m")
    # a checkout directly in the temporary folder (a CI's clone in /tmp) names its siblings as ../
    beside = "../bench-1" if os.path.realpath(PROJECT_ROOT.parent) == os.path.realpath(tmp) else "<tmp>/bench-1"
    assert results.portable(text) == f"run logs/x and . and {beside}/out.md and ../shared/video.mp4 and ~/cache/m"
    assert results.portable(f"{tmp}x/y") == f"{tmp}x/y"  # only whole folder names


def _args(**values):
    return argparse.Namespace(**{"allow_busy": False, "quiet_wait": 0.0, **values})


def _load(monkeypatch, one_minute: float) -> None:
    monkeypatch.setattr(results, "load_average", lambda: (one_minute, 1.0, 1.0))
    monkeypatch.setattr(results, "usable_cores", lambda: 2)


def test_a_timing_benchmark_refuses_a_busy_machine_unless_allowed_and_then_says_so(tmp_path, monkeypatch):
    _load(monkeypatch, 1.5)  # 0.75 per core on 2 cores: busy
    with pytest.raises(SystemExit, match="refusing to time on a busy machine: 1-minute load 1.50 >= 1.50"):
        results.quiet_machine_guard(_args(), results.Measures.TIME)
    args = _args(allow_busy=True, out=tmp_path / "t.md")
    assert results.quiet_machine_guard(args, results.Measures.TIME).busy
    results.write_results(args, "T", "body")
    text = (tmp_path / "t.md").read_text()
    assert "**BUSY MACHINE: the timings in this file were taken on a busy machine**" in text
    assert "1.50 / 1.00 / 1.00 at the start" in text and "busy at 1.50 or above" in text


def test_a_quiet_machine_is_timed_and_recorded_as_quiet(tmp_path, monkeypatch):
    _load(monkeypatch, 1.4)
    args = _args(out=tmp_path / "q.md")
    assert not results.quiet_machine_guard(args, results.Measures.TIME).busy
    results.write_results(args, "Q", "body")
    text = (tmp_path / "q.md").read_text()
    assert "quiet: below 1.50 at the start" in text and "BUSY" not in text and "> **" not in text


def test_accuracy_benchmarks_only_warn_and_load_benchmarks_say_load_is_the_point(tmp_path, monkeypatch, capsys):
    _load(monkeypatch, 9.0)
    accuracy = _args(out=tmp_path / "a.md")
    assert results.quiet_machine_guard(accuracy, results.Measures.ACCURACY).busy
    assert "warning: busy machine" in capsys.readouterr().err
    results.write_results(accuracy, "A", "body")
    assert "> **Busy machine** (1-minute load 9.00 on 2 cores" in (tmp_path / "a.md").read_text()
    load = _args(out=tmp_path / "l.md")
    results.quiet_machine_guard(load, results.Measures.LOAD)
    results.write_results(load, "L", "body")
    assert "exempt from the quiet-machine refusal" in (tmp_path / "l.md").read_text()


def test_every_benchmark_that_writes_results_checks_the_load_first():
    for script in sorted((PROJECT_ROOT / "benchmarks").glob("*.py")):
        text = script.read_text()
        if "write_results(" in text and script.name != "results.py":
            assert "quiet_machine_guard(args, Measures." in text, script.name


ABSOLUTE_PATH = re.compile(r"(?<![\w.~<>-])/(tmp|work|home|root|Users|private|var/folders)/")


def test_no_file_in_the_docs_names_an_absolute_path_of_the_machine_that_wrote_it():
    found = [f"{path.relative_to(PROJECT_ROOT)}:{number}: {line.strip()[:120]}"
             for path in sorted((PROJECT_ROOT / "docs").rglob("*.md")) + [PROJECT_ROOT / "README.md"]
             for number, line in enumerate(path.read_text().splitlines(), 1) if ABSOLUTE_PATH.search(line)]
    assert not found, "\n".join(found)


RESULTS_FILES = sorted((PROJECT_ROOT / "docs" / "results").glob("*.md"))


@pytest.mark.parametrize("path", RESULTS_FILES, ids=[p.name for p in RESULTS_FILES])
def test_every_results_file_records_commit_date_machine_load_and_command(path):
    head = path.read_text().split("\n\n", 2)[1]
    fields = dict(line[2:].split(": ", 1) for line in head.splitlines() if line.startswith("- "))
    assert {"machine", "commit", "date", "load", "command"} <= set(fields), sorted(fields)
    assert re.search(r"CPU kernels: [A-Z0-9_]+ \(torch", fields["machine"]), fields["machine"]
    commit = fields["commit"].removesuffix("-dirty")
    assert re.fullmatch(r"[0-9a-f]{40}", commit)
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=PROJECT_ROOT, capture_output=True)
    assert known.returncode == 0, f"{path.name} cites commit {commit}, which is not in the history"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", fields["date"])
    assert re.match(r"[\d.]+ / [\d.]+ / [\d.]+ ", fields["load"])
    assert fields["command"].startswith("`") and "python benchmarks/" in fields["command"]


def test_make_results_remakes_every_results_file_with_the_benchmark_it_records():
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\nresults:"):].split("\n\n", 1)[0].replace("\\\n", " ")
    commands = [line.strip() for line in recipe.splitlines()[1:]]
    for path in RESULTS_FILES:
        script = re.search(r"python (benchmarks/\w+\.py)", path.read_text()).group(1)
        makes_it = [c for c in commands if script in c and (f"--out docs/results/{path.name}" in c or (
            "--out" not in c and f"add_output_arguments(parser, \"{path.stem}\")" in (PROJECT_ROOT / script).read_text()))]
        if script.endswith("empathetic_exchanges.py") and "--finetune" in path.read_text().split("\n- command:")[1][:200]:
            makes_it = [c for c in commands if script in c and "--finetune" in c]
        assert makes_it, f"make results does not remake {path.name} ({script})"


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
    result = train_throughput.main(["--device", "cuda", "--precision", "bf16-mixed", *TINY, "--out", str(tmp_path / "gpu.md")])
    (row,) = result["models"]
    assert row["precision"] == "bf16-mixed" and row["peak_gpu_memory_gib"] > 0 and row["train_samples_per_s"] > 0
    assert "GPU: " in (tmp_path / "gpu.md").read_text()


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


def test_empathetic_exchanges_compares_recipes_in_display_order_and_marks_unmeasured_rows():
    """The previous default sits above the default (which is compared with it), a recipe not run gets a
    row of 'unmeasured' and its reason, the time line is the ratio of median seconds per fold, and the
    penalties chosen at an end of their widened grid are listed."""
    import empathetic_exchanges

    rating = lambda r: {"pearson": r, "spearman": r, "mse": 1.3 - r, "qwk": r / 2, "macro_f1": 0.15}  # noqa: E731
    base = {"training mean": {"rating": rating(0.0)}}
    stack = lambda end: {"TF-IDF ridge": {"weight": 0.4, "held_out_r": 0.1, "alpha": 3.2, "grid_end": None},  # noqa: E731
                         "embedding ridge (prompt, last layer)": {"weight": 0.0, "held_out_r": 0.0, "alpha": 1e9,
                                                                  "grid_end": end}}
    folds = {"default": [{"model": {"rating": rating(r)}, "baselines": base, "stack": stack(end)}
                         for r, end in ((0.25, None), (0.27, "upper"), (0.20, None))],
             "round3": [{"model": {"rating": rating(r)}, "baselines": base} for r in (0.22, 0.28, 0.18)]}
    labels = empathetic_exchanges.RECIPES
    text = empathetic_exchanges.summary_table(folds, {"default": [60, 40, 42], "round3": [30, 31, 33]}, "cpu", labels,
                                              {labels["finetune"]: "unmeasured: meant for a GPU"})
    assert text.index(f"| {labels['round3']} |") < text.index(f"| {labels['default']} |")
    assert (f"{labels['default']} vs {labels['round3']}: wins on mean r, rho and QWK (higher r on 2/3, rho on 2/3, "
            "QWK on 2/3 folds)") in text and f"{labels['round3']} vs {labels['default']}" not in text
    assert f"| {labels['finetune']} | unmeasured | unmeasured |" in text and "unmeasured: meant for a GPU" in text
    assert (f"{labels['default']}, penalties at an end of the widened grid: 1 of 6 expert fits: "
            "embedding ridge (prompt, last layer) (upper end, alpha 1e+09, fold 1)") in text
    timing = empathetic_exchanges.time_comparison(
        {"default": [60, 40, 42], "round3": [30, 31, 33]}, labels,
        [{"encoder": "MiniLM", "layers": 6, "texts": 10, "seconds": 1.0, "peak_gb": 0.5}])
    assert "42 s per fold against" in timing and "31 s" in timing and "1.35x" in timing
    assert "| MiniLM | 6 | 1.0 | 0.50 |" in timing
