"""last.ckpt is the latest epoch, also after epochs whose validation loss got worse (resume repeats nothing)."""
from __future__ import annotations

import lightning as L
import torch

from empathic_fusion.pipeline import _instantiate_all
from empathic_fusion.compose import compose_config


class WorseningModule(L.LightningModule):
    """A tiny model whose logged val/loss rises every epoch, so only epoch 0 is ever the best."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", torch.tensor(float(self.current_epoch + 1)))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_last_checkpoint_is_the_latest_epoch_when_validation_worsens(tmp_path):
    cfg = compose_config([], tmp_path)
    callbacks = _instantiate_all(cfg.callbacks)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)
    trainer = L.Trainer(max_epochs=3, callbacks=callbacks, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(WorseningModule(), data, data)
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["epoch"] == 2 and last["global_step"] == 6  # the third epoch, not the best (first) one
    assert trainer.checkpoint_callback.best_model_path.endswith("epoch_000.ckpt")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["epoch_000.ckpt", "last.ckpt"]
