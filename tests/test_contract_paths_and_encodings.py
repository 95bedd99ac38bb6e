"""Tables made on Windows or saved by Excel: a media path with backslashes in sessions.csv is read with `/`
where that file exists (a warning names the line), else its error says to write `/`; a file with a UTF-16
(or UTF-8) byte-order mark is read in that encoding, and UTF-16 without one is named, not called garbage.
The dataset is the 1-7 test dataset (tables and transcripts, with small stand-in media files)."""
from __future__ import annotations

import codecs
from pathlib import Path

import pandas as pd
import pytest

from empathic_fusion.dataset import DatasetError, load_dataset
from empathic_fusion.scoring.table import TableError, read_table
from tests.test_rating_scale import write_dataset


@pytest.fixture
def dataset(tmp_path) -> Path:
    """The dataset, with a distinct stand-in file for every video sessions.csv names (only their presence is
    checked when the video modality is selected)."""
    root = write_dataset(tmp_path / "data", {"name": "windows", "fps": 15, "rating_scale": [1, 7]})
    for position, video in enumerate(pd.read_csv(root / "sessions.csv").video):
        (root / video).parent.mkdir(parents=True, exist_ok=True)
        (root / video).write_bytes(f"video {position}".encode())
    return root


def _set_video(root: Path, row: int, value: str) -> None:
    sessions = pd.read_csv(root / "sessions.csv", dtype=str, keep_default_na=False)
    sessions.loc[row, "video"] = value
    sessions.to_csv(root / "sessions.csv", index=False)


def test_a_windows_path_is_read_with_slashes_where_that_file_exists_with_a_warning(dataset):
    video = pd.read_csv(dataset / "sessions.csv").video[1]  # media/p002_s1.avi
    windows = video.replace("/", "\\")
    _set_video(dataset, 1, windows)
    data = load_dataset(dataset, ["video", "text"])
    sid = data.sessions.index[1]
    assert data.sessions.video[sid] == dataset.resolve() / video
    assert (f"sessions.csv, line 3, field 'video': '{windows}' uses Windows backslashes; read as '{video}' (write "
            f"paths with '/' so the table reads the same on every system)") in data.warnings


def test_a_windows_path_to_no_file_keeps_its_line_and_says_to_write_slashes(dataset):
    _set_video(dataset, 2, "media\\missing.avi")
    with pytest.raises(DatasetError) as info:
        load_dataset(dataset, ["video"])
    expected = ("sessions.csv, line 4, field 'video': file 'media\\missing.avi' does not exist (the video modality "
                "reads it); nor does 'media/missing.avi': write paths with '/', relative to the dataset folder")
    assert expected in str(info.value)


def _encode(path: Path, encoding: str) -> None:
    path.write_bytes(path.read_text(encoding="utf-8").encode(encoding))


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-8-sig"])
def test_a_file_with_a_byte_order_mark_is_read_in_its_encoding(dataset, encoding):
    """Excel's "Unicode text" is UTF-16 with a byte-order mark: the same tables load as from UTF-8."""
    reference = load_dataset(dataset, ["text"])
    sid = reference.sessions.index[0]
    transcript = dataset / "transcripts" / f"{sid}.csv"
    table = pd.read_csv(transcript, keep_default_na=False)
    table.loc[0, "text"] = "Grüße, naïve café"  # not ASCII: decoded, not only passed through
    table.to_csv(transcript, index=False)
    expected = load_dataset(dataset, ["text"])
    if encoding == "utf-16-be":
        for name in ("ratings.csv", f"transcripts/{sid}.csv"):
            path = dataset / name
            path.write_bytes(codecs.BOM_UTF16_BE + path.read_text(encoding="utf-8").encode("utf-16-be"))
    else:
        for name in ("ratings.csv", f"transcripts/{sid}.csv", "dataset.yaml"):
            _encode(dataset / name, encoding)
    data = load_dataset(dataset, ["text"])
    pd.testing.assert_frame_equal(data.ratings, expected.ratings)
    pd.testing.assert_frame_equal(data.transcripts[sid], expected.transcripts[sid])
    assert data.transcripts[sid].text[0] == "Grüße, naïve café" and data.fps == 15


def test_utf16_without_a_mark_and_undecodable_utf16_are_named(dataset):
    ratings = dataset / "ratings.csv"
    text = ratings.read_text(encoding="utf-8")
    ratings.write_bytes(text.encode("utf-16-le"))  # no byte-order mark: NUL bytes between the letters
    with pytest.raises(DatasetError) as info:
        load_dataset(dataset, ["text"])
    assert ("ratings.csv, line 1: is not UTF-8: it holds NUL bytes, as UTF-16 without a byte-order mark does (or it "
            "is not a text file); save the file as UTF-8") in str(info.value)
    ratings.write_bytes(codecs.BOM_UTF16_LE + text.encode("utf-16-le") + b"\x00\xd8A\x00")  # an unpaired surrogate
    with pytest.raises(DatasetError) as info:
        load_dataset(dataset, ["text"])
    lines = text.count("\n") + 1
    assert (f"ratings.csv, line {lines}: is UTF-16 (it starts with a UTF-16 byte-order mark) but byte "
            f"{len(codecs.BOM_UTF16_LE + text.encode('utf-16-le')) + 1} of the file (0x00) cannot be decoded as "
            f"UTF-16; save the file as UTF-8") in str(info.value)


def test_the_scoring_table_reads_utf16_and_names_what_it_cannot(tmp_path):
    """empathic-predict's text tables are read as the dataset's files are."""
    path = tmp_path / "table.csv"
    path.write_bytes("text,note\nIch fühle mit dir,ä\n".encode("utf-16"))
    assert read_table(path, ["text"]).text.tolist() == ["Ich fühle mit dir"]
    path.write_bytes("text\nIch fühle mit dir\n".encode("utf-16-le"))
    with pytest.raises(TableError, match=r"table.csv, line 1: is not UTF-8: it holds NUL bytes, as UTF-16 without a "
                                         r"byte-order mark does"):
        read_table(path, ["text"])
