"""The console scripts (`empathic-train`, `empathic-evaluate`, `empathic-extract`, `empathic-predict`,
`empathic-serve`).

Each is a Hydra app over the config tree inside the package (`empathic_fusion/conf`), so they work
the same from a source checkout (where `train.py` and friends are thin shims over these) and after a
plain `pip install`. An expected error (empathic_fusion/core/errors.py `UserError`: a dataset, a config
value, a file, the disk, a lock) ends a run with its message alone and exit status 1; `verbose=true` or
HYDRA_FULL_ERROR=1 show its traceback too. Any other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

import hydra
from omegaconf import DictConfig

import empathic_fusion.config  # noqa: F401  (registers the config schemas in Hydra's ConfigStore)
import empathic_fusion.utils  # noqa: F401  (registers the project_root resolver)
from empathic_fusion.core.errors import UserError

CONFIG_PATH = "conf"  # relative to this file: empathic_fusion/conf
log = logging.getLogger(__name__)


def traceback_wanted(cfg: DictConfig) -> bool:
    """Whether an expected error shows its traceback: `verbose=true`, or HYDRA_FULL_ERROR=1 (read as Hydra
    reads it)."""
    return bool(cfg.get("verbose", False)) or os.environ.get("HYDRA_FULL_ERROR") == "1"


@contextmanager
def user_errors(cfg: DictConfig) -> Iterator[None]:
    """Inside a Hydra task function, before Hydra's own handler (which prints "Error executing job" and a
    traceback): an expected error is logged as its message alone and the process exits with status 1.
    With `verbose=true` or HYDRA_FULL_ERROR=1 it goes on to Hydra, traceback and all, and so does any
    other exception (a bug). A multirun job's error is the sweep's (utils/multirun.py records a failed
    train or extract job and the sweep goes on), so it is passed on there too."""
    from empathic_fusion.utils.multirun import in_multirun

    try:
        yield
    except UserError as error:
        if traceback_wanted(cfg) or in_multirun():
            raise
        log.error("%s", error)
        raise SystemExit(1) from None


@contextmanager
def run_setup(cfg: DictConfig) -> Iterator[None]:
    """What every entry point does around its work: torch's CPU threads from the cores available now
    (`threads=N` or OMP_NUM_THREADS override), third-party log noise off unless `verbose=true`, each
    data warning logged once, and their count at the end."""
    from empathic_fusion.utils.run_output import data_warning_summary, reset_data_warnings, set_verbosity
    from empathic_fusion.utils.threads import configure_threads

    set_verbosity(cfg.verbose)
    configure_threads(cfg.threads)
    reset_data_warnings()
    try:
        yield
    finally:
        summary = data_warning_summary()
        if summary:
            log.warning(summary)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="train")
def train(cfg: DictConfig) -> float | None:
    """Train one model (conf/train.yaml): `empathic-train model=tfn modality=v+t`. Returns
    cfg.optimized_metric (a validation metric) for sweepers such as hparams_search=optuna; a failing
    job of a multirun is recorded in the sweep folder instead of stopping the sweep."""
    from empathic_fusion.pipeline import train as train_run
    from empathic_fusion.utils.multirun import run_job

    with user_errors(cfg), run_setup(cfg):
        return run_job(train_run, cfg)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="evaluate")
def evaluate(cfg: DictConfig) -> None:
    """Evaluate a checkpoint (`ckpt_path=`), a sweep (`sweep_dir=`) or an LLM judge (conf/evaluate.yaml)."""
    from empathic_fusion.pipeline import evaluate as evaluate_run

    with user_errors(cfg), run_setup(cfg):
        evaluate_run(cfg)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="extract")
def extract(cfg: DictConfig) -> None:
    """Fill the feature store (conf/extract.yaml). Exits with status 1 when any session or branch
    failed (listed in the store's failure report); in a sharded multirun the sweep's end decides."""
    from empathic_fusion.features.command import extract_command

    with user_errors(cfg), run_setup(cfg):
        failed = extract_command(cfg)
    if failed:
        raise SystemExit(1)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="predict")
def predict(cfg: DictConfig) -> None:
    """Score new recordings or a new text table with a checkpoint (conf/predict.yaml). Exits with status 1
    when no row could be scored (the reasons are in predictions.csv)."""
    from empathic_fusion.scoring.command import run_predict

    with user_errors(cfg), run_setup(cfg):
        result = run_predict(cfg)
    if result.scored == 0:
        raise SystemExit(1)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="serve")
def serve(cfg: DictConfig) -> None:
    """The Gradio app (conf/serve.yaml): a Text tab, a Clip tab, or both; a run folder serves its best checkpoint."""
    from empathic_fusion.app.ui import build_app, launch, models_from_config
    from empathic_fusion.utils.run_output import set_verbosity
    from empathic_fusion.utils.threads import configure_threads

    with user_errors(cfg):
        set_verbosity(cfg.verbose)
        configure_threads(cfg.threads)
        text, clip = models_from_config(cfg)
        for model in (text, clip):
            if model is not None:
                print(f"serving {model.card.kind} model {model.ckpt_path}")
        print(f"flags -> {cfg.flag_csv}; Ctrl+C stops")
        launch(build_app(text, clip, cfg.flag_csv), cfg.host, cfg.port, max_upload_mb=cfg.max_upload_mb)
