"""A feature branch as one unit: its facts, settings, signature, extractor and size, registered together.

Each extractor file registers its branches with `register_branch(BranchUnit(...))` when it is imported; the
registry imports every module of this package that does so the first time it is asked (`branch_unit`), so a
new extractor file needs no import line anywhere. Extraction (extract.py), the space estimate (store_space.py)
and the datamodules read the units and the specs, never a branch's name. What each part means:

- spec: the facts in empathic_fusion/core/branches.py (modality, media or transcript, dense or indexed,
  the medium it reads, whether it is the speech source), which the layers below this one read;
- settings: the dataclass of its `features.<name>` section (the package's own are FeaturesConfig's fields);
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

from empathic_fusion.config import register_schemas
from empathic_fusion.config.features import add_branch_settings, remove_branch_settings
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
_discovered = False


def register_branch(unit: BranchUnit) -> BranchUnit:
    """Make a branch known everywhere: its facts to the core registry, its settings to the features schema
    (and to Hydra's), the rest to extraction. Registering the same unit again (a re-import) is harmless."""
    add_branch(unit.name, unit.spec)
    if add_branch_settings(unit.name, unit.settings):
        register_schemas()
    _UNITS[unit.name] = unit
    return unit


def unregister_branch(name: str) -> None:
    """Forget a branch registered from outside the package (a plug-in's, a test's)."""
    _UNITS.pop(name, None)
    remove_branch(name)
    remove_branch_settings(name)
    register_schemas()


def branch_unit(name: str) -> BranchUnit:
    """The unit of a registered branch; UnknownBranchError (naming the known ones) for any other name."""
    _discover()
    if name not in _UNITS:
        raise UnknownBranchError(name)
    return _UNITS[name]


def branch_units() -> list[BranchUnit]:
    """Every registered branch's unit, in the core registry's order."""
    _discover()
    return [branch_unit(name) for name in BRANCHES]


def _discover() -> None:
    """Import, once, every module of this package that registers a branch (its source calls
    `register_branch(`), so each extractor file has registered its branches. Only those: every extraction
    worker process does this, and the others (the ResNet-50 weights' torch module, the command line) would
    add seconds to each worker's start."""
    global _discovered
    if _discovered:
        return
    _discovered = True  # before the imports: a module may ask for a unit while it is imported
    try:
        package = importlib.import_module(__package__)
        for module in pkgutil.iter_modules(package.__path__):
            source = Path(module.module_finder.path) / f"{module.name}.py"
            if module.name != __name__.rsplit(".", 1)[-1] and source.is_file() \
                    and "register_branch(" in source.read_text(encoding="utf-8"):
                importlib.import_module(f"{__package__}.{module.name}")
    except BaseException:
        _discovered = False
        raise
