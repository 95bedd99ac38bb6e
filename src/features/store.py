"""A feature store: one folder per session, one sub-folder per branch, a manifest per session.

    <root>/sessions/<session_id>/manifest.json
    <root>/sessions/<session_id>/<branch>/<array>.npy      (memory-mappable .npy files)
    <root>/dataset/<branch>/...                             (dataset-level branches, e.g. stories)
    <root>/failures.json                                    (the last extraction's failures)

A branch is written into a temporary folder and renamed into place, and the manifest is replaced
atomically after it, so a killed extraction never leaves a half-written branch that looks done.
A branch is up to date when its signature (extractor, version, config, input-file hashes) equals
the one in the manifest.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

DATASET_KEY = "_dataset"


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def canonical_hash(value: Any) -> str:
    """Stable short hash of a JSON-serialisable value (configs, signatures, splits)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


class FeatureStore:
    """Reads and writes frame-level feature arrays and their manifests."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._hash_cache_path = self.root / "file_hashes.json"
        self._hash_cache: dict[str, dict] = (
            json.loads(self._hash_cache_path.read_text()) if self._hash_cache_path.exists() else {}
        )

    # ---- input hashing -------------------------------------------------------------------
    def file_hash(self, path: str | Path) -> str:
        """sha256 of a file; cached by (size, mtime) so large media is hashed once."""
        path = Path(path).resolve()
        stat = path.stat()
        key = str(path)
        cached = self._hash_cache.get(key)
        if cached and cached["size"] == stat.st_size and cached["mtime_ns"] == stat.st_mtime_ns:
            return cached["sha256"]
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
        self._hash_cache[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest.hexdigest()}
        return digest.hexdigest()

    def save_hash_cache(self) -> None:
        _atomic_write_text(self._hash_cache_path, json.dumps(self._hash_cache, indent=0, sort_keys=True))

    # ---- layout --------------------------------------------------------------------------
    def owner_dir(self, owner: str) -> Path:
        """Folder of a session, or of the dataset-level branches when owner is DATASET_KEY."""
        return self.root / "dataset" if owner == DATASET_KEY else self.root / "sessions" / owner

    def branch_dir(self, owner: str, branch: str) -> Path:
        return self.owner_dir(owner) / branch

    def manifest(self, owner: str) -> dict:
        path = self.owner_dir(owner) / "manifest.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def entry(self, owner: str, branch: str) -> dict | None:
        """Manifest entry of a finished branch whose files are all present, else None."""
        entry = self.manifest(owner).get(branch)
        if entry is None:
            return None
        folder = self.branch_dir(owner, branch)
        if not all((folder / f"{name}.npy").exists() for name in entry["arrays"]):
            return None
        return entry

    def is_fresh(self, owner: str, branch: str, signature: dict) -> bool:
        entry = self.entry(owner, branch)
        return entry is not None and entry["signature"] == signature

    # ---- writing -------------------------------------------------------------------------
    def write_branch(self, owner: str, branch: str, arrays: dict[str, np.ndarray], signature: dict,
                     info: dict | None = None) -> None:
        """Atomically replace one branch's arrays, then record it in the manifest."""
        owner_dir = self.owner_dir(owner)
        owner_dir.mkdir(parents=True, exist_ok=True)
        for leftover in [*owner_dir.glob(f".{branch}.tmp-*"), *owner_dir.glob(f".{branch}.old-*")]:
            shutil.rmtree(leftover, ignore_errors=True)  # from a killed run; one writer per session
        tmp = Path(tempfile.mkdtemp(prefix=f".{branch}.tmp-", dir=owner_dir))
        try:
            for name, array in arrays.items():
                with open(tmp / f"{name}.npy", "wb") as handle:
                    np.save(handle, np.ascontiguousarray(array))
                    handle.flush()
                    os.fsync(handle.fileno())
            final = self.branch_dir(owner, branch)
            if final.exists():
                old = owner_dir / f".{branch}.old-{os.getpid()}"
                final.rename(old)
                tmp.rename(final)
                shutil.rmtree(old)
            else:
                tmp.rename(final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
        manifest = self.manifest(owner)
        manifest[branch] = {
            "signature": signature,
            "arrays": {name: {"shape": list(a.shape), "dtype": str(a.dtype)} for name, a in arrays.items()},
            **(info or {}),
        }
        _atomic_write_text(owner_dir / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True))

    # ---- reading -------------------------------------------------------------------------
    def load(self, owner: str, branch: str, name: str, mmap: bool = True) -> np.ndarray:
        """One array of a branch, memory-mapped by default (read-only views, no copies)."""
        return np.load(self.branch_dir(owner, branch) / f"{name}.npy", mmap_mode="r" if mmap else None)

    def write_failures(self, failures: list[dict], name: str = "failures.json") -> Path:
        """The failure report: every (session, branch) that failed in the last run and why."""
        path = self.root / name
        _atomic_write_text(path, json.dumps(failures, indent=1))
        return path

    def manifest_hash(self, owners: list[str], branches: list[str]) -> str:
        """Hash of the signatures of the given branches: identifies the features a model saw."""
        return canonical_hash({o: {b: (self.entry(o, b) or {}).get("signature") for b in branches} for o in owners})
