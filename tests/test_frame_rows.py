"""FrameRows: a per-frame output written to a .npy file while it is computed is the array an in-memory run
gives (np.save's very bytes), whatever the declared frame count; small outputs stay arrays."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from empathic_fusion.features import frame_rows
from empathic_fusion.features.frame_rows import FrameRows, NpyFile


def _rows(count: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, width)).astype(np.float32)


def _fill(rows: FrameRows, frames: list[int], values: np.ndarray) -> None:
    """Single frames one at a time, then the rest in increasing runs, as the face and CNN paths give them."""
    half = len(frames) // 2
    for frame, value in zip(frames[:half], values[:half]):
        rows.put(frame, value)
    for start in range(half, len(frames), 7):
        rows.put(np.array(frames[start:start + 7]), values[start:start + 7])


def _expected(count: int, width: int, frames: list[int], values: np.ndarray) -> np.ndarray:
    expected = np.zeros((count, width), dtype=np.float16)
    expected[frames] = values
    return expected


@pytest.mark.parametrize("declared", [3000, 40, 0])  # as many frames as declared, fewer (grows), none declared
def test_rows_written_to_disk_load_as_the_in_memory_array_with_gaps_zero(tmp_path, monkeypatch, declared):
    monkeypatch.setattr(frame_rows, "SPILL_BYTES", 1)  # every output goes to disk
    frames = sorted(np.random.default_rng(0).choice(3000, 1800, replace=False).tolist())  # gaps of every length
    frames += [3300, 3301]  # past the last gap, beyond a whole buffer of zero rows
    values = _rows(len(frames), 5, seed=1)
    rows = FrameRows(declared, (5,), np.float16, tmp_path / "rows", "face", buffer_rows=64)
    memory = FrameRows(declared, (5,), np.float16)  # no folder: in memory, as before
    _fill(rows, frames, values)
    _fill(memory, frames, values)
    written, held = rows.finish(3400), memory.finish(3400)
    assert isinstance(written, NpyFile) and written.shape == (3400, 5) and written.dtype == np.float16
    assert written.path == tmp_path / "rows" / "face.npy" and written.nbytes == 3400 * 5 * 2
    assert pickle.loads(pickle.dumps(written)) == written  # a worker process's result carries it to the writer
    assert isinstance(held, np.ndarray) and np.array_equal(held, _expected(3400, 5, frames, values))
    loaded = np.load(written.path)
    assert loaded.dtype == np.float16 and np.array_equal(loaded, held)
    np.save(tmp_path / "saved.npy", held)
    assert written.path.read_bytes() == (tmp_path / "saved.npy").read_bytes()  # header and all: np.save's file


def test_a_header_rewritten_in_place_for_a_shape_with_more_digits(tmp_path, monkeypatch):
    monkeypatch.setattr(frame_rows, "SPILL_BYTES", 1)
    rows = FrameRows(9, (2,), np.uint8, tmp_path, "mask", buffer_rows=1000)
    rows.put(5, [1, 2])
    rows.put(123_455, 3)  # declared 9 rows (one digit), finishes with 123,456 (six)
    written = rows.finish(123_456)
    loaded = np.load(written.path)
    assert loaded.shape == (123_456, 2) and loaded.dtype == np.uint8
    assert loaded[5].tolist() == [1, 2] and loaded[123_455].tolist() == [3, 3] and loaded.sum() == 9
    header = frame_rows.npy_header((123_456, 2), np.uint8)
    assert len(header) == len(frame_rows.npy_header((9, 2), np.uint8))  # the same length: rewritten in place
    assert written.path.read_bytes()[:len(header)] == header
    assert written.path.stat().st_size == len(header) + 123_456 * 2


def test_an_in_memory_output_that_grows_past_the_threshold_goes_to_disk_with_its_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(frame_rows, "SPILL_BYTES", 100 * 4 * 2)  # 100 rows of 4 float16
    values = _rows(300, 4, seed=2)
    rows = FrameRows(10, (4,), np.float16, tmp_path, "cnn", buffer_rows=16)
    rows.put(np.arange(0, 60), values[:60])
    assert rows.array is not None  # 60 rows (grown from the declared 10): still in memory
    rows.put(np.arange(60, 300, 2), values[60:300:2])  # grows past 100 rows: what it held is written out
    assert rows.array is None
    written = rows.finish(301)
    expected = np.zeros((301, 4), dtype=np.float16)
    expected[:60], expected[60:300:2] = values[:60], values[60:300:2]
    assert np.array_equal(np.load(written.path), expected)


def test_small_outputs_and_those_without_a_folder_stay_in_memory(tmp_path):
    rows = FrameRows(1000, (1451,), np.float16, tmp_path)  # 2.9 MB: under SPILL_BYTES
    rows.put(3, np.ones(1451))
    array = rows.finish(1200)  # more frames than declared
    assert isinstance(array, np.ndarray) and array.shape == (1200, 1451) and array.sum() == 1451
    assert not list(tmp_path.iterdir())
    unbounded = FrameRows(10 ** 9, (0,), np.float16)  # no folder: in memory whatever its size (here none)
    assert isinstance(unbounded.finish(10 ** 9), np.ndarray)


def test_frames_must_come_in_increasing_order_and_a_discarded_output_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(frame_rows, "SPILL_BYTES", 1)
    rows = FrameRows(100, (3,), np.float16, tmp_path, "face")
    rows.put(10, 1.0)
    for frames in (10, 4, np.array([11, 11]), np.array([12, 9])):
        with pytest.raises(ValueError, match="frame"):
            rows.put(frames, 2.0)
    with pytest.raises(ValueError, match="10 rows asked for, frame 10 was given"):
        rows.finish(10)
    rows.discard()
    assert not list(tmp_path.iterdir())
