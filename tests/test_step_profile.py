"""The profile's summary counts the device's work only: profiler ranges placed on the device's timeline
(`Optimizer.step#AdamW.step`) are no kernels, and overlapping kernels are busy time once."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from empathic_fusion.utils import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
import step_profile  # noqa: E402

CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


def event(name: str, start: float, end: float, device=CUDA, annotation: bool = False) -> SimpleNamespace:
    return SimpleNamespace(name=name, device_type=device, is_user_annotation=annotation, device_time=end - start,
                           time_range=SimpleNamespace(start=start, end=end))


def test_a_profiler_range_on_the_device_timeline_is_no_kernel():
    events = [event("Optimizer.step#AdamW.step", 0, 100, annotation=True), event("gemm", 10, 20),
              event("aten::mm", 5, 25, device=CPU), event("adamw_kernel", 60, 70)]
    assert [e.name for e in step_profile.device_work(events)] == ["gemm", "adamw_kernel"]


@pytest.mark.parametrize("intervals, busy", [
    ([(0, 10), (20, 30)], 20),            # apart
    ([(0, 10), (5, 15)], 15),             # overlapping (two streams)
    ([(0, 30), (5, 15), (10, 20)], 30),   # nested
    ([(20, 30), (0, 10), (10, 12)], 22),  # unsorted, touching
    ([], 0),
])
def test_busy_time_is_the_union_of_the_kernels_intervals(intervals, busy):
    assert step_profile.busy_us([event("k", a, b) for a, b in intervals]) == busy
