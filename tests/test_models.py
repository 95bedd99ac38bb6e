"""LF-LSTM and the heads on every modality subset: shapes, gradients, masks, learning."""
from __future__ import annotations

import functools
import itertools

import pytest
import torch
from hydra.errors import InstantiationException

from empathic_fusion.models.base import build_module
from empathic_fusion.pipeline import run_config
from empathic_fusion.compose import compose_config

DIMS = {"video": 12, "audio": 5, "text": 8, "story": 8, "traits": 6}
NET = {"_target_": "empathic_fusion.models.lf_lstm.LFLSTM", "hidden_sizes": {"video": 8, "audio": 4, "text": 8},
       "representation_dim": 16, "post_fusion_hidden": 16, "dropout": 0.0}
SUBSETS = [list(c) for r in (1, 2, 3) for c in itertools.combinations(("video", "audio", "text"), r)]


def _batch(modalities, n=6, length=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = {m: {"x": torch.randn(n, length, DIMS[m], generator=g), "mask": torch.rand(n, length, generator=g) > 0.3,
                 "lengths": torch.full((n,), length)} for m in modalities}
    batch.update(story=torch.randn(n, DIMS["story"], generator=g), traits=torch.randn(n, 6, generator=g),
                 traits_mask=torch.ones(n, 6, dtype=torch.bool), target=torch.rand(n, generator=g) * 2 - 1,
                 rating_index=torch.arange(n))
    return batch


@functools.lru_cache
def _run_config() -> dict:
    return run_config(compose_config(["model=lf_lstm", "model.optimizer.lr=0.01"], "unused"))


def _model(modalities, head):
    config = _run_config()
    torch.manual_seed(0)
    return build_module({**config["model"], "net": NET, "head": head}, {"modalities": modalities, "input_dims": DIMS},
                        config)


@pytest.mark.parametrize("head", ["similarity", "regression"])
@pytest.mark.parametrize("modalities", SUBSETS, ids=lambda m: "+".join(x[0] for x in m))
def test_shapes_gradients_and_masks(modalities, head):
    model = _model(modalities, head)
    batch = _batch(modalities)
    pred = model(batch)
    assert pred.shape == (6,) and torch.isfinite(pred).all()
    if head == "similarity":
        assert pred.abs().max() <= 1.0
    torch.nn.functional.mse_loss(pred, batch["target"]).backward()
    assert set(model.net.encoders) == set(modalities)
    for m in modalities:
        grads = [p.grad for p in model.net.encoders[m].parameters()]
        assert all(g is not None and g.abs().sum() > 0 for g in grads), m
    # features under a zero mask do not change the output
    model.eval()
    changed = _batch(modalities)
    for m in modalities:
        noise = torch.randn_like(changed[m]["x"]) * 100
        changed[m]["x"] = torch.where(changed[m]["mask"].unsqueeze(-1), changed[m]["x"], noise)
    with torch.no_grad():
        assert torch.allclose(model(_batch(modalities)), model(changed), atol=1e-6)


@pytest.mark.parametrize("head", ["similarity", "regression"])
def test_overfits_one_small_batch(head):
    model = _model(["video", "audio", "text"], head)
    batch = _batch(["video", "audio", "text"], n=8)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(150):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(batch), batch["target"])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]


def test_checkpoint_hyperparameters_describe_the_inputs():
    model = _model(["video", "text"], "similarity")
    assert model.hparams.data_info["input_dims"] == DIMS and model.describe()["modalities"] == ["video", "text"]
    assert model.hparams.optimizer["lr"] == 0.01 and model.configure_optimizers()["optimizer"].defaults["lr"] == 0.01
    with pytest.raises(InstantiationException, match="head"):  # hydra wraps the module's ValueError
        _model(["text"], "ranking")
