"""Fusion models (encoders + fusion -> representation), heads, the LightningModules that train them, and
the text models (their experts in models/text/).

Importing the package imports every module in its folder (`import_models`), so each model registers its
name (empathic_fusion/core/registry.py) without an import line anywhere: a new fusion model is its net
file here and its config, conf/model/<name>.yaml. `python -m empathic_fusion.models` lists them.
"""
from __future__ import annotations

import importlib
import pkgutil

from empathic_fusion.core import registry
from empathic_fusion.core.registry import display_name, display_rank  # noqa: F401  (complete once imported)


def import_models() -> list[str]:
    """Import every module of this package (sub-packages too, and folders added to its `__path__`), so
    each registers what it defines; returns their names."""
    names = [info.name for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}.")
             if not info.name.rsplit(".", 1)[-1].startswith("_")]
    for name in names:
        importlib.import_module(name)
    return names


def list_models(module: str | None = None) -> list[str]:
    """Every model a config can name (`model=<name>`), of one module ("fusion", "text") or all: the
    paper's in its table order, then the others by name."""
    import_models()
    return registry.list_models(module)


import_models()
