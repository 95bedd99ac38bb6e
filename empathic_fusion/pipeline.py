"""What train.py and evaluate.py run, kept out of the entry points so tests can call it."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from omegaconf import DictConfig, OmegaConf

from empathic_fusion.config import ConfigError, validate
from empathic_fusion.core.errors import MissingFileError
from empathic_fusion.evaluation.groups import check_groups
from empathic_fusion.evaluation.report import module_report
from empathic_fusion.evaluation.sweep import evaluate_sweep, skip_incompatible_cell
from empathic_fusion.datamodules.protocol import EmpathyData
from empathic_fusion.datamodules.setup_cache import sweep_scope
from empathic_fusion.datamodules.build import build_datamodule, set_up
from empathic_fusion.models.base import build_module
from empathic_fusion.models.checkpoints import check_resumable, load_module
from empathic_fusion.utils.job_timings import TimingCallback, job_timings, timed
from empathic_fusion.utils.multirun import multirun_job, write_failure_list
from empathic_fusion.utils.loggers import finish_loggers, log_run_metadata, run_metadata
from empathic_fusion.utils.preemption import job_ended_well
from empathic_fusion.utils.run_output import plot_list, shown, what_now

log = logging.getLogger(__name__)
RUN_CONFIG_KEYS = ("data", "features", "modality", "model", "evaluation", "seed")  # what a checkpoint keeps of its run
RESULTS_TABLE = "test_metrics.md"  # the test report's table (evaluation/report_parts.py)
NEW_DATA = {"dataset_dir": "<folder of new sessions>", "path": "<table of new texts>"}  # what predict scores


def _instantiate_all(group: DictConfig | None) -> list:
    if not group:
        return []
    return [hydra.utils.instantiate(c) for c in group.values() if isinstance(c, DictConfig) and "_target_" in c]


def run_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved parts of a run's config that its model keeps (checkpoint hyperparameters): what
    evaluate.py rebuilds the data from, and the evaluation settings used during training."""
    return {key: _container(cfg[key]) for key in RUN_CONFIG_KEYS}


def build_model(cfg: DictConfig, data_info: dict[str, Any]):
    """The LightningModule `cfg.model` names, for data described by `data_info` (the datamodule's
    fitted_state()): the one construction of every model."""
    return build_module(_container(cfg.model), data_info, run_config(cfg))


def build_run(cfg: DictConfig, extra_callbacks: list[L.Callback] | None = None
              ) -> tuple[EmpathyData, L.LightningModule, L.Trainer]:
    """The run's trainer, its datamodule set up for fitting and the model built from it.

    The trainer comes first: the datamodule places its frame arrays by the device the run trains on
    (`data.frames=auto`: in a GPU's memory when they fit), which it reads from the trainer it is
    attached to; the model needs the datamodule's input dims, so it comes last."""
    with timed("setup/trainer"):
        loggers = _instantiate_all(cfg.logger)
        callbacks = _instantiate_all(cfg.callbacks) + list(extra_callbacks or [])
        trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    with timed("setup/data"):
        datamodule = build_datamodule(_container(cfg.data), _container(cfg.features), list(cfg.modality.names))
        set_up(datamodule, trainer, "fit")
    with timed("setup/model"):
        model = build_model(cfg, datamodule.fitted_state())
    if cfg.test:
        check_groups(model, datamodule, _container(cfg.evaluation))  # an unknown attribute fails before training
    return datamodule, model, trainer


def train(cfg: DictConfig, extra_callbacks: list[L.Callback] | None = None) -> dict[str, Any]:
    """Prepare data, train (continuing a killed run from its last.ckpt), test the best checkpoint.

    Returns the test results plus `validation` (the last epoch's val/ metrics), `best_validation`
    (the checkpoint monitor's best value) and `global_step`, so a sweeper can optimize a validation
    metric (empathic_fusion/utils/multirun.py). Loggers get the resolved config, git commit, split hash and
    feature-store manifest hash; a W&B run is closed when the job ends, also when it fails.
    `extra_callbacks` are added to the configured ones (for programmatic use). Where the job's time went is
    written to the run folder's timings.json (empathic_fusion/utils/job_timings.py).
    """
    validate(cfg)
    L.seed_everything(cfg.seed, workers=True)
    out_dir = Path(cfg.paths.output_dir)
    if (skipped := skip_incompatible_cell(cfg, out_dir)) is not None:  # a sweep grid cell the model cannot run
        return skipped
    job = multirun_job() if cfg.grid.share_setup else None  # a multirun's jobs share their data's set-up
    sweep = (str(job.sweep.dir), str(job.job.num)) if job is not None else (None, "")
    with job_timings(out_dir) as timings, sweep_scope(*sweep):
        return _train(cfg, out_dir, [TimingCallback(timings), *(extra_callbacks or [])])


def _train(cfg: DictConfig, out_dir: Path, extra_callbacks: list[L.Callback]) -> dict[str, Any]:
    datamodule, model, trainer = build_run(cfg, extra_callbacks)
    loggers = trainer.loggers
    log.info("data: %s", datamodule.describe())
    failed = True
    try:
        log_run_metadata(loggers, run_metadata(cfg, datamodule.describe()), out_dir)
        if cfg.train:
            # weights_only=False: a text run's checkpoint holds fitted vocabularies and ridge coefficients
            resume = resolve_ckpt_path(cfg.ckpt_path, trainer)
            if resume is not None:
                check_resumable(resume, model)
            trainer.fit(model, datamodule=datamodule, ckpt_path=resume, weights_only=False)
        validation = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        checkpoint = trainer.checkpoint_callback
        best_validation = ({checkpoint.monitor: float(checkpoint.best_model_score)}
                           if checkpoint is not None and checkpoint.monitor and checkpoint.best_model_score is not None
                           else {})
        results: dict[str, Any] = {}
        if cfg.test:
            best = checkpoint.best_model_path if checkpoint else ""
            with timed("test"):  # its test_steps, and the best checkpoint's loading around them
                trainer.test(model, datamodule=datamodule, ckpt_path=best or None, weights_only=False)
            if trainer.is_global_zero:  # under DDP every process has the gathered predictions; one reports
                on_run_device(model, trainer)
                with timed("report"):
                    results = module_report(model, datamodule, out_dir, _container(cfg.evaluation), trainer.loggers)
            results["best_checkpoint"] = best
        results.update(validation=validation, best_validation=best_validation, global_step=trainer.global_step)
        if cfg.train and cfg.test:  # nothing left to resume: a grid removes last.ckpt (callbacks.preemption)
            job_ended_well(trainer)
        failed = False
    finally:
        finish_loggers(trainer.loggers, failed)
    return results


def train_summary(cfg: DictConfig, results: dict[str, Any]) -> str:
    """What train.py prints last: the run folder, its best checkpoint, the results table, whether the model
    failed the report's sanity check, the plots and the empathic-predict command that scores new data with it
    (a run folder stands for its best checkpoint)."""
    run_dir = Path(cfg.paths.output_dir)
    best = results.get("best_checkpoint")
    saved = any((run_dir / "checkpoints").glob("*.ckpt"))
    checkpoint = (f"{shown(best)}  (pass it as ckpt_path=)" if best else
                  f"{shown(run_dir / 'checkpoints')}/  (ckpt_path=<run folder> takes its best)" if saved else None)
    data_key = "dataset_dir" if "dataset_dir" in cfg.data else "path"
    table = run_dir / RESULTS_TABLE
    failed = (results.get("sanity") or {}).get("message")  # the report's sanity check (evaluation/report_parts.py)
    return what_now([
        ("run folder", shown(run_dir)), ("checkpoint", checkpoint),
        ("results", shown(table) if table.is_file() else None),
        ("sanity", "the model does not beat the constant training mean at the rating level; "
                   f"{RESULTS_TABLE} says how" if failed else None), ("plots", plot_list(run_dir)),
        ("next", f"empathic-predict ckpt_path={shown(run_dir)} data.{data_key}={NEW_DATA[data_key]}"
                 if checkpoint else None)])


def resolve_ckpt_path(ckpt_path: str | None, trainer: L.Trainer) -> str | None:
    """Where fit continues from. `last` or null: the run folder's last.ckpt when it exists (a job
    killed or requeued into the same folder resumes on its own); null also leaves Lightning's SLURM
    `hpc_ckpt_*.ckpt` to Lightning. A path: that checkpoint, which must exist."""
    if ckpt_path not in (None, "last"):
        if not Path(ckpt_path).is_file():
            raise MissingFileError(f"ckpt_path={ckpt_path} does not exist")
        return str(ckpt_path)
    if ckpt_path is None and list(Path(trainer.default_root_dir).glob("hpc_ckpt_*.ckpt")):
        return None  # Lightning restores its own SLURM requeue checkpoint
    dirs = {Path(cb.dirpath) for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)}
    found = sorted((d / "last.ckpt" for d in dirs if (d / "last.ckpt").is_file()), key=lambda p: p.stat().st_mtime)
    if found:
        log.info("resuming from %s", found[-1])
        return str(found[-1])
    if ckpt_path == "last":
        log.warning("ckpt_path=last but no last.ckpt in %s: training from scratch", sorted(map(str, dirs)))
    return None


def _container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Evaluate one checkpoint (`ckpt_path`) on the data it was trained on, or a sweep directory
    (`sweep_dir`) into paper tables; data.* overrides apply to a checkpoint's data."""
    validate(cfg)
    judge = cfg.judge is not None  # the optional config group judge=llm_judge
    if bool(cfg.ckpt_path) + bool(cfg.sweep_dir) + judge != 1:
        raise ConfigError(["give exactly one of ckpt_path=<file.ckpt>, sweep_dir=<multirun folder> or "
                           "judge=llm_judge (with +data=<text data>)"])
    out_dir = Path(cfg.paths.output_dir)
    if cfg.sweep_dir:  # the tables and the failure list into the sweep folder, as when the sweep ended
        tables = cfg.tables
        write_failure_list(cfg.sweep_dir)
        result = evaluate_sweep(cfg.sweep_dir, cfg.out_dir or cfg.sweep_dir, tuple(tables.metrics),
                                float(tables.scale), int(tables.decimals), bool(tables.plots))
        for level, paths in result["paths"].items():
            print(f"\n{level}-level results ({cfg.sweep_dir}):\n{paths['md'].read_text()}")
        if result["robustness"] is not None:
            print(f"\n{result['robustness'].read_text()}")
        return result
    if judge:
        from empathic_fusion.evaluation.judge_report import evaluate_judge

        return evaluate_judge(cfg, out_dir)
    evaluation = _container(cfg.evaluation)
    if cfg.split == "val" and evaluation["threshold"] == "validation":
        raise ConfigError(["evaluation.threshold=validation chooses the cutoff on the validation split; "
                           "scoring that same split with it would be optimistic: use split=test or threshold=fixed"])
    model = load_module(cfg.ckpt_path)
    trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, logger=False)  # first: it places the data
    datamodule = model.evaluation_datamodule(_container(cfg.data), _container(cfg.features), cfg.split,
                                             cfg.test_csv, trainer=trainer)
    trainer.test(model, datamodule=datamodule)
    on_run_device(model, trainer)
    return module_report(model, datamodule, out_dir, evaluation)


def evaluate_summary(cfg: DictConfig) -> str:
    """What evaluate.py prints last: the run folder, the tables it wrote (test_metrics.md, or a sweep's
    paper tables in out_dir) and the plots."""
    run_dir = Path(cfg.paths.output_dir)
    out = Path(cfg.out_dir) if cfg.out_dir else run_dir  # the run's folder itself, unless hydra.run.dir was set too
    tables = sorted(out.glob("*.md"), key=lambda p: (p.name != RESULTS_TABLE, p.name))
    return what_now([("run folder", shown(run_dir)), ("results", ", ".join(shown(t) for t in tables) or None),
                     ("plots", plot_list(out, None if out == run_dir else shown(out)))])


def on_run_device(model: L.LightningModule, trainer: L.Trainer) -> None:
    """The model back on the device it was tested on: Lightning returns it to the CPU after testing, and
    the report's passes (validation predictions, the missing-modality conditions) read batches that the
    datamodule gathers on that device."""
    model.to(trainer.strategy.root_device)
