"""One model family, one pipeline: a fusion model and a text model are built from their model configs'
`_target_`, trained, tested and reported by the same `pipeline.train`, and their checkpoints are
rebuilt by `pipeline.evaluate` from the registered name their header records."""
from __future__ import annotations

import json

import pytest
import torch

from empathic_fusion.models.base import HEADER_KEY, EmpathyLightningModule
from empathic_fusion.models.checkpoints import load_module, read_header
from empathic_fusion.models.fusion_module import FusionModule
from empathic_fusion.pipeline import evaluate, train
from empathic_fusion.models.text_module import TextEmpathyModule
from empathic_fusion.demo.generated_table import make_text_table
from empathic_fusion.compose import compose_config

pytestmark = pytest.mark.slow  # trains a fusion and a text model

COMMON = ["trainer.accelerator=cpu", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
          "logger=none", "seed=1", "evaluation=lean"]
HEADER_KEYS = {"module", "model", "format", "created", "commit", "data"}


@pytest.fixture(scope="module")
def runs(tiny_dataset, tiny_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("family")
    fusion = compose_config([f"data.dataset_dir={tiny_dataset}", f"data.store_dir={tiny_store}", "data.demo=null",
                             "data.extract_workers=1", "model=lf_lstm", "modality=t", "trainer.max_epochs=3",
                             "model.optimizer.lr=1e-3", *COMMON], root / "fusion")
    fusion_results = train(fusion)
    make_text_table(30, 3, seed=0).to_csv(root / "table.csv", index=False)
    text = compose_config(["data=text_csv", "model=text_regressor", "modality=t", f"data.path={root / 'table.csv'}",
                           "data.text_columns=[text]", "data.label_columns=[emotional]", "data.group_column=writer",
                           "data.cv_folds=3", "model.net.encoder.cache_dir=null", "model.baselines.embedding_ridge=false",
                           "trainer.max_epochs=3", *COMMON], root / "text")
    text_results = train(text)
    return {"fusion": (fusion_results, root / "fusion"), "text": (text_results, root / "text")}


@pytest.mark.parametrize("kind, cls, model", [("fusion", FusionModule, "lf_lstm"),
                                              ("text", TextEmpathyModule, "text_regressor")])
def test_both_kinds_train_report_and_evaluate_through_one_path(runs, kind, cls, model, tmp_path):
    results, out = runs[kind]
    assert issubclass(cls, EmpathyLightningModule)
    written = json.loads((out / "test_metrics.json").read_text())
    assert written["model"]["rating"]["pearson"] == pytest.approx(results["model"]["rating"]["pearson"])
    assert (out / "test_metrics.md").exists() and (out / "test_metrics.csv").exists() and (out / "test_predictions.csv").exists()
    # evaluation=lean: no bootstrap CIs, no missing-modality report, no plots
    assert not written.get("ci") and "missing_modalities" not in written
    assert not list(out.rglob("*.png")) and not (out / "test_missing_modalities.csv").exists()
    header = read_header(results["best_checkpoint"])
    assert HEADER_KEYS <= set(header) and header["module"] == kind and header["model"] == model
    assert header["format"] == 3 and header["data"]  # the datamodule's describe()
    module = load_module(results["best_checkpoint"])
    assert type(module) is cls and module.kind == kind and module.optimizer_cfg["_target_"] == "torch.optim.AdamW"
    assert type(load_module(out)) is cls  # the run folder: its best checkpoint
    again = evaluate(compose_config([f"ckpt_path={results['best_checkpoint']}", *COMMON[:3], "evaluation=lean"],
                                    tmp_path, "evaluate"))
    for metric, value in results["model"]["rating"].items():
        assert again["model"]["rating"][metric] == pytest.approx(value, abs=1e-5, nan_ok=True), metric


def test_every_module_builds_its_optimizer_and_scheduler_from_the_config(runs):
    fusion = load_module(runs["fusion"][0]["best_checkpoint"])
    config = fusion.configure_optimizers()
    assert config["optimizer"].defaults["lr"] == 1e-3 and config["optimizer"].defaults["weight_decay"] == 0.01
    assert config["lr_scheduler"]["interval"] == "epoch" and config["lr_scheduler"]["scheduler"].step_size == 5
    text = load_module(runs["text"][0]["best_checkpoint"])
    assert isinstance(text.configure_optimizers(), torch.optim.AdamW)  # text_regressor: scheduler null


def test_a_checkpoint_without_the_header_is_refused_with_the_fix(runs, tmp_path):
    checkpoint = torch.load(runs["fusion"][0]["best_checkpoint"], map_location="cpu", weights_only=False)
    del checkpoint[HEADER_KEY]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    with pytest.raises(ValueError, match="no 'empathic_fusion' header.*retrain"):
        load_module(tmp_path / "old.ckpt")





def test_lightnings_note_on_the_modules_batch_transfer_hook_is_not_shown_to_users(tmp_path):
    """The module's transfer_batch_to_device serves every datamodule on purpose; Lightning's UserWarning about
    it (printed on every train.py run before) is not shown once a module is made, other warnings are."""
    import warnings

    from lightning.pytorch.utilities.rank_zero import rank_zero_warn

    from empathic_fusion.models.base import build_module
    from empathic_fusion.pipeline import run_config

    note = ("You have overridden `transfer_batch_to_device` in `LightningModule` but have passed in a "
            "`LightningDataModule`. It will use the implementation from `LightningModule` instance.")
    config = run_config(compose_config(["model=lf_lstm"], tmp_path))
    dims = {"video": 4, "audio": 3, "text": 5, "story": 8, "traits": 6}
    with warnings.catch_warnings(record=True) as caught:  # the filters as they are, then: show everything else
        warnings.filterwarnings("always", append=True)
        build_module(config["model"], {"modalities": ["video", "audio", "text"], "input_dims": dims}, config)
        caught.clear()
        rank_zero_warn(note)
        rank_zero_warn("another note")
    assert [str(w.message) for w in caught] == ["another note"]
