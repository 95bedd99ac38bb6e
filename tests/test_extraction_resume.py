"""An extraction killed mid-way completes on rerun with arrays byte-identical to an uninterrupted run;
finished sessions are not touched; shards split the sessions; the command prints every branch's dims."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from empathic_fusion.dataset import load_dataset
from empathic_fusion.demo.generate import DemoConfig, generate_demo
from empathic_fusion.features.extract import extract_features, parse_shard
from empathic_fusion.features.store import FeatureStore
from empathic_fusion.utils import PROJECT_ROOT
from tests.conftest import FEATURES_CFG

pytestmark = pytest.mark.slow

SMALL = DemoConfig(n_participants=3, sessions_per_participant=1, warm_up_s=1.0, story_share_s=6.0,
                   story_receive_s=1.0, reflection_s=4.0, cool_down_s=1.0, seed=5)
# every branch kind: the CNN embeds every 15th frame (one a second) to stay fast on a CPU
CFG = {**FEATURES_CFG, "modalities": {"video": ["face", "cnn"], "audio": ["audio"], "text": ["text", "glove"]},
       "cnn": {"frame_stride": 15, "batch_size": 8, "device": "cpu"}}
CLI_CFG = ["features.modalities.video=[face,cnn]", "features.modalities.text=[text,glove]",
           "features.cnn.frame_stride=15", "features.cnn.batch_size=8", "features.cnn.device=cpu"]


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> Path:
    return generate_demo(tmp_path_factory.mktemp("resume") / "small", SMALL, workers=1)


@pytest.fixture(scope="module")
def reference_store(small_dataset, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("reference") / "store"
    report = extract_features(load_dataset(small_dataset), FeatureStore(root), ["video", "audio", "text"], CFG,
                              workers=1, progress=False)
    assert not report.failures, report.summary()
    return root


def _arrays(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.glob("sessions/*/*/*.npy"))}


def _command(dataset: Path, store: Path, *extra: str) -> list[str]:
    return [sys.executable, str(PROJECT_ROOT / "extract.py"), "data=empathic_stories", f"data.dataset_dir={dataset}",
            f"data.store_dir={store}", "workers=1", "progress=false", *CLI_CFG,
            f"hydra.run.dir={store.parent / 'run'}", *extra]


def test_killed_extraction_completes_byte_identical(small_dataset, reference_store, tmp_path):
    store_root = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    process = subprocess.Popen(_command(small_dataset, store_root), cwd=PROJECT_ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    done_at_kill: list[Path] = []
    try:
        while time.monotonic() < deadline and process.poll() is None:
            manifests = list(store_root.glob("sessions/*/manifest.json"))
            done_at_kill = [m.parent for m in manifests if "face" in json.loads(m.read_text() or "{}")]
            if done_at_kill:  # the first session's video branch is written: kill now, mid-way
                process.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    assert done_at_kill, "the extraction finished or stalled before a media branch was written"
    partial = _arrays(store_root)
    assert len(partial) < len(_arrays(reference_store)), "the kill came after everything was written"
    finished = {p: p.stat().st_mtime_ns for d in done_at_kill for p in d.glob("face/*.npy")}

    report = extract_features(load_dataset(small_dataset), FeatureStore(store_root), ["video", "audio", "text"], CFG,
                              workers=1, progress=False)
    assert not report.failures and report.extracted, report.summary()
    assert not any(p.name.startswith(".") for p in store_root.rglob("*") if p.is_dir())  # no temp folders left
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # finished branches untouched
    resumed, reference = _arrays(store_root), _arrays(reference_store)
    assert resumed.keys() == reference.keys()
    different = [name for name in reference if resumed[name] != reference[name]]
    assert not different, f"arrays differ from the uninterrupted run: {different}"


def test_rows_written_to_disk_while_extracted_store_the_same_bytes(small_dataset, reference_store, tmp_path,
                                                                   monkeypatch):
    """Every session's face and CNN rows go to disk while extracted (as a long session's do): the store holds
    the same bytes as the reference's, and no rows folder is left behind."""
    from empathic_fusion.features import frame_rows
    from empathic_fusion.features.frame_rows import NpyFile

    monkeypatch.setattr(frame_rows, "SPILL_BYTES", 1)
    handed: list[tuple[str, str]] = []
    write_branch = FeatureStore.write_branch

    def spy(self, owner, branch, arrays, *args, **kwargs):
        handed.extend((branch, name) for name, array in arrays.items() if isinstance(array, NpyFile))
        return write_branch(self, owner, branch, arrays, *args, **kwargs)

    monkeypatch.setattr(FeatureStore, "write_branch", spy)
    dataset = load_dataset(small_dataset)
    report = extract_features(dataset, FeatureStore(tmp_path / "store"), ["video"], CFG, workers=1, progress=False)
    assert not report.failures, report.summary()
    assert sorted(set(handed)) == [("cnn", "features"), ("face", "features")]
    assert len(handed) == 2 * len(dataset.sessions)
    assert not [p for p in (tmp_path / "store").rglob(".*") if p.is_dir()]  # no rows or temporary folder left
    ours = _arrays(tmp_path / "store")
    assert ours and all(ours[name] == (reference_store / name).read_bytes() for name in ours)
    assert {name.split("/")[2] for name in ours} == {"face", "cnn"}


def test_a_disk_that_runs_full_while_rows_are_written_stops_the_run_naming_the_session(small_dataset, tmp_path,
                                                                                        monkeypatch):
    from empathic_fusion.features import frame_rows
    from empathic_fusion.features.store import StoreSpaceError

    def full(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        raise OSError(28, "No space left on device", str(self.folder / f"{self.name}.npy"))

    monkeypatch.setattr(frame_rows, "SPILL_BYTES", 1)
    monkeypatch.setattr(frame_rows.FrameRows, "_open", full)
    store = tmp_path / "store"
    first = sorted(load_dataset(small_dataset).sessions.index)[0]
    with pytest.raises(StoreSpaceError) as info:
        extract_features(load_dataset(small_dataset), FeatureStore(store), ["video"], CFG, workers=1, progress=False)
    assert str(info.value).startswith(f"feature store {store}: the disk is full: session '{first}', branch 'face' "
                                      f"needs ")
    assert "No space left on device" in str(info.value) and "nothing of it was kept and extraction stopped" in \
        str(info.value)
    failures = json.loads((store / "failures.json").read_text())
    assert [(f["session_id"], f["branch"]) for f in failures] == [(first, "face")]
    assert not list(store.glob("sessions/*/*")) and not list(store.glob("sessions/*/.*"))  # nothing, no rows folder


def test_shards_split_sessions_and_report_failures_apart(small_dataset, reference_store, tmp_path):
    dataset = load_dataset(small_dataset)
    store = FeatureStore(tmp_path / "store")
    reports = [extract_features(dataset, store, ["text"], CFG, progress=False, shard=f"{i}/3") for i in range(3)]
    owned = [sorted({sid for sid, _ in r.extracted if sid != "_dataset"}) for r in reports]
    assert sorted(sum(owned, [])) == sorted(dataset.sessions.index) and all(owned)
    assert [r.skipped_sessions for r in reports] == [len(dataset.sessions) - len(o) for o in owned]
    assert [("_dataset", "stories") in r.extracted for r in reports] == [True, False, False]  # one writer only
    assert {p.name for p in store.root.glob("failures*.json")} == {f"failures-shard{i}of3.json" for i in range(3)}
    # each shard its own hash cache (shards running at once never rewrite one file); merging joins them
    assert {p.name for p in store.root.glob("file_hashes*.json")} == {f"file_hashes-shard{i}of3.json" for i in range(3)}
    assert not store.merge_shards(3).missing and [p.name for p in store.root.glob("file_hashes*.json")] == ["file_hashes.json"]
    for name, data in _arrays(store.root).items():
        assert data == (reference_store / name).read_bytes()
    with pytest.raises(ValueError, match="0..2"):
        parse_shard("3/3")


def test_command_prints_dims_and_lists_failures(small_dataset, reference_store, tmp_path):
    import shutil

    store_root = Path(shutil.copytree(reference_store, tmp_path / "store"))
    sid = sorted(load_dataset(small_dataset).sessions.index)[0]
    broken = tmp_path / "dataset"
    shutil.copytree(small_dataset, broken)
    (broken / pd.read_csv(broken / "sessions.csv").set_index("session_id").video[sid]).write_bytes(b"not a video" * 50)
    result = subprocess.run(_command(broken, store_root, "modality=v+a+t"), cwd=PROJECT_ROOT, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    out = result.stdout
    assert "| face | 1451 |" in out and "| audio | 65 |" in out and "| text | 384 |" in out and "| glove | 50 |" in out
    assert "| cnn | 1280 |" in out and "video = face + cnn = 2731 per frame" in out
    assert "text = text + glove = 434 per frame" in out
    failures = json.loads((store_root / "failures.json").read_text())
    assert sorted((f["session_id"], f["branch"]) for f in failures) == [(sid, "cnn"), (sid, "face")]
    assert "cannot open video" in failures[0]["error"] or "no frame" in failures[0]["error"]
