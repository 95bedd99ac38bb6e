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


def _sessions(root) -> pd.DataFrame:
    return pd.read_csv(root / "sessions.csv", dtype=str, keep_default_na=False)


def test_audio_only_session_loads_for_modalities_without_video(dataset_copy):
    sid = _sessions(dataset_copy).session_id[1]
    _edit(dataset_copy, "sessions.csv", lambda t: t.loc.__setitem__((1, "video"), ""))
    data = load_dataset(dataset_copy, ["audio", "text"])
    assert data.sessions.video[sid] is None and data.sessions.audio[sid].is_file()
    assert load_dataset(dataset_copy, ["text"]).sessions.video[sid] is None
    with pytest.raises(DatasetError, match=r"sessions.csv, line 3, field 'video': is empty \(the video modality reads "
                                           r"it; a session with only an audio file works with modality a\+t, a or t\)"):
        load_dataset(dataset_copy, ["video", "text"])


def test_one_recording_in_two_participants_sessions_is_an_error_naming_both(dataset_copy):
    sessions = _sessions(dataset_copy)
    copy = dataset_copy / "media" / "copied.avi"  # another name, the same bytes
    copy.write_bytes((dataset_copy / sessions.video[0]).read_bytes())
    _edit(dataset_copy, "sessions.csv", lambda t: (t.loc.__setitem__((3, "video"), sessions.video[0]),
                                                    t.loc.__setitem__((5, "video"), "media/copied.avi")))
    message = _problems(dataset_copy)
    for line, session, participant in ((5, sessions.session_id[3], sessions.participant_id[3]),
                                       (7, sessions.session_id[5], sessions.participant_id[5])):
        assert (f"sessions.csv, line {line}, field 'video': '{sessions.video[0] if line == 5 else 'media/copied.avi'}' "
                f"is the same recording (sha256 ") in message
        assert (f"as line 2's video: sessions '{sessions.session_id[0]}' (participant '{sessions.participant_id[0]}') "
                f"and '{session}' (participant '{participant}') share one recording") in message
    assert "data.allow_shared_media=true" in message
    assert load_dataset(dataset_copy, ["text"]).warnings == []  # text alone reads no media: nothing leaks
    allowed = load_dataset(dataset_copy, allow_shared_media=True)
    assert sum("share one recording" in w and "(data.allow_shared_media=true)" in w for w in allowed.warnings) == 2


def test_one_recording_in_two_sessions_of_one_participant_is_a_warning(dataset_copy):
    sessions = _sessions(dataset_copy)
    _edit(dataset_copy, "sessions.csv", lambda t: (t.loc.__setitem__((4, "audio"), sessions.audio[0]),
                                                    t.loc.__setitem__((4, "participant_id"), sessions.participant_id[0])))
    data = load_dataset(dataset_copy)
    assert [w for w in data.warnings if "share one recording" in w] == [
        f"sessions.csv, line 6, field 'audio': '{sessions.audio[0]}' is the same recording (sha256 "
        f"{__import__('hashlib').sha256((dataset_copy / sessions.audio[0]).read_bytes()).hexdigest()[:12]}) as line "
        f"2's audio: sessions '{sessions.session_id[0]}' and '{sessions.session_id[4]}' of participant "
        f"'{sessions.participant_id[0]}' share one recording"]
