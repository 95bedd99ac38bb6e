"""Rater agreement against scipy and statsmodels, on data with a planted rater offset."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from empathic_fusion.evaluation.agreement import agreement, agreement_table, main, mixed_model


def _nested(seed: int = 0, n_stories: int = 30, offset: float = 0.4) -> pd.DataFrame:
    """2-4 human raters per story; the model rates each story once, `offset` higher, with story effects."""
    rng = np.random.default_rng(seed)
    rows = []
    for story in range(n_stories):
        story_mean = 3 + rng.normal(0, 0.8)
        model = story_mean + offset + rng.normal(0, 0.2)
        for rater in range(rng.integers(2, 5)):
            rows.append({"story_id": f"s{story}", "rater": rater, "human": story_mean + rng.normal(0, 0.5),
                         "model": model, "other": story_mean + rng.normal(0, 0.5)})
    return pd.DataFrame(rows)


def test_agreement_matches_scipy():
    data = _nested()
    a, b = data["human"].to_numpy(), data["model"].to_numpy()
    got = agreement(a, b)
    assert got["wasserstein"] == pytest.approx(stats.wasserstein_distance(a, b))
    paired = stats.ttest_rel(a, b)
    assert got["paired_t"] == pytest.approx(paired.statistic) and got["paired_p"] == pytest.approx(paired.pvalue)
    welch = stats.ttest_ind(a, b, equal_var=False)
    assert got["welch_t"] == pytest.approx(welch.statistic) and got["welch_p"] == pytest.approx(welch.pvalue)
    assert got["rmse"] == pytest.approx(np.sqrt(np.mean((a - b) ** 2)))
    assert got["mean_diff"] == pytest.approx(np.mean(a - b)) and got["mean_diff"] < -0.2  # model rates higher
    assert got["std_a"] == pytest.approx(np.std(a, ddof=1))


def test_mixed_model_recovers_the_planted_offset_with_a_random_intercept_per_item():
    data = _nested(offset=0.4)
    fit = mixed_model(data["human"], data["model"], data["story_id"])
    assert fit["converged"]
    assert fit["mixed_coef"] == pytest.approx(0.4, abs=0.15) and fit["mixed_p"] < 0.01
    assert fit["item_var"] > 0.2  # stories differ (sd 0.8 planted): the random intercept carries it
    null = _nested(seed=1, offset=0.0)
    assert mixed_model(null["human"], null["other"], null["story_id"])["mixed_p"] > 0.01


def test_identical_ratings_warn_and_stay_defined():
    a = np.array([1.0, 2.0, 3.0, 4.0])
    with pytest.warns(UserWarning, match="undefined"):
        got = agreement(a, a.copy())
    assert got["rmse"] == 0 and got["wasserstein"] == 0 and got["paired_t"] == 0 and got["paired_p"] == 1


def test_table_drops_missing_pairs_and_names_bad_columns():
    data = _nested()
    data.loc[0, "model"] = np.nan
    with pytest.warns(UserWarning, match="1 row"):
        table = agreement_table(data, {"Empathy": ("human", "model")}, item="story_id")
    assert table.loc[0, "n"] == len(data) - 1 and table.loc[0, "n_dropped"] == 1
    with pytest.raises(ValueError, match="'gpt'"):
        agreement_table(data, {"E": ("human", "gpt")})


def test_command_reads_a_csv_and_writes_the_table(tmp_path, capsys):
    data = _nested()
    data.to_csv(tmp_path / "ratings.csv", index=False)
    table = main([str(tmp_path / "ratings.csv"), "--pair", "Empathy=human:model", "--pair", "human:other",
                  "--item", "story_id", "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert "| Empathy (human vs model) |" in printed and "Wasserstein dist" in printed and "MixedLM B-A" in printed
    assert list(table["label"]) == ["Empathy", "human vs other"]
    saved = pd.read_csv(tmp_path / "out" / "agreement.csv")
    assert saved.loc[0, "wasserstein"] == pytest.approx(stats.wasserstein_distance(data["human"], data["model"]))
    header = (tmp_path / "out" / "agreement.md").read_text().splitlines()[0]
    assert [cell.strip() for cell in header.split("|")[1:4]] == ["", "n", "Mean A"]
    assert (tmp_path / "out" / "agreement_empathy.png").stat().st_size > 10_000
    assert (tmp_path / "out" / "agreement_human_vs_other.png").exists()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "ratings.csv"), "--pair", "human-model"])
