"""One MSE and a sanity line in every report: MSE is on the rating scale wherever it is shown (the model-scale
MSE only as `loss`), test_metrics.md keeps the heading that names the scales, a model that does not beat the
constant training mean is said to in the report, the log, the card, the app and the What now block, and a
ratio over r with nothing missing that has no reference prints why instead of nan."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from empathic_fusion.evaluation.missing_modalities import NO_REFERENCE, evaluate_conditions, markdown, summarize
from empathic_fusion.evaluation.report_parts import sanity_check, write_test_report
from empathic_fusion.evaluation.card import fusion_card
from empathic_fusion.models.checkpoints import opened_checkpoint


def test_sanity_check_names_what_the_model_fails_on():
    rated = np.array([1.0, 2, 3, 4, 5, 3, 2, 4])
    constant = {"pearson": 0.0, "mse": 1.5}
    good = sanity_check({"pearson": 0.6, "mse": 0.9}, constant, "the 1-5 rating scale", rated + 0.1, rated)
    assert good["beats_constant_mean"] and good["message"] is None
    flat = sanity_check({"pearson": -0.143, "mse": 1.6}, constant, "the 1-5 rating scale",
                        np.full(8, 3.0) + np.linspace(-0.1, 0.1, 8), rated)
    assert not flat["beats_constant_mean"]
    assert flat["message"].startswith("Sanity check: the model does not beat the constant training mean")
    assert "r -0.143 is not above the constant's 0" in flat["message"]
    assert "MSE 1.600 is not below the constant's 1.500 (the 1-5 rating scale)" in flat["message"]
    assert "nearly constant (sd 0.07 against the ratings' 1.31)" in flat["message"]
    worse_mse = sanity_check({"pearson": 0.2, "mse": 1.6}, constant, "the 1-5 rating scale")
    assert "r 0.2" not in worse_mse["message"] and "MSE 1.600" in worse_mse["message"]
    assert sanity_check({"pearson": 0.2, "mse": 9.0}, None, "x")["message"] is None  # no constant: r only


def test_the_written_report_keeps_its_heading_and_carries_the_sentence(tmp_path, caplog):
    rows = {"Model (per rating)": {"pearson": -0.1, "spearman": 0.0, "accuracy": 0.5, "f1": 0.4, "mse": 0.33},
            "constant train mean (per rating)": {"pearson": 0.0, "spearman": 0.0, "accuracy": 0.5, "f1": 0.0,
                                                 "mse": 0.31}}
    sanity = sanity_check(rows["Model (per rating)"], rows["constant train mean (per rating)"], "the 1-5 rating scale")
    with caplog.at_level(logging.WARNING, logger="empathic_fusion.evaluation.report_parts"):
        summary = write_test_report(tmp_path, "Test metrics (ratings 1-5; MSE on the 1-5 rating scale)", rows,
                                    {"model": {"rating": rows["Model (per rating)"]}}, sanity=sanity)
    lines = (tmp_path / "test_metrics.md").read_text().splitlines()
    assert lines[0] == "Test metrics (ratings 1-5; MSE on the 1-5 rating scale):"
    assert lines[2] == sanity["message"] and lines[4].startswith("|")
    assert sanity["message"] in caplog.text
    written = json.loads((tmp_path / "test_metrics.json").read_text())
    assert written == summary and written["mse_scale"] == "rating" and not written["sanity"]["beats_constant_mean"]


def test_a_missing_modality_table_without_a_reference_says_why_instead_of_nan():
    """Targets are the negated predictions, so r with nothing missing is negative: every ratio over it is
    undefined."""
    from tests.test_missing_modalities import ALL, _batch, _module

    model = _module(0.0).eval()
    loader = [_batch(n=16, seed=s) for s in range(3)]
    with torch.no_grad():
        for batch in loader:
            batch["target"] = -model(batch)
    table = evaluate_conditions(model, loader, ALL, [0.0, 0.5], seed=0)
    summary = summarize(table, ALL, [0.0, 0.5], 0)
    assert table.loc[0, "window_pearson"] == pytest.approx(-1.0) and table.loc[0, "rating_pearson"] < 0
    assert table["rating_relative_r"].isna().all()
    text = markdown(table, summary)
    assert "nan" not in text.lower()
    assert text.count(NO_REFERENCE) == len(table) + 4  # every r / r(none), and both robustness values per kind
    assert NO_REFERENCE == "n/a (r(none) ≤ 0)"


def _old_fusion_run(run: Path, summary: dict) -> tuple[Path, dict]:
    """A fusion checkpoint beside a test report written before MSE moved to the rating scale."""
    (run / "checkpoints").mkdir(parents=True)
    (run / "test_metrics.json").write_text(json.dumps(summary))
    header = {"module": "fusion", "modalities": ["video", "text"], "created": "2026-01-02T03:04:00+00:00",
              "commit": "abc123", "data": {"name": "demo", "sessions": 12, "scale": [1, 5], "generated": True}}
    return run / "checkpoints" / "best.ckpt", {"empathic_fusion": header,
                                               "hyper_parameters": {"net": {"_target_": "x.TFN"}}}


def test_the_card_of_an_older_report_converts_its_cosine_mse_and_checks_it_against_the_mean(tmp_path):
    """Before `mse_scale`, a fusion report held MSE on the cosine scale: the card shows it x 4 on 1-5 and
    runs the same sanity check on those numbers (the issue's TFN on v+t: r -0.143, MSE 0.328 against 0.311)."""
    summary = {"model": {"rating": {"pearson": -0.143, "mse": 0.328 / 4}},
               "constant_baseline": {"rating": {"pearson": 0.0, "mse": 0.311 / 4}}}
    card = fusion_card(opened_checkpoint(*_old_fusion_run(tmp_path / "old", summary)))
    assert card.test["empathy"].mse == pytest.approx(0.328)
    assert "MSE 0.328 (MSE on the 1-5 scale of the labels)" in card.markdown()
    assert "r -0.143 is not above the constant's 0 and MSE 0.328 is not below the constant's 0.311" in card.sanity
    assert card.sanity in card.markdown()


def test_the_report_of_a_constant_model_says_it_does_not_beat_the_mean(tiny_dataset, tiny_store, tmp_path, caplog):
    """The constant training-mean model (model=mean) through train.py's path: its report, log, card, app and
    What now block say it does not beat the constant training mean; MSE is on 1-5 with the cosine-scale
    loss beside it; its missing-modality table (r with nothing missing is 0) prints no nan."""
    from empathic_fusion.app.clip import ClipScorer
    from empathic_fusion.app.ui import build_app
    from empathic_fusion.pipeline import train, train_summary
    from empathic_fusion.compose import compose_config

    out = tmp_path / "run"
    cfg = compose_config([f"data.dataset_dir={tiny_dataset}", f"data.store_dir={tiny_store}", "data.demo=null",
                          "data.extract_workers=1", "trainer.max_epochs=1", "trainer.accelerator=cpu", "logger=none",
                          "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "seed=1",
                          "model=mean", "modality=v+t", "evaluation.bootstrap=0", "evaluation.plots=false",
                          "evaluation.missing_rates=[0,0.5]"], out)
    with caplog.at_level(logging.WARNING, logger="empathic_fusion.evaluation.report_parts"):
        results = train(cfg)
    written = json.loads((out / "test_metrics.json").read_text())
    sentence = written["sanity"]["message"]
    assert sentence.startswith("Sanity check: the model does not beat the constant training mean at the rating level")
    assert "r 0.000 is not above the constant's 0" in sentence and "(the 1-5 rating scale)" in sentence
    report = (out / "test_metrics.md").read_text()
    first = report.splitlines()[0]
    assert first.startswith("Test metrics (story_share") and "MSE on the 1-5 rating scale" in first
    assert sentence in report and sentence in caplog.text and "nan" not in report.lower()
    assert "n/a (r(none) ≤ 0)" in report
    rating = written["model"]["rating"]
    assert written["mse_scale"] == "rating" and rating["mse"] == pytest.approx(4 * rating["loss"])
    predictions = pd.read_csv(out / "test_predictions.csv")
    assert rating["mse"] == pytest.approx(np.mean((predictions.predicted - predictions.rated) ** 2), abs=1e-5)
    assert "sanity" in train_summary(cfg, results)

    scorer = ClipScorer(results["best_checkpoint"])
    assert scorer.card.sanity == sentence and f"**{sentence}**" in scorer.card.markdown()
    ids = [getattr(block, "elem_id", None) for block in build_app(clip_scorer=scorer).blocks.values()]
    assert "clip-sanity" in ids
