"""Windows gathered a batch at a time from frame arrays: the datamodule's default loader.

`WindowDataset` builds each window in Python (a pandas row, NumPy slices, per-window z-scoring).
Here every store branch of the selected modalities is read once (through `FeatureStore.load`, so its
checks apply) into one float32 frame array per modality, concatenated across sessions on the
session's frame clock (`session_frames` rows each) with one zero row at the end for frames outside a
session. z-scoring with the training statistics and masking depend only on the frame, so they are
done once here (in float32, the reference's arithmetic) instead of once per window: a frame is zero
where its branch has nothing or the modality's mask is 0 (no branch valid; audio: participant
silent). A window is then an offset and a count of in-session frames. Windows overlap about 8-fold,
so the arrays cost about 1/8 of the materialised windows, in float32 twice the store's float16.

Where the frame arrays live (`FrameArrays.in_memory`, `frame_cache.frame_arrays_on_disk`):
- **in memory** (`memory`): one tensor per dense piece on the training device (or the host); a batch
  is one `index_select` per piece. The arrays are filled a chunk of rows at a time, so the host never
  holds more than a chunk on the way to a GPU. In a GPU's memory they are held in half precision
  (`data.device_frames_dtype`, bfloat16 by default: half the memory, float32's range, so the full corpus
  fits an 80 GB GPU) and each batch is widened to float32 as it is gathered.
- **on disk** (`disk`, out of core): the dense pieces are written once to a normalised frame cache
  (`frame_cache.py`, float32 files keyed by the store, the windows' sessions and the statistics) and a
  batch reads each window's rows with one positioned read (`os.preadv`) straight into the batch buffer.
  The reads go through the operating system's page cache, which concurrent runs share, and nothing of
  the cache is mapped into the process, so a run's memory does not grow with the corpus. Only the
  per-frame masks, the indexed branches' per-frame rows (1 + 8 bytes a frame) and their tables stay
  in memory.

Either way the batches are identical to `WindowDataset`'s (tests/test_window_gather.py): same keys,
dtypes, values (with half-precision arrays the values are the float32 ones rounded to that precision). Indexed branches (`<branch>/index` shifted onto the concatenated `<branch>/table`,
pointing at a zero row where masked) are always gathered in memory.

On the host, a batch's large outputs (tens of MB) are written into reused buffers (`HostBuffers`):
a fresh allocation of that size is a new memory mapping whose first touch page-faults every 4 KiB,
which cost about 7 times the gather itself (benchmarks/grid.py). A buffer is reused only when no
tensor outside the pool still shares its storage, so a batch that is kept is never overwritten.
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler, get_worker_info

from empathic_fusion.datamodules.window_dataset import CHUNK_ROWS, FrameSource, window_labels
from empathic_fusion.dataset.scale import RatingScale
from empathic_fusion.core.branches import INDEXED

log = logging.getLogger(__name__)

def fit_rows(array: np.ndarray, n: int, fill) -> np.ndarray:
    """array cut or padded (with `fill`) to n rows."""
    out = np.full((n,) + array.shape[1:], fill, dtype=array.dtype)
    out[: min(n, len(array))] = array[:n]
    return out


@dataclass(frozen=True)
class FrameLayout:
    """Where every frame goes: `offsets[sid]` is a session's first row (it has `session_frames[sid]` rows
    in every modality), `rows` the zero row's position. `pieces[modality]` lists the modality's columns in
    branch order: ("dense", key) for a run of dense branches (one array, `widths[key]` columns),
    ("indexed", branch) for an indexed branch."""

    offsets: dict[str, int]
    rows: int
    pieces: dict[str, list[tuple[str, str]]]
    widths: dict[str, int]

    @classmethod
    def of(cls, source: FrameSource) -> FrameLayout:
        offsets, row = {}, 0
        for sid, n in source.session_frames.items():
            offsets[sid] = row
            row += int(n)
        pieces, widths = {}, {}
        for modality, names in source.branches.items():
            pieces[modality], run = [], []
            for branch in names + [None]:  # consecutive dense branches share one array
                if (branch is None or branch in INDEXED) and run:
                    key = f"{modality}/{'+'.join(run)}"
                    pieces[modality].append(("dense", key))
                    widths[key] = sum(source.branch_dims[b] for b in run)
                    run = []
                if branch in INDEXED:
                    pieces[modality].append(("indexed", branch))
                elif branch is not None:
                    run.append(branch)
        return cls(offsets, row, pieces, widths)

    def dense_keys(self) -> list[str]:
        return [key for pieces in self.pieces.values() for kind, key in pieces if kind == "dense"]

    def dense_nbytes(self, itemsize: int = 4) -> int:
        """Bytes of the dense pieces (the bulk of the arrays), at `itemsize` bytes a value (float32's 4)."""
        return itemsize * (self.rows + 1) * sum(self.widths.values())


class FrameSink(Protocol):
    """Where `fill_frames` puts what it computes (rows are positions in the layout)."""

    def dense(self, key: str, row: int, values: np.ndarray) -> None: ...
    def mask(self, modality: str, row: int, values: np.ndarray) -> None: ...
    def index(self, branch: str, row: int, values: np.ndarray) -> None: ...
    def table(self, branch: str, values: np.ndarray) -> None: ...


def fill_frames(source: FrameSource, layout: FrameLayout, sink: FrameSink, chunk_rows: int = CHUNK_ROWS) -> None:
    """Every session's normalised, masked frames of every modality, a chunk of rows at a time, into
    `sink`. Rows never given (sessions whose modality is masked, the zero row) are zero in the dense
    pieces, False in the masks and -1 (nothing) in the indices. Dense values get the reference's
    float32 arithmetic, per frame: (x - mean) / std, then 0 where the branch or the modality is masked.
    Indices are shifted onto the branch's table as the sink receives them, session after session."""
    table_rows = {b: 0 for names in source.branches.values() for b in names if b in INDEXED}
    store = source.store
    for modality, names in source.branches.items():
        columns, column = {}, 0
        for branch in names:
            columns[branch] = (column, column + source.branch_dims[branch])
            column += source.branch_dims[branch]
        stats = source.stats.get(modality)
        piece_of = {b: key for kind, key in layout.pieces[modality] if kind == "dense"
                    for b in key.split("/", 1)[1].split("+")}
        for sid, n in source.session_frames.items():
            n = int(n)
            if (sid, modality) in source.missing:
                continue
            first = layout.offsets[sid]
            valid, stored = {}, {}  # stored: an indexed branch's (index, table), a dense one's frame count
            for branch in names:
                if (sid, modality, branch) in source.missing:
                    continue
                if branch in INDEXED:
                    table_name, index_name = INDEXED[branch]
                    index = np.asarray(store.load(sid, branch, index_name)).astype(np.int64)
                    table = np.asarray(store.load(sid, branch, table_name))
                    store.check_finite(table, sid, branch, table_name)
                    if index.size and index.max() >= len(table):
                        raise ValueError(f"session '{sid}', branch '{branch}': {index_name} points at row "
                                         f"{int(index.max())} of a {len(table)}-row {table_name} table")
                    index = fit_rows(index, n, -1)
                    valid[branch] = index >= 0
                    stored[branch] = (index, table)
                else:
                    features = store.load(sid, branch, "features")
                    # valid only where the branch has a frame and its mask (cut or padded to it) is set
                    branch_valid = fit_rows(np.asarray(store.load(sid, branch, "mask")) > 0, len(features), False)
                    valid[branch] = fit_rows(branch_valid, n, False)
                    stored[branch] = len(features)
                    del features  # read again a chunk at a time below: the mapping never holds a whole session
            frame_mask = np.logical_or.reduce(list(valid.values())) if valid else np.zeros(n, dtype=bool)
            if modality == "audio":
                frame_mask &= fit_rows(np.asarray(source.speaking[sid], dtype=bool), n, False)
            sink.mask(modality, first, frame_mask)
            for branch in valid:
                if branch in INDEXED:
                    index, table = stored[branch]
                    keep = valid[branch] & frame_mask
                    sink.index(branch, first, np.where(keep, index + table_rows[branch], -1))
                    sink.table(branch, table)
                    table_rows[branch] += len(table)
            dense = [b for b in valid if b not in INDEXED]
            for key in dict.fromkeys(piece_of[b] for b in dense):
                width = layout.widths[key]
                offset = columns[key.split("/", 1)[1].split("+")[0]][0]
                for lo in range(0, n, chunk_rows):
                    hi = min(n, lo + chunk_rows)
                    block = np.zeros((hi - lo, width), dtype=np.float32)
                    for branch in (b for b in dense if piece_of[b] == key):
                        start, stop = columns[branch]
                        x = np.zeros((hi - lo, stop - start), dtype=np.float32)
                        m = max(0, min(hi, stored[branch]) - lo)
                        if m:
                            x[:m] = store.load(sid, branch, "features")[lo: lo + m]
                            store.check_finite(x[:m], sid, branch, "features")
                        if stats is not None:  # the reference's float32 arithmetic, per frame
                            x = (x - stats[0][start:stop]) / stats[1][start:stop]
                        x[~(valid[branch][lo:hi] & frame_mask[lo:hi])] = 0.0
                        block[:, start - offset: stop - offset] = x
                    sink.dense(key, first + lo, block)


def read_into(handle: int, buffer: np.ndarray, offset: int) -> None:
    """Fill a C-contiguous `buffer` with the file's bytes at `offset` (one positioned read where the system
    has one; the file descriptor's position is never used, so processes and threads may share it)."""
    view = memoryview(buffer).cast("B")
    done = 0
    while done < len(view):
        if hasattr(os, "preadv"):
            got = os.preadv(handle, [view[done:]], offset + done)
        else:  # Windows: no positioned read; the descriptor is this process's own (DiskRows reopens per process)
            os.lseek(handle, offset + done, os.SEEK_SET)
            got = os.readv(handle, [view[done:]])
        if got <= 0:
            raise OSError(f"frame cache file ended after {offset + done} bytes (expected {offset + len(view)})")
        done += got


class DiskRows:
    """A (rows, width) float32 array in a .npy file, read a run of rows at a time into a given buffer.

    Opened once per process (a DataLoader worker started by spawn reopens it), never mapped, so its
    pages stay in the shared page cache and are not counted in any process's memory."""

    def __init__(self, path: Path, rows: int, width: int, data_offset: int):
        self.path, self.rows, self.width, self.data_offset = Path(path), int(rows), int(width), int(data_offset)
        self.shape = (self.rows, self.width)
        self._handle: tuple[int, int] | None = None  # (pid, fd)

    def _fd(self) -> int:
        if self._handle is None or self._handle[0] != os.getpid():
            self._handle = (os.getpid(), os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0)))
        return self._handle[1]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_handle": None}

    def __del__(self) -> None:
        if self._handle is not None and self._handle[0] == os.getpid():
            os.close(self._handle[1])

    def read_windows(self, out: np.ndarray, first: np.ndarray, lengths: np.ndarray) -> None:
        """out[i, :lengths[i]] = rows first[i]..first[i] + lengths[i] - 1; out[i, lengths[i]:] = 0.
        One positioned read per window (the loop is kept lean: it runs once per window of every batch)."""
        fd, row_bytes, length = self._fd(), 4 * self.width, out.shape[1]
        window_bytes, base = row_bytes * length, self.data_offset
        view = memoryview(out.reshape(-1)).cast("B")
        preadv = getattr(os, "preadv", None)
        for i, (start, n) in enumerate(zip(first.tolist(), lengths.tolist())):
            if n:
                at, size = i * window_bytes, n * row_bytes
                if preadv is None or preadv(fd, [view[at: at + size]], base + start * row_bytes) != size:
                    read_into(fd, out[i, :n], base + start * row_bytes)  # a short read: finish it, or say why
            if n < length:
                out[i, n:] = 0.0


class FramePartsSink:
    """What every `FrameSink` keeps in memory while `fill_frames` runs: the per-frame modality masks, the
    indexed branches' per-frame rows and their tables (sessions' tables in order). Sinks add `dense`."""

    def __init__(self, layout: FrameLayout, source: FrameSource):
        self.dims = source.branch_dims
        self.masks = {m: np.zeros(layout.rows + 1, dtype=bool) for m in source.branches}
        self.indices = {b: np.full(layout.rows + 1, -1, dtype=np.int64) for names in source.branches.values()
                        for b in names if b in INDEXED}
        self.tables: dict[str, list[np.ndarray]] = {b: [] for b in self.indices}

    def mask(self, modality: str, row: int, values: np.ndarray) -> None:
        self.masks[modality][row: row + len(values)] = values

    def index(self, branch: str, row: int, values: np.ndarray) -> None:
        self.indices[branch][row: row + len(values)] = values

    def table(self, branch: str, values: np.ndarray) -> None:
        self.tables[branch].append(np.asarray(values, dtype=np.float32))

    def table_arrays(self) -> dict[str, np.ndarray]:
        """Each indexed branch's table: its sessions' tables concatenated in the order they came."""
        return {b: np.concatenate(t) if t else np.zeros((0, self.dims[b]), np.float32) for b, t in self.tables.items()}


class MemorySink(FramePartsSink):
    """fill_frames into tensors on `device` in `dtype` (dense chunks copied over one at a time, each cast on the
    host first, so a half-precision array costs half the transfer)."""

    def __init__(self, layout: FrameLayout, source: FrameSource, device: torch.device, dtype: torch.dtype = torch.float32):
        super().__init__(layout, source)
        self.device, self.dtype = device, dtype
        self.tensors = {key: torch.zeros((layout.rows + 1, layout.widths[key]), dtype=dtype, device=device)
                        for key in layout.dense_keys()}

    def dense(self, key: str, row: int, values: np.ndarray) -> None:
        self.tensors[key][row: row + len(values)] = torch.from_numpy(values).to(self.dtype).to(self.device)


def small_tensors(masks: dict[str, np.ndarray], indices: dict[str, np.ndarray], tables: dict[str, np.ndarray],
                  branch_dims: dict[str, int]) -> dict[str, torch.Tensor]:
    """The per-frame masks, and each indexed branch's table with a zero row at its end that the
    per-frame index points at where it has nothing (-1)."""
    tensors = {f"{m}/mask": torch.from_numpy(np.asarray(mask, dtype=bool)) for m, mask in masks.items()}
    for branch, index in indices.items():
        table = np.concatenate([np.asarray(tables[branch], dtype=np.float32).reshape(-1, branch_dims[branch]),
                                np.zeros((1, branch_dims[branch]), np.float32)])
        index = np.array(index, dtype=np.int64)
        index[index < 0] = len(table) - 1  # the zero row
        tensors[f"{branch}/index"] = torch.from_numpy(index)
        tensors[f"{branch}/table"] = torch.from_numpy(table)
    return tensors


class FrameArrays:
    """Per modality: normalised, masked float32 frames of every session, concatenated (+ a zero row), in
    memory (`tensors[key]`, on `device`) or on disk (`disk[key]`, a normalised frame cache) for the dense
    pieces; masks and indexed branches always in `tensors`, on `device`.

    `offsets[sid]` is a session's first row; it has `session_frames[sid]` rows in every modality.
    `pieces[modality]` lists the modality's columns in branch order (see `FrameLayout`).
    """

    def __init__(self, source: FrameSource, layout: FrameLayout, tensors: dict[str, torch.Tensor],
                 disk: dict[str, DiskRows] | None = None, where: str = ""):
        self.branches = {m: list(b) for m, b in source.branches.items()}
        self.layout = layout
        self.tensors = tensors
        self.disk = disk or {}
        self.where = where  # what the log said about the choice

    @classmethod
    def in_memory(cls, source: FrameSource, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> FrameArrays:
        """Every frame in tensors on `device`, filled a chunk of rows at a time; the dense pieces in `dtype`
        (batches are gathered in float32 whatever it is)."""
        device = torch.device(device)
        layout = FrameLayout.of(source)
        sink = MemorySink(layout, source, device, dtype)
        fill_frames(source, layout, sink)
        small = small_tensors(sink.masks, sink.indices, sink.table_arrays(), source.branch_dims)
        return cls(source, layout, {**sink.tensors, **{k: v.to(device) for k, v in small.items()}})

    @property
    def offsets(self) -> dict[str, int]:
        return self.layout.offsets

    @property
    def rows(self) -> int:
        return self.layout.rows

    @property
    def pieces(self) -> dict[str, list[tuple[str, str]]]:
        return self.layout.pieces

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    def nbytes(self) -> int:
        """Bytes held in memory (on `device`)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def disk_nbytes(self) -> int:
        """Bytes of the dense pieces read from disk (0 in memory)."""
        return sum(4 * rows.rows * rows.width for rows in self.disk.values())


class HostBuffers:
    """Output buffers for host-side batches, reused once nothing outside the pool shares their storage.

    At most `per_key` buffers per output; when all are held elsewhere, the oldest is left to its holder.

    Used only in the main process: a DataLoader worker hands its batch over by moving the storage
    itself into shared memory, which the main process keeps reading after the worker's references
    are gone, so workers allocate fresh buffers every time.
    """

    def __init__(self, per_key: int = 4):
        self.per_key = per_key
        self.buffers: dict[str, list[tuple[torch.Tensor, int]]] = {}
        self.enabled = hasattr(torch._C, "_storage_Use_Count")

    @staticmethod
    def _users(tensor: torch.Tensor) -> int:
        return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)

    def take(self, key: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised (shape, dtype) host tensor that no live batch shares."""
        if not self.enabled or get_worker_info() is not None:
            return torch.empty(shape, dtype=dtype)
        kept = self.buffers.setdefault(key, [])
        inference = torch.is_inference_mode_enabled()  # a buffer made under inference mode is read-only outside it
        for tensor, alone in kept:
            if (tensor.shape == shape and tensor.dtype == dtype and self._users(tensor) == alone
                    and (inference or not tensor.is_inference())):
                return tensor
        tensor = torch.empty(shape, dtype=dtype)
        if len(kept) >= self.per_key:  # every kept buffer is busy (batches held for long): let the oldest go
            kept.pop(0)
        kept.append((tensor, self._users(tensor)))  # the count while only the pool holds it
        return tensor


class WindowBatches(Dataset):
    """One split's windows; `data[indices]` is a whole batch in the batch-dict contract, `data[i]` one window.

    Keeps `WindowDataset`'s attributes (`windows`, `ratings`, `targets`, `story_row`, `traits`, `traits_mask`).
    """

    def __init__(self, frames: FrameArrays, windows: pd.DataFrame, ratings: pd.DataFrame, length: int,
                 session_frames: dict[str, int], story_embeddings: np.ndarray, story_rows: dict[str, int],
                 traits: pd.DataFrame, scale: RatingScale):
        self.arrays = frames
        self.windows = windows.reset_index(drop=True)
        self.length = int(length)
        self.modalities = list(frames.branches)
        labels = window_labels(self.windows, ratings, story_rows, traits, scale)
        self.targets, self.ratings, self.story_row, self.traits, self.traits_mask = labels
        sessions = self.windows.session_id.to_numpy()
        starts = self.windows.start.to_numpy(dtype=np.int64)
        if (starts < 0).any():
            raise ValueError(f"window starts must be >= 0, got {int(starts.min())}")
        total = np.array([session_frames[s] for s in sessions], dtype=np.int64)
        first = np.array([frames.offsets[s] for s in sessions], dtype=np.int64) + starts
        self.index = {"lengths": torch.from_numpy(np.clip(total - starts, 0, self.length)),
                      "first": torch.from_numpy(first),
                      "rating_index": torch.tensor(self.windows.rating_index.to_numpy(dtype=np.int64)),
                      "story_row": torch.from_numpy(self.story_row), "traits": torch.from_numpy(self.traits),
                      "traits_mask": torch.from_numpy(self.traits_mask), "target": torch.from_numpy(self.targets)}
        self.story_embeddings = torch.from_numpy(np.asarray(story_embeddings, dtype=np.float32))
        self._device = torch.device("cpu")
        self._buffers = HostBuffers()
        self.to(frames.device)

    def to(self, device: torch.device) -> WindowBatches:
        """Per-window offsets and labels onto the arrays' device."""
        self._device = torch.device(device)
        self.index = {k: v.to(device) for k, v in self.index.items()}
        self.story_embeddings = self.story_embeddings.to(device)
        return self

    def __len__(self) -> int:
        return len(self.windows)

    def batch(self, window: torch.Tensor) -> dict:
        """The batch of windows `window` (a (B,) long tensor of positions in this split)."""
        tensors = self.arrays.tensors
        window = window.to(self._device)
        frame = torch.arange(self.length, device=self._device)
        lengths = self.index["lengths"][window]
        inside = frame[None, :] < lengths[:, None]
        rows = torch.where(inside, self.index["first"][window][:, None] + frame[None, :], self.arrays.rows).reshape(-1)
        shape = inside.shape
        batch: dict = {}
        disk = self.arrays.disk
        if disk:  # out of core: each window's rows read straight into the batch buffer
            first, count = self.index["first"][window].numpy(), lengths.numpy()
        for modality in self.modalities:
            parts = []
            for kind, key in self.arrays.pieces[modality]:
                if kind == "dense" and key in disk:
                    out = self._empty(key, (len(rows), disk[key].width), torch.float32)
                    disk[key].read_windows(out.numpy().reshape(*shape, -1), first, count)
                    parts.append(out)
                elif kind == "dense":
                    parts.append(self._select(tensors[key], rows, key))
                else:
                    parts.append(self._select(tensors[f"{key}/table"], tensors[f"{key}/index"].index_select(0, rows), key))
            if len(parts) > 1:  # the concatenation widens half-precision arrays to float32
                x = self._empty(modality, (len(rows), sum(p.shape[1] for p in parts)), torch.float32)
                x = torch.cat(parts, dim=-1, out=x)
            else:
                x = parts[0].float()
            batch[modality] = {"x": x.view(*shape, -1), "mask": tensors[f"{modality}/mask"].index_select(0, rows).view(shape),
                               "lengths": lengths}
        batch["story"] = self.story_embeddings.index_select(0, self.index["story_row"][window])
        for key in ("traits", "traits_mask", "target", "rating_index"):
            batch[key] = self.index[key][window]
        return batch

    def _empty(self, key: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self._device.type == "cpu" and not torch.compiler.is_compiling():  # a traced gather allocates its own
            return self._buffers.take(key, shape, dtype)
        return torch.empty(shape, dtype=dtype, device=self._device)  # the CUDA caching allocator reuses memory

    def _select(self, source: torch.Tensor, rows: torch.Tensor, key: str) -> torch.Tensor:
        """source[rows] into a (reused, on the host) buffer."""
        out = self._empty(key, (len(rows),) + tuple(source.shape[1:]), source.dtype)
        return torch.index_select(source, 0, rows, out=out)

    def __getitem__(self, i: int | Sequence[int] | torch.Tensor) -> dict:
        if isinstance(i, (int, np.integer)):
            item = self.batch(torch.tensor([int(i)]))
            return {k: ({kk: vv[0] for kk, vv in v.items()} if isinstance(v, dict) else v[0]) for k, v in item.items()}
        return self.batch(torch.as_tensor(i, dtype=torch.long))

    def __getitems__(self, indices: list[int]) -> dict:
        return self.batch(torch.as_tensor(indices, dtype=torch.long))


class WindowPositions(Dataset):
    """A split's batches as their window positions only, `{"window": positions}`, for a training step that gathers
    its batch itself (`WindowBatches.batch`): with the frame arrays in a GPU's memory the gather is then part of
    a captured step."""

    def __init__(self, windows: WindowBatches):
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"window": torch.as_tensor(positions, dtype=torch.long)}


class IndexBatchSampler(DistributedSampler):
    """Batches of window positions from any index sampler (the rating oversampler, or a
    `DistributedSampler` over the split), for a DataLoader with `batch_size=None`.

    A `DistributedSampler` itself so Lightning leaves it in place under DDP (sharding is the inner
    sampler's); `set_epoch` reaches the inner sampler. With a GPU `device` (frame arrays in its memory)
    the epoch's order is copied there once and each batch is a slice of it: a batch's positions copied
    from the host one by one would make the host wait for the device at every step.
    """

    def __init__(self, windows: Sampler[int], batch_size: int, drop_last: bool = False,
                 device: torch.device | str = "cpu"):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.windows = windows
        self.batch_size = int(batch_size)
        self.drop_last = drop_last
        self.device = torch.device(device)
        # DistributedSampler's attributes, as Lightning reads them (e.g. `shuffle`), taken from the inner sampler
        self.dataset = getattr(windows, "dataset", None)
        self.num_replicas = getattr(windows, "num_replicas", 1)
        self.rank = getattr(windows, "rank", 0)
        self.shuffle = getattr(windows, "shuffle", False)
        self.seed = getattr(windows, "seed", 0)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.windows, "set_epoch"):
            self.windows.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int] | torch.Tensor]:
        order = list(self.windows)
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        if self.device.type != "cpu":
            order = torch.tensor(order, dtype=torch.long).to(self.device)
        for begin in range(0, stop, self.batch_size):
            yield order[begin: begin + self.batch_size]

    def __len__(self) -> int:
        n = len(self.windows)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
