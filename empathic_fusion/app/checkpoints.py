"""Which checkpoint the app serves: a checkpoint file as given, or a run folder's best checkpoint.

A run folder (`<run>/` or `<run>/checkpoints/`) holds the monitored ModelCheckpoint's best
(`epoch_NNN.ckpt`, what the run tested) and `last.ckpt` (the latest epoch, to resume from), which
may be worse. The best is read from the monitored checkpoint callback's state that Lightning saves in
every checkpoint (`best_model_path`, newest checkpoint first); when that file has moved with the
folder it is found by name, and when it is gone the best surviving entry of the callback's
`best_k_models` (by the monitored score and mode) is served instead.
"""
from __future__ import annotations

import ast
import logging
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's dict, memory-mapped (tensors are read when used)."""
    return torch.load(path, map_location="cpu", weights_only=False, mmap=True)


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


def best_checkpoint(folder: Path) -> Path:
    """The monitored best checkpoint of a run's checkpoints folder."""
    files = list(folder.glob("*.ckpt"))
    if not files:
        raise FileNotFoundError(f"no .ckpt file in {folder} (train.py writes <run>/checkpoints/*.ckpt)")
    newest_first = sorted(files, key=lambda p: (p.name != "last.ckpt", -p.stat().st_mtime))
    for path in newest_first:
        for state, mode in _monitored_states(load_checkpoint(path)):
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
        raise FileNotFoundError(f"{path} is neither a checkpoint file nor a run folder")
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    return best_checkpoint(folder)


def metrics_note(path: Path) -> str:
    """Says so when the served checkpoint is not the run's best, whose test metrics the card shows."""
    folder = path.parent
    try:
        best = best_checkpoint(folder)
    except (FileNotFoundError, ValueError):
        return ""
    if best.resolve() == path.resolve():
        return ""
    return (f"These test metrics are of the run's best checkpoint {best.name}; the served {path.name} is another "
            "epoch of that run (serve the run folder to serve the best).")
