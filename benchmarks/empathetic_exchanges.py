"""EmpatheticExchanges benchmark: the text model vs majority-class, training-mean and TF-IDF + ridge
baselines under conversation-grouped 5-fold CV (Spearman rho, Acc, macro-F1, QWK, MSE; mean ± std).

    .venv/bin/python benchmarks/empathetic_exchanges.py [hydra overrides, e.g. model.max_epochs=20]

Reads ../shared/data/empathetic_exchanges (never copied into the repo); exits 0 with a message when
it is absent. Frozen all-MiniLM-L6-v2 embeddings are cached in data/features/text_cache, so a rerun
only trains the heads. Results go to logs/benchmarks/empathetic_exchanges/<time>/.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import open_dict  # noqa: E402

import src.utils  # noqa: E402,F401  (project_root resolver)
from src.text.pipeline import train_text  # noqa: E402


def main(overrides: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=text_empathetic_exchanges", *overrides])
    data_path = Path(cfg.data.path)
    if not data_path.is_file():
        print(f"EmpatheticExchanges not found at {data_path}; nothing to benchmark.")
        return 0
    out_dir = ROOT / "logs" / "benchmarks" / "empathetic_exchanges" / time.strftime("%Y-%m-%d_%H-%M-%S")
    with open_dict(cfg):
        cfg.paths.output_dir = str(out_dir)
    start = time.time()
    train_text(cfg)
    print(f"results in {out_dir} ({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
