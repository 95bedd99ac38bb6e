"""Paper-style result tables (Tables 2/3 of EmpathicStories++): models x modality subsets x metrics,
runs of one cell (seeds, CV folds) aggregated to mean +- std, best per column bold, second underlined.

Written as Markdown (underline as <u>..</u>, which GitHub renders), LaTeX (booktabs) and CSV
(numbers only: one mean and one std column per metric, plus the number of runs).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from empathic_fusion.metrics import LOWER_IS_BETTER, METRIC_NAMES, PAPER_SYMBOLS

# Rows in the paper's order; unknown models and modality subsets follow alphabetically.
MODEL_DISPLAY = {"AMER": "AMER", "TFN": "TFN", "EFLSTM": "EF-LSTM", "LFLSTM": "LF-LSTM",
                 "StorySimilarity": "Story similarity (SBERT)", "MeanBaseline": "Train mean"}
MODALITY_ORDER = ("t", "v+a", "v+t", "a+t", "v+a+t", "v", "a")
LATEX_SYMBOLS = {"pearson": "$r$", "spearman": r"$\rho$", "accuracy": "Acc", "f1": "$F1$", "mse": "MSE",
                 "mae": "MAE", "ccc": "CCC"}


def model_display_name(target: str) -> str:
    """Paper name for a net's `_target_` (or class name); unknown classes keep their class name."""
    name = target.rsplit(".", 1)[-1]
    return MODEL_DISPLAY.get(name, name)


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
    model_rank = {v: i for i, v in enumerate(MODEL_DISPLAY.values())}
    summary["_m"] = summary["model"].map(lambda v: (model_rank.get(v, len(model_rank)), v))
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
    mean, std = summary.at[row, f"{metric}_mean"] * scale, summary.at[row, f"{metric}_std"] * scale
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}"


def to_markdown(summary: pd.DataFrame, metrics: tuple[str, ...] = METRIC_NAMES, scale: float = 100.0,
                decimals: int = 1) -> str:
    """Markdown table; the model name is printed on its first row only, as in the paper."""
    marks = rank_marks(summary, metrics, scale, decimals)
    arrows = {m: "↓" if m in LOWER_IS_BETTER else "↑" for m in metrics}
    lines = ["| Model | Modality | " + " | ".join(f"{PAPER_SYMBOLS[m]} ({arrows[m]})" for m in metrics) + " | runs |",
             "|---|---|" + "---|" * len(metrics) + "---|"]
    previous = None
    for row in summary.index:
        model = summary.at[row, "model"]
        cells = []
        for metric in metrics:
            text = _cell(summary, row, metric, scale, decimals)
            mark = marks.get((row, metric))
            cells.append(f"**{text}**" if mark == "best" else f"<u>{text}</u>" if mark == "second" else text)
        lines.append(f"| {model if model != previous else ''} | {summary.at[row, 'modality']} | "
                     + " | ".join(cells) + f" | {summary.at[row, 'n_runs']} |")
        previous = model
    return "\n".join(lines)


def to_latex(summary: pd.DataFrame, metrics: tuple[str, ...] = METRIC_NAMES, scale: float = 100.0,
             decimals: int = 1, caption: str = "") -> str:
    """A booktabs table (needs \\usepackage{booktabs}); bold best, underline second."""
    marks = rank_marks(summary, metrics, scale, decimals)
    arrows = {m: r"$\downarrow$" if m in LOWER_IS_BETTER else r"$\uparrow$" for m in metrics}
    lines = [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{ll" + "c" * len(metrics) + "}", r"\toprule",
             "Model & Modality & " + " & ".join(f"{LATEX_SYMBOLS[m]} ({arrows[m]})" for m in metrics) + r" \\",
             r"\midrule"]
    previous = None
    for row in summary.index:
        model = summary.at[row, "model"]
        if previous is not None and model != previous:
            lines.append(r"\midrule")
        cells = []
        for metric in metrics:
            text = _cell(summary, row, metric, scale, decimals).replace("±", r"\pm")
            mark = marks.get((row, metric))
            text = rf"\mathbf{{{text}}}" if mark == "best" else rf"\underline{{{text}}}" if mark == "second" else text
            cells.append(f"${text}$")
        modality = "$" + summary.at[row, "modality"].replace("+", " + ") + "$"
        name = model.replace("&", r"\&") if model != previous else ""
        lines.append(f"{name} & {modality} & " + " & ".join(cells) + r" \\")
        previous = model
    lines += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        lines.append(rf"\caption{{{caption}}}")
    lines.append(r"\end{table}")
    return "\n".join(lines)


def write_tables(summary: pd.DataFrame, out_stem: Path, metrics: tuple[str, ...] = METRIC_NAMES,
                 scale: float = 100.0, decimals: int = 1, caption: str = "") -> dict[str, Path]:
    """`<stem>.md`, `<stem>.tex` and `<stem>.csv` next to each other; returns their paths."""
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    paths = {ext: out_stem.with_suffix(f".{ext}") for ext in ("md", "tex", "csv")}
    paths["md"].write_text(to_markdown(summary, metrics, scale, decimals) + "\n")
    paths["tex"].write_text(to_latex(summary, metrics, scale, decimals, caption) + "\n")
    summary.to_csv(paths["csv"], index=False)
    return paths
