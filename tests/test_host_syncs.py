"""A fusion model's training step through the Trainer makes at most one host sync, the reading of the
logged loss every `log_every_n_steps` steps: counted on the CPU by what would sync on a GPU (ops that read
a device value on the host, copies to the host; benchmarks/host_syncs.py), and by CUDA itself on a GPU."""
from __future__ import annotations

import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from empathic_fusion.utils import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
from host_syncs import HostSyncCounter, SyncsPerStep  # noqa: E402
from train_throughput import SyntheticBatches, fusion_module  # noqa: E402

DIMS = {"video": 16, "audio": 8, "text": 16, "story": 16, "traits": 6}
MODALITIES = ["video", "audio", "text"]


def _steps(name: str, device: str, tmp_path, steps: int = 12) -> list[int]:
    torch.manual_seed(0)
    module = fusion_module(name, MODALITIES, DIMS)
    data = SyntheticBatches(1000, 8, 12, DIMS, pool=2)  # two batches, already on the device, handed out in turn
    data.batches = [{k: ({kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict) else v.to(device))
                     for k, v in b.items()} for b in data.batches]
    counting = SyncsPerStep(device, skip=2)
    trainer = L.Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=1, max_steps=steps, max_epochs=-1,
                        logger=CSVLogger(tmp_path), log_every_n_steps=5, limit_val_batches=0, num_sanity_val_steps=0,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[counting])
    trainer.fit(module, train_dataloaders=DataLoader(data, batch_size=None))
    return counting.counts


@pytest.mark.parametrize("name", ["tfn", "ef_lstm", "lf_lstm", "amer"])
def test_a_training_step_syncs_at_most_once(name, tmp_path):
    counts = _steps(name, "cpu", tmp_path)
    assert len(counts) >= 8 and max(counts) <= 1, counts
    assert sum(counts) <= len(counts) // 5 + 1, counts  # the loss read for the logger, every 5 steps


def test_the_counter_sees_what_would_sync_on_a_gpu():
    x = torch.arange(6.0)
    with HostSyncCounter() as syncs:
        x.sum().item()
        x.nonzero()
        x[x > 2]
        x.tolist()
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))])
        optimizer.param_groups[0]["params"][0].grad = torch.ones(2)
        optimizer.step()  # its step counters live on the host: no sync
    assert syncs.by_op == {"aten::_local_scalar_dense": 1, "aten::nonzero": 1, "aten::index": 1, "Tensor.tolist": 1}


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tfn", "ef_lstm"])
def test_a_training_step_on_the_gpu_syncs_at_most_once(name, tmp_path):
    counts = _steps(name, "cuda", tmp_path)
    assert len(counts) >= 8 and max(counts) <= 1, counts
