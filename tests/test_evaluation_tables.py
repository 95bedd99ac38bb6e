"""Paper tables from a sweep folder: seeds -> mean ± std, best bold / second underlined, md/tex/csv."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from empathic_fusion.evaluation.sweep import PaperTablesCallback, collect_runs, evaluate_sweep, skipped_runs
from empathic_fusion.evaluation.tables import aggregate_runs, rank_marks, to_latex, to_markdown
from empathic_fusion.evaluation.report_parts import format_ci
from empathic_fusion.metrics import ALL_METRIC_NAMES, METRIC_NAMES, PAPER_SYMBOLS, format_table

MODELS = {"empathic_fusion.models.lf_lstm.LFLSTM": 0.30, "empathic_fusion.models.tfn.TFN": 0.10, "empathic_fusion.models.amer.AMER": 0.20}
MODALITIES = {"t": ["text"], "v+t": ["video", "text"]}


def _job(root: Path, num: int, target: str, modality: str, seed: int, pearson: float, **data) -> Path:
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    cfg = {"model": {"net": {"_target_": target}}, "modality": {"short": modality, "names": MODALITIES[modality]},
           "seed": seed, "data": {"scenario": "story_share", **data}}
    OmegaConf.save(OmegaConf.create(cfg), job / ".hydra" / "config.yaml")
    values = {m: 0.2 for m in ALL_METRIC_NAMES} | {"pearson": pearson, "mse": 0.3 - pearson / 2}
    (job / "test_metrics.json").write_text(json.dumps({"model": {"window": values, "rating": values}}))
    return job


@pytest.fixture
def sweep(tmp_path) -> Path:
    """3 models x 2 modality subsets x 3 seeds with known Pearson means (model base + 0.05 for v+t)."""
    num = 0
    for target, base in MODELS.items():
        for modality in MODALITIES:
            for seed, noise in zip((1, 2, 3), (-0.01, 0.0, 0.01)):
                _job(tmp_path, num, target, modality, seed, base + (0.05 if modality == "v+t" else 0) + noise)
                num += 1
    skipped = tmp_path / str(num)
    skipped.mkdir()
    (skipped / "skipped.json").write_text(json.dumps({"skipped": True, "reason": "needs text"}))
    return tmp_path


def test_collect_and_aggregate_seeds(sweep):
    runs = collect_runs(sweep)
    assert len(runs) == 3 * 2 * 3 * 2  # jobs x levels; the skipped job has no metrics
    summary = aggregate_runs(runs[runs.level == "rating"])
    assert list(summary["model"]) == ["AMER", "AMER", "TFN", "TFN", "LF-LSTM", "LF-LSTM"]  # the paper's order
    assert list(summary["modality"][:2]) == ["t", "v+t"]
    row = summary[(summary.model == "LF-LSTM") & (summary.modality == "v+t")].iloc[0]
    assert row["pearson_mean"] == pytest.approx(0.35)
    assert row["pearson_std"] == pytest.approx(np.std([-0.01, 0, 0.01], ddof=1))
    assert row["n_runs"] == 3
    assert skipped_runs(sweep) == [{"skipped": True, "reason": "needs text"}]


def test_a_job_that_failed_when_the_sweep_last_ran_leaves_its_earlier_results_out(sweep, caplog):
    """Its folder still holds the test_metrics.json of an earlier run of the sweep: stale, so not in the tables."""
    from empathic_fusion.utils.multirun import record_failure

    record_failure(sweep, 0, ["seed=1"], RuntimeError("a checkpoint of another model"), sweep / "0")
    runs = collect_runs(sweep)
    assert len(runs) == (3 * 2 * 3 - 1) * 2 and str(sweep / "0") not in set(runs["run_dir"])
    assert any("from an earlier run and is left out" in r.getMessage() for r in caplog.records)


def test_best_bold_second_underlined_in_markdown_and_latex(sweep):
    summary = aggregate_runs(collect_runs(sweep).query("level == 'rating'"))
    marks = rank_marks(summary, ("pearson", "mse"))
    best = summary.index[(summary.model == "LF-LSTM") & (summary.modality == "v+t")][0]
    second = summary.index[(summary.model == "LF-LSTM") & (summary.modality == "t")][0]
    assert marks[(best, "pearson")] == "best" and marks[(second, "pearson")] == "second"
    assert marks[(best, "mse")] == "best"  # lower is better for MSE
    markdown = to_markdown(summary)
    assert "**35.0 ± 1.0**" in markdown and "<u>30.0 ± 1.0</u>" in markdown
    assert sum(_cells(line)[0] == "LF-LSTM" for line in markdown.splitlines()) == 1  # named on its first row only
    assert _cells(markdown.splitlines()[0]) == ["Model", "Modality", "r (↑)", "rho (↑)", "Acc (↑)", "F1 (↑)",
                                                "MSE (↓)", "runs"]
    latex = to_latex(summary, caption="c")
    assert r"\mathbf{35.0 \pm 1.0}" in latex and r"\underline{30.0 \pm 1.0}" in latex and r"\toprule" in latex


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("|")[1:-1]]


def test_markdown_tables_read_back_as_their_numbers():
    """format_table and format_ci (pandas + tabulate): each row reads back as the values it was given,
    three decimals, NaN written as nan."""
    rows = {"model": {m: 0.1234 * (k + 1) for k, m in enumerate(METRIC_NAMES)},
            "TF-IDF + ridge": {m: float("nan") if m == "pearson" else 0.5 for m in METRIC_NAMES}}
    lines = format_table(rows, scale=100).splitlines()
    assert _cells(lines[0]) == ["", *(PAPER_SYMBOLS[m] for m in METRIC_NAMES)] and set(lines[1]) <= set("|:-")
    assert _cells(lines[2]) == ["model", *(f"{12.34 * (k + 1):.3f}" for k in range(len(METRIC_NAMES)))]
    assert _cells(lines[3]) == ["TF-IDF + ridge", "nan", *["50.000"] * (len(METRIC_NAMES) - 1)]
    ci = {"rating": {"pearson": {"estimate": 0.41, "low": -0.0501, "high": 0.6}, "mse": {"estimate": 1.0, "low": 0.5, "high": 2.25}}}
    text = format_ci(ci, 0.95, ("pearson", "mse"))
    assert text.startswith("95% bootstrap CI, resampling participants:\n\n")
    header, _, row = text.split("\n\n")[1].splitlines()
    assert _cells(header) == ["level", "pearson", "mse"]
    assert _cells(row) == ["rating", "0.410 [-0.050, 0.600]", "1.000 [0.500, 2.250]"]


def test_ties_share_the_mark():
    summary = pd.DataFrame({"model": ["A", "B", "C"], "modality": ["t"] * 3, "pearson_mean": [0.2, 0.2, 0.1],
                            "pearson_std": [0.0] * 3, "n_runs": [1] * 3})
    marks = rank_marks(summary, ("pearson",))
    assert marks[(0, "pearson")] == marks[(1, "pearson")] == "best" and marks[(2, "pearson")] == "second"


def test_evaluate_sweep_writes_md_tex_csv_and_plots(sweep, tmp_path):
    out = tmp_path / "tables"
    result = evaluate_sweep(sweep, out, plots=True)
    for level in ("window", "rating"):
        for ext in ("md", "tex", "csv"):
            assert (out / f"paper_table_{level}.{ext}").stat().st_size > 100
        assert (out / f"ablation_{level}_pearson.png").stat().st_size > 5000
    csv = pd.read_csv(out / "paper_table_rating.csv")
    assert len(csv) == 6 and {"pearson_mean", "pearson_std", "n_runs"} <= set(csv.columns)
    assert result["summaries"]["rating"]["pearson_mean"].max() == pytest.approx(0.35)


def test_callback_writes_tables_into_the_sweep_dir(sweep, capsys):
    PaperTablesCallback(plots=False).on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    assert (sweep / "paper_table_rating.md").exists() and "LF-LSTM" in capsys.readouterr().out


def test_folds_are_aggregated_and_coverage_checked(tmp_path):
    for fold in range(3):
        job = _job(tmp_path, fold, "empathic_fusion.models.lf_lstm.LFLSTM", "t", 1, 0.1 * fold, cv_folds=3, cv_fold=fold)
        pd.DataFrame({"participant_id": [f"p{fold}a", f"p{fold}b"], "predicted": [3, 4], "rated": [2, 5]}).to_csv(
            job / "test_predictions.csv", index=False)
    evaluate_sweep(tmp_path, tmp_path / "out", plots=False)
    coverage = pd.read_csv(tmp_path / "out" / "cv_coverage.csv").iloc[0]
    assert coverage["folds"] == 3 and coverage["participants_tested"] == 6 and coverage["tested_twice_or_more"] == 0
    summary = pd.read_csv(tmp_path / "out" / "paper_table_rating.csv").iloc[0]
    assert summary["pearson_mean"] == pytest.approx(0.1) and summary["n_runs"] == 3
    assert "over folds" in (tmp_path / "out" / "paper_table_rating.tex").read_text()


def test_empty_sweep_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no finished runs"):
        collect_runs(tmp_path)


def _missing_summary(r_none: float, relative: dict[str, float], robustness: float) -> dict:
    entry = lambda rel: {level: {"pearson": r_none * rel, "mse": 0.3, "relative_r": rel} for level in ("window", "rating")}
    return {"modalities": ["video", "text"], "rates": [0.0, 0.5], "seed": 0, "none": entry(1.0),
            "removed": {name: entry(rel) for name, rel in relative.items()},
            "random": {"0.5": entry(robustness)}, "block": {"0.5": entry(1.0)},
            "robustness": {"random": {"window": robustness, "rating": robustness},
                           "block": {"window": 1.0, "rating": 1.0}}}


def test_sweep_robustness_table_aggregates_the_missing_modality_summaries(sweep):
    """Jobs with a missing-modality summary give robustness_table.md: mean ± sd over seeds per cell, the
    mean and worst r / r(none) over single removed modalities, NaN robustness left out and counted."""
    jobs = sorted(p.parent for p in sweep.rglob("test_metrics.json"))
    lf_vt = [j for j in jobs if "LFLSTM" in (j / ".hydra" / "config.yaml").read_text()
             and "short: v+t" in (j / ".hydra" / "config.yaml").read_text()]
    for job, robustness in zip(lf_vt, (0.6, 0.8, float("nan"))):
        summary = json.loads((job / "test_metrics.json").read_text())
        summary["missing_modalities"] = _missing_summary(0.35, {"video": 0.9, "text": 0.5}, robustness)
        (job / "test_metrics.json").write_text(json.dumps(summary))
    result = evaluate_sweep(sweep, sweep / "out", plots=False)
    runs = pd.read_csv(sweep / "out" / "robustness_runs.csv")
    assert len(runs) == 3 and set(runs["model"]) == {"LF-LSTM"} and set(runs["modality"]) == {"v+t"}
    assert runs["relative_r_one_removed"].tolist() == pytest.approx([0.7] * 3)
    assert runs["relative_r_worst_removed"].tolist() == pytest.approx([0.5] * 3)
    header, _, row = result["robustness"].read_text().split("\n\n")[1].splitlines()
    cells = dict(zip(_cells(header), _cells(row)))
    assert cells["Model"] == "LF-LSTM" and cells["runs"] == "3"
    assert cells["relative robustness, random frames"] == f"0.700 ± {np.std([0.6, 0.8], ddof=1):.3f} (2 of 3)"
    assert cells["r / r(none), worst modality removed"] == "0.500 ± 0.000"


def test_sweep_without_missing_modality_summaries_writes_no_robustness_table(sweep):
    assert evaluate_sweep(sweep, sweep / "out", plots=False)["robustness"] is None
    assert not (sweep / "out" / "robustness_table.md").exists()
