"""Train a fusion model: python train.py model=lf_lstm modality=v+t (see conf/train.yaml)."""
import hydra
from omegaconf import DictConfig

import src.utils  # noqa: F401  (registers the project_root resolver)
from src.pipeline import train
from src.utils.multirun import run_job


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Returns cfg.optimized_metric (a validation metric) for sweepers such as hparams_search=optuna;
    a failing job of a multirun is recorded in the sweep folder instead of stopping the sweep."""
    if cfg.model.get("task") == "text":  # text models (model=text_regressor | llm_judge): src/text/
        from src.text.pipeline import train_text

        train_text(cfg)
        return None
    return run_job(train, cfg)


if __name__ == "__main__":
    main()
