"""Paper-style result tables (Tables 2/3 of EmpathicStories++): models x modality subsets x metrics,
runs of one cell (seeds, CV folds) aggregated to mean +- std, best per column bold, second underlined.

Written by pandas as Markdown (via tabulate; underline as <u>..</u>, which GitHub renders), LaTeX
(booktabs, via the Styler) and CSV (numbers only: one mean and one std column per metric, plus the
number of runs).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import pandas as pd

from empathic_fusion.metrics import LOWER_IS_BETTER, METRIC_NAMES, PAPER_SYMBOLS

NO_REFERENCE = "n/a (r(none) ≤ 0)"  # a ratio over r with nothing missing that is not above 0

# Rows in the paper's order (models: their registered `paper_rank`); other models and modality subsets follow
# alphabetically.
MODALITY_ORDER = ("t", "v+a", "v+t", "a+t", "v+a+t", "v", "a")
LATEX_SYMBOLS = {"pearson": "$r$", "spearman": r"$\rho$", "accuracy": "Acc", "f1": "$F1$", "mse": "MSE",
                 "mae": "MAE", "ccc": "CCC"}


def model_display_name(target: str) -> str:
    """Paper name for a net's `_target_` (or registered name), as its registration gives it; unknown classes
    keep their class name. (The models are imported when a name is asked for, not with this module: the
    sweep's tables callback loads without torch.)"""
    from empathic_fusion.models import display_name

    return display_name(target)


def _order(values: pd.Series, preferred: tuple[str, ...]) -> pd.Series:
    rank = {v: i for i, v in enumerate(preferred)}
    return values.map(lambda v: (rank.get(v, len(rank)), str(v)))


def aggregate_runs(runs: pd.DataFrame, metrics: tuple[str, ...] = METRIC_NAMES) -> pd.DataFrame:
    """One row per (model, modality): `<metric>_mean`, `<metric>_std` (sample std; 0 for one run), `n_runs`."""
    missing = [c for c in ("model", "modality", *metrics) if c not in runs.columns]
    if missing:
        raise ValueError(f"runs table lacks column(s) {missing}")
    if runs.empty:
        raise ValueError("no runs to aggregate")
    grouped = runs.groupby(["model", "modality"], sort=False)
    summary = grouped[list(metrics)].mean().add_suffix("_mean")
    std = grouped[list(metrics)].std(ddof=1).fillna(0.0).add_suffix("_std")
    summary = summary.join(std).join(grouped.size().rename("n_runs")).reset_index()
    from empathic_fusion.models import display_rank

    summary["_m"] = summary["model"].map(display_rank)
    summary["_s"] = _order(summary["modality"], MODALITY_ORDER)
    summary = summary.sort_values(["_m", "_s"]).drop(columns=["_m", "_s"]).reset_index(drop=True)
    columns = ["model", "modality"] + [f"{m}_{s}" for m in metrics for s in ("mean", "std")] + ["n_runs"]
    return summary[columns]


def rank_marks(summary: pd.DataFrame, metrics: tuple[str, ...], scale: float = 100.0,
               decimals: int = 1) -> dict[tuple[int, str], str]:
    """(row, metric) -> "best" | "second", comparing means as displayed (ties share the mark)."""
    marks: dict[tuple[int, str], str] = {}
    for metric in metrics:
        shown = (summary[f"{metric}_mean"] * scale).round(decimals)
        distinct = sorted(shown.unique(), reverse=metric not in LOWER_IS_BETTER)
        for label, value in zip(("best", "second"), distinct[:2]):
            for row in shown.index[shown == value]:
                marks[(row, metric)] = label
    return marks


def _cell(summary: pd.DataFrame, row: int, metric: str, scale: float, decimals: int) -> str:
    """mean ± std, or n/a where the runs have no value (e.g. level metrics without integer levels), not nan."""
    mean, std = summary.at[row, f"{metric}_mean"] * scale, summary.at[row, f"{metric}_std"] * scale
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}" if math.isfinite(mean) else "n/a"


def _display(summary: pd.DataFrame, metrics: tuple[str, ...], scale: float, decimals: int,
             cell: Callable[[str, str | None], str], header: Callable[[str], str],
             model_name: Callable[[str], str], modality_name: Callable[[str], str]) -> pd.DataFrame:
    """The table as shown: one text column per metric (`cell(text, mark)` marks best and second), the
    model named on its first row only, as in the paper."""
    marks = rank_marks(summary, metrics, scale, decimals)
    models = summary["model"].astype(str)
    shown = pd.DataFrame({"Model": [model_name(m) if m != previous else ""
                                    for m, previous in zip(models, [None, *models[:-1]])],
                          "Modality": [modality_name(str(m)) for m in summary["modality"]]}, index=summary.index)
    for metric in metrics:
        shown[header(metric)] = [cell(_cell(summary, row, metric, scale, decimals), marks.get((row, metric)))
                                 for row in summary.index]
    shown["runs"] = summary["n_runs"].astype(int)
    return shown


def to_markdown(summary: pd.DataFrame, metrics: tuple[str, ...] = METRIC_NAMES, scale: float = 100.0,
                decimals: int = 1) -> str:
    """Markdown table (pandas + tabulate); the model name is printed on its first row only, as in the paper."""
    arrows = {m: "↓" if m in LOWER_IS_BETTER else "↑" for m in metrics}
    shown = _display(summary, metrics, scale, decimals,
                     cell=lambda text, mark: f"**{text}**" if mark == "best" else f"<u>{text}</u>" if mark == "second" else text,
                     header=lambda m: f"{PAPER_SYMBOLS[m]} ({arrows[m]})", model_name=str, modality_name=str)
    return shown.to_markdown(index=False, colalign=("left", "left", *["right"] * (len(metrics) + 1)))


def to_latex(summary: pd.DataFrame, metrics: tuple[str, ...] = METRIC_NAMES, scale: float = 100.0,
             decimals: int = 1, caption: str = "") -> str:
    """A booktabs table (pandas Styler; needs \\usepackage{booktabs}); bold best, underline second."""
    arrows = {m: r"$\downarrow$" if m in LOWER_IS_BETTER else r"$\uparrow$" for m in metrics}

    def cell(text: str, mark: str | None) -> str:
        text = text.replace("±", r"\pm")
        return "$" + (rf"\mathbf{{{text}}}" if mark == "best" else rf"\underline{{{text}}}" if mark == "second" else text) + "$"

    shown = _display(summary, metrics, scale, decimals, cell=cell, header=lambda m: f"{LATEX_SYMBOLS[m]} ({arrows[m]})",
                     model_name=lambda m: m.replace("&", r"\&"),
                     modality_name=lambda m: "$" + m.replace("+", " + ") + "$")
    return shown.drop(columns="runs").style.hide(axis="index").to_latex(
        column_format="ll" + "c" * len(metrics), hrules=True, position="t", position_float="centering",
        caption=caption or None).rstrip("\n")


def write_tables(summary: pd.DataFrame, out_stem: Path, metrics: tuple[str, ...] = METRIC_NAMES,
                 scale: float = 100.0, decimals: int = 1, caption: str = "") -> dict[str, Path]:
    """`<stem>.md`, `<stem>.tex` and `<stem>.csv` next to each other; returns their paths."""
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    paths = {ext: out_stem.with_suffix(f".{ext}") for ext in ("md", "tex", "csv")}
    paths["md"].write_text(to_markdown(summary, metrics, scale, decimals) + "\n")
    paths["tex"].write_text(to_latex(summary, metrics, scale, decimals, caption) + "\n")
    summary.to_csv(paths["csv"], index=False)
    return paths
