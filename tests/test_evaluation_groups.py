"""Results per participant group (evaluation.groups): CIs from the participant resamples, pooling of
small groups, quantile bins, unknown attributes, settings, and the files a fusion run's report writes."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from empathic_fusion.config.checks import ConfigError
from empathic_fusion.config.evaluation import EvaluationConfig
from empathic_fusion.dataset import load_dataset
from empathic_fusion.dataset.scale import SELF_REPORT
from empathic_fusion.evaluation.groups import attribute_breakdown, check_attributes, group_labels, group_results
from empathic_fusion.pipeline import train
from empathic_fusion.compose import compose_config

SETTINGS = {"bootstrap": 200, "confidence": 0.9, "bootstrap_seed": 7, "min_group_size": 3, "group_bins": 3}


def _table(sizes: dict[str, int], ratings: int = 4, seed: int = 0) -> pd.DataFrame:
    """Ratings of participants in groups of the given sizes (attribute `group`), a group-dependent signal."""
    rng = np.random.default_rng(seed)
    rows = []
    for g, (label, n) in enumerate(sizes.items()):
        for p in range(n):
            rated = rng.integers(1, 6, ratings).astype(float)
            for r in rated:
                rows.append({"participant_id": f"{label}{p}", "group": label, "rated": r,
                             "predicted": float(np.clip(r + rng.normal(0, 0.5 + g), 1, 5))})
    return pd.DataFrame(rows)


def _direct(table: pd.DataFrame, members: dict[str, list[str]], n_boot: int, confidence: float, seed: int):
    """The bootstrap written out: the same seeded resamples of all participants; per group r (on the cosine
    scale, as the report computes it) and MSE on the 1-5 rating scale, as the report shows it."""
    participants = sorted(table.participant_id.unique())
    rng = np.random.default_rng(seed)
    draws = {g: [] for g in members}
    for _ in range(n_boot):
        pick = rng.integers(0, len(participants), len(participants))
        for g, ids in members.items():
            rows = pd.concat([table[(table.participant_id == participants[i]) & table.participant_id.isin(ids)]
                              for i in pick])
            pred, true = (rows.predicted.to_numpy() - 3) / 2, (rows.rated.to_numpy() - 3) / 2
            draws[g].append((np.corrcoef(pred, true)[0, 1], np.mean((rows.predicted - rows.rated) ** 2)) if len(rows)
                            else (np.nan,) * 2)
    alpha = (1 - confidence) / 2
    return {g: np.nanquantile(np.array(d), [alpha, 1 - alpha], axis=0) for g, d in draws.items()}, draws


def test_group_cis_and_gap_match_a_direct_participant_bootstrap():
    table = _table({"a": 4, "b": 5})
    result = attribute_breakdown(table, table["group"], 3, 3, 60, 0.9, 7, SELF_REPORT)
    members = {g: sorted(table.participant_id[table.group == g].unique()) for g in ("a", "b")}
    (bounds, draws) = _direct(table, members, 60, 0.9, 7)
    by_label = {g["group"]: g for g in result["groups"]}
    assert list(by_label) == ["a", "b"]
    for g in ("a", "b"):
        rows = table[table.group == g]
        pred, true = (rows.predicted - 3) / 2, (rows.rated - 3) / 2
        assert by_label[g]["pearson"]["estimate"] == pytest.approx(np.corrcoef(pred, true)[0, 1])
        assert by_label[g]["mse"]["estimate"] == pytest.approx(np.mean((rows.predicted - rows.rated) ** 2))
        assert [by_label[g]["pearson"]["low"], by_label[g]["pearson"]["high"]] == pytest.approx(bounds[g][:, 0])
        assert [by_label[g]["mse"]["low"], by_label[g]["mse"]["high"]] == pytest.approx(bounds[g][:, 1])
        assert by_label[g]["n_participants"] == len(members[g]) and by_label[g]["n_ratings"] == len(rows)
    gap = result["gaps"]["pearson"]  # two groups: the gap is their difference, higher r first
    high, low = gap["groups"]
    assert gap["estimate"] > 0
    assert gap["estimate"] == pytest.approx(by_label[high]["pearson"]["estimate"] - by_label[low]["pearson"]["estimate"])
    diff = np.array(draws[high])[:, 0] - np.array(draws[low])[:, 0]
    assert [gap["low"], gap["high"]] == pytest.approx(np.nanquantile(diff, [0.05, 0.95]))


def test_small_groups_are_pooled_and_never_reported_alone():
    table = _table({"big1": 4, "big2": 3, "tiny1": 2, "tiny2": 1})  # pool of 3: reported as one group
    result = attribute_breakdown(table, table["group"], 3, 3, 20, 0.9, 0, SELF_REPORT)
    assert [g["group"] for g in result["groups"]] == ["big1", "big2", "other (pooled: 2 groups)"]
    assert result["groups"][2]["n_participants"] == 3 and result["groups"][2]["n_ratings"] == 12

    table = _table({"big1": 5, "big2": 3, "tiny": 1})  # pool of 1 takes in the smallest reported group (big2)
    result = attribute_breakdown(table, table["group"], 3, 3, 20, 0.9, 0, SELF_REPORT)
    assert [g["group"] for g in result["groups"]] == ["big1", "other (pooled: 2 groups)"]
    assert result["groups"][1]["n_participants"] == 4

    table = _table({"big": 4, "tiny1": 1, "tiny2": 1})  # everything pooled into one group: not broken down
    result = attribute_breakdown(table, table["group"], 3, 3, 20, 0.9, 0, SELF_REPORT)
    assert not result["broken_down"] and result["groups"] == [] and result["gaps"] == {}
    assert result["note"] == "not broken down: fewer than two groups of at least 3 participants"


def test_small_groups_are_absent_from_every_output(tmp_path):
    table = _table({"big1": 4, "big2": 4, "rare": 2})
    table["single"] = "x"  # one group only
    logger = _Logger()
    summary, markdown = group_results(table, table[["group", "single"]], SETTINGS, SELF_REPORT, tmp_path,
                                      "the 1-5 rating scale", [logger])
    written = pd.read_csv(tmp_path / "test_groups.csv")
    text = json.dumps(summary) + markdown + written.to_csv()
    assert "rare" not in text
    # the pool of 2 took in big1 (the smallest reported group, first of two of 4)
    assert list(written.group.fillna("")) == ["big2", "other (pooled: 2 groups)", ""]
    assert written.note.iloc[-1].startswith("not broken down")
    assert (tmp_path / "test_groups.csv").read_text().splitlines()[1].startswith("group,big2,4,16,")
    assert summary["attributes"]["single"]["groups"] == []
    gap = summary["attributes"]["group"]["gaps"]
    assert logger.logged == [{"test/groups/group/n_groups": 2.0, "test/groups/group/r_gap": gap["pearson"]["estimate"],
                              "test/groups/group/mse_gap": gap["mse"]["estimate"],
                              "test/groups/single/n_groups": 0.0}]  # aggregates only: no labels, no ids


class _Logger:
    """What a Lightning logger's log_metrics receives."""

    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics: dict[str, float]) -> None:
        self.logged.append(dict(metrics))


def test_numeric_attribute_is_cut_into_quantile_bins_of_participants_and_missing_is_counted():
    table = pd.DataFrame({"participant_id": [f"p{i}" for i in range(7) for _ in range(2)],
                          "age": [a for a in (20, 25, 30, 41, 50, 60, None) for _ in range(2)]})
    labels, order, kind = group_labels(table, table["age"], 2)
    assert kind == "2 quantile bins" and order == ["[20, 35.5]", "(35.5, 60]"]  # the median of 6 participants
    assert list(labels[:6]) == ["[20, 35.5]"] * 6 and labels.isna().sum() == 2
    labels, order, kind = group_labels(table, table["age"], 6)  # no more values than bins: each value is a group
    assert kind == "values" and order == ["20", "25", "30", "41", "50", "60"]
    table["gender"] = ["f", "f", "m", "m", None, None] + ["f"] * 8  # text: its values
    labels, order, _ = group_labels(table, table["gender"], 2)
    assert order == ["f", "m"] and labels.isna().sum() == 2
    rated = table.assign(rated=np.tile([2.0, 4.0], 7), predicted=np.tile([2.5, 3.5], 7))
    result = attribute_breakdown(rated, rated["age"], 3, 2, 0, 0.9, 0, None)
    assert result["missing"] == {"participants": 1, "ratings": 2}
    assert [g["n_participants"] for g in result["groups"]] == [3, 3]


def test_unknown_attribute_and_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match=r"\['gender'\] not among the attributes of participants.csv; "
                                          r"available: \['age', 'trait_empathy'\]"):
        check_attributes(["trait_empathy", "gender"], ["age", "trait_empathy"], "participants.csv")
    check_attributes([], [], "participants.csv")
    assert EvaluationConfig().groups == [] and EvaluationConfig().min_group_size == 5
    assert EvaluationConfig().group_bins == 3
    for bad in ({"min_group_size": 0}, {"group_bins": 1}, {"groups": ["a", "a"]}, {"groups": [""]}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            EvaluationConfig(**bad)


def test_fusion_report_writes_groups(dataset_copy, tiny_store, tmp_path):
    """A participant attribute beyond the traits (text column) is kept by the dataset and broken down."""
    participants = pd.read_csv(dataset_copy / "participants.csv", dtype=str)
    participants["gender"] = ["f" if i % 2 else "m" for i in range(len(participants))]
    participants.to_csv(dataset_copy / "participants.csv", index=False)
    assert list(load_dataset(dataset_copy).participants["gender"][:2]) == ["m", "f"]
    out = tmp_path / "run"
    base = [f"data.dataset_dir={dataset_copy}", f"data.store_dir={tiny_store}", "data.demo=null",
            "data.extract_workers=1", "trainer.max_epochs=1", "trainer.accelerator=cpu", "logger=none",
            "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "seed=1",
            "model=story_similarity", "modality=t", "evaluation.plots=false", "evaluation.bootstrap=50",
            "evaluation.missing_modalities=false",
            "evaluation.min_group_size=1", "evaluation.group_bins=2"]
    with pytest.raises(ConfigError, match="available: .*'gender'"):
        train(compose_config(base + ["evaluation.groups=[age]"], out))
    train(compose_config(base + ["evaluation.groups=[gender,trait_empathy]"], out))
    written = pd.read_csv(out / "test_groups.csv")
    assert set(written.attribute) == {"gender", "trait_empathy"}
    predictions = pd.read_csv(out / "test_predictions.csv")
    gender = written[written.attribute == "gender"]
    assert gender.n_ratings.sum() == len(predictions)
    summary = json.loads((out / "test_metrics.json").read_text())["groups"]
    assert set(summary["attributes"]) == {"gender", "trait_empathy"}
    assert "Per group" in (out / "test_metrics.md").read_text()
