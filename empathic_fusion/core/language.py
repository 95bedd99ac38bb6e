"""Which languages a text field is in, cheaply, and a warning when the encoder was not trained for them.

A text's majority Unicode script comes from its letters' character names, its language from py3langid
(a pure-python langid.py with its model in the wheel, offline). A Latin-script text is weighed among
the widely spoken Latin-script languages (LATIN_LANGUAGES: the language model's 97 languages spread a
short text's probability over its neighbours, Spanish over Galician and Catalan) and is English when
English is the more likely half, another language only when that language is the more likely half and
English has next to no chance (MAX_ENGLISH): short replies share words across languages ("me", "a",
"no" are English and Spanish), so a text is never called another language on a few shared words, and an
English reply is never flagged. Texts without letters, Latin texts of fewer than MIN_WORDS words and
Latin texts that fit neither rule are undetermined and never counted: greetings and one-word replies
are too short to tell. Other scripts (CJK, Cyrillic, Arabic, ...) take the language model's answer.
"""
from __future__ import annotations

import functools
import logging
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable

log = logging.getLogger(__name__)

MIN_WORDS = 4
MAJORITY = 0.5  # a Latin text's language: the candidate with at least this probability
MAX_ENGLISH = 0.02  # and English's chance at most this, for the text to be called another language
LATIN_LANGUAGES = ("en", "es", "fr", "de", "it", "pt", "nl", "sv", "da", "no", "pl", "cs", "sk", "ro", "hu", "fi",
                   "tr", "id", "ms", "vi", "ca", "hr", "sl", "lt", "lv", "et", "sq", "sw", "tl")
NAMED_SOURCES = 3  # a warning names this many sessions (or other sources) of the texts it counts, then a count
_WORD = re.compile(r"[^\W\d_]+")
_warned: set[tuple[str, str]] = set()


def text_script(text: str) -> str | None:
    """The Unicode script most of the text's letters belong to (LATIN, CJK, CYRILLIC, ...); None: no letters."""
    scripts = Counter(unicodedata.name(ch, "UNKNOWN").split(" ")[0] for ch in text if ch.isalpha())
    return scripts.most_common(1)[0][0] if scripts else None


@functools.lru_cache(maxsize=2)
def _identifier(latin: bool = False):
    """py3langid's identifier over all its languages, or over LATIN_LANGUAGES (each its own instance)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    if latin:
        identifier.set_languages(list(LATIN_LANGUAGES))
    return identifier


def detect_language(text: str) -> str | None:
    """ISO 639-1 code of the text's language, or None when it cannot be told (see the module's rules)."""
    script = text_script(text)
    if script is None:
        return None
    if script != "LATIN":
        return str(_identifier().classify(text)[0])
    if len(_WORD.findall(text.lower())) < MIN_WORDS:
        return None
    chances = dict(_identifier(latin=True).rank(text))
    if chances["en"] >= MAJORITY:
        return "en"
    language = max(chances, key=chances.get)
    return str(language) if chances[language] >= MAJORITY and chances["en"] <= MAX_ENGLISH else None


def is_untrained_language(code: str | None, languages: tuple[str, ...]) -> bool:
    """A detected language (not None) outside the encoder's languages (regional variants, e.g. en-US, count as theirs)."""
    return code is not None and code not in {known.split("-")[0] for known in languages}


def _named(sources: list[str], kind: str) -> str:
    """", in sessions a, b, c and 4 more": the first NAMED_SOURCES distinct sources, then how many others."""
    distinct = list(dict.fromkeys(sources))
    shown = ", ".join(distinct[:NAMED_SOURCES])
    more = f" and {len(distinct) - NAMED_SOURCES} more" if len(distinct) > NAMED_SOURCES else ""
    return f", in {kind} {shown}{more}"


def untrained_language_warning(field: str, texts: Iterable[str], languages: tuple[str, ...] | None,
                               encoder: str, sources: Iterable[str] | None = None,
                               source_kind: str = "sessions") -> str | None:
    """A message counting the field's texts in languages the encoder was not trained for (None: all are,
    or the encoder's languages are unknown). Names the field and the languages, never a text; with
    `sources` (where each text comes from, e.g. its session) also the first few sources of those texts."""
    if not languages:
        return None
    texts = [str(t) for t in texts]
    codes = {text: detect_language(text) for text in dict.fromkeys(texts)}
    flagged = [i for i, text in enumerate(texts) if is_untrained_language(codes[text], languages)]
    if not flagged:
        return None
    other = Counter(codes[texts[i]] for i in flagged)
    listed = ", ".join(f"{code} {n}" for code, n in sorted(other.items(), key=lambda kv: (-kv[1], kv[0])))
    origins = list(sources) if sources is not None else None
    where = _named([origins[i] for i in flagged], source_kind) if origins is not None else ""
    return (f"{field}: {len(flagged)} of {len(texts)} texts are in languages the text encoder {encoder} "
            f"was not trained for ({listed}; it knows {', '.join(languages)}){where}; their embeddings are "
            "unreliable. Use a multilingual encoder (docs/text_models.md) or translate the texts")


def warn_untrained_languages(field: str, texts: Iterable[str], languages: tuple[str, ...] | None,
                             encoder: str, sources: Iterable[str] | None = None) -> str | None:
    """Log `untrained_language_warning` as a WARNING once per process (run) for each field and finding."""
    message = untrained_language_warning(field, texts, languages, encoder, sources)
    if message is not None and (field, message) not in _warned:
        _warned.add((field, message))
        log.warning(message)
    return message
