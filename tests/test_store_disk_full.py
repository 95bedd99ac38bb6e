"""A store on a disk without room: too little free space stops extraction before any work, a disk that runs
full while a branch is written stops it with StoreSpaceError naming the store, session, branch and the
space needed and free (nothing half-written recorded, the failure reported), and a rerun after space is
freed completes. A store_dir that is a dangling link (an unmounted drive) or a file gets its own message."""
from __future__ import annotations

import json
import shutil
import wave
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

from empathic_fusion.core.errors import UserError
from empathic_fusion.dataset import load_dataset
from empathic_fusion.features import store as store_module
from empathic_fusion.features.extract import extract_features
from empathic_fusion.features.store import FeatureStore, StoreLocationError, StoreSpaceError
from empathic_fusion.features.store_space import needed_bytes

SESSIONS = ("s0", "s1", "s2")
# the feature config's defaults with audio alone (spawned test processes import this module: no conftest)
AUDIO_CFG = {"audio": {"feature_set": "ComParE_2016"}, "modalities": {"video": ["face"], "audio": ["audio"],
                                                                      "text": ["text"]}}


def write_audio_dataset(root: Path, seconds: float = 2.0) -> Path:
    """A dataset of three audio-only sessions (a tone each, 16 kHz mono wav) with transcripts and ratings."""
    (root / "media").mkdir(parents=True)
    (root / "transcripts").mkdir()
    (root / "dataset.yaml").write_text("name: tones\nfps: 15\n")
    (root / "participants.csv").write_text("participant_id\n" + "".join(f"p{i}\n" for i in range(len(SESSIONS))))
    (root / "sessions.csv").write_text("session_id,participant_id,video,audio\n" + "".join(
        f"{sid},p{i},,media/{sid}.wav\n" for i, sid in enumerate(SESSIONS)))
    (root / "stories.csv").write_text("story_id,text\nst1,My grandmother taught me to bake bread.\n")
    (root / "ratings.csv").write_text("session_id,story_id,empathy\n" + "".join(f"{sid},st1,3\n" for sid in SESSIONS))
    rate = 16000
    for i, sid in enumerate(SESSIONS):
        t = np.arange(int(seconds * rate)) / rate
        with wave.open(str(root / "media" / f"{sid}.wav"), "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(rate)
            out.writeframes((0.3 * np.sin(2 * np.pi * (220 + 110 * i) * t) * 32767).astype("<i2").tobytes())
        (root / "transcripts" / f"{sid}.csv").write_text(
            "start,end,speaker,phase,story_id,text\n0.0,1.5,participant,story_share,,I want to tell you about it.\n")
    return root


def extract_audio(dataset: Path, store: Path, cfg: dict = AUDIO_CFG, **kwargs):
    """The audio branch (and the stories) of the dataset's sessions into the store."""
    return extract_features(load_dataset(dataset, ["audio"]), FeatureStore(store), ["audio"], cfg, progress=False,
                            **kwargs)


@pytest.fixture(scope="module")
def tones(tmp_path_factory) -> Path:
    return write_audio_dataset(tmp_path_factory.mktemp("tones") / "dataset")


def _short_write_on(call: int, monkeypatch) -> list[str]:
    """np.save in the store fails from the `call`-th array on as on a full disk (numpy's short write, errno
    None); returns the names of the files it was asked to write."""
    real_save, calls = np.save, []

    def save(handle, array, *args, **kwargs):
        calls.append(Path(handle.name).name)
        if len(calls) >= call:
            handle.write(b"\x93NUMPY partial")  # a part of the file reaches the disk
            raise OSError(f"{array.nbytes} requested and {array.nbytes // 2} written")
        return real_save(handle, array, *args, **kwargs)

    monkeypatch.setattr(store_module.np, "save", save)
    return calls


def _store_state(store: Path) -> dict[str, bytes]:
    """Every file of the store and its bytes (the extraction lock's own files aside)."""
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*"))
            if p.is_file() and not str(p.relative_to(store)).startswith(".extract")}


@pytest.mark.slow  # extracts (and embeds the stories)
def test_disk_full_while_writing_stops_with_the_branch_named_and_a_rerun_completes(tones, tmp_path, monkeypatch):
    store = tmp_path / "store"
    extract_audio(tones, store, branches=[])  # the stories first: then only the sessions' audio is written below
    before = _store_state(store)
    calls = _short_write_on(4, monkeypatch)  # s0's audio (3 arrays) fits; s1's first array does not
    with pytest.raises(StoreSpaceError) as info:
        extract_audio(tones, store)
    message = str(info.value)
    assert isinstance(info.value, UserError) and isinstance(info.value, OSError)
    assert message.startswith(f"feature store {store}: the disk is full: session 's1', branch 'audio' needs ")
    assert " are free (OSError: " in message and "requested and" in message and "written); nothing of it was kept " \
        "and extraction stopped. Free space on that disk (or set data.store_dir to a larger one) and run " \
        "extract.py again: it keeps every branch already written" in message
    assert len(calls) == 4  # stopped there: s2 was never written
    # s0 is complete and recorded; nothing of s1 is on disk or in a manifest (no temporary folder left)
    assert FeatureStore(store).entry("s0", "audio") is not None
    assert not (store / "sessions" / "s1").exists() or list((store / "sessions" / "s1").iterdir()) == []
    assert not (store / "sessions" / "s2").exists()
    assert not [p for p in store.rglob(".*tmp-*")]
    assert {k: v for k, v in _store_state(store).items() if not k.startswith("sessions/s0/")
            and k not in ("failures.json", "file_hashes.json")} == \
        {k: v for k, v in before.items() if k not in ("failures.json", "file_hashes.json")}
    failures = json.loads((store / "failures.json").read_text())
    assert [(f["session_id"], f["branch"]) for f in failures] == [("s1", "audio")] and failures[0]["error"] == message

    monkeypatch.undo()  # space freed: the rerun writes what is missing and keeps s0
    report = extract_audio(tones, store)
    assert sorted(report.extracted) == [("s1", "audio"), ("s2", "audio")] and not report.failures
    assert ("s0", "audio") in report.up_to_date
    assert json.loads((store / "failures.json").read_text()) == []


def test_disk_full_in_the_manifest_leaves_the_old_record_and_no_files_it_does_not_describe(tmp_path, monkeypatch):
    store = FeatureStore(tmp_path / "store")
    store.write_branch("s1", "audio", {"features": np.ones((4, 3), np.float32)}, {"v": 1})
    manifest = (store.root / "sessions" / "s1" / "manifest.json").read_bytes()

    def full(path, text):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(store_module, "atomic_write_text", full)
    with pytest.raises(StoreSpaceError, match=r"session 's1', branch 'audio' needs .* are free \(OSError: \[Errno 28\] "
                                              r"No space left on device: .*\); its manifest was not updated, its "
                                              r"files were removed and extraction stopped"):
        store.write_branch("s1", "audio", {"features": np.zeros((4, 3), np.float32)}, {"v": 2})
    assert (store.root / "sessions" / "s1" / "manifest.json").read_bytes() == manifest
    assert store.entry("s1", "audio") is None  # recorded files gone: redone by the next run, never read as v1
    assert sorted(p.name for p in (store.root / "sessions" / "s1").iterdir()) == ["manifest.json"]


@pytest.mark.slow  # extracts (and embeds the stories)
def test_too_little_free_space_stops_before_any_work(tones, tmp_path, monkeypatch):
    store = tmp_path / "store"
    extract_audio(tones, store, branches=[])
    before = _store_state(store)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 ** 9, 10 ** 9 - 50_000, 50_000))
    with pytest.raises(StoreSpaceError) as info:
        extract_audio(tones, store)
    assert str(info.value).startswith(f"feature store {store}: extracting 3 branch(es) of 3 session(s) needs about ")
    assert "kB and 50.0 kB are free on its disk; nothing was extracted. Free space there (or set data.store_dir to " \
        "a larger disk) and run extract.py again (how the space is estimated: docs/features.md)" in str(info.value)
    assert {k: v for k, v in _store_state(store).items() if k != "file_hashes.json"} == \
        {k: v for k, v in before.items() if k != "file_hashes.json"}
    monkeypatch.undo()
    assert not extract_audio(tones, store).failures


@pytest.mark.slow  # extracts (and embeds the stories)
def test_the_estimate_covers_what_is_written(tones, tmp_path):
    """The pre-check's estimate is an upper estimate of the store's growth, and not far above it."""
    store = tmp_path / "store"
    extract_audio(tones, store, branches=[])
    dataset = load_dataset(tones, ["audio"])
    estimate = needed_bytes(FeatureStore(store), dataset, {sid: ["audio"] for sid in SESSIONS}, False, AUDIO_CFG)
    extract_audio(tones, store)
    written = sum(p.stat().st_size for sid in SESSIONS for p in (store / "sessions" / sid / "audio").iterdir())
    assert written <= estimate <= written + 3 * 3 * 4096  # the file-system allowance per file on top
    # a branch that is redone replaces its files: it counts only what it grows by (here the allowance)
    redo = needed_bytes(FeatureStore(store), dataset, {sid: ["audio"] for sid in SESSIONS}, False, AUDIO_CFG)
    assert redo == estimate - written


def test_a_dangling_store_link_or_a_file_gets_its_own_message(tmp_path):
    link = tmp_path / "store"
    link.symlink_to(tmp_path / "unmounted" / "store")
    with pytest.raises(StoreLocationError) as info:
        FeatureStore(link)
    assert str(info.value) == (f"feature store folder {link}: {link} is a link to {tmp_path / 'unmounted' / 'store'}, "
                               f"which does not exist (an unmounted drive or a moved folder?); mount or create it, or "
                               f"set data.store_dir to another folder")
    assert isinstance(info.value, UserError) and not (tmp_path / "unmounted").exists()
    inside = tmp_path / "drive"
    inside.symlink_to(tmp_path / "gone")
    with pytest.raises(StoreLocationError, match=r"drive is a link to .*gone, which does not exist"):
        FeatureStore(inside / "features" / "demo")
    (tmp_path / "a_file").write_text("not a folder")
    for path in (tmp_path / "a_file", tmp_path / "a_file" / "store"):
        with pytest.raises(StoreLocationError) as info:
            FeatureStore(path)
        assert str(info.value) == (f"feature store folder {path}: {tmp_path / 'a_file'} is a file, not a folder; "
                                   f"set data.store_dir to a folder (or move the file away)")
