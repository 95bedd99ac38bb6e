"""Transcripts past the media's end, windows with nothing valid, participants without ratings, empty splits."""
from __future__ import annotations

import pandas as pd
import pytest

from empathic_fusion.dataset import load_dataset
from empathic_fusion.features.extract import extract_features
from empathic_fusion.features.store import FeatureStore
from tests.conftest import FEATURES_CFG
from tests.test_datamodule import _datamodule


def test_transcript_past_the_media_end_warns_and_windows_stay_inside(dataset_copy, store_copy):
    sid = sorted(pd.read_csv(dataset_copy / "sessions.csv").session_id)[0]
    path = dataset_copy / "transcripts" / f"{sid}.csv"
    transcript = pd.read_csv(path, keep_default_na=False)
    extra = pd.DataFrame([{"start": 30.0, "end": 41.8, "speaker": "participant", "phase": "story_share",
                           "story_id": "", "text": "And that is how the long story ended, much later."}])
    pd.concat([transcript, extra]).to_csv(path, index=False)
    report = extract_features(load_dataset(dataset_copy), FeatureStore(store_copy), ["text"], FEATURES_CFG, workers=1,
                              progress=False)
    media_end = FeatureStore(store_copy).entry(sid, "face")["n_frames"] / 15
    assert f"session '{sid}': the transcript runs to 41.8 s but the session's media end at {media_end:.1f} s; " \
           "utterances past the end are not used (training and prediction leave them out)" in report.warnings
    dm = _datamodule(dataset_copy, store_copy, ("video", "text"))
    n_frames = FeatureStore(store_copy).entry(sid, "face")["n_frames"]
    assert any(f"session '{sid}': the transcript runs to 41.8 s" in w for w in dm.warnings)
    windows = dm.windows[dm.windows.session_id == sid]
    assert len(windows) and (windows.start + dm.window_frames <= n_frames).all()
    for split, data in dm.datasets.items():  # every window that counts has something to read
        for i in range(len(data)):
            item = data[i]
            assert item["video"]["mask"].any() or item["text"]["mask"].any()


def test_windows_with_no_valid_frame_are_left_out_and_counted(dataset_copy, store_copy):
    sid = sorted(pd.read_csv(dataset_copy / "sessions.csv").session_id)[1]
    store = FeatureStore(store_copy)
    entry = store.entry(sid, "face")
    arrays = {name: store.load(sid, "face", name, mmap=False) for name in entry["arrays"]}
    arrays["mask"][:] = 0  # no face in any frame of this session
    store.write_branch(sid, "face", arrays, entry["signature"], {k: v for k, v in entry.items()
                                                                  if k not in ("signature", "arrays")})
    intact = (_datamodule(dataset_copy, store_copy, ("text",)).windows.session_id == sid).sum()
    dm = _datamodule(dataset_copy, store_copy, ("video",))
    assert (dm.windows.session_id == sid).sum() == 0 and intact > 0
    assert any(f"left out {intact} window(s) with no valid frame" in w and f"{sid} ({intact})" in w for w in dm.warnings)


def test_participant_without_sessions_takes_no_place_in_the_split(dataset_copy, tiny_store, tmp_path):
    participants = pd.read_csv(dataset_copy / "participants.csv")
    ghost = participants.iloc[[0]].assign(participant_id="p999")
    pd.concat([participants, ghost]).to_csv(dataset_copy / "participants.csv", index=False)
    import shutil

    store = shutil.copytree(tiny_store, tmp_path / "store")
    dm = _datamodule(dataset_copy, store, ("text",))
    assert "p999" not in dm.split_assignment and len(dm.split_assignment) == len(participants)


def test_an_empty_split_stops_before_training_and_says_what_to_change(tiny_dataset, store_copy):
    from empathic_fusion.core.errors import UserError

    with pytest.raises(UserError, match=r"the split settings leave a split empty: \d+ participants with "
                                        r"(ratings|story_share windows) .*"
                                        r"data.split_fractions=\[0.8, 0.2, 0.0\] leaves the test split without one\. "
                                        r"data.split_fractions=\[0.6,0.2,0.2\] gives every split one of them"):
        _datamodule(tiny_dataset, store_copy, ("text",), split_fractions=(0.8, 0.2, 0.0))


def test_audio_only_session_trains_with_audio_and_text(dataset_copy, store_copy):
    import shutil

    from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
    from empathic_fusion.dataset import DatasetError

    sessions = pd.read_csv(dataset_copy / "sessions.csv", dtype=str, keep_default_na=False)
    sid = sessions.session_id[0]
    sessions.loc[0, "video"] = ""
    sessions.to_csv(dataset_copy / "sessions.csv", index=False)
    shutil.rmtree(store_copy / "sessions" / sid / "audio")  # extracted again from the audio file alone
    dm = FusionDataModule(str(dataset_copy), str(store_copy), ["audio", "text"], FEATURES_CFG, batch_size=8,
                           extract_workers=1)
    dm.prepare_data()
    dm.setup("fit")
    assert (dm.windows.session_id == sid).any() and (sid, "audio") not in dm.missing
    assert not any(sid in w for w in dm.warnings)
    with pytest.raises(DatasetError, match="sessions.csv, line 2, field 'video': is empty"):
        _datamodule(dataset_copy, store_copy, ("video", "text"))
