"""Window indexing, participant splits and oversampling."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from empathic_fusion.datamodules.sampler import RatingOversampler, oversampled_indices
from empathic_fusion.datamodules.splits import load_or_create_split, split_participants
from empathic_fusion.datamodules.windows import build_windows, phase_span, window_starts


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
    with pytest.raises(ValueError, match="scenario"):
        phase_span(transcript, "cool_down", "s1")


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
