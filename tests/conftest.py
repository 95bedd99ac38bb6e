"""Shared fixtures: one tiny demo dataset with real media and a filled feature store per test session."""
from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

import empathic_fusion.utils  # noqa: F401  (project_root resolver)
from empathic_fusion.core.packaged_encoders import ENV_DIR, encoders_dir
from empathic_fusion.utils import PROJECT_ROOT
from empathic_fusion.demo.generate import DemoConfig, generate_demo

FEATURES_CFG = {
    "face": {"min_detection_confidence": 0.5, "min_tracking_confidence": 0.5},
    "audio": {"feature_set": "ComParE_2016"},
    "text": {"model_path": None, "speakers": ["participant"], "batch_size": 64, "device": "cpu"},
}
INSTALLED_ENCODERS = encoders_dir()  # where `empathic-encoders install` put them, read before any test hides them


@pytest.fixture(scope="session", autouse=True)
def _no_installed_encoders(tmp_path_factory):
    """The session sees no installed packaged encoder (the text model's model_path=auto is then MiniLM,
    as on a fresh install, whatever this machine has installed; subprocesses inherit it), session
    fixtures included."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENV_DIR, str(tmp_path_factory.getbasetemp() / "no_installed_encoders"))
        yield


@pytest.fixture(autouse=True)
def _installed_encoders_when_marked(request, monkeypatch) -> None:
    """A test marked `installed_encoders` sees those this machine has."""
    if request.node.get_closest_marker("installed_encoders"):
        monkeypatch.setenv(ENV_DIR, str(INSTALLED_ENCODERS))


# Small but with a strong planted signal: many short sessions (the models learn from the number of
# sessions, not their length), little noise, one session per participant.
TINY_DEMO = DemoConfig(n_participants=40, sessions_per_participant=1, warm_up_s=1.0, story_share_s=8.0,
                       story_receive_s=1.0, reflection_s=4.0, cool_down_s=1.0, noise_sd=0.15, seed=3)


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    return generate_demo(tmp_path_factory.mktemp("demo") / "tiny", TINY_DEMO, workers=2)


@pytest.fixture(scope="session")
def tiny_store(tiny_dataset, tmp_path_factory) -> Path:
    """A store with every branch extracted (read-only for tests: copy it before changing it)."""
    from empathic_fusion.dataset import load_dataset
    from empathic_fusion.features.extract import extract_features
    from empathic_fusion.features.store import FeatureStore

    root = tmp_path_factory.mktemp("store") / "features"
    report = extract_features(load_dataset(tiny_dataset), FeatureStore(root), ["video", "audio", "text"],
                              FEATURES_CFG, workers=2, progress=False)
    assert not report.failures, report.summary()
    return root


T = TypeVar("T")


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], T]) -> T:
    """`make(folder)` once per test session, however many pytest-xdist workers ask: the first one makes it in a
    folder all of them share, the others wait for it and read its pickled result. For a module fixture whose
    tests spread over both workers of `make test` (each worker would build it again); its tests must only read
    what it made."""
    shared = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        shared = shared.parent  # the session's folder above each worker's own (removed when that worker ends)
    folder, result = shared / name, shared / f"{name}.pickle"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if result.is_file():
            return pickle.loads(result.read_bytes())
        shutil.rmtree(folder, ignore_errors=True)  # what a worker whose `make` failed left
        folder.mkdir(parents=True)
        made = make(folder)
        result.write_bytes(pickle.dumps(made))
        return made


def write_session_tables(source: Path, root: Path, sessions) -> None:
    """sessions.csv, ratings.csv and participants.csv at root for `sessions` (rows of source's sessions.csv): a
    dataset cut to those sessions, their ratings and their participants; root may be source (cut in place)."""
    import pandas as pd

    sessions.to_csv(root / "sessions.csv", index=False)
    for name, key, kept in (("ratings", "session_id", sessions.session_id),
                            ("participants", "participant_id", sessions.participant_id)):
        table = pd.read_csv(source / f"{name}.csv", keep_default_na=False)
        table[table[key].isin(kept)].to_csv(root / f"{name}.csv", index=False)


SYNTHETIC_BRANCHES = {"face": 24, "audio": 8, "text": 384}  # the synthetic store's branches and their small dims


@pytest.fixture(scope="session")
def synthetic_store(tmp_path_factory) -> tuple[Path, Path]:
    """(dataset, store): a dataset in the contract's layout with a filled store in the store's real format at 0.002
    of the corpus (benchmarks/grid.py), which needs no extraction."""
    import sys

    sys.path.insert(0, str(PROJECT_ROOT))
    from benchmarks.grid import write_synthetic

    root = tmp_path_factory.mktemp("synthetic")
    write_synthetic(root, 0.002, 10, SYNTHETIC_BRANCHES)
    return root / "dataset", root / "store"


@pytest.fixture
def dataset_copy(tiny_dataset, tmp_path) -> Path:
    """A private copy of the tiny dataset that a test may damage."""
    return Path(shutil.copytree(tiny_dataset, tmp_path / "dataset"))


@pytest.fixture
def store_copy(tiny_store, tmp_path) -> Path:
    """A private copy of the tiny store (without the frame caches other tests' runs left in it)."""
    return Path(shutil.copytree(tiny_store, tmp_path / "store", ignore=shutil.ignore_patterns("frame_cache")))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns xdist_group markers into node-id suffixes
def pytest_collection_modifyitems(config, items) -> None:
    """Tests that read the extracted tiny store are `slow` (extracting it is the slow part of a session);
    under `pytest -n 2 --dist loadgroup` (make test) every test of the tiny dataset runs in one worker, so
    it is generated and extracted once; tests marked `gpu` are skipped, with the reason, where torch sees
    no CUDA GPU."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "tiny_store" in fixtures:
            item.add_marker(pytest.mark.slow)
        if "tiny_dataset" in fixtures:
            item.add_marker(pytest.mark.xdist_group("tiny_dataset"))
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_tests:
        item.add_marker(skip)


_TREE_KEY = pytest.StashKey[set]()


def _tree_status() -> set[str] | None:
    """`git status --porcelain` lines of the checkout (tracked changes and untracked, not ignored, files);
    None outside a git checkout."""
    try:
        done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=PROJECT_ROOT,
                              capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return set(done.stdout.splitlines())


def pytest_sessionstart(session) -> None:
    session.config.stash[_TREE_KEY] = _tree_status()


def pytest_sessionfinish(session, exitstatus) -> None:
    """No test may write into the source tree: files the session changed or added (outside .gitignore)
    fail the run, named."""
    before = session.config.stash.get(_TREE_KEY, None)
    after = _tree_status()
    if before is None or after is None:
        return
    changed = sorted(after - before)
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = "tests changed the source tree (git status):\n  " + "\n  ".join(changed)
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
