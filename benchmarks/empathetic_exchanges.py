"""EmpatheticExchanges benchmark: the text model against every baseline it reports (TF-IDF + ridge,
ridge on frozen embeddings, training mean) under conversation-grouped 5-fold CV: r, rho, MSE, QWK
and macro-F1 as mean ± std over folds, whether the model wins on r and rho, the stack weights of
its ridge experts, and the time per fold.

    .venv/bin/python benchmarks/empathetic_exchanges.py [hydra overrides, e.g. trainer.max_epochs=20]
    .venv/bin/python benchmarks/empathetic_exchanges.py experiment=text_empathetic_exchanges_finetune \
        --out docs/results/empathetic_exchanges_finetune.md

Reads ../shared/data/empathetic_exchanges (never copied into the repo); exits 0 with a message when
it is absent. Frozen all-MiniLM-L6-v2 embeddings are cached in data/features/text_cache, so a rerun
only trains the heads. The runs go to logs/benchmarks/empathetic_exchanges/<time>/; the tables to
docs/results/empathetic_exchanges.md (`--out` elsewhere, `--no-write` to print only).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import open_dict  # noqa: E402

from empathic_fusion.utils import CONFIG_DIR  # noqa: E402  (also registers the project_root resolver)
from empathic_fusion.evaluation.sweep import evaluate_sweep  # noqa: E402
from empathic_fusion.pipeline import train  # noqa: E402
from results import add_output_arguments, write_results  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every fold's run")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="folder for the folds' runs (default: logs/benchmarks/empathetic_exchanges/<time>)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="folds trained at once, one process each (seconds per fold then overlap)")
    add_output_arguments(parser, "empathetic_exchanges")
    args = parser.parse_args(argv)
    overrides = args.overrides
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    experiment = next((o for o in overrides if o.startswith("experiment=")), "experiment=text_empathetic_exchanges")
    overrides = [o for o in overrides if o != experiment]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        base = compose(config_name="train", overrides=[experiment, "logger=none", *overrides])
    data_path = Path(base.data.path)
    if not data_path.is_file():
        print(f"EmpatheticExchanges not found at {data_path}; nothing to benchmark.")
        return 0
    out_dir = args.run_dir or ROOT / "logs" / "benchmarks" / "empathetic_exchanges" / time.strftime("%Y-%m-%d_%H-%M-%S")
    start = time.time()
    folds_to_run = range(int(base.data.cv_folds))  # one run per fold, as a `data.cv_fold` sweep would do
    if args.jobs > 1:  # folds in parallel processes (fresh interpreters: Hydra and torch state stay per fold)
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
            seconds = list(pool.map(run_fold, [experiment] * len(folds_to_run), [overrides] * len(folds_to_run),
                                    folds_to_run, [out_dir] * len(folds_to_run)))
    else:
        seconds = [run_fold(experiment, overrides, fold, out_dir) for fold in folds_to_run]
    result = evaluate_sweep(out_dir, None, plots=False)
    sweep_tables = [f"{level}-level, mean ± std over folds (x100):\n\n{paths['md'].read_text().strip()}\n"
                    for level, paths in result["paths"].items()]
    folds = [json.loads((out_dir / str(k) / "test_metrics.json").read_text()) for k in range(len(seconds))]
    parallel = f" ({args.jobs} folds at once, so the seconds per fold overlap)" if args.jobs > 1 else ""
    body = (f"{len(seconds)} conversation-grouped folds of {data_path.name}{parallel}; model and baselines fitted on "
            f"the same training rows, mean ± std over folds.\n\n{summary_table(folds, seconds)}\n\n"
            + "\n".join(sweep_tables))
    print("\n" + body)
    write_results(args, "EmpatheticExchanges: text model against its baselines", body)
    print(f"results in {out_dir} ({time.time() - start:.0f} s)")
    return 0


def run_fold(experiment: str, overrides: list[str], fold: int, out_dir: Path) -> float:
    """Train and test one fold into out_dir/<fold> as a Hydra job would leave it; seconds it took."""
    from omegaconf import OmegaConf

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[experiment, "logger=none", *overrides, f"data.cv_fold={fold}"])
    job = out_dir / str(fold)
    with open_dict(cfg):
        cfg.paths.output_dir = str(job)
    fold_start = time.time()
    train(cfg)
    (job / ".hydra").mkdir(parents=True, exist_ok=True)  # what evaluate_sweep reads from a Hydra job
    OmegaConf.save(cfg, job / ".hydra" / "config.yaml", resolve=True)
    seconds = time.time() - fold_start
    print(f"fold {fold}: {seconds:.0f} s (CPU)", flush=True)
    return seconds


METRICS = {"pearson": "r", "spearman": "rho", "mse": "MSE", "qwk": "QWK", "macro_f1": "macro-F1"}


def summary_table(folds: list[dict], seconds: list[float]) -> str:
    """Model and baselines, mean ± std over folds; per baseline whether the model wins on r and rho
    (means) and on how many folds; the ridge experts' mean stack weights; seconds per fold."""
    rows = {"model": [f["model"]["rating"] for f in folds]}
    rows.update({name: [f["baselines"][name]["rating"] for f in folds] for name in folds[0]["baselines"]})
    mean = {row: {m: float(np.mean([v[m] for v in values])) for m in METRICS} for row, values in rows.items()}
    lines = ["| | " + " | ".join(METRICS.values()) + " |", "|---" * (len(METRICS) + 1) + "|"]
    for row, values in rows.items():
        cells = [f"{mean[row][m]:.3f} ± {np.std([v[m] for v in values], ddof=1):.3f}" for m in METRICS]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines.append("")
    for name in rows:
        if name == "model":
            continue
        wins = {m: sum(a[m] > b[m] for a, b in zip(rows["model"], rows[name])) for m in ("pearson", "spearman")}
        verdict = all(mean["model"][m] > mean[name][m] for m in ("pearson", "spearman"))
        lines.append(f"model vs {name}: {'wins' if verdict else 'does NOT win'} on mean r and rho "
                     f"(r higher on {wins['pearson']}/{len(folds)} folds, rho on {wins['spearman']}/{len(folds)})")
    stacks = [f.get("stack") or {} for f in folds]
    if any(stacks):
        lines.append("ridge experts, mean over folds (stack weight; held-out r on the training rows): " + "; ".join(
            f"{name} {np.mean([s[name]['weight'] for s in stacks]):.2f}; "
            f"{np.mean([s[name]['held_out_r'] for s in stacks]):.3f}" for name in stacks[0]))
    lines.append("seconds per fold (CPU): " + ", ".join(f"{s:.0f}" for s in seconds))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
