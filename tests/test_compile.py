"""`model.compile=true`: the net and head through torch.compile train and predict as the eager module does.

Compiled here with the aot_eager backend (Dynamo's capture and AOTAutograd's joint graph, no code
generation: seconds instead of the minute inductor takes on a CPU), so what is tested is the capture
around the masked norms, the LSTMs (run eagerly between the compiled parts) and the heads."""
from __future__ import annotations

import sys

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from empathic_fusion.models.base import build_module
from empathic_fusion.pipeline import run_config
from empathic_fusion.utils import PROJECT_ROOT
from empathic_fusion.compose import compose_config

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
from train_throughput import SyntheticBatches  # noqa: E402

DIMS = {"video": 12, "audio": 6, "text": 10, "story": 8, "traits": 6}


def _module(name: str, tmp_path, compiled: bool):
    config = run_config(compose_config([f"model={name}", f"model.compile={str(compiled).lower()}",
                                        "model.compile_backend=aot_eager"], tmp_path))
    torch.manual_seed(0)
    return build_module(config["model"], {"modalities": ["video", "audio", "text"], "input_dims": DIMS}, config)


def _train(module, batches: list[dict]) -> list[float]:
    L.seed_everything(0)
    trainer = L.Trainer(accelerator="cpu", max_steps=len(batches), max_epochs=-1, logger=False, limit_val_batches=0,
                        num_sanity_val_steps=0, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    module.eval()
    with torch.no_grad():
        return module(batches[0]).tolist()


@pytest.mark.parametrize("name", ["tfn", "ef_lstm", "lf_lstm", "amer"])
def test_a_compiled_model_trains_and_predicts_as_the_eager_one(name, tmp_path):
    batches = SyntheticBatches(4, 6, 10, DIMS).batches
    eager, compiled = _module(name, tmp_path, False), _module(name, tmp_path, True)
    assert compiled.compile_settings == {"mode": None, "backend": "aot_eager"}
    assert eager.state_dict().keys() == compiled.state_dict().keys()  # compiling leaves the checkpoint's layout
    expected, got = _train(eager, batches), _train(compiled, batches)
    assert compiled.__dict__["_compiled"] is not None
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=1e-6)
    for (key, a), b in zip(eager.state_dict().items(), compiled.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=key)
