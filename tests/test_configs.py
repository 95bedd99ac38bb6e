"""Every config composes, and every composed config instantiates its datamodule, model and trainer."""
from __future__ import annotations

from pathlib import Path

import hydra
import pytest
from lightning.pytorch.accelerators import CPUAccelerator
from omegaconf import OmegaConf

from empathic_fusion.config import (EvaluateRunConfig, ExtractRunConfig, FusionModelConfig, PredictRunConfig,
                                    ServeRunConfig, TextModelConfig, TrainRunConfig, validate)
from empathic_fusion.models.fusion_module import FusionModule
from empathic_fusion.pipeline import build_datamodule, build_model
from empathic_fusion.utils import CONFIG_DIR
from empathic_fusion.compose import compose_config

CONF = CONFIG_DIR


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(name: str, overrides: list[str], tmp_path: Path):
    return compose_config(overrides, tmp_path, name)


COMBOS = [f"data={d}" for d in _options("data")] + [f"model={m}" for m in _options("model")] \
    + [f"modality={m}" for m in _options("modality")] + [f"trainer={t}" for t in _options("trainer")] \
    + [f"features={f}" for f in _options("features")] \
    + [f"logger={lg}" for lg in _options("logger")] + [f"experiment={e}" for e in _options("experiment")] \
    + [f"evaluation={e}" for e in _options("evaluation")]


# Text models (empathic_fusion/text/) pair with text tables, not with the multimodal datamodule: they are composed
# with each other (see _check_text_config). The LLM judge is an evaluate.py config group (conf/judge).
TEXT_DATA, TEXT_MODELS = {"text_csv", "empathetic_exchanges"}, {"text_regressor", "text_finetune"}
TEXT_TABLE = ["data.path=/some/table.csv", "data.text_columns=[text]", "data.label_columns=[score]"]


def _is_text(override: str) -> bool:
    group, name = override.split("=", 1)
    return (group == "data" and name in TEXT_DATA) or (group == "model" and name in TEXT_MODELS) \
        or (group == "experiment" and name.startswith("text_"))


def _check_text_config(override: str, tmp_path: Path) -> None:
    from empathic_fusion.datamodules.text_table import PersonaEncoder
    from empathic_fusion.datamodules.text_datamodule import TextDataModule
    from empathic_fusion.models.text_module import TextEmpathyModule

    extra = {"data=text_csv": ["model=text_regressor"] + TEXT_TABLE,
             "model=text_regressor": ["data=text_csv"] + TEXT_TABLE,
             "model=text_finetune": ["data=text_csv"] + TEXT_TABLE}.get(override, [])
    if override in ("data=empathetic_exchanges",):
        extra = ["model=text_regressor"]
    modality = [] if override.startswith("experiment=") else ["modality=t"]  # a text table serves text only
    cfg = _compose("train", [override, "model.net.encoder.cache_dir=null"] + extra + modality, tmp_path)
    dm = build_datamodule(OmegaConf.to_container(cfg.data, resolve=True), OmegaConf.to_container(cfg.features, resolve=True),
                          list(cfg.modality.names))
    assert isinstance(dm, TextDataModule) and dm.spec.text_columns and dm.spec.label_columns and dm.n_folds == 5
    assert OmegaConf.get_type(cfg.model) is TextModelConfig and OmegaConf.get_type(cfg) is TrainRunConfig
    model = OmegaConf.to_container(cfg.model, resolve=True)
    assert model["optimizer"]["_partial_"] and model["optimizer"]["_target_"] == "torch.optim.AdamW"
    info = {"fields": dm.spec.fields, "labels": dm.spec.label_columns, "persona": PersonaEncoder([]).state(),
            "target_mean": [3.0] * len(dm.spec.label_columns), "target_std": [1.0] * len(dm.spec.label_columns),
            "levels": [1, 5]}
    module = build_model(cfg, info)
    assert isinstance(module, TextEmpathyModule)
    assert module.net.head[-1].out_features == len(dm.spec.label_columns)
    n_fields, labels = len(dm.spec.fields), len(dm.spec.label_columns)
    # TF-IDF ridge + an embedding ridge per field and layer set, the last 1, 2, 4 and all 6 of MiniLM (tests see no
    # installed mpnet: model_path auto is MiniLM), + the fine-tuned encoder expert, a score per label each
    finetuned = override in ("model=text_finetune", "experiment=text_empathetic_exchanges_finetune")
    n_experts = 1 + n_fields * 4 + finetuned
    assert model["net"]["encoder"]["model_path"] == "auto" and module.encoder.dim == 384
    assert model["net"]["head_input"] == "expert_scores" and module.encoder.frozen and module.net.layer_sets == (1, 2, 4, 6)
    assert len(module.net.experts) == n_experts and module.net.head[1].in_features == labels * n_experts
    if finetuned:  # the packaged MiniLM (not the frozen experts' encoder, which may be mpnet), the run's seed, every field
        expert = module.net.experts[-1]
        assert expert.model_path is None and expert.seed == cfg.seed
        assert expert.fields == list(dm.spec.fields) and expert.trainable_layers == 6
    trainer = hydra.utils.instantiate(cfg.trainer, logger=False, enable_progress_bar=False)
    assert trainer.max_epochs == (30 if override.startswith("experiment=") else 10)


def test_the_fine_tune_recipe_keeps_the_default_experts_and_adds_one(tmp_path):
    """conf/model/text_finetune.yaml restates text_regressor's experts (Hydra replaces lists): they stay equal."""
    default, finetune = (OmegaConf.to_container(_compose("train", ["data=text_csv", f"model={name}"] + TEXT_TABLE,
                                                         tmp_path).model, resolve=True)
                         for name in ("text_regressor", "text_finetune"))
    assert finetune["net"]["experts"][:-1] == default["net"]["experts"]
    assert finetune["net"]["experts"][-1]["_target_"].endswith("FineTunedEncoderExpert")
    default["net"].pop("experts"), finetune["net"].pop("experts")
    assert finetune == default  # nothing else differs


def test_judge_config_composes_for_evaluate(tmp_path):
    from empathic_fusion.evaluation.llm_judge import PROMPTS

    cfg = _compose("evaluate", ["judge=llm_judge", "+data=empathetic_exchanges"], tmp_path)
    assert cfg.judge.prompt in PROMPTS and cfg.judge.max_retries >= 1 and cfg.data.label_columns == ["empathy"]


@pytest.mark.parametrize("override", COMBOS)
def test_train_config_composes_and_instantiates(override, tmp_path):
    if _is_text(override):
        return _check_text_config(override, tmp_path)
    extra = ["data.dataset_dir=/some/dataset"] if override == "data=empathic_stories" else []
    cfg = _compose("train", [override] + extra, tmp_path)
    assert OmegaConf.get_type(cfg.model) is FusionModelConfig and OmegaConf.get_type(cfg) is TrainRunConfig
    assert cfg.modality.names and set(cfg.modality.names) <= {"video", "audio", "text"}
    paper_lr = 1e-3 if override.startswith(("experiment=demo", "experiment=es_")) else 1e-4  # demo recipe: lr x10
    # the paper grids' cheap demo recipe; the demo's own recipe (conf/experiment/demo.yaml); the paper's
    epochs = 2 if override.startswith("experiment=es_") else 30 if override.startswith("experiment=demo") else 10
    assert cfg.model.optimizer.lr == paper_lr and cfg.trainer.max_epochs == epochs and cfg.data.window_frames == 120
    dm = build_datamodule(OmegaConf.to_container(cfg.data, resolve=True), OmegaConf.to_container(cfg.features, resolve=True),
                          list(cfg.modality.names))
    assert dm.modalities == list(cfg.modality.names)
    dims = {"video": 4, "audio": 3, "text": 5, "story": 5, "traits": 6}
    model = build_model(cfg, {"modalities": list(cfg.modality.names), "input_dims": dims})
    assert isinstance(model, FusionModule)
    assert model.net.out_dim > 0
    if override not in ("trainer=gpu", "trainer=ddp"):  # no GPU here; the gpu configs still compose
        trainer = hydra.utils.instantiate(cfg.trainer, logger=False, enable_progress_bar=False)
        assert trainer.max_epochs == epochs
    for callback in cfg.callbacks.values():
        hydra.utils.instantiate(callback)
    for logger in (cfg.logger or {}).values():
        if logger._target_.endswith("mlflow_logger"):  # opens its sqlite store (seconds); a run test covers it
            continue
        hydra.utils.instantiate(logger)


def test_modality_short_names_cover_all_seven_subsets():
    assert _options("modality") == sorted(["t", "v", "a", "v+a", "v+t", "a+t", "v+a+t"])


def test_serve_config_composes(tmp_path):
    cfg = _compose("serve", ["ckpt_path=/x/model.pt"], tmp_path)
    assert OmegaConf.get_type(cfg) is ServeRunConfig and cfg.port == 7860 and cfg.threads is None
    assert cfg.ckpt_path == "/x/model.pt" and cfg.host == "127.0.0.1" and cfg.flag_csv.endswith("flagged.csv")


def test_predict_config_composes(tmp_path):
    cfg = _compose("predict", ["ckpt_path=/x/run", "data.dataset_dir=/x/new"], tmp_path)
    assert OmegaConf.get_type(cfg) is PredictRunConfig and cfg.accelerator == "cpu" and cfg.progress
    assert cfg.data.dataset_dir == "/x/new" and cfg.data.path is None and cfg.data.extract_workers == 1


def test_evaluate_config_composes(tmp_path):
    cfg = _compose("evaluate", ["ckpt_path=/x.ckpt"], tmp_path)
    assert OmegaConf.get_type(cfg) is EvaluateRunConfig and cfg.data == {} and cfg.features == {}
    assert cfg.ckpt_path == "/x.ckpt" and cfg.split == "test" and cfg.verbose is False


def test_extract_config_composes_with_its_top_level_defaults(tmp_path):
    cfg = _compose("extract", ["shard=3/16"], tmp_path)
    assert OmegaConf.get_type(cfg) is ExtractRunConfig and cfg.shard == "3/16" and cfg.branches is None
    assert cfg.workers == cfg.data.extract_workers and not cfg.verify and cfg.progress


# what each debug config (conf/debug) makes of the Trainer, beyond default.yaml's one CPU epoch
DEBUG_TRAINERS = {
    "default": {},
    "fast_dev_run": {"fast_dev_run": True, "limit_train_batches": 1, "limit_val_batches": 1, "limit_test_batches": 1},
    "overfit": {"max_epochs": 20, "overfit_batches": 3, "limit_train_batches": 3, "limit_val_batches": 3},
    "limit": {"max_epochs": 3, "limit_train_batches": 5, "limit_val_batches": 2, "limit_test_batches": 2},
    "profiler": {"profiler": "SimpleProfiler"},
}


def test_every_debug_config_is_tested():
    assert sorted(DEBUG_TRAINERS) == _options("debug")


@pytest.mark.parametrize("name", sorted(DEBUG_TRAINERS))
def test_debug_configs_give_the_trainer_they_name(name, tmp_path):
    cfg = _compose("train", [f"debug={name}"], tmp_path)
    validate(cfg)
    assert cfg.task_name == "debug" and cfg.logger is None and cfg.data.num_workers == 0 and cfg.verbose
    assert cfg.callbacks.model_checkpoint is None and cfg.callbacks.last_checkpoint is None
    trainer = hydra.utils.instantiate(cfg.trainer, logger=False)
    settings = {"max_epochs": 1, "fast_dev_run": False, "overfit_batches": 0.0, "limit_train_batches": 1.0,
                "limit_val_batches": 1.0, "limit_test_batches": 1.0, "profiler": "PassThroughProfiler",
                **DEBUG_TRAINERS[name]}
    built = {key: getattr(trainer, key) for key in settings if key != "profiler"}
    built["profiler"] = type(trainer.profiler).__name__
    if name == "fast_dev_run":  # Lightning runs one batch of each split and one epoch
        assert trainer.num_sanity_val_steps == 0 and trainer.fit_loop.max_epochs == 1
        built["max_epochs"] = 1
    assert built == settings
    assert isinstance(trainer.accelerator, CPUAccelerator) and trainer.num_devices == 1 and trainer._detect_anomaly
    if name == "overfit":  # the same windows in a fixed order: Lightning can order the per-window loader
        assert cfg.data.loader == "reference" and not cfg.data.oversample and cfg.model.scheduler is None


@pytest.mark.parametrize("name", ["default", "fast_dev_run", "limit", "profiler"])
def test_debug_configs_compose_with_a_text_table(name, tmp_path):
    cfg = _compose("train", [f"debug={name}", "data=text_csv", "model=text_regressor", "modality=t", *TEXT_TABLE],
                   tmp_path)
    validate(cfg)
    assert cfg.trainer.accelerator == "cpu" and cfg.data.num_workers == 0


@pytest.mark.parametrize("experiment,scenario", [("es_story_share", "story_share"), ("es_reflection", "reflection")])
def test_paper_grid_experiments_sweep_the_grid_and_end_with_tables(experiment, scenario, tmp_path):
    import empathic_fusion.cli  # noqa: F401  (registers ${fusion_models:}, the registered fusion models)

    cfg = _compose("train", [f"experiment={experiment}"], tmp_path)
    params = cfg.hydra.sweeper.params
    assert params.model.split(",") == ["amer", "tfn", "ef_lstm", "lf_lstm", "story_similarity", "mean"]
    assert params.modality.split(",") == ["t", "v+a", "v+t", "a+t", "v+a+t"] and params.seed == "1,2,3"
    # a subset's jobs follow each other (the first parameter varies slowest), so they share its data's set-up
    assert list(params) == ["modality", "model", "seed"] and cfg.grid.share_setup
    # the lean report and the best checkpoint only (last.ckpt, to resume a preempted job, is removed at the job's
    # end); the full report of a cell comes from its checkpoint afterwards
    assert cfg.evaluation.bootstrap == 0 and not cfg.evaluation.missing_modalities
    assert cfg.callbacks.last_checkpoint is not None and cfg.callbacks.preemption.remove_last_at_end
    assert set(params.model.split(",")) <= set(_options("model")) and set(params.modality.split(",")) <= set(_options("modality"))
    assert cfg.hydra.callbacks.paper_tables._target_ == "empathic_fusion.evaluation.sweep.PaperTablesCallback"
    hydra.utils.instantiate(cfg.hydra.callbacks.paper_tables)
    assert cfg.data.scenario == scenario and cfg.grid.skip_incompatible


def test_evaluate_config_takes_a_sweep_dir(tmp_path):
    cfg = _compose("evaluate", ["sweep_dir=/x/sweep"], tmp_path)
    assert cfg.sweep_dir == "/x/sweep" and cfg.ckpt_path is None and list(cfg.tables.metrics)[0] == "pearson"


def test_fast_dev_run_goes_through_a_whole_training_run(tiny_dataset, store_copy, tmp_path):
    """pipeline.train builds its Trainer from cfg.trainer: debug=fast_dev_run trains, validates and tests one batch."""
    from empathic_fusion.pipeline import train

    cfg = _compose("train", ["debug=fast_dev_run", f"data.dataset_dir={tiny_dataset}", f"data.store_dir={store_copy}",
                             "data.demo=null", "trainer.enable_progress_bar=false"], tmp_path)
    results = train(cfg)
    assert results["global_step"] == 1 and results["best_checkpoint"] == ""  # fast_dev_run saves nothing
    assert set(results["model"]) == {"window", "rating"}
