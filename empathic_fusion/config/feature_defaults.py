"""The `features` config as code reads it: every section and key filled in from the schema
(empathic_fusion/config/features.py), checked the way composition checks it."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from empathic_fusion.config.validate import typed


# `features.cnn.half` (true | false | auto), which `precision` replaced: checkpoints and run configs saved
# with it keep loading, read as the precision it meant
LEGACY_HALF = {True: "fp16", False: "fp32", "auto": "auto"}


def _translated(cfg: dict[str, Any]) -> dict[str, Any]:
    """A saved feature config in today's keys (the one renamed key: cnn.half -> cnn.precision)."""
    cnn = cfg.get("cnn")
    if not isinstance(cnn, dict) or "half" not in cnn:
        return cfg
    cnn = dict(cnn)
    half = cnn.pop("half")
    cnn.setdefault("precision", LEGACY_HALF.get(half, half))
    return {**cfg, "cnn": cnn}


def with_defaults(cfg: dict[str, Any] | None) -> dict[str, Any]:
    """The feature config with every missing section and key filled from its schema; an unknown key,
    a wrong type or a branch of another modality is an error naming the key and value. A config saved
    with a renamed key (a checkpoint's run config) is read in today's keys."""
    return asdict(typed("features", _translated(dict(cfg or {}))))


def modality_branches(modality: str, cfg: dict[str, Any] | None) -> list[str]:
    """Store branches whose per-frame vectors are concatenated into this modality's input."""
    return list(with_defaults(cfg)["modalities"][modality])
