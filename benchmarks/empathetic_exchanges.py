"""EmpatheticExchanges benchmark: the text recipes side by side on the same conversation-grouped folds,
against every baseline they report (TF-IDF + ridge, ridge on frozen embeddings, training mean): r, rho,
MSE, QWK and macro-F1 as mean ± std over folds, whether each recipe wins on r, rho and QWK and on how
many folds, the stack weights and held-out r of its experts, and the time per fold.

The recipes (`--recipes`, default all but the GPU one):
- default: the CPU default as shipped (conf/model/text_regressor.yaml): TF-IDF ridge and representation
  experts, a ridge per field on the last 1, 2, 4 and all layers' pooled vectors, weighed by the stack,
  each penalty grid widened past an end its best penalty sits at, over the strongest installed encoder
  (model_path=auto: all-mpnet-base-v2 when `empathic-encoders install mpnet` ran, else MiniLM);
- minilm: the same on the packaged MiniLM (what a machine without mpnet runs; left out when the
  default already runs MiniLM);
- round3: the previous CPU default: MiniLM, the last 1, 2 and 4 layers, the fixed penalty grid;
- constant: the earliest CPU default, one embedding ridge per field on MiniLM's last layer alone;
- finetune: the GPU recipe (experiment=text_empathetic_exchanges_finetune: the default stack plus a
  cross-fitted fine-tuned encoder expert). With `--finetune` it runs on the same folds (on a CPU with
  reduced settings, `--finetune-overrides`, which its label then says); without, its row is marked
  unmeasured.
The time of the default (and minilm) against the round3 recipe is their median seconds per fold (the
first fold also encodes the table); the cold encoding of the table's first texts, MiniLM with and
without the kept layers and mpnet with all of its layers, each in a fresh process, gives seconds and
peak memory side by side (the encoding is apart from the fit time: it is cached on disk once).

    python benchmarks/empathetic_exchanges.py [hydra overrides for every recipe]
    python benchmarks/empathetic_exchanges.py --recipes default,constant
    python benchmarks/empathetic_exchanges.py --finetune trainer=gpu                      # on a GPU
    python benchmarks/empathetic_exchanges.py --finetune \
        --finetune-overrides "model.net.experts.2.trainable_layers=1 model.net.experts.2.epochs=1"  # on a CPU

Reads ../shared/data/empathetic_exchanges (never copied into the repo); exits 0 with a message when
it is absent. Frozen embeddings are cached in data/features/text_cache, so a rerun only trains the
heads. The runs go to logs/benchmarks/empathetic_exchanges/<time>/<recipe>/<fold>; the tables to
docs/results/empathetic_exchanges.md, or with `--finetune`
docs/results/empathetic_exchanges_finetune_<cpu|gpu>.md (`--out` elsewhere, `--no-write` to print only).
"""
from __future__ import annotations

import argparse
import json
import logging
import shlex
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
from empathic_fusion.core.packaged_encoders import AUTO, chosen_encoder, is_installed  # noqa: E402
from empathic_fusion.core.sentence_encoder import encoder_name  # noqa: E402
from empathic_fusion.evaluation.sweep import evaluate_sweep  # noqa: E402
from empathic_fusion.pipeline import train  # noqa: E402
from results import RESULTS_DIR, Measures, add_output_arguments, quiet_machine_guard, write_results  # noqa: E402


DEFAULT = "experiment=text_empathetic_exchanges"
FINETUNE = "experiment=text_empathetic_exchanges_finetune"
RECIPES = {"default": "CPU default", "minilm": "CPU default on MiniLM",
           "round3": "previous CPU default (MiniLM, last 1, 2 and 4 layers, fixed penalty grid)",
           "constant": "earliest CPU default (MiniLM, last layer only)",
           "finetune": "GPU recipe (stack + fine-tuned encoder)"}
_MINILM = "model.net.encoder.model_path=null"
_FIXED_GRID = ["++model.net.experts.0.widen_steps=0", "++model.net.experts.1.widen_steps=0"]
RECIPE_OVERRIDES = {"default": [], "minilm": [_MINILM],
                    "round3": [_MINILM, "model.net.experts.1.layers=[1,2,4]", *_FIXED_GRID],
                    "constant": [_MINILM, "model.net.experts.1.layers=null", *_FIXED_GRID]}
DISPLAY = ("constant", "round3", "minilm", "default", "finetune")  # each recipe is compared with those above it
ENCODING_TEXTS = 2000  # texts encoded cold for the side-by-side encoding time


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every recipe's runs")
    parser.add_argument("--recipes", default="default,minilm,round3,constant",
                        help=f"comma-separated, from {', '.join(r for r in RECIPES if r != 'finetune')} "
                             "(the default recipe always runs: the baselines come from its runs)")
    parser.add_argument("--finetune", action="store_true",
                        help="also run the GPU recipe (experiment=text_empathetic_exchanges_finetune) on the same folds")
    parser.add_argument("--finetune-overrides", default="",
                        help="Hydra overrides for the GPU recipe only, one string (e.g. fewer layers on a CPU)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="folder for the runs (default: logs/benchmarks/empathetic_exchanges/<time>); given again, "
                             "the folds that finished there are read, not trained again")
    parser.add_argument("--jobs", type=int, default=1,
                        help="folds trained at once, one process each (seconds per fold then overlap)")
    parser.add_argument("--no-second-table", action="store_true",
                        help="skip the check of the default against the constant recipe on the synthetic table")
    add_output_arguments(parser, "empathetic_exchanges")
    args = parser.parse_args(argv)
    quiet_machine_guard(args, Measures.ACCURACY)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    experiment = next((o for o in args.overrides if o.startswith("experiment=")), DEFAULT)
    if experiment == FINETUNE:
        parser.error(f"{FINETUNE} runs with --finetune, beside the CPU default")
    common = [o for o in args.overrides if o != experiment]
    chosen = ["default", *[r.strip() for r in args.recipes.split(",") if r.strip() not in ("", "default")]]
    unknown = [r for r in chosen if r not in RECIPE_OVERRIDES]
    if unknown:
        parser.error(f"--recipes: unknown {unknown}; known: {', '.join(RECIPE_OVERRIDES)}")
    unmeasured = {}
    default_encoder = chosen_encoder(AUTO)
    if "minilm" in chosen and default_encoder is None:
        chosen.remove("minilm")  # the default runs MiniLM already: the same runs
    labels_base = dict(RECIPES, default=f"CPU default ({encoder_name(AUTO)}, model_path=auto)")
    recipes = {name: [experiment, *common, *RECIPE_OVERRIDES[name]] for name in chosen}
    if args.finetune:
        recipes["finetune"] = [FINETUNE, *common, *shlex.split(args.finetune_overrides)]
    else:
        unmeasured["finetune"] = ("unmeasured: it fine-tunes the encoder 6 times per fold, meant for a GPU; "
                                  "`--finetune trainer=gpu` on one fills this row")
    configs = {name: compose_train(overrides) for name, overrides in recipes.items()}
    base = configs["default"]
    data_path = Path(base.data.path)
    if not data_path.is_file():
        print(f"EmpatheticExchanges not found at {data_path}; nothing to benchmark.")
        return 0
    device = "gpu" if any(_on_gpu(cfg) for cfg in configs.values()) else "cpu"
    if args.finetune and args.out == RESULTS_DIR / "empathetic_exchanges.md":
        args.out = RESULTS_DIR / f"empathetic_exchanges_finetune_{device}.md"
    out_dir = args.run_dir or ROOT / "logs" / "benchmarks" / "empathetic_exchanges" / time.strftime("%Y-%m-%d_%H-%M-%S")
    start = time.time()
    changed = experiment != DEFAULT or bool(common)  # the recipes are not as shipped: say so in every label
    labels = {name: label + (" with the command's overrides" if changed else "")
              for name, label in labels_base.items()}
    encoding = encoding_costs(base, is_installed("mpnet")) if "round3" in recipes else None
    folds: dict[str, list[dict]] = {}
    seconds: dict[str, list[float]] = {}
    sweep_tables = []
    for name, overrides in recipes.items():
        run_dir = out_dir / name
        fold_ids = list(range(int(base.data.cv_folds)))  # one run per fold, as a `data.cv_fold` sweep would do
        seconds[name], folds[name] = run_recipe(overrides, fold_ids, run_dir, args.jobs)
        result = evaluate_sweep(run_dir, None, plots=False)
        sweep_tables += [f"{labels[name]}, {level}-level, mean ± std over folds (x100):\n\n"
                         f"{paths['md'].read_text().strip()}\n" for level, paths in result["paths"].items()]
    parallel = f" ({args.jobs} folds at once, so the seconds per fold overlap)" if args.jobs > 1 else ""
    body = (f"{len(folds['default'])} conversation-grouped folds of {data_path.name}{parallel}, on the {device.upper()}; "
            "every recipe and baseline fitted on the same training rows, mean ± std over folds.\n\n")
    if args.finetune:
        body += finetune_settings(configs["finetune"], device) + "\n\n"
    body += summary_table(folds, seconds, device, labels, {labels[k]: v for k, v in unmeasured.items()})
    body += "\n\n" + time_comparison(seconds, labels, encoding) + "\n\n" + "\n".join(sweep_tables)
    if "round3" in recipes and not args.no_second_table:
        body += "\n" + second_table(out_dir / "synthetic", common, args.jobs, labels)
    print("\n" + body)
    title = "EmpatheticExchanges: text recipes against their baselines"
    write_results(args, title + (f", with the GPU recipe ({device.upper()})" if args.finetune else ""), body)
    print(f"results in {out_dir} ({time.time() - start:.0f} s)")
    return 0


SYNTHETIC = {"writers": 150, "turns": 4, "seed": 0}


def second_table(out_dir: Path, common: list[str], jobs: int, labels: dict[str, str]) -> str:
    """The default against the previous default (round3) on a second table, the generated one of
    empathic_fusion/demo/generated_table.py (one text field, three labels from planted phrases, 5 folds
    grouped by writer): the representation experts must not hurt where words carry the signal."""
    from empathic_fusion.demo.generated_table import make_text_table

    out_dir.mkdir(parents=True, exist_ok=True)
    table = out_dir / "table.csv"
    make_text_table(SYNTHETIC["writers"], SYNTHETIC["turns"], seed=SYNTHETIC["seed"]).to_csv(table, index=False)
    data = ["model=text_regressor", "modality=t", "data=text_csv", f"data.path={table}", "data.text_columns=[text]",
            "data.label_columns=[cognitive,emotional,behavioral]", "data.group_column=writer", "data.cv_folds=5",
            "data.name=synthetic", "trainer.max_epochs=30"]
    folds, seconds = {}, {}
    for name in ("default", "round3"):
        seconds[name], folds[name] = run_recipe([*data, *common, *RECIPE_OVERRIDES[name]], list(range(5)),
                                                out_dir / name, jobs)
    rows = SYNTHETIC["writers"] * SYNTHETIC["turns"]
    return (f"A second table: the generated one of empathic_fusion/demo/generated_table.py ({SYNTHETIC['writers']} writers x "
            f"{SYNTHETIC['turns']} turns = {rows} rows, seed {SYNTHETIC['seed']}; one text field, the mean of three "
            "labels driven by planted phrases), 5 folds grouped by writer, the same two recipes:\n\n"
            + summary_table(folds, seconds, "cpu", labels) + "\n")


ENCODING_PROBES = (("MiniLM", None, 4), ("MiniLM", None, 6), ("mpnet", "mpnet", 12))  # round3, minilm, default


def encoding_costs(cfg, with_mpnet: bool) -> list[dict]:
    """Encoding the table's first ENCODING_TEXTS distinct texts with an empty cache, each probe in a
    fresh process (so its peak memory is the encoder's and the texts'): MiniLM with its last 4 layers
    kept (the previous default) and with all 6 (the default on MiniLM), and mpnet with all 12 (the
    default where mpnet is installed). Seconds and peak resident memory per probe."""
    import hydra
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from omegaconf import OmegaConf

    datamodule = hydra.utils.instantiate(cfg.data, modalities=["text"], features=None)
    datamodule.setup("fit")
    texts = list(dict.fromkeys(datamodule.all_texts()))[:ENCODING_TEXTS]
    encoder = {**OmegaConf.to_container(cfg.model.net.encoder, resolve=True), "cache_dir": None}
    out = []
    for name, model_path, layers in ENCODING_PROBES:
        if model_path == "mpnet" and not with_mpnet:
            continue
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            seconds, peak = pool.submit(_encode_probe, {**encoder, "model_path": model_path}, layers, texts).result()
        out.append({"encoder": name, "layers": layers, "texts": len(texts), "seconds": seconds, "peak_gb": peak})
    return out


def _encode_probe(encoder_cfg: dict, layers: int, texts: list[str]) -> tuple[float, float]:
    """In a fresh process: load the encoder, encode the texts (keeping `layers`); seconds and peak RSS (GB)."""
    import resource

    import hydra

    encoder = hydra.utils.instantiate(encoder_cfg)
    if layers:
        encoder.keep_layers(layers)
    start = time.perf_counter()
    encoder.warm(texts)
    seconds = time.perf_counter() - start
    return seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2


def time_comparison(seconds: dict[str, list[float]], labels: dict[str, str], encoding: list[dict] | None) -> str:
    """The default's (and minilm's) time against the previous default's (median seconds per fold, so the
    first fold's encoding is left out, and their ratio), and the encoding probes side by side."""
    lines = []
    for name in ("default", "minilm"):
        if name in seconds and "round3" in seconds:
            new, old = float(np.median(seconds[name])), float(np.median(seconds["round3"]))
            lines.append(f"Time: {labels[name]} {new:.0f} s per fold against {labels['round3']} {old:.0f} s "
                         f"(median over folds, the embeddings cached): {new / old:.2f}x.")
    if encoding:
        lines += ["", f"Encoding the table's first {encoding[0]['texts']} distinct texts with an empty cache, one "
                  "process each (peak resident memory: the encoder, the texts and the interpreter):", "",
                  "| encoder | layers kept | seconds | peak memory (GB) |", "|---|---|---|---|"]
        lines += [f"| {p['encoder']} | {p['layers']} | {p['seconds']:.1f} | {p['peak_gb']:.2f} |" for p in encoding]
    return "\n".join(lines)


# Written into a fold's folder when it finished: its overrides and seconds (to resume a benchmark).
FINISHED = "fold_run.json"


def compose_train(overrides: list[str]):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=["logger=none", *overrides])


def _on_gpu(cfg) -> bool:
    import torch

    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    return torch.cuda.is_available() and accelerator in ("gpu", "cuda", "auto")


def run_recipe(overrides: list[str], fold_ids: list[int], run_dir: Path, jobs: int) -> tuple[list[float], list[dict]]:
    """Each fold's run (run_folds) and its test_metrics.json: seconds per fold and the folds' results."""
    seconds = run_folds(overrides, fold_ids, run_dir, jobs)
    return seconds, [json.loads((run_dir / str(k) / "test_metrics.json").read_text()) for k in fold_ids]


def run_folds(overrides: list[str], fold_ids: list[int], run_dir: Path, jobs: int) -> list[float]:
    """Each fold's run into run_dir/<fold>, `jobs` at once in fresh interpreters (Hydra and torch
    state stay per fold); seconds per fold."""
    if jobs <= 1:
        return [run_fold(overrides, fold, run_dir) for fold in fold_ids]
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        return list(pool.map(run_fold, [overrides] * len(fold_ids), fold_ids, [run_dir] * len(fold_ids)))


def run_fold(overrides: list[str], fold: int, out_dir: Path) -> float:
    """Train and test one fold into out_dir/<fold> as a Hydra job would leave it; seconds it took. A fold
    that finished there with the same overrides (an interrupted benchmark given the same `--run-dir`)
    is read, not trained again."""
    from omegaconf import OmegaConf

    job = out_dir / str(fold)
    finished = job / FINISHED
    if finished.is_file() and json.loads(finished.read_text())["overrides"] == list(overrides):
        print(f"fold {fold}: reusing the finished run in {job}", flush=True)
        return json.loads(finished.read_text())["seconds"]
    cfg = compose_train([*overrides, f"data.cv_fold={fold}"])
    with open_dict(cfg):
        cfg.paths.output_dir = str(job)
    fold_start = time.time()
    train(cfg)
    (job / ".hydra").mkdir(parents=True, exist_ok=True)  # what evaluate_sweep reads from a Hydra job
    OmegaConf.save(cfg, job / ".hydra" / "config.yaml", resolve=True)
    seconds = time.time() - fold_start
    finished.write_text(json.dumps({"overrides": list(overrides), "seconds": seconds}))
    print(f"fold {fold}: {seconds:.0f} s", flush=True)
    return seconds


EXPERT_SETTINGS = ("trainable_layers", "epochs", "inner_folds", "fields", "max_length", "batch_size", "lr")


def finetune_settings(cfg, device: str) -> str:
    """The fine-tuned expert's settings as run (`cfg`, the run's config), and where they differ from
    the GPU recipe's."""
    from omegaconf import OmegaConf

    expert = lambda config: OmegaConf.to_container(config.model.net.experts[-1], resolve=True)  # noqa: E731
    ran = expert(cfg)
    recipe = expert(compose_train([FINETUNE]))
    settings = ", ".join(f"{k} {ran[k] if ran[k] is not None else 'every field'}" for k in EXPERT_SETTINGS)
    changed = [f"{k} {ran[k]} instead of {recipe[k] if recipe[k] is not None else 'every field'}"
               for k in EXPERT_SETTINGS if ran[k] != recipe[k]]
    text = f"Fine-tuned encoder expert as run: {settings}."
    if changed:
        text += (f" **Reduced from the GPU recipe** (conf/model/text_finetune.yaml) to fit a {device.upper()}: "
                 + "; ".join(changed) + ". Its numbers are this reduced recipe's, not the full recipe's.")
    return text


METRICS = {"pearson": "r", "spearman": "rho", "mse": "MSE", "qwk": "QWK", "macro_f1": "macro-F1"}
WON_ON = ("pearson", "spearman", "qwk")


def summary_table(folds: dict[str, list[dict]], seconds: dict[str, list[float]], device: str = "cpu",
                  labels: dict[str, str] | None = None, unmeasured: dict[str, str] | None = None) -> str:
    """Every recipe's model and the baselines (from the default recipe's runs; every recipe fits the
    same ones on the same rows), mean ± std over folds, and a row per recipe not run (`unmeasured`:
    label -> why); per recipe, against each recipe above it (DISPLAY order) and each baseline, whether
    it wins on the means of r, rho and QWK and on how many folds; the experts' stack weights; seconds
    per fold."""
    default = folds["default"]
    labels = labels or RECIPES
    folds = {name: folds[name] for name in DISPLAY if name in folds}
    rows = {labels[name]: [f["model"]["rating"] for f in runs] for name, runs in folds.items()}
    rows.update({name: [f["baselines"][name]["rating"] for f in default] for name in default[0]["baselines"]})
    mean = {row: {m: float(np.mean([v[m] for v in values])) for m in METRICS} for row, values in rows.items()}
    lines = ["| | " + " | ".join(METRICS.values()) + " |", "|---" * (len(METRICS) + 1) + "|"]
    for row, values in rows.items():
        cells = [f"{mean[row][m]:.3f} ± {np.std([v[m] for v in values], ddof=1):.3f}" for m in METRICS]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    for row, why in (unmeasured or {}).items():
        lines.append(f"| {row} | " + " | ".join(["unmeasured"] * len(METRICS)) + " |")
    lines.append("")
    lines += [f"{row}: {why}" for row, why in (unmeasured or {}).items()]
    models = [labels[name] for name in folds]
    for model in models:
        for other in rows:
            if other == model or (other in models and models.index(other) > models.index(model)):
                continue
            lines.append(f"{model} vs {other}: {wins(rows[model], rows[other], mean[model], mean[other])}")
    for name, runs in folds.items():
        stacks = [f.get("stack") or {} for f in runs]
        if any(stacks):
            lines.append(f"{labels[name]}, experts, mean over folds (stack weight; held-out r on the training rows; "
                         "fit seconds): " + "; ".join(
                             f"{expert} {np.mean([s[expert]['weight'] for s in stacks]):.2f}; "
                             f"{np.mean([s[expert]['held_out_r'] for s in stacks]):.3f}; "
                             f"{np.mean([s[expert].get('fit_seconds', np.nan) for s in stacks]):.1f}"
                             for expert in stacks[0]))
        at_end = [f"{expert} ({s[expert]['grid_end']} end, alpha {s[expert]['alpha']:g}, fold {k})"
                  for k, s in enumerate(stacks) for expert in s if s[expert].get("grid_end")]
        if any(stacks):
            lines.append(f"{labels[name]}, penalties at an end of the widened grid: "
                         + (f"{len(at_end)} of {sum(len(s) for s in stacks)} expert fits: " + "; ".join(at_end)
                            if at_end else f"none of {sum(len(s) for s in stacks)} expert fits"))
        lines.append(f"{labels[name]}, seconds per fold ({device.upper()}): "
                     + ", ".join(f"{s:.0f}" for s in seconds[name]))
    return "\n".join(lines)


def wins(model: list[dict], other: list[dict], model_mean: dict, other_mean: dict) -> str:
    """'wins' when the model's means of r, rho and QWK are all higher, with the folds won on each."""
    verdict = all(model_mean[m] > other_mean[m] for m in WON_ON)
    counts = ", ".join(f"{METRICS[m]} on {sum(a[m] > b[m] for a, b in zip(model, other))}/{len(model)}" for m in WON_ON)
    return f"{'wins' if verdict else 'does NOT win'} on mean r, rho and QWK (higher {counts} folds)"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
