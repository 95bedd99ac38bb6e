"""A fusion datamodule's set-up kept in the process between the jobs of one multirun.

A grid sweep trains many models and seeds on the same store, split and modality subset. Hydra's basic
launcher runs its jobs one after another in one process (and `hydra/launcher=shared_device` runs them in a
few long-lived worker processes), so the second job of a subset would repeat what the first did: the
store's freshness checks, the windows, the training statistics and the frame arrays' fill (the largest
fixed cost of a job on a GPU, where the arrays live in its memory). Inside a multirun (`sweep_scope`) a set-up
datamodule is kept and the next job that asks for the same data gets it again, when

- its key is equal: every data and feature setting that the set-up depends on, the modalities, the device the
  frames are placed for, and the sweep (a new multirun in the same process never reuses an older one's), and
- its inputs are unchanged: the size, modification time and inode of every file of the dataset folder and of
  the store's sessions, dataset branches, failure reports and splits (not the frame cache or the hash cache,
  which reading updates) are as they were when it was kept.

One set-up is kept per process (the sweep orders its jobs so that runs of one subset follow each other): a
job that asks for other data releases it first, so frame arrays on a GPU are never held twice and the new
job's memory budget counts only what it needs. Outside a multirun nothing is kept.
"""
from __future__ import annotations

import atexit
import gc
import hashlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

UNWATCHED = ("frame_cache", "file_hashes")  # what reading the store writes, left out of the inputs' fingerprint


@dataclass
class KeptSetup:
    key: str
    fingerprint: str
    state: dict[str, Any]
    job: str  # the job that set it up, for the log
    device: torch.device


_scope: str | None = None  # the sweep whose jobs keep their set-up
_job = ""  # the job running now
_kept: KeptSetup | None = None


@contextmanager
def sweep_scope(sweep: str | None, job: str) -> Iterator[None]:
    """Inside it, datamodules of sweep `sweep` keep and reuse their set-up (None: not a multirun, nothing kept)."""
    global _scope, _job
    previous = _scope, _job
    _scope, _job = sweep, job
    try:
        yield
    finally:
        _scope, _job = previous


def active() -> bool:
    return _scope is not None


def inputs_fingerprint(folders: list[Path]) -> str:
    """A digest of (path, size, modification time, inode) of every file under `folders`, names in UNWATCHED
    left out: a file written, replaced or removed changes it."""
    digest = hashlib.sha256()
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith(UNWATCHED) and not d.startswith(".tmp-"))
            for name in sorted(files):
                if name.startswith(UNWATCHED) or name.endswith(".lock"):
                    continue
                path = os.path.join(root, name)
                try:
                    stat = os.stat(path)
                except FileNotFoundError:
                    continue
                digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ino}\n".encode())
    return digest.hexdigest()


def reuse(key: str, fingerprint: str) -> KeptSetup | None:
    """The kept set-up for `key` when its inputs are unchanged; otherwise None, after releasing what is kept."""
    if _scope is None:
        return None
    key = f"{_scope}\0{key}"
    if _kept is not None and _kept.key == key and _kept.fingerprint == fingerprint:
        return _kept
    if _kept is not None and _kept.key == key:
        log.info("data: the dataset or store changed since job %s set it up; setting up again", _kept.job)
    release()
    return None


def keep(key: str, fingerprint: str, state: dict[str, Any], device: torch.device) -> None:
    """Keep a datamodule's set-up for the next jobs of this sweep (inside `sweep_scope` only)."""
    global _kept
    if _scope is None:
        return
    release()
    _kept = KeptSetup(f"{_scope}\0{key}", fingerprint, state, _job, device)


def release() -> None:
    """Let the kept set-up go (its frame arrays with it, also from a GPU's memory)."""
    global _kept
    if _kept is None:
        return
    on_gpu = _kept.device.type == "cuda"
    _kept = None
    if on_gpu:
        gc.collect()  # the previous job's trainer and datamodule may hold the arrays in a reference cycle
        torch.cuda.empty_cache()


atexit.register(release)  # before the interpreter's teardown, while the arrays' files can still close
