"""One predict loop (empathic_fusion/models/predict.py): every forward pass a test report makes runs inside
`predict_batches`, the loop `empathic-predict` scores with, on the device the model is on, and the report
leaves the model as it found it (weights, device, mode, its own Trainer, no inference tensors)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import lightning as L
import torch

import empathic_fusion
from empathic_fusion.evaluation.report import module_report
from empathic_fusion.models import predict as one_loop
from empathic_fusion.pipeline import build_run
from empathic_fusion.compose import compose_config

LOOP_FILE = Path(one_loop.__file__).resolve()


def _in_the_one_loop() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "predict_batches" and Path(code.co_filename).resolve() == LOOP_FILE:
            return True
        frame = frame.f_back
    return False


class _TestSplit(L.LightningDataModule):
    """A predict split that is another datamodule's test loader (empathic-predict's entry point over it)."""

    def __init__(self, datamodule: L.LightningDataModule):
        super().__init__()
        self.source = datamodule

    def predict_dataloader(self):
        return self.source.test_dataloader()


def test_a_report_predicts_through_the_one_loop_and_leaves_the_model_as_it_was(synthetic_store, tmp_path):
    cfg = compose_config(["trainer=cpu", "model=tfn", "modality=v+a+t", "data=empathic_stories",
                          f"data.dataset_dir={synthetic_store[0]}", f"data.store_dir={synthetic_store[1]}",
                          "data.batch_size=16", "data.split_fractions=[0.6,0.2,0.2]", "data.extract_workers=1",
                          "logger=none", "trainer.max_epochs=1", "seed=3", "evaluation.plots=false",
                          "evaluation.bootstrap=0", "evaluation.threshold=validation",
                          "evaluation.missing_modalities=true", "evaluation.missing_rates=[0,0.5]"], tmp_path)
    datamodule, module, trainer = build_run(cfg)
    trainer.fit(module, datamodule=datamodule)
    trainer.test(module, datamodule=datamodule)
    module.saved_val_predictions = None  # the report makes its own pass over the validation split
    weights = {k: v.clone() for k, v in module.state_dict().items()}
    device, training = module.device, module.training
    calls: list[bool] = []
    forward = module.forward

    def spied(batch):
        calls.append(_in_the_one_loop())
        return forward(batch)

    module.forward = spied
    module_report(module, datamodule, tmp_path / "report", dict(cfg.evaluation))
    del module.forward
    # the validation pass and the missing-modality conditions (9 with three modalities and one rate)
    assert len(calls) > 10 and all(calls), f"{calls.count(False)} of {len(calls)} forwards ran outside the loop"
    assert module.device == device and module.training == training and module.trainer is trainer
    assert all(torch.equal(v, weights[k]) for k, v in module.state_dict().items())
    assert not any(t.is_inference() for t in [*module.parameters(), *module.buffers()])
    # empathic-predict's function over the test loader gives exactly what Lightning's test loop collected
    tested = module.test_predictions
    assert torch.equal(one_loop.predict(module, _TestSplit(datamodule)), tested["window_pred"])
    split = one_loop.predict_split(module, datamodule.test_dataloader())
    assert all(torch.equal(split[k], tested[k]) for k in ("window_pred", "window_target", "rating_pred"))


def test_no_module_but_the_one_loop_calls_predict_step_or_trainer_predict():
    """A second loop shows as a `predict_step(...)` call, or a `trainer.predict(...)`, outside models/predict.py."""
    package = Path(empathic_fusion.__file__).parent
    found = []
    for path in package.rglob("*.py"):
        if path.resolve() == LOOP_FILE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and (node.func.attr == "predict_step"
                         or (node.func.attr == "predict" and "trainer" in ast.unparse(node.func.value).lower()))):
                found.append(f"{path.relative_to(package)}:{node.lineno}")
    assert found == []
