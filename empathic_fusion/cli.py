"""The console scripts (`empathic-train`, `empathic-evaluate`, `empathic-extract`, `empathic-predict`,
`empathic-serve`).

Each is a Hydra app over the config tree inside the package (`empathic_fusion/conf`), so they work
the same from a source checkout (where `train.py` and friends are thin shims over these) and after a
plain `pip install`. An expected error (empathic_fusion/core/errors.py `UserError`: a dataset, a config
value, a file, the disk, a lock) ends a run with its message alone and exit status 1; `verbose=true` or
HYDRA_FULL_ERROR=1 show its traceback too. Any other exception is a bug and keeps its traceback.

Before a run starts: a mistyped setting (`model=tfm`, `data.dataset_dr=x`) is one message with a "did you
mean" (config/typos.py), and a checkpoint, dataset folder or table that a setting names but is not there
stops the run before torch is imported and before Hydra makes its folder (`InputCheck`, config/inputs.py).
Each script ends with a short "What now:" block: the run folder, the files to open, the next command.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import hydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

import empathic_fusion.config  # noqa: F401  (registers the config schemas in Hydra's ConfigStore)
import empathic_fusion.features  # noqa: F401  (declares the feature branches: their `features.<branch>` schemas)
import empathic_fusion.utils  # noqa: F401  (registers the project_root resolver)
from empathic_fusion.config.inputs import input_problems, swept_keys
from empathic_fusion.config.typos import readable_composition_errors
from empathic_fusion.core.errors import UserError

CONFIG_PATH = "conf"  # relative to this file: empathic_fusion/conf
log = logging.getLogger(__name__)


def fusion_models() -> str:
    """`${fusion_models:}`, the models of the paper grid (conf/experiment/es_story_share.yaml): every
    registered fusion model (conf/model/<name>.yaml), the paper's in its order, then the others by name.
    Resolved only when a sweep reads it, so torch is imported then and not before."""
    from empathic_fusion.models import list_models

    return ",".join(list_models("fusion"))


if not OmegaConf.has_resolver("fusion_models"):
    OmegaConf.register_new_resolver("fusion_models", fusion_models)


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


class InputCheck(Callback):
    """Hydra callback (conf/hydra/default.yaml): the files and folders the settings name are checked once the
    config is composed, before Hydra makes the run's (or sweep's) folder and before torch is imported. One
    that is missing ends the run with one message naming each setting, exit status 1 and nothing written.
    Hydra turns an exception of a callback into a warning and goes on, so this exits itself; there is no
    traceback to show (HYDRA_FULL_ERROR=1 and verbose=true print the same)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, ())

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, swept_keys(config))

    @staticmethod
    def _check(config: DictConfig, swept: Iterable[str]) -> None:
        problems = input_problems(config, swept)
        if problems:
            sys.stderr.write("\n".join(problems) + "\n")
            raise SystemExit(1)


def console_script(main: Callable[..., Any]) -> Callable[..., Any]:
    """A Hydra app as a console script: a mistyped setting stops it with one message (config/typos.py)."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> Any:
        with readable_composition_errors():
            return main(*args, **kwargs)

    return run


@contextmanager
def run_setup(cfg: DictConfig) -> Iterator[None]:
    """What every entry point does around its work: torch's CPU threads from the cores available now
    (`threads=N` or OMP_NUM_THREADS override; measured once per multirun in a process), third-party log
    noise off unless `verbose=true`, each data warning logged once, and their count at the end."""
    from empathic_fusion.utils.multirun import multirun_job
    from empathic_fusion.utils.run_output import data_warning_summary, reset_data_warnings, set_verbosity
    from empathic_fusion.utils.threads import configure_threads

    set_verbosity(cfg.verbose)
    job = multirun_job()
    configure_threads(cfg.threads, str(job.sweep.dir) if job is not None else None)
    reset_data_warnings()
    try:
        yield
    finally:
        summary = data_warning_summary()
        if summary:
            log.warning(summary)


@console_script
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="train")
def train(cfg: DictConfig) -> float | None:
    """Train one model (conf/train.yaml): `empathic-train model=tfn modality=v+t`. Returns
    cfg.optimized_metric (a validation metric) for sweepers such as hparams_search=optuna; a failing
    job of a multirun is recorded in the sweep folder instead of stopping the sweep."""
    from empathic_fusion.pipeline import train as train_run, train_summary
    from empathic_fusion.utils.multirun import run_job

    results: dict[str, Any] = {}

    def train_and_keep(c: DictConfig) -> dict[str, Any]:  # the results name the checkpoint for the block
        results.update(train_run(c))
        return results

    with user_errors(cfg), run_setup(cfg):
        value = run_job(train_and_keep, cfg)
    if results:  # not a sweep job that failed (recorded in the sweep folder)
        print(train_summary(cfg, results))
    return value


@console_script
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="evaluate")
def evaluate(cfg: DictConfig) -> None:
    """Evaluate a checkpoint (`ckpt_path=`), a sweep (`sweep_dir=`) or an LLM judge (conf/evaluate.yaml)."""
    from empathic_fusion.pipeline import evaluate as evaluate_run, evaluate_summary

    with user_errors(cfg), run_setup(cfg):
        evaluate_run(cfg)
    print(evaluate_summary(cfg))


@console_script
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="extract")
def extract(cfg: DictConfig) -> None:
    """Fill the feature store (conf/extract.yaml). Exits with status 1 when any session or branch
    failed (listed in the store's failure report); in a sharded multirun the sweep's end decides."""
    from empathic_fusion.features.command import extract_command

    with user_errors(cfg), run_setup(cfg):
        failed = extract_command(cfg)
    if failed:
        raise SystemExit(1)


@console_script
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="predict")
def predict(cfg: DictConfig) -> None:
    """Score new recordings or a new text table with a checkpoint (conf/predict.yaml). Exits with status 1
    when no row could be scored (the reasons are in predictions.csv)."""
    from empathic_fusion.scoring.command import run_predict

    with user_errors(cfg), run_setup(cfg):
        result = run_predict(cfg)
    print(result.summary())
    if result.scored == 0:
        raise SystemExit(1)


@console_script
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
