"""Extract features into the store: python extract.py data=... features=paper shard=3/16 (conf/extract.yaml)."""
import hydra
from omegaconf import DictConfig

import src.utils  # noqa: F401  (registers the project_root resolver)
from src.features.command import run_extraction


@hydra.main(version_base="1.3", config_path="conf", config_name="extract")
def main(cfg: DictConfig) -> None:
    """Exits with status 1 when any session or branch failed (listed in the store's failure report)."""
    report = run_extraction(cfg)
    if report.failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
