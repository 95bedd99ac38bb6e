"""Metrics against scipy / scikit-learn / torchmetrics, degenerate inputs, thresholds and per-rating aggregation."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.metrics import accuracy_score, cohen_kappa_score, f1_score, mean_absolute_error, mean_squared_error
from torchmetrics.functional import concordance_corrcoef

from empathic_fusion.dataset.scale import SELF_REPORT
from empathic_fusion.metrics import (ALL_METRIC_NAMES, METRIC_NAMES, aggregate_by_rating, choose_threshold, empathy_metrics,
                                     format_table, infer_levels, level_metrics, metrics_with_levels, to_levels)


def _ccc(pred: np.ndarray, target: np.ndarray) -> float:
    """Lin (1989): 2 cov / (var_p + var_t + (mean_p - mean_t)^2), population moments."""
    cov = np.mean((pred - pred.mean()) * (target - target.mean()))
    return 2 * cov / (pred.var() + target.var() + (pred.mean() - target.mean()) ** 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_scipy_and_sklearn(seed):
    rng = np.random.default_rng(seed)
    target = rng.choice([-1, -0.5, 0, 0.5, 1], size=200)  # ties in target, as with 1-5 ratings
    pred = 0.5 * target + rng.normal(0, 0.4, 200) + 0.1
    got = empathy_metrics(torch.tensor(pred), torch.tensor(target), threshold=0.0)
    assert set(got) == set(ALL_METRIC_NAMES)
    assert got["pearson"] == pytest.approx(stats.pearsonr(pred, target)[0], abs=1e-6)
    assert got["spearman"] == pytest.approx(stats.spearmanr(pred, target)[0], abs=1e-6)
    assert got["mse"] == pytest.approx(mean_squared_error(target, pred), rel=1e-6)
    assert got["mae"] == pytest.approx(mean_absolute_error(target, pred), rel=1e-6)
    assert got["ccc"] == pytest.approx(_ccc(pred, target), abs=1e-4)  # torchmetrics: sample moments
    assert got["ccc"] == pytest.approx(concordance_corrcoef(torch.tensor(pred), torch.tensor(target)).item(), abs=1e-9)
    assert got["accuracy"] == pytest.approx(accuracy_score(target > 0, pred > 0))
    assert got["f1"] == pytest.approx(f1_score(target > 0, pred > 0))


def test_ties_in_predictions_use_average_ranks():
    pred = np.array([0.0, 0.0, 0.5, 0.5, 0.5, 1.0])
    target = np.array([-1.0, 0.0, 0.0, 0.5, 1.0, 1.0])
    got = empathy_metrics(torch.tensor(pred), torch.tensor(target))
    assert got["spearman"] == pytest.approx(stats.spearmanr(pred, target)[0], abs=1e-6)


def test_rating_threshold_maps_to_cosine_scale():
    assert SELF_REPORT.to_target(3.0) == 0.0 and SELF_REPORT.to_target(4.0) == 0.5
    rng = np.random.default_rng(3)
    target, pred = rng.uniform(-1, 1, 100), rng.uniform(-1, 1, 100)
    got = empathy_metrics(torch.tensor(pred), torch.tensor(target), threshold=0.5)
    assert got["f1"] == pytest.approx(f1_score(target > 0.5, pred > 0.5))


def test_constant_predictions_warn_and_give_defined_values():
    target = torch.tensor([-1.0, 0.0, 0.5, 1.0])
    with pytest.warns(UserWarning, match="constant"):
        got = empathy_metrics(torch.zeros(4), target)
    assert got["pearson"] == 0.0 and got["spearman"] == 0.0 and got["ccc"] == 0.0
    assert got["mse"] == pytest.approx(float((target ** 2).mean()))
    assert got["f1"] == 0.0  # no positive prediction
    assert not any(np.isnan(v) for v in got.values())


def test_one_class_split_warns_and_is_defined():
    target = torch.tensor([0.5, 1.0, 0.5, 1.0])  # everyone empathized
    with pytest.warns(UserWarning, match="one side of the threshold"):
        got = empathy_metrics(torch.tensor([0.2, 0.9, -0.1, 0.7]), target)
    assert got["accuracy"] == pytest.approx(0.75) and got["f1"] == pytest.approx(f1_score([1] * 4, [1, 1, 0, 1]))
    with pytest.warns(UserWarning):
        low = empathy_metrics(torch.tensor([-0.5, -0.2]), torch.tensor([-1.0, -0.5]))
    assert low["f1"] == 0.0 and low["accuracy"] == 1.0


def test_constant_identical_ccc_is_one_and_empty_is_nan():
    with pytest.warns(UserWarning):
        assert empathy_metrics(torch.full((3,), 0.5), torch.full((3,), 0.5))["ccc"] == 1.0
    assert all(np.isnan(v) for v in empathy_metrics(torch.zeros(0), torch.zeros(0)).values())


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="differ in length"):
        empathy_metrics(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="finite"):
        empathy_metrics(torch.tensor([0.0, float("nan")]), torch.zeros(2))


def test_choose_threshold_maximises_validation_f1_and_beats_fixed_on_shifted_predictions():
    rng = np.random.default_rng(4)
    target = rng.choice([-1, -0.5, 0, 0.5, 1], size=300)
    pred = 0.3 * target - 0.4 + rng.normal(0, 0.1, 300)  # informative but shifted below the fixed cutoff 0
    cut = choose_threshold(torch.tensor(pred), torch.tensor(target), 0.0)
    best = max(f1_score(target > 0, pred > c) for c in np.unique(pred))
    assert f1_score(target > 0, pred > cut) == pytest.approx(best)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fixed = empathy_metrics(torch.tensor(pred), torch.tensor(target), 0.0)
        chosen = empathy_metrics(torch.tensor(pred), torch.tensor(target), 0.0, pred_threshold=cut)
    assert chosen["f1"] > fixed["f1"] + 0.3
    assert chosen["pearson"] == fixed["pearson"]  # only the binarisation moves
    with pytest.warns(UserWarning, match="single class"):
        assert choose_threshold(torch.tensor([0.1, 0.2]), torch.tensor([0.5, 1.0]), 0.0) == 0.0


def test_aggregate_by_rating_averages_windows():
    pred = torch.tensor([0.1, 0.3, -0.5, 0.9, 0.7])
    target = torch.tensor([0.5, 0.5, -1.0, 1.0, 1.0])
    rating = torch.tensor([4, 4, 2, 9, 9])
    mean_pred, first_target, ids = aggregate_by_rating(pred, target, rating)
    assert ids.tolist() == [2, 4, 9]
    assert mean_pred.tolist() == pytest.approx([-0.5, 0.2, 0.8])
    assert first_target.tolist() == [-1.0, 0.5, 1.0]


def test_format_table_scales_like_the_paper():
    row = {m: 0.1234 for m in ALL_METRIC_NAMES}
    table = format_table({"m": row}, scale=100)
    assert [c.strip() for c in table.splitlines()[0].split("|")[1:-1]] == ["", "r", "rho", "Acc", "F1", "MSE"]
    assert "12.340" in table
    assert "CCC" in format_table({"m": row}, metrics=ALL_METRIC_NAMES) and len(METRIC_NAMES) == 5


def test_metrics_on_a_level_scale_match_scipy_and_sklearn():
    rng = np.random.default_rng(0)
    target = rng.integers(1, 6, 200).astype(float)
    pred = target + rng.normal(0, 0.8, 200)
    got = metrics_with_levels(pred, target, 3.0, (1, 5))
    levels = to_levels(pred, (1, 5))
    assert levels.min() >= 1 and levels.max() <= 5 and np.array_equal(levels, np.clip(np.round(pred), 1, 5))
    assert got["pearson"] == pytest.approx(stats.pearsonr(pred, target)[0])
    assert got["spearman"] == pytest.approx(stats.spearmanr(pred, target)[0])
    assert got["mse"] == pytest.approx(mean_squared_error(target, pred))
    assert got["f1"] == pytest.approx(f1_score(target > 3, pred > 3))
    assert got["macro_f1"] == pytest.approx(f1_score(target.astype(int), levels, labels=[1, 2, 3, 4, 5], average="macro"))
    assert got["qwk"] == pytest.approx(cohen_kappa_score(target.astype(int), levels, weights="quadratic"))


def test_level_metrics_of_constants_and_without_a_scale():
    target = np.repeat([1.0, 2.0, 3.0, 4.0, 5.0], 4)
    constant = metrics_with_levels(np.full(20, 3.0), target, 3.0, (1, 5))
    assert constant["spearman"] == 0.0 and constant["qwk"] == 0.0  # project rule: no agreement, not NaN
    assert level_metrics(np.full(4, 2.0), np.full(4, 2.0), (1, 5))["qwk"] == 0.0
    assert all(np.isnan(v) for v in level_metrics(target, target, None).values())
    assert infer_levels(np.array([1.0, 5.0, 3.0])) == (1, 5) and infer_levels(np.array([0.5, 2.0])) is None
    with pytest.raises(ValueError, match="3 predictions for 2 targets"):
        level_metrics(np.zeros(3), np.zeros(2), (1, 5))
