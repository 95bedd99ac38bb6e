"""Stable names for the classes a checkpoint is rebuilt from, like timm's `register_model`.

A checkpoint records registered names (`"module": "fusion"`, `"model": "lf_lstm"`), not where a class
lives, and its hyperparameters' `_target_` paths are brought up to date from this registry when it is
loaded (`refresh_targets`). A class that moves or is renamed keeps its registered name and lists
its earlier dotted paths as `aliases`, so every checkpoint saved before the move still loads.

Registration happens when the module that defines a class is imported: `empathic_fusion.models` imports
every module in its folder when it is imported (models/__init__.py), so a new model file needs no import
line anywhere. A net also says which module trains it (`module="fusion"`) and how the paper's tables name
it (`display`, `paper_rank`): the paper grid (conf/experiment/es_story_share.yaml) and the tables' rows
(evaluation/tables.py) come from here. The registry lives at the bottom so that every layer can register.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T", bound=type)

REGISTRY: dict[str, type] = {}  # registered name -> class
_NAMES: dict[str, str] = {}     # a registered name, a class's dotted path (current or earlier) or alias -> name


@dataclass(frozen=True)
class ModelEntry:
    """What a registered net tells the rest of the project: the module that trains it, and its row in
    the paper's tables (`paper_rank`: the paper's row order; None: after the paper's rows, by name)."""

    name: str
    module: str
    display: str
    paper_rank: int | None = None


MODELS: dict[str, ModelEntry] = {}  # registered name of a net a model config names -> its entry


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_model(name: str, aliases: tuple[str, ...] = (), *, module: str | None = None,
                   display: str | None = None, paper_rank: int | None = None) -> Callable[[T], T]:
    """Register a class under `name` (and its earlier dotted paths or names, `aliases`): LightningModules,
    nets and the parts a model config builds by `_target_` (encoders, heads, experts).

    A net that a model config (conf/model/<name>.yaml) names gives `module`, the registered name of the
    LightningModule that trains it ("fusion", "text"), and may give `display`, its name in the paper's
    tables (default: its class name), and `paper_rank`, its row there."""

    def add(cls: T) -> T:
        known = REGISTRY.get(name)
        if known is not None and class_path(known) != class_path(cls):
            raise ValueError(f"model name '{name}' is registered for {class_path(known)} already")
        REGISTRY[name] = cls
        cls.registered_name = name
        for key in (name, class_path(cls), *aliases):
            _NAMES[key] = name
        if module is not None:
            MODELS[name] = ModelEntry(name, module, display or cls.__name__, paper_rank)
        return cls

    return add


def list_models(module: str | None = None) -> list[str]:
    """Registered nets that a model config can name (those of `module` only, e.g. "fusion"), the paper's
    in its row order first, then the others by name. Only what has been imported is registered:
    `empathic_fusion.models.list_models` imports every model first."""
    entries = [e for e in MODELS.values() if module is None or e.module == module]
    return [e.name for e in sorted(entries, key=lambda e: (e.paper_rank is None, e.paper_rank or 0, e.name))]


def display_name(name_or_path: str) -> str:
    """A net's name in the paper's tables, from its registered name, alias or dotted path (an unknown one:
    its class name, the last part of the path)."""
    entry = MODELS.get(registered_name(name_or_path) or "")
    return entry.display if entry is not None else str(name_or_path).rsplit(".", 1)[-1]


def display_rank(display: str) -> tuple[bool, int, str]:
    """Sort key of a table row by its display name: the paper's rows in its order, then the others by name."""
    ranks = {e.display: e.paper_rank for e in MODELS.values() if e.paper_rank is not None}
    rank = ranks.get(display)
    return (rank is None, rank or 0, display)


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
