"""Evaluate a checkpoint or a sweep (see conf/evaluate.yaml):
    python evaluate.py ckpt_path=path/to.ckpt
    python evaluate.py sweep_dir=logs/train/multiruns/<date>
"""
import hydra
from omegaconf import DictConfig

import src.utils  # noqa: F401  (registers the project_root resolver)
from src.pipeline import evaluate


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    evaluate(cfg)


if __name__ == "__main__":
    main()
