"""Frame arrays go where the run trains: train.py and evaluate.py attach their trainer to the datamodule
before its setup, so `data.frames=auto` keeps them in a GPU's memory under `trainer=gpu`.

The CPU test mocks CUDA's availability (Lightning then builds a CUDA trainer without touching a GPU) and
records where the arrays would be placed; the gpu-marked test runs train.py on a real GPU."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import lightning.fabric.accelerators.cuda as lightning_cuda
import pytest
import torch

from empathic_fusion.datamodules.window_gather import FrameArrays
from empathic_fusion.pipeline import build_run
from empathic_fusion.utils import PROJECT_ROOT
from empathic_fusion.utils.compose import compose_config

sys.path.insert(0, str(PROJECT_ROOT))
from benchmarks.grid import write_synthetic  # noqa: E402

BRANCHES = {"face": 24, "audio": 8, "text": 384}


@pytest.fixture(scope="module")
def synthetic_store(tmp_path_factory) -> tuple[Path, Path]:
    """A dataset in the contract's layout with a filled store in the real format (no media to extract)."""
    root = tmp_path_factory.mktemp("synthetic")
    write_synthetic(root, 0.002, 10, BRANCHES)
    return root / "dataset", root / "store"


def _overrides(store: tuple[Path, Path]) -> list[str]:
    return ["data=empathic_stories", f"data.dataset_dir={store[0]}", f"data.store_dir={store[1]}",
            "data.split_fractions=[0.6,0.2,0.2]", "data.extract_workers=1", "logger=none"]


def _cuda_visible():
    """Lightning and torch report one bf16-capable CUDA device; nothing is allocated on it."""
    return mock.patch.multiple(torch.cuda, is_available=lambda: True, device_count=lambda: 1,
                               is_bf16_supported=lambda *args, **kwargs: True)


def test_trainer_gpu_places_the_frame_arrays_in_gpu_memory(synthetic_store, tmp_path, caplog):
    placed: list[torch.device] = []
    in_memory = FrameArrays.in_memory

    def record(source, device):  # where train.py would put them; built on the CPU here
        placed.append(torch.device(device))
        return in_memory(source, torch.device("cpu"))

    cfg = compose_config(["trainer=gpu", "model=tfn", "modality=v+t", *_overrides(synthetic_store)], tmp_path)
    with _cuda_visible(), mock.patch.object(lightning_cuda, "num_cuda_devices", return_value=1), \
            mock.patch.object(FrameArrays, "in_memory", staticmethod(record)), caplog.at_level(logging.INFO):
        datamodule, model, trainer = build_run(cfg)
    assert trainer.strategy.root_device == torch.device("cuda", 0)
    assert placed == [torch.device("cuda", 0)]
    assert datamodule.trainer is trainer
    assert any("in memory on cuda:0" in r.getMessage() and "they fit data.device_memory_gb" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_trainer_cpu_reads_the_frame_arrays_out_of_core(synthetic_store, tmp_path, caplog):
    cfg = compose_config(["trainer=cpu", "model=tfn", "modality=v+t", *_overrides(synthetic_store)], tmp_path)
    with caplog.at_level(logging.INFO):
        datamodule, _, _ = build_run(cfg)
    assert datamodule.frames.device == torch.device("cpu") and datamodule.frames.where
    assert any("out of core" in r.getMessage() and "training on the CPU" in r.getMessage() for r in caplog.records)


def test_a_text_run_encodes_its_table_on_the_device_it_trains_on(tmp_path):
    """The frozen encoder is kept outside the module's children (no weights in checkpoints), so Lightning
    never moves it, and the module's `setup` (where the table is encoded) runs before the module moves:
    under trainer=gpu the table was encoded on the CPU. The encoder now goes to the trainer's device first."""
    from empathic_fusion.core.sentence_encoder import SentenceEncoder
    from empathic_fusion.models.text_module import attach_encoder
    from empathic_fusion.text.synthetic import make_text_table

    make_text_table(12, 2, seed=0).to_csv(tmp_path / "table.csv", index=False)
    cfg = compose_config(["trainer=gpu", "data=text_csv", "model=text_regressor", "modality=t",
                          f"data.path={tmp_path / 'table.csv'}", "data.text_columns=[text]",
                          "data.label_columns=[emotional]", "data.cv_folds=3", "model.net.encoder.cache_dir=null",
                          "logger=none"], tmp_path / "out")
    calls: list[tuple[str, object]] = []
    with _cuda_visible(), mock.patch.object(lightning_cuda, "num_cuda_devices", return_value=1):
        datamodule, model, trainer = build_run(cfg)
        model.trainer = trainer
        with mock.patch.object(SentenceEncoder, "to", lambda self, device: calls.append(("to", device)) or self), \
                mock.patch.object(SentenceEncoder, "warm", lambda self, texts: calls.append(("warm", len(texts)))):
            attach_encoder(model, datamodule)  # what the module's setup does with the trainer's datamodule
    assert calls[0] == ("to", torch.device("cuda", 0)) and calls[1][0] == "warm", calls
    assert datamodule.embedder is model.frozen_encoder


@pytest.mark.gpu
def test_train_py_on_the_gpu_keeps_the_frame_arrays_in_gpu_memory(synthetic_store, tmp_path):
    # debug options train on the CPU (debug/default.yaml) unless told otherwise
    done = subprocess.run([sys.executable, "train.py", "trainer=gpu", "debug=limit", "trainer.accelerator=gpu",
                           "model=tfn", "modality=v+t", *_overrides(synthetic_store), f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "in memory on cuda:0" in log, log[-4000:]
    assert (tmp_path / "run" / "test_metrics.json").is_file()


@pytest.mark.gpu
def test_frames_in_gpu_memory_equal_the_reference_and_load_without_host_syncs(synthetic_store):
    """`auto` on a GPU: the arrays are filled onto the device a chunk at a time; batches equal the per-window
    reference's; an epoch of training batches makes a fixed few host syncs (its order copied to the device,
    the loader's start), none per batch."""
    from benchmarks.grid import features_config
    from benchmarks.host_syncs import HostSyncCounter
    from empathic_fusion.datamodules.empathy_datamodule import EmpathyDataModule
    from tests.test_window_gather import assert_same

    features = features_config(BRANCHES)

    def datamodule(**kwargs) -> EmpathyDataModule:
        dm = EmpathyDataModule(str(synthetic_store[0]), str(synthetic_store[1]), list(features["modalities"]),
                               features, batch_size=8, extract_workers=1, split_fractions=(0.6, 0.2, 0.2), **kwargs)
        dm.setup("fit")
        return dm

    reference = datamodule(loader="reference")
    with mock.patch("empathic_fusion.datamodules.empathy_datamodule.EmpathyDataModule._training_device",
                    lambda self: torch.device("cuda", 0)):
        dm = datamodule()
        assert dm.frames.device.type == "cuda" and not dm.frames.disk
        for expected, actual in zip(reference.val_dataloader(), dm.val_dataloader(), strict=True):
            assert_same(expected, {k: ({kk: vv.cpu() for kk, vv in v.items()} if isinstance(v, dict) else v.cpu())
                                   for k, v in actual.items()})
        loader = dm.train_dataloader()
        with HostSyncCounter("cuda") as syncs:
            batches = sum(1 for _ in loader)
        assert batches > 3 and syncs.total <= 2, dict(syncs.by_caller)
