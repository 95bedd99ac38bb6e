"""A single shard run (`extract.py shard=i/n`, no multirun) leaves its own failure report and hash cache
beside the merged ones until `merge=true`: its last line names them and the command that merges them. The
dataset is the test dataset's transcripts with the packaged GloVe vectors (no encoder to load), shard 1 of
2 (shard 0 would also embed the stories)."""
from __future__ import annotations

import shlex
from pathlib import Path

from empathic_fusion.features.command import merge_command, run_extraction, shard_merge_note
from empathic_fusion.features.store import FeatureStore
from empathic_fusion.compose import compose_config
from tests.test_rating_scale import write_dataset


def _extract_config(dataset: Path, store: Path, out: Path, *extra: str):
    return compose_config([f"data.dataset_dir={dataset}", f"data.store_dir={store}", "data.demo=null", "modality=t",
                           "features.modalities.text=[glove]", "progress=false", *extra], out, "extract")


def test_a_shard_runs_last_line_names_its_files_and_the_merge_command(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "data", {"name": "shards", "fps": 15}, seven=False)
    store = tmp_path / "my store"  # a space: the command quotes it
    report = run_extraction(_extract_config(dataset, store, tmp_path / "run", "shard=1/2"))
    assert report.extracted and not report.failures
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (f"shard 1/2: its failures-shard1of2.json and file_hashes-shard1of2.json stay in {store} until the "
                    f"shards are merged into failures.json and file_hashes.json; when all 2 shards have finished, run: "
                    f"python extract.py merge=true data.store_dir='{store}' shards=2")

    # the command it names merges them (shard 0 never ran: reported missing)
    overrides = shlex.split(last.split("run: ", 1)[1])[2:]
    assert merge_command(compose_config(overrides, tmp_path / "merge", "extract"))  # True: a shard is missing
    assert sorted(p.name for p in store.glob("file_hashes*.json")) == ["file_hashes.json"]
    assert "shard 0/2 did not finish" in capsys.readouterr().out


def test_a_shard_that_left_no_files_gets_no_note(tmp_path):
    """A shard whose report was merged away (or a read-only store it could not write) names nothing to merge."""
    assert shard_merge_note(FeatureStore(tmp_path / "store"), (0, 4)) is None
