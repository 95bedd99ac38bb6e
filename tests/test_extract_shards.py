"""Extraction as a job array: `extract.py -m shard=0/2,1/2` through a Hydra launcher that starts each shard
in its own process fills one shared store whose arrays equal a single-process extraction's; when the
multirun ends the shards' failure reports and hash caches are merged, and `verify=true` finds every
branch up to date."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from empathic_fusion.features.command import merge_command, run_extraction
from empathic_fusion.features.store import FeatureStore
from empathic_fusion.utils import CONFIG_DIR, PROJECT_ROOT
from tests.conftest import write_session_tables

pytestmark = pytest.mark.xdist_group("tiny_dataset")

SESSIONS = 4  # face tracking costs about 2 s a session on one core: a few sessions keep the test fast
BRANCHES = ("face", "audio", "text")  # the tiny store's: features=default with modality=v+a+t


@pytest.fixture
def few_sessions(tiny_dataset: Path, tmp_path: Path) -> Path:
    """The tiny dataset's first sessions (media linked, not copied), with the audio of the first two
    replaced by bytes no decoder reads: shard 0 owns the first session, shard 1 the second."""
    root = tmp_path / "dataset"
    (root / "media").mkdir(parents=True)
    (root / "transcripts").mkdir()
    sessions = pd.read_csv(tiny_dataset / "sessions.csv").sort_values("session_id").head(SESSIONS)
    write_session_tables(tiny_dataset, root, sessions)
    for name in ("dataset.yaml", "stories.csv"):
        (root / name).write_bytes((tiny_dataset / name).read_bytes())
    for position, row in enumerate(sessions.itertuples()):
        (root / "transcripts" / f"{row.session_id}.csv").symlink_to(tiny_dataset / "transcripts" / f"{row.session_id}.csv")
        (root / row.video).symlink_to(tiny_dataset / row.video)
        if position < 2:  # each its own bytes: equal recordings of two participants would fail the dataset check
            (root / row.audio).write_bytes(f"not audio {row.session_id} ".encode() * 64)
        else:
            (root / row.audio).symlink_to(tiny_dataset / row.audio)
    return root


def _overrides(dataset: Path, store: Path) -> list[str]:
    return ["data=empathic_stories", f"data.dataset_dir={dataset}", f"data.store_dir={store}", "modality=v+a+t",
            "workers=1", "progress=false"]


def _extract(dataset: Path, store: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """extract.py -m ... in a fresh interpreter, as on a cluster's login node."""
    command = [sys.executable, str(PROJECT_ROOT / "extract.py"), "-m", *_overrides(dataset, store),
               f"hydra.sweep.dir={tmp_path / 'sweep'}", *extra]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)


def _sha256s(store: Path, sid: str) -> dict[str, dict[str, str]]:
    manifest = json.loads((store / "sessions" / sid / "manifest.json").read_text())
    return {branch: {name: record["sha256"] for name, record in manifest[branch]["arrays"].items()}
            for branch in BRANCHES if branch in manifest}


def test_two_shards_through_a_launcher_equal_one_process(few_sessions, tiny_store, tmp_path):
    store = tmp_path / "store"
    # submitit's local launcher: each shard a separate process, both running at once
    done = _extract(few_sessions, store, tmp_path, "hydra/launcher=submitit_local", "shard=0/2,1/2")
    assert done.returncode == 1, done.stderr[-3000:]  # the two broken recordings fail; the sweep still ends merged
    sids = sorted(pd.read_csv(few_sessions / "sessions.csv").session_id)
    records = sorted((json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/extraction.json")),
                     key=lambda r: r["shard"])
    assert [r["shard"] for r in records] == [[0, 2], [1, 2]] and all(r["extracted"] for r in records)

    # the failures of both shards in one report, and printed when the multirun ends
    failures = json.loads((store / "failures.json").read_text())
    assert [(f["session_id"], f["branch"], f["shard"]) for f in failures] == [(sids[0], "audio", "0/2"),
                                                                              (sids[1], "audio", "1/2")]
    assert f"FAILED {sids[0]}/audio (shard 0/2)" in done.stdout and f"FAILED {sids[1]}/audio (shard 1/2)" in done.stdout
    assert "2 of 2 shard(s) merged: 2 failure(s)" in done.stdout
    # one hash cache again, holding every input file both shards hashed
    assert not list(store.glob("file_hashes-shard*")) and sorted(p.name for p in store.glob("failures*.json")) == [
        "failures-shard0of2.json", "failures-shard1of2.json", "failures.json"]
    hashed = json.loads((store / "file_hashes.json").read_text())
    assert {str((few_sessions / "media" / f"{sid}.avi").resolve()) for sid in sids} <= set(hashed)

    # every array as a single process wrote it (the tiny store: one process over the whole dataset)
    for position, sid in enumerate(sids):
        expected = _sha256s(tiny_store, sid)
        if position < 2:
            expected.pop("audio")
        assert _sha256s(store, sid) == expected, sid
    stories = [json.loads((root / "dataset" / "manifest.json").read_text())["stories"]["arrays"]["embeddings"]["sha256"]
               for root in (store, tiny_store)]
    assert stories[0] == stories[1]

    # the merged store is up to date: verify re-hashes every array and redoes nothing (in this process: the
    # command is the same, and a third interpreter start would only cost time)
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("extract", overrides=[*_overrides(few_sessions, store), "verify=true"])
    report = run_extraction(cfg)
    assert not report.extracted and not report.damaged, report.summary()
    assert len(report.up_to_date) == SESSIONS * len(BRANCHES) - 2 + 1  # + the stories
    assert sorted((f["session_id"], f["branch"]) for f in report.failures) == [(sids[0], "audio"), (sids[1], "audio")]


def test_shards_expand_to_one_job_each_and_merge_by_hand(tmp_path):
    """`shards=N` gives the sweeper one job per shard; `merge=true` joins the shards' reports."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("extract", overrides=["shards=3", f"data.store_dir={tmp_path / 'store'}"],
                      return_hydra_config=True)
        assert cfg.hydra.sweeper.params.shard == "0/3,1/3,2/3"
        assert compose("extract", return_hydra_config=True).hydra.sweeper.params.shard == "null"
        slurm = compose("extract", overrides=["hydra/launcher=extract_slurm", "workers=6"], return_hydra_config=True)
        assert slurm.hydra.launcher.gpus_per_node == 0 and slurm.hydra.launcher.cpus_per_task == 6
        assert slurm.hydra.launcher.mem_gb == 4 + 2 * 6  # a base and 2 GB per worker
        assert type(instantiate(slurm.hydra.launcher)).__name__ == "SweepSlurmLauncher"
        merge = compose("extract", overrides=["merge=true", f"data.store_dir={tmp_path / 'store'}"])
    store = FeatureStore(tmp_path / "store")
    store.write_failures([{"session_id": "b", "branch": "audio", "error": "broken"}], (1, 3))
    store.write_failures([], (0, 3))
    assert merge_command(merge)  # shard 2 left no report: not finished
    assert json.loads((store.root / "failures.json").read_text()) == [
        {"session_id": "b", "branch": "audio", "error": "broken", "shard": "1/3"}]
