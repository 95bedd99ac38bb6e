"""One sweep job as Hydra runs it: the value a sweeper optimizes, and failures that do not stop a sweep.

Hydra's multirun stops at the first job that raises. `run_job` catches the error of a multirun
job instead, records it as `failures/<job number>.json` in the sweep folder (one file per job, so
jobs running in parallel on a cluster never write the same file) and returns None, which the Optuna
sweeper records as a failed trial. `FailureReport`, a Hydra callback, lists them all in
`failures.json` and the log when the sweep ends. A single run (no -m) still raises. `SweepSummary` ends a
training sweep with its folder and the command that turns it into tables.

`${shard_sweep:${shards},${shard}}` (the `shard_sweep` resolver, registered on import; Hydra imports this module
for the callback before it builds the sweeper) turns `shards=N` into the sweeper parameter
`shard=0/N,...,N-1/N`, so `extract.py -m shards=N` runs one job per shard.
"""
from __future__ import annotations

import json
import logging
import math
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

FAILURES_DIR = "failures"
FAILURES_FILE = "failures.json"
T = TypeVar("T")


def shard_sweep(count: int | None, shard: str | None = None) -> str:
    """The sweeper's value of `shard` for `shards=N`: one job per shard, '0/N,1/N,...,N-1/N'; without
    shards the run's own `shard` (null when unset), which an override on the command line replaces."""
    if count is None:
        return "null" if shard is None else str(shard)
    if int(count) < 1:
        raise ValueError(f"shards must be an integer >= 1, got {count}")
    return ",".join(f"{i}/{int(count)}" for i in range(int(count)))


if not OmegaConf.has_resolver("shard_sweep"):
    OmegaConf.register_new_resolver("shard_sweep", shard_sweep)


def metric_value(results: dict[str, Any], name: str | None) -> float | None:
    """The validation metric a sweeper optimizes: the best value the checkpoint callback saw when
    it monitors `name`, otherwise the last epoch's; test metrics are never returned."""
    if not name or results.get("skipped"):  # a grid cell the model cannot run has no metric
        return None
    if not name.startswith("val/"):
        raise ValueError(f"optimized_metric must be a validation metric (val/...), got '{name}'")
    best = results.get("best_validation", {})
    value = best.get(name, results.get("validation", {}).get(name))
    if value is None:
        raise KeyError(f"optimized_metric '{name}' was not logged; logged: {sorted(results.get('validation', {}))}")
    return float(value) if math.isfinite(float(value)) else None


def in_multirun() -> bool:
    """True inside a job of a multirun (-m), where a job's failure must not stop the sweep."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def multirun_job() -> DictConfig | None:
    """Hydra's config of this multirun job (its sweep folder, job number, overrides); None outside a multirun."""
    return HydraConfig.get() if in_multirun() else None


def failure_path(sweep_dir: Path | str, job_num: int) -> Path:
    """Where a sweep job's failure is recorded."""
    return Path(sweep_dir) / FAILURES_DIR / f"{int(job_num)}.json"


def record_failure(sweep_dir: Path, job_num: int, overrides: list[str], error: BaseException,
                   run_dir: Path | str | None = None) -> Path:
    """Write one failed job's overrides, error and run folder to the sweep folder."""
    path = failure_path(sweep_dir, job_num)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "job": job_num, "overrides": list(overrides), "error": f"{type(error).__name__}: {error}",
        "run_dir": None if run_dir is None else str(Path(run_dir).resolve()),
        "traceback": "".join(traceback.format_exception(error)),
    }, indent=1))
    return path


def failed_run_dirs(sweep_dir: Path | str) -> set[Path]:
    """The run folders of the jobs whose last run failed: what they hold is from an earlier run."""
    return {Path(r["run_dir"]) for r in collect_failures(Path(sweep_dir)) if r.get("run_dir")}


def run_job(task: Callable[[DictConfig], dict[str, Any]], cfg: DictConfig) -> float | None:
    """Run `task(cfg)` and return `cfg.optimized_metric` from its results; in a multirun a failing
    job is recorded and returns None so the other jobs still run."""
    return sweep_job(lambda c: metric_value(task(c), c.optimized_metric), cfg)


def sweep_job(task: Callable[[DictConfig], T], cfg: DictConfig) -> T | None:
    """Run `task(cfg)` and return what it returns; in a multirun a job that raises is recorded in the
    sweep folder and returns None, so the other jobs still run (a single run still raises)."""
    hydra_cfg = multirun_job()
    if hydra_cfg is not None:  # the sweep run again: this job's earlier failure record gives way to this run's outcome
        failure_path(hydra_cfg.sweep.dir, hydra_cfg.job.num).unlink(missing_ok=True)
    try:
        return task(cfg)
    except Exception as error:
        if hydra_cfg is None:
            raise
        path = record_failure(Path(hydra_cfg.sweep.dir), int(hydra_cfg.job.num),
                              list(hydra_cfg.overrides.task), error,
                              OmegaConf.select(hydra_cfg, "runtime.output_dir", default=None))
        log.error("job %s failed (%s: %s); recorded in %s, the sweep goes on",
                  hydra_cfg.job.num, type(error).__name__, error, path)
        return None


def collect_failures(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every recorded failure of a sweep, by job number."""
    folder = Path(sweep_dir) / FAILURES_DIR
    records = [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.is_dir() else []
    return sorted(records, key=lambda r: r["job"])


def write_failure_list(sweep_dir: Path | str) -> list[dict[str, Any]]:
    """`<sweep dir>/failures.json` from the jobs' failure records (removed when there are none: a list left by an
    earlier run of the sweep is gone with its failures); logs them and returns them."""
    sweep_dir = Path(sweep_dir)
    failures = collect_failures(sweep_dir)
    if not failures:
        (sweep_dir / FAILURES_FILE).unlink(missing_ok=True)
        return []
    summary = [{k: r[k] for k in ("job", "overrides", "error")} for r in failures]
    (sweep_dir / FAILURES_FILE).write_text(json.dumps(summary, indent=1))
    lines = "\n".join(f"  job {r['job']} ({' '.join(r['overrides'])}): {r['error']}" for r in summary)
    log.error("%d job(s) of the sweep failed (details in %s):\n%s", len(summary), sweep_dir / FAILURES_FILE, lines)
    return summary


class FailureReport(Callback):
    """At the end of a multirun, list the failed jobs in `<sweep dir>/failures.json` and the log."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        write_failure_list(Path(str(config.hydra.sweep.dir)))


class SweepSummary(Callback):
    """At the end of a training multirun (conf/train.yaml): the sweep folder and the evaluate.py command that
    makes its tables, after each job's own "What now:" block; then exit status 1 when any job failed (its
    record in failures.json), as extraction does, so a script or scheduler that started the sweep sees it."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from empathic_fusion.utils.run_output import shown, what_now

        sweep = Path(str(config.hydra.sweep.dir))
        sweep_dir = shown(str(sweep))
        failed = collect_failures(sweep)
        print(what_now([("sweep folder", f"{sweep_dir}  (a run folder per job: 0/, 1/, ...)"),
                        ("failed", f"{len(failed)} job(s): {shown(str(sweep / FAILURES_FILE))}" if failed else None),
                        ("next", f"empathic-evaluate sweep_dir={sweep_dir}")]))
        if failed:
            raise SystemExit(1)
