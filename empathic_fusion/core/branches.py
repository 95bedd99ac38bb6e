"""Which store branches make up each modality.

A modality's per-frame vector is its branches' vectors concatenated in the configured order, e.g.
video = face (+ cnn) as the paper concatenated OpenFace and ResNet50, text = SBERT (`text`) and/or
per-word GloVe (`glove`). Branches are either dense (`features` T x F + `mask`) or indexed (a row
table + a per-frame index into it, -1 = none), which keeps per-utterance vectors from being copied
onto every frame.

The registry sits at the bottom (it imports nothing from empathic_fusion) so that the feature schema
(empathic_fusion/config/features.py), extraction, the datamodules and the app all read it from one place;
the feature config filled in from its schema is `empathic_fusion.config.with_defaults`.
"""
from __future__ import annotations

from dataclasses import dataclass

MODALITIES = ("video", "audio", "text")


@dataclass(frozen=True)
class BranchSpec:
    """What the rest of the project needs to know about a store branch."""

    modality: str                            # the modality whose per-frame vector it is part of
    source: str                              # "media": decoded per session in worker processes; "transcript"
    indexed: tuple[str, str] | None = None   # (row table, per-frame index) array names; None: dense features + mask

    @property
    def vectors(self) -> str:
        """The array whose columns are the branch's per-frame vector (the row table of an indexed branch)."""
        return self.indexed[0] if self.indexed else "features"


# The one registry of branches: extraction (empathic_fusion/features/extract.py keeps each branch's signature and
# version beside it), the datamodule, the window loaders and the app read it.
BRANCHES: dict[str, BranchSpec] = {
    "face": BranchSpec("video", "media"),
    "cnn": BranchSpec("video", "media"),
    "audio": BranchSpec("audio", "media"),
    "text": BranchSpec("text", "transcript", ("utterances", "frame_utterance")),
    "glove": BranchSpec("text", "transcript", ("words", "frame_word")),
}
BRANCH_MODALITY = {name: spec.modality for name, spec in BRANCHES.items()}
INDEXED = {name: spec.indexed for name, spec in BRANCHES.items() if spec.indexed}
MEDIA_BRANCHES = tuple(name for name, spec in BRANCHES.items() if spec.source == "media")


def branch_width(branch: str, entry: dict) -> int:
    """Per-frame width of a recorded branch, from its manifest entry."""
    return int(entry["arrays"][BRANCHES[branch].vectors]["shape"][1])

