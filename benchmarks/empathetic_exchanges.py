"""EmpatheticExchanges benchmark: the text model vs majority-class, training-mean and TF-IDF + ridge
baselines under conversation-grouped 5-fold CV (Spearman rho, Acc, macro-F1, QWK, MSE; mean ± std).

    .venv/bin/python benchmarks/empathetic_exchanges.py [hydra overrides, e.g. trainer.max_epochs=20]
    .venv/bin/python benchmarks/empathetic_exchanges.py experiment=text_empathetic_exchanges_finetune

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
from src.evaluation.sweep import evaluate_sweep  # noqa: E402
from src.pipeline import train  # noqa: E402


def main(overrides: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from omegaconf import OmegaConf

    experiment = next((o for o in overrides if o.startswith("experiment=")), "experiment=text_empathetic_exchanges")
    overrides = [o for o in overrides if o != experiment]
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        base = compose(config_name="train", overrides=[experiment, "logger=none", *overrides])
    data_path = Path(base.data.path)
    if not data_path.is_file():
        print(f"EmpatheticExchanges not found at {data_path}; nothing to benchmark.")
        return 0
    out_dir = ROOT / "logs" / "benchmarks" / "empathetic_exchanges" / time.strftime("%Y-%m-%d_%H-%M-%S")
    start = time.time()
    for fold in range(int(base.data.cv_folds)):  # one run per fold, as a `data.cv_fold` sweep would do
        with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="train", overrides=[experiment, "logger=none", *overrides,
                                                          f"data.cv_fold={fold}"])
        job = out_dir / str(fold)
        with open_dict(cfg):
            cfg.paths.output_dir = str(job)
        fold_start = time.time()
        train(cfg)
        (job / ".hydra").mkdir(parents=True, exist_ok=True)  # what evaluate_sweep reads from a Hydra job
        OmegaConf.save(cfg, job / ".hydra" / "config.yaml", resolve=True)
        print(f"fold {fold}: {time.time() - fold_start:.0f} s (CPU)")
    result = evaluate_sweep(out_dir, None, plots=False)
    for level, paths in result["paths"].items():
        print(f"\n{level}-level, mean ± std over folds (x100):\n{paths['md'].read_text()}")
    print(f"results in {out_dir} ({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
