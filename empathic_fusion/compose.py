"""Compose a run's config in Python, as train.py / evaluate.py would see it (notebooks, tests, benchmarks).

An entry point like cli.py: it declares the feature branches (importing empathic_fusion.features) before
composing, so every branch's `features.<branch>` section is in the schema, a newly added extractor file's too."""
from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

import empathic_fusion.config  # noqa: F401  (registers the config schemas in Hydra's ConfigStore)
from empathic_fusion.features import discover_branches
from empathic_fusion.utils import CONFIG_DIR


def compose_config(overrides: list[str], output_dir: str | Path, config_name: str = "train") -> DictConfig:
    """`conf/<config_name>.yaml` with the overrides, the Hydra config set (so `${hydra:...}` resolves)
    and every output written under `output_dir` instead of a dated run folder."""
    discover_branches()  # extractor files added since the package was imported
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
    return cfg
