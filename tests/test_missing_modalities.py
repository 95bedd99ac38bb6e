"""Missing modalities: training-time modality dropout drops whole modalities at the set rate (never all,
never in eval or at p=0), the report's conditions remove what they say, and a fusion run's report
writes the missing-modality table, plot and summary."""
from __future__ import annotations

import functools
import json
import math

import lightning as L
import pandas as pd
import pytest
import torch

from empathic_fusion.config import validate
from empathic_fusion.config.checks import ConfigError
from empathic_fusion.config.evaluation import MISSING_RATES, EvaluationConfig
from empathic_fusion.datamodules.missing import (
    block_length, drop_frames_block, drop_frames_random, modality_dropout, remove_modalities)
from empathic_fusion.evaluation.missing_modalities import (
    conditions, evaluate_conditions, relative_robustness, summarize)
from empathic_fusion.models.base import build_module
from empathic_fusion.pipeline import run_config, train
from empathic_fusion.compose import compose_config

ALL = ("video", "audio", "text")
DIMS = {"video": 6, "audio": 3, "text": 4, "story": 4, "traits": 6}


def _batch(n: int = 8, frames: int = 10, seed: int = 0, modalities=ALL) -> dict:
    """Every frame valid and no feature zero, so anything masked or zeroed was dropped."""
    g = torch.Generator().manual_seed(seed)
    batch = {m: {"x": torch.rand(n, frames, DIMS[m], generator=g) + 0.5, "mask": torch.ones(n, frames, dtype=torch.bool),
                 "lengths": torch.full((n,), frames)} for m in modalities}
    batch.update(story=torch.randn(n, DIMS["story"], generator=g), traits=torch.randn(n, 6, generator=g),
                 traits_mask=torch.ones(n, 6, dtype=torch.bool), target=torch.rand(n, generator=g) * 2 - 1,
                 rating_index=torch.arange(n) // 2)
    return batch


def _dropped(part: dict) -> torch.Tensor:
    """(windows, frames): frames masked and zeroed."""
    return ~part["mask"] & (part["x"] == 0).all(dim=-1)


@pytest.mark.parametrize("p", [0.3, 0.7])
@pytest.mark.parametrize("modalities", [ALL, ("video", "text")], ids=["vat", "vt"])
def test_modality_dropout_masks_whole_modalities_at_the_set_rate_never_all(p, modalities):
    batch = _batch(n=20_000, frames=3, modalities=modalities)
    original = {m: batch[m]["x"].clone() for m in modalities}
    out = modality_dropout(batch, modalities, p, torch.Generator().manual_seed(1))
    dropped = torch.stack([_dropped(out[m]).all(dim=1) for m in modalities], dim=1)
    for j, m in enumerate(modalities):  # whole modalities: every frame dropped, or none
        assert (_dropped(out[m]).any(dim=1) == dropped[:, j]).all()
        assert torch.equal(out[m]["x"][~dropped[:, j]], original[m][~dropped[:, j]])
        assert torch.equal(batch[m]["x"], original[m]) and batch[m]["mask"].all()  # the input is not changed
    assert not dropped.all(dim=1).any()
    expected = p - p ** len(modalities) / len(modalities)
    assert dropped.float().mean(dim=0).sub(expected).abs().max() < 0.015
    assert out["story"] is batch["story"] and out["traits"] is batch["traits"]
    again = modality_dropout(batch, modalities, p, torch.Generator().manual_seed(1))
    assert all(torch.equal(again[m]["mask"], out[m]["mask"]) for m in modalities)  # the generator decides


@functools.lru_cache
def _run_config() -> dict:
    return run_config(compose_config(["model=lf_lstm"], "unused"))


def _module(p: float, modalities=ALL):
    config = _run_config()
    torch.manual_seed(0)
    net = {**config["model"]["net"], "hidden_sizes": {"video": 4, "audio": 4, "text": 4}, "representation_dim": 8,
           "post_fusion_hidden": 8, "dropout": 0.0}
    return build_module({**config["model"], "net": net, "modality_dropout": p},
                        {"modalities": list(modalities), "input_dims": DIMS}, config)


def _seen_by_step(model, batch: dict) -> dict:
    """The batch the module's forward gets in a training step."""
    seen = {}
    forward = model.forward
    model.forward = lambda b: seen.update(b) or forward(b)
    model.log = lambda *args, **kwargs: None
    model.training_step(batch, 0)
    return seen


def test_the_module_drops_in_training_steps_only_and_not_at_p_zero():
    batch = _batch(n=64)
    seen = _seen_by_step(_module(0.5), batch)
    assert any(_dropped(seen[m]).all(dim=1).any() for m in ALL)
    assert _module(0.5).hparams.modality_dropout == 0.5
    model = _module(0.0)
    seen = _seen_by_step(model, batch)
    assert all(seen[m] is batch[m] for m in ALL) and model.dropout_generator is None
    model = _module(0.5)  # validation and test steps see the data as it is
    model.eval()
    seen = {}
    forward = model.forward
    model.forward = lambda b: seen.update(b) or forward(b)
    model.log = lambda *args, **kwargs: None
    model.validation_step(batch, 0)
    assert all(seen[m] is batch[m] for m in ALL)


def test_dropout_draws_repeat_under_seed_everything_and_leave_the_global_stream_alone():
    def masks(seed: int) -> list[torch.Tensor]:
        model = _module(0.5)
        L.seed_everything(seed)
        seen = _seen_by_step(model, _batch(n=32))
        after = torch.rand(1)  # the global stream draws as if no dropout had been drawn
        L.seed_everything(seed)
        return [seen[m]["mask"] for m in ALL] + [after == torch.rand(1)]

    first, again, other = masks(3), masks(3), masks(4)
    assert all(torch.equal(a, b) for a, b in zip(first, again)) and first[-1].all()
    assert not all(torch.equal(a, b) for a, b in zip(first[:-1], other[:-1]))


def test_dropout_with_one_modality_warns_and_does_nothing():
    with pytest.warns(UserWarning, match="nothing can be dropped"):
        model = _module(0.5, ("text",))
    batch = _batch(modalities=("text",))
    assert _seen_by_step(model, batch)["text"] is batch["text"]


def test_the_schemas_check_the_new_keys():
    assert EvaluationConfig().missing_rates == MISSING_RATES == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    for rates in ([0.1, 0.5], [0.0, 0.5, 0.3], [0.0, 1.0], []):
        with pytest.raises(ConfigError, match="missing_rates"):
            EvaluationConfig(missing_rates=rates)
    for p in (-0.1, 1.0):
        with pytest.raises(ConfigError, match=f"model.modality_dropout={p}: must be a probability in"):
            validate(compose_config([f"model.modality_dropout={p}"], "unused"))
    for name in ("lf_lstm", "ef_lstm", "tfn", "amer"):
        assert compose_config([f"model={name}"], "unused").model.modality_dropout == 0.0


def test_removed_modalities_are_masked_and_zero_as_a_whole():
    batch = _batch()
    out = remove_modalities(batch, ["audio", "text"])
    assert _dropped(out["audio"]).all() and _dropped(out["text"]).all()
    assert out["video"] is batch["video"] and batch["audio"]["mask"].all()
    assert torch.equal(out["audio"]["lengths"], batch["audio"]["lengths"])


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_random_drop_takes_the_rate_of_frames_independently(rate):
    out = drop_frames_random(_batch(n=400, frames=50), ALL, rate, torch.Generator().manual_seed(0))
    for m in ALL:
        dropped = _dropped(out[m])
        assert abs(dropped.float().mean().item() - rate) < 0.01
        assert (out[m]["x"][~dropped] != 0).all()  # dropped frames exactly: masked where zeroed
    assert not torch.equal(_dropped(out["video"]), _dropped(out["audio"]))  # per modality


@pytest.mark.parametrize("rate", [0.0, 0.24, 0.5, 0.9])
def test_block_drop_is_one_contiguous_block_of_rounded_length_per_window_and_modality(rate):
    frames = 10
    out = drop_frames_block(_batch(n=200, frames=frames), ALL, rate, torch.Generator().manual_seed(0))
    length = block_length(rate, frames)
    assert length == round(rate * frames)
    for m in ALL:
        dropped = _dropped(out[m])
        assert (dropped.sum(dim=1) == length).all()
        if length:
            first = dropped.float().argmax(dim=1)
            for i in range(len(dropped)):
                assert dropped[i, first[i]:first[i] + length].all()
            assert len(set(first.tolist())) > 1  # random starts
        assert (dropped == ~out[m]["mask"]).all()


def test_conditions_remove_each_modality_and_each_pair_never_all():
    names = [c.name for c in conditions(ALL, [0.0, 0.5])]
    assert names == ["none", "random 0.5", "block 0.5", "without video", "without audio", "without text",
                     "without video+audio", "without video+text", "without audio+text"]
    assert [c.name for c in conditions(["video", "text"], [0.0])] == ["none", "without video", "without text"]
    assert [c.name for c in conditions(["text"], [0.0, 0.3])] == ["none", "random 0.3", "block 0.3"]


def test_relative_robustness_is_the_normalised_area_under_r():
    rates = torch.tensor([0.0, 0.5, 1.0]).numpy()
    assert relative_robustness(rates, torch.tensor([0.5, 0.5, 0.5]).numpy()) == pytest.approx(1.0)
    assert relative_robustness(rates, torch.tensor([0.4, 0.2, 0.0]).numpy()) == pytest.approx(0.5)
    assert math.isnan(relative_robustness(rates, torch.tensor([0.0, 0.2, 0.0]).numpy()))


def test_conditions_are_scored_reproducibly_and_removing_data_changes_predictions():
    model = _module(0.0)
    model.eval()
    loader = [_batch(n=16, seed=s) for s in range(3)]
    with torch.no_grad():
        for batch in loader:  # targets the model predicts exactly: r 1 with nothing missing
            batch["target"] = model(batch)
    table = evaluate_conditions(model, loader, ALL, [0.0, 0.5], seed=0)
    assert list(table["condition"])[:3] == ["none", "random 0.5", "block 0.5"]
    assert table.loc[0, "window_pearson"] == pytest.approx(1.0) and table.loc[0, "window_mse"] == pytest.approx(0.0)
    assert (table["window_relative_r"] == table["window_pearson"]).all()
    assert table.equals(evaluate_conditions(model, loader, ALL, [0.0, 0.5], seed=0))
    assert table["window_mse"].nunique() == len(table)  # each condition changes what the model sees
    summary = summarize(table, ALL, [0.0, 0.5], 0)
    assert set(summary["removed"]) == {"video", "audio", "text", "video+audio", "video+text", "audio+text"}
    assert summary["random"]["0.5"]["rating"]["pearson"] == table.loc[1, "rating_pearson"]
    assert set(summary["robustness"]) == {"random", "block"}


def _data(tiny_dataset, tiny_store) -> list[str]:
    return [f"data.dataset_dir={tiny_dataset}", f"data.store_dir={tiny_store}", "data.demo=null",
            "data.extract_workers=1", "trainer.max_epochs=1", "trainer.accelerator=cpu", "logger=none",
            "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "seed=1"]


def test_a_fusion_run_with_modality_dropout_reports_missing_modalities(tiny_dataset, tiny_store, tmp_path):
    out = tmp_path / "run"
    cfg = compose_config(_data(tiny_dataset, tiny_store) + [
        "model=lf_lstm", "modality=v+a+t", "model.modality_dropout=0.3", "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1", "evaluation.bootstrap=0", "evaluation.missing_rates=[0,0.5]"], out)
    train(cfg)
    table = pd.read_csv(out / "test_missing_modalities.csv")
    assert list(table["condition"]) == ["none", "random 0.5", "block 0.5", "without video", "without audio",
                                        "without text", "without video+audio", "without video+text",
                                        "without audio+text"]
    written = json.loads((out / "test_metrics.json").read_text())
    summary = written["missing_modalities"]
    for level in ("window", "rating"):  # nothing missing is the main report's model
        assert summary["none"][level]["pearson"] == pytest.approx(written["model"][level]["pearson"], abs=1e-5)
        assert summary["none"][level]["mse"] == pytest.approx(written["model"][level]["mse"], abs=1e-5)
    assert summary["rates"] == [0.0, 0.5] and set(summary["robustness"]["block"]) == {"window", "rating"}
    assert "without audio+text" in (out / "test_metrics.md").read_text()
    assert (out / "test_missing_modalities.png").stat().st_size > 10_000
