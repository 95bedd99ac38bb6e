"""One extraction writes a feature store at a time; the shards of one extraction write it together.

    <store>/.extract.lock                        an unsharded extraction holds it exclusively, each shard shared
    <store>/.extract-shard<i>of<n>.lock          shard i/n holds it exclusively
    <store>/.extract-holder-<host>-<pid>[-shard<i>of<n>].json   who holds them: pid, host, start time,
                                                 command, shard

A second unsharded extraction, a second run of one shard, or a shard of another count that shares
sessions with a running one (3/16 and 3/8) waits for the holder to end (`lock=wait`, reported in the
log while it waits, at most `lock_timeout` seconds) or stops at once with StoreLockError naming it
(`lock=fail`). Shards of one extraction (`extract.py shard=i/n`, one cluster job each) run together:
each writes only its own sessions and report files.

The locks are fcntl.flock locks, which the operating system releases when their process ends, however
it ends (killed, crashed), so a lock is never left behind. What a killed holder leaves is its record;
the next run that takes the lock removes it with a note in the log ("taken over"). On Linux, flock on
NFS is carried by the server's byte-range locks, so jobs on several nodes exclude each other. Without
fcntl (Windows) every run takes filelock's exclusive lock on the store: shards then run one after
another, and temporary folders of other processes are only removed by a run that holds the lock.

Only writers lock: extraction takes the lock when it finds something to write, so training and
prediction on an up-to-date (or read-only) store never wait.
"""
from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from filelock import FileLock, Timeout

from empathic_fusion.core.errors import UserError
from empathic_fusion.core.files import atomic_write_text, is_disk_full

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

log = logging.getLogger(__name__)

STORE_LOCK = ".extract.lock"
HOLDER = ".extract-holder-"  # + <host>-<pid>[-shard<i>of<n>].json in the store folder
POLL_SECONDS = 1.0           # how often a waiting run tries the lock again
REPORT_SECONDS = 300.0       # how often a waiting run says it still waits (and at once when the holder changes)
HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "localhost"


class StoreLockError(UserError, RuntimeError):
    """Another extraction writes the store: `lock=fail`, or still after `lock_timeout` seconds."""


def pid_alive(pid: int) -> bool:
    """Whether a process of this host runs with that pid (True when it cannot be told: Windows)."""
    if os.name == "nt":
        return True  # os.kill(pid, 0) would send it CTRL_C_EVENT there
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def shard_lock_name(shard: tuple[int, int]) -> str:
    return f".extract-shard{shard[0]}of{shard[1]}.lock"


def shards_overlap(one: tuple[int, int] | None, other: tuple[int, int] | None) -> bool:
    """Whether two runs can write the same session: an unsharded run writes all; shards i/n and j/m share
    the sessions p with p % n == i and p % m == j, which exist when i and j agree modulo gcd(n, m)."""
    if one is None or other is None:
        return True
    return one[0] % math.gcd(one[1], other[1]) == other[0] % math.gcd(one[1], other[1])


@dataclass(frozen=True)
class Holder:
    """A run's record of holding a store's extraction lock."""

    pid: int
    host: str
    started: str
    command: str
    shard: tuple[int, int] | None
    path: Path

    def describe(self) -> str:
        shard = f"shard {self.shard[0]}/{self.shard[1]}, " if self.shard else ""
        return f"{shard}pid {self.pid} on host {self.host}, started {self.started}, command `{self.command}`"


def _read_holder(path: Path) -> Holder | None:
    try:
        record = json.loads(path.read_text())
        shard = tuple(record["shard"]) if record.get("shard") else None
        return Holder(int(record["pid"]), str(record["host"]), str(record["started"]), str(record["command"]),
                      shard, path)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # removed meanwhile, or written half by a killed run


def _try_flock(path: Path, exclusive: bool, create: bool = True) -> int | None:
    """An open descriptor of `path` holding a flock, or None when another holds a conflicting one."""
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o666)
    except FileNotFoundError:
        if create:
            raise
        return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):  # EACCES: flock emulated over NFS
            return None
        raise
    return fd


class ExtractionLock:
    """The lock one extraction holds on a store while it writes (see the module docstring).

    `mode` "wait" or "fail" (what a run does when another holds the lock), `timeout` the seconds a waiting
    run waits at most (None: as long as it takes)."""

    def __init__(self, root: Path, shard: tuple[int, int] | None = None, mode: str = "wait",
                 timeout: float | None = None, poll_seconds: float = POLL_SECONDS):
        if mode not in ("wait", "fail"):
            raise ValueError(f"lock must be wait or fail, got '{mode}'")
        self.root, self.shard, self.mode, self.timeout = Path(root), shard, mode, timeout
        self.poll_seconds = poll_seconds
        self.waited = 0.0  # seconds this run waited for another to end
        self._fds: list[int] = []
        self._filelock: FileLock | None = None
        self._record = self.root / (f"{HOLDER}{HOST}-{os.getpid()}" + (f"-shard{shard[0]}of{shard[1]}" if shard else "")
                                    + ".json")

    @property
    def held(self) -> bool:
        return bool(self._fds) or self._filelock is not None

    # ---- taking and giving back ----------------------------------------------------------------
    def acquire(self) -> ExtractionLock:
        """Take the lock: at once, or after waiting for the runs in the way (reported in the log)."""
        began, reported, last_seen = time.monotonic(), -math.inf, None
        while True:
            blockers = self._try_once()
            if blockers is None:
                if last_seen is not None:
                    self.waited = time.monotonic() - began
                    log.warning("feature store %s: the other extraction ended; this one goes on after waiting %.0f s",
                                self.root, self.waited)
                return self
            if self.mode == "fail":
                raise StoreLockError(self._message(blockers, "wait for it to end (lock=wait waits for it), "
                                                             "or stop that process if it hangs"))
            elapsed = time.monotonic() - began
            if self.timeout is not None and elapsed >= self.timeout:
                raise StoreLockError(self._message(blockers, f"gave up after waiting {elapsed:.0f} s "
                                                             f"(lock_timeout={self.timeout:g}); run again when it "
                                                             f"has ended, or stop that process if it hangs"))
            seen = [h.describe() for h in blockers]
            if seen != last_seen or time.monotonic() - reported >= REPORT_SECONDS:
                limit = "no time limit" if self.timeout is None else f"at most lock_timeout={self.timeout:g} s"
                log.warning("%s", self._message(blockers, f"waiting for it to end ({limit}; waited {elapsed:.0f} s "
                                                          f"so far)"))
                reported, last_seen = time.monotonic(), seen
            left = math.inf if self.timeout is None else max(self.timeout - elapsed, 0.0)
            time.sleep(min(self.poll_seconds, left))

    def try_acquire(self) -> bool:
        """Take the lock if no other run holds it, without waiting; False otherwise (also when the store
        cannot be written, e.g. a read-only copy)."""
        try:
            return self._try_once() is None
        except OSError:
            return False

    def release(self) -> None:
        if not self.held:
            return
        self._record.unlink(missing_ok=True)
        for fd in reversed(self._fds):
            os.close(fd)  # closing the descriptor releases its flock
        self._fds = []
        if self._filelock is not None:
            self._filelock.release()
            self._filelock = None

    def __enter__(self) -> ExtractionLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ---- one attempt ---------------------------------------------------------------------------
    def _try_once(self) -> list[Holder] | None:
        """Take every lock this run needs, or none: None when taken, else the runs in the way."""
        if self.held:
            raise RuntimeError(f"the extraction lock of {self.root} is already held by this process")
        self.root.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            lock = FileLock(str(self.root / STORE_LOCK))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                return self._live_holders(lambda holder: True)
            self._filelock = lock
        else:
            store = _try_flock(self.root / STORE_LOCK, exclusive=self.shard is None)
            if store is None:  # an unsharded run is blocked by anyone; a shard by an unsharded run
                return self._live_holders(lambda holder: self.shard is None or holder.shard is None)
            self._fds = [store]
            if self.shard is not None:
                own = _try_flock(self.root / shard_lock_name(self.shard), exclusive=True)
                if own is None:
                    self.release()
                    return self._live_holders(lambda holder: holder.shard == self.shard)
                self._fds.append(own)
                overlapping = [h for h in self._holders() if h.shard is not None and h.shard[1] != self.shard[1]
                               and shards_overlap(h.shard, self.shard) and self._shard_held(h.shard)]
                if overlapping:
                    self.release()
                    return overlapping
        try:
            self._write_record()
            self._take_over_stale()
        except BaseException:
            self.release()
            raise
        return None

    def _shard_held(self, shard: tuple[int, int]) -> bool:
        """Whether some run holds shard's lock now (tried and let go at once)."""
        fd = _try_flock(self.root / shard_lock_name(shard), exclusive=True, create=False)
        if fd is not None:
            os.close(fd)
            return False
        return (self.root / shard_lock_name(shard)).exists()

    # ---- holder records ------------------------------------------------------------------------
    def _holders(self) -> list[Holder]:
        holders = [_read_holder(path) for path in sorted(self.root.glob(f"{HOLDER}*.json"))]
        return [h for h in holders if h is not None and h.path != self._record]

    def _live_holders(self, blocks) -> list[Holder]:
        """The recorded holders that block this run, less those of this host whose process has ended. A
        holder that has not written its record yet is read again after a moment."""
        for attempt in range(2):
            holders = [h for h in self._holders() if blocks(h) and (h.host != HOST or pid_alive(h.pid))]
            if holders or attempt:
                return holders
            time.sleep(min(self.poll_seconds, 0.5))
        return []

    def _write_record(self) -> None:
        """Record who holds the lock, for the messages of runs that find it taken; on a full disk the lock is
        held without a record (the free-space check that follows names the problem)."""
        record = {"pid": os.getpid(), "host": HOST, "started": datetime.now().astimezone().isoformat(timespec="seconds"),
                  "command": shlex.join(sys.argv) if sys.argv and sys.argv[0] else sys.executable,
                  "shard": list(self.shard) if self.shard else None}
        try:
            atomic_write_text(self._record, json.dumps(record, indent=1))
        except OSError as error:
            if not is_disk_full(error):
                raise

    def _take_over_stale(self) -> None:
        """Remove the records of holders that have ended without giving the lock back (killed), noting each:
        holding the lock proves that for some of them; of the others, a process of this host that is gone
        or a shard whose lock nobody holds."""
        for holder in self._holders():
            if self.shard is None or holder.shard is None or holder.shard == self.shard or fcntl is None:
                stale = True  # this run holds the lock that one would hold
            elif holder.host == HOST:
                stale = not pid_alive(holder.pid)
            else:
                stale = not self._shard_held(holder.shard)
            if stale:
                log.warning("feature store %s: the extraction lock was held by %s, which ended without giving it "
                            "back (killed or crashed); taken over", self.root, holder.describe())
                holder.path.unlink(missing_ok=True)

    # ---- messages ------------------------------------------------------------------------------
    def _message(self, blockers: list[Holder], what_now: str) -> str:
        who = "; ".join(h.describe() for h in blockers) or "a run that has not recorded itself yet"
        if self.shard is None or not blockers:
            conflict = f"another extraction writes it: {who}"
        elif all(h.shard is None for h in blockers):
            conflict = f"an extraction of the whole store writes it: {who}"
        elif all(h.shard == self.shard for h in blockers):
            conflict = f"shard {self.shard[0]}/{self.shard[1]} is being extracted by another run: {who}"
        else:
            conflict = f"a shard that shares sessions with shard {self.shard[0]}/{self.shard[1]} is being extracted: {who}"
        return (f"feature store {self.root}: {conflict}. One extraction writes a store at a time (the shards of one "
                f"extraction together); {what_now}")
