"""Kernels one training step launches, counted on the CPU, per part of the model.

On a GPU a small fusion model's step is bound by kernel launches (about 25 us each on an H100,
whatever the kernel computes), so the number of kernels a step launches predicts its eager speed,
and that number can be counted on any machine: `KernelCount` counts the ATen ops that run (through
`TorchDispatchMode`, below autograd, so the backward's ops are seen too) and leaves out what launches
nothing on a GPU: views (which relabel memory), allocations (`empty`), reads of a value on the host
(`item()`), Python numbers wrapped as tensors for an op (a kernel argument on a GPU) and ops that write
no tensor. One `_foreach_*` op counts once (one multi-tensor launch).

Each op is put in a part of the step: the forward's ops by the code that called them (the masked
norms, the other costs of the masks, the head, the rest of the net; for a model of another project,
by its modules: BatchNorm is a norm, the output layer the head), the backward's by the forward part whose autograd node runs them,
the loss, and the optimizer. `step_kernels` runs one training step the way it runs on a GPU (AdamW
fused, `zero_grad(set_to_none=True)`) and returns the counts:

    counts = step_kernels(module, batch, lambda out, b: F.mse_loss(out, b["target"]))
    counts.total, counts.table()   # e.g. {"net": (40, 21), "masks": (6, 3), "norms": (9, 8), ...}: forward, backward

    python benchmarks/kernel_count.py            # every fusion model's counts, per part
    python benchmarks/kernel_count.py --record   # and write them as the budgets the test holds

tests/test_kernel_budget.py holds every model under its budget (benchmarks/kernel_budget.json);
benchmarks/models_vs_mmsa.py prints the counts beside MMSA's nets, counted the same way.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PARTS = ("net", "masks", "norms", "head", "loss", "optimizer")
ALLOCATIONS = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
               "aten::new_empty_strided", "aten::empty.memory_format"}
HOST_READS = {"aten::_local_scalar_dense", "aten::item"}
# a Python number made a tensor on the host for an op (`torch.where(mask, x, 0.0)`): a kernel argument on a GPU
WRAPPED_NUMBERS = {"aten::scalar_tensor"}
# views whose schema does not say so (autograd treats the result as new), and no-ops
UNMARKED_VIEWS = {"aten::_unsafe_view", "aten::lift_fresh"}
# the code that makes each forward part of our models, by (file, function); the rest of a net is "net". "masks" is
# what the masks cost outside the norms: pooling over the valid frames (the means themselves included), zeroing
# masked frames and reading an LSTM's state at each window's last valid frame (MMSA's nets have no masks)
OUR_PARTS = {("norm.py", None): "norms", ("heads.py", None): "head", ("pooling.py", None): "masks",
             ("encoders.py", "masked"): "masks", ("encoders.py", "masked_time_major"): "masks",
             ("encoders.py", "last_valid_state"): "masks", ("encoders.py", "longest_lengths"): "masks"}


def launches_a_kernel(func: Any) -> bool:
    """Whether an ATen op launches work on a GPU: it writes a tensor (returns a new one, or changes one in place,
    as the optimizer's fused step does) and is not a view, an allocation or a read of a value on the host."""
    schema = func._schema
    if schema.name in ALLOCATIONS | HOST_READS | WRAPPED_NUMBERS | UNMARKED_VIEWS or schema.name.startswith("profiler::"):
        return False
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return True  # in place (its return, if any, is the argument itself)
    tensors = [r for r in schema.returns if "Tensor" in str(r.type)]
    return bool(tensors) and tensors[0].alias_info is None


class KernelCount(TorchDispatchMode):
    """Kernel-launching ATen ops inside the `with` block, by `part` (set by the caller or by `_Parts`) and by op."""

    def __init__(self):
        super().__init__()
        self.part = "net"
        self.by_part: collections.Counter = collections.Counter()
        self.by_op: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if launches_a_kernel(func):
            self.by_part[self.part] += 1
            self.by_op[(self.part, func._schema.name)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_part.values())

    def table(self) -> dict[str, tuple[int, int]]:
        """(forward, backward) kernels of every part; the optimizer's in the forward slot."""
        return {part: (self.by_part[part], self.by_part[f"{part} backward"]) for part in PARTS}

    def backward_total(self) -> int:
        return sum(n for part, n in self.by_part.items() if part.endswith(" backward"))


def _frame_part(rules: dict[tuple[str, str | None], str], depth: int) -> str | None:
    """The part of the innermost calling frame that a rule names (file name, and function or None for any)."""
    frame = sys._getframe(depth)
    while frame is not None:
        name = frame.f_code.co_filename.rsplit("/", 1)[-1]
        for (file, function), part in rules.items():
            if name == file and function in (None, frame.f_code.co_name):
                return part
        frame = frame.f_back
    return None


class _Parts(TorchFunctionMode):
    """Labels the forward: sets the counter's part for each torch call (a module hook's label first, then
    the calling code's) and tags the autograd nodes the call made, so that the backward's ops are counted
    in the part whose forward made them."""

    def __init__(self, counter: KernelCount, rules: dict[tuple[str, str | None], str]):
        super().__init__()
        self.counter, self.rules = counter, rules
        self.module_parts: list[str] = []

    def enter(self, part: str) -> None:
        self.module_parts.append(part)

    def leave(self) -> None:
        self.module_parts.pop()

    def part_here(self) -> str:
        return (self.module_parts[-1] if self.module_parts else None) or _frame_part(self.rules, 3) or "net"

    def __torch_function__(self, func, types, args=(), kwargs=None):
        part = self.part_here()
        self.counter.part = part
        out = func(*args, **(kwargs or {}))
        for tensor in _tensors(out):
            _tag(tensor.grad_fn, part)
        self.counter.part = "net"
        return out


class _FunctionParts:
    """While counting, an autograd.Function's outputs are tagged with the part of the code that applied it
    (`Function.apply` does not pass through the torch-function mode)."""

    def __init__(self, parts: _Parts):
        self.parts = parts
        self.original = torch.autograd.Function.__dict__["apply"]

    def __enter__(self) -> None:
        original, parts = self.original, self.parts

        def apply(cls, *args, **kwargs):
            out = original.__func__(cls, *args, **kwargs)
            for tensor in _tensors(out):
                _tag(tensor.grad_fn, parts.part_here())
            return out
        torch.autograd.Function.apply = classmethod(apply)

    def __exit__(self, *exc: Any) -> None:
        torch.autograd.Function.apply = self.original


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


def _tag(node: Any, part: str) -> None:
    """Tag an autograd node and the untagged nodes behind it (made by the same call) with `part`."""
    stack = [node]
    while stack:
        node = stack.pop()
        if node is None or "kernel_part" in node.metadata:
            continue
        node.metadata["kernel_part"] = part
        stack.extend(next_node for next_node, _ in node.next_functions)


def _label_backward(root: Any, counter: KernelCount) -> None:
    """Before each node of the graph runs in the backward, set the counter's part to its forward's."""
    seen, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        part = node.metadata.get("kernel_part", "net")

        def label(grad_outputs, _part=part):
            counter.part = f"{_part} backward"
        node.register_prehook(label)
        stack.extend(next_node for next_node, _ in node.next_functions)


def step_kernels(model: nn.Module, batch: Any, loss_fn: Callable[[torch.Tensor, Any], torch.Tensor],
                 forward: Callable[[Any], torch.Tensor] | None = None,
                 module_parts: dict[type | nn.Module, str] | None = None,
                 rules: dict[tuple[str, str | None], str] | None = None,
                 optimizer: torch.optim.Optimizer | None = None) -> KernelCount:
    """The kernels of one training step of `model` on `batch`: forward (`forward(batch)`, default `model(batch)`),
    `loss_fn(output, batch)`, backward and the optimizer's step (AdamW fused, as on a GPU, unless one is given).
    `module_parts` labels the forward of these modules, or of modules of these types (e.g. {nn.BatchNorm1d: "norms"}), `rules` the
    forward of code in these files (default: our norms and heads). A first step runs uncounted, so the count
    is a steady step's (the optimizer's state exists)."""
    optimizer = optimizer or torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4,
                                               fused=True)
    forward = forward or model
    rules = OUR_PARTS if rules is None else rules
    hooks = []

    def step(counter: KernelCount | None) -> None:
        optimizer.zero_grad(set_to_none=True)
        if counter is None:
            loss_fn(forward(batch), batch).backward()
            optimizer.step()
            return
        with _Parts(counter, rules) as parts, _FunctionParts(parts):
            for module in model.modules():
                part = next((p for kind, p in (module_parts or {}).items()
                             if kind is module or (isinstance(kind, type) and isinstance(module, kind))), None)
                if part is not None:
                    hooks.append(module.register_forward_pre_hook(lambda *_, _p=part: parts.enter(_p)))
                    hooks.append(module.register_forward_hook(lambda *_: parts.leave()))
            output = forward(batch)
            parts.rules = {}
            parts.module_parts = ["loss"]
            loss = loss_fn(output, batch)
        for hook in hooks:
            hook.remove()
        _label_backward(loss.grad_fn, counter)
        counter.part = "loss backward"  # the seed gradient
        loss.backward()
        counter.part = "optimizer"
        optimizer.step()

    step(None)
    counter = KernelCount()
    with counter:
        step(counter)
    return counter


# ---- the budget: every fusion model's step at the paper's dims, as conf/model configures it --------------
BUDGET_FILE = Path(__file__).resolve().parent / "kernel_budget.json"
PAPER_DIMS = {"video": 2762, "audio": 65, "text": 384, "story": 384, "traits": 6}
COUNT_BATCH = {"batch_size": 8, "frames": 120}  # the count does not depend on the batch's size


def mse(output: torch.Tensor, batch: dict) -> torch.Tensor:
    return F.mse_loss(output.float(), batch["target"].float())


def model_kernels(name: str, batch: dict | None = None, **net_overrides: Any) -> KernelCount:
    """One training step of fusion model `name` (conf/model/<name>.yaml, video + audio + text at the paper's dims)."""
    from train_throughput import MODALITIES, SyntheticBatches, fusion_module

    batch = batch or SyntheticBatches(1, dims=PAPER_DIMS, **COUNT_BATCH).batches[0]
    torch.manual_seed(0)
    module = fusion_module(name, list(MODALITIES), PAPER_DIMS, **net_overrides).train()
    return step_kernels(module, batch, mse)


def trainable_fusion_models() -> list[str]:
    """The registered fusion models with parameters to train (the baselines take no optimizer step)."""
    from train_throughput import MODALITIES, fusion_module

    from empathic_fusion.models import list_models

    return [name for name in list_models("fusion")
            if any(p.requires_grad for p in fusion_module(name, list(MODALITIES), PAPER_DIMS).parameters())]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true",
                        help=f"write the counts as the budgets the test holds ({BUDGET_FILE.name})")
    args = parser.parse_args(argv)
    counts = {}
    for name in trainable_fusion_models():
        count = model_kernels(name)
        counts[name] = {"total": count.total, "parts": {part: list(fb) for part, fb in count.table().items()}}
        print(f"{name:10s} {count.total:4d}  " + "  ".join(f"{p} {f}+{b}" for p, (f, b) in count.table().items()))
    if args.record:
        about = ("Kernel-launching ATen ops of one training step per fusion model (benchmarks/kernel_count.py: video + "
                 "audio + text at the paper's dims, fused AdamW); tests/test_kernel_budget.py fails when a model launches "
                 "more. Written by `python benchmarks/kernel_count.py --record`; parts are [forward, backward].")
        rows = ",\n".join(f"  {json.dumps(name)}: {json.dumps(value)}" for name, value in counts.items())
        BUDGET_FILE.write_text(f'{{\n "about": {json.dumps(about)},\n "models": {{\n{rows}\n }}\n}}\n')
        print(f"wrote {BUDGET_FILE}")
    return counts


if __name__ == "__main__":
    main()
