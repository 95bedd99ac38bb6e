"""Typed Hydra configs: one dataclass per config group, the one place each default lives.

Importing this package registers the schemas in Hydra's ConfigStore, so every YAML of a group names its
schema first in its defaults list (`defaults: [schema_evaluation, _self_]`); the console scripts
(empathic_fusion/cli.py) and `empathic_fusion.compose` import it before composing.

- data: `FusionDataConfig` (data.py; conf/data/demo.yaml, empathic_stories.yaml) and `TextDataConfig`
  (text_csv.yaml, empathetic_exchanges.yaml); demo generator settings `DemoConfig` (demo.py)
- features: `FeaturesConfig` (features.py), trainer: `TrainerConfig` (trainer.py),
  evaluation: `EvaluationConfig` (evaluation.py), paths: `PathsConfig` (paths.py)

Adding a key: add a typed field with its default and a short comment to the group's dataclass (and a
rule to its `__post_init__` when only some values make sense: `require(prefix, self, {field: (ok, allowed)})`).
Set it in a YAML only where a dataset or variant differs from the default. Code reads the key directly
(`cfg.data.key`, `features["text"]["key"]`), never with a fallback: the schema fills defaults in when
configs are composed, and `typed(group, values)` does so for partial configs built in code. A key in a
YAML that no schema has fails composition for everyone; tests/test_configs.py composes every config.
`validate(cfg)` (train, evaluate, extract call it first) reports every value out of range at once.
`with_defaults(features)` is the features config filled in and checked (feature_defaults.py); the branch
registry it checks against is empathic_fusion/core/branches.py, whose branches (and their `features.<branch>`
sections) the extractor files of empathic_fusion/features declare: importing that package, as the entry
points do before composing, adds their sections to the schema stored here.
"""
from __future__ import annotations

from hydra.core.config_store import ConfigStore

from empathic_fusion.config.checks import ConfigError
from empathic_fusion.config.data import FusionDataConfig, TextDataConfig
from empathic_fusion.config.demo import DemoConfig
from empathic_fusion.config.evaluation import EvaluationConfig
from empathic_fusion.config.feature_defaults import modality_branches, with_defaults
from empathic_fusion.config.features import FeaturesConfig, features_schema
from empathic_fusion.config.model import FusionModelConfig, TextModelConfig
from empathic_fusion.config.paths import PathsConfig
from empathic_fusion.config.run import (
    EvaluateRunConfig,
    ExtractRunConfig,
    PredictRunConfig,
    ServeRunConfig,
    TrainRunConfig,
)
from empathic_fusion.config.trainer import TrainerConfig
from empathic_fusion.config.validate import typed, validate

# (group, schema name) -> dataclass; a YAML of the group lists the schema name first in its defaults
SCHEMAS: dict[tuple[str | None, str], type] = {
    ("data", "schema_fusion_data"): FusionDataConfig,
    ("data", "schema_text_data"): TextDataConfig,
    ("features", "schema_features"): FeaturesConfig,
    ("trainer", "schema_trainer"): TrainerConfig,
    ("evaluation", "schema_evaluation"): EvaluationConfig,
    ("paths", "schema_paths"): PathsConfig,
    ("model", "schema_fusion_model"): FusionModelConfig,
    ("model", "schema_text_model"): TextModelConfig,
    (None, "schema_train"): TrainRunConfig,        # the top-level keys of conf/train.yaml, ... (run.py)
    (None, "schema_evaluate"): EvaluateRunConfig,
    (None, "schema_extract"): ExtractRunConfig,
    (None, "schema_serve"): ServeRunConfig,
    (None, "schema_predict"): PredictRunConfig,
}


def register_schemas() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent)."""
    store = ConfigStore.instance()
    for (group, name), schema in SCHEMAS.items():
        store.store(group=group, name=name, node=features_schema() if schema is FeaturesConfig else schema)


def register_features_schema() -> None:
    """Store the `features` schema again after a branch brings its settings (features/branch_unit.py), so that
    composition knows its `features.<branch>` section."""
    ConfigStore.instance().store(group="features", name="schema_features", node=features_schema())


register_schemas()

__all__ = ["ConfigError", "DemoConfig", "EvaluationConfig", "FeaturesConfig", "FusionDataConfig", "PathsConfig",
           "SCHEMAS", "TextDataConfig", "TrainerConfig", "modality_branches", "register_features_schema",
           "register_schemas", "typed", "validate", "with_defaults"]
