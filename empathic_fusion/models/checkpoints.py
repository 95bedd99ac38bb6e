"""The one checkpoint loader: evaluate, the web app and the scorers find, read and rebuild checkpoints here.

Which checkpoint: a checkpoint file as given, or a run folder's best checkpoint. A run folder
(`<run>/` or `<run>/checkpoints/`) holds the monitored ModelCheckpoint's best (`epoch_NNN.ckpt`, what the run tested) and `last.ckpt` (the latest epoch, to resume from), which
may be worse. The best is read from the monitored checkpoint callback's state that Lightning saves in
every checkpoint (`best_model_path`, newest checkpoint first); when that file has moved with the
folder it is found by name, and when it is gone the best surviving entry of the callback's
`best_k_models` (by the monitored score and mode) is served instead.

What it is: the header every module writes (`checkpoint["empathic_fusion"]`, models/base.py) names its
module and model by registered name (empathic_fusion/core/registry.py) with a format version.
Format 2 headers (a dotted class path) are read through the registry's aliases, so checkpoints
written before names were registered keep loading.
"""
from __future__ import annotations

import ast
import logging
from dataclasses import dataclass
import pickle
import types
from pathlib import Path
from typing import Any

import torch

from empathic_fusion.core.errors import MissingFileError, UserError
from empathic_fusion.core.registry import class_path, model_class, refresh_targets, registered_name
from empathic_fusion.datamodules import fusion_datamodule, text_datamodule  # noqa: F401  (register their earlier paths)
from empathic_fusion.models.base import HEADER_FORMAT, HEADER_KEY, EmpathyLightningModule

log = logging.getLogger(__name__)


# earlier module of a class pickled into checkpoints -> where it lives now (fitted text experts pickle theirs)
MOVED_MODULES = {f"empathic_fusion.text.{name}": f"empathic_fusion.models.text.{name}"
                 for name in ("experts", "finetuned_expert", "branches", "fitted")}


class _MovedClassesUnpickler(pickle.Unpickler):
    """Finds a pickled class that has moved since the checkpoint was written."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(MOVED_MODULES.get(module, module), name)


_PICKLE = types.ModuleType("pickle")
_PICKLE.__dict__.update(pickle.__dict__)
_PICKLE.Unpickler = _MovedClassesUnpickler


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's dict, memory-mapped (tensors are read when used)."""
    return torch.load(path, map_location="cpu", weights_only=False, mmap=True, pickle_module=_PICKLE)


def _monitored_states(checkpoint: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """(state, mode) of every ModelCheckpoint callback with a monitor saved in the checkpoint."""
    found = []
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if not str(key).startswith("ModelCheckpoint") or not isinstance(state, dict) or not state.get("monitor"):
            continue
        try:  # the state key is "ModelCheckpoint{'monitor': ..., 'mode': 'min', ...}"
            mode = ast.literal_eval(str(key)[len("ModelCheckpoint"):]).get("mode", "min")
        except (ValueError, SyntaxError):
            mode = "min"
        found.append((state, mode))
    return found


def _here(saved: str, folder: Path) -> Path | None:
    """A path recorded at training time, or the file of that name in `folder` (the run moved)."""
    path = Path(saved)
    for candidate in (path, folder / path.name):
        if candidate.is_file():
            return candidate
    return None


def best_checkpoint(folder: Path, known: dict[Path, dict[str, Any]] | None = None) -> Path:
    """The monitored best checkpoint of a run's checkpoints folder (`known`: checkpoints already read,
    by path, which are not read again)."""
    files = list(folder.glob("*.ckpt"))
    if not files:
        raise MissingFileError(f"no .ckpt file in {folder} (train.py writes <run>/checkpoints/*.ckpt)")
    newest_first = sorted(files, key=lambda p: (p.name != "last.ckpt", -p.stat().st_mtime))
    known = known or {}
    for path in newest_first:
        checkpoint = known.get(path)
        for state, mode in _monitored_states(read_checkpoint(path) if checkpoint is None else checkpoint):
            best = _here(str(state.get("best_model_path") or ""), folder) if state.get("best_model_path") else None
            if best is not None:
                return best
            scored = [(float(score), found) for saved, score in (state.get("best_k_models") or {}).items()
                      if (found := _here(str(saved), folder)) is not None]
            if scored:
                pick = (min if mode == "min" else max)(scored, key=lambda item: item[0])[1]
                log.warning("the run's best checkpoint %s is gone; serving %s, the best (%s) of those left",
                            state.get("best_model_path"), pick, state.get("monitor"))
                return pick
    others = [p for p in files if p.name != "last.ckpt"]
    if len(others) == 1:
        return others[0]
    raise ValueError(f"{folder}: no checkpoint records which of {sorted(p.name for p in files)} is the monitored "
                     "best; give the checkpoint file itself")


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file as given; for a run folder (or its checkpoints/ folder) its best checkpoint."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise MissingFileError(f"{path} is neither a checkpoint file nor a run folder")
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    return best_checkpoint(folder)


def metrics_note(path: Path, checkpoint: dict[str, Any] | None = None) -> str:
    """Says so when the served checkpoint (`checkpoint`: its dict, when already read) is not the run's best,
    whose test metrics the card shows."""
    folder = path.parent
    try:
        best = best_checkpoint(folder, {path: checkpoint} if checkpoint is not None else None)
    except (FileNotFoundError, ValueError):
        return ""
    if best.resolve() == path.resolve():
        return ""
    return (f"These test metrics are of the run's best checkpoint {best.name}; the served {path.name} is another "
            "epoch of that run (serve the run folder to serve the best).")


class IncompatibleResumeError(UserError, ValueError):
    """A checkpoint to continue training from holds another network than the run builds."""


def check_resumable(path: str | Path, module: torch.nn.Module) -> None:
    """Fail with one message, before Lightning's own state-dict error, when `path` holds other tensors than
    `module`: a run folder (or a sweep job's) left by a run of another model or recipe, which training
    would otherwise resume."""
    saved = read_checkpoint(Path(path)).get("state_dict", {})
    ours = module.state_dict()
    shape = lambda v: tuple(v.shape) if isinstance(v, torch.Tensor) else None  # noqa: E731
    missing, extra = sorted(set(ours) - set(saved)), sorted(set(saved) - set(ours))
    resized = sorted(k for k in set(ours) & set(saved) if shape(ours[k]) != shape(saved[k]))
    if not (missing or extra or resized):
        return
    details = [f"{len(items)} {what}, e.g. {items[0]}" for items, what in
               ((missing, "missing there"), (extra, "not in this model")) if items]
    if resized:
        details.append(f"{len(resized)} of another shape, e.g. {resized[0]} {list(shape(saved[resized[0]]))} there, "
                       f"{list(shape(ours[resized[0]]))} here")
    raise IncompatibleResumeError(
        f"{path} was written by a run of another model or recipe, so training cannot continue from it "
        f"({'; '.join(details)}). Start afresh in another folder (hydra.run.dir=..., or hydra.sweep.dir=... for a "
        f"sweep) or remove the old checkpoints/ there.")


class WrongKindError(UserError, ValueError):
    """A checkpoint of another kind than the caller serves (a text checkpoint where a fusion one goes)."""


def checkpoint_header(checkpoint: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """A checkpoint's header with `module` and `model` as registered names, whatever its format."""
    header = checkpoint.get(HEADER_KEY)
    if not isinstance(header, dict) or not ({"module", "class"} & set(header)):
        raise WrongKindError(f"{path} has no '{HEADER_KEY}' header naming its module: it was not written by "
                         f"this version of empathic-fusion (header format {HEADER_FORMAT}); retrain it with train.py")
    if "module" in header:
        return dict(header)
    # format 2: dotted paths of the module class and of the net
    net = str(header.get("net") or (checkpoint.get("hyper_parameters") or {}).get("net", {}).get("_target_", ""))
    return {**header, "module": registered_name(header["class"]) or header["class"],
            "model": registered_name(net) or net}


def read_header(path: str | Path) -> dict[str, Any]:
    """The header of a checkpoint file or of a run folder's best checkpoint."""
    path = resolve_checkpoint(path)
    return checkpoint_header(read_checkpoint(path), path)


@dataclass
class OpenedCheckpoint:
    """A checkpoint read once for everything a server, scorer or evaluation needs of it: the file (a run
    folder's best), its dict (memory-mapped: tensors are read when used), its header, and the note the model
    card shows when it is not the run's best."""

    path: Path
    data: dict[str, Any]
    header: dict[str, Any]
    from_folder: bool

    @property
    def metrics_note(self) -> str:
        return "" if self.from_folder else metrics_note(self.path, self.data)


def open_checkpoint(path: str | Path, kind: str | None = None) -> OpenedCheckpoint:
    """A checkpoint file, or a run folder's best, read once. `kind` ('fusion' or 'text'): a checkpoint of
    another kind raises WrongKindError."""
    resolved = resolve_checkpoint(path)
    opened = opened_checkpoint(resolved, read_checkpoint(resolved), from_folder=not Path(path).is_file())
    if kind is not None and opened.header["module"] != kind:
        raise WrongKindError(f"{resolved} is a {opened.header['module']} checkpoint, not a {kind} one")
    return opened


def opened_checkpoint(path: Path, checkpoint: dict[str, Any], from_folder: bool = False) -> OpenedCheckpoint:
    """A checkpoint dict already read from `path`, with its header (format 2 or 3) as registered names."""
    return OpenedCheckpoint(Path(path), checkpoint, checkpoint_header(checkpoint, path), from_folder)


def module_from(opened: OpenedCheckpoint) -> EmpathyLightningModule:
    """The module an opened checkpoint's header names, rebuilt from its hyperparameters (`_target_`s brought
    up to date through the registry) with its weights and state, on the CPU; the file is not read again."""
    header, checkpoint = opened.header, opened.data
    try:
        cls = model_class(header["module"])
    except KeyError as error:
        raise ValueError(f"{opened.path}: {error.args[0]}") from None
    if not (isinstance(cls, type) and issubclass(cls, EmpathyLightningModule)):
        raise ValueError(f"{opened.path}: header module {header['module']} is not an EmpathyLightningModule")
    hparams = refresh_targets(dict(checkpoint.get("hyper_parameters") or {}))
    if isinstance(hparams.get("net"), dict) and registered_name(str(header.get("model"))):
        hparams["net"]["_target_"] = class_path(model_class(header["model"]))
    module = cls(**hparams)
    module.on_load_checkpoint(checkpoint)
    module.load_state_dict(checkpoint["state_dict"])
    return module


def load_module(path: str | Path, kind: str | None = None) -> EmpathyLightningModule:
    """A checkpoint (a file, or a run folder's best) rebuilt as the module its header names, on the CPU.
    `kind` ('fusion' or 'text'): a checkpoint of another kind raises WrongKindError before anything is built."""
    return module_from(open_checkpoint(path, kind))
