"""The dataset contract: a valid dataset loads; each kind of problem is named by file, line, field."""
from __future__ import annotations

import pandas as pd
import pytest

from empathic_fusion.dataset import PHASES, DatasetError, load_dataset


def _edit(root, name, fn):
    path = root / name
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    fn(table)
    table.to_csv(path, index=False)


def _problems(root) -> str:
    with pytest.raises(DatasetError) as info:
        load_dataset(root)
    return str(info.value)


def test_demo_dataset_loads(tiny_dataset):
    data = load_dataset(tiny_dataset)
    assert data.fps == 15
    assert len(data.participants) == 40 and len(data.sessions) == 40
    assert set(data.ratings.empathy.unique()) <= {1, 2, 3, 4, 5}
    transcript = data.transcripts[data.sessions.index[0]]
    assert set(transcript.phase) == set(PHASES)
    reflections = transcript[transcript.phase == "reflection"]
    assert (reflections.story_id != "").all() and set(reflections.story_id) <= set(data.stories.index)
    assert data.warnings == []


def test_rating_out_of_range_is_named(dataset_copy):
    _edit(dataset_copy, "ratings.csv", lambda t: t.__setitem__("empathy", ["7"] + list(t.empathy[1:])))
    message = _problems(dataset_copy)
    assert "ratings.csv, line 2, field 'empathy': 7 is outside 1-5" in message


def test_unknown_story_id_is_named(dataset_copy):
    _edit(dataset_copy, "ratings.csv", lambda t: t.__setitem__("story_id", list(t.story_id[:2]) + ["nope"] + list(t.story_id[3:])))
    assert "ratings.csv, line 4, field 'story_id': 'nope' is not in stories.csv" in _problems(dataset_copy)


def test_transcript_problems_are_all_listed(dataset_copy):
    sid = pd.read_csv(dataset_copy / "sessions.csv").session_id[0]
    def damage(t):
        t.loc[0, "phase"] = "chit_chat"
        t.loc[1, "end"] = "0.1"
        reflection = t.index[t.phase == "reflection"][0]
        t.loc[reflection, "story_id"] = ""
    _edit(dataset_copy, f"transcripts/{sid}.csv", damage)
    message = _problems(dataset_copy)
    assert f"transcripts/{sid}.csv, line 2, field 'phase': 'chit_chat' is not one of" in message
    assert f"transcripts/{sid}.csv, line 3, field 'end'" in message and "is not after start" in message
    assert "a reflection utterance must name the story it reflects on" in message
    assert "3 problem(s)" in message


def test_missing_column_media_and_participant(dataset_copy):
    _edit(dataset_copy, "sessions.csv", lambda t: (t.__setitem__("video", ["media/missing.avi"] + list(t.video[1:])),
                                                     t.__setitem__("participant_id", list(t.participant_id[:1]) + ["ghost"] + list(t.participant_id[2:]))))
    _edit(dataset_copy, "stories.csv", lambda t: t.rename(columns={"text": "body"}, inplace=True))
    message = _problems(dataset_copy)
    assert "sessions.csv, line 2, field 'video': file 'media/missing.avi' does not exist" in message
    assert "sessions.csv, line 3, field 'participant_id': 'ghost' is not in participants.csv" in message
    assert "stories.csv, line 1: missing column(s) ['text']" in message


def test_trait_out_of_range_and_duplicate_rating(dataset_copy):
    _edit(dataset_copy, "participants.csv", lambda t: t.__setitem__("trait_empathy", ["9"] + list(t.trait_empathy[1:])))
    _edit(dataset_copy, "ratings.csv", lambda t: t.loc.__setitem__(len(t), list(t.iloc[0])))
    message = _problems(dataset_copy)
    assert "participants.csv, line 2, field 'trait_empathy': 9 is outside 1-5" in message
    assert "rates story" in message and "again (first on line 2)" in message


def test_missing_transcript_is_a_warning_naming_the_session(dataset_copy):
    sid = pd.read_csv(dataset_copy / "sessions.csv").session_id[2]
    (dataset_copy / "transcripts" / f"{sid}.csv").unlink()
    data = load_dataset(dataset_copy)
    assert sid not in data.transcripts
    assert any(sid in w and "3 rating(s) get no windows" in w for w in data.warnings)


@pytest.mark.parametrize("value, expected", [
    (".nan", "must be a finite number of frames per second, got nan"),
    (".inf", "must be a finite number of frames per second, got inf"),
    ("-.inf", "must be a finite number of frames per second, got -inf"),
    ("true", "must be a positive number of frames per second, got True (a boolean)"),
    ("0", "must be a positive number of frames per second, got 0"),
    ("-15", "must be a positive number of frames per second, got -15"),
    ("'15'", "must be a positive number of frames per second, got '15' (a str)"),
])
def test_fps_must_be_a_positive_finite_number_not_a_boolean(dataset_copy, value, expected):
    path = dataset_copy / "dataset.yaml"
    lines = path.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, start=1) if text.startswith("fps:"))
    lines[line - 1] = f"fps: {value}"
    path.write_text("\n".join(lines) + "\n")
    assert f"dataset.yaml, line {line}, field 'fps': {expected}" in _problems(dataset_copy)


@pytest.mark.parametrize("column, value, expected", [
    ("start", "nan", "'nan' is not a finite number"),
    ("end", "inf", "'inf' is not a finite number"),
    ("start", "true", "'true' is not a number"),
])
def test_transcript_times_must_be_finite_numbers(dataset_copy, column, value, expected):
    sid = pd.read_csv(dataset_copy / "sessions.csv").session_id[0]
    _edit(dataset_copy, f"transcripts/{sid}.csv", lambda t: t.loc.__setitem__((1, column), value))
    assert f"transcripts/{sid}.csv, line 3, field '{column}': {expected}" in _problems(dataset_copy)


@pytest.mark.parametrize("value, expected", [("nan", "'nan' is not a finite number"),
                                             ("true", "'true' is not a number"),
                                             ("-inf", "'-inf' is not a finite number")])
def test_ratings_must_be_finite_numbers_on_the_scale(dataset_copy, value, expected):
    _edit(dataset_copy, "ratings.csv", lambda t: t.loc.__setitem__((0, "empathy"), value))
    assert f"ratings.csv, line 2, field 'empathy': {expected}" in _problems(dataset_copy)
