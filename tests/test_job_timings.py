"""What a training job writes about its own cost (timings.json, empathic_fusion/utils/job_timings.py), and the
validation predictions a checkpoint keeps so the report makes no second pass over the validation split."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from empathic_fusion.models.checkpoints import load_module
from empathic_fusion.models.predict import predict_split
from empathic_fusion.pipeline import build_run, train
from empathic_fusion.compose import compose_config


def _cfg(store: tuple[Path, Path], out: Path, *extra: str):
    return compose_config(["trainer=cpu", "model=tfn", "modality=v+a+t", "data=empathic_stories",
                           f"data.dataset_dir={store[0]}", f"data.store_dir={store[1]}", "data.batch_size=16",
                           "data.split_fractions=[0.6,0.2,0.2]", "data.extract_workers=1", "logger=none",
                           "evaluation=lean", "trainer.max_epochs=2", "seed=3", *extra], out)


def test_a_job_writes_where_its_time_went(synthetic_store, tmp_path):
    cfg = _cfg(synthetic_store, tmp_path)
    train(cfg)
    timings = json.loads((Path(cfg.paths.output_dir) / "timings.json").read_text())
    seconds, counts = timings["seconds"], timings["counts"]
    for span in ("setup/trainer", "setup/prepare", "setup/data", "setup/frames", "setup/model", "sanity_check",
                 "train_steps", "validation", "checkpoint", "test", "test_steps", "report"):
        assert seconds[span] >= 0, span
    assert counts["epochs"] == 2 and counts["validation"] == 2
    assert counts["checkpoint"] >= 1 and counts["train_steps"] > 0
    # nested spans inside their parents, the top-level ones inside the job
    assert seconds["setup/frames"] <= seconds["setup/data"] and seconds["test_steps"] <= seconds["test"]
    top = [seconds[k] for k in ("setup/trainer", "setup/data", "setup/model", "sanity_check", "train_steps",
                                "validation", "checkpoint", "test", "report")]
    assert sum(top) <= timings["total_s"]


def test_the_checkpoint_keeps_the_validation_predictions_of_its_weights(synthetic_store, tmp_path):
    cfg = _cfg(synthetic_store, tmp_path)
    datamodule, module, trainer = build_run(cfg)
    trainer.fit(module, datamodule=datamodule)
    best = trainer.checkpoint_callback.best_model_path
    trainer.test(module, datamodule=datamodule, ckpt_path=best, weights_only=False)
    kept = module.validation_predictions(datamodule)
    assert kept is not None
    computed = predict_split(module, datamodule.val_dataloader())  # the pass the report no longer makes
    assert set(kept) == set(computed)
    for key in computed:
        assert torch.equal(kept[key], computed[key]), key
    # other data, or predictions made in reduced precision, are not taken for this split's
    other = load_module(best)
    assert other.validation_predictions(datamodule) is not None
    other.saved_val_predictions = {**other.saved_val_predictions, "precision": "bf16-mixed"}
    assert other.validation_predictions(datamodule) is None
    other.saved_val_predictions = {**load_module(best).saved_val_predictions, "data": "another data set"}
    assert other.validation_predictions(datamodule) is None
