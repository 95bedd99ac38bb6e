"""The `features` config as code reads it: every section and key filled in from the schema
(empathic_fusion/config/features.py), checked the way composition checks it."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from empathic_fusion.config.validate import typed


def with_defaults(cfg: dict[str, Any] | None) -> dict[str, Any]:
    """The feature config with every missing section and key filled from its schema; an unknown key,
    a wrong type or a branch of another modality is an error naming the key and value."""
    return asdict(typed("features", cfg or {}))


def modality_branches(modality: str, cfg: dict[str, Any] | None) -> list[str]:
    """Store branches whose per-frame vectors are concatenated into this modality's input."""
    return list(with_defaults(cfg)["modalities"][modality])
