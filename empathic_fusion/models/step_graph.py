"""A whole training step as one function of its batch, captured once as a CUDA graph and replayed (`model.step_graph=true`).

A fusion model's step on a GPU is a few hundred small kernels, each costing a launch whatever it computes.
Captured as a CUDA graph, the forward, the loss, the backward and AdamW's update are one launch. What
capture needs, and how it is met here:
- no host sync inside the step (tests/test_host_syncs.py holds the models to that), and nothing read
  from the host: the learning rate and AdamW's step counts are tensors on the device (the scheduler
  writes the rate into its tensor), the training loss is summed on the device (read only when logged);
- static shapes: the step is captured for the shape of the first batch; a batch of another shape (the
  epoch's last, partial batch) runs the same function eagerly, so no window is dropped;
- random numbers drawn on the device (dropout; modality dropout draws from the device's generator);
- a few eager warm-up steps before capture (on a side stream, as CUDA requires), each a real step.
Where capture is impossible (no CUDA device) the same function runs eagerly; where the run's settings
rule it out (`refusal`), the module trains the usual way. Either is said in one log line.

The update is AdamW's (decoupled weight decay; Loshchilov & Hutter, 2019) written with foreach ops on
the optimizer's own state (`exp_avg`, `exp_avg_sq`, `step`), so a checkpoint resumes with or without the
graph, and the whole step also traces as one torch.compile graph: torch's fused AdamW kernel has no
functional form for torch.compile to trace, and its functional API graph-breaks by design.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)

WARMUP_STEPS = 3  # eager steps before capture (CUDA's recipe: lazy initialisation and cuDNN's choices settle)
StepBody = Callable[[dict], tuple[torch.Tensor, dict[str, torch.Tensor]]]  # batch -> (loss, what the step returns)


def refusal(trainer: L.Trainer | None, optimizer_cfg: dict[str, Any], scheduler_cfg: dict[str, Any] | None,
            compiled: bool) -> str | None:
    """Why the step cannot be captured with these settings (None: it can)."""
    target = str(optimizer_cfg.get("_target_", ""))
    if target.rsplit(".", 1)[-1] != "AdamW":
        return f"the captured step's update is AdamW's, and model.optimizer is {target}"
    if optimizer_cfg.get("amsgrad") or optimizer_cfg.get("maximize"):
        return "the captured step's AdamW has no amsgrad or maximize"
    if scheduler_cfg and "Plateau" in str(scheduler_cfg.get("_target_", "")):
        return "a plateau scheduler steps on a monitored metric, which the captured step does not pass it"
    if compiled:
        return "model.compile=true captures the net itself (set one of the two)"
    if trainer is None:
        return None
    if trainer.world_size > 1:
        return "one process per step: with several devices DDP reduces gradients between them"
    if trainer.accumulate_grad_batches != 1:
        return "trainer.accumulate_grad_batches accumulates over several batches"
    if trainer.gradient_clip_val:
        return "trainer.gradient_clip_val clips after the backward"
    if str(trainer.precision) in ("16-mixed", "16"):
        return "16-mixed scales the loss with a GradScaler that reads its scale on the host"
    return None


def _state(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> dict[str, torch.Tensor]:
    """AdamW's state of one parameter, made as torch makes it for a fused AdamW (the step count a float32
    tensor on the parameter's device) when the parameter has none yet."""
    state = optimizer.state[param]
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    elif state["step"].device != param.device:  # a checkpoint of an eager run keeps its counts on the host
        state["step"] = state["step"].to(param.device, torch.float32)
    return state


def rate_on_device(optimizer: torch.optim.Optimizer) -> None:
    """Each group's learning rate as a float64 tensor on its parameters' device (a scheduler fills it in place),
    so a captured update reads the current rate, and computes with it as AdamW does with a Python float."""
    for group in optimizer.param_groups:
        device = group["params"][0].device
        if not isinstance(group["lr"], torch.Tensor) or group["lr"].device != device:
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float64, device=device)


def _single(value: torch.Tensor | float) -> torch.Tensor | float:
    """A float64 scalar as the float32 an op on float32 tensors takes (a Python float stays one)."""
    return value.float() if isinstance(value, torch.Tensor) else value


def adamw_update(optimizer: torch.optim.Optimizer, grads: dict[torch.Tensor, torch.Tensor]) -> None:
    """AdamW's step for the parameters in `grads`, with each group's settings, on the optimizer's state: torch's
    AdamW arithmetic op for op (its scalars, here device tensors, in float64), so on the CPU the weights are
    the same to the bit."""
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p in grads]
        if not params:
            continue
        states = [_state(optimizer, p) for p in params]
        gradients = [grads[p] for p in params]
        steps = [s["step"] for s in states]
        exp_avgs, exp_avg_sqs = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        torch._foreach_add_(steps, 1.0)
        if group["weight_decay"]:
            torch._foreach_mul_(params, _single(1.0 - lr * group["weight_decay"]))
        torch._foreach_lerp_(exp_avgs, gradients, 1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, gradients, gradients, 1.0 - beta2)
        step = steps[0].double()  # the group's parameters are updated together: one count
        step_size = lr / (1.0 - torch.pow(beta1, step))
        denominators = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denominators, _single(torch.sqrt(1.0 - torch.pow(beta2, step))))
        torch._foreach_add_(denominators, group["eps"])
        updates = torch._foreach_mul(exp_avgs, _single(-step_size))  # p + (-step_size * m) / d, as addcdiv_ does
        torch._foreach_div_(updates, denominators)
        torch._foreach_add_(params, updates)


def _leaves(batch: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    """The batch's tensors by path ("video/x"), in a fixed order."""
    out = {}
    for key in sorted(batch):
        value = batch[key]
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}/"))
        elif isinstance(value, torch.Tensor):
            out[f"{prefix}{key}"] = value
    return out


def _rebuild(batch: dict, leaves: dict[str, torch.Tensor], prefix: str = "") -> dict:
    """`batch` with its tensors replaced by `leaves` (same paths)."""
    return {key: (_rebuild(value, leaves, f"{prefix}{key}/") if isinstance(value, dict)
                  else leaves.get(f"{prefix}{key}", value)) for key, value in batch.items()}


class GraphedStep:
    """`body` (batch -> loss, outputs), its gradients and AdamW's update on `optimizer`, as one step.

    Called with a batch, returns the body's outputs (tensors of the caller's, "pred" among them: one per
    window). The loss times the batch's windows is added to `loss_sums` (every element) on the device. On a CUDA device the step is captured
    after `warmup` eager steps and replayed for every batch of the captured shape; `compiler` (e.g.
    `torch.compile`) wraps the step function for that shape instead, after the same warm-up, and nothing
    is captured."""

    def __init__(self, body: StepBody, optimizer: torch.optim.Optimizer, loss_sums: torch.Tensor,
                 warmup: int = WARMUP_STEPS, compiler: Callable[[Callable], Callable] | None = None):
        self.body, self.optimizer, self.loss_sums = body, optimizer, loss_sums
        self.params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        for param in self.params:  # AdamW's state exists before the first step: every step runs the same code
            _state(optimizer, param)
        self.warmup, self.compiler = warmup, compiler
        self.shape: tuple | None = None  # the captured shape: (path, shape, dtype) of every tensor of the batch
        self.warmed = 0
        self.graph: Any = None
        self.static: dict[str, torch.Tensor] = {}
        self.static_out: dict[str, torch.Tensor] = {}
        self.compiled: Callable | None = None
        self.mode = ""  # what the log said: "graph", "compiled", "eager"

    def step(self, batch: dict) -> dict[str, torch.Tensor]:
        """The step itself: what is captured, compiled or run eagerly."""
        loss, outputs = self.body(batch)
        self.loss_sums.add_(loss.detach().float(), alpha=float(len(outputs["pred"])))
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        with torch.no_grad():
            adamw_update(self.optimizer, {p: g for p, g in zip(self.params, grads) if g is not None})
        return {key: value.detach() for key, value in outputs.items()}

    def __call__(self, batch: dict) -> dict[str, torch.Tensor]:
        leaves = _leaves(batch)
        shape = tuple((path, tuple(t.shape), t.dtype) for path, t in leaves.items())
        first = next(iter(leaves.values()))
        device = first.device
        if self.shape is None:
            self.shape = shape
            self._announce(device, len(first))
        if shape != self.shape or self.mode == "eager":
            return self.step(batch)
        if self.warmed < self.warmup:  # real steps that settle what the first steps make (caches, CUDA's choices)
            self.warmed += 1
            return self._warm_up(batch, device)
        if self.mode == "compiled":
            if self.compiled is None:
                self.compiled = self.compiler(self.step)
            return self.compiled(batch)
        if self.graph is None and not self._capture(batch, leaves):
            return self.step(batch)
        torch._foreach_copy_(list(self.static.values()), list(leaves.values()))
        self.graph.replay()
        return {key: value.clone() for key, value in self.static_out.items()}  # the next replay overwrites them

    def _warm_up(self, batch: dict, device: torch.device) -> dict[str, torch.Tensor]:
        """An eager step; on a CUDA device on a side stream, as capture requires."""
        if device.type != "cuda":
            return self.step(batch)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            pred = self.step(batch)
        torch.cuda.current_stream(device).wait_stream(side)
        return pred

    def _announce(self, device: torch.device, windows: int) -> None:
        if self.compiler is not None:
            self.mode = "compiled"
            log.info("step graph: the training step for batches of %d windows runs compiled", windows)
        elif device.type == "cuda":
            self.mode = "graph"
            log.info("step graph: the training step for batches of %d windows is captured as one CUDA graph after "
                     "%d warm-up steps (a batch of another size runs eagerly)", windows, self.warmup)
        else:
            self.mode = "eager"
            log.info("step graph: CUDA graphs need a CUDA device and this run is on %s: the step runs eagerly",
                     device.type)

    def _capture(self, batch: dict, leaves: dict[str, torch.Tensor]) -> bool:
        """Capture the step on static copies of the batch's tensors; False (and eager from here on, said in the
        log) when CUDA refuses."""
        self.static = {path: t.clone() for path, t in leaves.items()}
        static_batch = _rebuild(batch, self.static)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.static_out = self.step(static_batch)
        except RuntimeError as error:
            log.warning("step graph: the step could not be captured (%s); it runs eagerly", str(error).splitlines()[0])
            self.mode, self.static, self.static_out = "eager", {}, {}
            return False
        self.graph = graph
        return True
