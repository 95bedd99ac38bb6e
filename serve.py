"""Serve the empathy scoring page for a trained text model: python serve.py ckpt_path=.../model.pt"""
import hydra
from omegaconf import DictConfig

import src.utils  # noqa: F401  (registers the project_root resolver)


@hydra.main(version_base="1.3", config_path="conf", config_name="serve")
def main(cfg: DictConfig) -> None:
    from src.text.scorer import TextScorer
    from src.text.serve import make_server

    server = make_server(TextScorer.load(cfg.ckpt_path), cfg.host, cfg.port, cfg.flag_csv)
    host, port = server.server_address[:2]
    print(f"scoring page on http://{host}:{port}/ (flags -> {cfg.flag_csv}); Ctrl+C stops")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
