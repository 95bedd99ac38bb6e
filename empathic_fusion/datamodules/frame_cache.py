"""The normalised frame cache: the out-of-core frame arrays, written once and shared by every run that
reads the same frames.

    <cache root>/<key>/meta.json             what the cache holds, its identity, each file's size and time
    <cache root>/<key>/dense-<piece>.npy     (rows + 1, width) float32: z-scored, masked frames of a dense piece
    <cache root>/<key>/mask-<modality>.npy   (rows + 1,) bool per-frame modality mask
    <cache root>/<key>/index-<branch>.npy    (rows + 1,) int64 rows of an indexed branch's table (-1: nothing)
    <cache root>/<key>/table-<branch>.npy    an indexed branch's table, sessions concatenated
    <cache root>/<key>.lock                  held while one process builds the cache

The key hashes everything the values depend on: the sessions in order with their frame counts, the
selected branches and their widths, what is masked, the stored arrays' contents (their sha256 in the
store's manifest), where the participant speaks (the audio mask) and the normalisation statistics. A
change to any of them is another key, so a cache is never read for other frames than it was built
from. Runs of a sweep that share a split read one cache (and one copy of it in the page cache),
whatever their model or seed; each cross-validation fold has its own training statistics, so its own
cache.

A cache is written into a temporary folder and renamed into place, under a file lock, so concurrent
runs build it once and never read half of one. Before writing, the free space is checked against the
cache's size. On opening, every file's size and modification time are compared with meta.json; a
cache that differs is rebuilt with a warning.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from filelock import FileLock

from empathic_fusion.core.branches import BRANCHES, speech_branch
from empathic_fusion.core.errors import UserError
from empathic_fusion.core.files import atomic_write_text, canonical_hash, free_bytes, respect_umask
from empathic_fusion.datamodules.window_dataset import FrameSource
from empathic_fusion.datamodules.window_gather import (DiskRows, FrameArrays, FrameLayout, FramePartsSink, fill_frames,
                                                        fit_rows, small_tensors)
from empathic_fusion.utils.run_output import warn_data

log = logging.getLogger(__name__)

CACHE_VERSION = 1
META = "meta.json"
FREE_MARGIN_BYTES = 256 * 2 ** 20  # left free on the disk after a cache is written


class FrameCacheSpaceError(UserError, OSError):
    """The disk holding the cache has not enough free space for it; the message says how much is needed."""


class FrameCacheWriteError(UserError, OSError):
    """The cache's folder cannot be written (a read-only store, another user's folder); the message says
    where and what to do."""


_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


@dataclass
class FrameCache:
    """An opened cache: the dense pieces to read from disk, the rest loaded."""

    folder: Path
    dense: dict[str, DiskRows]
    masks: dict[str, np.ndarray]
    indices: dict[str, np.ndarray]
    tables: dict[str, np.ndarray]


def _file_name(kind: str, name: str) -> str:
    return f"{kind}-{name.replace('/', '-')}.npy"


def _array_digest(arrays: list[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def cache_identity(source: FrameSource, layout: FrameLayout) -> dict:
    """What the cached values depend on (JSON): its hash is the cache's key."""
    missing = source.missing
    entries = {}
    for sid in layout.offsets:
        for modality, names in source.branches.items():
            for branch in names:
                if (sid, modality) in missing or (sid, modality, branch) in missing:
                    continue
                entry = source.store.manifest(sid).get(branch) or {}
                arrays = {name: {k: record.get(k) for k in ("sha256", "shape", "dtype", "bytes")}
                          for name, record in entry.get("arrays", {}).items()}
                entries[f"{sid}/{branch}"] = canonical_hash({"signature": entry.get("signature"), "arrays": arrays})
    speaking = None
    speech = speech_branch()
    if speech is not None and BRANCHES[speech].modality in source.branches:  # the modality the speech mask masks
        speaking = _array_digest([np.packbits(fit_rows(np.asarray(source.speaking[sid], dtype=bool), int(n), False))
                                  for sid, n in source.session_frames.items()])
    return {"version": CACHE_VERSION, "store": str(source.store.root.resolve()),
            "sessions": [[sid, int(n)] for sid, n in source.session_frames.items()],
            "branches": source.branches, "branch_dims": {b: int(d) for b, d in source.branch_dims.items()},
            "missing": sorted(map(list, missing)), "stored": canonical_hash(entries), "speaking": speaking,
            "stats": {m: _array_digest([np.asarray(mean, np.float32), np.asarray(std, np.float32)])
                      for m, (mean, std) in sorted(source.stats.items())}}


def frame_arrays_on_disk(source: FrameSource, root: Path) -> FrameArrays:
    """Frame arrays whose dense pieces are read out of core from the frame cache under `root` (built when
    missing: once, whichever concurrent run gets there first); masks and indexed branches in host tensors
    (batches are gathered on the host and handed to the training device)."""
    layout = FrameLayout.of(source)
    cache = open_frame_cache(source, layout, Path(root))
    tensors = small_tensors(cache.masks, cache.indices, cache.tables, source.branch_dims)
    return FrameArrays(source, layout, tensors, cache.dense, where=f"out of core from {cache.folder}")


def open_frame_cache(source: FrameSource, layout: FrameLayout, root: Path) -> FrameCache:
    """The cache of these frames under `root`: opened when it is there and intact, else built (once:
    concurrent callers wait for the first)."""
    identity = cache_identity(source, layout)
    key = canonical_hash(identity)
    folder = root / key
    cache = _open(folder, layout)
    if cache is not None:
        log.info("frame cache %s: reused", folder)
        return cache
    try:
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root / f"{key}.lock")):
            cache = _open(folder, layout)  # built by another run while this one waited
            if cache is not None:
                log.info("frame cache %s: reused (written by another run meanwhile)", folder)
            else:
                _build(source, layout, folder, identity)
                cache = _open(folder, layout)
    except OSError as error:
        if error.errno not in _NOT_WRITABLE or isinstance(error, FrameCacheSpaceError):
            raise
        raise FrameCacheWriteError(error.errno, f"cannot write the frame cache in {root} ({error.strerror}: "
                                   f"{error.filename or root}); a read-only store needs data.frame_cache_dir set to a "
                                   f"writable folder (e.g. a local disk), or data.frames=memory to hold the frames "
                                   f"in memory") from error
    if cache is None:
        raise RuntimeError(f"frame cache {folder} could not be read back after it was written")
    return cache


def _open(folder: Path, layout: FrameLayout) -> FrameCache | None:
    """The cache in `folder`, or None when there is none; a damaged one (a file missing or changed since
    it was written) is reported and left to be rebuilt."""
    try:
        meta = json.loads((folder / META).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        warn_data(f"frame cache {folder}: {META} is damaged; the cache is built again")
        return None
    for name, record in meta["files"].items():
        path = folder / name
        try:
            stat = path.stat()
        except FileNotFoundError:
            warn_data(f"frame cache {folder}: {name} is missing; the cache is built again")
            return None
        if stat.st_size != record["bytes"] or stat.st_mtime_ns != record["mtime_ns"]:
            warn_data(f"frame cache {folder}: {name} changed after it was written (size or time differ); "
                      f"the cache is built again")
            return None
    dense = {key: DiskRows(folder / info["file"], layout.rows + 1, info["width"], info["data_offset"])
             for key, info in meta["dense"].items()}
    masks = {m: np.load(folder / _file_name("mask", m)) for m in meta["masks"]}
    indices = {b: np.load(folder / _file_name("index", b)) for b in meta["indexed"]}
    tables = {b: np.load(folder / _file_name("table", b)) for b in meta["indexed"]}
    return FrameCache(folder, dense, masks, indices, tables)


class _DiskSink(FramePartsSink):
    """fill_frames into the cache files: dense chunks written in place, the rest gathered for np.save."""

    def __init__(self, folder: Path, layout: FrameLayout, source: FrameSource):
        super().__init__(layout, source)
        self.folder, self.layout = folder, layout
        self.files, self.offsets = {}, {}
        for key in layout.dense_keys():
            path = folder / _file_name("dense", key)
            header = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32,
                                               shape=(layout.rows + 1, layout.widths[key]))
            self.offsets[key] = header.offset  # the file is sized (sparse: zeros until written)
            del header
            self.files[key] = os.open(path, os.O_WRONLY | getattr(os, "O_BINARY", 0))

    def dense(self, key: str, row: int, values: np.ndarray) -> None:
        view = memoryview(np.ascontiguousarray(values, dtype=np.float32)).cast("B")
        offset, done = self.offsets[key] + row * 4 * self.layout.widths[key], 0
        while done < len(view):
            if hasattr(os, "pwritev"):
                done += os.pwritev(self.files[key], [view[done:]], offset + done)
            else:
                os.lseek(self.files[key], offset + done, os.SEEK_SET)
                done += os.write(self.files[key], view[done:])

    def close(self) -> None:
        for fd in self.files.values():
            os.fsync(fd)
            os.close(fd)
        self.files = {}
        for modality, mask in self.masks.items():
            np.save(self.folder / _file_name("mask", modality), mask)
        for branch, table in self.table_arrays().items():
            np.save(self.folder / _file_name("index", branch), self.indices[branch])
            np.save(self.folder / _file_name("table", branch), table)


def _build(source: FrameSource, layout: FrameLayout, folder: Path, identity: dict) -> None:
    """Write the cache into a temporary folder beside `folder` and rename it into place."""
    root = folder.parent
    needed = layout.dense_nbytes() + 9 * (layout.rows + 1) * len(source.branches)
    free = free_bytes(root)
    advice = (f"free space there, point data.frame_cache_dir at a larger disk, or hold the frames in memory "
              f"with data.frames=memory (about {needed / 1e9:.2f} GB of RAM)")
    if free < needed + FREE_MARGIN_BYTES:
        raise FrameCacheSpaceError(errno.ENOSPC, f"the frame cache for these windows needs {needed / 1e9:.2f} GB in "
                                   f"{root} and {free / 1e9:.2f} GB are free: {advice}")
    began = time.perf_counter()
    log.info("frame cache %s: writing %.2f GB of normalised frames", folder, needed / 1e9)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=root))
    respect_umask(tmp, directory=True)
    sink = None
    try:
        sink = _DiskSink(tmp, layout, source)
        fill_frames(source, layout, sink)
        sink.close()
        files = {}
        for path in sorted(tmp.iterdir()):
            stat = path.stat()
            files[path.name] = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        meta = {"key": folder.name, "identity": identity, "files": files, "rows": layout.rows + 1,
                "dense": {key: {"file": _file_name("dense", key), "width": layout.widths[key],
                                "data_offset": sink.offsets[key]} for key in layout.dense_keys()},
                "masks": list(source.branches), "indexed": list(sink.indices),
                "seconds": round(time.perf_counter() - began, 1)}
        atomic_write_text(tmp / META, json.dumps(meta, indent=1))
        if folder.exists():  # a damaged cache of the same key
            old = root / f".old-{folder.name}-{os.getpid()}"
            folder.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(folder)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise FrameCacheSpaceError(errno.ENOSPC, f"the disk ran full while writing the frame cache for these "
                                       f"windows ({needed / 1e9:.2f} GB) in {root}; nothing was kept: {advice}") from error
        raise
    finally:
        if sink is not None:
            for fd in sink.files.values():
                os.close(fd)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("frame cache %s: written in %.1f s", folder, time.perf_counter() - began)
