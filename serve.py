"""Serve the Gradio app (see conf/serve.yaml):
    python serve.py ckpt_path=path/to/fusion.ckpt text_ckpt_path=path/to/model.pt   (either or both)
"""
import hydra
from omegaconf import DictConfig

import src.utils  # noqa: F401  (registers the project_root resolver)


@hydra.main(version_base="1.3", config_path="conf", config_name="serve")
def main(cfg: DictConfig) -> None:
    from src.app.clip import ClipScorer
    from src.app.text import load_text_scorer
    from src.app.ui import build_app, launch

    text = load_text_scorer(cfg.text_ckpt_path) if cfg.text_ckpt_path else None
    clip = ClipScorer(cfg.ckpt_path, cfg.max_upload_mb) if cfg.ckpt_path else None
    print(f"flags -> {cfg.flag_csv}; Ctrl+C stops")
    launch(build_app(text, clip, cfg.flag_csv), cfg.host, cfg.port)


if __name__ == "__main__":
    main()
