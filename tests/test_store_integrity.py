"""Store integrity: stale branches are never read, damaged files are named and redone, NaN never enters,
and the store respects the umask (issue: trustworthy results)."""
from __future__ import annotations

import logging
import os
import stat

import numpy as np
import pandas as pd
import pytest

from empathic_fusion.dataset import load_dataset
from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
from empathic_fusion.features.freshness import StaleFeaturesError
from empathic_fusion.features.extract import extract_features
from empathic_fusion.features import frame_rows, store as store_module
from empathic_fusion.features.frame_rows import FrameRows, NpyFile
from empathic_fusion.features.store import FeatureStore, StoreIntegrityError, rows_folder
from tests.conftest import FEATURES_CFG


def _extract(dataset_root, store_root, modalities=("video", "audio", "text"), verify=False):
    return extract_features(load_dataset(dataset_root), FeatureStore(store_root), list(modalities), FEATURES_CFG,
                            workers=1, progress=False, verify=verify)


def _datamodule(dataset, store, modalities=("video", "audio", "text"), **kwargs) -> FusionDataModule:
    dm = FusionDataModule(str(dataset), str(store), list(modalities), FEATURES_CFG, batch_size=8,
                           extract_workers=1, **kwargs)
    dm.setup("fit")
    return dm


def _session(root, i=0) -> str:
    return sorted(pd.read_csv(root / "sessions.csv").session_id)[i]


def test_failed_reextraction_masks_the_stale_branch(dataset_copy, store_copy, caplog):
    sid = _session(dataset_copy)
    intact = _datamodule(dataset_copy, store_copy, ("video", "text"))
    video = dataset_copy / pd.read_csv(dataset_copy / "sessions.csv").set_index("session_id").video[sid]
    video.write_bytes(b"this is not a video" * 100)
    report = _extract(dataset_copy, store_copy, ("video",))
    assert [(f["session_id"], f["branch"]) for f in report.failures] == [(sid, "face")]
    with caplog.at_level(logging.WARNING):
        dm = _datamodule(dataset_copy, store_copy, ("video", "text"))
    message = next(w for w in dm.warnings if f"session '{sid}', branch 'face'" in w)
    assert "stale" in message and "input 'video'" in message and "masked" in message
    assert (sid, "video") in dm.missing
    assert dm.manifest_hash != intact.manifest_hash  # the run records what it actually used
    with pytest.raises(StaleFeaturesError, match=f"session '{sid}', branch 'face'"):
        _datamodule(dataset_copy, store_copy, ("video", "text"), on_stale="error")


def test_dropping_the_audio_column_makes_the_wav_features_stale(dataset_copy, store_copy):
    sessions = pd.read_csv(dataset_copy / "sessions.csv")
    sessions.drop(columns=["audio"]).to_csv(dataset_copy / "sessions.csv", index=False)
    dm = _datamodule(dataset_copy, store_copy, ("audio", "text"))
    stale = [w for w in dm.warnings if "branch 'audio'" in w and "stale" in w]
    assert len(stale) == len(sessions)  # every session now names the video's track: the wav features are not read
    assert dm.missing >= {(s, "audio") for s in dm.windows.session_id}


def test_truncated_array_is_named_on_load_and_redone_alone(dataset_copy, store_copy):
    sid = _session(dataset_copy, 1)
    path = store_copy / "sessions" / sid / "face" / "features.npy"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    store = FeatureStore(store_copy)
    with pytest.raises(StoreIntegrityError, match=f"{path}.*session '{sid}', branch 'face'.*truncated"):
        store.load(sid, "face", "features")
    report = _extract(dataset_copy, store_copy)
    assert report.extracted == [(sid, "face")] and not report.failures
    assert [d["branch"] for d in report.damaged] == ["face"]
    assert path.read_bytes() == data  # byte-identical to the intact extraction


def test_nan_written_in_place_is_found_by_verify_and_named_by_training(dataset_copy, store_copy):
    sid = _session(dataset_copy, 2)
    path = store_copy / "sessions" / sid / "audio" / "features.npy"
    original, written = path.read_bytes(), path.stat()
    array = np.load(path, mmap_mode="r+")
    array[5:40] = np.nan  # same size, valid header: only the contents changed
    array.flush()
    del array
    os.utime(path, ns=(written.st_atime_ns, written.st_mtime_ns))  # damage that keeps size and mtime
    dm = FusionDataModule(str(dataset_copy), str(store_copy), ["audio"], FEATURES_CFG, batch_size=8, extract_workers=1)
    with pytest.raises(StoreIntegrityError, match=f"session '{sid}', branch 'audio'.*NaN"):
        dm.setup("fit")
        for split in ("train", "val", "test"):
            for i in range(len(dm.datasets[split])):
                dm.datasets[split][i]
    assert _extract(dataset_copy, store_copy).extracted == []  # the cheap check cannot see it ...
    report = _extract(dataset_copy, store_copy, verify=True)  # ... verify does, and redoes that branch alone
    assert report.extracted == [(sid, "audio")]
    assert "NaN" in " ".join(report.damaged[0]["problems"]) or "sha256" in " ".join(report.damaged[0]["problems"])
    assert path.read_bytes() == original


def test_finite_garbage_written_in_place_is_found_before_use_and_redone(dataset_copy, store_copy):
    sid = _session(dataset_copy, 3)
    path = store_copy / "sessions" / sid / "face" / "features.npy"
    original = path.read_bytes()
    array = np.load(path, mmap_mode="r+")
    array[:] = np.float16(0.5)  # finite, same size and header: only the modification time tells
    array.flush()
    del array
    with pytest.raises(StoreIntegrityError, match=f"{path}.*session '{sid}', branch 'face'.*modified since it was"):
        FeatureStore(store_copy).load(sid, "face", "features")
    dm = _datamodule(dataset_copy, store_copy, ("video", "text"))
    assert (sid, "video") in dm.missing
    assert any(f"session '{sid}', branch 'face': damaged" in w and "sha256 differs" in w for w in dm.warnings)
    report = _extract(dataset_copy, store_copy, ("video",))
    assert report.extracted == [(sid, "face")] and path.read_bytes() == original


def test_a_touched_intact_array_is_rehashed_once_then_its_time_recorded(dataset_copy, store_copy):
    sid = _session(dataset_copy, 4)
    path = store_copy / "sessions" / sid / "audio" / "mask.npy"
    recorded = FeatureStore(store_copy).entry(sid, "audio")["arrays"]["mask"]["mtime_ns"]
    os.utime(path, ns=(recorded, recorded + 5 * 10**9))  # e.g. a copy that did not keep times
    store = FeatureStore(store_copy)
    assert store.load(sid, "audio", "mask").shape  # same contents: used
    report = _extract(dataset_copy, store_copy, ("audio",))
    assert report.extracted == [] and not report.damaged
    assert FeatureStore(store_copy).entry(sid, "audio")["arrays"]["mask"]["mtime_ns"] == recorded + 5 * 10**9


def test_non_finite_values_never_enter_the_store(tmp_path):
    store = FeatureStore(tmp_path / "store")
    bad = np.ones((4, 3), dtype=np.float32)
    bad[2, 1] = np.inf
    with pytest.raises(StoreIntegrityError, match="session 's1', branch 'audio'.*1 NaN/Inf value.*'features'"):
        store.write_branch("s1", "audio", {"features": bad, "mask": np.ones(4, np.uint8)}, {"v": 1})
    assert store.entry("s1", "audio") is None and not (tmp_path / "store" / "sessions" / "s1" / "audio").exists()


def _written_to_disk(folder, name: str, array: np.ndarray) -> NpyFile:
    """`array` as extraction writes a long session's rows: to a .npy file, row by row."""
    rows = FrameRows(0, array.shape[1:], array.dtype, folder, name, buffer_rows=8)
    for frame, row in enumerate(array):
        rows.put(frame, row)
    return rows.finish(len(array))


def test_a_file_written_while_extracted_is_moved_in_and_recorded_as_an_array_is(tmp_path, monkeypatch):
    monkeypatch.setattr(frame_rows, "SPILL_BYTES", 1)
    monkeypatch.setattr(store_module, "FINITE_CHECK_BYTES", 64)  # the file is checked in many small reads
    store = FeatureStore(tmp_path / "store")
    features = np.random.default_rng(0).standard_normal((50, 7)).astype(np.float16)
    mask = (np.arange(50) % 3 > 0).astype(np.uint8)
    store.write_branch("s0", "face", {"features": features, "mask": mask}, {"v": 1})
    folder = rows_folder(store.owner_dir("s1"))
    handle = _written_to_disk(folder, "face", features)
    store.write_branch("s1", "face", {"features": handle, "mask": mask}, {"v": 1})
    assert not handle.path.exists() and list(folder.iterdir()) == []  # moved, not copied
    ours, theirs = store.entry("s1", "face")["arrays"], store.entry("s0", "face")["arrays"]
    for name in ("features", "mask"):
        assert {k: v for k, v in ours[name].items() if k != "mtime_ns"} == \
            {k: v for k, v in theirs[name].items() if k != "mtime_ns"}  # shape, dtype, bytes and sha256
        assert ours[name]["mtime_ns"] == (store.branch_dir("s1", "face") / f"{name}.npy").stat().st_mtime_ns
    assert np.array_equal(store.load("s1", "face", "features"), features)
    assert store.check_branch("s1", "face", deep=True) == []


def test_a_file_with_non_finite_values_is_refused_and_left_where_it_was(tmp_path, monkeypatch):
    monkeypatch.setattr(frame_rows, "SPILL_BYTES", 1)
    monkeypatch.setattr(store_module, "FINITE_CHECK_BYTES", 64)
    store = FeatureStore(tmp_path / "store")
    features = np.ones((40, 5), dtype=np.float16)
    features[37, 2], features[3, 0] = np.nan, -np.inf  # in the last read and the first
    handle = _written_to_disk(tmp_path / "rows", "cnn", features)
    with pytest.raises(StoreIntegrityError, match="session 's1', branch 'cnn'.* 2 NaN/Inf value.*'features'"):
        store.write_branch("s1", "cnn", {"features": handle, "mask": np.ones(40, np.uint8)}, {"v": 1})
    assert handle.path.exists() and store.entry("s1", "cnn") is None
    assert not store.branch_dir("s1", "cnn").exists()
    wrong = NpyFile(handle.path, (41, 5), np.dtype(np.float16))  # a handle that does not describe its file
    with pytest.raises(StoreIntegrityError, match="is not a .npy file of shape \\[41, 5\\] and dtype float16"):
        store.write_branch("s1", "cnn", {"features": wrong}, {"v": 1})


def test_manifest_records_size_and_hash_and_verify_checks_them(tmp_path):
    store = FeatureStore(tmp_path / "store")
    store.write_branch("s1", "face", {"features": np.arange(12, dtype=np.float16).reshape(4, 3)}, {"v": 1})
    record = store.entry("s1", "face")["arrays"]["features"]
    path = store.branch_dir("s1", "face") / "features.npy"
    assert record["bytes"] == path.stat().st_size and len(record["sha256"]) == 64
    assert record["mtime_ns"] == path.stat().st_mtime_ns
    raw = bytearray(path.read_bytes())
    raw[-2:] = b"\x00\x3c"  # overwrite the last value in place
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(record["mtime_ns"], record["mtime_ns"]))  # keeps size and mtime: only verify sees it
    assert store.check_branch("s1", "face") == [] and store.is_fresh("s1", "face", {"v": 1})
    assert "sha256" in store.check_branch("s1", "face", deep=True)[0]
    os.utime(path, ns=(record["mtime_ns"], record["mtime_ns"] + 10**9))  # a later write: the mtime moved
    assert "modified since it was written; sha256 differs" in store.check_branch("s1", "face")[0]
    path.unlink()
    with pytest.raises(StoreIntegrityError, match="is missing"):
        store.load("s1", "face", "features")


def test_store_respects_the_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        store = FeatureStore(tmp_path / "store")
        store.write_branch("s1", "face", {"features": np.zeros((2, 3), np.float16)}, {"v": 1})
        folder = store.branch_dir("s1", "face")
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755
        assert stat.S_IMODE((folder / "features.npy").stat().st_mode) == 0o644
        assert stat.S_IMODE((store.owner_dir("s1") / "manifest.json").stat().st_mode) == 0o644
    finally:
        os.umask(previous)
