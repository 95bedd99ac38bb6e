"""Metrics against scipy / scikit-learn, degenerate inputs, and per-rating aggregation."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, mean_squared_error

from src.metrics import aggregate_by_rating, empathy_metrics


def test_metrics_match_scipy_and_sklearn():
    rng = np.random.default_rng(0)
    target = rng.choice([-1, -0.5, 0, 0.5, 1], size=200)
    pred = 0.5 * target + rng.normal(0, 0.4, 200)
    got = empathy_metrics(torch.tensor(pred), torch.tensor(target), threshold=0.0)
    assert got["pearson"] == pytest.approx(stats.pearsonr(pred, target)[0], abs=1e-5)
    assert got["spearman"] == pytest.approx(stats.spearmanr(pred, target)[0], abs=1e-5)  # ties in target
    assert got["mse"] == pytest.approx(mean_squared_error(target, pred), rel=1e-5)
    assert got["accuracy"] == pytest.approx(accuracy_score(target > 0, pred > 0))
    assert got["f1"] == pytest.approx(f1_score(target > 0, pred > 0))


def test_constant_predictions_warn_and_give_zero_correlation():
    target = torch.tensor([-1.0, 0.0, 0.5, 1.0])
    with pytest.warns(UserWarning, match="constant"):
        got = empathy_metrics(torch.zeros(4), target)
    assert got["pearson"] == 0.0 and got["spearman"] == 0.0
    assert got["mse"] == pytest.approx(float((target ** 2).mean()))
    assert got["f1"] == 0.0  # no positive prediction


def test_aggregate_by_rating_averages_windows():
    pred = torch.tensor([0.1, 0.3, -0.5, 0.9, 0.7])
    target = torch.tensor([0.5, 0.5, -1.0, 1.0, 1.0])
    rating = torch.tensor([4, 4, 2, 9, 9])
    mean_pred, first_target, ids = aggregate_by_rating(pred, target, rating)
    assert ids.tolist() == [2, 4, 9]
    assert mean_pred.tolist() == pytest.approx([-0.5, 0.2, 0.8])
    assert first_target.tolist() == [-1.0, 0.5, 1.0]
