"""Participant K-fold splits, the test report of a real run (who made each prediction, thresholds from
validation, CIs, breakdown, plots), grid-cell skipping and evaluate.py on a sweep folder."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from omegaconf import OmegaConf
from scipy import stats

from empathic_fusion.datamodules.splits import participant_folds
from empathic_fusion.dataset import load_dataset
from empathic_fusion.pipeline import evaluate, train
from empathic_fusion.compose import compose_config

IDS = [f"p{i:02d}" for i in range(41)]


def test_participant_folds_give_everyone_exactly_one_test_turn():
    folds = [participant_folds(IDS, 5, k, 0.2, seed=3) for k in range(5)]
    tested = [p for f in folds for p, split in f.items() if split == "test"]
    assert sorted(tested) == IDS  # each of the 41 participants tested once
    assert {len([p for p in f if f[p] == "test"]) for f in folds} == {8, 9}
    for f in folds:
        assert sum(s == "val" for s in f.values()) == round(0.2 * sum(s != "test" for s in f.values()))
    assert folds[0] == participant_folds(list(reversed(IDS)), 5, 0, 0.2, seed=3)  # order-independent, seeded
    assert folds[0] != participant_folds(IDS, 5, 0, 0.2, seed=4)
    with pytest.raises(ValueError, match="cv_folds"):
        participant_folds(IDS[:3], 5, 0, 0.2, 0)


_cfg = compose_config


def _data(tiny_dataset, tiny_store) -> list[str]:
    return [f"data.dataset_dir={tiny_dataset}", f"data.store_dir={tiny_store}", "data.demo=null",
            "data.extract_workers=1", "trainer.max_epochs=1", "trainer.accelerator=cpu", "logger=none",
            "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "seed=1"]


@pytest.fixture(scope="module")
def fold_run(tiny_dataset, tiny_store, tmp_path_factory):
    """The parameter-free story_similarity baseline (text only: fast), fold 1 of 4, threshold from validation."""
    out = tmp_path_factory.mktemp("fold_sweep") / "0"  # job 0 of a one-job sweep folder
    cfg = _cfg(_data(tiny_dataset, tiny_store) + [
        "model=story_similarity", "modality=t", "data.cv_folds=4", "data.cv_fold=1",
        "evaluation.threshold=validation", "evaluation.bootstrap=100"], out)
    results = train(cfg)
    (out / ".hydra").mkdir(parents=True)
    job_cfg = OmegaConf.create({k: cfg[k] for k in cfg if k != "hydra"})  # as a Hydra job leaves it
    OmegaConf.save(job_cfg, out / ".hydra" / "config.yaml")
    return cfg, results, out


def test_report_names_who_made_each_prediction(fold_run, tiny_dataset):
    _, _, out = fold_run
    ratings = load_dataset(tiny_dataset).ratings
    predictions = pd.read_csv(out / "test_predictions.csv")
    assert {"rating_index", "session_id", "participant_id", "story_id", "n_windows", "predicted", "rated"} \
        <= set(predictions.columns)
    joined = ratings.loc[predictions.rating_index]
    assert list(joined.participant_id) == list(predictions.participant_id)
    assert list(joined.empathy) == pytest.approx(list(predictions.rated))
    fold = participant_folds(load_dataset(tiny_dataset).participants.index.tolist(), 4, 1, 0.2 / 0.9, 0)
    assert set(predictions.participant_id) == {p for p, s in fold.items() if s == "test"}
    windows = pd.read_csv(out / "test_window_predictions.csv")
    assert len(windows) == predictions.n_windows.sum()


def test_report_has_validation_threshold_cis_breakdown_and_plots(fold_run):
    _, results, out = fold_run
    written = json.loads((out / "test_metrics.json").read_text())
    for level in ("window", "rating"):
        assert written["thresholds"][level]["mode"] == "validation" and written["thresholds"][level]["target"] == 0.0
        ci = written["ci"][level]["pearson"]
        assert ci["low"] <= ci["estimate"] <= ci["high"]
    predictions = pd.read_csv(out / "test_predictions.csv")  # the reported r is the r of the written predictions
    assert written["model"]["rating"]["pearson"] == pytest.approx(stats.pearsonr(predictions.predicted, predictions.rated)[0],
                                                                  abs=1e-5)
    cut = written["thresholds"]["rating"]["prediction_rating"]  # Acc uses the validation cutoff, truth stays at 3
    assert written["model"]["rating"]["accuracy"] == pytest.approx(((predictions.predicted > cut) == (predictions.rated > 3)).mean(),
                                                                   abs=1e-6)
    breakdown = pd.read_csv(out / "test_per_participant.csv")
    assert set(breakdown.participant_id) == set(pd.read_csv(out / "test_predictions.csv").participant_id)
    assert written["participants"]["n"] == len(breakdown)
    for png in ("test_predicted_vs_true", "test_rating_distributions", "test_per_participant_r"):
        assert (out / f"{png}.png").stat().st_size > 10_000
    assert "bootstrap CI" in (out / "test_metrics.md").read_text()


def test_grid_skips_a_cell_the_model_cannot_run(tiny_dataset, tiny_store, tmp_path):
    cfg = _cfg(_data(tiny_dataset, tiny_store) + ["model=story_similarity", "modality=v+a", "grid.skip_incompatible=true"],
               tmp_path)
    result = train(cfg)
    assert result["skipped"] and "needs ['text']" in result["reason"]
    assert json.loads((tmp_path / "skipped.json").read_text())["modality"] == "v+a"


def test_evaluate_on_a_sweep_folder_and_argument_errors(fold_run, tmp_path):
    _, results, out = fold_run
    cfg = _cfg([f"sweep_dir={out.parent}", "tables.plots=false"], tmp_path, "evaluate")
    evaluated = evaluate(cfg)
    summary = evaluated["summaries"]["rating"]
    assert list(summary.model) == ["Story similarity (SBERT)"] and summary.n_runs.iloc[0] == 1
    assert summary.pearson_mean.iloc[0] == pytest.approx(results["model"]["rating"]["pearson"])
    # into the sweep folder, as when the sweep ended
    assert (out.parent / "paper_table_rating.tex").exists() and (out.parent / "cv_coverage.csv").exists()
    with pytest.raises(ValueError, match="exactly one"):
        evaluate(_cfg([], tmp_path, "evaluate"))
