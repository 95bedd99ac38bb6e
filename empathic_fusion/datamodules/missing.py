"""Missing modalities on a batch of windows: whole modalities removed, frames dropped at random or in a
block, and modality dropout for training. Each returns a new batch (the loader's tensors, which a frame
cache may share, are never changed in place) with the batch contract of window_dataset.py: a dropped
frame has mask False and zero features, as frames without a face or speech already do, so every
model reads it as missing data. `lengths` (the window's length in the session) is left as it is.

Random draws come from the `torch.Generator` a caller passes (CPU), so a caller decides the stream:
the training module keeps its own (modality dropout), the missing-modality report one per condition.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def _masked_part(part: dict[str, torch.Tensor], keep: torch.Tensor) -> dict[str, torch.Tensor]:
    """A modality's {"x", "mask", "lengths"} with the frames where `keep` (B, k) is False masked and zeroed."""
    keep = keep.to(part["mask"].device)
    return {**part, "mask": part["mask"] & keep, "x": part["x"] * keep.unsqueeze(-1).to(part["x"].dtype)}


def remove_modalities(batch: dict, removed: Sequence[str]) -> dict:
    """The batch with each modality in `removed` missing as a whole (every frame masked and zeroed)."""
    out = dict(batch)
    for m in removed:
        out[m] = _masked_part(batch[m], torch.zeros_like(batch[m]["mask"], dtype=torch.bool))
    return out


def drop_frames_random(batch: dict, modalities: Sequence[str], rate: float, generator: torch.Generator) -> dict:
    """Each frame of each modality dropped independently with probability `rate`."""
    out = dict(batch)
    for m in modalities:
        keep = torch.rand(batch[m]["mask"].shape, generator=generator) >= rate
        out[m] = _masked_part(batch[m], keep)
    return out


def block_length(rate: float, frames: int) -> int:
    """Frames one block drops from a window of `frames` frames: round(rate * frames)."""
    return min(frames, int(round(rate * frames)))


def drop_frames_block(batch: dict, modalities: Sequence[str], rate: float, generator: torch.Generator) -> dict:
    """One contiguous block of round(rate * window length) frames dropped per window and modality, at a
    start drawn uniformly among the positions where the block fits in the window."""
    out = dict(batch)
    for m in modalities:
        windows, frames = batch[m]["mask"].shape
        length = block_length(rate, frames)
        start = torch.randint(0, frames - length + 1, (windows, 1), generator=generator)
        position = torch.arange(frames).unsqueeze(0)
        out[m] = _masked_part(batch[m], (position < start) | (position >= start + length))
    return out


def modality_dropout_draw(windows: int, modalities: int, p: float, generator: torch.Generator | None,
                          device: torch.device | str | None = None) -> torch.Tensor:
    """(windows, modalities) bool, True where a modality is dropped: each with probability `p`, except
    that a window whose every modality was drawn keeps one of them, chosen at random. A modality is thus
    dropped with probability p - p**M / M for M modalities. Drawn on the generator's device (None: from
    `device`'s default generator), with no value read on the host (a captured step draws it on the GPU)."""
    device = generator.device if generator is not None else device
    drop = torch.rand((windows, modalities), generator=generator, device=device) < p
    kept = torch.randint(0, modalities, (windows,), generator=generator, device=device)  # one stream per batch size
    return drop & ~(drop.all(dim=1, keepdim=True) & torch.nn.functional.one_hot(kept, modalities).bool())


def modality_dropout(batch: dict, modalities: Sequence[str], p: float, generator: torch.Generator | None,
                     device: torch.device | str | None = None) -> dict:
    """The batch with whole modalities dropped per window (`modality_dropout_draw`); story, traits and
    targets untouched. Needs two or more modalities: with one, dropping it would leave nothing."""
    if len(modalities) < 2:
        raise ValueError(f"modality dropout needs two or more modalities, got {list(modalities)}")
    drop = modality_dropout_draw(len(batch["target"]), len(modalities), p, generator, device)
    out = dict(batch)
    for j, m in enumerate(modalities):
        out[m] = _masked_part(batch[m], ~drop[:, j:j + 1].expand(batch[m]["mask"].shape))
    return out
