"""Run output: torch threads from the cores available, third-party noise filtered, one line per epoch
when output is a file, data warnings once per run."""
from __future__ import annotations

import logging
import os

import lightning as L
import pytest
import torch

from empathic_fusion.utils import threads as threads_module
from empathic_fusion.utils.progress import EpochLines
from empathic_fusion.utils.run_output import (THIRD_PARTY_LOGGERS, VERBOSE_ENV, data_warning_summary,
                                              native_logs_filtered, reset_data_warnings, set_verbosity, warn_data)
from empathic_fusion.utils.threads import available_cores, busy_cores, configure_threads


def _blas_threads() -> set[int]:
    from threadpoolctl import threadpool_info

    import numpy  # noqa: F401  (its BLAS is loaded: there is a pool to count)

    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


@pytest.fixture(autouse=True)
def _restore_threads_and_log_levels(monkeypatch):
    """torch's and BLAS's threads, their environment and the log levels as they were before the test."""
    from threadpoolctl import threadpool_limits

    before, blas = torch.get_num_threads(), max(_blas_threads())
    levels = {name: logging.getLogger(name).level for name in THIRD_PARTY_LOGGERS}
    monkeypatch.setenv(VERBOSE_ENV, os.environ.get(VERBOSE_ENV, "0"))  # restored after the test
    for name in ("OPENBLAS_NUM_THREADS", threads_module.BLAS_SET_BY):  # configure_threads sets them; restored after
        monkeypatch.delenv(name, raising=False)
    yield
    torch.set_num_threads(before)
    threadpool_limits(limits=blas, user_api="blas")
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_threads_setting_wins_then_omp_num_threads_then_free_cores(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert configure_threads(3) == 3 and torch.get_num_threads() == 3
    assert configure_threads(None) == 1 and torch.get_num_threads() == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5, 7})  # 4 of the machine's cores
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(threads_module, "cgroup_cpu_limit", lambda: None)
    monkeypatch.setattr(threads_module, "busy_cores", lambda cores, seconds=0.25: 1.2 if cores == [0, 2, 5, 7] else None)
    assert configure_threads(None) == 3 and torch.get_num_threads() == 3  # 4 allowed, about 1 busy
    monkeypatch.setattr(threads_module, "busy_cores", lambda cores, seconds=0.25: 4.0)  # a hog on every core
    assert available_cores() == 1
    monkeypatch.setattr(threads_module, "busy_cores", lambda cores, seconds=0.25: 0.0)
    monkeypatch.setattr(threads_module, "cgroup_cpu_limit", lambda: 2)  # a container's quota of 2 CPUs
    assert available_cores() == 2
    for bad in (0, -2, True, "4"):
        with pytest.raises(ValueError, match="must be a positive integer"):
            configure_threads(bad)


def test_numpys_blas_gets_the_same_threads_unless_openblas_num_threads_is_set(monkeypatch):
    """On a busy machine a BLAS with a thread per core waits on itself (an eigendecomposition 70 times slower):
    it follows torch's count, in the libraries loaded now and, through OPENBLAS_NUM_THREADS, those loaded later."""
    assert configure_threads(2) == 2 and _blas_threads() == {2} and os.environ["OPENBLAS_NUM_THREADS"] == "2"
    assert configure_threads(1) == 1 and _blas_threads() == {1} and os.environ["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")  # the user's own setting
    assert configure_threads(1) == 1 and torch.get_num_threads() == 1
    assert _blas_threads() == {1} and os.environ["OPENBLAS_NUM_THREADS"] == "2"  # left as they were


def test_a_sweep_measures_the_free_cores_at_its_first_job_only(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    measured = []
    monkeypatch.setattr(threads_module, "available_cores", lambda: measured.append(1) or 2)  # sleeps in real life
    assert [configure_threads(None, "sweep-1") for _ in range(3)] == [2, 2, 2] and len(measured) == 1
    assert configure_threads(None, "sweep-2") == 2 and len(measured) == 2  # another multirun measures again
    assert configure_threads(None) == 2 and len(measured) == 3  # single runs always measure
    assert configure_threads(1, "sweep-2") == 1  # a setting still wins


def test_a_slurm_job_takes_the_cpus_it_was_given_before_measuring_free_cores(monkeypatch):
    """Two jobs started on one node at the same moment each see every core idle: the allocation decides."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(threads_module, "available_cores", lambda: pytest.fail("measured inside a SLURM job"))
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert configure_threads(None) == 1 and torch.get_num_threads() == 1
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")  # more than the process may run on: its affinity caps it
    assert configure_threads(None, "sweep") == 4
    assert configure_threads(2) == 2  # a setting still wins
    monkeypatch.delenv("SLURM_JOB_ID")  # a variable left in a shell outside any job is not read
    monkeypatch.setattr(threads_module, "available_cores", lambda: 3)
    assert configure_threads(None) == 3


def test_busy_cores_reads_this_machines_cpu_times():
    cores = sorted(os.sched_getaffinity(0))
    busy = busy_cores(cores, 0.05)
    assert busy is not None and -0.01 <= busy <= len(cores) + 0.01


def test_cgroup_quota_is_read(tmp_path):
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert threads_module.cgroup_cpu_limit(tmp_path / "cpu.max") == 3
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads_module.cgroup_cpu_limit(tmp_path / "cpu.max") is None


def test_native_log_lines_are_dropped_and_the_rest_kept(capfd):
    set_verbosity(False)
    with native_logs_filtered():
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n"
                    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
                    b"W0000 00:00:1795490792.939019   16832 inference_feedback_manager.cc:114] Feedback manager\n"
                    b"E0000 00:00:1795490792.939019   16832 calculator_graph.cc:9] a real error\n"
                    b"something else\n")
    err = capfd.readouterr().err
    assert err == ("E0000 00:00:1795490792.939019   16832 calculator_graph.cc:9] a real error\nsomething else\n")
    set_verbosity(True)  # verbose=true: everything passes
    with native_logs_filtered():
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
    assert "TensorFlow Lite" in capfd.readouterr().err


def test_lightning_banners_and_tips_are_silenced_unless_verbose(caplog):
    set_verbosity(False)
    with caplog.at_level(logging.INFO):
        L.Trainer(logger=False, enable_checkpointing=False, accelerator="cpu")
    assert not [r for r in caplog.records if r.name.startswith("lightning")]
    set_verbosity(True)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        L.Trainer(logger=False, enable_checkpointing=False, accelerator="cpu")
    assert any("Tip" in r.getMessage() or "available" in r.getMessage() for r in caplog.records)


class _Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, _):
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("train/loss", loss, on_epoch=True, on_step=False)
        return loss

    def validation_step(self, batch, _):
        self.log("val/loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_one_line_per_epoch_when_output_is_not_a_terminal(capsys):
    data = torch.utils.data.TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    trainer = L.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, accelerator="cpu",
                        enable_model_summary=False, callbacks=[EpochLines(interactive=False)])
    trainer.fit(_Tiny(), loader, loader)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"]
    assert all("train/loss" in line and "val/loss" in line for line in lines)
    assert trainer.progress_bar_callback.is_disabled


def test_data_warnings_are_logged_once_per_run_and_counted(caplog):
    reset_data_warnings()
    with caplog.at_level(logging.WARNING, logger="empathic_fusion.data"):
        for message in ("session 's1' face: 3 frames could not be decoded", "session 's2': no audio",
                        "session 's1' face: 3 frames could not be decoded"):
            warn_data(message)
    assert [r.getMessage() for r in caplog.records] == ["session 's1' face: 3 frames could not be decoded",
                                                        "session 's2': no audio"]
    assert data_warning_summary() == "2 data warning(s) in this run, listed above"
    reset_data_warnings()
    assert data_warning_summary() is None


def test_setting_the_verbosity_imports_no_library(tmp_path):
    """extract.py, and the dataset errors it stops at, never import Lightning (seconds at every start)."""
    import subprocess
    import sys

    code = ("import sys\nfrom empathic_fusion.utils.run_output import set_verbosity\nset_verbosity(False)\n"
            "print(sorted(set(sys.modules) & {'lightning', 'torch', 'transformers'}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


def test_the_verbosity_holds_for_a_library_that_sets_its_levels_when_imported_later(tmp_path, monkeypatch):
    """Lightning and transformers set their loggers' levels at import: the levels are set again right after, with
    the verbosity last chosen (here a stand-in library, imported for the first time after set_verbosity)."""
    import importlib.util
    import sys

    from empathic_fusion.utils import run_output

    (tmp_path / "lightning_stand_in").mkdir()
    (tmp_path / "lightning_stand_in" / "__init__.py").write_text(
        "import logging\nlogging.getLogger('lightning.pytorch').setLevel(logging.INFO)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(run_output._LevelsAfterImport, "LEVELS_SET_AT_IMPORT", ("lightning_stand_in",))
    monkeypatch.setattr(run_output._LevelsAfterImport, "_pending", None)
    monkeypatch.delitem(sys.modules, "lightning_stand_in", raising=False)
    set_verbosity(True)
    set_verbosity(False)  # the last choice counts
    assert isinstance(sys.meta_path[0], run_output._LevelsAfterImport)
    assert importlib.util.find_spec("lightning_stand_in") is not None  # an is-it-installed check imports nothing
    import lightning_stand_in  # noqa: F401

    assert logging.getLogger("lightning.pytorch").level == logging.WARNING
    assert not any(isinstance(f, run_output._LevelsAfterImport) for f in sys.meta_path)  # gone once used
    set_verbosity(True)
    assert logging.getLogger("lightning.pytorch").level == logging.INFO


def test_libraries_deprecation_warnings_are_silenced_unless_verbose():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        set_verbosity(False)
        warnings.warn_explicit("old API", DeprecationWarning, "_pytree.py", 21, module="lightning.pytorch.utilities._pytree")
        warnings.warn_explicit("ours", DeprecationWarning, "x.py", 1, module="empathic_fusion.x")
    assert [str(w.message) for w in caught] == ["ours"]


def test_scoring_progress_counts_the_rows_scored_not_batches(capsys):
    from empathic_fusion.models.predict import predict

    class Scorer(L.LightningModule):
        def forward(self, batch):
            return batch[0].sum(1)

    class Rows(L.LightningDataModule):
        def predict_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(10, 2)), batch_size=4)

    data = Rows()
    assert predict(Scorer(), data, progress=True, unit="row").tolist() == [2.0] * 10
    bar = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "10/10" in bar and " rows/s]" in bar and "it/s" not in bar
