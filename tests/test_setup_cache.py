"""A fusion datamodule's set-up kept between the jobs of one multirun (datamodules/setup_cache.py): reused for the
same settings and unchanged files, set up again otherwise, and never kept outside a multirun."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from empathic_fusion.datamodules import setup_cache
from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
from tests.conftest import FEATURES_CFG
from tests.test_window_gather import assert_same


def _set_up(dataset: Path, store: Path, modalities=("audio", "text"), **kwargs) -> FusionDataModule:
    dm = FusionDataModule(str(dataset), str(store), list(modalities), FEATURES_CFG, extract_workers=1,
                           **{"batch_size": 8, **kwargs})
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _every_batch(dm: FusionDataModule) -> dict:
    return {split: data[list(range(len(data)))] for split, data in dm.datasets.items()}


@pytest.fixture(autouse=True)
def _nothing_kept():
    setup_cache.release()
    yield
    setup_cache.release()


def test_a_later_job_of_the_sweep_reuses_the_set_up_and_gets_the_same_batches(tiny_dataset, store_copy, caplog):
    with setup_cache.sweep_scope("sweep-a", "0"):
        first = _set_up(tiny_dataset, store_copy, seed=1)
        expected = _every_batch(first)
    first.datasets["test"] = first.datasets["val"]  # what evaluate.py split=val does to its datamodule
    with setup_cache.sweep_scope("sweep-a", "1"), caplog.at_level(logging.INFO):
        second = _set_up(tiny_dataset, store_copy, seed=2, batch_size=4)  # another seed and batch: same data
    assert "set up by job 0 of this sweep" in caplog.text
    assert second.frames is first.frames and second.stats is first.stats
    assert second.datasets["test"] is not second.datasets["val"]  # a job's own swap stays its own
    assert_same(expected, _every_batch(second))
    assert second.batch_size == 4 and second.seed == 2


def test_changed_files_other_settings_another_sweep_or_no_sweep_set_up_again(tiny_dataset, store_copy, caplog):
    with setup_cache.sweep_scope("sweep-b", "0"):
        first = _set_up(tiny_dataset, store_copy)

    def reused(**kwargs) -> bool:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            dm = _set_up(tiny_dataset, store_copy, **kwargs)
        return dm.frames is first.frames and "set up by job" in caplog.text

    with setup_cache.sweep_scope("sweep-b", "1"):
        assert reused()
        assert not reused(modalities=("text",))  # other data: the kept set-up is released, this one kept
    with setup_cache.sweep_scope("sweep-b", "2"):
        first = _set_up(tiny_dataset, store_copy)
    manifest = next((store_copy / "sessions").glob("*/manifest.json"))
    os.utime(manifest, ns=(manifest.stat().st_atime_ns, manifest.stat().st_mtime_ns + 1_000_000))  # rewritten
    with setup_cache.sweep_scope("sweep-b", "3"):
        assert not reused()
        assert "changed since job 2" in caplog.text
    with setup_cache.sweep_scope("sweep-c", "0"):  # a new multirun in the same process
        assert not reused()
    assert not reused()  # outside a multirun nothing is reused ...
    with setup_cache.sweep_scope("sweep-d", "0"):
        assert not reused()  # ... or kept


def test_the_fingerprint_ignores_what_reading_writes(tiny_dataset, store_copy):
    before = setup_cache.inputs_fingerprint([tiny_dataset, store_copy])
    (store_copy / "frame_cache").mkdir(exist_ok=True)
    (store_copy / "frame_cache" / "x.npy").write_bytes(b"0")
    (store_copy / "file_hashes.json").write_text("{}")
    assert setup_cache.inputs_fingerprint([tiny_dataset, store_copy]) == before
    (store_copy / "failures.json").write_text("[]")
    assert setup_cache.inputs_fingerprint([tiny_dataset, store_copy]) != before
