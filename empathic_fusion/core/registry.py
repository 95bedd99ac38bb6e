"""Stable names for the classes a checkpoint is rebuilt from, like timm's `register_model`.

A checkpoint records registered names (`"module": "fusion"`, `"model": "lf_lstm"`), not where a class
lives, and its hyperparameters' `_target_` paths are brought up to date from this registry when it is
loaded (`refresh_targets`). A class that moves or is renamed keeps its registered name and lists
its earlier dotted paths as `aliases`, so every checkpoint saved before the move still loads.

Registration happens when the module that defines a class is imported; the checkpoint loader
(empathic_fusion/models/checkpoints.py) imports the fusion models, and whatever loads text checkpoints
imports empathic_fusion.text.model. The registry lives at the bottom so that every layer can register.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T", bound=type)

REGISTRY: dict[str, type] = {}  # registered name -> class
_NAMES: dict[str, str] = {}     # a registered name, a class's dotted path (current or earlier) or alias -> name


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_model(name: str, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
    """Register a class under `name` (and its earlier dotted paths or names, `aliases`): LightningModules,
    nets and the parts a model config builds by `_target_` (encoders, heads, experts)."""

    def add(cls: T) -> T:
        known = REGISTRY.get(name)
        if known is not None and class_path(known) != class_path(cls):
            raise ValueError(f"model name '{name}' is registered for {class_path(known)} already")
        REGISTRY[name] = cls
        cls.registered_name = name
        for key in (name, class_path(cls), *aliases):
            _NAMES[key] = name
        return cls

    return add


def registered_name(name_or_path: str) -> str | None:
    """The registered name of a name, alias or dotted class path; None when it names nothing registered."""
    return _NAMES.get(str(name_or_path))


def model_class(name_or_path: str) -> type:
    """The class registered under a name (or an alias or earlier path of it)."""
    name = registered_name(name_or_path)
    if name is None:
        raise KeyError(f"'{name_or_path}' is not a registered model; registered: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def refresh_targets(value: Any) -> Any:
    """A config (nested dicts and lists) with every `_target_` that names a registered class, by an
    earlier path or an alias, replaced by the class's current dotted path; other values unchanged."""
    if isinstance(value, dict):
        out = {k: refresh_targets(v) for k, v in value.items()}
        target = out.get("_target_")
        if isinstance(target, str) and (name := registered_name(target)) is not None:
            out["_target_"] = class_path(REGISTRY[name])
        return out
    if isinstance(value, list):
        return [refresh_targets(v) for v in value]
    return value
