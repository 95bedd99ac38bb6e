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

from empathic_fusion.config.checks import ConfigError, finite
from empathic_fusion.config.data import FusionDataConfig, TextDataConfig, rating_scale
from empathic_fusion.config.evaluation import EvaluationConfig
from empathic_fusion.config.features import FeaturesConfig
from empathic_fusion.config.trainer import TrainerConfig

GROUPS = {"data": None, "features": FeaturesConfig, "trainer": TrainerConfig, "evaluation": EvaluationConfig}
MODEL_RULES = (("model.optimizer.lr", lambda v: finite(v) and v > 0, "a learning rate > 0"),
               ("model.optimizer.weight_decay", lambda v: finite(v) and v >= 0, "a number >= 0"))
DATA_SCHEMAS = {schema._target_: schema for schema in (FusionDataConfig, TextDataConfig)}


def schema_of(group: str, node: Any) -> type | None:
    """The dataclass a group's config follows: its own structured type, or (for a data config built by
    hand) the schema of its `_target_`; None when there is none (e.g. evaluate.yaml's partial `data: {}`)."""
    object_type = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if object_type is not None and dataclasses.is_dataclass(object_type):
        return object_type
    if group == "data":
        target = node.get("_target_") if isinstance(node, (dict, DictConfig)) else None
        return DATA_SCHEMAS.get(target)
    return GROUPS.get(group)


def typed(group: str, values: Any) -> Any:
    """`values` (a dict or DictConfig of one group) merged over its schema and built into the dataclass,
    so defaults are filled in, unknown keys and wrong types refused, ranges and choices checked."""
    schema = schema_of(group, values)
    if schema is None:
        raise ConfigError([f"{group}: no schema for this config (data needs a known _target_: {sorted(DATA_SCHEMAS)})"])
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
    for key, ok, allowed in MODEL_RULES:  # the model group has no schema of its own yet
        value = OmegaConf.select(cfg, key)
        if value is not None and not ok(value):
            problems.append(f"{key}={value}: must be {allowed}")
    low, high = rating_scale(getattr(built.get("data"), "levels", None))
    for key in ("evaluation.threshold_rating",):
        threshold = OmegaConf.select(cfg, key)
        if threshold is not None and not low <= float(threshold) <= high:
            problems.append(f"{key}={threshold}: must be a rating within the scale {low:g}-{high:g}")
    if problems:
        raise ConfigError(problems)
