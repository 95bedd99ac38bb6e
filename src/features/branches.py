"""Which store branches make up each modality, and the feature config's defaults.

A modality's per-frame vector is its branches' vectors concatenated in the configured order, e.g.
video = face (+ cnn) as the paper concatenated OpenFace and ResNet50, text = SBERT (`text`) and/or
per-word GloVe (`glove`). Branches are either dense (`features` T x F + `mask`) or indexed (a row
table + a per-frame index into it, -1 = none), which keeps per-utterance vectors from being copied
onto every frame.
"""
from __future__ import annotations

import copy
from typing import Any

import yaml

from src.utils import PROJECT_ROOT

MODALITIES = ("video", "audio", "text")
BRANCH_MODALITY = {"face": "video", "cnn": "video", "audio": "audio", "text": "text", "glove": "text"}
# indexed branches: (row table, per-frame index) array names
INDEXED = {"text": ("utterances", "frame_utterance"), "glove": ("words", "frame_word")}

# the defaults are conf/features/default.yaml itself (one source for the command line and for code
# that passes a partial feature config, e.g. tests and notebooks)
DEFAULTS: dict[str, Any] = yaml.safe_load((PROJECT_ROOT / "conf" / "features" / "default.yaml").read_text())


def with_defaults(cfg: dict[str, Any] | None) -> dict[str, Any]:
    """The feature config with every missing section and key filled from DEFAULTS."""
    merged = copy.deepcopy(DEFAULTS)
    for section, values in (cfg or {}).items():
        if isinstance(values, dict) and isinstance(merged.get(section), dict):
            merged[section].update(values)
        else:
            merged[section] = values
    for modality, branches in merged["modalities"].items():
        if modality not in MODALITIES:
            raise ValueError(f"features.modalities has unknown modality '{modality}'; use {list(MODALITIES)}")
        wrong = [b for b in branches if BRANCH_MODALITY.get(b) != modality]
        if not branches or wrong:
            allowed = [b for b, m in BRANCH_MODALITY.items() if m == modality]
            raise ValueError(f"features.modalities.{modality} = {list(branches)}: choose one or more of {allowed}")
    return merged


def modality_branches(modality: str, cfg: dict[str, Any] | None) -> list[str]:
    """Store branches whose per-frame vectors are concatenated into this modality's input."""
    return list(with_defaults(cfg)["modalities"][modality])
