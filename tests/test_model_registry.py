"""Registration where the models are: `empathic_fusion.models` imports every module in its folder, so a
model is known by name without an import line anywhere; every model config's targets are registered and
round-trip through a checkpoint; the paper grid and the tables' rows come from the registry."""
from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from omegaconf import OmegaConf

import empathic_fusion.models as models
from empathic_fusion.core import registry
from empathic_fusion.core.registry import class_path, model_class, registered_name
from empathic_fusion.datamodules.text_table import PersonaEncoder
from empathic_fusion.evaluation.tables import model_display_name
from empathic_fusion.models.base import build_module
from empathic_fusion.models.checkpoints import load_module, read_header
from empathic_fusion.pipeline import run_config
from empathic_fusion.compose import compose_config

CONF = Path(models.__file__).parent.parent / "conf" / "model"
MODEL_CONFIGS = sorted(p.stem for p in CONF.glob("*.yaml"))
FUSION_DIMS = {"video": 6, "audio": 4, "text": 8, "story": 8, "traits": 6}


@functools.lru_cache
def _run_config(name: str) -> dict:
    """The run config of model=<name> (a text model without an encoder cache folder)."""
    text = registered_name(yaml.safe_load((CONF / f"{name}.yaml").read_text()).get("_target_", "")) != "fusion"
    return run_config(compose_config([f"model={name}", *(["model.net.encoder.cache_dir=null"] if text else [])],
                                     "unused"))


def _targets(name: str) -> tuple[str, str]:
    model = _run_config(name)["model"]
    return model["_target_"], model["net"]["_target_"]


def test_the_package_registers_every_model_without_an_import_list():
    assert "empathic_fusion.models.tfn" in models.import_models()
    paper = ["amer", "tfn", "ef_lstm", "lf_lstm", "story_similarity", "mean"]  # the paper's rows, in its order
    assert models.list_models("fusion")[:len(paper)] == paper  # a model added later comes after them
    assert "text_regressor" in models.list_models("text")
    assert [model_display_name(class_path(model_class(n))) for n in paper] == [
        "AMER", "TFN", "EF-LSTM", "LF-LSTM", "Story similarity (SBERT)", "Train mean"]


@pytest.mark.parametrize("name", MODEL_CONFIGS)
def test_every_model_config_names_registered_classes(name):
    module_target, net_target = _targets(name)
    for target in (module_target, net_target):
        assert registered_name(target) is not None, target
        assert class_path(model_class(target)) == target  # the config names the class where it lives
    if registered_name(module_target) == "fusion":  # the paper grid runs model=<registered name>
        assert registered_name(net_target) == name


def test_the_fusion_model_configs_are_the_registered_fusion_models():
    fusion = [n for n in MODEL_CONFIGS if registered_name(_targets(n)[0]) == "fusion"]
    assert sorted(fusion) == sorted(models.list_models("fusion"))


def _data_info(name: str) -> dict:
    if registered_name(_targets(name)[0]) == "fusion":
        return {"modalities": ["video", "audio", "text"], "input_dims": FUSION_DIMS}
    return {"fields": ["text"], "labels": ["a", "b"], "persona": PersonaEncoder([]).state(),
            "target_mean": [3.0, 3.0], "target_std": [1.0, 1.0], "levels": None}


@pytest.mark.parametrize("name", MODEL_CONFIGS)
def test_every_model_config_round_trips_through_a_checkpoint(name, tmp_path):
    config = _run_config(name)
    torch.manual_seed(0)
    module = build_module(config["model"], _data_info(name), config)
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu")
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp_path / "model.ckpt", weights_only=False)
    header = read_header(tmp_path / "model.ckpt")
    assert header["module"] == module.registered_name and header["model"] == registered_name(_targets(name)[1])
    loaded = load_module(tmp_path / "model.ckpt")
    assert type(loaded) is type(module) and type(loaded.net) is type(module.net)
    saved, again = module.state_dict(), loaded.state_dict()
    assert saved.keys() == again.keys()
    assert all(torch.equal(saved[k], again[k]) for k in saved if isinstance(saved[k], torch.Tensor))


TOY_NET = '''
"""A toy fusion model: each modality's masked mean, one linear layer."""
import torch
from torch import nn

from empathic_fusion.core.registry import register_model
from empathic_fusion.models.components.pooling import masked_mean


@register_model("toy_mean_pool", module="fusion", display="Toy mean pool")
class ToyMeanPool(nn.Module):
    required_head = None  # the config's head

    def __init__(self, modalities, input_dims, hidden=8):
        super().__init__()
        self.modalities = list(modalities)
        self.linear = nn.Linear(sum(int(input_dims[m]) for m in self.modalities), hidden)
        self.out_dim = hidden

    def forward(self, batch):
        pooled = [masked_mean(batch[m]["x"], batch[m]["mask"]) for m in self.modalities]
        return torch.tanh(self.linear(torch.cat(pooled, dim=-1)))
'''

TOY_CONFIG = """
defaults:
  - schema_fusion_model
  - /optimizer@optimizer: adamw
  - /scheduler@scheduler: step_lr
  - _self_
_target_: empathic_fusion.models.fusion_module.FusionModule
net:
  _target_: empathic_fusion.models.toy_mean_pool.ToyMeanPool
  hidden: 8
"""


@pytest.fixture
def toy_model(tmp_path, monkeypatch):
    """A net file in a folder on the models package's path and its YAML in a config folder on Hydra's search
    path: the two files a new fusion model is. The registry and the import are undone afterwards."""
    code, conf = tmp_path / "code", tmp_path / "conf" / "model"
    code.mkdir()
    conf.mkdir(parents=True)
    (code / "toy_mean_pool.py").write_text(TOY_NET)
    (conf / "toy_mean_pool.yaml").write_text(TOY_CONFIG)
    monkeypatch.setattr(models, "__path__", [*models.__path__, str(code)])
    for table in ("REGISTRY", "_NAMES", "MODELS"):
        monkeypatch.setattr(registry, table, dict(getattr(registry, table)))
    yield f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    sys.modules.pop("empathic_fusion.models.toy_mean_pool", None)


def test_a_new_fusion_model_is_its_net_file_and_its_config(toy_model, tiny_dataset, tiny_store, tmp_path):
    from empathic_fusion.cli import fusion_models
    from empathic_fusion.evaluation.sweep import evaluate_sweep
    from empathic_fusion.pipeline import train

    assert models.list_models("fusion")[-1] == "toy_mean_pool"  # after the paper's models
    assert fusion_models().split(",")[-1] == "toy_mean_pool"  # the paper grid's sweep runs it too
    for name in ("toy_mean_pool", "mean"):
        out = tmp_path / "sweep" / name
        cfg = compose_config([toy_model, f"model={name}", f"data.dataset_dir={tiny_dataset}",
                              f"data.store_dir={tiny_store}", "data.demo=null", "modality=v+t", "trainer.max_epochs=1",
                              "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", "logger=none",
                              "evaluation=lean"], out)
        results = train(cfg)
        (out / ".hydra").mkdir()
        OmegaConf.save(cfg, out / ".hydra" / "config.yaml")
        assert math.isfinite(results["model"]["rating"]["mse"])
    assert read_header(tmp_path / "sweep" / "toy_mean_pool")["model"] == "toy_mean_pool"
    tables = evaluate_sweep(tmp_path / "sweep", plots=False)
    assert list(tables["summaries"]["rating"]["model"]) == ["Train mean", "Toy mean pool"]  # after the paper's rows


def test_a_net_without_the_declared_attributes_is_refused_with_their_names():
    """FusionModule checks its net against models/contracts.py FusionNet instead of probing attributes."""
    from torch import nn

    from empathic_fusion.models.contracts import FusionNet, check_part

    class NoHeadChoice(nn.Module):
        def __init__(self):
            super().__init__()
            self.modalities, self.out_dim = ["text"], 4

        def forward(self, batch):
            return batch

    with pytest.raises(TypeError, match=r"NoHeadChoice is not a FusionNet: it lacks \['required_head'\]"):
        check_part(NoHeadChoice(), FusionNet)
    NoHeadChoice.required_head = None
    check_part(NoHeadChoice(), FusionNet)
