"""What every datamodule offers the pipeline, the LightningModules and the scorers.

`FusionDataModule` (sessions in the dataset contract, datamodules/fusion_datamodule.py) and
`TextDataModule` (a table of texts, datamodules/text_datamodule.py) both implement it; `build_datamodule`
(datamodules/build.py) returns one, and nothing downstream asks which of the two it has. `FusionData` adds what
a fusion model reads of its datamodule once it is set up (the fusion module checks for it instead of probing
attributes one by one).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import pandas as pd
import torch

from torch.utils.data import DataLoader


@runtime_checkable
class EmpathyData(Protocol):
    """A Lightning datamodule of empathy ratings (windows of sessions, or rows of a text table)."""

    name: str              # the data set's name, as reports and model cards show it
    modalities: list[str]  # the modalities its batches carry ("video", "audio", "text")

    def prepare_data(self) -> None:
        """Validate the data and extract (or reuse) what it needs, once per machine."""

    def setup(self, stage: str | None = None) -> None:
        """Build the splits a stage ("fit", "validate", "test", "predict") reads."""

    def describe(self) -> dict[str, Any]:
        """What a checkpoint records about the data (shown on the model card)."""

    def fitted_state(self) -> dict[str, Any]:
        """What a model is built from and keeps in its checkpoint (dims, fields, fitted statistics)."""

    def train_dataloader(self) -> DataLoader: ...

    def val_dataloader(self) -> DataLoader: ...

    def test_dataloader(self) -> DataLoader: ...

    def predict_dataloader(self) -> DataLoader: ...


@runtime_checkable
class FusionData(EmpathyData, Protocol):
    """A set-up datamodule of windows of sessions, as the fusion module reads it."""

    input_dims: dict[str, int]  # per-frame width of each modality, and of "story" and "traits"
    stats: dict[str, tuple[torch.Tensor, torch.Tensor]]  # training-split mean and std per normalised modality
    train_target_mean: float  # the training windows' mean target (the constant baseline, the `mean` head)
    ratings: pd.DataFrame  # one row per self-rating: session, participant, story (empty until set up)
    datasets: dict[str, Any]  # the set-up splits' window datasets by split; "test" is "val" under split=val


@runtime_checkable
class GathersInStep(Protocol):
    """A datamodule whose training batches can be gathered inside the training step (a captured step then holds
    the gather too: models/step_graph.py)."""

    def gather_training_batches_in_step(self) -> Any:
        """From now on the train loader yields {"window": the batch's window positions, on the frames' device}
        and the returned function (positions -> batch) gathers their batch; None, and nothing changes, where
        batches are not gathered from frame arrays in memory."""
