"""Settings a user can get wrong are refused when the run starts, naming key, value and allowed range."""
from __future__ import annotations

import re

import pytest

from empathic_fusion.pipeline import evaluate, train
from empathic_fusion.utils.compose import compose_config
from empathic_fusion.utils.config_checks import ConfigError, check_config
from tests.test_configs import COMBOS, TEXT_TABLE, _is_text


@pytest.mark.parametrize("override", COMBOS)
def test_every_shipped_config_passes_the_checks(override, tmp_path):
    extra = ["data.dataset_dir=/some/dataset"] if override == "data=empathic_stories" else []
    if _is_text(override):
        extra = TEXT_TABLE + (["model=text_regressor"] if override.startswith("data=") else ["data=text_csv"])
        if override == "data=empathetic_exchanges" or override.startswith("experiment=text_empathetic_exchanges"):
            extra = ["model=text_regressor"] if override.startswith("data=") else []
    check_config(compose_config([override] + extra, tmp_path))


@pytest.mark.parametrize("override,message", [
    ("trainer.max_epochs=-1", "trainer.max_epochs=-1: must be an integer >= 1"),
    ("data.window_frames=0", "data.window_frames=0: must be an integer >= 1"),
    ("data.stride_seconds=0", "data.stride_seconds=0: must be a number > 0"),
    ("data.split_fractions=[0.5,0.5,0.5]", "data.split_fractions=[0.5, 0.5, 0.5]: must be three non-negative"),
    ("data.batch_size=0", "data.batch_size=0: must be an integer >= 1"),
    ("model.threshold_rating=7", "model.threshold_rating=7: must be a rating within the scale 1-5"),
    ("evaluation.threshold=best", "evaluation.threshold=best: must be fixed or validation"),
    ("evaluation.confidence=1.5", "evaluation.confidence=1.5: must be a number strictly between 0 and 1"),
    ("data.cv_folds=1", "data.cv_folds=1: must be 0 (no cross-validation) or an integer >= 2"),
])
def test_nonsense_settings_stop_the_run_before_any_data_is_read(override, message, tmp_path):
    cfg = compose_config([override, "data.dataset_dir=/does/not/exist", "data.demo=null"], tmp_path)
    with pytest.raises(ConfigError, match=re.escape(message)):
        train(cfg)


def test_every_problem_is_listed_at_once_and_evaluate_checks_too(tmp_path):
    cfg = compose_config(["data.cv_folds=5", "data.cv_fold=5", "data.batch_size=-2"], tmp_path, "train")
    with pytest.raises(ConfigError) as error:
        check_config(cfg)
    assert "data.cv_fold=5: must be in 0..4" in str(error.value) and "data.batch_size=-2" in str(error.value)
    with pytest.raises(ConfigError, match="evaluation.bootstrap=-1"):
        evaluate(compose_config(["ckpt_path=/x.ckpt", "evaluation.bootstrap=-1"], tmp_path, "evaluate"))
