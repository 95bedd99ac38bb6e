"""Kernels per training step: every fusion model stays within its recorded budget (benchmarks/kernel_budget.json),
counted on the CPU as they would launch on a GPU (benchmarks/kernel_count.py), and the counter counts what it says."""
from __future__ import annotations

import collections
import json
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from empathic_fusion.models import list_models
from empathic_fusion.utils import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
from kernel_count import BUDGET_FILE, model_kernels, step_kernels, trainable_fusion_models  # noqa: E402

BUDGETS = json.loads(BUDGET_FILE.read_text())["models"]


@pytest.mark.parametrize("name", list_models("fusion"))
def test_a_training_step_launches_no_more_kernels_than_its_budget(name):
    if name not in trainable_fusion_models():
        pytest.skip(f"{name} has nothing to train: no optimizer step")
    if name not in BUDGETS:
        pytest.skip(f"no kernel budget recorded for {name}: python benchmarks/kernel_count.py --record")
    count = model_kernels(name)
    budget = BUDGETS[name]
    grown = {part: (list(got), budget["parts"][part]) for part, got in count.table().items()
             if sum(got) > sum(budget["parts"][part])}
    assert count.total <= budget["total"], (f"{name}: {count.total} kernels per step, budget {budget['total']}; "
                                            f"grown (now, budget): {grown}; ops: {dict(count.by_op)}")


def test_the_counter_counts_launches_per_part_forward_and_backward():
    """A step of norm -> linear -> MSE with fused AdamW: the ops are known one by one."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 2))
    batch = {"x": torch.randn(8, 4), "target": torch.randn(8, 2)}
    count = step_kernels(model, batch, lambda out, b: F.mse_loss(out, b["target"]), forward=lambda b: model(b["x"]),
                         module_parts={nn.BatchNorm1d: "norms"})
    table = count.table()
    assert table["norms"][0] == 2  # native_batch_norm and the running step count (add_); its view and empty left out
    assert dict((op, n) for (part, op), n in count.by_op.items() if part == "net") == {"aten::addmm": 1}
    assert table["loss"] == (1, 2)  # mse_loss; the seed gradient (ones_like) and mse_loss_backward
    assert table["optimizer"] == (2, 0)  # _foreach_add_ of the step counts and _fused_adamw_
    assert table["net"][1] == 3  # the linear's backward: its input's, weight's and bias's gradients
    assert table["norms"][1] == 1  # native_batch_norm_backward (the input needs none: x is data)
    assert count.total == sum(f + b for f, b in table.values())


def test_views_allocations_and_host_reads_are_not_kernels():
    x = torch.randn(4, 4)
    model = nn.Linear(4, 1)
    batch = {"x": x, "target": torch.zeros(4)}

    def forward(b):
        h = b["x"].t().contiguous().t()  # a view, a copy (one kernel), a view
        float(h.sum())  # a reduction (one kernel) read on the host (no kernel)
        torch.empty(3)
        return model(h.view(4, 4)).squeeze(-1)
    count = step_kernels(model, batch, lambda out, b: F.mse_loss(out, b["target"]), forward=forward)
    assert sorted(op for (part, op) in count.by_op if part == "net") == ["aten::addmm", "aten::clone", "aten::sum"]


def test_the_masks_part_holds_the_mask_handling_and_the_lstm_stays_in_the_net():
    """An LSTM encoder's step: zeroing the masked frames and reading each window's last valid state are the
    masks part (the gather and its backward), the LSTM itself is the net."""
    from empathic_fusion.models.components.encoders import MaskedLSTMEncoder

    torch.manual_seed(0)
    encoder = MaskedLSTMEncoder(3, 4)
    mask = torch.arange(5).expand(2, 5) < torch.tensor([[3], [5]])
    batch = {"x": torch.randn(2, 5, 3), "mask": mask, "lengths": mask.sum(1), "target": torch.randn(2, 4)}
    count = step_kernels(encoder, batch, lambda out, b: F.mse_loss(out, b["target"]),
                         forward=lambda b: encoder(b["x"], b["mask"], b["lengths"]))
    ops = collections.defaultdict(set)
    for part, op in count.by_op:
        ops[part].add(op)
    assert {"aten::where", "aten::gather"} <= ops["masks"] and "aten::scatter_add" in ops["masks backward"]
    assert any("rnn" in op or "lstm" in op for op in ops["net"])  # mkldnn_rnn_layer on a CPU, cudnn_rnn on a GPU
    assert not any("rnn" in op or "lstm" in op for op in ops["masks"])
    assert count.table()["masks"] == (count.by_part["masks"], count.by_part["masks backward"])
