"""File helpers shared by the store, the dataset contract, the demo generator and the splits: content
hashes, writes that are never seen half-done, and permissions that follow the process umask."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def respect_umask(path: Path, directory: bool) -> None:
    """tempfile creates 0700 folders and 0600 files; give them the permissions a plain mkdir/open would,
    so a lab's shared folder stays readable to colleagues."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename, so a reader
    sees the old file or the new one, never a part of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    respect_umask(Path(tmp), directory=False)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def canonical_hash(value: Any) -> str:
    """Stable short hash of a JSON-serialisable value (configs, signatures, splits)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def sha256_file(path: Path) -> str:
    """A file's sha256, read in 4 MiB blocks (media and arrays of any size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
