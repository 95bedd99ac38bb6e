"""Feature store: shapes, reruns that skip, staleness per branch, and bad media handled without loss."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from empathic_fusion.dataset import load_dataset
from empathic_fusion.demo.face import write_face_video
from empathic_fusion.features.extract import extract_features
from empathic_fusion.features.face_mesh import FACE_DIM
from empathic_fusion.features.store import DATASET_KEY, FeatureStore
from tests.conftest import FEATURES_CFG, write_session_tables


def _extract(dataset_root, store_root, modalities=("video", "audio", "text"), cfg=FEATURES_CFG):
    return extract_features(load_dataset(dataset_root), FeatureStore(store_root), list(modalities), cfg,
                            workers=1, progress=False)


def _first_session(root) -> str:
    return pd.read_csv(root / "sessions.csv").session_id[0]


def test_store_layout_dims_and_masks(tiny_dataset, tiny_store):
    store = FeatureStore(tiny_store)
    sid = _first_session(tiny_dataset)
    face = store.load(sid, "face", "features")
    assert isinstance(face, np.memmap) and face.dtype == np.float16 and face.shape[1] == FACE_DIM
    assert store.load(sid, "face", "mask").mean() > 0.95  # the demo face is found in (nearly) every frame
    audio = store.load(sid, "audio", "features")
    assert audio.shape[1] == 65 and abs(len(audio) - len(face)) <= 1  # one row per video frame
    assert store.load(sid, "text", "utterances").shape[1] == 384
    assert store.load(DATASET_KEY, "stories", "embeddings").shape == (len(load_dataset(tiny_dataset).stories), 384)
    entry = store.entry(sid, "face")
    assert entry["signature"]["extractor"] == "mediapipe_face_mesh" and len(entry["signature"]["inputs"]["video"]) == 64
    assert json.loads((tiny_store / "failures.json").read_text()) == []


def test_rerun_skips_everything_and_changes_nothing(tiny_dataset, store_copy):
    before = {p: p.stat().st_mtime_ns for p in store_copy.rglob("*.npy")}
    report = _extract(tiny_dataset, store_copy)
    assert report.extracted == [] and len(report.up_to_date) == 40 * 3 + 1
    assert {p: p.stat().st_mtime_ns for p in store_copy.rglob("*.npy")} == before


def test_stale_branches_are_redone_and_only_those(dataset_copy, store_copy):
    """A changed transcript redoes that session's text branch alone; a changed audio setting redoes the audio
    branch of every session (the dataset cut to 4 sessions: re-extracting audio is the slow part)."""
    kept = pd.read_csv(dataset_copy / "sessions.csv").head(4)
    write_session_tables(dataset_copy, dataset_copy, kept)
    sid = _first_session(dataset_copy)
    path = dataset_copy / "transcripts" / f"{sid}.csv"
    transcript = pd.read_csv(path, keep_default_na=False)
    transcript.loc[1, "text"] = "Actually my day was wonderful, I saw my family."
    transcript.to_csv(path, index=False)
    report = _extract(dataset_copy, store_copy)
    assert report.extracted == [(sid, "text")]
    cfg = {**FEATURES_CFG, "audio": {"feature_set": "eGeMAPSv02"}}
    report = _extract(dataset_copy, store_copy, ("audio",), cfg)
    assert sorted(report.extracted) == [(s, "audio") for s in sorted(kept.session_id)]
    assert FeatureStore(store_copy).load(sid, "audio", "features").shape[1] == 25


def test_corrupt_and_truncated_video_are_reported_and_nothing_is_lost(dataset_copy, store_copy):
    sessions = pd.read_csv(dataset_copy / "sessions.csv")
    broken, truncated, other = sessions.session_id[:3]
    store = FeatureStore(store_copy)
    kept_face = np.array(store.load(broken, "face", "features"))
    (dataset_copy / f"media/{broken}.avi").write_bytes(b"this is not a video" * 100)
    video = dataset_copy / f"media/{truncated}.avi"
    data = video.read_bytes()
    video.write_bytes(data[: len(data) // 2])
    before_other = store.entry(other, "face")
    report = _extract(dataset_copy, store_copy, ("video",))
    failures = json.loads((store_copy / "failures.json").read_text())
    assert [(f["session_id"], f["branch"]) for f in failures] == [(broken, "face")]
    assert "cannot open video" in failures[0]["error"] or "no frame" in failures[0]["error"]
    # the failed session keeps its earlier features untouched; the others are unaffected
    assert np.array_equal(np.array(store.load(broken, "face", "features")), kept_face)
    assert store.entry(other, "face") == before_other
    assert any(truncated in w and "truncated" in w for w in report.warnings)
    mask = store.load(truncated, "face", "mask")
    assert 0 < mask.mean() < 0.8 and mask[-10:].sum() == 0  # time axis kept, missing tail masked


def test_session_without_a_face_is_masked_and_reported(dataset_copy, store_copy):
    sid = _first_session(dataset_copy)
    n = 60
    controls = {"face_visible": np.zeros(n)}
    write_face_video(dataset_copy / f"media/{sid}.avi", controls, fps=15)
    report = _extract(dataset_copy, store_copy, ("video",))
    store = FeatureStore(store_copy)
    assert store.load(sid, "face", "mask").sum() == 0
    assert not np.any(np.array(store.load(sid, "face", "features")))
    assert any(sid in w and "no face found" in w for w in report.warnings)


def test_data_warnings_are_stored_and_repeated_once_on_every_run_that_reads_them(dataset_copy, store_copy, caplog):
    import logging

    from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
    from empathic_fusion.utils.run_output import data_warning_summary, reset_data_warnings

    sid = _first_session(dataset_copy)
    write_face_video(dataset_copy / f"media/{sid}.avi", {"face_visible": np.zeros(60)}, fps=15)  # 4 s, no face
    report = _extract(dataset_copy, store_copy, ("video",))
    no_face = next(w for w in report.warnings if "no face found" in w)
    stored = FeatureStore(store_copy).entry(sid, "face")["warnings"]
    assert [f"session '{sid}' face: {note}" for note in stored] == [no_face]
    for run in range(2):  # a later run, which extracts nothing, says the same, once
        reset_data_warnings()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="empathic_fusion.data"):
            dm = FusionDataModule(str(dataset_copy), str(store_copy), ["video", "audio", "text"], FEATURES_CFG,
                                   batch_size=8, extract_workers=1)
            dm.prepare_data()
            dm.setup("fit")
        logged = [r.getMessage() for r in caplog.records if r.name == "empathic_fusion.data"]
        assert logged.count(no_face) == 1
        assert sum(f"session '{sid}': video has 60 frames (4.0 s) but audio" in m for m in logged) == 1
        assert len(logged) == len(set(logged)) and data_warning_summary().startswith(f"{len(logged)} data warning(s)")
