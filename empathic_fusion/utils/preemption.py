"""A job that SLURM is about to stop keeps the step under way.

submitit sends SIGUSR2 `signal_delay_s` before a job's time limit and on preemption; its own handler, installed
before the job runs, calls the launcher's `checkpoint()` and requeues the job, which then runs again into the
same run folder and resumes from `checkpoints/last.ckpt` (pipeline.resolve_ckpt_path). `PreemptionCheckpoint`
puts its own handler in front of that one when the job builds its trainer, before the data's set-up; the
handler only notes the signal. At the end of the next training batch the callback saves last.ckpt (a
mid-epoch checkpoint: the weights, optimizer, loops, the training loader's place in its epoch
(datamodules/sampler.py ResumableLoader) and the random generators' states), then hands the signal to the
handler it replaced, which requeues the job. Without such a handler (SIG_DFL, SIG_IGN) training stops there
instead, and the run goes on to its test. The requeued job trains the rest of that epoch in the same order
and draws the same random numbers, so it ends as an uninterrupted run would.
"""
from __future__ import annotations

import logging
import random
import signal
import threading
import weakref
from pathlib import Path
from types import FrameType
from typing import Any, Callable

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

log = logging.getLogger(__name__)

Handler = Callable[[int, FrameType | None], Any] | int | None  # what signal.getsignal returns


def last_checkpoint_path(trainer: L.Trainer) -> Path | None:
    """Where last.ckpt goes: the folder of the ModelCheckpoint that writes it (callbacks.last_checkpoint), else
    of another checkpoint callback (resolve_ckpt_path resumes from a last.ckpt in any of their folders); None
    without one."""
    checkpoints = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.dirpath]
    if not checkpoints:
        return None
    chosen = min(checkpoints, key=lambda c: c.filename != c.CHECKPOINT_NAME_LAST)
    return Path(chosen.dirpath) / f"{chosen.CHECKPOINT_NAME_LAST}{chosen.FILE_EXTENSION}"


def random_states() -> dict[str, Any]:
    """The states of the generators training draws from (dropout, shuffles, augmentations): torch's on the
    CPU and, once CUDA is in use, on every GPU, numpy's (its keys as a tensor, so a checkpoint still loads with
    torch.load(weights_only=True)) and python's."""
    name, keys, position, has_gauss, gauss = np.random.get_state(legacy=True)
    numpy_state = [name, torch.from_numpy(keys.copy()), position, has_gauss, gauss]
    states = {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["torch.cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_random_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, position, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, keys.numpy(), position, has_gauss, gauss))
    random.setstate(states["python"])
    cuda = states.get("torch.cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _install(callback: PreemptionCheckpoint, signum: int) -> tuple[Handler, Handler]:
    """Put a handler for `signum` in front of the current one: (the replaced handler, the new one). While the
    callback defers signals the handler only notes one; once it no longer does, or is gone (its job ended before
    training, e.g. failed while setting up its data), the handler gives the signal to the replaced one and steps
    aside, also where Lightning put it back (its SignalConnector reinstalls, when a fit ends, every handler it
    found when the fit began)."""
    owner = weakref.ref(callback)
    previous = signal.getsignal(signum)

    def note(received: int, frame: FrameType | None) -> None:
        alive = owner()
        if alive is not None and alive.deferring:
            alive.signalled = True
            return
        signal.signal(received, previous)
        signal.raise_signal(received)

    signal.signal(signum, note)
    return previous, note


class PreemptionCheckpoint(L.Callback):
    """On SIGUSR2, save last.ckpt at the end of the next training batch and pass the signal on (module doc).

    A signal that comes at an epoch's last batch waits for the next batch's end, after that epoch's validation
    and checkpoints (a checkpoint saved at the last batch would resume past them), or for the end of
    training. One that comes before training (while the data set up, or during the sanity check) waits for the
    first batch's end, so a requeued job always has something saved. Under DDP every rank saves when any got
    it. The replaced handler is put back when training ends.

    `remove_last_at_end`: once the job has trained and tested, remove last.ckpt (pipeline.train calls
    `job_ended_well`), so a grid keeps only the best checkpoint of each run; a job that failed or was stopped
    keeps it to resume from. Every checkpoint also keeps the random generators' states, which a resumed fit
    takes back before its first batch (`on_train_start`).
    """

    def __init__(self, remove_last_at_end: bool = False, signum: int = getattr(signal, "SIGUSR2", 0)):
        self.remove_last_at_end = bool(remove_last_at_end)
        self.signum = int(signum)
        self.signalled = False  # a signal came that is not handled yet
        self.stopped = False  # training was stopped by a signal (no handler to pass it to)
        self.deferring = False  # signals wait for a training batch's end (from the job's start to training's end)
        self._previous: Handler = None
        self._handler: Handler = None
        self._random_states: dict[str, Any] | None = None  # a resumed checkpoint's, until training starts
        if self.signum and threading.current_thread() is threading.main_thread():
            self._previous, self._handler = _install(self, self.signum)
            self.deferring = True

    # ---- the signal ---------------------------------------------------------------------------------
    def _received(self, trainer: L.Trainer) -> bool:
        """Whether a signal is waiting, in any process (every rank must save together)."""
        if trainer.world_size > 1:
            return trainer.strategy.reduce_boolean_decision(self.signalled, all=False)
        return self.signalled

    def _save_and_pass_on(self, trainer: L.Trainer) -> None:
        self.signalled = False
        path = last_checkpoint_path(trainer)
        where = "nothing saved (no checkpoint callback)"
        if path is not None:
            trainer.save_checkpoint(path)
            where = f"saved {path}"
        log.info("%s at step %d (%d batches into epoch %d): %s; %s", signal.Signals(self.signum).name,
                 trainer.global_step, trainer.fit_loop.epoch_loop.batch_progress.current.ready,
                 trainer.current_epoch + 1, where, "passing it on" if callable(self._previous) else "training stops")
        if callable(self._previous):
            self._previous(self.signum, None)  # submitit's: requeue the job and exit
            return
        self.stopped = True
        trainer.should_stop = True
        for checkpoint in trainer.checkpoint_callbacks:  # none saves again after this step (ModelCheckpoint's
            if isinstance(checkpoint, ModelCheckpoint):  # own rule), so the stopping epoch's validation and end
                checkpoint._last_global_step_saved = trainer.global_step  # neither replace last.ckpt nor the best

    def _stop_deferring(self) -> None:
        """Signals are the replaced handler's again."""
        self.deferring = False
        if self._handler is not None and signal.getsignal(self.signum) is self._handler:
            signal.signal(self.signum, self._previous)

    def _hand_back(self) -> None:
        """Stop deferring; a signal still waiting (nothing was trained since it came) goes on now."""
        self._stop_deferring()
        if self.signalled and callable(self._previous):
            self.signalled = False
            self._previous(self.signum, None)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._received(trainer) and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self._save_and_pass_on(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._received(trainer):  # it came at the last batch or during the last validation
            self._save_and_pass_on(trainer)
        self._stop_deferring()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":  # a test, validation or prediction: no training in this job to save
            self._hand_back()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._hand_back()  # also for a fit with nothing left to train (resumed at its end): no on_train_end

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._stop_deferring()

    # ---- the random generators' states ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"random_states": random_states()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._random_states = state_dict.get("random_states")

    def _take_back_random_states(self, resumed_mid_epoch: bool, trainer: L.Trainer) -> None:
        if self._random_states is not None and trainer.fit_loop.restarting == resumed_mid_epoch:
            restore_random_states(self._random_states)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_back_random_states(False, trainer)

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_back_random_states(False, trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A resumed fit takes back the saved generators' states where the interrupted run saved them: after the
        sanity check (its draws are the resumed run's only) and, for a checkpoint saved mid-epoch, after the
        training loader made its iterator (which draws a seed, as it did before that checkpoint), here; for one
        saved at an epoch's end, before (on_fit_start, or the sanity check's end), as the next epoch's iterator
        drew after that checkpoint. It then draws the dropout masks an uninterrupted run would."""
        self._take_back_random_states(True, trainer)
        self._random_states = None

    # ---- the job's end --------------------------------------------------------------------------------------
    def job_ended_well(self, trainer: L.Trainer) -> None:
        """The job trained and tested: remove last.ckpt when `remove_last_at_end` (not after a stop by the
        signal, whose run is unfinished)."""
        path = last_checkpoint_path(trainer)
        if not self.remove_last_at_end or self.stopped or path is None or not path.is_file():
            return
        trainer.strategy.remove_checkpoint(path)
        log.info("removed %s: the job trained and tested (remove_last_at_end)", path)


def job_ended_well(trainer: L.Trainer) -> None:
    """Tell the trainer's PreemptionCheckpoint callbacks that the job trained and tested."""
    for callback in trainer.callbacks:
        if isinstance(callback, PreemptionCheckpoint):
            callback.job_ended_well(trainer)
