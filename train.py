"""Train a model (see conf/train.yaml): a fusion net, python train.py model=lf_lstm modality=v+t,
or a text model, python train.py experiment=text_empathetic_exchanges."""
import hydra
from omegaconf import DictConfig

import src.utils  # noqa: F401  (registers the project_root resolver)
from src.pipeline import train
from src.utils.multirun import run_job


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Returns cfg.optimized_metric (a validation metric) for sweepers such as hparams_search=optuna;
    a failing job of a multirun is recorded in the sweep folder instead of stopping the sweep."""
    return run_job(train, cfg)


if __name__ == "__main__":
    main()
