"""Settings a user can get wrong are refused, naming key, value and what is allowed: a wrong type or an
unknown key while Hydra composes the config, a value out of range or choices when the run starts."""
from __future__ import annotations

import inspect
import re
import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException
from lightning.pytorch import Trainer

from empathic_fusion.config import ConfigError, TrainerConfig, typed, validate
from empathic_fusion.pipeline import evaluate, train
from empathic_fusion.compose import compose_config
from tests.test_configs import COMBOS, TEXT_TABLE, _is_text


@pytest.mark.parametrize("override", COMBOS)
def test_every_shipped_config_passes_the_checks(override, tmp_path):
    extra = ["data.dataset_dir=/some/dataset"] if override == "data=empathic_stories" else []
    if _is_text(override):
        extra = TEXT_TABLE + (["model=text_regressor"] if override.startswith("data=") else ["data=text_csv"])
        if override == "data=empathetic_exchanges" or override.startswith("experiment=text_empathetic_exchanges"):
            extra = ["model=text_regressor"] if override.startswith("data=") else []
    validate(compose_config([override] + extra, tmp_path))


@pytest.mark.parametrize("override,message", [
    ("trainer.max_epochs=-1", "trainer.max_epochs=-1: must be an integer >= 1"),
    ("data.window_frames=0", "data.window_frames=0: must be an integer >= 1"),
    ("data.stride_seconds=0", "data.stride_seconds=0.0: must be a number > 0"),
    ("data.split_fractions=[0.5,0.5,0.5]", "data.split_fractions=[0.5, 0.5, 0.5]: must be three non-negative"),
    ("data.batch_size=0", "data.batch_size=0: must be an integer >= 1"),
    ("evaluation.threshold_rating=7", "evaluation.threshold_rating=7.0: must be a rating within the scale 1-5"),
    ("evaluation.threshold=best", "evaluation.threshold=best: must be fixed or validation"),
    ("evaluation.confidence=1.5", "evaluation.confidence=1.5: must be a number strictly between 0 and 1"),
    ("data.cv_folds=1", "data.cv_folds=1: must be 0 (no cross-validation) or an integer >= 2"),
    ("data.scenario=story", "data.scenario=story: must be story_share or reflection"),
    ("data.demo.n_participants=0", "data.demo.n_participants=0: must be an integer >= 1"),
    ("features.face.backend=dlib", "features.face.backend=dlib: must be mediapipe or openface"),
    ("features.modalities.video=[glove]", "features.modalities.video=['glove']: must be one or more of ['face', 'cnn']"),
    ("model.optimizer.lr=0", "model.optimizer.lr=0: must be a learning rate > 0"),
    ("model.optimizer.weight_decay=-1", "model.optimizer.weight_decay=-1: must be a number >= 0"),
    ("model.head=mlp", "model.head=mlp: must be similarity, regression, cosine or constant"),
    ("model.needs=[smell]", "model.needs=['smell']: must be a subset of ['video', 'audio', 'text']"),
    ("threads=0", "threads=0: must be null (the cores free now) or an integer >= 1"),
    ("optimized_metric=test/loss", "optimized_metric=test/loss: must be a validation metric (val/...)"),
])
def test_out_of_range_settings_stop_the_run_before_any_data_is_read(override, message, tmp_path):
    cfg = compose_config([override, "data.dataset_dir=/does/not/exist"], tmp_path)
    with pytest.raises(ConfigError, match=re.escape(message)):
        train(cfg)


@pytest.mark.parametrize("override,message", [
    ("data.batch_size=abc", "Value 'abc' of type 'str' could not be converted to Integer"),     # wrong type
    ("evaluation.plots=maybe", "Value 'maybe' is not a valid bool"),
    ("data.windw_frames=100", "Key 'windw_frames' not in 'FusionDataConfig'"),                  # unknown key
    ("trainer.max_epoch=3", "Key 'max_epoch' not in 'TrainerConfig'"),
    ("model.hed=regression", "Key 'hed' not in 'FusionModelConfig'"),
    ("verbose=loud", "Value 'loud' is not a valid bool"),                                         # top-level keys
    ("seeds=3", "Key 'seeds' not in 'TrainRunConfig'"),
])
def test_wrong_types_and_unknown_keys_fail_while_composing(override, message, tmp_path):
    with pytest.raises(ConfigCompositionException) as error:
        compose_config([override], tmp_path)
    text = f"{error.value}\n{error.value.__cause__}"
    assert override.split("=")[0] in text and message in text  # Hydra names the override, OmegaConf what is allowed
    assert override in text or "Could not override" in text


def test_unknown_keys_added_with_plus_are_refused_at_start(tmp_path):
    cfg = compose_config(["+data.windw_frames=100", "+features.cnn.strid=2"], tmp_path)
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert "data.windw_frames=100: not a setting; known: [" in str(error.value) and "'window_frames'" in str(error.value)
    assert "features.cnn.strid=2: not a setting" in str(error.value)
    with pytest.raises(ConfigError, match=re.escape("seeds: not a setting; known: ['task_name', 'threads', 'verbose', 'paths', 'seed'")):
        validate(compose_config(["+seeds=3"], tmp_path))


def test_partial_configs_from_code_are_typed_with_defaults_filled_in():
    assert typed("evaluation", {"bootstrap": 5}).confidence == 0.95
    with pytest.raises(ConfigError, match=re.escape("evaluation.bootstrap=many: Value 'many' of type 'str' could not")):
        typed("evaluation", {"bootstrap": "many"})
    with pytest.raises(ConfigError, match=re.escape("features.cnn.fo: not a setting; known: ['model'")):
        typed("features", {"cnn": {"fo": 1}})
    with pytest.raises(ConfigError, match=re.escape("data.dataset_dir=???: must be set")):
        typed("data", {"_target_": "empathic_fusion.datamodules.fusion_datamodule.FusionDataModule"})


def test_text_model_settings_are_checked(tmp_path):
    text = ["data=text_csv", "model=text_regressor", *TEXT_TABLE]
    with pytest.raises(ConfigError) as error:
        validate(compose_config(text + ["model.encoder_lr=0", "model.optimizer.lr=-1"], tmp_path))
    for problem in ("model.encoder_lr=0.0: must be a learning rate > 0", "model.optimizer.lr=-1: must be a learning"):
        assert problem in str(error.value)
    with pytest.raises(ConfigError, match=re.escape("model.robustness.report_level=0.5: must be one of levels [0.1,")):
        validate(compose_config(text + ["model.robustness.report_level=0.5"], tmp_path))
    built = typed("model", {"_target_": "empathic_fusion.models.text_module.TextEmpathyModule", "net": {"_target_": "x.Net"},
                            "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-3}})
    assert built.use_persona and built.baselines.embedding_ridge and built.robustness.n_texts == 0
    with pytest.raises(ConfigError, match=re.escape("model.net=None: must be a network config")):
        typed("model", {"_target_": "empathic_fusion.models.fusion_module.FusionModule", "net": None,
                        "optimizer": {"_target_": "torch.optim.AdamW"}})


@pytest.mark.parametrize("name,override,message", [
    ("evaluate", "split=train", "split=train: must be test or val"),
    ("extract", "workers=0", "workers=0: must be an integer >= 1"),
    ("serve", "port=0", "port=0: must be a port number in 1..65535"),
    ("serve", "accelerator=tpu", "accelerator=tpu: must be cpu, gpu or auto"),
    ("predict", "data.extract_workers=0", "data.extract_workers=0: must be an integer >= 1"),
    ("predict", "accelerator=tpu", "accelerator=tpu: must be cpu, gpu or auto"),
])
def test_top_level_keys_of_every_entry_point_are_checked(name, override, message, tmp_path):
    cfg = compose_config([override], tmp_path, name)
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(cfg)


def test_every_problem_is_listed_at_once_and_evaluate_checks_too(tmp_path):
    cfg = compose_config(["data.cv_folds=5", "data.cv_fold=5", "data.batch_size=-2", "evaluation.bootstrap=-1"],
                         tmp_path, "train")
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    for problem in ("data.cv_fold=5: must be in 0..4", "data.batch_size=-2", "evaluation.bootstrap=-1"):
        assert problem in str(error.value)
    with pytest.raises(ConfigError, match="evaluation.bootstrap=-1"):
        evaluate(compose_config(["ckpt_path=/x.ckpt", "evaluation.bootstrap=-1"], tmp_path, "evaluate"))


def test_trainer_schema_keeps_lightnings_defaults_where_the_project_sets_none():
    project = {"_target_", "default_root_dir", "max_epochs", "devices", "log_every_n_steps", "deterministic",
               "enable_model_summary", "enable_progress_bar"}
    lightning = {name: p.default for name, p in inspect.signature(Trainer.__init__).parameters.items()}
    schema = {name: value for name, value in vars(TrainerConfig()).items() if name not in project}
    assert schema and all(lightning[name] == value for name, value in schema.items()), \
        {name: (value, lightning[name]) for name, value in schema.items() if lightning[name] != value}


def test_the_schemas_are_registered_for_anyone_composing_the_config_tree():
    """Hydra's own API on the packaged tree, in a fresh interpreter: importing CONFIG_DIR registers the schemas."""
    code = ("from hydra import compose, initialize_config_dir\n"
            "from empathic_fusion.utils import CONFIG_DIR\n"
            "with initialize_config_dir(str(CONFIG_DIR), version_base='1.3'):\n"
            "    cfg = compose('train', overrides=['evaluation.bootstrap=7'])\n"
            "from omegaconf import OmegaConf\n"
            "print(OmegaConf.get_type(cfg.evaluation).__name__, cfg.evaluation.bootstrap, cfg.data.window_frames)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["EvaluationConfig", "7", "120"]
