"""Split-conformal intervals: the finite-sample quantile, coverage at the nominal level where the truth
is known, the unbounded case, the setting, the model card reading them back (and none from an older
test report), and a fusion run's test report writing them end to end."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from empathic_fusion.config import typed
from empathic_fusion.config.checks import ConfigError
from empathic_fusion.evaluation.conformal import (
    calibrate,
    conformal_half_width,
    conformal_rank,
    format_intervals,
    fusion_intervals,
    interval_report,
)
from empathic_fusion.evaluation.card import FUSION_OUTPUT, FUSION_WINDOW, NO_INTERVALS, fusion_card, text_card
from empathic_fusion.models.checkpoints import opened_checkpoint


def _direct_half_width(residuals: np.ndarray, coverage: float) -> float:
    """The definition, by brute force: the smallest calibration residual r with #{|res| <= r} >=
    (n + 1) x coverage; none (inf) when even the largest falls short."""
    values = np.abs(residuals)
    enough = [r for r in sorted(values) if (values <= r).sum() >= (len(values) + 1) * coverage - 1e-9]
    return float(enough[0]) if enough else math.inf


def test_half_width_is_the_finite_sample_quantile():
    rng = np.random.default_rng(0)
    for n in (1, 5, 9, 10, 19, 57, 200):
        residuals = rng.normal(size=n)
        for coverage in (0.5, 0.8, 0.9, 0.95):
            assert conformal_half_width(residuals, coverage) == _direct_half_width(residuals, coverage), (n, coverage)
    assert conformal_rank(9, 0.9) == 9 and conformal_rank(19, 0.95) == 19 and conformal_rank(99, 0.07) == 7
    assert conformal_half_width(np.arange(1.0, 10.0), 0.8) == 8.0  # ceil(10 x 0.8) = 8th smallest


def test_too_few_calibration_items_give_an_unbounded_interval():
    assert conformal_half_width(np.ones(8), 0.9) == math.inf  # ceil(9 x 0.9) = 9 > 8
    assert conformal_half_width(np.arange(9.0), 0.9) == 8.0  # ceil(10 x 0.9) = 9: the largest
    item = calibrate(np.zeros(8), np.ones(8), np.zeros(4), np.full(4, 3.0), 0.9)
    assert item["unbounded"] and item["half_width"] is None and item["test_coverage"] == 1.0
    assert "too few" in item["note"] and "whole scale" in item["note"]
    empty = calibrate(np.zeros(0), np.zeros(0), np.zeros(3), np.zeros(3), 0.9)
    assert empty["half_width"] is None and not empty["unbounded"] and empty["n_calibration"] == 0
    table = format_intervals(interval_report({"a": item, "b": empty}, 0.9, False, "outputs"))
    assert "unbounded" in table and "none" in table and "no validation items" in table


@pytest.mark.parametrize("coverage", [0.8, 0.9])
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_coverage_is_nominal_where_the_truth_is_known(seed, coverage):
    """y = f(x) + noise whose spread grows with x; the model predicts f(x) with a bias. Calibrated on 800
    items, the interval holds about the nominal share of 5000 new ones (marginally: wider-noise items
    are covered less often, which split conformal allows)."""
    rng = np.random.default_rng(seed)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.uniform(0, 1, n)
        truth = 3 + np.sin(6 * x)
        rated = truth + rng.normal(0, 0.2 + 0.6 * x)
        return truth + 0.15, rated  # biased predictions, ratings

    item = calibrate(*draw(800), *draw(5000), coverage)
    assert item["n_calibration"] == 800 and item["n_test"] == 5000
    assert abs(item["test_coverage"] - coverage) <= 0.05, item


def test_fusion_levels_are_on_the_rating_scale():
    """Targets are ratings mapped onto [-1, 1]: on 1-5 a target residual of 0.25 is 0.5 rating points."""
    to_rating = lambda t: 3 + 2 * np.asarray(t)  # noqa: E731
    val = {"window_pred": np.zeros(19), "window_target": np.linspace(-0.5, 0.5, 19),
           "rating_pred": np.zeros(9), "rating_target": np.full(9, 0.25)}
    test = {"window_pred": np.zeros(4), "window_target": np.array([0.0, 0.1, 0.5, 0.9]),
            "rating_pred": np.zeros(2), "rating_target": np.array([0.25, 0.5])}
    report = fusion_intervals(test, val, to_rating, 0.9, in_sample=False)
    assert report["method"] == "split conformal" and report["calibration"] == "validation split"
    rating = report["levels"]["rating"]
    assert rating["half_width"] == pytest.approx(0.5) and rating["test_coverage"] == 0.5
    window = report["levels"]["window"]  # ceil(20 x 0.9) = 18th of 19 residuals |linspace| x 2
    assert window["half_width"] == pytest.approx(2 * sorted(np.abs(np.linspace(-0.5, 0.5, 19)))[17])
    assert window["n_calibration"] == 19 and window["test_coverage"] == 0.75
    assert "in-sample" in fusion_intervals(test, val, to_rating, 0.9, in_sample=True)["note"]


def test_interval_coverage_setting():
    assert typed("evaluation", {}).interval_coverage == 0.9
    assert typed("evaluation", {"interval_coverage": 0.8}).interval_coverage == 0.8
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ConfigError, match="interval_coverage"):
            typed("evaluation", {"interval_coverage": bad})


# ---- the model card -------------------------------------------------------------------------------

def _fusion_checkpoint(run: Path, summary: dict) -> tuple[Path, dict]:
    (run / "checkpoints").mkdir(parents=True)
    (run / "test_metrics.json").write_text(json.dumps(summary))
    header = {"module": "fusion", "modalities": ["video", "audio"], "created": "2026-01-02T03:04:00+00:00",
              "commit": "abc123", "data": {"name": "demo", "sessions": 12, "scale": [1, 5], "generated": True}}
    return run / "checkpoints" / "best.ckpt", {"empathic_fusion": header,
                                               "hyper_parameters": {"net": {"_target_": "x.LFLSTM"}}}


def test_the_card_reads_the_conformal_half_width(tmp_path):
    rng = np.random.default_rng(0)
    val = {"window_pred": rng.normal(0, 0.3, 60), "window_target": rng.normal(0, 0.3, 60),
           "rating_pred": rng.normal(0, 0.3, 20), "rating_target": rng.normal(0, 0.3, 20)}
    intervals = fusion_intervals(val, val, lambda t: 3 + 2 * np.asarray(t), 0.9, in_sample=False)
    summary = {"model": {"rating": {"pearson": 0.4, "mse": 0.05}}, "intervals": intervals}
    card = fusion_card(opened_checkpoint(*_fusion_checkpoint(tmp_path / "run", summary)))
    rating, window = intervals["levels"]["rating"], intervals["levels"]["window"]
    assert card.interval(FUSION_OUTPUT) == pytest.approx(rating["half_width"])
    assert card.interval(FUSION_WINDOW) == pytest.approx(window["half_width"])
    assert card.coverage == 0.9 and card.interval("other") is None
    low, high = card.interval_bounds(FUSION_OUTPUT, np.array([1.2, 3.0]))
    assert low[0] == 1.0 and high[1] == pytest.approx(3.0 + rating["half_width"])  # cut at the scale's end
    text = card.markdown()
    assert "90% split conformal" in text and "calibrated on the validation split" in text
    assert f"+-{rating['half_width']:.3f}" in text and "20 calibration items" in text
    assert f"{rating['test_coverage']:.1%} of 20 test items inside" in text and "1.96" not in text


def test_a_run_without_intervals_shows_none_and_says_why(tmp_path):
    old = _fusion_checkpoint(tmp_path / "old", {"model": {"rating": {"pearson": 0.4, "mse": 0.05}}})
    card = fusion_card(opened_checkpoint(*old))
    assert card.interval(FUSION_OUTPUT) is None and card.interval_bounds(FUSION_OUTPUT, 3.0) is None
    assert NO_INTERVALS in card.markdown() and "retrain, or re-run its test" in card.markdown()


def test_a_text_card_reads_each_output_and_the_unbounded_one(tmp_path):
    run = tmp_path / "text_run"
    (run / "checkpoints").mkdir(parents=True)
    few = calibrate(np.zeros(3), np.ones(3), np.zeros(2), np.ones(2), 0.9)
    enough = calibrate(np.zeros(40), np.linspace(-1, 1, 40), np.zeros(10), np.linspace(-1, 1, 10), 0.9)
    summary = {"outputs": {"empathy": {"TextRegressor": {"pearson": 0.3, "mse": 0.5}}},
               "intervals": interval_report({"empathy": enough, "other": few}, 0.9, False, "outputs")}
    (run / "test_metrics.json").write_text(json.dumps(summary))
    header = {"module": "text", "created": "2026-01-02T03:04:00+00:00", "commit": "abc", "encoder": {},
              "data": {"name": "t", "scale": [1, 5], "labels": ["empathy", "other"]}}
    card = text_card(opened_checkpoint(run / "checkpoints" / "x.ckpt", {
        "empathic_fusion": header, "hyper_parameters": {"net": {"_target_": "x.TextRegressor"}}}, from_folder=True))
    assert card.interval("empathy") == pytest.approx(enough["half_width"])
    assert card.interval("other") == math.inf and card.interval_bounds("other", 2.0) == (1.0, 5.0)
    assert "the whole scale (too few calibration items)" in card.markdown()


# ---- a real run's test report --------------------------------------------------------------------

def test_a_fusion_run_reports_its_intervals(tiny_dataset, tiny_store, tmp_path):
    """The parameter-free story_similarity model (no training: fast) through train.py's path, then
    evaluate.py split=val: the intervals in test_metrics.json / .md, their coverage as the written test
    predictions give it, and the card of the run's checkpoint."""
    from empathic_fusion.models.checkpoints import read_checkpoint
    from empathic_fusion.pipeline import evaluate, train
    from empathic_fusion.compose import compose_config

    data = [f"data.dataset_dir={tiny_dataset}", f"data.store_dir={tiny_store}", "data.demo=null",
            "data.extract_workers=1", "trainer.max_epochs=1", "trainer.accelerator=cpu", "logger=none",
            "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "seed=1",
            "model=story_similarity", "modality=t", "evaluation=lean",
            "evaluation.interval_coverage=0.8"]
    out = tmp_path / "run"
    results = train(compose_config(data, out))
    written = json.loads((out / "test_metrics.json").read_text())["intervals"]
    assert written["method"] == "split conformal" and written["coverage"] == 0.8 and not written["in_sample"]
    predictions = pd.read_csv(out / "test_predictions.csv")
    rating = written["levels"]["rating"]
    assert rating["n_test"] == len(predictions) and rating["n_calibration"] > 0
    if rating["half_width"] is not None:
        inside = (predictions.predicted - predictions.rated).abs() <= rating["half_width"] + 1e-9
        assert rating["test_coverage"] == pytest.approx(inside.mean(), abs=1e-6)
    windows = pd.read_csv(out / "test_window_predictions.csv")
    assert written["levels"]["window"]["n_test"] == len(windows)
    notes = (out / "test_metrics.md").read_text()
    assert "80% split conformal intervals" in notes and "| rating" in notes and "| window" in notes

    card = fusion_card(opened_checkpoint(Path(results["best_checkpoint"]), read_checkpoint(results["best_checkpoint"])))
    if rating["half_width"] is not None:
        assert card.interval(FUSION_OUTPUT) == pytest.approx(rating["half_width"])

    evaluated = tmp_path / "val"
    again = evaluate(compose_config([f"ckpt_path={results['best_checkpoint']}", "split=val", "trainer.accelerator=cpu",
                                     "evaluation=lean",
                                     "evaluation.interval_coverage=0.8"], evaluated, "evaluate"))
    in_sample = again["intervals"]
    assert in_sample["in_sample"] and "in-sample" in in_sample["note"]
    for level in ("window", "rating"):
        item = in_sample["levels"][level]
        assert item["n_test"] == item["n_calibration"] == written["levels"][level]["n_calibration"]
        assert item["half_width"] == written["levels"][level]["half_width"]
        assert item["test_coverage"] >= 0.8  # the k-th smallest of n residuals covers k / n >= 0.8 of them
