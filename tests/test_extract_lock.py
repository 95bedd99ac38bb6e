"""One extraction writes a store at a time: a second waits or fails naming the first (pid, host, start time,
command), shards of one extraction run together while a second run of a shard or an overlapping shard is
refused, a killed holder's lock is taken over with a note, and no writer removes a running writer's
temporary folders. Two extractions started at once on one store extract each branch once."""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from empathic_fusion.config import ExtractRunConfig
from empathic_fusion.config.checks import ConfigError
from empathic_fusion.core.errors import UserError
from empathic_fusion.features.store import FeatureStore, rows_folder
from empathic_fusion.features.store_lock import HOLDER, HOST, ExtractionLock, StoreLockError, shards_overlap
from tests.test_store_disk_full import AUDIO_CFG, SESSIONS, extract_audio, write_audio_dataset

SPAWN = multiprocessing.get_context("spawn")


def _hold(root: str, shard: tuple[int, int] | None, ready, release) -> None:
    """Child process: hold the store's extraction lock until `release` is set."""
    with FeatureStore(root).writing(shard):
        ready.set()
        release.wait(120)


def _idle(ready, release) -> None:
    ready.set()
    release.wait(120)


def _extract(dataset: str, store: str, results) -> None:
    report = extract_audio(Path(dataset), Path(store))
    results.put({"pid": os.getpid(), "extracted": report.extracted, "failures": report.failures})


class Child:
    """A spawned process that runs `target(*args, ready, release)` until released."""

    def __init__(self, target, *args):
        self.ready, self.release = SPAWN.Event(), SPAWN.Event()
        self.process = SPAWN.Process(target=target, args=(*args, self.ready, self.release), daemon=True)
        self.process.start()
        assert self.ready.wait(120), "the child process did not start"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        self.release.set()
        self.process.join(60)


@pytest.fixture
def child_holding(tmp_path):
    children = []

    def start(shard=None, root=None):
        child = Child(_hold, str(root or tmp_path / "store"), shard)
        children.append(child)
        return child

    yield start
    for child in children:
        child.stop()


@pytest.fixture(scope="module")
def tones_store(tmp_path_factory) -> tuple[Path, Path]:
    """The tone dataset and a store with its stories and audio extracted (copy it before writing)."""
    root = tmp_path_factory.mktemp("tones")
    dataset, store = write_audio_dataset(root / "dataset"), root / "store"
    extract_audio(dataset, store)
    return dataset, store


def _refused(root: Path, shard=None) -> str:
    with pytest.raises(StoreLockError) as info:
        ExtractionLock(root, shard, "fail").acquire()
    assert isinstance(info.value, UserError)
    return str(info.value)


def test_a_second_extraction_fails_naming_the_first(tmp_path, child_holding):
    root = tmp_path / "store"
    holder = child_holding()
    message = _refused(root)
    assert message.startswith(f"feature store {root}: another extraction writes it: pid {holder.pid} on host {HOST}, "
                              f"started 20")
    assert ", command `" in message and message.endswith(
        "`. One extraction writes a store at a time (the shards of one extraction together); wait for it to end "
        "(lock=wait waits for it), or stop that process if it hangs")
    holder.stop()
    with ExtractionLock(root, None, "fail") as lock:  # free again once the first has ended
        assert lock.held and lock.waited == 0


def test_a_second_extraction_waits_reporting_the_first(tmp_path, child_holding, caplog):
    root = tmp_path / "store"
    holder = child_holding()
    caplog.set_level(logging.WARNING)
    with pytest.raises(StoreLockError, match=rf"pid {holder.pid} on host .*; gave up after waiting 0 s "
                                             rf"\(lock_timeout=0.3\); run again when it has ended"):
        ExtractionLock(root, None, "wait", timeout=0.3, poll_seconds=0.05).acquire()
    assert f"another extraction writes it: pid {holder.pid}" in caplog.text
    assert "waiting for it to end (at most lock_timeout=0.3 s; waited 0 s so far)" in caplog.text
    caplog.clear()
    threading.Timer(0.5, holder.release.set).start()
    with ExtractionLock(root, None, "wait", poll_seconds=0.05) as lock:
        assert lock.waited >= 0.4
    assert "waiting for it to end (no time limit" in caplog.text
    assert "the other extraction ended; this one goes on after waiting" in caplog.text


def test_shards_run_together_and_a_second_run_of_a_shard_or_an_overlapping_shard_is_refused(tmp_path, child_holding):
    root = tmp_path / "store"
    holder = child_holding((0, 2))
    for other in ((1, 2), (1, 4), (3, 4)):  # no session in common with shard 0/2
        with ExtractionLock(root, other, "fail"):
            pass
    assert f"shard 0/2 is being extracted by another run: shard 0/2, pid {holder.pid} on host {HOST}" in \
        _refused(root, (0, 2))
    assert f"a shard that shares sessions with shard 2/4 is being extracted: shard 0/2, pid {holder.pid}" in \
        _refused(root, (2, 4))
    assert f"another extraction writes it: shard 0/2, pid {holder.pid}" in _refused(root)
    with ExtractionLock(root, (1, 2), "fail"):  # an unsharded run is refused by every shard that runs
        message = _refused(root)
        assert f"shard 0/2, pid {holder.pid}" in message and f"shard 1/2, pid {os.getpid()}" in message
    holder.stop()
    with ExtractionLock(root, None, "fail"):  # and a shard by an unsharded run
        assert f"an extraction of the whole store writes it: pid {os.getpid()}" in _refused(root, (1, 2))
    assert [shards_overlap((i, 4), (0, 2)) for i in range(4)] == [True, False, True, False]
    assert shards_overlap((3, 16), (3, 8)) and not shards_overlap((3, 16), (4, 8)) and shards_overlap(None, (1, 5))


def _records(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob(f"{HOLDER}*"))


def test_a_killed_holders_lock_is_taken_over_with_a_note(tmp_path, caplog):
    root = tmp_path / "store"
    holder = Child(_hold, str(root), None)
    holder.process.kill()  # no chance to give the lock back: the OS releases it, its record stays
    holder.process.join(60)
    assert (root / f"{HOLDER}{HOST}-{holder.pid}.json").exists()
    caplog.set_level(logging.WARNING)
    with ExtractionLock(root, None, "fail"):
        assert _records(root) == [f"{HOLDER}{HOST}-{os.getpid()}.json"]
    assert f"the extraction lock was held by pid {holder.pid} on host {HOST}, started " in caplog.text
    assert "which ended without giving it back (killed or crashed); taken over" in caplog.text
    assert not _records(root)  # released: this run's record is gone too

    # a shard takes over a dead shard's record of this host, and keeps a live one's
    caplog.clear()
    live = Child(_hold, str(root), (1, 4))
    record = {"pid": holder.pid, "host": HOST, "started": "2025-01-01T00:00:00+00:00", "command": "extract.py",
              "shard": [0, 2]}
    (root / f"{HOLDER}{HOST}-{holder.pid}-shard0of2.json").write_text(json.dumps(record))
    try:
        with ExtractionLock(root, (3, 4), "fail"):
            assert _records(root) == sorted([f"{HOLDER}{HOST}-{live.pid}-shard1of4.json",
                                             f"{HOLDER}{HOST}-{os.getpid()}-shard3of4.json"])
    finally:
        live.stop()
    assert f"the extraction lock was held by shard 0/2, pid {holder.pid} on host {HOST}" in caplog.text


def _dead_pid() -> int:
    process = SPAWN.Process(target=os.getpid)
    process.start()
    process.join(60)
    return process.pid


def test_write_branch_never_removes_a_running_writers_temporary_folder(tmp_path):
    store = FeatureStore(tmp_path / "store")
    folder = store.owner_dir("s1")
    dead = _dead_pid()
    running = Child(_idle)
    try:
        names = {"running": f".audio.tmp-{running.pid}-k2j4@{HOST}", "dead": f".audio.tmp-{dead}-x8s1@{HOST}",
                 "dead_old": f".audio.old-{dead}@{HOST}", "other_host": ".audio.tmp-77-p0q1@node-17.cluster",
                 "unnamed": ".audio.tmp-h4ks92f1", "other_branch": f".text.tmp-{dead}-x8s1@{HOST}"}
        for name in names.values():
            (folder / name).mkdir(parents=True)
            (folder / name / "features.npy").write_bytes(b"part of an array")
        store.write_branch("s1", "audio", {"features": np.ones((3, 2), np.float32)}, {"v": 1})
        left = {key for key, name in names.items() if (folder / name).exists()}
        # a running writer's, another host's and an unnamed folder stay: who wrote them cannot be told
        assert left == {"running", "other_host", "unnamed", "other_branch"}
        with store.writing():  # holding the store's lock: no other writer can be at work, except this host's running one
            store.write_branch("s1", "audio", {"features": np.zeros((3, 2), np.float32)}, {"v": 2})
        assert {key for key, name in names.items() if (folder / name).exists()} == {"running", "other_branch"}
        assert (folder / names["running"] / "features.npy").read_bytes() == b"part of an array"
        assert np.array_equal(store.load("s1", "audio", "features"), np.zeros((3, 2), np.float32))
        assert not [p for p in folder.iterdir() if p.name.startswith(".audio.") and str(os.getpid()) in p.name]
    finally:
        running.stop()


def test_a_killed_extractions_rows_folder_goes_with_the_next_write_and_a_running_ones_stays(tmp_path):
    """The rows a long session's extraction writes while it runs (store.rows_folder) are leftovers like a
    temporary branch folder once their process is gone; this process's own are in use and stay."""
    store = FeatureStore(tmp_path / "store")
    folder = store.owner_dir("s1")
    dead = _dead_pid()
    running = Child(_idle)
    try:
        names = {"dead": f".rows.tmp-{dead}-a1b2@{HOST}", "running": f".rows.tmp-{running.pid}-c3d4@{HOST}",
                 "mine": rows_folder(folder).name, "other_host": ".rows.tmp-77-e5f6@node-17.cluster"}
        assert names["mine"].startswith(f".rows.tmp-{os.getpid()}-") and names["mine"].endswith(f"@{HOST}")
        for name in names.values():
            (folder / name).mkdir(parents=True)
            (folder / name / "face.npy").write_bytes(b"rows of a long session")
        store.write_branch("s1", "audio", {"features": np.ones((3, 2), np.float32)}, {"v": 1})
        assert {key for key, name in names.items() if (folder / name).exists()} == {"running", "mine", "other_host"}
        with store.writing():  # no other writer can be at work, except this host's running one
            store.write_branch("s1", "face", {"features": np.ones((3, 2), np.float16)}, {"v": 1})
        assert {key for key, name in names.items() if (folder / name).exists()} == {"running", "mine"}
    finally:
        running.stop()


@pytest.mark.slow  # extracts (and embeds the stories)
def test_extraction_locks_only_to_write(tones_store, tmp_path, child_holding):
    """A run with nothing to write never takes the lock; one with work fails (lock=fail) or gives up after
    lock_timeout, having written nothing."""
    dataset, store = tones_store[0], Path(shutil.copytree(tones_store[1], tmp_path / "store"))
    manifests = {sid: (store / "sessions" / sid / "manifest.json").read_bytes() for sid in SESSIONS}
    holder = child_holding(None, store)
    report = extract_audio(dataset, store, lock="fail")  # up to date: read without the lock
    assert not report.extracted and len(report.up_to_date) == len(SESSIONS) + 1
    other = {**AUDIO_CFG, "audio": {"feature_set": "eGeMAPSv02"}}  # every session's audio to redo
    with pytest.raises(StoreLockError, match=f"another extraction writes it: pid {holder.pid}"):
        extract_audio(dataset, store, cfg=other, lock="fail")
    with pytest.raises(StoreLockError, match=r"gave up after waiting \d+ s \(lock_timeout=0.2\)"):
        extract_audio(dataset, store, cfg=other, lock_timeout=0.2)
    assert {sid: (store / "sessions" / sid / "manifest.json").read_bytes() for sid in SESSIONS} == manifests
    holder.stop()
    assert len(extract_audio(dataset, store, cfg=other, lock="fail").extracted) == len(SESSIONS)


@pytest.mark.slow  # extracts (and embeds the stories)
def test_two_extractions_at_once_extract_each_branch_once(tones_store, tmp_path):
    dataset, store = tones_store[0], Path(shutil.copytree(tones_store[1], tmp_path / "store"))
    for sid in SESSIONS:  # the sessions' audio to redo; the stories stay
        shutil.rmtree(store / "sessions" / sid)
    results = SPAWN.Queue()
    runs = [SPAWN.Process(target=_extract, args=(str(dataset), str(store), results)) for _ in range(2)]
    for run in runs:
        run.start()
    reports = [results.get(timeout=240) for _ in runs]
    for run in runs:
        run.join(60)
    assert [r["failures"] for r in reports] == [[], []]
    extracted = sorted(tuple(branch) for r in reports for branch in r["extracted"])
    assert extracted == [(sid, "audio") for sid in SESSIONS]  # each once, by whichever run took the lock first
    assert not [p for p in store.rglob(".*tmp-*")] and not _records(store)


def test_lock_settings_are_checked():
    with pytest.raises(ConfigError, match="lock=sometimes: must be wait or fail"):
        ExtractRunConfig(workers=1, lock="sometimes")
    with pytest.raises(ConfigError, match=r"lock_timeout=-1: must be null \(wait until it ends\) or a number of "
                                          r"seconds >= 0"):
        ExtractRunConfig(workers=1, lock_timeout=-1)
    default = ExtractRunConfig(workers=1)
    assert (default.lock, default.lock_timeout) == ("wait", None)
