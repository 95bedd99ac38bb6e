"""The out-of-core frame arrays: the normalised frame cache is built once per identity and shared, never
read for other frames than it was built from, rebuilt when damaged, refused with a clear error when the
disk is too small, never mapped into the process; arrays filled a chunk at a time equal one pass; the
automatic choice between memory and disk."""
from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from empathic_fusion.datamodules import frame_cache
from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule, device_budget, frames_place
from empathic_fusion.datamodules.statistics import covered_sums
from empathic_fusion.datamodules.window_gather import FrameLayout, MemorySink, fill_frames
from empathic_fusion.features.store import FeatureStore
from empathic_fusion.utils import PROJECT_ROOT
from tests.conftest import FEATURES_CFG
from tests.test_window_gather import assert_same

MODALITIES = ["video", "audio", "text"]


def _datamodule(dataset, store, frames="disk", **kwargs) -> FusionDataModule:
    dm = FusionDataModule(str(dataset), str(store), MODALITIES, FEATURES_CFG, batch_size=8, extract_workers=1,
                           frames=frames, **kwargs)
    dm.setup("fit")
    return dm


def _caches(store: Path) -> list[Path]:
    return sorted(p for p in (store / "frame_cache").iterdir() if p.is_dir())


def _every_batch(dm: FusionDataModule) -> dict:
    return {split: data[list(range(len(data)))] for split, data in dm.datasets.items()}


def test_cache_is_built_once_and_read_by_later_runs(tiny_dataset, store_copy, caplog):
    with caplog.at_level(logging.INFO):
        first = _datamodule(tiny_dataset, store_copy)
    assert "writing" in caplog.text
    [cache] = _caches(store_copy)
    meta = json.loads((cache / "meta.json").read_text())
    times = {name: (cache / name).stat().st_mtime_ns for name in meta["files"]}
    caplog.clear()
    with caplog.at_level(logging.INFO):
        second = _datamodule(tiny_dataset, store_copy, seed=7)  # another run of the sweep: same frames
    assert "reused" in caplog.text and "writing" not in caplog.text
    assert _caches(store_copy) == [cache]
    assert {name: (cache / name).stat().st_mtime_ns for name in meta["files"]} == times
    assert_same(_every_batch(first), _every_batch(second))
    memory = _datamodule(tiny_dataset, store_copy, frames="memory")
    assert_same(_every_batch(memory), _every_batch(second))


def test_other_statistics_or_changed_features_get_their_own_cache(tiny_dataset, store_copy):
    _datamodule(tiny_dataset, store_copy)
    _datamodule(tiny_dataset, store_copy, normalize=["video"])  # audio not z-scored: other values
    assert len(_caches(store_copy)) == 2
    store = FeatureStore(store_copy)
    sid = sorted(p.name for p in (store_copy / "sessions").iterdir())[0]
    audio = np.asarray(store.load(sid, "audio", "features")).copy()
    audio[0] += 1.0  # the session's audio is extracted again with other values
    entry = store.manifest(sid)["audio"]
    arrays = {name: np.asarray(store.load(sid, "audio", name)) for name in entry["arrays"]}
    store.write_branch(sid, "audio", {**arrays, "features": audio}, entry["signature"],
                       {k: v for k, v in entry.items() if k not in ("signature", "arrays")})
    changed = _datamodule(tiny_dataset, store_copy)
    assert len(_caches(store_copy)) == 3
    reference = _datamodule(tiny_dataset, store_copy, loader="reference")
    for split in ("train", "val", "test"):
        windows = len(reference.datasets[split])
        assert_same(next(iter(torch.utils.data.DataLoader(reference.datasets[split], batch_size=windows))),
                    changed.datasets[split][list(range(windows))], split)


def test_damaged_cache_is_rebuilt_with_a_warning(tiny_dataset, store_copy, caplog):
    before = _every_batch(_datamodule(tiny_dataset, store_copy))
    [cache] = _caches(store_copy)
    dense = next(cache.glob("dense-video-*.npy"))
    with open(dense, "r+b") as handle:  # bytes overwritten in place: same size, a new modification time
        handle.seek(-64, os.SEEK_END)
        handle.write(b"\x7f" * 64)
    with caplog.at_level(logging.WARNING):
        after = _every_batch(_datamodule(tiny_dataset, store_copy))
    assert f"{dense.name} changed after it was written" in caplog.text
    assert_same(before, after)
    (cache / "mask-audio.npy").unlink()
    with caplog.at_level(logging.WARNING):
        assert_same(before, _every_batch(_datamodule(tiny_dataset, store_copy)))
    assert "mask-audio.npy is missing" in caplog.text
    assert not list((store_copy / "frame_cache").glob(".tmp-*")) and not list((store_copy / "frame_cache").glob(".old-*"))


def test_too_little_disk_space_is_refused_before_writing(tiny_dataset, store_copy, monkeypatch, tmp_path):
    class Usage:
        free = 10 * 2 ** 20

    monkeypatch.setattr(frame_cache.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(frame_cache.FrameCacheSpaceError, match=r"needs .* GB in .* and 0.01 GB are free.*"
                                                               r"data.frame_cache_dir.*data.frames=memory"):
        _datamodule(tiny_dataset, store_copy, frame_cache_dir=str(tmp_path / "cache"))
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]


def test_a_folder_that_cannot_be_written_gets_a_clear_error(tiny_dataset, store_copy, monkeypatch, tmp_path):
    """A read-only store (or another user's folder): the error names the folder and the two ways out."""
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if "frame_cache" in str(self):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(frame_cache.FrameCacheWriteError, match=r"cannot write the frame cache in .*frame_cache "
                                                               r"\(Permission denied.*data.frame_cache_dir.*data.frames=memory"):
        _datamodule(tiny_dataset, store_copy)
    monkeypatch.setattr(Path, "mkdir", real_mkdir)
    memory = _datamodule(tiny_dataset, store_copy, frames="memory")  # the way out the message names
    assert not memory.frames.disk and not (store_copy / "frame_cache").exists()


def test_the_cache_is_read_not_mapped(tiny_dataset, store_copy):
    """Reads go through the page cache without mapping the files, so they never count in the run's memory."""
    dm = _datamodule(tiny_dataset, store_copy)
    data = dm.datasets["train"]
    data[list(range(len(data)))]
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps on this system")
    assert "frame_cache" not in maps.read_text()


def test_concurrent_runs_build_the_cache_once(tiny_dataset, store_copy):
    script = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
              "from tests.test_frame_cache import _datamodule\n"
              f"_datamodule({str(tiny_dataset)!r}, {str(store_copy)!r})\n")
    runs = [subprocess.Popen([sys.executable, "-c", script], cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    logs = [run.communicate(timeout=300)[0] for run in runs]
    assert all(run.returncode == 0 for run in runs), logs
    assert sum("frame cache" in log and "writing" in log for log in logs) == 1, logs
    assert sum("reused" in log for log in logs) == 1, logs
    assert len(_caches(store_copy)) == 1 and not list((store_copy / "frame_cache").glob(".tmp-*"))


def test_filling_a_chunk_at_a_time_equals_one_pass(tiny_dataset, tiny_store):
    dm = FusionDataModule(str(tiny_dataset), str(tiny_store), MODALITIES, FEATURES_CFG, batch_size=8,
                           extract_workers=1, loader="reference")
    dm.setup("fit")
    source = dm.datasets["train"]
    from empathic_fusion.datamodules.window_dataset import FrameSource

    frames = FrameSource(dm.datasets["train"].store, source.branches, source.branch_dims, source.session_frames,
                         source.speaking, source.stats, source.missing)
    layout = FrameLayout.of(frames)
    filled = []
    for chunk in (7, 10 ** 9):
        sink = MemorySink(layout, frames, torch.device("cpu"))
        fill_frames(frames, layout, sink, chunk_rows=chunk)
        filled.append(sink)
    for key in filled[0].tensors:
        assert torch.equal(filled[0].tensors[key], filled[1].tensors[key]), key
    assert all(np.array_equal(filled[0].masks[m], filled[1].masks[m]) for m in MODALITIES)
    store, sid = FeatureStore(tiny_store), next(iter(frames.session_frames))
    covered = np.asarray(store.load(sid, "face", "mask")) > 0
    chunked, whole = covered_sums(store, sid, "face", covered, 5), covered_sums(store, sid, "face", covered, 10 ** 9)
    assert chunked[2] == whole[2] and np.array_equal(chunked[0], whole[0]) and np.array_equal(chunked[1], whole[1])


@pytest.mark.parametrize("place,device,size_gb,expected", [
    ("auto", "cpu", 0.1, ("disk", "cpu")),
    ("auto", "cuda", 1.0, ("memory", "cuda")),
    ("auto", "cuda", 20.0, ("disk", "cpu")),
    ("memory", "cpu", 20.0, ("memory", "cpu")),
    ("memory", "cuda", 20.0, ("memory", "cpu")),
    ("disk", "cuda", 1.0, ("disk", "cpu")),
])
def test_where_the_frames_go(place, device, size_gb, expected):
    chosen, target, why = frames_place(place, torch.device(device), size_gb * 1e9, device_budget(torch.device(device), 8.0))
    assert (chosen, target.type) == expected and why
    if place == "auto" and device == "cuda":
        assert ("exceed" in why) == (size_gb > 8)


def test_dataloader_workers_read_the_cache_in_their_own_processes(tiny_dataset, store_copy):
    reference = _datamodule(tiny_dataset, store_copy, loader="reference")
    disk = _datamodule(tiny_dataset, store_copy, num_workers=2)
    assert disk.frames.disk
    for expected, actual in zip(reference.val_dataloader(), disk.val_dataloader(), strict=True):
        assert_same(expected, actual)
