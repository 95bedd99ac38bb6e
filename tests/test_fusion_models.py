"""EF-LSTM, TFN, AMER and the two baselines built from their conf/model files: every modality subset
and head trains, gradients reach exactly the selected encoders, masked frames never matter, each
fusion model overfits a batch, and the parameter-free baselines run through the Lightning flow."""
from __future__ import annotations

import functools
import itertools
import logging

import lightning as L
import pytest
import torch
from hydra.errors import InstantiationException
from torch.utils.data import DataLoader, Dataset

from empathic_fusion.models.components.attention import masked_self_attention
from empathic_fusion.models.components.fusion import tensor_fusion, tensor_fusion_size
from empathic_fusion.models.components.norm import MaskedBatchNorm
from empathic_fusion.models.components.pooling import masked_mean
from empathic_fusion.models.base import build_module
from empathic_fusion.pipeline import run_config
from empathic_fusion.compose import compose_config

DIMS = {"video": 12, "audio": 5, "text": 8, "story": 8, "traits": 6}
ALL = ("video", "audio", "text")
SUBSETS = [list(c) for r in (1, 2, 3) for c in itertools.combinations(ALL, r)]
FUSION = ["ef_lstm", "tfn", "amer"]
BUILD_ERROR = (ValueError, InstantiationException)  # hydra wraps the net's own ValueError


def _short(modalities):
    return "+".join(m[0] for m in modalities)


@functools.lru_cache
def _run_config(name: str) -> dict:
    return run_config(compose_config([f"model={name}", "model.optimizer.lr=0.001"], "unused"))


def _model(name, modalities, head=None, **net_overrides):
    config = _run_config(name)
    model_cfg = config["model"]
    torch.manual_seed(0)
    return build_module({**model_cfg, "net": {**model_cfg["net"], **net_overrides}, "head": head or model_cfg["head"]},
                        {"modalities": modalities, "input_dims": DIMS}, config)


def _batch(n=6, length=20, seed=0, empty_first=True):
    """All three modalities, whatever the model selects. Sample 1 ends early (padding is masked);
    with empty_first, sample 0 has no valid frame in any modality (no face, no speech)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((n,), length)
    lengths[1] = length - 8
    inside = torch.arange(length) < lengths[:, None]
    batch = {}
    for m in ALL:
        mask = (torch.rand(n, length, generator=g) > 0.3) & inside
        if empty_first:
            mask[0] = False
        batch[m] = {"x": torch.randn(n, length, DIMS[m], generator=g), "mask": mask, "lengths": lengths.clone()}
    batch.update(story=torch.randn(n, DIMS["story"], generator=g), traits=torch.randn(n, 6, generator=g),
                 traits_mask=torch.rand(n, 6, generator=g) > 0.2, target=torch.rand(n, generator=g) * 2 - 1,
                 rating_index=torch.arange(n))
    return batch


def _perturb_masked(batch, modalities):
    """Huge noise wherever a selected modality is masked, and everywhere in unselected ones."""
    changed = {k: ({**v, "x": v["x"].clone()} if isinstance(v, dict) else v) for k, v in batch.items()}
    g = torch.Generator().manual_seed(99)
    for m in ALL:
        noise = torch.randn(changed[m]["x"].shape, generator=g) * 100
        keep = changed[m]["mask"].unsqueeze(-1) if m in modalities else torch.zeros_like(noise, dtype=torch.bool)
        changed[m]["x"] = torch.where(keep, changed[m]["x"], noise)
    return changed


@pytest.mark.parametrize("head", ["similarity", "regression"])
@pytest.mark.parametrize("modalities", SUBSETS, ids=_short)
@pytest.mark.parametrize("name", FUSION)
def test_trains_with_gradients_only_where_selected_and_ignores_masked_frames(name, modalities, head):
    model = _model(name, modalities, head)
    assert set(model.net.encoders) == set(modalities)
    optimizer = model.configure_optimizers()["optimizer"]
    model.train()
    for step in range(3):
        batch = _batch(seed=step)
        for m in ALL:
            batch[m]["x"].requires_grad_(True)
        optimizer.zero_grad()
        pred = model(batch)
        assert pred.shape == (6,) and torch.isfinite(pred).all()
        if head == "similarity":
            assert pred.abs().max() <= 1.0
        torch.nn.functional.mse_loss(pred, batch["target"]).backward()
        for m in ALL:
            grad = batch[m]["x"].grad
            if m not in modalities:
                assert grad is None, f"gradient reached unselected {m}"
                continue
            valid = batch[m]["mask"]
            assert grad[valid].abs().sum() > 0, f"no gradient reached the valid {m} frames"
            assert (grad[~valid] == 0).all(), f"masked {m} frames received a gradient"
            params = list(model.net.encoders[m].parameters())
            assert all(p.grad is not None for p in params) and sum(p.grad.abs().sum() for p in params) > 0, m
        optimizer.step()
    model.eval()
    batch = _batch(seed=5)
    with torch.no_grad():
        out = model(batch)
        assert torch.isfinite(out).all()
        assert torch.allclose(out, model(_perturb_masked(batch, modalities)), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("head", ["similarity", "regression"])
@pytest.mark.parametrize("name", FUSION)
def test_overfits_one_small_batch(name, head):
    dropout = {"ef_lstm": {"dropout": 0.0}, "tfn": {"dropouts": {m: 0.0 for m in [*ALL, "post_fusion"]}},
               "amer": {}}[name]  # dropout off: this checks that the model can fit, not how it regularises
    model = _model(name, list(ALL), head, **dropout)
    batch = _batch(n=8, empty_first=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(200):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(batch), batch["target"])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], (losses[0], losses[-1])


def test_tfn_logs_its_fused_size_and_bounds_it(caplog):
    with caplog.at_level(logging.INFO, logger="empathic_fusion.models.tfn"):
        model = _model("tfn", list(ALL))
    assert model.net.fused_size == tensor_fusion_size([4, 16, 64]) == 5 * 17 * 65
    assert "5525" in caplog.text and "parameters" in caplog.text
    with pytest.raises(BUILD_ERROR, match="max_fused_size"):
        _model("tfn", list(ALL), hidden_sizes={"audio": 64, "video": 64, "text": 64})


def test_tensor_fusion_keeps_each_embedding_inside_the_product():
    g = torch.Generator().manual_seed(0)
    a, v, t = torch.randn(3, 2, generator=g), torch.randn(3, 4, generator=g), torch.randn(3, 5, generator=g)
    assert torch.allclose(tensor_fusion([a]), torch.cat([torch.ones(3, 1), a], 1))
    cube = tensor_fusion([a, v, t]).view(3, 3, 5, 6)
    assert torch.allclose(cube[:, 1:, 0, 0], a) and torch.allclose(cube[:, 0, 1:, 0], v)
    assert torch.allclose(cube[:, 0, 0, 1:], t) and torch.allclose(cube[:, 1, 2, 3], a[:, 0] * v[:, 1] * t[:, 2])


def test_masked_batchnorm_normalises_features_over_valid_frames_only():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 10, 3, generator=g) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([2.0, -3.0, 7.0])
    mask = torch.rand(4, 10, generator=g) > 0.4
    norm = MaskedBatchNorm(3)
    out = norm(torch.where(mask.unsqueeze(-1), x, torch.full_like(x, 1e4)), mask)
    reference = torch.nn.BatchNorm1d(3)(x[mask])  # per feature, over the valid frames
    assert torch.allclose(out[mask], reference, atol=1e-4) and (out[~mask] == 0).all()


def test_masked_attention_attends_over_valid_frames_and_survives_an_empty_window():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 4, generator=g)
    mask = torch.tensor([[True, False, True, True, False, True], [False] * 6])
    out = masked_self_attention(x, mask, temperature=2.0)
    valid = x[0, mask[0]]
    expected = torch.softmax(x[0] @ valid.T / 2.0, dim=-1) @ valid
    assert torch.allclose(out[0], expected, atol=1e-6) and torch.isfinite(out[1]).all()
    assert (masked_mean(out, mask)[1] == 0).all()  # the empty window is left out when pooled, as AMER pools


# ---- baselines -----------------------------------------------------------------------------------

@pytest.mark.parametrize("modalities", SUBSETS, ids=_short)
def test_mean_baseline_predicts_the_fitted_constant_on_any_subset(modalities):
    model = _model("mean", modalities)
    assert not any(p.requires_grad for p in model.parameters())
    model.head.fit(0.25)
    batch = _batch()
    assert torch.equal(model(batch), torch.full((6,), 0.25))
    assert torch.equal(model(_perturb_masked(batch, modalities)), torch.full((6,), 0.25))
    with pytest.raises(BUILD_ERROR, match="head=constant"):
        _model("mean", modalities, head="similarity")


@pytest.mark.parametrize("modalities", SUBSETS, ids=_short)
def test_story_similarity_is_the_cosine_of_the_participants_text_and_the_story(modalities):
    if "text" not in modalities:
        with pytest.raises(BUILD_ERROR, match=r"StorySimilarity needs modalities \['text'\].*modality=t"):
            _model("story_similarity", modalities)
        return
    model = _model("story_similarity", modalities)
    assert not list(model.parameters())
    batch = _batch()
    text, mask = batch["text"]["x"], batch["text"]["mask"]
    mean_text = (text * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
    expected = torch.nn.functional.cosine_similarity(mean_text, batch["story"], dim=-1, eps=1e-6)
    assert torch.allclose(model(batch), expected, atol=1e-6) and model(batch)[0] == 0  # no speech: neutral
    assert torch.allclose(model(batch), model(_perturb_masked(batch, modalities)), atol=1e-6)
    with pytest.raises(BUILD_ERROR, match="head=cosine"):
        _model("story_similarity", modalities, head="regression")


class _Items(Dataset):
    def __init__(self, batch):
        self.batch, self.n = batch, len(batch["target"])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {k: ({kk: vv[i] for kk, vv in v.items()} if isinstance(v, dict) else v[i]) for k, v in self.batch.items()}


class _TinyData(L.LightningDataModule):
    def __init__(self):
        super().__init__()
        self.items = _Items(_batch(n=8))
        self.train_target_mean = float(self.items.batch["target"].mean())

    def train_dataloader(self):
        return DataLoader(self.items, batch_size=4)

    def val_dataloader(self):
        return DataLoader(self.items, batch_size=4)

    def test_dataloader(self):
        return DataLoader(self.items, batch_size=4)


@pytest.mark.parametrize("name", ["mean", "story_similarity", "tfn"])
def test_lightning_fit_and_test_run_with_or_without_trainable_parameters(name):
    model, data = _model(name, list(ALL)), _TinyData()
    trainer = L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu")
    trainer.fit(model, datamodule=data)
    trainer.test(model, datamodule=data, verbose=False)
    pred = model.test_predictions["window_pred"]
    assert pred.shape == (8,) and torch.isfinite(pred).all()
    if name == "mean":
        assert torch.allclose(pred, torch.full((8,), data.train_target_mean))
    assert model.header()["data"] == {"datamodule": f"{__name__}._TinyData"}  # no describe(): named only
