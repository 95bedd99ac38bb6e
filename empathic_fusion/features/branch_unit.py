"""A feature branch as one unit: its facts, settings, signature, extractor and size, registered together.

A branch is one file: its extractor file declares its spec and settings dataclass beside its extractor and
registers them with `register_branch(BranchUnit(...))` when it is imported. Importing this package imports
every module of it that does so (`discover_branches`, from features/__init__.py), so the core registry and
the `features` schema know every branch before any config is composed or checked (the entry points, cli.py
and compose.py, import the package first), and a new extractor file needs no import line and no entry
in any other file. Such a file imports nothing heavy at module level (mediapipe, opensmile, torch: inside
its functions), because every process that reads a config imports it. Extraction (extract.py), the space
estimate (store_space.py) and the datamodules read the units and the specs, never a branch's name. The parts:

- spec: the facts in empathic_fusion/core/branches.py (modality, media or transcript, dense or indexed,
  the medium it reads, whether it is the speech source), which the layers below this one read;
- settings: the dataclass of its `features.<name>` section, ranges checked in its `__post_init__`;
- signature: what its stored output depends on (extractor, version, config, input hashes): a changed
  signature makes the stored branch stale, so an existing branch's must never change by accident;
- a media branch's `extract_media(job, branches)`, run per session in a worker process (branches that share
  one pass over the media, like face and cnn sharing one decode, share the function: it is called once
  with all of them), and `frame_bytes(cfg)`, its stored bytes per frame;
- a transcript branch's `extract_transcripts(run, todo)`, run in the main process for every session to do,
  and `row_bytes(transcript, cfg)`, the bytes of its row table for one transcript.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from empathic_fusion.config import register_features_schema
from empathic_fusion.core.branches import BRANCHES, BranchSpec, UnknownBranchError, add_branch, remove_branch
from empathic_fusion.core.files import is_disk_full

if TYPE_CHECKING:
    import pandas as pd

    from empathic_fusion.dataset import EmpathyDataset
    from empathic_fusion.features.store import FeatureStore

BranchOutput = tuple[dict, dict, list[str]]  # arrays, info for the manifest, warnings about the data
Signature = Callable[["FeatureStore", "EmpathyDataset", str, dict, "str | None"], dict]


def failure_record(session_id: str, branch: str, error: Exception) -> dict[str, str]:
    """A branch's failure for one session, as the extraction report lists it."""
    return {"session_id": session_id, "branch": branch, "error": f"{type(error).__name__}: {error}"}


@dataclass
class MediaJob:
    """One session's media as a worker process extracts it; `cfg` is the with_defaults features config."""

    session_id: str
    video: Path
    audio: Path  # the session's audio file, else its video
    fps: float
    cfg: dict[str, Any]
    rows_dir: Path  # where long outputs are written while computed (frame_rows.py)
    failures: list[dict] = field(default_factory=list)
    disk_full: dict | None = None  # the first branch that ran out of disk: the main process stops the run

    def fail(self, branch: str, error: Exception) -> None:
        """Record a branch's failure (the others go on); a full disk is the run's problem, not the branch's."""
        if is_disk_full(error):
            self.disk_full = self.disk_full or {"branch": branch, "error": error}
        else:
            self.failures.append(failure_record(self.session_id, branch, error))


@dataclass
class TranscriptRun:
    """What a transcript branch's extraction is given: the dataset and config, the sentence encoder the
    stories share (loaded once, when first asked for), and `write`, which stores one session's output."""

    dataset: EmpathyDataset
    cfg: dict[str, Any]
    text_encoder: Callable[[], Any]
    write: Callable[[str, str, dict, dict, dict, list[str]], bool]  # (session, branch, arrays, signature, info, notes)
    fail: Callable[[str, str, Exception], None]                     # (session, branch, error)


@dataclass(frozen=True)
class BranchUnit:
    """Everything the project needs to extract, size and read one store branch."""

    name: str
    spec: BranchSpec
    settings: type
    signature: Signature
    extract_media: Callable[[MediaJob, list[str]], dict[str, BranchOutput]] | None = None
    frame_bytes: Callable[[dict], int] | None = None
    extract_transcripts: Callable[[TranscriptRun, list[tuple[str, dict]]], None] | None = None
    row_bytes: Callable[[pd.DataFrame, dict], int] | None = None

    def __post_init__(self) -> None:
        parts = {"media": ("extract_media", "frame_bytes"), "transcript": ("extract_transcripts", "row_bytes")}
        if self.spec.source not in parts:
            raise ValueError(f"feature branch '{self.name}': source must be one of {list(parts)}")
        missing = [part for part in parts[self.spec.source] if getattr(self, part) is None]
        if missing:
            raise ValueError(f"feature branch '{self.name}' ({self.spec.source}) needs {missing}")


_UNITS: dict[str, BranchUnit] = {}
_SCANNED: set[str] = set()  # modules of this package already looked at by discover_branches
_schema_stale = False  # a branch's settings changed since the features schema was last stored
_discovering = False  # while discover_branches imports: the schema is stored once at its end, with every branch in


def register_branch(unit: BranchUnit) -> BranchUnit:
    """Make a branch known everywhere: its facts and settings to the core registry (and so to the features
    schema, and to Hydra's), the rest to extraction. Registering the same unit again (a re-import) is harmless."""
    global _schema_stale
    if add_branch(unit.name, unit.spec, unit.settings):
        _schema_stale = True
    _UNITS[unit.name] = unit
    if not _discovering:
        _store_schema()
    return unit


def _store_schema() -> None:
    """Store the features schema in Hydra's ConfigStore when a branch's settings changed since it last was."""
    global _schema_stale
    if _schema_stale:
        register_features_schema()
        _schema_stale = False


def unregister_branch(name: str) -> None:
    """Forget a registered branch (a plug-in's, a test's)."""
    _UNITS.pop(name, None)
    remove_branch(name)
    register_features_schema()


def branch_unit(name: str) -> BranchUnit:
    """The unit of a registered branch; UnknownBranchError (naming the known ones) for any other name. An
    unknown name first looks for extractor files added to the package since it was imported."""
    if name not in _UNITS:
        discover_branches()
    if name not in _UNITS:
        raise UnknownBranchError(name)
    return _UNITS[name]


def branch_units() -> list[BranchUnit]:
    """Every registered branch's unit, in the core registry's order."""
    return [branch_unit(name) for name in BRANCHES]


def discover_branches() -> None:
    """Import every module of this package (folders added to its `__path__` too) that registers a branch
    (its source calls `register_branch(`) and has not been looked at yet. Only those: every extraction worker
    process does this, and the others (the ResNet-50 weights' torch module, the command line) would add
    seconds to each worker's start. The features schema is stored once at the end, when the defaults of
    `features.modalities` name branches that are all declared."""
    global _discovering
    if _discovering:  # a module being imported asked for a unit
        return
    _discovering = True
    try:
        package = importlib.import_module(__package__)
        for module in pkgutil.iter_modules(package.__path__):
            name = f"{__package__}.{module.name}"
            if name in _SCANNED or name == __name__:
                continue
            source = Path(module.module_finder.path) / f"{module.name}.py"
            if source.is_file() and "register_branch(" in source.read_text(encoding="utf-8"):
                importlib.import_module(name)
            _SCANNED.add(name)
    finally:
        _discovering = False
    _store_schema()


def forget_module(name: str) -> None:
    """Let discover_branches look at a module again (one removed from the package and unregistered: a test's)."""
    _SCANNED.discard(name)
