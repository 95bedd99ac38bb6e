"""Window indexing, participant splits and oversampling."""
from __future__ import annotations

import json
import logging
import re

import numpy as np
import pandas as pd
import pytest

from empathic_fusion.datamodules.sampler import RatingOversampler, oversampled_indices
from empathic_fusion.config import ConfigError, FusionDataConfig, typed
from empathic_fusion.datamodules.splits import (SPLITTER, group_folds, group_holdout, load_or_create_split,
                                                participant_folds, split_participants)
from empathic_fusion.datamodules.windows import build_windows, phase_span, short_media_note, window_ends, window_starts


def _transcript():
    rows = [
        (0.0, 3.0, "agent", "warm_up", ""), (3.3, 9.0, "participant", "story_share", ""),
        (9.5, 15.3, "participant", "story_share", ""), (16.0, 20.0, "agent", "story_receive", ""),
        (20.5, 24.0, "participant", "reflection", "s1"), (24.5, 40.0, "participant", "reflection", "s2"),
        (40.5, 42.0, "agent", "cool_down", ""),
    ]
    return pd.DataFrame(rows, columns=["start", "end", "speaker", "phase", "story_id"]).assign(text="x")


def test_window_starts_slide_every_second_inside_the_phase():
    starts = window_starts((49, 230), n_frames=700, length=120, stride=15)
    assert starts.tolist() == [49, 64, 79, 94, 109]
    assert (starts + 120 <= 230).all() and starts[0] == 49


def test_short_phase_gets_one_centred_window_clamped_to_the_session():
    assert window_starts((300, 360), 700, 120, 15).tolist() == [270]
    assert window_starts((0, 30), 700, 120, 15).tolist() == [0]
    assert window_starts((650, 700), 700, 120, 15).tolist() == [580]
    assert window_starts((10, 40), 50, 120, 15).tolist() == [0]  # session shorter than a window


def test_phase_spans_per_scenario():
    transcript = _transcript()
    assert phase_span(transcript, "story_share", "s1") == (3.3, 15.3)
    assert phase_span(transcript, "reflection", "s2") == (24.5, 40.0)
    assert phase_span(transcript, "reflection", "s3") is None


def test_a_scenario_without_windows_is_refused_by_the_data_schema():
    """phase_span trusts data.scenario: the schema names the key and the scenarios it allows."""
    with pytest.raises(ConfigError, match=re.escape("data.scenario=cool_down: must be story_share or reflection")):
        typed("data", {"_target_": FusionDataConfig._target_, "dataset_dir": "/x", "store_dir": "/x/store", "seed": 0,
                       "scenario": "cool_down"})


def test_build_windows_counts_and_boundaries():
    ratings = pd.DataFrame({"session_id": ["a", "a", "a"], "story_id": ["s1", "s2", "s3"], "empathy": [2, 4, 5],
                            "participant_id": ["p"] * 3})
    share, notes = build_windows(ratings, {"a": _transcript()}, {"a": 630}, "story_share", 15, 120, 1.0)
    # story share spans frames 49..230: 5 windows for each of the 3 ratings
    assert len(share) == 15 and sorted(set(share.start)) == [49, 64, 79, 94, 109] and notes == []
    refl, notes = build_windows(ratings, {"a": _transcript()}, {"a": 630}, "reflection", 15, 120, 1.0)
    by_rating = refl.groupby("rating_index").start.apply(list).to_dict()
    assert by_rating[0] == [(307 + 360) // 2 - 60]         # 3.5 s reflection: one centred window
    assert by_rating[1] == list(range(367, 600 - 120 + 1, 15))  # 15.5 s reflection: slid every second
    assert 2 not in by_rating and "no reflection utterances" in notes[0]


def test_media_shorter_than_a_window_is_one_window_with_a_note_and_real_times():
    """The one rule (training, empathic-predict and the app build windows with it): a 2.4 s session at 15 fps
    is one window from its first frame, padded and masked past its 36 frames; once per session, a note
    says so; its frames end at the media's end, never at start + 8 s."""
    ratings = pd.DataFrame({"session_id": ["short", "short", "long"], "story_id": ["s1", "s2", "s1"],
                            "empathy": [2, 4, 5], "participant_id": ["p", "p", "q"]})
    clip = pd.DataFrame({"start": [0.2], "end": [2.4], "speaker": ["participant"], "phase": ["story_share"],
                         "story_id": [""], "text": ["x"]})
    windows, notes = build_windows(ratings, {"short": clip, "long": _transcript()}, {"short": 36, "long": 630},
                                   "story_share", 15, 120, 1.0)
    short = windows[windows.session_id == "short"]
    assert short.start.tolist() == [0, 0] and len(windows[windows.session_id == "long"]) == 5
    assert notes == [f"session 'short': {short_media_note(36, 120, 15)}"]
    assert notes[0] == ("session 'short': the media is 2.4 s long, shorter than one window (8 s): it is one window "
                        "of its 2.4 s, the rest padded and masked")
    assert short_media_note(120, 120, 15) is None
    assert window_ends(np.array([0, 49, 580]), np.array([36, 630, 700]), 120).tolist() == [36, 169, 700]


def test_split_is_participant_level_seeded_and_persisted(tmp_path):
    ids = [f"p{i:02d}" for i in range(41)]
    split = split_participants(ids, (0.7, 0.2, 0.1), seed=1)
    counts = pd.Series(split).value_counts().to_dict()
    assert counts == {"train": 29, "val": 8, "test": 4}
    assert split == split_participants(list(reversed(ids)), (0.7, 0.2, 0.1), seed=1)
    assert split != split_participants(ids, (0.7, 0.2, 0.1), seed=2)
    path = tmp_path / "split.json"
    first, first_hash = load_or_create_split(path, ids, (0.7, 0.2, 0.1), 1)
    again, again_hash = load_or_create_split(path, ids, (0.7, 0.2, 0.1), 1)
    assert first == again == split and first_hash == again_hash and path.exists()
    assert sorted(split_participants(ids[:4], (0.7, 0.2, 0.1), 0).values()) == ["test", "train", "train", "val"]
    assert sorted(split_participants(ids[:3], (0.8, 0.1, 0.1), 5).values()) == ["test", "train", "val"]
    assert set(split_participants(ids, (1.0, 0.0, 0.0), 0).values()) == {"train"}


def test_a_persisted_split_is_reused_while_its_participants_and_settings_hold(tmp_path):
    ids = [f"p{i:02d}" for i in range(10)]
    path = tmp_path / "split.json"
    path.write_text(json.dumps({"seed": 0, "fractions": [0.7, 0.2, 0.1], "hash": "h", "splitter": SPLITTER,
                                "assignment": {p: "train" for p in ids}}))
    assert load_or_create_split(path, ids, (0.7, 0.2, 0.1), 0) == ({p: "train" for p in ids}, "h")
    fresh, fresh_hash = load_or_create_split(path, ids + ["p99"], (0.7, 0.2, 0.1), 0)  # another participant
    assert fresh_hash != "h" and sorted(fresh) == sorted(ids + ["p99"]) and "test" in fresh.values()


def test_a_split_persisted_by_another_splitter_is_redrawn_like_a_fresh_one(tmp_path, caplog):
    ids = [f"p{i:02d}" for i in range(10)]
    path = tmp_path / "split.json"  # as the hand-written splitter wrote it: no "splitter" key
    path.write_text(json.dumps({"seed": 0, "fractions": [0.7, 0.2, 0.1], "hash": "h",
                                "assignment": {p: "train" for p in ids}}))
    with caplog.at_level(logging.WARNING, logger="empathic_fusion.datamodules.splits"):
        redrawn, redrawn_hash = load_or_create_split(path, ids, (0.7, 0.2, 0.1), 0)
    assert "another splitter" in caplog.text
    assert redrawn == split_participants(ids, (0.7, 0.2, 0.1), 0) and redrawn_hash != "h"
    assert json.loads(path.read_text())["splitter"] == SPLITTER


def test_group_folds_keep_groups_whole_balance_sizes_and_follow_the_seed():
    groups = np.repeat([f"g{i}" for i in range(12)], 3)  # 12 groups of 3 rows
    folds = group_folds(len(groups), 4, seed=0, groups=groups)
    tested = np.concatenate([test for _, test in folds])
    assert sorted(tested.tolist()) == list(range(len(groups)))  # every row tested once
    for train, test in folds:
        assert not set(groups[train]) & set(groups[test]) and len(test) == 9
    assert [t.tolist() for _, t in folds] == [t.tolist() for _, t in group_folds(len(groups), 4, 0, groups=groups)]
    assert [t.tolist() for _, t in folds] != [t.tolist() for _, t in group_folds(len(groups), 4, 1, groups=groups)]
    strata = np.tile([1, 1, 5], 12)  # every group holds both levels: each fold keeps the 2:1 mix
    for _, test in group_folds(len(groups), 4, 0, groups=groups, strata=strata):
        assert (strata[test] == 1).sum() == 2 * (strata[test] == 5).sum()
    with pytest.raises(ValueError, match="3 groups cannot fill 4 folds"):
        group_folds(9, 4, 0, groups=groups[:9])
    rows = group_folds(10, 5, 0)  # no groups: shuffled rows
    assert sorted(np.concatenate([t for _, t in rows]).tolist()) == list(range(10))


def test_group_holdout_holds_out_whole_groups():
    groups = np.repeat(["a", "b", "c", "d"], [1, 2, 3, 4])
    kept, held = group_holdout(groups, 2, seed=0)
    assert len(set(groups[held])) == 2 and not set(groups[kept]) & set(groups[held])
    assert sorted(np.concatenate([kept, held]).tolist()) == list(range(10))
    kept, held = group_holdout(groups, 0, seed=0)
    assert len(held) == 0 and len(kept) == 10


def test_participant_folds_need_as_many_participants_as_folds():
    with pytest.raises(ValueError, match=re.escape("data.cv_folds <= number of participants (3)")):
        participant_folds(["a", "b", "c"], 5, 0, 0.2, 0)


def test_oversampling_balances_rating_classes_and_reshuffles_per_epoch():
    classes = np.array([1] * 3 + [3] * 10 + [5] * 6)
    picks = oversampled_indices(classes, np.random.default_rng(0))
    assert np.bincount(classes[picks]).tolist() == [0, 10, 0, 10, 0, 10]
    assert set(np.flatnonzero(classes == 3)) <= set(picks)  # the majority class is kept whole
    sampler = RatingOversampler(classes, seed=0)
    sampler.set_epoch(0)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    assert len(epoch0) == len(sampler) == 30 and list(sampler) != epoch0
