"""File helpers shared by the store, the frame cache, the dataset contract, the demo generator and the
splits: content hashes, writes that are never seen half-done, permissions that follow the process umask,
and the free space on a disk."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

# numpy's message when the C library wrote less than asked (a full disk; the errno is often lost):
# "OSError: 428045 requested and 407488 written"
_SHORT_WRITE = re.compile(r"^\d+ requested and \d+ written$")
_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}  # a full disk, or the user's quota reached


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
    try:
        respect_umask(Path(tmp), directory=False)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: no half-written temporary file stays behind
        Path(tmp).unlink(missing_ok=True)
        raise


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


def free_bytes(path: Path) -> int:
    """Free bytes on the disk that holds `path` (its nearest existing folder when it does not exist yet)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def is_disk_full(error: BaseException) -> bool:
    """An error from writing to a disk without room: ENOSPC, a quota (EDQUOT), or numpy's short write
    (`428045 requested and 407488 written`, whose errno is None)."""
    if not isinstance(error, OSError):
        return False
    return error.errno in _NO_SPACE or (error.errno is None and bool(_SHORT_WRITE.match(str(error))))


def format_bytes(count: float) -> str:
    """1234567 -> '1.2 MB' (decimal units, as `df -H` shows them)."""
    value, unit = float(count), "bytes"
    for larger in ("kB", "MB", "GB", "TB"):
        if abs(value) < 1000:
            break
        value, unit = value / 1000, larger
    return f"{value:.0f} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
