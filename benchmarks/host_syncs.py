"""Count the host syncs a stretch of training makes, on a GPU or, as a proxy, on the CPU.

A host sync (the host waiting for the device: `.item()`, `bool(tensor)`, `nonzero`, a copy to the host)
stops the host from queueing the next kernels while the device drains, so a small model's step costs
its launch time plus its run time instead of the larger of the two. On CUDA the driver's own report
counts them (`torch.cuda.set_sync_debug_mode`); on the CPU nothing waits, so `HostSyncCounter` counts
the operations that would: the ATen ops that read a device value on the host, and the Python calls that
copy to it. Reading the optimizer's step counters is not counted: PyTorch keeps them on the host.

    with HostSyncCounter() as syncs:
        ...                      # some training steps
    print(syncs.total, syncs.by_op)

`SyncsPerStep` does the same for each training step of a Trainer (a Lightning callback).
"""
from __future__ import annotations

import collections
import traceback
import warnings
from typing import Any

import lightning as L
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ATen ops whose result size or value the host must read (on a GPU, a device-to-host copy and a wait)
READS_ON_HOST = {"aten::nonzero", "aten::_local_scalar_dense", "aten::masked_select", "aten::is_nonzero",
                 "aten::equal", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
                 "aten::repeat_interleave"}
HOST_STATE = ("/torch/optim/",)  # code that reads host-side tensors (Adam's step counters)
COPIES_TO_HOST = ("cpu", "numpy", "tolist")


def _boolean_index(func: Any, args: tuple) -> bool:
    """x[mask] and x[mask] = v with a bool mask: the mask's nonzero count is read on the host."""
    if func._schema.name not in ("aten::index", "aten::index_put", "aten::index_put_"):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


def _caller() -> str:
    frames = [f for f in traceback.extract_stack()[:-3] if "host_syncs.py" not in f.filename]
    own = [f for f in frames if "/torch/" not in f.filename] or frames
    frame = own[-1]
    return f"{frame.filename.rsplit('/', 2)[-2]}/{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"


class _CpuProxy(TorchDispatchMode):
    def __init__(self, counter: "HostSyncCounter"):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in READS_ON_HOST or _boolean_index(func, args):
            stack = "".join(f.filename for f in traceback.extract_stack()[-12:])
            if not (name == "aten::_local_scalar_dense" and any(part in stack for part in HOST_STATE)):
                self.counter.record(name, _caller())
        return func(*args, **(kwargs or {}))


class HostSyncCounter:
    """Host syncs within a `with` block: CUDA's own report on a GPU (`device="cuda"`), else the CPU proxy
    described above. `total`, `by_op` (what synced) and `by_caller` (where, file:line outside torch)."""

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.by_op: collections.Counter = collections.Counter()
        self.by_caller: collections.Counter = collections.Counter()
        self._mode: _CpuProxy | None = None
        self._patched: dict[str, Any] = {}
        self._warnings: Any = None

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def record(self, what: str, where: str) -> None:
        self.by_op[what] += 1
        self.by_caller[where] += 1

    def __enter__(self) -> "HostSyncCounter":
        if self.device.type == "cuda":
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            return self
        self._mode = _CpuProxy(self)
        self._mode.__enter__()
        for name in COPIES_TO_HOST:  # Python-level copies to the host, which no ATen op shows on the CPU
            original = getattr(torch.Tensor, name)
            self._patched[name] = original

            def counted(tensor, *args, _original=original, _name=name, **kwargs):
                self.record(f"Tensor.{_name}", _caller())
                return _original(tensor, *args, **kwargs)
            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
            for caught in self._caught:
                if "synchroniz" in str(caught.message).lower():
                    self.record("cuda sync", f"{caught.filename.rsplit('/', 1)[-1]}:{caught.lineno}")
            self._warnings.__exit__(*exc)
            return
        for name, original in self._patched.items():
            setattr(torch.Tensor, name, original)
        self._mode.__exit__(*exc)


class SyncsPerStep(L.Callback):
    """Host syncs of each training step, from its batch's start to the next batch's, for `steps` steps (None:
    all) after the first `skip`: `counts` per step and `by_caller` over them all. A step still counted when
    training ends is left out (it would hold the epoch's end)."""

    def __init__(self, device: str | torch.device = "cpu", skip: int = 0, steps: int | None = None):
        self.device, self.skip, self.steps = torch.device(device), skip, steps
        self.counts: list[int] = []
        self.by_caller: collections.Counter = collections.Counter()
        self._counter: HostSyncCounter | None = None

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.counts.append(self._counter.total)
            self.by_caller.update(self._counter.by_caller)
            self._counter = None
        if trainer.global_step >= self.skip and (self.steps is None or len(self.counts) < self.steps):
            self._counter = HostSyncCounter(self.device).__enter__()

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self._counter = None
