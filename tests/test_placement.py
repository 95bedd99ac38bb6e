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
import lightning as L
import pytest
import torch

from empathic_fusion.datamodules.fusion_datamodule import device_budget, frames_place
from empathic_fusion.datamodules.window_gather import FrameArrays
from empathic_fusion.pipeline import build_run
from empathic_fusion.utils import PROJECT_ROOT
from empathic_fusion.compose import compose_config

from tests.conftest import SYNTHETIC_BRANCHES as BRANCHES


def _overrides(store: tuple[Path, Path]) -> list[str]:
    return ["data=empathic_stories", f"data.dataset_dir={store[0]}", f"data.store_dir={store[1]}",
            "data.split_fractions=[0.6,0.2,0.2]", "data.extract_workers=1", "logger=none"]


def _cuda_visible():
    """Lightning and torch report one bf16-capable CUDA device; nothing is allocated on it."""
    return mock.patch.multiple(torch.cuda, is_available=lambda: True, device_count=lambda: 1,
                               is_bf16_supported=lambda *args, **kwargs: True)


def _free_memory(gigabytes: float):
    """torch.cuda.mem_get_info of a GPU with this much free memory."""
    return mock.patch.object(torch.cuda, "mem_get_info", lambda device=None: (gigabytes * 1e9, 80e9))


def test_trainer_gpu_places_the_frame_arrays_in_gpu_memory_in_half_precision(synthetic_store, tmp_path, caplog):
    placed: list[tuple[torch.device, torch.dtype]] = []
    in_memory = FrameArrays.in_memory

    def record(source, device, dtype):  # where and how train.py would put them; built on the CPU here
        placed.append((torch.device(device), dtype))
        return in_memory(source, torch.device("cpu"), dtype)

    cfg = compose_config(["trainer=gpu", "model=tfn", "modality=v+t", *_overrides(synthetic_store)], tmp_path)
    with _cuda_visible(), mock.patch.object(lightning_cuda, "num_cuda_devices", return_value=1), _free_memory(70), \
            mock.patch.object(FrameArrays, "in_memory", staticmethod(record)), caplog.at_level(logging.INFO):
        datamodule, model, trainer = build_run(cfg)
    assert trainer.strategy.root_device == torch.device("cuda", 0)
    assert placed == [(torch.device("cuda", 0), torch.bfloat16)]
    assert datamodule.trainer is trainer
    assert datamodule.frames.tensors["video/face"].dtype == torch.bfloat16
    batch = datamodule.datasets["train"][[0, 1]]
    assert batch["video"]["x"].dtype == torch.float32  # widened as gathered
    messages = [r.getMessage() for r in caplog.records]
    assert any("in bfloat16): in memory on cuda:0" in m and "they fit 50% of the 70.0 GB free on cuda:0" in m
               for m in messages), messages


FULL_CORPUS_FRAMES = 2_860_000  # EmpathicStories++ on the 15 fps clock (benchmarks/grid.py FULL_FRAMES)
PAPER_DENSE_DIMS = 714 + 2048 + 65  # face + CNN frame embeddings + openSMILE (text is an indexed table)


@pytest.mark.parametrize("free_gb,where", [(79.0, "memory"), (11.5, "disk")])
def test_the_full_corpus_is_held_on_an_80_gb_gpu_and_not_on_a_12_gb_one(free_gb, where):
    size = FULL_CORPUS_FRAMES * PAPER_DENSE_DIMS * torch.bfloat16.itemsize  # 16.2 GB (32.3 GB in float32)
    gpu = torch.device("cuda", 0)
    with _free_memory(free_gb):
        place, device, why = frames_place("auto", gpu, size, device_budget(gpu, None))
    assert (place, device) == ((where, gpu) if where == "memory" else (where, torch.device("cpu")))
    assert f"50% of the {free_gb:.1f} GB free on cuda:0" in why
    assert frames_place("auto", gpu, size, device_budget(gpu, 8.0))[0] == "disk"  # an explicit budget wins


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
    from empathic_fusion.demo.generated_table import make_text_table

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
    reference's (held in float32), or its features rounded to bfloat16 (the default); an epoch of training
    batches makes a fixed few host syncs (its order copied to the device, the loader's start), none per batch."""
    from benchmarks.grid import features_config
    from benchmarks.host_syncs import HostSyncCounter
    from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
    from tests.test_window_gather import assert_same

    features = features_config(BRANCHES)

    def datamodule(**kwargs) -> FusionDataModule:
        dm = FusionDataModule(str(synthetic_store[0]), str(synthetic_store[1]), list(features["modalities"]),
                               features, batch_size=8, extract_workers=1, split_fractions=(0.6, 0.2, 0.2), **kwargs)
        dm.setup("fit")
        return dm

    def rounded(batch: dict, dtype: torch.dtype) -> dict:  # the dense arrays' features (text is an indexed table)
        return {k: ({kk: (vv.to(dtype).float() if kk == "x" and k != "text" else vv) for kk, vv in v.items()}
                    if isinstance(v, dict) else v) for k, v in batch.items()}

    reference = datamodule(loader="reference")
    with mock.patch("empathic_fusion.datamodules.fusion_datamodule.FusionDataModule._training_device",
                    lambda self: torch.device("cuda", 0)):
        for dtype in (torch.float32, torch.bfloat16):
            dm = datamodule(device_frames_dtype=str(dtype).replace("torch.", ""))
            assert dm.frames.device.type == "cuda" and not dm.frames.disk
            for expected, actual in zip(reference.val_dataloader(), dm.val_dataloader(), strict=True):
                actual = {k: ({kk: vv.cpu() for kk, vv in v.items()} if isinstance(v, dict) else v.cpu())
                          for k, v in actual.items()}
                assert_same(rounded(expected, dtype) if dtype != torch.float32 else expected, actual)
        loader = dm.train_dataloader()
        with HostSyncCounter("cuda") as syncs:
            batches = sum(1 for _ in loader)
        assert batches > 3 and syncs.total <= 2, dict(syncs.by_caller)


def test_half_precision_frame_arrays_train_to_the_same_metrics(synthetic_store, tmp_path):
    """The arrays as a GPU holds them (bfloat16, widened per batch) against float32, on the CPU: a model trained
    and tested on either predicts the same within the rounding of its inputs."""
    in_memory = FrameArrays.in_memory
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        cfg = compose_config(["trainer=cpu", "model=tfn", "modality=v+a+t", "data.frames=memory", "trainer.max_epochs=2",
                              *_overrides(synthetic_store), f"hydra.run.dir={tmp_path / str(dtype)}"], tmp_path / str(dtype))
        L.seed_everything(0)
        with mock.patch.object(FrameArrays, "in_memory",
                               staticmethod(lambda source, device, _=None, d=dtype: in_memory(source, device, d))):
            datamodule, model, trainer = build_run(cfg)
        assert datamodule.frames.tensors["video/face"].dtype == dtype
        L.seed_everything(0)
        trainer.fit(model, datamodule=datamodule)
        metrics = trainer.test(model, datamodule=datamodule, verbose=False)[0]
        results[dtype] = (model.test_predictions["window_pred"], metrics)
    (full, full_metrics), (half, half_metrics) = results[torch.float32], results[torch.bfloat16]
    assert full.std() > 0 and (full - half).abs().max() <= 1e-3
    assert half_metrics["test/window/mse"] == pytest.approx(full_metrics["test/window/mse"], rel=1e-3)
