"""Which store branches make up each modality.

A modality's per-frame vector is its branches' vectors concatenated in the configured order, e.g.
video = face (+ cnn) as the paper concatenated OpenFace and ResNet50, text = SBERT (`text`) and/or
per-word GloVe (`glove`). Branches are either dense (`features` T x F + `mask`) or indexed (a row
table + a per-frame index into it, -1 = none), which keeps per-utterance vectors from being copied
onto every frame.

The registry sits at the bottom (it imports nothing from empathic_fusion but the bottom's errors) so that
the feature schema (empathic_fusion/config/features.py), extraction, the datamodules and the app all read it
from one place; the feature config filled in from its schema is `empathic_fusion.config.with_defaults`. It
lists no branch itself: each extractor file of empathic_fusion/features declares its branches (spec, settings
and the parts that live higher up, as one unit: empathic_fusion/features/branch_unit.py), and importing that
package finds them all, before any config is composed (the entry points import it first).
"""
from __future__ import annotations

from dataclasses import dataclass

from empathic_fusion.core.errors import UserError, did_you_mean

MODALITIES = ("video", "audio", "text")


@dataclass(frozen=True)
class BranchSpec:
    """What the rest of the project needs to know about a store branch: the facts that every layer may read.
    Its extractor file declares it with its settings and the parts that live higher up (its signature,
    extractor and size per frame) as one unit (empathic_fusion/features/branch_unit.py)."""

    modality: str                            # the modality whose per-frame vector it is part of
    source: str                              # "media": decoded per session in worker processes; "transcript"
    indexed: tuple[str, str] | None = None   # (row table, per-frame index) array names; None: dense features + mask
    medium: str | None = None                # media branches: the file read, "video" or "audio" (else the video)
    # its per-frame "voiced" array and its settings' `speech_mask` decide which frames hold the participant's
    # speech (one branch at most)
    speech_source: bool = False

    @property
    def vectors(self) -> str:
        """The array whose columns are the branch's per-frame vector (the row table of an indexed branch)."""
        return self.indexed[0] if self.indexed else "features"


class UnknownBranchError(UserError, ValueError):
    """A branch name no spec is registered for: named with the known ones (a modality's name with its
    branches, else the closest names), never read as some default."""

    def __init__(self, branch: str):
        if branch in MODALITIES:
            hint = (f"; '{branch}' is a modality, its branches are "
                    f"{[name for name, spec in BRANCHES.items() if spec.modality == branch]}")
        else:
            hint = did_you_mean(branch, list(BRANCHES), n=2)
        super().__init__(f"unknown feature branch '{branch}'; known: {list(BRANCHES)}{hint}")
        self.branch = branch


# The one registry of branches, filled in by the extractor files (empathic_fusion/features/branch_unit.py):
# extraction, the datamodule, the window loaders, the app and the features schema read it. Kept in modality
# order (MODALITIES), each modality's branches in the order they were declared.
BRANCHES: dict[str, BranchSpec] = {}
# each branch's settings dataclass: its `features.<branch>` section
BRANCH_SETTINGS: dict[str, type] = {}
# views of BRANCHES, kept in step with it by add_branch and remove_branch
BRANCH_MODALITY: dict[str, str] = {}
INDEXED: dict[str, tuple[str, str]] = {}


def add_branch(name: str, spec: BranchSpec, settings: type) -> bool:
    """Register a branch's facts and settings (a branch already registered with other facts is an error);
    whether its settings changed (a new branch, or a module imported again), so the schema must be rebuilt."""
    if name in BRANCHES and BRANCHES[name] != spec:
        raise ValueError(f"feature branch '{name}' is already registered as {BRANCHES[name]}")
    if spec.modality not in MODALITIES:
        raise ValueError(f"feature branch '{name}': modality must be one of {list(MODALITIES)}, got '{spec.modality}'")
    if spec.speech_source and speech_branch() not in (None, name):
        raise ValueError(f"feature branch '{name}': '{speech_branch()}' is already the speech source")
    changed = BRANCH_SETTINGS.get(name) is not settings
    BRANCH_SETTINGS[name] = settings
    if name not in BRANCHES:
        BRANCHES[name] = spec
        _sort_by_modality()
    return changed


def _sort_by_modality() -> None:
    """Reorder BRANCHES (in place: modules hold it) by modality, keeping declaration order within one, and
    rebuild its views in that order."""
    ordered = sorted(BRANCHES.items(), key=lambda item: MODALITIES.index(item[1].modality))
    BRANCHES.clear()
    BRANCHES.update(ordered)
    BRANCH_MODALITY.clear()
    BRANCH_MODALITY.update((name, spec.modality) for name, spec in ordered)
    INDEXED.clear()
    INDEXED.update((name, spec.indexed) for name, spec in ordered if spec.indexed)


def branch_settings(name: str) -> type:
    """The settings dataclass of a registered branch (its defaults are the class's attributes)."""
    branch_spec(name)
    return BRANCH_SETTINGS[name]


def remove_branch(name: str) -> None:
    """Forget a branch added with add_branch (a plug-in's, a test's)."""
    BRANCHES.pop(name, None)
    BRANCH_SETTINGS.pop(name, None)
    BRANCH_MODALITY.pop(name, None)
    INDEXED.pop(name, None)


def branch_spec(name: str) -> BranchSpec:
    """The spec of a registered branch; UnknownBranchError for any other name."""
    if name not in BRANCHES:
        raise UnknownBranchError(name)
    return BRANCHES[name]


def media_branches() -> tuple[str, ...]:
    """The branches decoded from a session's media, in registry order."""
    return tuple(name for name, spec in BRANCHES.items() if spec.source == "media")


def speech_branch() -> str | None:
    """The branch whose voicing and settings make the speech mask (None: the transcript alone)."""
    return next((name for name, spec in BRANCHES.items() if spec.speech_source), None)


def branch_width(branch: str, entry: dict) -> int:
    """Per-frame width of a recorded branch, from its manifest entry."""
    return int(entry["arrays"][branch_spec(branch).vectors]["shape"][1])
