"""A dataset rated on another scale than 1-5 declares it in dataset.yaml (`rating_scale: [1, 7]`), and the
scale flows through: the contract checks ratings against it, targets are (rating - 4) / 3, Acc/F1 cut at
its midpoint 4, reports and the checkpoint carry it, and `empathic-predict` maps predictions back onto it
without the training dataset. Unknown dataset.yaml keys are an error; datasets without the key (the
demo) and old checkpoints read as 1-5.

The 1-7 dataset is the tiny demo's plan (tables and transcripts, no media) with its 1-5 ratings spread
onto 1-7, trained on text only, so a whole run takes seconds."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from empathic_fusion.config import ConfigError, validate
from empathic_fusion.config.demo import DemoConfig
from empathic_fusion.dataset import DatasetError, load_dataset
from empathic_fusion.dataset.scale import SELF_REPORT, RatingScale, recorded_scale
from empathic_fusion.demo.generate import plan_demo
from empathic_fusion.compose import compose_config

ONTO_SEVEN = {1: 1, 2: 2, 3: 4, 4: 6, 5: 7}  # the demo's 1-5 ratings spread symmetrically onto 1-7
PLAN = DemoConfig(n_participants=10, sessions_per_participant=1, warm_up_s=1.0, story_share_s=8.0,
                  story_receive_s=1.0, reflection_s=4.0, cool_down_s=1.0, noise_sd=0.15, seed=3)
FORMAT2 = Path(__file__).parent / "data" / "format2"


def write_dataset(root: Path, meta: dict, seven: bool = True) -> Path:
    """A text-only dataset in the contract's layout (sessions name media that are not there: the text
    modality never reads them)."""
    tables, transcripts, _ = plan_demo(PLAN)
    (root / "transcripts").mkdir(parents=True)
    (root / "dataset.yaml").write_text(yaml.safe_dump(meta, sort_keys=False, default_flow_style=None))
    if seven:
        tables["ratings"]["empathy"] = tables["ratings"].empathy.map(ONTO_SEVEN)
    for name in ("participants", "sessions", "stories", "ratings"):
        tables[name].to_csv(root / f"{name}.csv", index=False)
    for sid, transcript in transcripts.items():
        transcript.to_csv(root / "transcripts" / f"{sid}.csv", index=False)
    return root


def _set_first_rating(root: Path, value: str) -> None:
    ratings = pd.read_csv(root / "ratings.csv", dtype=str)
    ratings.loc[0, "empathy"] = value
    ratings.to_csv(root / "ratings.csv", index=False)


def _problems(root: Path) -> str:
    with pytest.raises(DatasetError) as info:
        load_dataset(root, ["text"])
    return str(info.value)


@pytest.fixture
def seven(tmp_path) -> Path:
    return write_dataset(tmp_path / "seven", {"name": "seven", "fps": 15, "rating_scale": [1, 7]})


# ---- the scale and the contract ------------------------------------------------------------------------

def test_a_one_to_seven_scale_maps_its_midpoint_to_zero_and_back():
    scale = RatingScale(1, 7)
    assert scale.midpoint == 4 and scale.half_range == 3
    assert np.allclose(scale.to_target([1, 4, 5.5, 7]), [-1, 0, 0.5, 1])
    assert np.allclose(scale.to_rating(scale.to_target([1, 2, 6, 7])), [1, 2, 6, 7])
    assert recorded_scale({"scale": [1, 7]}) == scale
    assert recorded_scale({}) == SELF_REPORT and recorded_scale(None) == SELF_REPORT  # old checkpoints: 1-5


def test_the_declared_scale_is_checked_and_kept(seven):
    _set_first_rating(seven, "7")
    data = load_dataset(seven, ["text"])
    assert data.rating_scale == RatingScale(1, 7) and data.ratings.empathy.max() == 7
    _set_first_rating(seven, "8")
    assert ("ratings.csv, line 2, field 'empathy': 8 is outside 1-7 (the rating_scale dataset.yaml declares)"
            in _problems(seven))
    _set_first_rating(seven, "0.5")
    assert "ratings.csv, line 2, field 'empathy': 0.5 is outside 1-7" in _problems(seven)


def test_without_rating_scale_the_default_one_to_five_refuses_a_seven_and_says_how_to_declare_another(seven):
    (seven / "dataset.yaml").write_text("name: seven\nfps: 15\n")
    _set_first_rating(seven, "7")
    assert ("ratings.csv, line 2, field 'empathy': 7 is outside 1-5 (the default rating scale; a dataset rated on "
            "another scale declares it in dataset.yaml, e.g. rating_scale: [1, 7])") in _problems(seven)


def test_an_unknown_dataset_yaml_key_is_named_with_its_line_and_the_allowed_keys(seven):
    (seven / "dataset.yaml").write_text("name: seven\nfps: 15\nrating_scal: [1, 7]\n")
    assert ("dataset.yaml, line 3, field 'rating_scal': is not a dataset.yaml key; did you mean 'rating_scale'? "
            "the keys are name, fps, generated, rating_scale") in _problems(seven)
    (seven / "dataset.yaml").write_text("name: seven\nlanguage: de\nfps: 15\n")
    assert ("dataset.yaml, line 2, field 'language': is not a dataset.yaml key; the keys are name, fps, generated, "
            "rating_scale") in _problems(seven)


@pytest.mark.parametrize("value, expected", [
    ("[7, 1]", "must be [low, high] with low < high, got [7, 1]"),
    ("[4, 4]", "must be [low, high] with low < high, got [4, 4]"),
    ("[1]", "must be [low, high], two numbers such as [1, 7], got [1]"),
    ("1-7", "must be [low, high], two numbers such as [1, 7], got '1-7'"),
    ("[1, .nan]", "must be [low, high] with two finite numbers, got [1, nan]"),
    ("[true, 7]", "must be [low, high] with two finite numbers, got [True, 7]"),
    ("[one, seven]", "must be [low, high] with two finite numbers, got ['one', 'seven']"),
])
def test_a_malformed_rating_scale_is_named_with_its_line(seven, value, expected):
    (seven / "dataset.yaml").write_text(f"name: seven\nrating_scale: {value}\nfps: 15\n")
    message = _problems(seven)
    assert f"dataset.yaml, line 2, field 'rating_scale': {expected}" in message
    assert "1 problem(s)" in message  # the ratings are not checked against a scale that is not there


def test_a_dataset_yaml_that_is_not_a_mapping_or_not_yaml_is_named(seven):
    (seven / "dataset.yaml").write_text("- fps: 15\n")
    expected = "dataset.yaml: must be a mapping of keys (name, fps, generated, rating_scale), got a list"
    assert expected in _problems(seven)
    (seven / "dataset.yaml").write_text("name: seven\nfps: [15\n")
    assert "dataset.yaml, line 3: is not valid YAML" in _problems(seven)


def test_the_default_threshold_is_the_midpoint_and_an_off_scale_one_stops_the_run(seven, tmp_path):
    ok = compose_config([f"data.dataset_dir={seven}", "data.demo=null", "evaluation.threshold_rating=6"], tmp_path)
    validate(ok)  # 6 is on 1-7 (refused on 1-5 before the scale could be declared)
    off = compose_config([f"data.dataset_dir={seven}", "data.demo=null", "evaluation.threshold_rating=8"], tmp_path)
    with pytest.raises(ConfigError, match=r"evaluation.threshold_rating=8.0: must be a rating within the scale 1-7 "
                                          r"\(the rating_scale of .*dataset.yaml"):
        validate(off)


# ---- a whole run on 1-7 -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def seven_run(tmp_path_factory) -> dict:
    """One epoch of the default fusion model on the 1-7 dataset's text (test report and checkpoint)."""
    from empathic_fusion.pipeline import train

    root = tmp_path_factory.mktemp("seven_run")
    dataset = write_dataset(root / "data", {"name": "seven", "fps": 15, "rating_scale": [1, 7]})
    overrides = [f"data.dataset_dir={dataset}", f"data.store_dir={root / 'store'}", "data.demo=null", "modality=t",
                 "data.split_fractions=[0.6,0.2,0.2]", "data.extract_workers=1", "trainer.max_epochs=1",
                 "evaluation.bootstrap=20", "evaluation.plots=false", "evaluation.missing_modalities=false",
                 "trainer.accelerator=cpu",
                 "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "logger=none"]
    cfg = compose_config(overrides, root / "run")
    results = train(cfg)
    return {"root": root, "dataset": dataset, "store": root / "store", "out": root / "run", "cfg": cfg,
            "results": results, "ckpt": Path(results["best_checkpoint"])}


def test_targets_are_ratings_minus_four_over_three(seven_run):
    from empathic_fusion.datamodules.build import build_datamodule
    from empathic_fusion.pipeline import run_config

    config = run_config(seven_run["cfg"])
    datamodule = build_datamodule(config["data"], config["features"], ["text"])
    datamodule.setup("fit")
    train = datamodule.datasets["train"]
    assert np.allclose(train.targets, (train.ratings - 4) / 3, atol=1e-7)
    assert set(np.unique(train.ratings)) <= {1, 2, 4, 6, 7} and train.targets.min() >= -1 and train.targets.max() <= 1
    assert datamodule.describe()["scale"] == [1.0, 7.0]


def test_the_report_cuts_at_four_and_lists_ratings_on_one_to_seven(seven_run):
    out = seven_run["out"]
    thresholds = json.loads((out / "test_metrics.json").read_text())["thresholds"]
    for level in ("window", "rating"):
        assert thresholds[level]["target"] == 0.0 and thresholds[level]["prediction_rating"] == 4.0
    table = pd.read_csv(out / "test_predictions.csv")
    ratings = pd.read_csv(seven_run["dataset"] / "ratings.csv").set_index(["session_id", "story_id"]).empathy
    assert len(table) and np.allclose(table.rated, ratings.loc[list(zip(table.session_id, table.story_id))], atol=1e-5)
    assert set(table.rated.round(4)) <= {1, 2, 4, 6, 7} and table.predicted.between(-2, 10).all()


def test_the_checkpoint_carries_the_scale_and_its_card_shows_mse_on_it(seven_run):
    from empathic_fusion.evaluation.card import fusion_card
    from empathic_fusion.models.checkpoints import load_module, opened_checkpoint, read_checkpoint

    model = load_module(seven_run["ckpt"], kind="fusion")
    assert model.rating_scale == RatingScale(1, 7) and model.threshold == 0.0
    card = fusion_card(opened_checkpoint(seven_run["ckpt"], read_checkpoint(seven_run["ckpt"])))
    assert card.scale == (1.0, 7.0) and "scale 1-7" in card.markdown()
    rating = json.loads((seven_run["out"] / "test_metrics.json").read_text())["model"]["rating"]
    assert rating["mse"] == pytest.approx(rating["loss"] * 9)  # the report's MSE on 1-7; the loss on (rating-4)/3
    assert card.test["empathy"].mse == pytest.approx(rating["mse"]) and "MSE on the 1-7 scale" in card.markdown()
    assert card.clip(7.8) == (7.0, True) and card.clip(6.5) == (6.5, False)


def test_predict_maps_back_onto_one_to_seven_without_the_training_dataset(seven_run, tmp_path):
    """Scoring a copy with no ratings and a dataset.yaml that declares no scale, with the training dataset
    gone: the predictions are the test report's, on 1-7 (the checkpoint's scale)."""
    from empathic_fusion.scoring.command import run_predict

    new = Path(shutil.copytree(seven_run["dataset"], tmp_path / "new"))
    (new / "ratings.csv").unlink()
    (new / "dataset.yaml").write_text("name: new\nfps: 15\n")
    hidden = seven_run["root"] / "data-moved"
    seven_run["dataset"].rename(hidden)
    try:
        result = run_predict(compose_config([f"ckpt_path={seven_run['ckpt']}", f"data.dataset_dir={new}",
                                             f"data.store_dir={seven_run['store']}", f"out_dir={tmp_path / 'out'}",
                                             "progress=false"], tmp_path / "run", config_name="predict"))
    finally:
        hidden.rename(seven_run["dataset"])
    assert result.scored
    pairs = pd.read_csv(tmp_path / "out" / "predictions.csv").set_index(["session_id", "story_id"])
    test = pd.read_csv(seven_run["out"] / "test_predictions.csv")
    raw = pairs.raw_predicted.loc[list(zip(test.session_id, test.story_id))].to_numpy()
    assert np.allclose(raw, test.predicted, atol=1e-4)
    scored = pairs[pairs.status == "scored"]
    assert scored.predicted.between(1, 7).all()


def test_predict_refuses_ratings_on_another_scale_than_the_model(seven_run, tmp_path):
    from empathic_fusion.evaluation.card import fusion_card
    from empathic_fusion.models.checkpoints import load_module, opened_checkpoint, read_checkpoint
    from empathic_fusion.scoring.fusion import score_dataset

    five = write_dataset(tmp_path / "five", {"name": "five", "fps": 15}, seven=False)
    model = load_module(seven_run["ckpt"], kind="fusion").eval()
    with pytest.raises(DatasetError, match=r"dataset.yaml, field 'rating_scale': rating_scale is 1-5 but the model "
                                           r"was trained on ratings on 1-7"):
        card = fusion_card(opened_checkpoint(seven_run["ckpt"], read_checkpoint(seven_run["ckpt"])))
        score_dataset(model, card, five, seven_run["store"], progress=False)


def test_evaluate_checks_the_threshold_against_the_checkpoints_scale(seven_run, tmp_path):
    from empathic_fusion.pipeline import evaluate

    common = [f"ckpt_path={seven_run['ckpt']}", "evaluation=lean",
              "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]
    summary = evaluate(compose_config(common + ["evaluation.threshold_rating=6"], tmp_path / "six", "evaluate"))
    assert summary["thresholds"]["rating"]["prediction_rating"] == pytest.approx(6.0)
    with pytest.raises(ConfigError, match=r"evaluation.threshold_rating=7.5: must be a rating within the scale 1-7 "
                                          r"\(the rating scale of the data the model was trained on\)"):
        evaluate(compose_config(common + ["evaluation.threshold_rating=7.5"], tmp_path / "off", "evaluate"))


def test_an_old_checkpoint_without_a_recorded_scale_reads_as_one_to_five():
    from empathic_fusion.evaluation.card import fusion_card
    from empathic_fusion.models.checkpoints import load_module, opened_checkpoint, read_checkpoint

    path = FORMAT2 / "fusion_lf_lstm.ckpt"
    model = load_module(path, kind="fusion")
    assert model.rating_scale == SELF_REPORT and model.threshold == 0.0
    assert fusion_card(opened_checkpoint(path, read_checkpoint(path))).scale == (1.0, 5.0)
