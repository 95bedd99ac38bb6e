"""Preemption that loses no step (empathic_fusion/utils/preemption.py): SIGUSR2, as submitit sends it before a time
limit, saves the step under way as last.ckpt and passes the signal on; the job run again into its folder trains the
rest of that epoch in the same order and draws the same random numbers, so it ends with an uninterrupted run's
weights and test metrics. The training orders' and loader's state round trips (datamodules/sampler.py), a signal
before training, and the grid's removal of last.ckpt at the end of a job that trained and tested."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler, TensorDataset

import empathic_fusion.pipeline as pipeline
from empathic_fusion.datamodules.sampler import RatingOversampler, ResumableLoader, ResumableSampler
from empathic_fusion.datamodules.window_gather import IndexBatchSampler
from empathic_fusion.pipeline import train
from empathic_fusion.compose import compose_config

EPOCHS, SIGNAL_EPOCH, SIGNAL_BATCH = 3, 1, 5  # the signal comes at the end of batch 5 of the second epoch
PATHS = {  # the training loader's three ways to its batches, and the per-window reference loader
    "oversampler": [],
    "plain_shuffle": ["data.oversample=false"],
    "gather_in_step": ["data.frames=memory", "model.step_graph=true"],
    "reference": ["data.loader=reference"],
}


class Requeued(SystemExit):
    """What submitit's handler ends the job with (after requeueing it)."""


@pytest.fixture
def submitit_handler():
    """SIGUSR2's handler before the job starts, as submitit installs it: it notes the call and exits."""
    calls: list[int] = []

    def requeue(signum, frame):
        calls.append(signum)
        raise Requeued(-1)

    original = signal.signal(signal.SIGUSR2, requeue)
    yield calls
    signal.signal(signal.SIGUSR2, original)


@pytest.fixture
def no_handler():
    original = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGUSR2, original)


def _cfg(store: tuple[Path, Path], out: Path, *extra: str):
    """TFN on the synthetic store, 14 batches of 16 an epoch, dropout and modality dropout on, the learning rate
    stepped every epoch (so a resumed run must keep the scheduler's place too)."""
    return compose_config(["trainer=cpu", "model=tfn", "modality=v+a+t", "data=empathic_stories",
                           f"data.dataset_dir={store[0]}", f"data.store_dir={store[1]}", "data.batch_size=16",
                           "data.split_fractions=[0.6,0.2,0.2]", "data.extract_workers=1", "logger=none",
                           "evaluation=lean", f"trainer.max_epochs={EPOCHS}", "model.scheduler.step_size=1",
                           "model.modality_dropout=0.3", "seed=3", *extra], out)


class BatchLog(L.Callback):
    """The windows of every training batch, and the step at which this fit trained its first."""

    def __init__(self):
        self.batches: list[list[int]] = []
        self.first_step: int | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.first_step is None:
            self.first_step = trainer.global_step
        self.batches.append(batch["window" if "window" in batch else "rating_index"].tolist())


class SignalAt(L.Callback):
    """Sends SIGUSR2 to this process at the end of one training batch (`batch` -1: the epoch's last)."""

    def __init__(self, epoch: int, batch: int):
        self.epoch, self.batch = epoch, batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        last = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        if trainer.current_epoch == self.epoch and (batch_idx == self.batch or self.batch == -1 and last):
            os.kill(os.getpid(), signal.SIGUSR2)


def _run(cfg, *callbacks: L.Callback) -> tuple[dict, BatchLog]:
    log = BatchLog()
    return train(cfg, extra_callbacks=[log, *callbacks]), log


def _outcome(run_dir: Path) -> dict:
    """What must equal an uninterrupted run's: the final weights and learning rate (last.ckpt) and the test
    metrics (of the best checkpoint)."""
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    return {"weights": last["state_dict"], "lr": last["lr_schedulers"][0]["_last_lr"],
            "metrics": json.loads((run_dir / "test_metrics.json").read_text())}


def assert_same_outcome(expected: dict, actual: dict) -> None:
    assert expected["lr"] == actual["lr"] and expected["metrics"] == actual["metrics"]
    assert expected["weights"].keys() == actual["weights"].keys()
    for key, value in expected["weights"].items():
        assert torch.equal(value, actual["weights"][key]), key


_UNINTERRUPTED: dict[str, tuple[dict, dict, BatchLog]] = {}


def uninterrupted(path: str, store, tmp_path_factory) -> tuple[dict, dict, BatchLog]:
    """(results, outcome, batches) of the uninterrupted run of a loader path, run once per session."""
    if path not in _UNINTERRUPTED:
        out = tmp_path_factory.mktemp(f"uninterrupted_{path}")
        results, log = _run(_cfg(store, out, *PATHS[path]))
        _UNINTERRUPTED[path] = (results, _outcome(out), log)
    return _UNINTERRUPTED[path]


def _interrupt_and_resume(cfg, signal_at: SignalAt) -> tuple[dict, dict, BatchLog, BatchLog]:
    """Run `cfg` until the signal requeues it, then again into the same folder: (the first run's last.ckpt, the
    second's results, both batch logs)."""
    first = BatchLog()
    with pytest.raises(Requeued):
        train(cfg, extra_callbacks=[first, signal_at])
    saved = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    results, second = _run(cfg)
    return saved, results, first, second


@pytest.mark.parametrize("path", list(PATHS))
def test_a_signal_mid_epoch_saves_the_step_and_the_requeued_job_ends_as_an_uninterrupted_one(
        path, synthetic_store, tmp_path, tmp_path_factory, submitit_handler):
    whole, expected, whole_log = uninterrupted(path, synthetic_store, tmp_path_factory)
    per_epoch = len(whole_log.batches) // EPOCHS
    saved, resumed, first, second = _interrupt_and_resume(_cfg(synthetic_store, tmp_path, *PATHS[path]),
                                                          SignalAt(SIGNAL_EPOCH, SIGNAL_BATCH))
    # noted at batch 5's end (after the callback had looked), saved at batch 6's: mid-epoch, then submitit's handler
    # ran; the checkpoint (random states included) still loads with weights_only=True
    step = SIGNAL_EPOCH * per_epoch + SIGNAL_BATCH + 2
    assert submitit_handler == [signal.SIGUSR2]
    assert saved["global_step"] == step and saved["epoch"] == SIGNAL_EPOCH
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["batches"] == SIGNAL_BATCH + 2
    # the requeued job went on from that step with the rest of the epoch, in the uninterrupted order
    assert second.first_step == step and len(first.batches) == step
    assert first.batches + second.batches == whole_log.batches
    assert resumed["global_step"] == whole["global_step"] == EPOCHS * per_epoch
    assert resumed["best_validation"] == whole["best_validation"]
    assert_same_outcome(expected, _outcome(tmp_path))


def test_a_signal_at_an_epochs_last_batch_waits_for_the_next_batch(synthetic_store, tmp_path, tmp_path_factory,
                                                                   submitit_handler):
    """Saved after that epoch's validation and checkpoints, at the end of the next epoch's first batch."""
    _, expected, whole_log = uninterrupted("oversampler", synthetic_store, tmp_path_factory)
    per_epoch = len(whole_log.batches) // EPOCHS
    saved, _, first, second = _interrupt_and_resume(_cfg(synthetic_store, tmp_path), SignalAt(0, -1))
    assert saved["global_step"] == per_epoch + 1 and saved["epoch"] == 1
    assert first.batches + second.batches == whole_log.batches
    assert_same_outcome(expected, _outcome(tmp_path))


class KilledAtEpochStart(L.Callback):
    """Stands in for a job killed without a signal: it dies when epoch `epoch` begins, after the previous one's
    last.ckpt."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            raise RuntimeError("killed")


def test_a_run_killed_between_epochs_resumes_from_the_epochs_last_ckpt_as_exactly(synthetic_store, tmp_path,
                                                                                 tmp_path_factory):
    """The random generators' states saved at the epoch's end are taken back before the next epoch's loader
    draws its seed, as in the uninterrupted run."""
    _, expected, whole_log = uninterrupted("oversampler", synthetic_store, tmp_path_factory)
    cfg = _cfg(synthetic_store, tmp_path)
    with pytest.raises(RuntimeError, match="killed"):
        train(cfg, extra_callbacks=[KilledAtEpochStart(EPOCHS - 1)])
    _, second = _run(cfg)
    assert second.batches == whole_log.batches[-len(whole_log.batches) // EPOCHS:]
    assert_same_outcome(expected, _outcome(tmp_path))


def test_without_a_handler_to_pass_it_to_the_signal_stops_training_after_saving(synthetic_store, tmp_path,
                                                                               tmp_path_factory, no_handler):
    """The run stops at the saved step and tests its best checkpoint; its last.ckpt (kept, also with
    remove_last_at_end) resumes as a requeued job's does."""
    whole, expected, whole_log = uninterrupted("oversampler", synthetic_store, tmp_path_factory)
    per_epoch = len(whole_log.batches) // EPOCHS
    cfg = _cfg(synthetic_store, tmp_path, "callbacks.preemption.remove_last_at_end=true")
    stopped = BatchLog()
    results = train(cfg, extra_callbacks=[stopped, SignalAt(SIGNAL_EPOCH, SIGNAL_BATCH)])
    step = SIGNAL_EPOCH * per_epoch + SIGNAL_BATCH + 2
    assert results["global_step"] == step and results["best_checkpoint"]
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == step  # neither the stopping epoch's validation nor its end replaced it
    assert not any(f"epoch_{SIGNAL_EPOCH:03d}" in p.name for p in (tmp_path / "checkpoints").iterdir())
    resumed, second = _run(cfg)
    assert stopped.batches + second.batches == whole_log.batches
    assert resumed["global_step"] == whole["global_step"]
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()  # this job trained and tested: removed
    assert json.loads((tmp_path / "test_metrics.json").read_text()) == expected["metrics"]


def test_a_signal_before_training_waits_for_the_first_batch(synthetic_store, tmp_path, submitit_handler,
                                                            monkeypatch):
    """One that comes while the job sets up its data does not requeue a job with nothing saved."""
    set_up = pipeline.set_up

    def set_up_and_get_the_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGUSR2)
        assert not submitit_handler  # not passed on yet
        return set_up(*args, **kwargs)

    monkeypatch.setattr(pipeline, "set_up", set_up_and_get_the_signal)
    log = BatchLog()
    with pytest.raises(Requeued):
        train(_cfg(synthetic_store, tmp_path), extra_callbacks=[log])
    assert submitit_handler == [signal.SIGUSR2] and len(log.batches) == 1
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 1
    with pytest.raises(Requeued):  # the job over, a signal is the replaced handler's again
        os.kill(os.getpid(), signal.SIGUSR2)
    assert signal.getsignal(signal.SIGUSR2).__name__ == "requeue"


class FailingTest(L.Callback):
    def on_test_start(self, trainer, pl_module):
        raise RuntimeError("the test failed")


def test_the_grid_removes_last_ckpt_after_a_good_job_and_keeps_it_after_a_failed_one(synthetic_store, tmp_path):
    grid = ["callbacks.preemption.remove_last_at_end=true", "trainer.max_epochs=1"]
    results = train(_cfg(synthetic_store, tmp_path / "good", *grid))
    kept = sorted(p.name for p in (tmp_path / "good" / "checkpoints").iterdir())
    assert kept == [Path(results["best_checkpoint"]).name] == ["epoch_000.ckpt"]
    with pytest.raises(RuntimeError, match="the test failed"):
        train(_cfg(synthetic_store, tmp_path / "failed", *grid), extra_callbacks=[FailingTest()])
    assert (tmp_path / "failed" / "checkpoints" / "last.ckpt").is_file()  # the requeued job resumes from it
    default = _cfg(synthetic_store, tmp_path / "default", "trainer.max_epochs=1")
    assert not default.callbacks.preemption.remove_last_at_end
    grid_cfg = compose_config(["experiment=es_story_share"], tmp_path / "es")
    assert grid_cfg.callbacks.preemption.remove_last_at_end and grid_cfg.callbacks.last_checkpoint is not None


# ---- the training orders' and loader's state ---------------------------------------------------------------
CLASSES = np.random.default_rng(0).integers(1, 6, size=61)


def _orders(world: int, rank: int) -> dict[str, ResumableSampler]:
    return {"oversampler": RatingOversampler(CLASSES, seed=5, num_replicas=world, rank=rank),
            "plain_shuffle": ResumableSampler(range(len(CLASSES)), num_replicas=world, rank=rank, shuffle=True,
                                              seed=5)}


@pytest.mark.parametrize("kind", ["oversampler", "plain_shuffle"])
@pytest.mark.parametrize("world", [1, 3])
def test_a_sampler_state_resumes_the_epoch_in_every_rank(kind, world):
    """Rank 0's state after 7 of its positions (what a checkpoint keeps) resumes every rank at its 8th, in the
    epoch under way, and the epochs after it draw as the uninterrupted sampler's."""
    interrupted = _orders(world, 0)[kind]
    interrupted.set_epoch(2)
    taken = iter(interrupted)
    for _ in range(7):
        next(taken)
    state = interrupted.state_dict()
    assert state == {"epoch": 2, "seed": 5, "taken": 7 * world}
    for rank in range(world):
        whole = _orders(world, rank)[kind]
        whole.set_epoch(2)
        epoch_2, epoch_3 = list(whole), (whole.set_epoch(3), list(whole))[1]
        resumed = _orders(world, rank)[kind]
        resumed.load_state_dict(state)
        assert list(resumed) == epoch_2[7:]
        resumed.set_epoch(3)
        assert list(resumed) == epoch_3
    with pytest.raises(ValueError, match="seed"):
        _orders(world, 0)[kind].load_state_dict({**state, "seed": 6})


def _loaders(kind: str, workers: int = 0) -> DataLoader:
    data = TensorDataset(torch.arange(len(CLASSES)))
    order = _orders(1, 0)["plain_shuffle"]
    if kind == "batched":  # batches from an index batch sampler, as the batched loader makes them
        return ResumableLoader(torch.arange(len(CLASSES)), sampler=IndexBatchSampler(order, 8), batch_size=None)
    if kind == "other_sampler":  # a sampler Lightning put in place (overfit_batches): batches drawn and dropped
        return ResumableLoader(data, sampler=SequentialSampler(data), batch_size=8)
    return ResumableLoader(data, sampler=order, batch_size=8, num_workers=workers)


def _positions(batch) -> list[int]:
    return (batch[0] if isinstance(batch, list) else batch).tolist()


@pytest.mark.parametrize("kind,workers", [("per_window", 0), ("per_window", 2), ("batched", 0),
                                          ("other_sampler", 0)])
def test_a_loader_state_counts_the_batches_given_out_not_prefetched(kind, workers):
    whole = [_positions(b) for b in _loaders(kind, workers)]
    interrupted = _loaders(kind, workers)
    batches = iter(interrupted)
    for _ in range(3):  # with workers, more positions than these are already with them
        next(batches)
    state = interrupted.state_dict()
    assert state["batches"] == 3
    resumed = _loaders(kind, workers)
    resumed.load_state_dict(state)
    rest = [_positions(b) for b in resumed]
    assert rest == whole[3:]
    assert resumed.state_dict()["batches"] == len(whole)
    assert [_positions(b) for b in resumed] == whole  # the next iteration is whole again
