"""Tables and plots from a sweep directory (`python train.py -m ...`): one row per finished job,
cells aggregated over seeds and CV folds, written next to the jobs.

Every job of a sweep leaves `.hydra/config.yaml` and `test_metrics.json` in its folder (a job that failed
when the sweep last ran it is left out: what its folder holds is from an earlier run); jobs a
grid skipped (a baseline that cannot take a modality subset) leave `skipped.json` instead. Jobs whose
report holds the missing-modality summary (fusion models, `evaluation.missing_modalities`) also give
the robustness table: per model and modality subset, rating-level r with nothing missing, the relative
robustness to frames dropped at random and in blocks, and r relative to nothing missing with one
modality removed (docs/evaluation.md, "Missing modalities").
`PaperTablesCallback` runs `evaluate_sweep` when Hydra's multirun ends, so
`python train.py -m experiment=es_story_share` ends with the tables.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from empathic_fusion.core.errors import MissingFileError
from empathic_fusion.evaluation.tables import NO_REFERENCE, aggregate_runs, model_display_name, write_tables
from empathic_fusion.metrics import ALL_METRIC_NAMES, METRIC_NAMES, PAPER_SYMBOLS
from empathic_fusion.utils.multirun import collect_failures, failed_run_dirs
from empathic_fusion.utils.slurm_jobs import queue_states, sweep_jobs

log = logging.getLogger(__name__)
LEVELS = ("window", "rating")


def metrics_files(sweep_dir: Path, warn: bool = False) -> list[Path]:
    """The jobs' test_metrics.json, but for jobs that failed when the sweep last ran them (their folder holds
    an earlier run's results)."""
    failed = failed_run_dirs(sweep_dir)
    kept = []
    for metrics_file in sorted(sweep_dir.rglob("test_metrics.json")):
        if metrics_file.parent.resolve() not in failed:
            kept.append(metrics_file)
        elif warn:
            log.warning("%s failed when the sweep last ran it (%s); its test_metrics.json is from an earlier run "
                        "and is left out", metrics_file.parent, sweep_dir / "failures")
    return kept


def collect_runs(sweep_dir: Path | str) -> pd.DataFrame:
    """One row per (job, level): model, modality, seed, fold, scenario, run_dir and every metric."""
    sweep_dir = Path(sweep_dir)
    rows = []
    for metrics_file in metrics_files(sweep_dir, warn=True):
        job = metrics_file.parent
        config_file = job / ".hydra" / "config.yaml"
        if not config_file.exists():
            log.warning("%s has no .hydra/config.yaml; left out", job)
            continue
        cfg = OmegaConf.load(config_file)
        summary = json.loads(metrics_file.read_text())
        data = cfg.get("data", {})
        # the model, then the baselines a text run fits on the same fold (TF-IDF + ridge, ...)
        models = {model_display_name(cfg.model.net._target_): summary["model"], **summary.get("baselines", {})}
        for name, results in models.items():
            for level in LEVELS:
                if level not in results:
                    continue
                rows.append({"run_dir": str(job), "model": name, "baseline": name in summary.get("baselines", {}),
                             "modality": cfg.modality.short, "seed": cfg.get("seed"),
                             "fold": data.get("cv_fold") if data.get("cv_folds") else None,
                             "scenario": data.get("scenario", data.get("name", "story_share")), "level": level,
                             **{m: results[level].get(m, float("nan")) for m in ALL_METRIC_NAMES}})
    if not rows:
        raise MissingFileError(f"no finished runs (test_metrics.json with .hydra/config.yaml) under {sweep_dir}")
    return pd.DataFrame(rows)


ROBUSTNESS_COLUMNS = {"r_none": "r, nothing missing", "robustness_random": "relative robustness, random frames",
                      "robustness_block": "relative robustness, block of frames",
                      "relative_r_one_removed": "r / r(none), one modality removed (mean)",
                      "relative_r_worst_removed": "r / r(none), worst modality removed"}


def collect_robustness(sweep_dir: Path | str) -> pd.DataFrame:
    """One row per job whose report holds a missing-modality summary: model, modality, seed, fold and the
    rating-level `ROBUSTNESS_COLUMNS` (NaN where undefined: relative values need r(none) > 0; the removed
    ones need two modalities or more)."""
    rows = []
    for metrics_file in metrics_files(Path(sweep_dir)):
        missing = json.loads(metrics_file.read_text()).get("missing_modalities")
        config_file = metrics_file.parent / ".hydra" / "config.yaml"
        if not missing or not config_file.exists():
            continue
        cfg = OmegaConf.load(config_file)
        data = cfg.get("data", {})
        one = [entry["rating"]["relative_r"] for removed, entry in missing["removed"].items() if "+" not in removed]
        rows.append({"run_dir": str(metrics_file.parent), "model": model_display_name(cfg.model.net._target_),
                     "modality": cfg.modality.short, "seed": cfg.get("seed"),
                     "fold": data.get("cv_fold") if data.get("cv_folds") else None,
                     "r_none": missing["none"]["rating"]["pearson"],
                     "robustness_random": missing["robustness"]["random"]["rating"],
                     "robustness_block": missing["robustness"]["block"]["rating"],
                     "relative_r_one_removed": float(np.mean(one)) if one else float("nan"),
                     "relative_r_worst_removed": float(np.min(one)) if one else float("nan")})
    return pd.DataFrame(rows)


def robustness_table(runs: pd.DataFrame, decimals: int = 3) -> str:
    """Markdown: mean ± sd over the runs of each (model, modality) cell, NaN runs left out of each mean
    (how many runs a mean holds is in its cell when fewer than the cell's runs); a cell with no value says
    why when it is that r with nothing missing was never above 0."""
    lines = []
    for (model, modality), cell in runs.groupby(["model", "modality"], sort=False):
        row = {"Model": model, "Modality": modality}
        for column, title in ROBUSTNESS_COLUMNS.items():
            values = cell[column].dropna()
            if values.empty:
                relative = column != "r_none" and not (cell["r_none"] > 0).any()
                row[title] = NO_REFERENCE if relative else "n/a"
                continue
            sd = float(values.std(ddof=1)) if len(values) > 1 else 0.0
            row[title] = (f"{values.mean():.{decimals}f} ± {sd:.{decimals}f}"
                          + (f" ({len(values)} of {len(cell)})" if len(values) < len(cell) else ""))
        row["runs"] = len(cell)
        lines.append(row)
    return pd.DataFrame(lines).to_markdown(index=False, colalign=["left"] * (len(ROBUSTNESS_COLUMNS) + 3))


def skipped_runs(sweep_dir: Path | str) -> list[dict[str, Any]]:
    """The grid cells a sweep skipped, with the reason each job recorded."""
    return [json.loads(p.read_text()) for p in sorted(Path(sweep_dir).rglob("skipped.json"))]


def skip_incompatible_cell(cfg: DictConfig, out_dir: Path) -> dict[str, Any] | None:
    """In a grid sweep (`grid.skip_incompatible: true`), skip a model that needs a modality the cell lacks.

    A model config may list `needs: [text]` (story_similarity does). Outside such a grid nothing is
    skipped and the model's own error explains the mismatch. The job leaves `skipped.json`.
    """
    if not cfg.grid.skip_incompatible:
        return None
    lacking = sorted(set(cfg.model.get("needs") or []) - set(cfg.modality.names))  # text models have no `needs`
    if not lacking:
        return None
    entry = {"skipped": True, "model": model_display_name(cfg.model.net._target_), "modality": cfg.modality.short,
             "seed": cfg.seed, "reason": f"{model_display_name(cfg.model.net._target_)} needs {lacking}, "
                                                f"modality {cfg.modality.short} has {list(cfg.modality.names)}"}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "skipped.json").write_text(json.dumps(entry, indent=1))
    log.warning("skipped grid cell: %s", entry["reason"])
    return entry


def missing_jobs(sweep_dir: Path | str) -> list[dict[str, Any]]:
    """The sweep's jobs without results: each recorded failure, and each job a SLURM launch listed
    (`jobs.json`) whose run folder holds no results, with what SLURM's queue says of it."""
    sweep_dir = Path(sweep_dir)
    missing = {r["job"]: {"job": r["job"], "overrides": r["overrides"], "why": r["error"]}
               for r in collect_failures(sweep_dir)}
    unfinished = [j for j in sweep_jobs(sweep_dir) if j["job"] not in missing
                  and not any((sweep_dir / str(j["job"]) / name).is_file() for name in ("test_metrics.json", "skipped.json"))]
    states = queue_states([j["slurm_job_id"] for j in unfinished if j.get("slurm_job_id")]) if unfinished else {}
    for job in unfinished:
        state = (states or {}).get(job.get("slurm_job_id", ""))
        why = (f"still in SLURM's queue ({state[0]})" if state else
               f"no results: it ended without them (its log: {job.get('stderr', '?')})" if states is not None else
               f"no results (its log: {job.get('stderr', '?')})")
        missing[job["job"]] = {"job": job["job"], "overrides": job["overrides"], "why": why}
    return [missing[k] for k in sorted(missing)]


def missing_note(missing: list[dict[str, Any]]) -> str:
    """Markdown lines under a table: which jobs (cells) it lacks and why."""
    if not missing:
        return ""
    lines = [f"- job {m['job']} ({' '.join(m['overrides'])}): {m['why']}" for m in missing]
    return f"\nMissing from this table: {len(missing)} job(s) of the sweep have no results.\n\n" + "\n".join(lines) + "\n"


def evaluate_sweep(sweep_dir: Path | str, out_dir: Path | str | None = None,
                   metrics: tuple[str, ...] = METRIC_NAMES, scale: float = 100.0, decimals: int = 1,
                   plots: bool = True) -> dict[str, Any]:
    """Write `paper_table_<level>.{md,tex,csv}` (the markdown ends with the jobs that have no results, and why),
    `runs.csv`, (optionally) ablation plots and, when jobs hold a missing-modality summary, `robustness_table.md`
    and `robustness_runs.csv`; return the summaries, paths and missing jobs."""
    sweep_dir = Path(sweep_dir)
    out_dir = Path(out_dir) if out_dir else sweep_dir
    runs = collect_runs(sweep_dir)
    missing = missing_jobs(sweep_dir)
    note = missing_note(missing)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out_dir / "runs.csv", index=False)
    scenarios = sorted(runs["scenario"].unique())
    spread = "folds" if runs["fold"].notna().any() else "seeds"
    summaries, written = {}, {}
    for level in LEVELS:
        level_runs = runs[runs["level"] == level]
        if level_runs.empty:
            continue
        summary = aggregate_runs(level_runs, metrics)
        caption = (f"Empathy prediction ({', '.join(scenarios).replace('_', ' ')}), {level}-level, mean $\\pm$ std over {spread}; "
                   f"scores x{scale:g}; MSE on the rating scale. Best per column bold, second underlined.")
        written[level] = write_tables(summary, out_dir / f"paper_table_{level}", metrics, scale, decimals, caption)
        if note:
            with written[level]["md"].open("a") as table:
                table.write(note)
        summaries[level] = summary
        if plots:
            from empathic_fusion.evaluation.plots import modality_ablation, save_figure

            for metric in ("pearson", "mse"):
                save_figure(modality_ablation(summary, metric, scale,
                                              title=f"Modality ablation, {level}-level {PAPER_SYMBOLS[metric]} (mean ± std over {spread})"),
                            out_dir / f"ablation_{level}_{metric}.png")
    if spread == "folds":  # K-fold CV: check every participant had exactly one test turn
        from empathic_fusion.evaluation.cross_validation import coverage, out_of_fold_predictions

        own = runs[~runs["baseline"]]  # test_predictions.csv holds the job's model, not its baselines
        coverage(own).to_csv(out_dir / "cv_coverage.csv", index=False)
        out_of_fold_predictions(own).to_csv(out_dir / "cv_out_of_fold_predictions.csv", index=False)
    robustness, robustness_md = collect_robustness(sweep_dir), None
    if not robustness.empty:
        robustness.to_csv(out_dir / "robustness_runs.csv", index=False)
        robustness_md = out_dir / "robustness_table.md"
        robustness_md.write_text(
            f"Robustness to missing data (rating level, mean ± sd over {spread}; relative robustness: area under r "
            "over the missing rates / (r(0) x rate span), 1 = no loss):\n\n" + robustness_table(robustness) + "\n")
    skipped = skipped_runs(sweep_dir)
    for entry in skipped:
        log.info("skipped cell: %s", entry.get("reason"))
    log.info("tables written: %s", {k: str(v["md"]) for k, v in written.items()})
    return {"summaries": summaries, "paths": written, "runs": runs, "skipped": skipped, "robustness": robustness_md,
            "missing": missing}


class PaperTablesCallback(Callback):
    """Hydra callback: after a multirun, write the paper tables into the sweep directory and print them."""

    def __init__(self, metrics: list[str] | None = None, scale: float = 100.0, decimals: int = 1, plots: bool = True):
        self.metrics = tuple(metrics or METRIC_NAMES)
        self.scale, self.decimals, self.plots = scale, decimals, plots

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            result = evaluate_sweep(sweep_dir, None, self.metrics, self.scale, self.decimals, self.plots)
        except FileNotFoundError as error:
            log.warning("no tables: %s", error)
            return
        for level, paths in result["paths"].items():
            print(f"\n{level}-level results ({sweep_dir}):\n{paths['md'].read_text()}")
        if result["robustness"] is not None:
            print(f"\n{result['robustness'].read_text()}")
