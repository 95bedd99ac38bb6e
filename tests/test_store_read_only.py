"""A lab's finished feature store on a read-only mount (or another user's folder) is read as it is: training,
evaluation and prediction on an up-to-date store write nothing into it (the frame cache goes where
data.frame_cache_dir says); extraction into a read-only place, or a read-only store with something stale,
stops with one message naming the folder, the branches and data.store_dir, without a traceback.

A read-only place is made the way a cluster has one: a read-only bind mount in a private mount namespace
(`unshare -m`, as root, who ignores permissions) or, for anyone else, write permission taken away. The
store is the 1-7 test dataset's text branch (test_rating_scale.write_dataset: tables and transcripts, no
media), so one run trains in seconds."""
from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import pandas as pd
import pytest

from empathic_fusion.dataset import load_dataset
from empathic_fusion.features.extract import extract_features
from empathic_fusion.features.store import FeatureStore, StoreLocationError, StoreReadOnlyError
from empathic_fusion.core.errors import UserError
from empathic_fusion.utils import PROJECT_ROOT
from tests.conftest import FEATURES_CFG
from tests.test_rating_scale import write_dataset

FAILED = "p002_s1"  # the session whose text extraction failed in the lab's store (listed in its failures.json)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under root (its modification time changes when an entry is added or removed)
    with its size and modification time: what a run wrote there, if anything."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in [root, *root.rglob("*")]}


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict[str, Path]:
    """The lab's dataset and its finished text store."""
    root = tmp_path_factory.mktemp("lab")
    dataset = write_dataset(root / "dataset", {"name": "lab", "fps": 15, "rating_scale": [1, 7]})
    report = extract_features(load_dataset(dataset, ["text"]), FeatureStore(root / "store"), ["text"], FEATURES_CFG,
                              progress=False)
    assert not report.failures, report.summary()
    return {"dataset": dataset, "store": root / "store"}


@pytest.fixture
def lab_store(lab, tmp_path) -> Path:
    return Path(shutil.copytree(lab["store"], tmp_path / "store"))


def _fail_a_session(store: Path) -> None:
    """Leave the store as a failed extraction does: the session's branch missing, failures.json listing it."""
    shutil.rmtree(store / "sessions" / FAILED)
    (store / "failures.json").write_text(json.dumps(
        [{"session_id": FAILED, "branch": "text", "error": "OSError: the transcript could not be read"}], indent=1))


# ---- no writes when nothing changed (any user) -------------------------------------------------------------

@pytest.mark.slow  # extracts the lab's store (loads the sentence encoder)
def test_an_up_to_date_run_writes_nothing_into_the_store(lab, lab_store):
    """What training, evaluation and prediction call first (extract_features, in prepare_data) found
    everything up to date but rewrote file_hashes.json and failures.json on every run."""
    before = _tree(lab_store)
    report = extract_features(load_dataset(lab["dataset"], ["text"]), FeatureStore(lab_store), ["text"],
                              FEATURES_CFG, progress=False)
    assert not report.extracted and len(report.up_to_date) == 11 and not report.failures  # 10 sessions, the stories
    assert _tree(lab_store) == before


def test_the_hash_cache_is_written_only_after_a_new_hash(tmp_path):
    store = FeatureStore(tmp_path / "store")
    media = tmp_path / "a.txt"
    media.write_text("recording")
    assert not store.save_hash_cache()  # nothing hashed yet: no file
    assert not (store.root / "file_hashes.json").exists()
    digest = store.file_hash(media)
    assert store.save_hash_cache() and (store.root / "file_hashes.json").exists()
    written = (store.root / "file_hashes.json").stat().st_mtime_ns
    again = FeatureStore(store.root)
    assert again.file_hash(media) == digest and not again.save_hash_cache()  # cached: not rewritten
    assert (store.root / "file_hashes.json").stat().st_mtime_ns == written
    media.write_text("another recording")
    assert again.file_hash(media) != digest and again.save_hash_cache()  # changed file: saved


def test_an_unchanged_failure_report_is_not_rewritten(tmp_path):
    store = FeatureStore(tmp_path / "store")
    failures = [{"session_id": "s1", "branch": "face", "error": "no frame"},
                {"session_id": "s2", "branch": "audio", "error": "no audio stream"}]
    path = store.write_failures(failures)
    written = path.stat().st_mtime_ns
    assert store.write_failures(list(reversed(failures))) == path and path.stat().st_mtime_ns == written
    store.write_failures(failures[:1])
    assert json.loads(path.read_text()) == failures[:1]


def test_the_read_only_error_is_a_user_error_naming_the_folder_and_the_setting(tmp_path):
    """A UserError (the console scripts print its message alone, exit status 1) and an OSError."""
    assert issubclass(StoreReadOnlyError, UserError) and issubclass(StoreReadOnlyError, OSError)
    assert issubclass(StoreReadOnlyError, StoreLocationError)
    error = FeatureStore(tmp_path / "store").read_only_error(errno.EROFS, "it would write", ["session 's1': stale"])
    assert str(error) == (
        f"feature store {tmp_path / 'store'} is read-only for this run (Read-only file system), and it would write; "
        f"nothing was written. Ask the store's owner to run extract.py on it, or copy it to a writable folder and set "
        f"data.store_dir to that folder (data.store_dir=/scratch/$USER/features extracts a store of your own). To "
        f"extract:\n  session 's1': stale")


# ---- a read-only place -----------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _bind_mounts_work() -> bool:
    """Whether `unshare -m` gives this (root) process a read-only bind mount that refuses writes."""
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"read-only-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        done = subprocess.run(["unshare", "-m", "sh", "-c", _mounts([probe]) + f" && ! touch {shlex.quote(str(probe / 'x'))}"],
                              capture_output=True, timeout=30)
        return done.returncode == 0 and not (probe / "x").exists()
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _mounts(paths: list[Path]) -> str:
    return " && ".join(f"mount --bind {shlex.quote(str(p))} {shlex.quote(str(p))} && mount -o remount,bind,ro "
                       f"{shlex.quote(str(p))}" for p in paths)


@contextmanager
def read_only(*paths: Path) -> Iterator[list[str]]:
    """The command prefix that runs a command with `paths` read-only: as root (who ignores permissions) a
    read-only bind mount in a private mount namespace, gone with the command; for anyone else the write
    permission is taken away meanwhile. Skips the test where neither is possible."""
    if os.geteuid() == 0:
        if not _bind_mounts_work():
            pytest.skip("running as root, which ignores file permissions, and `unshare -m` cannot make a read-only "
                        "bind mount here")
        yield ["unshare", "-m", "sh", "-c", _mounts(list(paths)) + ' && exec "$@"', "sh"]
        return
    modes = {p: p.stat().st_mode for root in paths for p in [root, *root.rglob("*")]}
    try:
        for p, mode in sorted(modes.items(), reverse=True):  # files before their folders
            p.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        yield []
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def _environment() -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    environment.update(PYTHONPATH=str(PROJECT_ROOT), OMP_NUM_THREADS="1")
    return environment


# The whole read-only session in one interpreter (a start costs seconds): each step's outcome goes to a
# JSON file. `extract.py` runs through its console entry point (cli.extract: the clean-error path).
SESSION = r'''
import json, sys, traceback
from pathlib import Path

args = json.loads(sys.argv[1])
tmp = Path(args["tmp"])
results = {}
try:
    sys.argv = ["extract.py", f"data.dataset_dir={args['readonly_dataset']}",
                f"data.store_dir={args['readonly_dataset']}/features", "data.demo=null", "modality=t",
                f"hydra.run.dir={tmp / 'extract'}"]
    from empathic_fusion.cli import extract
    try:
        extract()
        results["extract"] = "no exit"
    except SystemExit as exit_:
        results["extract"] = exit_.code
    from hydra.core.global_hydra import GlobalHydra
    GlobalHydra.instance().clear()

    from empathic_fusion.datamodules.frame_cache import FrameCacheWriteError
    from empathic_fusion.features.store import StoreReadOnlyError
    from empathic_fusion.pipeline import evaluate, train
    from empathic_fusion.scoring.command import run_predict
    from empathic_fusion.compose import compose_config

    common = [f"data.store_dir={args['store']}", "data.demo=null", "modality=t", "data.split_fractions=[0.6,0.2,0.2]",
              "data.extract_workers=1", "trainer.max_epochs=1", "evaluation=lean",
              "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
              "logger=none"]
    cache = [f"data.frame_cache_dir={tmp / 'frame_cache'}"]
    try:
        train(compose_config([f"data.dataset_dir={args['stale']}", *common, *cache], tmp / "stale"))
        results["stale"] = "trained"
    except StoreReadOnlyError as error:
        results["stale"] = str(error)
    try:
        train(compose_config([f"data.dataset_dir={args['dataset']}", *common], tmp / "default_cache"))
        results["default_cache"] = "trained"
    except FrameCacheWriteError as error:
        results["default_cache"] = str(error)
    trained = train(compose_config([f"data.dataset_dir={args['dataset']}", *common, *cache], tmp / "train"))
    results["ckpt"] = trained["best_checkpoint"]
    results["test"] = trained["model"]["rating"]["mse"]
    summary = evaluate(compose_config([f"ckpt_path={trained['best_checkpoint']}", "evaluation=lean",
                                       "trainer.enable_progress_bar=false",
                                       "trainer.enable_model_summary=false"], tmp / "evaluate", "evaluate"))
    results["evaluate"] = summary["model"]["rating"]["mse"]
    predicted = run_predict(compose_config([f"ckpt_path={trained['best_checkpoint']}",
                                            f"data.dataset_dir={args['dataset']}", f"data.store_dir={args['store']}",
                                            f"out_dir={tmp / 'predictions'}", "progress=false"], tmp / "predict",
                                           config_name="predict"))
    results["scored"] = predicted.scored
except BaseException:
    results["error"] = traceback.format_exc()
(tmp / "results.json").write_text(json.dumps(results))
'''


@pytest.mark.slow  # trains twice, evaluates and predicts in a subprocess
def test_a_read_only_store_is_trained_evaluated_and_predicted_on_without_a_write(lab, lab_store, tmp_path):
    """Up to date: train, evaluate and predict run and the store is byte for byte and time for time as it was
    (file_hashes.json, failures.json, the split, lock files, manifests), the frame cache in data.frame_cache_dir.
    Its failed session is not retried. Stale (a transcript edited since): training stops naming the session
    and branch and that the store is read-only. Extraction into a read-only dataset folder stops naming the
    folder and data.store_dir, without a traceback."""
    _fail_a_session(lab_store)
    stale = Path(shutil.copytree(lab["dataset"], tmp_path / "stale"))
    transcript = stale / "transcripts" / "p003_s1.csv"
    table = pd.read_csv(transcript, keep_default_na=False)
    table.loc[1, "text"] = "Actually my day was wonderful."
    table.to_csv(transcript, index=False)
    readonly_dataset = Path(shutil.copytree(lab["dataset"], tmp_path / "readonly_dataset"))
    runs = tmp_path / "runs"
    runs.mkdir()
    args = {"tmp": str(runs), "store": str(lab_store), "dataset": str(lab["dataset"]), "stale": str(stale),
            "readonly_dataset": str(readonly_dataset)}
    before = _tree(lab_store)
    with read_only(lab_store, readonly_dataset) as prefix:
        done = subprocess.run([*prefix, sys.executable, "-c", SESSION, json.dumps(args)], cwd=tmp_path,
                              env=_environment(), capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    results = json.loads((runs / "results.json").read_text())
    assert "error" not in results, results.get("error", "") + output[-3000:]

    # extraction into the read-only dataset folder: one message, no traceback, status 1, nothing created
    assert results["extract"] == 1
    assert (f"feature store folder {readonly_dataset}/features cannot be created: {readonly_dataset} is not "
            f"writable") in output and "Set data.store_dir to a writable folder" in output
    assert "Traceback" not in output and "Error executing job" not in output
    assert not (readonly_dataset / "features").exists()

    # stale on a read-only store: stops before writing, naming the branch
    assert f"feature store {lab_store} is read-only for this run" in results["stale"]
    assert "session 'p003_s1', branch 'text': stale (input 'transcript' changed)" in results["stale"]
    assert "data.store_dir" in results["stale"]
    # the frame cache's default place is in the store: its own message says to set data.frame_cache_dir
    assert "data.frame_cache_dir" in results["default_cache"] and str(lab_store) in results["default_cache"]

    # up to date: trained, evaluated (the same test metrics) and predicted without a write into the store
    assert results["evaluate"] == pytest.approx(results["test"], abs=1e-6)
    assert results["scored"] > 0
    assert list((runs / "frame_cache").iterdir())
    assert _tree(lab_store) == before
    assert "split file" in output and "cannot be written" in output  # the split is used without being saved
    assert f"not retried ({FAILED}/text)" in output
    predictions = (runs / "predictions" / "predictions.csv").read_text()
    assert FAILED in predictions  # listed, not scored: its text features are missing
