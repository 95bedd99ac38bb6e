"""The `features` group: which store branches make up each modality and each extractor's settings.

Each branch's `features.<branch>` section is the settings dataclass its extractor file declares with it
(empathic_fusion/features/, e.g. FaceConfig in video_branches.py), read from the branch registry
(empathic_fusion/core/branches.py), so adding a branch touches no file here. Changing a value re-extracts
only the branch it belongs to. Per-frame dims: face 1451 (mediapipe) or 253 (openface), cnn 1280
(efficientnet_lite0) or 2048 (resnet50), audio 65 (ComParE_2016) or 25 (eGeMAPSv02), text 384 (SBERT),
glove 50 (packaged 6B) or 300 (840B).
"""
from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from functools import lru_cache
from typing import List

from empathic_fusion.config.checks import require
from empathic_fusion.core.branches import BRANCH_MODALITY, BRANCH_SETTINGS, MODALITIES  # the branch registry

SCHEMA_MODULE = "empathic_fusion.features"  # where a pickled config finds the schema class (`FeaturesSchema`)


@dataclass
class ModalityBranchesConfig:
    """Store branches concatenated per frame into each modality's input, in this order."""

    video: List[str] = field(default_factory=lambda: ["face"])  # [face, cnn] = the paper's OpenFace + ResNet50
    audio: List[str] = field(default_factory=lambda: ["audio"])
    text: List[str] = field(default_factory=lambda: ["text"])   # text = SBERT per utterance; glove = per word

    def __post_init__(self) -> None:
        if not BRANCH_MODALITY:  # the schema as stored before the branches are declared (config/__init__.py)
            return
        rules = {}
        for modality in MODALITIES:
            branches = getattr(self, modality)
            allowed = [b for b, m in BRANCH_MODALITY.items() if m == modality]
            rules[modality] = (bool(branches) and set(branches) <= set(allowed), f"one or more of {allowed}")
        require("features.modalities", self, rules)


@dataclass
class FeaturesConfig:
    """The `features` group's own keys (conf/features/default.yaml, paper.yaml); `features_schema()` adds a
    section per declared branch."""

    modalities: ModalityBranchesConfig = field(default_factory=ModalityBranchesConfig)


def features_schema() -> type:
    """The `features` group's schema: FeaturesConfig with a section for each registered branch, in the
    registry's order."""
    return _schema_with(tuple((name, BRANCH_SETTINGS[name]) for name in BRANCH_MODALITY))


@lru_cache(maxsize=None)
def _schema_with(sections: tuple[tuple[str, type], ...]) -> type:
    """FeaturesConfig with the branches' sections (one class per set of sections, so configs built alike match)."""
    if not sections:
        return FeaturesConfig
    schema = make_dataclass("FeaturesConfig", [(name, settings, field(default_factory=settings))
                                               for name, settings in sections], bases=(FeaturesConfig,))
    # messages name FeaturesConfig. A pickled config (a sweep job's, sent to another process) records its schema
    # by module and name: the package that declares the branches, whose import declares them all before it hands
    # out the schema (empathic_fusion/features/__init__.py), so the job's process knows every section
    schema.__module__, schema.__qualname__ = SCHEMA_MODULE, "FeaturesSchema"
    return schema
