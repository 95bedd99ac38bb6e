"""Load and validate a multimodal empathy dataset laid out as documented in docs/dataset.md.

Every problem is reported with the file, line and field it comes from, and all problems of a
dataset are collected before raising, so a researcher can fix a whole CSV in one pass.
Problems that can be handled without guessing (a session without a transcript) are kept as
warnings: the session is excluded from windows and the warning says so. Files that start with a
byte-order mark are read in the encoding it names (UTF-16, as Excel's "Unicode text" saves, or UTF-8
with a BOM); a Windows path in sessions.csv (`media\\s01.mp4`) is read with `/` where that file exists.
"""
from __future__ import annotations

import codecs
import difflib
import io
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from empathic_fusion.core.errors import UserError
from empathic_fusion.core.files import sha256_file
from empathic_fusion.dataset.scale import SELF_REPORT, TRAIT_SCALE, RatingScale

PHASES = ("warm_up", "story_share", "story_receive", "reflection", "cool_down")
SPEAKERS = ("participant", "agent")
TRAIT_COLUMNS = (
    "big5_openness",
    "big5_conscientiousness",
    "big5_extraversion",
    "big5_agreeableness",
    "big5_neuroticism",
    "trait_empathy",
)
TRANSCRIPT_COLUMNS = ("start", "end", "speaker", "phase", "story_id", "text")
DATASET_KEYS = ("name", "fps", "generated", "rating_scale")  # what dataset.yaml may hold


@dataclass(frozen=True)
class Problem:
    """One validation problem, located precisely enough to fix by hand."""

    file: str
    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f", line {self.line}"
        if self.field is not None:
            where += f", field '{self.field}'"
        return f"{where}: {self.message}"


class DatasetError(UserError, ValueError):
    """Raised with every problem found; the message lists them one per line."""

    def __init__(self, root: Path, problems: list[Problem]):
        self.problems = problems
        listed = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"dataset at {root} has {len(problems)} problem(s):\n{listed}")


@dataclass
class EmpathyDataset:
    """A validated dataset: tables indexed by their ids, media paths absolute."""

    root: Path
    name: str
    fps: float
    participants: pd.DataFrame  # index participant_id; TRAIT_COLUMNS (NaN = not surveyed), then other columns as text
    sessions: pd.DataFrame  # index session_id; participant_id, video (Path), audio (Path | None)
    transcripts: dict[str, pd.DataFrame]  # session_id -> utterances sorted by start
    stories: pd.DataFrame  # index story_id; text
    ratings: pd.DataFrame  # session_id, story_id, empathy (float), participant_id
    warnings: list[str] = field(default_factory=list)
    generated: bool = False  # dataset.yaml `generated: true`: made by a generator (the demo), not recorded
    rating_scale: RatingScale = SELF_REPORT  # dataset.yaml `rating_scale: [low, high]` of ratings.csv's empathy

    def transcript_path(self, session_id: str) -> Path:
        return self.root / "transcripts" / f"{session_id}.csv"


def _line(row_index: int) -> int:
    """CSV line of a data row (line 1 is the header)."""
    return row_index + 2


class EncodingProblem(ValueError):
    """A text file that cannot be decoded; `line` (1-based, or None) and `message` say where and what."""

    def __init__(self, line: int | None, message: str):
        super().__init__(message)
        self.line, self.message = line, message


# byte-order marks, longest first (UTF-32 LE's starts with UTF-16 LE's): (mark, codec, name)
_BYTE_ORDER_MARKS = ((codecs.BOM_UTF32_LE, "utf-32", "UTF-32"), (codecs.BOM_UTF32_BE, "utf-32", "UTF-32"),
                     (codecs.BOM_UTF8, "utf-8-sig", "UTF-8 with a byte-order mark"),
                     (codecs.BOM_UTF16_LE, "utf-16", "UTF-16"), (codecs.BOM_UTF16_BE, "utf-16", "UTF-16"))


def decode_text(raw: bytes) -> str:
    """A text file's contents: UTF-8, or the encoding its byte-order mark names (Excel saves "Unicode text"
    as UTF-16 with one). Raises EncodingProblem naming the line, the byte and the encoding it was read as:
    a file in another encoding (Latin-1), a UTF-16 file without a mark (NUL bytes between the letters),
    bytes its own mark's encoding cannot decode."""
    for mark, codec, name in _BYTE_ORDER_MARKS:
        if raw.startswith(mark):
            try:
                return raw.decode(codec)
            except UnicodeDecodeError as error:
                before = raw[:error.start].decode(codec, errors="replace")
                raise EncodingProblem(before.count("\n") + 1, (
                    f"is {name} (it starts with a {name} byte-order mark) but byte {error.start + 1} of the file "
                    f"(0x{raw[error.start]:02x}) cannot be decoded as {name}; save the file as UTF-8")) from None
    if b"\x00" in raw:
        at = raw.index(b"\x00")
        raise EncodingProblem(raw.count(b"\n", 0, at) + 1, (
            "is not UTF-8: it holds NUL bytes, as UTF-16 without a byte-order mark does (or it is not a text file); "
            "save the file as UTF-8"))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:  # name the line and byte, not only the file
        line_start = raw.rfind(b"\n", 0, error.start) + 1
        raise EncodingProblem(raw.count(b"\n", 0, error.start) + 1, (
            f"is not UTF-8: byte {error.start - line_start + 1} of the line is 0x{raw[error.start]:02x} "
            f"(save the file as UTF-8)")) from None


def _read_table(path: Path, required: tuple[str, ...], problems: list[Problem], rel: str) -> pd.DataFrame | None:
    if not path.exists():
        problems.append(Problem(rel, None, None, "file is missing"))
        return None
    try:
        text = decode_text(path.read_bytes())
    except EncodingProblem as problem:
        problems.append(Problem(rel, problem.line, None, problem.message))
        return None
    try:
        table = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except Exception as error:  # noqa: BLE001 - any parse failure is reported with the file name
        problems.append(Problem(rel, None, None, f"cannot be parsed as CSV ({error})"))
        return None
    missing = [c for c in required if c not in table.columns]
    if missing:
        problems.append(Problem(rel, 1, None, f"missing column(s) {missing}; found {list(table.columns)}"))
        return None
    return table


def _number(value: str, rel: str, i: int, column: str, problems: list[Problem],
            allowed: RatingScale | None = None, required: bool = True, scale_note: str = "") -> float:
    text = str(value).strip()
    if text == "":
        if required:
            problems.append(Problem(rel, _line(i), column, "is empty"))
        return math.nan
    try:
        number = float(text)
    except ValueError:
        problems.append(Problem(rel, _line(i), column, f"'{text}' is not a number"))
        return math.nan
    if math.isnan(number) or math.isinf(number):
        problems.append(Problem(rel, _line(i), column, f"'{text}' is not a finite number"))
        return math.nan
    if allowed is not None and not allowed.contains(number):
        problems.append(Problem(rel, _line(i), column, f"{number:g} is outside {allowed}{scale_note}"))
        return math.nan
    return number


def _fps_problem(fps: object) -> str | None:
    """Why dataset.yaml's fps is not a usable frame rate, or None. YAML reads `true` as a boolean, which
    Python would take as 1, and `.nan`/`.inf` as floats: all are refused, naming the value."""
    if isinstance(fps, bool) or not isinstance(fps, (int, float)):
        kind = "a boolean" if isinstance(fps, bool) else ("missing" if fps is None else f"a {type(fps).__name__}")
        return f"must be a positive number of frames per second, got {fps!r} ({kind})"
    if not math.isfinite(fps):
        return f"must be a finite number of frames per second, got {fps!r}"
    if fps <= 0:
        return f"must be a positive number of frames per second, got {fps!r}"
    return None


def _rating_scale_problem(value: object) -> str | None:
    """Why dataset.yaml's rating_scale is not [low, high] with two finite numbers, low < high, or None."""
    if not isinstance(value, list) or len(value) != 2:
        return f"must be [low, high], two numbers such as [1, 7], got {value!r}"
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in value):
        return f"must be [low, high] with two finite numbers, got {value!r}"
    if not value[0] < value[1]:
        return f"must be [low, high] with low < high, got {value!r}"
    return None


def _yaml_key_line(text: str, key: str) -> int | None:
    """Line of a top-level key in a YAML file (for messages), or None when it is not there."""
    for number, line in enumerate(text.splitlines(), start=1):
        if line.split(":", 1)[0].strip().strip("'\"") == key and not line.startswith((" ", "\t")):
            return number
    return None


def _read_meta(root: Path, problems: list[Problem]) -> dict:
    """dataset.yaml, checked: a mapping of the known keys (an unknown one, such as a misspelt
    rating_scale, would otherwise be ignored without a word), fps a frame rate, generated a boolean,
    rating_scale [low, high]. Returns {} when the file cannot be read as such a mapping."""
    rel = "dataset.yaml"
    path = root / rel
    if not path.exists():
        problems.append(Problem(rel, None, None, "file is missing (it gives the dataset's name and fps)"))
        return {}
    try:
        text = decode_text(path.read_bytes())
    except EncodingProblem as problem:
        problems.append(Problem(rel, problem.line, None, problem.message))
        return {}
    try:
        meta = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        what = getattr(error, "problem", None) or str(error).splitlines()[0]
        problems.append(Problem(rel, mark.line + 1 if mark is not None else None, None,
                                f"is not valid YAML ({what}); write one 'key: value' per line"))
        return {}
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        problems.append(Problem(rel, None, None, f"must be a mapping of keys ({', '.join(DATASET_KEYS)}), "
                                                 f"got a {type(meta).__name__}"))
        return {}
    for key in meta:
        if key not in DATASET_KEYS:
            close = difflib.get_close_matches(str(key), DATASET_KEYS, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            problems.append(Problem(rel, _yaml_key_line(text, str(key)), str(key),
                                    f"is not a dataset.yaml key; {hint}the keys are {', '.join(DATASET_KEYS)}"))
    problem = _fps_problem(meta.get("fps"))
    if problem:
        problems.append(Problem(rel, _yaml_key_line(text, "fps"), "fps", problem))
    if not isinstance(meta.get("generated", False), bool):
        problems.append(Problem(rel, _yaml_key_line(text, "generated"), "generated",
                                f"must be true or false, got {meta['generated']!r}"))
    if "rating_scale" in meta:
        problem = _rating_scale_problem(meta["rating_scale"])
        if problem:
            problems.append(Problem(rel, _yaml_key_line(text, "rating_scale"), "rating_scale", problem))
    return meta


def _declared_rating_scale(meta: dict) -> RatingScale | None:
    """The scale dataset.yaml's (checked) `meta` declares, the 1-5 default when it declares none, or None
    when its rating_scale is malformed (already a problem)."""
    if "rating_scale" not in meta:
        return SELF_REPORT
    if _rating_scale_problem(meta["rating_scale"]):
        return None
    low, high = meta["rating_scale"]
    return RatingScale(float(low), float(high))


def read_rating_scale(root: str | Path) -> RatingScale | None:
    """The rating scale dataset.yaml at `root` declares (1-5 when it declares none or is not there yet,
    e.g. a demo still to be generated), or None when dataset.yaml has problems (load_dataset names them).
    For checks that run before the dataset is loaded (the config's Acc/F1 threshold)."""
    root = Path(root).resolve()
    if not (root / "dataset.yaml").exists():
        return SELF_REPORT
    problems: list[Problem] = []
    meta = _read_meta(root, problems)
    return None if problems else _declared_rating_scale(meta)


def _unique_ids(table: pd.DataFrame, column: str, rel: str, problems: list[Problem]) -> None:
    seen: dict[str, int] = {}
    for i, value in enumerate(table[column]):
        if value.strip() == "":
            problems.append(Problem(rel, _line(i), column, "is empty"))
        elif value in seen:
            problems.append(Problem(rel, _line(i), column, f"'{value}' repeats line {_line(seen[value])}"))
        else:
            seen[value] = i


def _load_participants(root: Path, problems: list[Problem]) -> pd.DataFrame:
    rel = "participants.csv"
    table = _read_table(root / rel, ("participant_id",), problems, rel)
    if table is None:
        return pd.DataFrame(columns=list(TRAIT_COLUMNS))
    _unique_ids(table, "participant_id", rel, problems)
    for column in TRAIT_COLUMNS:
        if column not in table.columns:
            table[column] = ""  # traits are optional survey data; absent = not surveyed
        table[column] = [
            _number(v, rel, i, column, problems, TRAIT_SCALE, required=False) for i, v in enumerate(table[column])
        ]
    # other columns (gender, age band, ...) are kept as text, "" = missing: attributes for evaluation.groups
    others = [c for c in table.columns if c != "participant_id" and c not in TRAIT_COLUMNS]
    table[others] = table[others].replace("", math.nan)
    return table.drop_duplicates("participant_id").set_index("participant_id")[list(TRAIT_COLUMNS) + others]


def _load_sessions(root: Path, participants: pd.DataFrame, problems: list[Problem], warnings: list[str],
                   modalities: tuple[str, ...] = ("video", "audio", "text"), allow_shared_media: bool = False,
                   file_hash: Callable[[Path], str] | None = None) -> pd.DataFrame:
    """Sessions with their media paths; a media file is required only where a selected modality reads it:
    the video for video (and for audio when a session has no audio file: its own track is read), the
    audio file for audio. The media read are checked for one recording named by two sessions."""
    rel = "sessions.csv"
    table = _read_table(root / rel, ("session_id", "participant_id", "video"), problems, rel)
    if table is None:
        return pd.DataFrame(columns=["participant_id", "video", "audio"])
    if "audio" not in table.columns:
        table["audio"] = ""
    _unique_ids(table, "session_id", rel, problems)
    videos, audios = [], []
    for i, row in table.iterrows():
        if row.participant_id not in participants.index:
            problems.append(Problem(rel, _line(i), "participant_id",
                                    f"'{row.participant_id}' is not in participants.csv"))
        video = _media_path(root, row.video, rel, i, "video", warnings)
        audio = _media_path(root, row.audio, rel, i, "audio", warnings)
        video_for = [m for m in ("video", "audio") if m in modalities and (m == "video" or audio is None)]
        if video is None and video_for:  # an audio-only session works for modalities that do not read video
            problems.append(Problem(rel, _line(i), "video", f"is empty (the {' and '.join(video_for)} modality reads "
                                    f"it; a session with only an audio file works with modality a+t, a or t)"))
        elif video is not None and not video.is_file() and video_for:
            problems.append(Problem(rel, _line(i), "video", f"file '{row.video}' does not exist (the "
                                    f"{' and '.join(video_for)} modality reads it){_slash_hint(row.video)}"))
        if audio is not None and not audio.is_file() and "audio" in modalities:
            problems.append(Problem(rel, _line(i), "audio", f"file '{row.audio}' does not exist (the audio "
                                    f"modality reads it){_slash_hint(row.audio)}"))
        videos.append(video)
        audios.append(audio)
    table["video"], table["audio"] = videos, audios
    read = [m for m in ("video", "audio") if m in modalities]
    media = [(_line(i), name, row[name], row.session_id, row.participant_id) for i, row in table.iterrows()
             for name in ("video", "audio")
             if row[name] is not None and row[name].is_file()
             and (name == "audio" and "audio" in read or name == "video" and ("video" in read or
                                                                                 "audio" in read and row.audio is None))]
    _shared_media(media, rel, root, allow_shared_media, file_hash or sha256_file, problems, warnings)
    return table.drop_duplicates("session_id").set_index("session_id")[["participant_id", "video", "audio"]]


def _windows_path(value: str) -> bool:
    """Whether a path from a table uses Windows backslashes where they are not separators (POSIX)."""
    return "\\" in value and os.sep == "/"


def _with_slashes(value: str) -> str:
    return value.replace("\\", "/")


def _media_path(root: Path, value: str, rel: str, i: int, column: str, warnings: list[str]) -> Path | None:
    """The media file a sessions.csv cell names (None when empty). On POSIX a backslash is part of a file
    name, so a path written on Windows (`media\\s01.mp4`) is read with `/` when that file exists and the
    name as written does not, with a warning naming the line."""
    if not value.strip():
        return None
    path = root / value
    if _windows_path(value) and not path.is_file():
        slashed = root / _with_slashes(value)
        if slashed.is_file():
            warnings.append(f"{rel}, line {_line(i)}, field '{column}': '{value}' uses Windows backslashes; read as "
                            f"'{_with_slashes(value)}' (write paths with '/' so the table reads the same "
                            f"on every system)")
            return slashed
    return path


def _slash_hint(value: str) -> str:
    """What a missing file's message adds when its path has Windows backslashes."""
    if not _windows_path(value):
        return ""
    return f"; nor does '{_with_slashes(value)}': write paths with '/', relative to the dataset folder"


def _shared_media(media: list[tuple[int, str, Path, str, str]], rel: str, root: Path, allow_shared: bool,
                  file_hash: Callable[[Path], str], problems: list[Problem], warnings: list[str]) -> None:
    """One recording (same bytes) named by two sessions: an error across participants (it would put one
    recording into two participants' splits) unless allowed, a warning within one participant.

    `media` holds (line, field, path, session, participant). Only files of equal size are hashed, so a
    dataset whose recordings all differ in size is not read at all; `file_hash` may be a cached hasher
    (the feature store's)."""
    by_size: dict[int, list] = {}
    for item in media:
        by_size.setdefault(item[2].stat().st_size, []).append(item)
    digests: dict[Path, str] = {}
    first: dict[str, tuple[int, str, Path, str, str]] = {}
    for group in by_size.values():
        if len({item[3] for item in group}) < 2:
            continue  # files of one session only
        for item in group:
            line, name, path, session, participant = item
            resolved = path.resolve()
            if resolved not in digests:
                digests[resolved] = file_hash(resolved)
            seen = first.setdefault(digests[resolved], item)
            if seen[3] == session:
                continue
            what = (f"'{path.relative_to(root) if path.is_relative_to(root) else path}' is the same recording "
                    f"(sha256 {digests[resolved][:12]}) as line {seen[0]}'s {seen[1]}")
            if seen[4] != participant:
                message = (f"{what}: sessions '{seen[3]}' (participant '{seen[4]}') and '{session}' (participant "
                           f"'{participant}') share one recording, so it would be in two participants' splits")
                if allow_shared:
                    warnings.append(f"{rel}, line {line}, field '{name}': {message} (data.allow_shared_media=true)")
                else:
                    problems.append(Problem(rel, line, name, f"{message}; correct {rel}, or set "
                                                             f"data.allow_shared_media=true if they really share it"))
            else:
                warnings.append(f"{rel}, line {line}, field '{name}': {what}: sessions '{seen[3]}' and '{session}' of "
                                f"participant '{participant}' share one recording")


def _load_stories(root: Path, problems: list[Problem]) -> pd.DataFrame:
    rel = "stories.csv"
    table = _read_table(root / rel, ("story_id", "text"), problems, rel)
    if table is None:
        return pd.DataFrame(columns=["text"])
    _unique_ids(table, "story_id", rel, problems)
    for i, text in enumerate(table.text):
        if text.strip() == "":
            problems.append(Problem(rel, _line(i), "text", "is empty"))
    return table.drop_duplicates("story_id").set_index("story_id")[["text"]]


def _load_transcript(path: Path, rel: str, stories: pd.DataFrame, problems: list[Problem]) -> pd.DataFrame | None:
    table = _read_table(path, TRANSCRIPT_COLUMNS, problems, rel)
    if table is None:
        return None
    starts, ends = [], []
    known_stories = set(stories.index)
    # plain columns zipped, not iterrows (a Series per row: most of a dataset's load time with long transcripts)
    for i, start_text, end_text, speaker, phase, story_text in zip(
            table.index, table.start, table.end, table.speaker, table.phase, table.story_id):
        start = _number(start_text, rel, i, "start", problems)
        end = _number(end_text, rel, i, "end", problems)
        if start < 0:
            problems.append(Problem(rel, _line(i), "start", f"{start:g} is negative"))
        if not math.isnan(start) and not math.isnan(end) and end <= start:
            problems.append(Problem(rel, _line(i), "end", f"{end:g} is not after start {start:g}"))
        if speaker not in SPEAKERS:
            problems.append(Problem(rel, _line(i), "speaker", f"'{speaker}' is not one of {list(SPEAKERS)}"))
        if phase not in PHASES:
            problems.append(Problem(rel, _line(i), "phase", f"'{phase}' is not one of {list(PHASES)}"))
        story = story_text.strip()
        if phase == "reflection" and story == "":
            problems.append(Problem(rel, _line(i), "story_id", "a reflection utterance must name the story it reflects on"))
        if story and story not in known_stories:
            problems.append(Problem(rel, _line(i), "story_id", f"'{story}' is not in stories.csv"))
        starts.append(start)
        ends.append(end)
    table["start"], table["end"] = starts, ends
    table["story_id"] = table.story_id.str.strip()
    return table.sort_values("start", kind="stable").reset_index(drop=True)


def _load_ratings(root: Path, sessions: pd.DataFrame, stories: pd.DataFrame, problems: list[Problem],
                  required: bool = True, scale: RatingScale | None = SELF_REPORT,
                  declared: bool = False) -> pd.DataFrame:
    """ratings.csv, each empathy a number on `scale` (None: dataset.yaml's rating_scale is malformed, which is
    a problem of its own, so only numbers are checked); `declared`: dataset.yaml names the scale."""
    rel = "ratings.csv"
    empty = pd.DataFrame(columns=["session_id", "story_id", "empathy", "participant_id"])
    if not required and not (root / rel).exists():
        return empty  # new recordings to score: nobody has rated them yet
    table = _read_table(root / rel, ("session_id", "story_id", "empathy"), problems, rel)
    if table is None:
        return empty
    seen: dict[tuple[str, str], int] = {}
    for i, row in table.iterrows():
        if row.session_id not in sessions.index:
            problems.append(Problem(rel, _line(i), "session_id", f"'{row.session_id}' is not in sessions.csv"))
        if row.story_id not in stories.index:
            problems.append(Problem(rel, _line(i), "story_id", f"'{row.story_id}' is not in stories.csv"))
        key = (row.session_id, row.story_id)
        if key in seen:
            problems.append(Problem(rel, _line(i), "story_id",
                                    f"session '{key[0]}' rates story '{key[1]}' again (first on line {_line(seen[key])})"))
        seen.setdefault(key, i)
    note = (" (the rating_scale dataset.yaml declares)" if declared else
            " (the default rating scale; a dataset rated on another scale declares it in dataset.yaml, "
            "e.g. rating_scale: [1, 7])")
    table["empathy"] = [_number(v, rel, i, "empathy", problems, scale, scale_note=note)
                        for i, v in enumerate(table.empathy)]
    table = table.drop_duplicates(["session_id", "story_id"]).reset_index(drop=True)
    table["participant_id"] = table.session_id.map(sessions.participant_id)
    return table[["session_id", "story_id", "empathy", "participant_id"]]


def load_dataset(root: str | Path, modalities: list[str] | tuple[str, ...] | None = None,
                 allow_shared_media: bool = False, file_hash: Callable[[Path], str] | None = None,
                 ratings_required: bool = True) -> EmpathyDataset:
    """Read and validate the dataset at root; raise DatasetError listing every problem found. With
    `modalities`, media files are required only where those modalities read them (v+t never opens audio).
    A recording (same sha256) that sessions of two participants name is an error, or a warning with
    `allow_shared_media`; `file_hash` lets a caller pass a cached hasher (FeatureStore.file_hash).
    `ratings_required=False` (scoring new recordings) reads a dataset without ratings.csv as unrated;
    a ratings.csv that is there is checked as always."""
    root = Path(root).resolve()
    problems: list[Problem] = []
    meta = _read_meta(root, problems)
    scale = _declared_rating_scale(meta)
    participants = _load_participants(root, problems)
    warnings: list[str] = []
    sessions = _load_sessions(root, participants, problems, warnings,
                              tuple(modalities) if modalities is not None else ("video", "audio", "text"),
                              allow_shared_media, file_hash)
    stories = _load_stories(root, problems)
    ratings = _load_ratings(root, sessions, stories, problems, ratings_required, scale, "rating_scale" in meta)
    transcripts: dict[str, pd.DataFrame] = {}
    for session_id in sessions.index:
        rel = f"transcripts/{session_id}.csv"
        path = root / rel
        if not path.exists():
            n = int((ratings.session_id == session_id).sum())
            warnings.append(f"session '{session_id}': transcript {rel} is missing; its phases are unknown, "
                            f"so its {n} rating(s) get no windows and its text features are masked")
            continue
        transcript = _load_transcript(path, rel, stories, problems)
        if transcript is not None:
            transcripts[session_id] = transcript
    if problems:
        raise DatasetError(root, problems)
    return EmpathyDataset(root=root, name=str(meta.get("name", root.name)), fps=float(meta["fps"]),
                          participants=participants, sessions=sessions, transcripts=transcripts,
                          stories=stories, ratings=ratings, warnings=warnings,
                          generated=bool(meta.get("generated", False)), rating_scale=scale)
