"""The seven adversarial text perturbations of Haleas, "Exploring the Empathy of Leading Large Language Models" (section 4.2.1), as deterministic transforms.

Every transform is `f(text, level, seed) -> text`; the same (text, level, seed) always gives the
same output (the random stream is seeded by the seed and a CRC of the text). `level` in (0, 1] is
the share of eligible words / characters changed: graded noise for the character-level transforms.
The last three are rule-based and ignore `level`:
- shortened: intensifiers and hedges are dropped (SHORTEN_DROP) and only the first half of the
  sentences is kept (at least one);
- elevated: words and phrases are replaced by formal ones (ELEVATED), longest phrase first;
- casual: formal words and phrases by casual ones and contractions (CASUAL).
"""
from __future__ import annotations

import random
import re
import zlib
from typing import Callable

GREEK_HOMOGLYPHS = {"a": "α", "e": "ε", "i": "ι", "o": "ο", "p": "ρ", "u": "υ", "v": "ν", "x": "χ", "y": "γ", "t": "τ",
                    "k": "κ", "n": "η", "A": "Α", "B": "Β", "E": "Ε", "H": "Η", "I": "Ι", "K": "Κ", "M": "Μ", "N": "Ν",
                    "O": "Ο", "P": "Ρ", "T": "Τ", "X": "Χ", "Y": "Υ", "Z": "Ζ"}
LEET = {"a": "4", "e": "3", "i": "1", "o": "0", "s": "5", "t": "7", "g": "9", "b": "8", "l": "1",
        "A": "4", "E": "3", "I": "1", "O": "0", "S": "5", "T": "7", "G": "9", "B": "8"}
SHORTEN_DROP = ["really", "truly", "perfectly", "very", "just", "so", "quite", "actually", "basically", "totally",
                "completely", "absolutely", "fully", "deeply", "extremely", "incredibly", "definitely", "honestly",
                "i think", "i believe", "you know", "i mean", "kind of", "sort of"]
ELEVATED = {"i understand": "i comprehend", "i get": "i comprehend", "i know": "i recognise", "i feel": "i perceive",
            "feel": "perceive", "feeling": "sentiment", "pain": "anguish", "hurt": "anguish", "sad": "sorrowful",
            "amazing": "awe-inspiring", "great": "exceptional", "good": "commendable", "bad": "regrettable",
            "hard": "arduous", "difficult": "exceedingly challenging", "okay": "entirely acceptable",
            "ok": "entirely acceptable", "stressed": "anxious", "upset": "distressed", "help": "assist",
            "get through": "persevere through", "push through": "persevere through", "want": "desire",
            "think": "contemplate", "sorry": "deeply regretful", "happy": "elated", "angry": "indignant",
            "scared": "apprehensive", "afraid": "apprehensive", "lonely": "isolated", "friend": "companion",
            "family": "kin", "tough": "formidable", "big": "substantial", "a lot": "considerably",
            "fighter": "valiant combatant", "warrior": "valiant combatant", "show": "demonstrate", "try": "endeavour",
            "need": "require", "maybe": "perhaps", "really": "genuinely", "thanks": "I am grateful"}
CASUAL = {"i understand how you feel": "i get how you feel", "i understand": "i get it", "difficult": "hard",
          "amazing": "cool", "wonderful": "awesome", "perfectly okay": "okay", "acceptable": "okay",
          "stressed": "upset", "anguish": "hurt", "emotional pain": "hurt", "however": "but", "therefore": "so",
          "extremely": "super", "very": "super", "warrior": "fighter", "perhaps": "maybe", "assist": "help",
          "it is": "it's", "you are": "you're", "i am": "i'm", "do not": "don't", "does not": "doesn't",
          "cannot": "can't", "can not": "can't", "that is": "that's", "i would": "i'd", "i will": "i'll",
          "going to": "gonna", "want to": "wanna", "yes": "yeah", "hello": "hey", "thank you": "thanks"}

_WORD = re.compile(r"[A-Za-z]+")


def _rng(text: str, seed: int, name: str) -> random.Random:
    return random.Random(zlib.crc32(f"{seed}|{name}|{text}".encode("utf-8")))


def _check_level(level: float) -> float:
    if not 0.0 < level <= 1.0:
        raise ValueError(f"perturbation level must be in (0, 1], got {level}")
    return float(level)


def excessive_punctuation(text: str, level: float = 0.3, seed: int = 0) -> str:
    """Stretch the last letter of a share of words and multiply sentence punctuation."""
    level, rng = _check_level(level), _rng(text, seed, "punct")

    def stretch(m: re.Match) -> str:
        word = m.group(0)
        return word + word[-1] * rng.randint(3, 10) if rng.random() < level else word

    text = _WORD.sub(stretch, text)
    text = re.sub(r"[.!?]", lambda m: "!" * rng.randint(3, 6) if rng.random() < max(level, 0.5) else m.group(0), text)
    return text if re.search(r"[.!?]$", text) else text + "!!!"


def _substitute(text: str, table: dict[str, str], level: float, rng: random.Random) -> str:
    return "".join(table[c] if c in table and rng.random() < level else c for c in text)


def greek_homoglyphs(text: str, level: float = 0.3, seed: int = 0) -> str:
    """Replace a share of Latin letters with look-alike Greek letters (α for a, ο for o, ...)."""
    return _substitute(text, GREEK_HOMOGLYPHS, _check_level(level), _rng(text, seed, "greek"))


def leetspeak(text: str, level: float = 0.3, seed: int = 0) -> str:
    """Replace a share of letters with digits (4 for a, 3 for e, 0 for o, ...)."""
    return _substitute(text, LEET, _check_level(level), _rng(text, seed, "leet"))


def spelling_errors(text: str, level: float = 0.3, seed: int = 0) -> str:
    """In a share of words: swap two letters, drop or double one, or truncate the word's end."""
    level, rng = _check_level(level), _rng(text, seed, "spell")

    def damage(m: re.Match) -> str:
        word = m.group(0)
        if len(word) < 3 or rng.random() >= level:
            return word
        i = rng.randrange(1, len(word) - 1)
        kind = rng.randrange(4)
        if kind == 0:
            return word[:i] + word[i + 1] + word[i] + word[i + 2:]
        if kind == 1:
            return word[:i] + word[i + 1:]
        if kind == 2:
            return word[:i] + word[i] + word[i:]
        return word[:max(2, len(word) - rng.randint(1, 3))]

    return _WORD.sub(damage, text)


def _replace_phrases(text: str, table: dict[str, str]) -> str:
    """Whole-word, case-insensitive phrase replacement, longest phrase first, capitalisation kept."""
    keys = sorted(table, key=len, reverse=True)
    pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in keys) + r")\b", re.IGNORECASE)

    def swap(m: re.Match) -> str:
        found, new = m.group(0), table[m.group(0).lower()]
        if found[0].isupper():
            new = new[0].upper() + new[1:]
        return new

    return pattern.sub(swap, text)


def shortened(text: str, level: float = 1.0, seed: int = 0) -> str:
    """Drop intensifiers / hedges and keep the first half of the sentences (at least one)."""
    words = re.compile(r"\s*\b(" + "|".join(re.escape(w) for w in sorted(SHORTEN_DROP, key=len, reverse=True)) + r")\b,?",
                       re.IGNORECASE)
    trimmed = re.sub(r"\s{2,}", " ", words.sub("", text)).strip()
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", trimmed) if s]
    kept = " ".join(sentences[:max(1, (len(sentences) + 1) // 2)])
    return kept[:1].upper() + kept[1:] if kept else kept


def elevated_language(text: str, level: float = 1.0, seed: int = 0) -> str:
    """Formal register: ELEVATED word and phrase map."""
    return _replace_phrases(text, ELEVATED)


def casual_language(text: str, level: float = 1.0, seed: int = 0) -> str:
    """Casual register: CASUAL word and phrase map (contractions, 'hard' for 'difficult', ...)."""
    return _replace_phrases(text, CASUAL)


PERTURBATIONS: dict[str, Callable[[str, float, int], str]] = {
    "excessive_punctuation": excessive_punctuation,
    "greek_homoglyphs": greek_homoglyphs,
    "spelling_errors": spelling_errors,
    "leetspeak": leetspeak,
    "shortened": shortened,
    "elevated_language": elevated_language,
    "casual_language": casual_language,
}
CHARACTER_LEVEL = ("excessive_punctuation", "greek_homoglyphs", "spelling_errors", "leetspeak")


def perturb(text: str, name: str, level: float = 0.3, seed: int = 0) -> str:
    if name not in PERTURBATIONS:
        raise KeyError(f"unknown perturbation {name!r}; known: {list(PERTURBATIONS)}")
    return PERTURBATIONS[name](text, level, seed)
