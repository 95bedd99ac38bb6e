"""Which languages a text field is in, cheaply, and a warning when the encoder was not trained for them.

A text's majority Unicode script comes from its letters' character names. Latin-script texts of at
least MIN_WORDS words whose share of English function words (ENGLISH_FUNCTION_WORDS, the most
frequent English words; kept here so that the check imports nothing heavy) reaches
ENGLISH_STOP_SHARE are English without further work (English prose runs at 0.3-0.5; German, French
or Spanish prose shares few of these words). The rest go to py3langid (a pure-python langid.py with
its model in the wheel, offline), counted only when it is at least MIN_PROBABILITY sure for a Latin
text. Texts without letters, and Latin texts of fewer than MIN_WORDS words, are undetermined and never
counted: greetings and one-word replies are too short to tell reliably.
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
ENGLISH_STOP_SHARE = 0.2
MIN_PROBABILITY = 0.9
_WORD = re.compile(r"[^\W\d_]+")
ENGLISH_FUNCTION_WORDS = frozenset("""
a about after all also am an and any are as at be because been but by can could did do does for from
had has have he her him his how i if in into is it its just me my no not of on or our out she so some
than that the their them then there these they this those to up us was we were what when which who
will with would you your
""".split())
_warned: set[tuple[str, str]] = set()


def text_script(text: str) -> str | None:
    """The Unicode script most of the text's letters belong to (LATIN, CJK, CYRILLIC, ...); None: no letters."""
    scripts = Counter(unicodedata.name(ch, "UNKNOWN").split(" ")[0] for ch in text if ch.isalpha())
    return scripts.most_common(1)[0][0] if scripts else None


@functools.lru_cache(maxsize=1)
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def detect_language(text: str) -> str | None:
    """ISO 639-1 code of the text's language, or None when it cannot be told (see the module's rules)."""
    script = text_script(text)
    if script is None:
        return None
    if script == "LATIN":
        words = _WORD.findall(text.lower())
        if len(words) < MIN_WORDS:
            return None
        if sum(w in ENGLISH_FUNCTION_WORDS for w in words) / len(words) >= ENGLISH_STOP_SHARE:
            return "en"
    language, probability = _identifier().classify(text)
    if script == "LATIN" and probability < MIN_PROBABILITY:
        return None
    return str(language)


def language_counts(texts: Iterable[str]) -> Counter:
    """Texts per detected language (None: undetermined); each distinct text is classified once."""
    occurrences = Counter(str(t) for t in texts)
    counts: Counter = Counter()
    for text, n in occurrences.items():
        counts[detect_language(text)] += n
    return counts


def is_untrained_language(code: str | None, languages: tuple[str, ...]) -> bool:
    """A detected language (not None) outside the encoder's languages (regional variants, e.g. en-US, count as theirs)."""
    return code is not None and code not in {known.split("-")[0] for known in languages}


def untrained_language_warning(field: str, texts: Iterable[str], languages: tuple[str, ...] | None,
                               encoder: str) -> str | None:
    """A message counting the field's texts in languages the encoder was not trained for (None: all are,
    or the encoder's languages are unknown). Names the field and the languages, never a text."""
    if not languages:
        return None
    texts = list(texts)
    counts = language_counts(texts)
    other = {code: n for code, n in counts.items() if is_untrained_language(code, languages)}
    if not other:
        return None
    listed = ", ".join(f"{code} {n}" for code, n in sorted(other.items(), key=lambda kv: (-kv[1], kv[0])))
    return (f"{field}: {sum(other.values())} of {len(texts)} texts are in languages the text encoder {encoder} "
            f"was not trained for ({listed}; it knows {', '.join(languages)}); their embeddings are unreliable. "
            "Use a multilingual encoder (docs/text_models.md) or translate the texts")


def warn_untrained_languages(field: str, texts: Iterable[str], languages: tuple[str, ...] | None,
                             encoder: str) -> str | None:
    """Log `untrained_language_warning` as a WARNING once per process (run) for each field and finding."""
    message = untrained_language_warning(field, texts, languages, encoder)
    if message is not None and (field, message) not in _warned:
        _warned.add((field, message))
        log.warning(message)
    return message
