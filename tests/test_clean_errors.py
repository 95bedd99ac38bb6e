"""An expected error (a dataset, config value, file, disk or lock the user can fix: `UserError`) ends a
console script with its message alone and exit status 1; `verbose=true` or HYDRA_FULL_ERROR=1 show the
traceback, and any other exception (a bug) keeps it."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from empathic_fusion.cli import user_errors
from empathic_fusion.core.errors import MissingFileError, UserError
from empathic_fusion.utils import PROJECT_ROOT
from tests.test_rating_scale import write_dataset


def _error_classes() -> list[tuple[type, type]]:
    from empathic_fusion.app.clip import ClipError
    from empathic_fusion.config import ConfigError
    from empathic_fusion.core.branches import UnknownBranchError
    from empathic_fusion.datamodules.frame_cache import FrameCacheSpaceError, FrameCacheWriteError
    from empathic_fusion.datamodules.splits import TooFewParticipantsError
    from empathic_fusion.dataset import DatasetError
    from empathic_fusion.features.freshness import StaleFeaturesError
    from empathic_fusion.features.media import MediaError
    from empathic_fusion.features.openface_import import OpenFaceFormatError
    from empathic_fusion.features.store import StoreIntegrityError
    from empathic_fusion.models.checkpoints import IncompatibleResumeError, WrongKindError
    from empathic_fusion.models.fusion_module import FeatureMismatchError
    from empathic_fusion.scoring.table import TableError
    from empathic_fusion.datamodules.text_table import TextTableError

    return [(ConfigError, ValueError), (DatasetError, ValueError), (MediaError, RuntimeError),
            (StoreIntegrityError, RuntimeError), (StaleFeaturesError, RuntimeError),
            (FrameCacheSpaceError, OSError), (FrameCacheWriteError, OSError), (TableError, ValueError),
            (ClipError, ValueError), (OpenFaceFormatError, ValueError), (FeatureMismatchError, ValueError),
            (WrongKindError, ValueError), (IncompatibleResumeError, ValueError), (TextTableError, ValueError),
            (MissingFileError, FileNotFoundError), (UnknownBranchError, ValueError),
            (TooFewParticipantsError, ValueError)]


def test_every_user_error_keeps_the_builtin_type_callers_catch():
    for error, builtin in _error_classes():
        assert issubclass(error, UserError) and issubclass(error, builtin), error


def test_a_user_error_is_its_message_and_status_one(monkeypatch, caplog):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with caplog.at_level(logging.ERROR, logger="empathic_fusion.cli"), pytest.raises(SystemExit) as exit_info:
        with user_errors(OmegaConf.create({"verbose": False})):
            raise MissingFileError("ckpt_path=x.ckpt does not exist")
    assert exit_info.value.code == 1 and caplog.messages == ["ckpt_path=x.ckpt does not exist"]


@pytest.mark.parametrize("verbose, env", [(True, None), (False, "1")])
def test_verbose_or_hydra_full_error_pass_it_on_with_its_traceback(monkeypatch, verbose, env):
    if env is None:
        monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    else:
        monkeypatch.setenv("HYDRA_FULL_ERROR", env)
    with pytest.raises(MissingFileError):
        with user_errors(OmegaConf.create({"verbose": verbose})):
            raise MissingFileError("gone")


def test_a_bug_and_a_multirun_jobs_error_are_passed_on(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(KeyError), user_errors(OmegaConf.create({"verbose": False})):
        raise KeyError("a bug")
    monkeypatch.setattr("empathic_fusion.utils.multirun.in_multirun", lambda: True)
    with pytest.raises(MissingFileError), user_errors(OmegaConf.create({"verbose": False})):
        raise MissingFileError("recorded by the sweep (utils/multirun.py), which goes on")


# ---- the console scripts ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bad_dataset(tmp_path_factory) -> Path:
    """A 1-7 dataset with an unknown dataset.yaml key and a rating of 9."""
    root = write_dataset(tmp_path_factory.mktemp("bad") / "data", {"name": "bad", "fps": 15, "rating_scale": [1, 7],
                                                                   "sclae": "oops"})
    ratings = (root / "ratings.csv").read_text().splitlines()
    first = ratings[1].rsplit(",", 1)[0]
    (root / "ratings.csv").write_text("\n".join([ratings[0], f"{first},9", *ratings[2:]]) + "\n")
    return root


UNKNOWN_KEY = ("dataset.yaml, line 4, field 'sclae': is not a dataset.yaml key; the keys are name, fps, generated, "
               "rating_scale")
OFF_SCALE = "ratings.csv, line 2, field 'empathy': 9 is outside 1-7 (the rating_scale dataset.yaml declares)"


def _environment(full_error: bool = False) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    environment.update(PYTHONPATH=str(PROJECT_ROOT), OMP_NUM_THREADS="1")
    if full_error:
        environment["HYDRA_FULL_ERROR"] = "1"
    return environment


def _run(args: list[str], tmp_path: Path, full_error: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                          env=_environment(full_error), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("script, extra", [("train.py", ["modality=t", "logger=none"]), ("extract.py", [])])
def test_a_bad_dataset_stops_a_console_script_with_its_message_alone(bad_dataset, tmp_path, script, extra):
    done = _run([str(PROJECT_ROOT / script), f"data.dataset_dir={bad_dataset}", f"data.store_dir={tmp_path / 'store'}",
                 "data.demo=null", *extra], tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert UNKNOWN_KEY in output and OFF_SCALE in output
    assert "Traceback" not in output and "Error executing job" not in output


@pytest.mark.slow
@pytest.mark.parametrize("folds", [0, 2])
def test_a_dataset_too_small_to_split_stops_train_py_with_one_message(tmp_path, folds):
    """Two participants cannot fill a train, a validation and a test split, nor the folds of data.cv_folds=2 (the
    advice the old message gave): train.py says so before it extracts anything, with how many it needs."""
    sys.path.insert(0, str(PROJECT_ROOT))
    from benchmarks.grid import write_synthetic

    write_synthetic(tmp_path / "two", 0.002, 2, {"text": 384})  # two sessions, two participants
    done = _run([str(PROJECT_ROOT / "train.py"), "data=empathic_stories", f"data.dataset_dir={tmp_path / 'two' / 'dataset'}",
                 f"data.store_dir={tmp_path / 'two' / 'store'}", "modality=t", "logger=none", f"data.cv_folds={folds}"],
                tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "the dataset is too small to split: 2 participants with ratings (p0000, p0001)" in output, output[-3000:]
    assert f"(it needs at least {4 if folds else 3})" in output and "add participants" in output
    assert "Traceback" not in output and "Error executing job" not in output


@pytest.mark.slow
def test_hydra_full_error_shows_the_traceback(bad_dataset, tmp_path):
    done = _run([str(PROJECT_ROOT / "train.py"), f"data.dataset_dir={bad_dataset}", f"data.store_dir={tmp_path / 's'}",
                 "data.demo=null", "modality=t", "logger=none"], tmp_path, full_error=True)
    assert done.returncode == 1 and "Traceback" in done.stderr and UNKNOWN_KEY in done.stderr


@pytest.mark.slow
def test_a_bug_keeps_its_traceback(tmp_path):
    """An exception that is not a UserError (here a KeyError raised inside the run) is reported by Hydra,
    traceback and all. The run is a stand-in module that raises it, so the process does not import Lightning
    and the models for a run that never starts."""
    code = ("import sys, types\npipeline = types.ModuleType('empathic_fusion.pipeline')\n"
            "def bug(cfg):\n    raise KeyError('an internal bug')\n"
            "pipeline.train, pipeline.train_summary = bug, None\nsys.modules[pipeline.__name__] = pipeline\n"
            "from empathic_fusion.cli import train\n"
            f"sys.argv = ['train.py', 'hydra.run.dir={tmp_path / 'run'}', 'logger=none']\ntrain()\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_environment(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" in done.stderr and "KeyError: 'an internal bug'" in done.stderr
