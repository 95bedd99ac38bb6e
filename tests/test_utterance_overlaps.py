"""Overlapping utterances (crosstalk, one inside another, two with the same start) lose nothing: the
frames they share show the mean of their embeddings (SBERT) or word vectors (GloVe), kept as extra
rows of the branch's table, and the overlaps are warned about. Non-overlapping transcripts are placed
exactly as before."""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from empathic_fusion.features.text_glove import extract_glove, tokenize, word_spans
from empathic_fusion.features.text_sbert import extract_text

FPS = 15.0


class HashEncoder:
    """A deterministic stand-in for the sentence encoder: one fixed random 8-d vector per text."""

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.stack([np.random.default_rng(int(hashlib.sha1(t.encode()).hexdigest()[:8], 16)).normal(size=8)
                         for t in texts]).astype(np.float32) if texts else np.zeros((0, 8), np.float32)


def transcript(rows: list[tuple[float, float, str, str]]) -> pd.DataFrame:
    return pd.DataFrame({"start": [r[0] for r in rows], "end": [r[1] for r in rows], "speaker": [r[2] for r in rows],
                         "phase": "story_share", "story_id": "", "text": [r[3] for r in rows]})


CROSSTALK = transcript([
    (2.0, 6.0, "participant", "I talked to my sister about it for a long time."),
    (3.0, 4.0, "participant", "Really."),                                      # inside the one above
    (5.0, 7.0, "agent", "That sounds hard."),                                  # another speaker: not chosen
    (10.1, 10.9, "participant", "Honestly it changed me."),                   # same start as the next, shorter
    (10.1, 14.0, "participant", "It changed how I see my family and my work."),
    (13.0, 16.0, "participant", "And then everything became calm again."),    # starts before the one above ends
    (20.0, 21.0, "participant", "Thank you."),
])


def spans_at_frames(table: pd.DataFrame, n_frames: int) -> list[list[int]]:
    """For every frame, the rows of `table` whose [start, end) holds the frame's centre."""
    centres = (np.arange(n_frames) + 0.5) / FPS
    return [[i for i, row in enumerate(table.itertuples()) if row.start <= c < row.end] for c in centres]


def test_every_overlapping_utterance_is_placed_and_shared_frames_get_the_mean():
    arrays, info, warnings = extract_text(CROSSTALK, FPS, HashEncoder(), ["participant"])
    chosen = CROSSTALK[CROSSTALK.speaker == "participant"].reset_index(drop=True)
    own = HashEncoder().encode(chosen.text.tolist())
    index, table = arrays["frame_utterance"], arrays["utterances"].astype(np.float32)
    assert info["n_utterances"] == 6 and len(index) == 315
    expected = spans_at_frames(chosen, len(index))
    for frame, spans in enumerate(expected):
        if not spans:
            assert index[frame] == -1 and arrays["mask"][frame] == 0
        elif len(spans) == 1:
            assert index[frame] == spans[0]  # an utterance alone keeps its own row
        else:
            assert index[frame] >= len(chosen)  # an appended row: the mean of the overlapping utterances
            np.testing.assert_allclose(table[index[frame]], own[spans].mean(axis=0), atol=2e-3)
    # "Honestly it changed me." (same start as a longer later one) is on all of its 12 frames, averaged there
    honestly = [f for f, spans in enumerate(expected) if 2 in spans]
    assert len(honestly) == 12 and all(np.allclose(table[index[f]], own[[2, 3]].mean(axis=0), atol=2e-3)
                                       for f in honestly)
    for u in range(len(chosen)):  # every utterance's embedding reaches a frame
        assert any(u in spans for spans in expected)
    assert len(table) == 6 + 3  # the sets {0, 1}, {2, 3} and {3, 4}
    shared = sum(len(spans) > 1 for spans in expected)
    assert shared == 15 + 12 + 15
    assert warnings == [f"3 overlapping utterance pair(s) (crosstalk) between 3.0 s and 14.0 s; their {shared} "
                        "shared frame(s) get the mean of the overlapping utterances' embeddings"]


def test_transcripts_without_overlaps_are_placed_as_before():
    plain = CROSSTALK.iloc[[0, 2, 4, 6]].reset_index(drop=True)  # touching or apart, the agent in between
    arrays, _, warnings = extract_text(plain, FPS, HashEncoder(), ["participant"])
    chosen = plain[plain.speaker == "participant"].reset_index(drop=True)
    n_frames = int(np.ceil(plain.end.max() * FPS))
    before = np.full(n_frames, -1, dtype=np.int32)  # the placement every earlier version made
    centres = (np.arange(n_frames) + 0.5) / FPS
    for i, row in chosen.iterrows():
        before[(centres >= row.start) & (centres < row.end)] = i
    assert arrays["frame_utterance"].dtype == np.int32 and np.array_equal(arrays["frame_utterance"], before)
    assert arrays["utterances"].shape == (3, 8) and warnings == []


def test_an_utterance_shorter_than_a_frame_goes_on_its_midpoint_frame():
    short = transcript([(1.0, 2.0, "participant", "Yes, I think so."), (2.51, 2.53, "participant", "Mm."),
                        (3.0, 4.0, "participant", "It was good.")])
    arrays, _, warnings = extract_text(short, FPS, HashEncoder(), ["participant"])
    index = arrays["frame_utterance"]
    assert np.flatnonzero(index == 1).tolist() == [37]  # 2.52 s * 15 fps: no frame centre lies in 2.51-2.53 s
    assert warnings == ["1 utterance(s) shorter than a frame (1/15 s) between 2.5 s and 2.5 s; "
                        "each is placed on the frame holding its midpoint"]


def test_glove_words_of_overlapping_utterances_are_averaged_not_overwritten():
    chosen = CROSSTALK[CROSSTALK.speaker == "participant"]
    words = word_spans(CROSSTALK, ["participant"])
    vocabulary = sorted(set(words.word))
    rng = np.random.default_rng(0)
    index, vectors = {w: i for i, w in enumerate(vocabulary)}, rng.normal(size=(len(vocabulary), 4)).astype(np.float32)
    arrays, info, warnings = extract_glove(CROSSTALK, FPS, index, vectors, ["participant"])
    frame_word, table = arrays["frame_word"], arrays["words"].astype(np.float32)
    expected = spans_at_frames(words, len(frame_word))
    for frame, spans in enumerate(expected):
        if len(spans) == 1:
            assert frame_word[frame] == spans[0]
        elif len(spans) > 1:
            np.testing.assert_allclose(table[frame_word[frame]], vectors[[index[w] for w in words.word.iloc[spans]]]
                                       .mean(axis=0), atol=2e-3)
    placed = {s for spans in expected for s in spans}
    # a word reaches a frame through its own row or through an appended row (checked above to be the mean)
    reached = {s for f, spans in enumerate(expected) for s in spans
               if (len(spans) == 1 and frame_word[f] == s) or (len(spans) > 1 and frame_word[f] >= len(words))}
    assert reached == placed  # every word that holds a frame centre reaches its frames
    first = sum(len(tokenize(text)) for text in chosen.text.iloc[:2])
    honestly = words.iloc[first: first + 4]
    assert honestly.word.tolist() == ["honestly", "it", "changed", "me"]
    assert set(honestly.index) <= reached  # "Honestly it changed me." is not lost
    assert info["overlap_rows"] == len(table) - len(words) > 0 and len(chosen) == 6
    assert len(warnings) == 1 and warnings[0].startswith("3 overlapping utterance pair(s) (crosstalk) between "
                                                         "3.0 s and 14.0 s; their 42 shared frame(s) get the mean "
                                                         "of the overlapping utterances' word vectors")


def test_the_speech_mask_counts_every_participant_utterance_as_the_text_branch_places_them():
    from empathic_fusion.features.speech import speaking_frames

    n_frames = 330
    spoken = speaking_frames(CROSSTALK, n_frames, FPS)
    chosen = CROSSTALK[CROSSTALK.speaker == "participant"].reset_index(drop=True)
    assert np.array_equal(spoken, np.array([bool(spans) for spans in spans_at_frames(chosen, n_frames)]))
    short = transcript([(2.51, 2.53, "participant", "Mm."), (30.0, 31.0, "participant", "Past the media end.")])
    assert np.flatnonzero(speaking_frames(short, 40, FPS)).tolist() == [37]
