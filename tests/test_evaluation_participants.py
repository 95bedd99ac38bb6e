"""Per-participant breakdown, participant-resampling bootstrap CIs, and the plots (PNG + loggers)."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from empathic_fusion.evaluation.participants import bootstrap_ci, per_participant
from empathic_fusion.evaluation.plots import (log_figure, modality_ablation, per_participant_r, predicted_vs_true,
                                  rating_distributions, save_figure)
from empathic_fusion.metrics import empathy_metrics, metric_values


def _predictions(n_participants: int = 12, per_person: int = 8, signal: float = 0.8, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_participants):
        rated = rng.integers(1, 6, per_person).astype(float)
        predicted = np.clip(3 + signal * (rated - 3) + rng.normal(0, 0.6, per_person), 1, 5)
        rows += [{"participant_id": f"p{p:02d}", "predicted": a, "rated": b} for a, b in zip(predicted, rated)]
    return pd.DataFrame(rows)


def test_per_participant_matches_scipy_and_flags_undefined_r():
    table = _predictions()
    table.loc[table.participant_id == "p03", "rated"] = 4.0  # one person rates everything 4
    breakdown = per_participant(table)
    assert len(breakdown) == 12 and breakdown["n"].eq(8).all()
    one = table[table.participant_id == "p00"]
    assert breakdown.set_index("participant_id").loc["p00", "pearson"] == pytest.approx(
        stats.pearsonr(one.predicted, one.rated)[0], abs=1e-6)
    flat = breakdown.set_index("participant_id").loc["p03"]
    assert not flat["r_defined"] and flat["pearson"] == 0.0
    assert breakdown["r_defined"].sum() == 11


@pytest.mark.parametrize("case", ["random", "ties", "constant_pred", "one_class", "identical_constant", "shifted_cut"])
def test_warning_free_core_equals_empathy_metrics(case):
    rng = np.random.default_rng(5)
    target = rng.choice([-1, -0.5, 0, 0.5, 1], size=40)
    pred = 0.4 * target + rng.normal(0, 0.3, 40)
    cut = None
    if case == "ties":
        pred = np.round(pred, 1)
    elif case == "constant_pred":
        pred = np.full(40, 0.1)
    elif case == "one_class":
        target = np.abs(target) + 0.5
    elif case == "identical_constant":
        pred = target = np.full(40, 0.5)
    elif case == "shifted_cut":
        cut = -0.2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = empathy_metrics(torch.tensor(pred), torch.tensor(target), 0.0, cut)
    got = metric_values(pred, target, 0.0, cut)
    assert got == pytest.approx(expected, abs=1e-6)


def test_bootstrap_resamples_participants_and_covers_the_estimate():
    table = _predictions()
    ci = bootstrap_ci(table, n_boot=300, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = empathy_metrics(torch.tensor((table.predicted.to_numpy() - 3) / 2), torch.tensor((table.rated.to_numpy() - 3) / 2),
                               half_range=2.0)
    for metric, values in ci.items():
        assert values["estimate"] == pytest.approx(full[metric])
        assert values["low"] <= values["estimate"] <= values["high"]
    assert 0 < ci["pearson"]["low"] < ci["pearson"]["high"] < 1  # planted signal: r clearly positive
    assert ci == bootstrap_ci(table, n_boot=300, seed=1)  # deterministic given the seed


def test_one_mse_whether_metrics_are_computed_on_the_cosine_or_the_rating_scale():
    """scale=None (text labels, scored as they are) and the 1-5 scale (a fusion model's ratings, computed on
    the cosine scale) give the same estimates and intervals: MSE and MAE come out on the rating scale."""
    table = _predictions()
    own = bootstrap_ci(table, n_boot=200, seed=1, threshold_rating=3.5, scale=None)
    cosine = bootstrap_ci(table, n_boot=200, seed=1, threshold_rating=3.5)
    expected = metric_values(table.predicted.to_numpy(float), table.rated.to_numpy(float), 3.5)
    assert {m: v["estimate"] for m, v in own.items()} == pytest.approx(expected)
    assert own["mse"]["estimate"] == pytest.approx(np.mean((table.predicted - table.rated) ** 2))
    for metric in own:
        assert own[metric] == pytest.approx(cosine[metric]), metric


def test_participant_bootstrap_is_wider_than_rating_bootstrap_when_people_differ():
    """Clustered data: each participant shifts all their predictions; resampling people sees that."""
    rng = np.random.default_rng(2)
    table = _predictions(n_participants=10, per_person=20, signal=0.3, seed=2)
    shifts = {p: rng.normal(0, 0.8) for p in table.participant_id.unique()}
    table["predicted"] = table.predicted + table.participant_id.map(shifts)
    by_person = bootstrap_ci(table, n_boot=300, seed=0)["mse"]
    by_rating = bootstrap_ci(table.assign(participant_id=np.arange(len(table))), n_boot=300, seed=0)["mse"]
    assert by_person["high"] - by_person["low"] > 1.5 * (by_rating["high"] - by_rating["low"])


def test_one_participant_warns_and_missing_columns_fail():
    table = _predictions(n_participants=1)
    with pytest.warns(UserWarning, match="1 participant"):
        ci = bootstrap_ci(table, n_boot=50)
    assert ci["pearson"]["low"] == ci["pearson"]["high"] == ci["pearson"]["estimate"]
    with pytest.raises(ValueError, match="participant_id"):
        per_participant(table.drop(columns="participant_id"))


def test_plots_are_pngs_and_go_to_image_loggers_only(tmp_path):
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    table = _predictions()
    figures = {"pred_vs_true": predicted_vs_true(table.predicted, table.rated),
               "distributions": rating_distributions(table.rated, table.predicted),
               "per_participant": per_participant_r(per_participant(table))}
    summary = pd.DataFrame({"model": ["LF-LSTM", "LF-LSTM", "TFN", "TFN"], "modality": ["t", "v+t"] * 2,
                            "pearson_mean": [0.1, 0.3, 0.05, -0.1], "pearson_std": [0.01, 0.05, 0.02, 0.03]})
    figures["ablation"] = modality_ablation(summary, "pearson")
    assert figures["pred_vs_true"].axes[0].get_title() == "Predicted vs self-rated empathy"
    assert len(figures["ablation"].axes[0].patches) == 4  # 2 models x 2 modality bars
    tensorboard = TensorBoardLogger(tmp_path / "tb")
    sent = log_figure([CSVLogger(tmp_path / "csv"), tensorboard], "test/pred_vs_true", figures["pred_vs_true"])
    assert sent == ["TensorBoardLogger"]  # CSV takes no images: skipped silently
    tensorboard.experiment.flush()
    assert any((tmp_path / "tb").rglob("events.out.tfevents.*"))
    for name, fig in figures.items():
        path = save_figure(fig, tmp_path / f"{name}.png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
