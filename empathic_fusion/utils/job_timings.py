"""Where a training job's wall time goes, written to `<run folder>/timings.json`.

A sweep of many short runs spends much of its time outside the training steps: starting the process,
setting up the data (the store's checks, the windows, the statistics, the frame arrays), validation,
checkpoints, the test and its report. Each job records these spans so a sweep's fixed costs can be
counted (benchmarks/sweep_cost.py) and a user can see where a slow job's time went:

    setup/trainer, setup/data (setup/frames: the frame arrays, inside it), setup/model,
    sanity_check, train_steps (the training epochs less the validation and checkpoints inside them),
    validation, checkpoint, test (test_steps inside it: the rest loads the best checkpoint), report.

`process_start_s` is the time from the process's start to the job's, for the first job of a process
(later jobs of a multirun run in the same process and pay it no more). Spans of work on a GPU end
with a synchronisation, so asynchronous kernels count in the span that launched them.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch

TIMINGS_FILE = "timings.json"
_active: JobTimings | None = None
_jobs_in_process = 0


def process_started() -> float | None:
    """The Unix time this process started (Linux: /proc), None where it is not known."""
    try:
        fields = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _first_rank() -> bool:
    """Not a later process of a distributed run (the ranks' variables that Lightning, torchrun and SLURM set)."""
    return all(os.environ.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class JobTimings:
    """Seconds per named span of one job, and counts (steps, validation runs, checkpoints written)."""

    def __init__(self) -> None:
        self.started = time.time()
        self._clock = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, name: str, seconds: float, count: int = 0) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        if count:
            self.count(name, count)

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            _synchronize()
            self.add(name, time.perf_counter() - began)

    def record(self, first_in_process: bool) -> dict[str, Any]:
        """The job's spans (seconds), counts, its total and, for a process's first job, the process's start."""
        started = process_started() if first_in_process else None
        return {"started": self.started, "total_s": time.perf_counter() - self._clock,
                "process_start_s": None if started is None else max(0.0, self.started - started),
                "seconds": {k: round(v, 4) for k, v in self.seconds.items()}, "counts": dict(self.counts)}


@contextmanager
def job_timings(out_dir: Path | str) -> Iterator[JobTimings]:
    """Time one job: spans added with `timed` inside it count, and `<out_dir>/timings.json` is written
    when it ends (also when it fails, so a slow failure can be read)."""
    global _active, _jobs_in_process
    timings, previous = JobTimings(), _active
    _active = timings
    _jobs_in_process += 1
    first = _jobs_in_process == 1
    try:
        yield timings
    finally:
        _active = previous
        out = Path(out_dir)
        if out.is_dir() and _first_rank():  # under DDP every rank times the job; the first one writes
            (out / TIMINGS_FILE).write_text(json.dumps(timings.record(first), indent=1))


@contextmanager
def timed(name: str) -> Iterator[None]:
    """A span of the job being timed (`job_timings`); outside one it costs nothing."""
    if _active is None:
        yield
        return
    with _active.span(name):
        yield


class TimingCallback(L.Callback):
    """The Trainer's spans of a job: sanity check, training epochs, validation, checkpoints and test steps."""

    def __init__(self, timings: JobTimings):
        self.timings = timings
        self._began: dict[str, float] = {}
        self._inside_epoch = 0.0  # validation and checkpoints within the current training epoch
        self._save = None

    def _start(self, name: str) -> None:
        _synchronize()
        self._began[name] = time.perf_counter()

    def _stop(self, name: str, count: int = 1) -> float:
        _synchronize()
        seconds = time.perf_counter() - self._began.pop(name)
        self.timings.add(name, seconds, count)
        return seconds

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._save is None:  # every checkpoint a callback writes goes through trainer.save_checkpoint
            self._save = trainer.save_checkpoint

            def save_checkpoint(*args: Any, **kwargs: Any) -> None:
                began = time.perf_counter()
                self._save(*args, **kwargs)
                seconds = time.perf_counter() - began
                self.timings.add("checkpoint", seconds, 1)
                self._inside_epoch += seconds

            trainer.save_checkpoint = save_checkpoint

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._save is not None:
            trainer.save_checkpoint = self._save
            self._save = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.on_train_epoch_start(trainer, pl_module)  # a fit resumed mid-epoch gets no start of that epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._inside_epoch = 0.0
        self._start("train_epoch")

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.timings.count("train_steps")  # timed per epoch

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _synchronize()
        seconds = time.perf_counter() - self._began.pop("train_epoch")
        self.timings.add("train_steps", seconds - self._inside_epoch)
        self.timings.count("epochs")
        self._inside_epoch = 0.0

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start("sanity_check" if trainer.sanity_checking else "validation")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        seconds = self._stop("sanity_check" if trainer.sanity_checking else "validation")
        if not trainer.sanity_checking:
            self._inside_epoch += seconds

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start("test_steps")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop("test_steps")
