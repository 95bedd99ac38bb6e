"""One check of a composed run config, called when a run starts (train, evaluate, extract).

Types and unknown keys are refused by OmegaConf while Hydra composes (each group's YAML names its
schema). Ranges and choices are the schemas' `__post_init__`, which OmegaConf does not run on merge:
`validate` builds each group's dataclass (`OmegaConf.to_object`) and reports every problem at once,
each as `key=value: must be ...`, before any data is read or any epoch runs.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, MissingMandatoryValue, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from empathic_fusion.config.checks import ConfigError
from empathic_fusion.config.data import FusionDataConfig, TextDataConfig, text_rating_scale
from empathic_fusion.config.evaluation import EvaluationConfig, threshold_rating_on
from empathic_fusion.config.features import FeaturesConfig, features_schema
from empathic_fusion.config.model import FusionModelConfig, TextModelConfig
from empathic_fusion.config.run import GROUP_KEYS, RUN_SCHEMAS
from empathic_fusion.config.trainer import TrainerConfig
from empathic_fusion.dataset.contract import read_rating_scale
from empathic_fusion.dataset.scale import RatingScale

GROUPS = {"data": None, "features": FeaturesConfig, "model": None, "trainer": TrainerConfig,
          "evaluation": EvaluationConfig}
# a group with one schema per kind: a config built by hand (or a checkpoint's) is matched by its _target_
TARGET_SCHEMAS = {"data": {schema._target_: schema for schema in (FusionDataConfig, TextDataConfig)},
                  "model": {schema._target_: schema for schema in (FusionModelConfig, TextModelConfig)}}


def schema_of(group: str, node: Any) -> type | None:
    """The dataclass a group's config follows: its own structured type, or (for a data or model config
    built by hand) the schema of its `_target_`; None when there is none (e.g. evaluate.yaml's partial
    `data: {}`, a model class of the user's own)."""
    object_type = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if object_type is not None and dataclasses.is_dataclass(object_type):
        return object_type
    if group in TARGET_SCHEMAS:
        target = node.get("_target_") if isinstance(node, (dict, DictConfig)) else None
        return TARGET_SCHEMAS[group].get(target)
    return features_schema() if group == "features" else GROUPS.get(group)


def typed(group: str, values: Any) -> Any:
    """`values` (a dict or DictConfig of one group) merged over its schema and built into the dataclass,
    so defaults are filled in, unknown keys and wrong types refused, ranges and choices checked."""
    schema = schema_of(group, values)
    if schema is None:
        known = sorted(TARGET_SCHEMAS.get(group, {}))
        raise ConfigError([f"{group}: no schema for this config" + (f" (a known _target_: {known})" if known else "")])
    try:
        node = values if OmegaConf.get_type(values) is schema else OmegaConf.merge(OmegaConf.structured(schema), values)
        unknown = _unknown_keys(node, group)
        if unknown:  # added with `+group.key=...`, which lifts the schema's struct flag
            raise ConfigError(unknown)
        return OmegaConf.to_object(node)
    except MissingMandatoryValue as error:
        raise ConfigError([f"{_key(group, error)}=???: must be set"]) from None
    except ConfigKeyError as error:
        known = [f.name for f in dataclasses.fields(error.object_type)] if dataclasses.is_dataclass(error.object_type) else []
        raise ConfigError([f"{_key(group, error)}: not a setting; known: {known}"]) from None
    except ValidationError as error:
        raise ConfigError([f"{_key(group, error)}={error.value}: {str(error.msg).splitlines()[0]}"]) from None


def _unknown_keys(node: DictConfig, prefix: str) -> list[str]:
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return []
    known = [f.name for f in dataclasses.fields(schema)]
    raw = OmegaConf.to_container(node, resolve=False)
    problems = [f"{prefix}.{key}={raw[key]}: not a setting; known: {known}" for key in raw if key not in known]
    for key in known:
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            problems += _unknown_keys(child, f"{prefix}.{key}")
    return problems


def _key(group: str, error: OmegaConfBaseException) -> str:
    key = str(error.full_key)
    return key if key.startswith(f"{group}.") else f"{group}.{key}"


def _run_problems(cfg: DictConfig) -> list[str]:
    """The top-level keys of a run config (run.py) out of range; its groups are checked on their own."""
    schema = OmegaConf.get_type(cfg)
    if schema not in RUN_SCHEMAS.values():
        return []
    known = [f.name for f in dataclasses.fields(schema)]
    problems = [f"{key}: not a setting; known: {known}" for key in cfg if key not in known and key != "hydra"]
    values = {key: cfg[key] for key in known if key in cfg and key not in GROUP_KEYS}
    try:
        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), _resolved(values)))
    except ConfigError as error:
        problems += error.problems
    return problems


def _resolved(values: dict[str, Any]) -> dict[str, Any]:
    return {k: OmegaConf.to_container(v, resolve=True) if isinstance(v, DictConfig) else v for k, v in values.items()}


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError listing every setting of the run config `cfg` out of its range or choices."""
    problems: list[str] = []
    built: dict[str, Any] = {}
    for group in GROUPS:
        node = cfg.get(group)
        if not isinstance(node, DictConfig) or schema_of(group, node) is None:
            continue  # a group this run has not got (serve), or a partial override (evaluate.yaml's data: {})
        try:
            built[group] = typed(group, node)
        except ConfigError as error:
            problems += error.problems
    problems += _run_problems(cfg)
    known = threshold_scale(built.get("data"))
    if known is not None and "evaluation" in built:
        scale, source = known
        try:
            threshold_rating_on(scale, built["evaluation"].threshold_rating, source)
        except ConfigError as error:
            problems += error.problems
    if problems:
        raise ConfigError(problems)


def threshold_scale(data: Any) -> tuple[RatingScale, str] | None:
    """The rating scale the Acc/F1 threshold lives on, and where it comes from, for a built data config:
    a text table's `levels`, a multimodal dataset's dataset.yaml `rating_scale` (read here so that a
    threshold off the scale stops the run before any data is read). None when it is not known yet (no data
    group, a dataset.yaml with problems of its own, which loading the dataset names); a checkpoint's
    module checks again against the scale it was trained on."""
    if isinstance(data, TextDataConfig):
        return text_rating_scale(data.levels), ("data.levels" if data.levels else "the default 1-5 scale")
    if isinstance(data, FusionDataConfig):
        scale = read_rating_scale(data.dataset_dir)
        return None if scale is None else (scale, f"the rating_scale of {data.dataset_dir}/dataset.yaml, default 1-5")
    return None
