"""A session's per-frame output rows, kept in memory while small and written to a .npy file while computed
when large, so extraction's memory does not grow with the session's length.

A 2-hour session at 15 fps has 108,000 frames: its face features (1451 float16 a frame) are 313 MB, its CNN
embeddings (1280) 276 MB. FrameRows takes the rows in frame order (gaps are zero rows, as in an array made
with np.zeros), holds BUFFER_ROWS of them at a time and appends them to a .npy file with plain sequential
writes (written pages sit in the page cache, which the kernel can drop, not in the process's resident
memory as a memmap's would); the header is written first with room to grow (numpy pads it for up to
GROWTH_AXIS_MAX_DIGITS digits of the first axis) and rewritten in place with the final shape when the rows
are finished, so a stream with more frames than it declared needs no copy. The file is byte for byte what
np.save would write for the same array. Outputs under SPILL_BYTES stay one in-memory array, as before:
short sessions, the demo and the tests get ndarrays. FeatureStore.write_branch takes either (NpyFile:
it moves the file into the branch's folder).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Outputs of at least this many bytes go to disk: 64 MB is about 23,000 face frames (25 minutes at 15 fps)
# or 26,000 CNN frames; a session below it holds its output as it always did (a copy or two of it, in the
# store's checks, stays far below the ~0.7 GB the extraction process holds anyway), one above it holds
# BUFFER_ROWS rows whatever its length. Read when a FrameRows is made (tests lower it).
SPILL_BYTES = 64 * 2 ** 20
BUFFER_ROWS = 1024  # rows held before they are written: 3 MB of face rows, written in one call
GROWTH_ROWS = 16    # the fewest rows an in-memory array grows to (a stream that declares no frame count)


@dataclass(frozen=True)
class NpyFile:
    """A finished .npy file standing for an array that was never held in memory (FeatureStore.write_branch
    moves it into the store)."""

    path: Path
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The .npy (version 1.0) header np.save writes for an array of this shape and dtype."""
    from io import BytesIO

    header = BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                  "fortran_order": False, "shape": tuple(int(n) for n in shape)})
    return header.getvalue()


class FrameRows:
    """Rows of one per-frame output (row i: frame i), given in increasing frame order; frames never given
    are zero. In memory (an array allocated for the declared `rows`, grown by doubling past them) unless
    `folder` is given and the output reaches SPILL_BYTES, declared or grown: then the rows go to
    `folder`/`name`.npy (the folder is created then) and `finish` returns an NpyFile."""

    def __init__(self, rows: int, row_shape: tuple[int, ...], dtype: np.dtype | type, folder: Path | None = None,
                 name: str = "rows", buffer_rows: int = BUFFER_ROWS):
        self.row_shape, self.dtype = tuple(row_shape), np.dtype(dtype)
        self.folder, self.name, self.buffer_rows = folder, name, buffer_rows
        self.next = 0  # the first frame a row may still be given for
        self.array: np.ndarray | None = None  # in memory
        self.buffer: np.ndarray | None = None  # on disk: rows written .. written + buffer_rows, not yet written
        self.written = 0  # rows in the file
        self.handle = None
        self.path: Path | None = None
        if self._spills(rows):
            self._open()
        else:
            self.array = np.zeros((max(rows, 0),) + self.row_shape, dtype=self.dtype)

    def _spills(self, rows: int) -> bool:
        return self.folder is not None and rows * self.dtype.itemsize * int(np.prod(self.row_shape)) >= SPILL_BYTES

    def _open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"{self.name}.npy"
        self.handle = open(self.path, "wb")
        self.handle.write(npy_header((0,) + self.row_shape, self.dtype))  # its length stays: rewritten at the end
        self.buffer = np.zeros((self.buffer_rows,) + self.row_shape, dtype=self.dtype)

    def put(self, frames: int | np.ndarray, values: np.ndarray | float) -> None:
        """Set the rows of `frames` (one frame, or increasing frames) to `values` (one row for all, or one
        each), cast to the dtype as an array assignment casts."""
        if isinstance(frames, (int, np.integer)) and frames >= self.next:  # one frame: no index arrays
            if self.array is not None and frames < len(self.array):
                self.array[frames] = values
                self.next = int(frames) + 1
                return
            if self.array is None and frames < self.written + self.buffer_rows:
                self.buffer[frames - self.written] = values
                self.next = int(frames) + 1
                return
        frames = np.atleast_1d(np.asarray(frames, dtype=np.int64))
        if not len(frames):
            return
        if frames[0] < self.next or (np.diff(frames) <= 0).any():
            raise ValueError(f"FrameRows '{self.name}': frames must increase (frame {frames[0]} given after frame "
                             f"{self.next - 1})")
        self.next = int(frames[-1]) + 1
        values = np.asarray(values)
        if values.ndim <= len(self.row_shape):  # one row (or value) for them all
            values = np.broadcast_to(values, (len(frames),) + self.row_shape)
        if self.array is not None:
            fits = int(np.searchsorted(frames, len(self.array)))
            self.array[frames[:fits]] = values[:fits]
            if fits == len(frames):
                return
            frames, values = frames[fits:], values[fits:]
            self._grow(int(frames[-1]))
            if self.array is not None:
                self.array[frames] = values
                return
        self._put_on_disk(frames, values)

    def _grow(self, last: int) -> None:
        """Room for row `last`: twice the rows in memory, or, at SPILL_BYTES, the rows so far written to disk."""
        rows = max(2 * len(self.array), last + 1, GROWTH_ROWS)
        if not self._spills(rows):
            grown = np.zeros((rows,) + self.row_shape, dtype=self.dtype)
            grown[:len(self.array)] = self.array
            self.array = grown
            return
        held, self.array = self.array, None
        self._open()
        self.handle.write(held.data)  # every row of it is final: rows only come in increasing order
        self.written = len(held)

    def _put_on_disk(self, frames: np.ndarray, values: np.ndarray) -> None:
        while len(frames):
            if frames[0] >= self.written + self.buffer_rows:  # the buffer is done: write it, skip zero stretches
                self._write_buffer()
                self._write_zeros((int(frames[0]) - self.written) // self.buffer_rows * self.buffer_rows)
                continue
            inside = int(np.searchsorted(frames, self.written + self.buffer_rows))
            self.buffer[frames[:inside] - self.written] = values[:inside]
            frames, values = frames[inside:], values[inside:]

    def _write_buffer(self, rows: int | None = None) -> None:
        rows = self.buffer_rows if rows is None else rows
        self.handle.write(self.buffer[:rows].data)
        self.written += rows
        self.buffer[:rows] = 0

    def _write_zeros(self, rows: int) -> None:
        """`rows` zero rows, written a buffer at a time (the buffer is all zeros when this is called)."""
        for start in range(0, rows, self.buffer_rows):
            self._write_buffer(min(self.buffer_rows, rows - start))

    def finish(self, rows: int) -> np.ndarray | NpyFile:
        """The output with `rows` rows (at least one past the last frame given): an array in memory, else the
        finished file, its header rewritten in place with the final shape."""
        if rows < self.next:
            raise ValueError(f"FrameRows '{self.name}': {rows} rows asked for, frame {self.next - 1} was given")
        if self.array is not None:
            if rows > len(self.array):
                self._grow(rows - 1)
            if self.array is not None:
                return self.array[:rows]
        left = rows - self.written
        self._write_buffer(min(left, self.buffer_rows))
        self._write_zeros(rows - self.written)
        shape = (rows,) + self.row_shape
        header = npy_header(shape, self.dtype)
        if len(header) != len(npy_header((0,) + self.row_shape, self.dtype)):
            raise ValueError(f"FrameRows '{self.name}': the .npy header for shape {shape} does not fit in place")
        self.handle.seek(0)
        self.handle.write(header)
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        self.buffer = None
        return NpyFile(self.path, shape, self.dtype)

    def discard(self) -> None:
        """Drop what was written (a failed extraction): the file is closed and removed."""
        self.array = self.buffer = None
        if self.handle is not None:
            self.handle.close()
            self.path.unlink(missing_ok=True)
