"""A feature store: one folder per session, one sub-folder per branch, a manifest per session.

    <root>/sessions/<session_id>/manifest.json
    <root>/sessions/<session_id>/<branch>/<array>.npy      (memory-mappable .npy files)
    <root>/dataset/<branch>/...                             (dataset-level branches, e.g. stories)
    <root>/failures.json                                    (the last extraction's failures)
    <root>/failures-shard<i>of<n>.json                      (shard i's failures; merged into failures.json)
    <root>/file_hashes.json, file_hashes-shard<i>of<n>.json (input-file hashes; a shard writes only its own)

Shards of one extraction (`extract.py shard=i/n`, one cluster job each) share one store: each writes
only its own sessions, its own failure report and its own hash cache, so concurrent shards never
write the same file; `merge_shards` joins their reports and caches when all have finished.

A branch is written into a temporary folder and renamed into place, and the manifest is replaced
atomically after it, so a killed extraction never leaves a half-written branch that looks done. The
temporary folders carry their writer's pid and host (`.face.tmp-<pid>-<random>@<host>`): a writer removes
the leftovers of its own process and of processes of its host that have ended, never a running one's;
one holding the store's extraction lock (`writing`, empathic_fusion/features/store_lock.py) also those of
other hosts. A disk that runs full while a branch is written stops with StoreSpaceError naming the
store, session, branch and the space needed and free; the branch's temporary folder is removed and its
manifest is left as it was.
A long session's per-frame rows are written to disk while they are computed (frame_rows.FrameRows), into a
per-process folder in the session's folder (`.rows.tmp-<pid>-<random>@<host>`, `rows_folder`: the same file
system, so `write_branch` renames a finished file into the branch's temporary folder instead of writing it
again); the leftovers of a killed extraction's are removed like those of its temporary branch folders.
A branch is up to date when its signature (extractor, version, config, input-file hashes) equals
the one in the manifest and its files pass the integrity check.

Integrity: the manifest records each array's shape, dtype, file size, modification time and sha256
at write time. `load` checks what is cheap every time (the file exists, its size, its header's shape
and dtype) and re-hashes a file whose modification time differs from the record (once per process), so
bytes overwritten in place are found before use; `check_branch(..., deep=True)` (`extract.py
verify=true`) re-hashes every file and looks for NaN/Inf, which also finds damage that kept both size
and modification time. Non-finite values never enter the store: `write_branch` rejects them. Folders and files are
created with the process umask (a lab's shared store stays readable to colleagues).

Read-only stores (a lab's store handed to students, a read-only mount on a cluster): a run that finds
everything up to date writes nothing into the store (the hash cache only when it learnt a new hash, the
failure report only when it changed), so training, evaluation and prediction read such a store as it is.
What it cannot save there (new input-file hashes, a failure report) is kept in memory for the run; what
extraction would have to write (a stale, damaged or missing branch) stops with StoreReadOnlyError naming
the branches, the folder and data.store_dir.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from empathic_fusion.core.errors import UserError
from empathic_fusion.core.files import (atomic_write_text, canonical_hash, format_bytes, free_bytes, is_disk_full,
                                        respect_umask, sha256_file)
from empathic_fusion.features.frame_rows import NpyFile
from empathic_fusion.features.store_lock import HOST, ExtractionLock, pid_alive

log = logging.getLogger(__name__)

DATASET_KEY = "_dataset"
MANIFEST_CHECKSUM = "_checksum"
FAILURES = "failures"
HASH_CACHE = "file_hashes"
_SHARD_FILE = re.compile(r"-shard(\d+)of(\d+)\.json$")
# a branch's temporary or replaced folder: .<branch>.tmp-<pid>-<random>@<host> or .<branch>.old-<pid>@<host>; an
# extracting process's rows written to disk: .rows.tmp-<pid>-<random>@<host>
_WRITER = re.compile(r"\.(?:tmp|old)-(?P<pid>\d+)(?:-[^@/]*)?@(?P<host>[^@/]+)$")
ROWS_FOLDER = ".rows"
FINITE_CHECK_BYTES = 1 << 22  # a file handed to write_branch is checked for NaN/Inf this many bytes at a time


def rows_folder(owner_dir: Path) -> Path:
    """A folder (not yet created) in an owner's folder for this process's rows of its branches written to
    disk while they are computed (frame_rows.FrameRows). Named like a temporary branch folder, so a killed
    process's is removed by the next writer of that owner (FeatureStore._remove_leftovers); the process that
    made it removes it when its branches are written or have failed."""
    return Path(owner_dir) / f"{ROWS_FOLDER}.tmp-{os.getpid()}-{secrets.token_hex(4)}@{HOST}"


def shard_file(stem: str, shard: tuple[int, int] | None) -> str:
    """`failures.json` for a whole extraction, `failures-shard3of16.json` for shard 3 of 16 (any stem)."""
    return f"{stem}.json" if shard is None else f"{stem}-shard{shard[0]}of{shard[1]}.json"


def _shard_of(path: Path) -> tuple[int, int] | None:
    match = _SHARD_FILE.search(path.name)
    return (int(match[1]), int(match[2])) if match else None


@dataclass
class ShardMerge:
    """What `FeatureStore.merge_shards` found: every shard's failures (each tagged with its shard) and
    the shards that left no report (unfinished, or not run)."""

    count: int
    failures: list[dict] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    path: Path | None = None

    def summary(self) -> str:
        lines = [f"{self.count - len(self.missing)} of {self.count} shard(s) merged: {len(self.failures)} failure(s)"
                 + (f" listed in {self.path}" if self.path else "")]
        lines += [f"  shard {i}/{self.count} did not finish (no {shard_file(FAILURES, (i, self.count))}); run it "
                  f"again: extract.py shard={i}/{self.count} ..." for i in self.missing]
        lines += [f"  FAILED {f['session_id']}/{f['branch']} (shard {f['shard']}): {f['error']}" for f in self.failures]
        return "\n".join(lines)


class StoreIntegrityError(UserError, RuntimeError):
    """A store file is missing, damaged or holds non-finite values; the message names the file."""


class StoreSpaceError(UserError, OSError):
    """The store's disk has no room for what extraction writes; the message names the store, the session
    and branch, the space needed and the space free."""

    def __init__(self, message: str, session: str | None = None, branch: str | None = None):
        super().__init__(errno.ENOSPC, message)
        self.session, self.branch = session, branch  # what was being written (the failure report's entry)

    def __str__(self) -> str:
        return self.strerror


class StoreLocationError(UserError, OSError):
    """`data.store_dir` cannot be a store folder: a link to nothing (an unmounted drive), or a file."""

    def __init__(self, code: int, message: str):
        super().__init__(code, message)

    def __str__(self) -> str:
        return self.strerror


class StoreReadOnlyError(StoreLocationError):
    """The run has to write into the store (create it, extract a stale or missing branch) and the store's
    folder cannot be written (a read-only mount, another user's folder); the message names the folder, what
    would be written and data.store_dir."""


NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)  # a read-only file system, or no permission


def not_writable(error: BaseException) -> bool:
    """Whether an error says the place cannot be written (read-only file system, no permission)."""
    return isinstance(error, OSError) and error.errno in NOT_WRITABLE


def _store_folder(root: Path) -> None:
    """Create the store folder; a path through a dangling link or a file, or a folder that cannot be
    created there (a read-only dataset folder), gets its own message."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        return
    except (FileExistsError, NotADirectoryError) as error:
        failure = error
    except OSError as error:
        if not not_writable(error):
            raise
        existing = root.absolute()
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        raise StoreReadOnlyError(error.errno, (
            f"feature store folder {root} cannot be created: {existing} is not writable ({error.strerror}); "
            f"extraction writes the features there. Set data.store_dir to a writable folder (e.g. "
            f"data.store_dir=/scratch/$USER/features), or make {existing} writable")) from None
    for part in [*reversed(root.absolute().parents), root.absolute()]:
        if part.is_symlink() and not part.exists():
            raise StoreLocationError(errno.ENOENT, (
                f"feature store folder {root}: {part} is a link to {os.readlink(part)}, which does not exist (an "
                f"unmounted drive or a moved folder?); mount or create it, or set data.store_dir to another "
                f"folder")) from failure
        if part.exists() and not part.is_dir():
            raise StoreLocationError(errno.ENOTDIR, (
                f"feature store folder {root}: {part} is a file, not a folder; set data.store_dir to a folder (or "
                f"move the file away)")) from failure
    raise failure


class FeatureStore:
    """Reads and writes frame-level feature arrays and their manifests."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        _store_folder(self.root)
        self._lock: ExtractionLock | None = None  # held while this process writes as the store's extraction
        self._manifests: dict[str, tuple[tuple[int, int, int], dict]] = {}
        self._rehashed: dict[Path, tuple[int, int]] = {}  # files whose changed mtime was re-hashed: (size, mtime_ns)
        self._hash_cache: dict[str, dict] = self._read_hash_caches()
        self._hash_cache_dirty = False  # a hash was computed that the cache files do not hold: save_hash_cache writes

    def read_only_code(self) -> int | None:
        """None when this process may create files in the store folder; else why not: EROFS (a read-only
        mount) or EACCES (another user's folder, a folder without write permission; root passes those)."""
        if os.access(self.root, os.W_OK | os.X_OK):
            return None
        try:
            read_only = bool(os.statvfs(self.root).f_flag & os.ST_RDONLY)
        except (OSError, AttributeError):  # no statvfs (Windows)
            read_only = False
        return errno.EROFS if read_only else errno.EACCES

    # ---- input hashing -------------------------------------------------------------------
    def file_hash(self, path: str | Path) -> str:
        """sha256 of a file; cached by (size, mtime) so large media is hashed once."""
        path = Path(path).resolve()
        stat = path.stat()
        key = str(path)
        cached = self._hash_cache.get(key)
        if cached and cached["size"] == stat.st_size and cached["mtime_ns"] == stat.st_mtime_ns:
            return cached["sha256"]
        digest = sha256_file(path)
        self._hash_cache[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}
        self._hash_cache_dirty = True
        return digest

    def _read_hash_caches(self) -> dict[str, dict]:
        """The store's hash cache joined with the shards' own (not yet merged) ones: an entry is only
        used while its file keeps the recorded size and mtime, so which copy of a path wins does not matter."""
        cache: dict[str, dict] = {}
        for path in [*sorted(self.root.glob(f"{HASH_CACHE}-shard*of*.json")), self.root / f"{HASH_CACHE}.json"]:
            try:
                cache.update(json.loads(path.read_text()))
            except FileNotFoundError:
                continue  # merged away by another process meanwhile
            except ValueError:
                continue  # a damaged cache only costs hashing again
        return cache

    def save_hash_cache(self, shard: tuple[int, int] | None = None, force: bool = False) -> bool:
        """Write the hash cache when a hash was computed that its files do not hold (or `force`): a run
        that hashed nothing new writes nothing, so an up-to-date read-only store is only read. A shard
        writes its own file, so concurrent shards never overwrite each other's entries (`merge_shards` joins
        them). A full disk or a store that cannot be written only costs hashing again next time (the hashes
        stay in memory for this run). True when the file was written."""
        if not (self._hash_cache_dirty or force):
            return False
        path = self.root / shard_file(HASH_CACHE, shard)
        try:
            atomic_write_text(path, json.dumps(self._hash_cache, indent=0, sort_keys=True))
        except OSError as error:
            if not_writable(error):
                log.debug("feature store %s cannot be written (%s): the input-file hashes were not saved in %s; "
                          "they are kept for this run and computed again next time", self.root, error.strerror, path)
                return False
            if not is_disk_full(error):
                raise
            log.warning("feature store %s: the disk is full (%s free); the input-file hashes were not saved and "
                        "are computed again next time", self.root, format_bytes(free_bytes(self.root)))
            return False
        self._hash_cache_dirty = False
        return True

    def merge_shards(self, count: int, finished: set[int] | None = None) -> ShardMerge:
        """Join the failure reports of shards 0..count-1 into `failures.json` (each failure tagged with
        its shard) and every shard's hash cache into `file_hashes.json` (the shard caches are removed).
        `finished` names the shards whose report belongs to this run (a report of an earlier run is then
        not taken for an unfinished shard's); by default every report found."""
        merge = ShardMerge(count)
        for index in range(count):
            path = self.root / shard_file(FAILURES, (index, count))
            if (finished is not None and index not in finished) or not path.exists():
                merge.missing.append(index)
                continue
            merge.failures += [{**failure, "shard": f"{index}/{count}"} for failure in json.loads(path.read_text())]
        merge.failures.sort(key=lambda f: (str(f["session_id"]), str(f["branch"])))
        merge.path = self.write_failures(merge.failures)
        caches = sorted(self.root.glob(f"{HASH_CACHE}-shard*of*.json"))
        self._hash_cache = {**self._read_hash_caches(), **self._hash_cache}
        self.save_hash_cache(force=bool(caches))  # the shards' entries go into file_hashes.json
        for path in caches:  # their entries are in file_hashes.json now
            path.unlink(missing_ok=True)
        return merge

    def shard_counts(self) -> list[int]:
        """The shard counts whose failure reports are in the store, the most recently written first."""
        newest: dict[int, int] = {}
        for path in self.root.glob(f"{FAILURES}-shard*of*.json"):
            shard = _shard_of(path)
            if shard is not None:
                newest[shard[1]] = max(newest.get(shard[1], 0), path.stat().st_mtime_ns)
        return sorted(newest, key=newest.get, reverse=True)

    # ---- layout --------------------------------------------------------------------------
    def owner_dir(self, owner: str) -> Path:
        """Folder of a session, or of the dataset-level branches when owner is DATASET_KEY."""
        return self.root / "dataset" if owner == DATASET_KEY else self.root / "sessions" / owner

    def branch_dir(self, owner: str, branch: str) -> Path:
        return self.owner_dir(owner) / branch

    def manifest(self, owner: str, strict: bool = True) -> dict:
        """The owner's manifest, re-read only when the file changed (readers open it once per array).
        A damaged manifest raises StoreIntegrityError, or reads as empty with strict=False (extraction:
        every branch of that owner is then redone)."""
        path = self.owner_dir(owner) / "manifest.json"
        try:
            stat = path.stat()
        except FileNotFoundError:
            return {}
        key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        cached = self._manifests.get(owner)
        if cached is None or cached[0] != key:
            try:
                manifest = json.loads(path.read_text())
                checksum = manifest.pop(MANIFEST_CHECKSUM, None)
                if checksum is not None and checksum != canonical_hash(manifest):
                    raise ValueError("its checksum does not match its contents")
                cached = (key, manifest)
            except (ValueError, UnicodeDecodeError) as error:
                if not strict:
                    return {}
                raise StoreIntegrityError(f"feature store manifest {path} is damaged ({error}); delete it and run "
                                          f"extract.py again to redo this session's branches") from error
            self._manifests[owner] = cached
        return cached[1]

    def entry(self, owner: str, branch: str) -> dict | None:
        """Manifest entry of a finished branch whose files are all present, else None."""
        entry = self.manifest(owner).get(branch)
        if entry is None:
            return None
        folder = self.branch_dir(owner, branch)
        if not all((folder / f"{name}.npy").exists() for name in entry["arrays"]):
            return None
        return entry

    def check_branch(self, owner: str, branch: str, deep: bool = False) -> list[str]:
        """What is wrong with a recorded branch's files ([] = intact). Cheap: presence, size, header
        shape and dtype; deep: also the recorded sha256 and NaN/Inf in the values."""
        entry = self.manifest(owner).get(branch)
        if entry is None:
            return [f"{self.branch_dir(owner, branch)}: not in the manifest"]
        problems = []
        for name, expected in entry["arrays"].items():
            path = self.branch_dir(owner, branch) / f"{name}.npy"
            problem = self._file_problem(path, expected, deep)
            if problem:
                problems.append(f"{path}: {problem}")
        return problems

    def _file_problem(self, path: Path, expected: dict | None, deep: bool) -> str | None:
        """_file_problem, plus: a file whose modification time differs from its record is re-hashed (once
        per process while it stays so), so in-place damage of the same size is found before use."""
        problem = _file_problem(path, expected, deep)
        if problem or deep or not expected or "mtime_ns" not in expected or "sha256" not in expected:
            return problem
        stat = path.stat()
        if stat.st_mtime_ns == expected["mtime_ns"] or self._rehashed.get(path) == (stat.st_size, stat.st_mtime_ns):
            return None
        if sha256_file(path) != expected["sha256"]:
            return "has other contents than were written (modified since it was written; sha256 differs)"
        self._rehashed[path] = (stat.st_size, stat.st_mtime_ns)
        return None

    def _current_times(self, owner: str, branch: str) -> dict | None:
        """The branch's array records with their files' current modification times, when any differs from
        the record (and every record has a sha256 the files were checked against); else None."""
        entry = self.manifest(owner).get(branch)
        if entry is None:
            return None
        arrays = {name: {**record, "mtime_ns": (self.branch_dir(owner, branch) / f"{name}.npy").stat().st_mtime_ns}
                  for name, record in entry["arrays"].items()}
        if arrays == entry["arrays"] or any("sha256" not in record for record in arrays.values()):
            return None
        return arrays

    def times_changed(self, owner: str, branch: str) -> bool:
        """Whether record_times would record anything for this branch (its files' times differ from the record)."""
        return self._current_times(owner, branch) is not None

    def record_times(self, owner: str, branch: str) -> None:
        """Record the current modification times of a branch whose files were re-hashed and found intact
        (a store copied without keeping times), so later opens need no re-hash. Extraction calls this;
        the files must have passed check_branch first."""
        arrays = self._current_times(owner, branch)
        if arrays is None:
            return
        manifest = dict(self.manifest(owner))
        entry = manifest[branch]
        manifest[branch] = {**entry, "arrays": arrays}
        manifest[MANIFEST_CHECKSUM] = canonical_hash(manifest)
        atomic_write_text(self.owner_dir(owner) / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
        self._manifests.pop(owner, None)

    def is_fresh(self, owner: str, branch: str, signature: dict, deep: bool = False) -> bool:
        """Up to date: recorded with this signature and its files pass the (cheap or deep) check."""
        entry = self.manifest(owner).get(branch)
        return entry is not None and entry["signature"] == signature and not self.check_branch(owner, branch, deep)

    # ---- writing -------------------------------------------------------------------------
    @contextmanager
    def writing(self, shard: tuple[int, int] | None = None, lock: str = "wait", timeout: float | None = None,
                what: str = "this run has branches to write") -> Iterator[ExtractionLock]:
        """Hold the store's extraction lock while writing (empathic_fusion/features/store_lock.py): an unsharded
        run alone, the shards of one extraction together; `lock` wait or fail when another run holds it.
        A store that cannot be written stops here with StoreReadOnlyError (saying `what` the run would
        write), before anything is written."""
        held = ExtractionLock(self.root, shard, lock, timeout)
        try:
            held.acquire()
        except OSError as error:
            if not not_writable(error):
                raise
            raise self.read_only_error(error.errno, what) from None
        self._lock = held
        try:
            yield held
        finally:
            self._lock = None
            held.release()

    def _remove_leftovers(self, owner_dir: Path, branch: str) -> None:
        """Remove the temporary and replaced folders of `branch` and the rows folders (`rows_folder`) that
        killed writers left: this process's branch folders, those of ended processes of this host, and, while
        this process holds the store's extraction lock (no other writer can be running), any other's. A
        running writer's folders are never touched, nor this process's rows folders (in use: their maker
        removes them)."""
        rows = [*owner_dir.glob(f"{ROWS_FOLDER}.tmp-*")]
        for leftover in [*owner_dir.glob(f".{branch}.tmp-*"), *owner_dir.glob(f".{branch}.old-*"), *rows]:
            writer = _WRITER.search(leftover.name)
            if writer is not None and writer["host"] == HOST:
                pid = int(writer["pid"])
                ended = (pid == os.getpid() and leftover not in rows) or (pid != os.getpid() and not pid_alive(pid))
            else:  # another host's, or named before writers were (no pid, no host)
                ended = self._lock is not None
            if ended:
                shutil.rmtree(leftover, ignore_errors=True)

    def space_error(self, owner: str, branch: str, needed: int, error: OSError, what: str) -> StoreSpaceError:
        """StoreSpaceError for a disk that ran full (`error`) while an owner's branch was written: what it
        needed, what is free, `what` became of it, and what to do."""
        where = f"the dataset-level branch '{branch}'" if owner == DATASET_KEY else f"session '{owner}', branch '{branch}'"
        return StoreSpaceError(
            f"feature store {self.root}: the disk is full: {where} needs "
            f"{format_bytes(needed)} and {format_bytes(free_bytes(self.root))} are free ({type(error).__name__}: "
            f"{error}); {what} and extraction stopped. Free space on that disk (or set data.store_dir to a larger "
            f"one) and run extract.py again: it keeps every branch already written", owner, branch)

    def write_branch(self, owner: str, branch: str, arrays: dict[str, np.ndarray | NpyFile], signature: dict,
                     info: dict | None = None) -> None:
        """Atomically replace one branch's arrays, then record them (shape, dtype, size, sha256) in the
        manifest. An array may be a finished .npy file (NpyFile: rows written to disk while extracted,
        frame_rows.py, best in `rows_folder`): it is checked a chunk at a time and moved into the branch, not
        read into memory; when the branch is not written it stays where it was (its maker removes it), or goes
        with the branch's temporary folder. Raises StoreIntegrityError, writing nothing, when an array holds
        NaN or Inf."""
        for name, array in arrays.items():
            bad = _non_finite(array)
            if bad:
                raise StoreIntegrityError(f"session '{owner}', branch '{branch}': the extractor produced {bad} "
                                          f"NaN/Inf value(s) in '{name}'; nothing was written")
        owner_dir = self.owner_dir(owner)
        needed = sum(np.asarray(array).nbytes if not isinstance(array, NpyFile) else array.nbytes
                     for array in arrays.values()) + 128 * len(arrays)  # .npy headers are 128 bytes
        try:
            owner_dir.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers(owner_dir, branch)
            tmp = Path(tempfile.mkdtemp(prefix=f".{branch}.tmp-{os.getpid()}-", suffix=f"@{HOST}", dir=owner_dir))
        except OSError as error:
            if is_disk_full(error):
                raise self.space_error(owner, branch, needed, error, "nothing of it was written") from error
            raise
        respect_umask(tmp, directory=True)
        records = {}
        final = self.branch_dir(owner, branch)
        try:
            for name, array in arrays.items():
                path = tmp / f"{name}.npy"
                if isinstance(array, NpyFile):
                    _move(array.path, path)
                    with open(path, "rb") as handle:
                        os.fsync(handle.fileno())
                else:
                    array = np.ascontiguousarray(array)
                    with open(path, "wb") as handle:
                        np.save(handle, array)
                        handle.flush()
                        os.fsync(handle.fileno())
                stat = path.stat()  # a rename keeps size and mtime
                records[name] = {"shape": list(array.shape), "dtype": str(np.dtype(array.dtype)),
                                 "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256_file(path)}
            if final.exists():
                old = owner_dir / f".{branch}.old-{os.getpid()}@{HOST}"
                final.rename(old)
                tmp.rename(final)
                shutil.rmtree(old)
            else:
                tmp.rename(final)
        except OSError as error:
            shutil.rmtree(tmp, ignore_errors=True)  # before the free space is measured for the message
            if is_disk_full(error):
                raise self.space_error(owner, branch, needed, error, "nothing of it was kept") from error
            raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
        manifest = dict(self.manifest(owner, strict=False))
        manifest[branch] = {"signature": signature, "arrays": records, **(info or {})}
        manifest[MANIFEST_CHECKSUM] = canonical_hash(manifest)  # edits or damage to the manifest itself show
        text = json.dumps(manifest, indent=1, sort_keys=True)
        try:
            atomic_write_text(owner_dir / "manifest.json", text)
        except OSError as error:
            if not is_disk_full(error):
                raise
            # the branch's files are in place but unrecorded: removed, so the old record cannot pass for them
            shutil.rmtree(final, ignore_errors=True)
            raise self.space_error(owner, branch, len(text), error,
                                   "its manifest was not updated, its files were removed") from error
        self._manifests.pop(owner, None)

    # ---- reading -------------------------------------------------------------------------
    def load(self, owner: str, branch: str, name: str, mmap: bool = True) -> np.ndarray:
        """One array of a branch, memory-mapped by default (read-only views, no copies), after the cheap
        integrity check against the manifest; StoreIntegrityError names the file and the fix."""
        path = self.branch_dir(owner, branch) / f"{name}.npy"
        expected = (self.manifest(owner).get(branch) or {}).get("arrays", {}).get(name)
        problem = self._file_problem(path, expected, deep=False) if expected else None
        if problem is None:
            try:
                return np.load(path, mmap_mode="r" if mmap else None)
            except (OSError, ValueError, EOFError) as error:
                problem = f"unreadable ({type(error).__name__}: {error})"
        raise StoreIntegrityError(f"feature store file {path} (session '{owner}', branch '{branch}') {problem}; "
                                  f"run extract.py again: it redoes damaged branches (extract.py verify=true "
                                  f"also checks the contents)")

    def check_finite(self, values: np.ndarray, owner: str, branch: str, name: str, where: str = "") -> None:
        """Values read from a branch's array must be finite: the store never writes NaN/Inf, so any found
        there mean the file was damaged since. StoreIntegrityError names the file (and `where` in it)."""
        if not np.isfinite(values).all():
            raise StoreIntegrityError(
                f"feature store file {self.branch_dir(owner, branch) / f'{name}.npy'} (session '{owner}', branch "
                f"'{branch}') holds NaN/Inf{where}; run `python extract.py verify=true` to find and redo damaged "
                f"branches")

    def read_only_error(self, code: int, what: str, details: list[str] | tuple[str, ...] = ()) -> StoreReadOnlyError:
        """StoreReadOnlyError for a run that must write into this store and cannot: `what` it would write,
        then the `details` (one per line), with what to do."""
        listed = "".join(f"\n  {line}" for line in details)
        return StoreReadOnlyError(code, (
            f"feature store {self.root} is read-only for this run ({os.strerror(code)}), and {what}; nothing was "
            f"written. Ask the store's owner to run extract.py on it, or copy it to a writable folder and set "
            f"data.store_dir to that folder (data.store_dir=/scratch/$USER/features extracts a store of your own)"
            + (f". To extract:{listed}" if listed else "")))

    def write_failures(self, failures: list[dict], shard: tuple[int, int] | None = None) -> Path | None:
        """The failure report: every (session, branch) that failed in the last run and why (a shard's
        own file for a shard). A report that already says this is left as it is (a run that found
        everything up to date writes nothing); None when the store cannot be written (the failures are
        then only in the run's summary)."""
        path = self.root / shard_file(FAILURES, shard)
        text = json.dumps(failures, indent=1)
        if _same_entries(self.read_failures(shard), failures):
            return path
        try:
            atomic_write_text(path, text)
        except OSError as error:
            if not_writable(error):
                log.warning("feature store %s cannot be written (%s): the failure report %s was not updated; the "
                            "run's summary lists its %d failure(s)", self.root, error.strerror, path, len(failures))
                return None
            if not is_disk_full(error):
                raise
            raise StoreSpaceError(f"feature store {self.root}: the disk is full: the failure report {path} needs "
                                  f"{format_bytes(len(text))} and {format_bytes(free_bytes(self.root))} are free "
                                  f"({type(error).__name__}: {error}). Free space on that disk (or set data.store_dir "
                                  f"to a larger one) and run extract.py again") from error
        return path

    def read_failures(self, shard: tuple[int, int] | None = None) -> list[dict] | None:
        """The failure report as the last run (of this shard) left it; None when there is none (or it is damaged)."""
        try:
            failures = json.loads((self.root / shard_file(FAILURES, shard)).read_text())
        except (OSError, ValueError):
            return None
        return failures if isinstance(failures, list) else None

    def recorded_failures(self) -> dict[tuple[str, str], dict]:
        """(session, branch) -> its failure in the store's failure reports (the merged one and every
        shard's): what the last extractions could not extract."""
        recorded: dict[tuple[str, str], dict] = {}
        for path in [*sorted(self.root.glob(f"{FAILURES}-shard*of*.json")), self.root / f"{FAILURES}.json"]:
            try:
                failures = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            for failure in failures if isinstance(failures, list) else []:
                if isinstance(failure, dict) and "session_id" in failure and "branch" in failure:
                    recorded[(str(failure["session_id"]), str(failure["branch"]))] = failure
        return recorded

    def manifest_hash(self, owners: list[str], branches: list[str],
                      excluded: set[tuple[str, str]] = frozenset()) -> str:
        """Hash of the signatures of the given branches: identifies the features a model saw. Branches in
        `excluded` (session, branch), e.g. stale ones that training masked, count as absent."""
        return canonical_hash({o: {b: None if (o, b) in excluded else (self.entry(o, b) or {}).get("signature")
                                   for b in branches} for o in owners})



def _non_finite(array: np.ndarray | NpyFile) -> int:
    """How many NaN/Inf values an array holds; a .npy file's are counted FINITE_CHECK_BYTES at a time (sequential
    reads: the file's pages are never mapped into the process, where they would count as its memory). A file
    whose header is not the NpyFile's shape and dtype raises StoreIntegrityError."""
    if not isinstance(array, NpyFile):
        if array.dtype.kind not in "fc" or np.isfinite(array).all():
            return 0
        return int(array.size - np.isfinite(array).sum())
    dtype = np.dtype(array.dtype)
    with open(array.path, "rb") as handle:
        try:
            version = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            header = read_header(handle)
        except ValueError as error:
            header = error
        if header != (tuple(array.shape), False, dtype):
            raise StoreIntegrityError(f"{array.path} is not a .npy file of shape {list(array.shape)} and dtype "
                                      f"{dtype} ({header})")
        if dtype.kind not in "fc":
            return 0
        bad, left, step = 0, int(np.prod(array.shape, dtype=np.int64)), max(FINITE_CHECK_BYTES // dtype.itemsize, 1)
        while left:
            values = np.fromfile(handle, dtype=dtype, count=min(step, left))
            if not len(values):
                raise StoreIntegrityError(f"{array.path} is shorter than shape {list(array.shape)} needs")
            bad += int(len(values) - np.isfinite(values).sum())
            left -= len(values)
    return bad


def _move(source: Path, target: Path) -> None:
    """Rename a file; copied (without reading it into memory) and removed when it is on another file system."""
    try:
        os.replace(source, target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        shutil.copyfile(source, target)
        Path(source).unlink()


def _same_entries(recorded: list[dict] | None, failures: list[dict]) -> bool:
    """Whether a recorded failure report holds these failures (in any order)."""
    if recorded is None or len(recorded) != len(failures):
        return False
    return sorted(map(canonical_hash, recorded)) == sorted(map(canonical_hash, failures))


def _file_problem(path: Path, expected: dict | None, deep: bool) -> str | None:
    """Why a store file does not match its manifest record, or None. Records written before sizes and
    hashes were kept are checked for what they have."""
    if not path.exists():
        return "is missing"
    expected = expected or {}
    size = path.stat().st_size
    if "bytes" in expected and size != expected["bytes"]:
        return f"has {size} bytes but was written with {expected['bytes']} (truncated or overwritten)"
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError) as error:
        return f"is unreadable ({type(error).__name__}: {error})"
    if "shape" in expected and list(array.shape) != list(expected["shape"]):
        return f"has shape {list(array.shape)} but was written with {expected['shape']}"
    if "dtype" in expected and str(array.dtype) != expected["dtype"]:
        return f"has dtype {array.dtype} but was written with {expected['dtype']}"
    if deep:
        if "sha256" in expected and sha256_file(path) != expected["sha256"]:
            return "has other contents than were written (sha256 differs)"
        if array.dtype.kind in "fc":
            finite = np.isfinite(array)
            if not finite.all():
                return f"holds {int(finite.size - finite.sum())} NaN/Inf value(s)"
    return None
