"""Progress output: a line per epoch when output goes to a file (a batch job's log), where a progress bar
cannot redraw, and scoring counted in what is scored."""
from __future__ import annotations

import sys
import time
from typing import Any

import lightning as L


class EpochLines(L.Callback):
    """When stderr is not a terminal, turn off Lightning's progress bar (its redraws fill a log file) and
    print one line per training epoch instead: epoch, losses and seconds. On a terminal it does nothing."""

    def __init__(self, interactive: bool | None = None):
        self.interactive = sys.stderr.isatty() if interactive is None else interactive
        self._started = 0.0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.interactive and trainer.progress_bar_callback is not None:
            trainer.progress_bar_callback.disable()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = time.perf_counter()  # a fit resumed mid-epoch gets no start of that epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.interactive or trainer.sanity_checking or not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if k.endswith("loss") and getattr(v, "numel", lambda: 1)() == 1}
        shown = "  ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items()))
        total = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        print(f"epoch {trainer.current_epoch + 1}{total}  {shown}  ({time.perf_counter() - self._started:.1f} s)",
              flush=True)


def scoring_bar(batches: Any, unit: str) -> Any:
    """A tqdm bar for scoring (empathic-predict) counted in what it scores, e.g. windows or rows per second,
    over the items of the batches' dataset: a bar counting batches shows `0.00it/s` for the one or two
    batches of a small input."""
    from tqdm import tqdm

    try:
        total = len(batches.dataset)
    except (AttributeError, TypeError):
        total = None
    return tqdm(total=total, unit=f" {unit}s", desc="scoring", dynamic_ncols=True)
