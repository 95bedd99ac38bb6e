"""The one predict loop: `predict_batches` is the only place a model is run over a DataLoader for its
predictions. `empathic-predict`, the web app's scorers, the test reports' validation and missing-modality
passes and the text robustness report all call it, so scoring builds and moves its batches exactly as
training did (the module's `transfer_batch_to_device` and `predict_step`).

It has no Trainer of its own: one would move the model back to the CPU at its teardown and take over the
module's `trainer`; it runs on the device the model is on, under `torch.no_grad` rather than
`torch.inference_mode`, so a module trained further after a report holds no inference tensors."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from empathic_fusion.datamodules.text_datamodule import TextDataModule
from empathic_fusion.metrics import split_predictions
from empathic_fusion.models.text_module import OVERALL, TextEmpathyModule, attach_encoder
from empathic_fusion.utils.progress import scoring_bar


def accelerator_device(accelerator: str) -> torch.device:
    """The device `Trainer(accelerator=...)` runs on: cpu, gpu (CUDA, else Apple's MPS) or auto (a GPU
    when there is one, else the CPU)."""
    if accelerator != "cpu":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if torch.backends.mps.is_available():
            return torch.device("mps")
        if accelerator != "auto":
            raise RuntimeError(f"accelerator={accelerator}, but torch sees no GPU (use accelerator=cpu or auto)")
    return torch.device("cpu")


def model_device(model: torch.nn.Module) -> torch.device:
    """Where a model is: a LightningModule's device (kept by `.to()` even without weights), else its first
    parameter's or buffer's, else the CPU."""
    if isinstance(model, L.LightningModule):
        return model.device
    tensor = next(iter([*model.parameters(), *model.buffers()]), None)
    return tensor.device if tensor is not None else torch.device("cpu")


@torch.no_grad()
def predict_batches(model: torch.nn.Module, batches: Iterable[Any], fields: tuple[str, ...] = (),
                    unit: str | None = None) -> dict[str, torch.Tensor]:
    """The model's outputs over `batches` ("pred", float32 on the CPU) and the batches' `fields`, each
    concatenated; the model in eval mode (its mode restored after), on its own device. A LightningModule
    moves each batch with its `transfer_batch_to_device` and scores it with its `predict_step`; `unit`
    shows a bar counting the units scored (a window, a row)."""
    was_training = model.training
    model.eval()
    device = model_device(model)
    lightning = isinstance(model, L.LightningModule)
    bar = scoring_bar(batches, unit) if unit else None
    preds, values = [], {field: [] for field in fields}
    try:
        for index, batch in enumerate(batches):  # kept where they are made (a loader may gather on a GPU)
            if lightning:
                out = model.predict_step(model.transfer_batch_to_device(batch, device, 0), index)
            else:
                out = model(move_data_to_device(batch, device))
            preds.append(out.float())
            for field in fields:
                values[field].append(batch[field])
            if bar is not None:
                bar.update(len(out))
    finally:
        model.train(was_training)
        if bar is not None:
            bar.close()
    return {"pred": torch.cat(preds).cpu(), **{field: torch.cat(parts).cpu() for field, parts in values.items()}}


def predict(module: L.LightningModule, datamodule: L.LightningDataModule, accelerator: str | None = None,
            progress: bool = False, unit: str = "row") -> torch.Tensor:
    """The module's outputs for every row of a set-up datamodule's predict split, as float32 on the CPU;
    `accelerator` (cpu | gpu | auto) moves the module there first (None: it stays where it is), and it
    stays there after. `progress` shows a bar counting the `unit`s scored."""
    if accelerator is not None:
        module.to(accelerator_device(accelerator))
    return predict_batches(module, datamodule.predict_dataloader(), unit=unit if progress else None)["pred"]


def predict_split(model: torch.nn.Module, batches: Iterable[dict]) -> dict[str, torch.Tensor]:
    """A fusion split's window predictions, targets and rating indices, and their means per rating."""
    predicted = predict_batches(model, batches, ("target", "rating_index"))
    return split_predictions(predicted["pred"], predicted["target"].float(), predicted["rating_index"].long())


def text_datamodule(module: TextEmpathyModule, fields: dict[str, list[str]],
                    persona: pd.DataFrame | None = None) -> TextDataModule:
    """Rows of texts as a predict split of a text module's datamodule; `fields` as the model reads them
    (derived ones built), a field left out is empty text, persona left out is 'unknown'. The module's
    encoder is attached as its `setup` attaches it under a Trainer (on the module's device)."""
    n = max(len(v) for v in fields.values())
    rows = pd.DataFrame({f: list(fields.get(f, [""] * n)) for f in module.net.fields})
    for column in module.persona_encoder.columns:
        rows[column] = persona[column].to_numpy() if persona is not None and column in persona else None
    datamodule = TextDataModule.for_checkpoint(module.data_config(), module.hparams.data_info, rows)
    attach_encoder(module, datamodule)
    return datamodule


def predict_texts(module: TextEmpathyModule, fields: dict[str, list[str]], persona: pd.DataFrame | None = None,
                  accelerator: str | None = None, progress: bool = False) -> dict[str, np.ndarray]:
    """A text module's scores for N rows per output (`module.output_names`; raw: not clipped to the label
    scale); `accelerator` as in `predict`."""
    if accelerator is not None:
        module.to(accelerator_device(accelerator))
    pred = predict(module, text_datamodule(module, fields, persona), None, progress).numpy()
    out = {name: pred[:, j] for j, name in enumerate(module.label_names)}
    if len(module.label_names) > 1:
        out[OVERALL] = pred.mean(1)
    return out
