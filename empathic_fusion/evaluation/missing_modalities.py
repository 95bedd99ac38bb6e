"""How a fusion model copes with missing data: its test split predicted again under conditions that
remove data before the forward pass (datamodules/missing.py), one inference pass each:

- each modality removed as a whole, and (with three modalities) each pair, so one is left;
- frames dropped at `evaluation.missing_rates`: independently at random per frame and modality
  (`random`), and as one contiguous block of round(rate x window length) frames per window and
  modality (`block`).

Per condition: Pearson r and MSE (on the rating scale, as in the main report) per window and per rating
(a rating's windows averaged, as the main report does) and r relative to r with nothing missing. Per kind of dropping, the relative robustness
is the area under r(rate) over the rates divided by r(0) x the span of the rates: 1 when nothing is
lost, 0.5 when r falls linearly to 0. It is the area under the performance-imperfection curve that
MultiBench (Liang et al., 2021, "MultiBench: Multiscale Benchmarks for Multimodal Representation
Learning") calls relative robustness, divided by r with nothing missing so that models of different r
compare. Relative values are NaN where r with nothing missing is not above 0 (test_metrics.json); the
tables print them as "n/a (r(none) ≤ 0)" (`relative_cell`).

Draws are reproducible: each condition has its own generator seeded from `evaluation.bootstrap_seed`,
the condition's kind and rate, and the test loader keeps its order, so a rerun drops the same frames.
Files: test_missing_modalities.csv (one row per condition) and .png (r against the missing rate; no
ids in it, so it also goes to the loggers); the markdown table joins test_metrics.md and the summary
test_metrics.json under "missing_modalities".
"""
from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from empathic_fusion.datamodules.missing import drop_frames_block, drop_frames_random, remove_modalities
from empathic_fusion.evaluation.plots import log_figure, save_figure
from empathic_fusion.evaluation.tables import NO_REFERENCE
from empathic_fusion.metrics import empathy_metrics
from empathic_fusion.models.predict import predict_split

KINDS = ("none", "random", "block", "removed")
DROPPING = ("random", "block")
LEVELS = ("window", "rating")
CSV_NAME = "test_missing_modalities.csv"
PLOT_NAME = "test_missing_modalities.png"


@dataclass(frozen=True)
class Condition:
    """What is missing: nothing, a fraction `rate` of frames (random or block), or whole modalities."""

    kind: str
    rate: float = 0.0
    removed: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        if self.kind == "removed":
            return "without " + "+".join(self.removed)
        return "none" if self.kind == "none" else f"{self.kind} {self.rate:g}"

    def seed(self, base: int) -> int:
        """The condition's own seed: the same draws whatever other conditions run."""
        words = [int(base), KINDS.index(self.kind), int(round(self.rate * 1_000_000)),
                 *(sum(ord(c) for c in m) for m in self.removed)]
        return int(np.random.SeedSequence(words).generate_state(1)[0])

    def apply(self, batch: dict, modalities: Sequence[str], generator: torch.Generator) -> dict:
        """The batch with this condition's data removed."""
        if self.kind == "random":
            return drop_frames_random(batch, modalities, self.rate, generator)
        if self.kind == "block":
            return drop_frames_block(batch, modalities, self.rate, generator)
        return remove_modalities(batch, self.removed)


def conditions(modalities: Sequence[str], rates: Sequence[float]) -> list[Condition]:
    """Nothing missing, frames dropped at each rate above 0 (random, block), then each modality and, with
    three modalities, each pair removed; never all modalities (with one, only the rate curves)."""
    found = [Condition("none")]
    found += [Condition(kind, float(rate)) for kind in DROPPING for rate in rates if rate > 0]
    for size in range(1, min(2, len(modalities) - 1) + 1):
        found += [Condition("removed", removed=tuple(c)) for c in itertools.combinations(modalities, size)]
    return found


def _transformed(loader: Iterable, condition: Condition, modalities: Sequence[str], seed: int) -> Iterator[dict]:
    generator = torch.Generator().manual_seed(condition.seed(seed))
    for batch in loader:
        yield batch if condition.kind == "none" else condition.apply(batch, modalities, generator)


def relative_cell(value: float, r_none: float, decimals: int = 3) -> str:
    """A value relative to r(none) (r / r(none), relative robustness) as a table prints it: the number, or
    why there is none instead of nan."""
    if math.isfinite(value):
        return f"{value:.{decimals}f}"
    return NO_REFERENCE if not r_none > 0 else "n/a"


def _scores(predictions: dict[str, torch.Tensor], half_range: float) -> dict[str, dict[str, float]]:
    with warnings.catch_warnings():  # a model that predicts a constant without its inputs has r 0 by design
        warnings.simplefilter("ignore")
        return {level: {k: v for k, v in empathy_metrics(predictions[f"{level}_pred"], predictions[f"{level}_target"],
                                                         half_range=half_range).items()
                        if k in ("pearson", "mse")} for level in LEVELS}


def evaluate_conditions(model: torch.nn.Module, loader: Iterable, modalities: Sequence[str],
                        rates: Sequence[float], seed: int = 0, half_range: float = 1.0) -> pd.DataFrame:
    """One row per condition: r and MSE (on the rating scale of `half_range`, the predictions being on the
    cosine scale) per window and per rating, and r relative to nothing missing."""
    rows = []
    for condition in conditions(modalities, rates):
        scores = _scores(predict_split(model, _transformed(loader, condition, modalities, seed)), half_range)
        rows.append({"condition": condition.name, "kind": condition.kind,
                     "rate": condition.rate if condition.kind != "removed" else float("nan"),
                     "removed": "+".join(condition.removed),
                     **{f"{level}_{k}": v for level in LEVELS for k, v in scores[level].items()}})
    table = pd.DataFrame(rows)
    for level in LEVELS:
        reference = float(table.loc[0, f"{level}_pearson"])
        table[f"{level}_relative_r"] = table[f"{level}_pearson"] / reference if reference > 0 else float("nan")
    return table


def rate_curve(table: pd.DataFrame, kind: str, level: str) -> tuple[np.ndarray, np.ndarray]:
    """(rates, r) of one kind of dropping, from rate 0 (nothing missing) up."""
    rows = table[table["kind"].isin(["none", kind])]
    return rows["rate"].to_numpy(float), rows[f"{level}_pearson"].to_numpy(float)


def relative_robustness(rates: np.ndarray, r: np.ndarray) -> float:
    """Area under r(rate) (trapezoids) / (r(0) x (last rate - first)): 1 = no loss; NaN unless r(0) > 0
    and there are two rates or more."""
    span = float(rates[-1] - rates[0]) if len(rates) else 0.0
    if len(rates) < 2 or span <= 0 or not r[0] > 0:
        return float("nan")
    area = float(np.sum((r[1:] + r[:-1]) / 2 * np.diff(rates)))
    return area / (float(r[0]) * span)


def summarize(table: pd.DataFrame, modalities: Sequence[str], rates: Sequence[float], seed: int) -> dict[str, Any]:
    """The JSON summary: scores with nothing missing, per removed set and per rate; relative robustness."""
    def entry(row: pd.Series) -> dict[str, dict[str, float]]:
        return {level: {k: float(row[f"{level}_{k}"]) for k in ("pearson", "mse", "relative_r")} for level in LEVELS}

    rows = {kind: table[table["kind"] == kind] for kind in KINDS}
    return {"modalities": list(modalities), "rates": [float(r) for r in rates], "seed": int(seed),
            "none": entry(rows["none"].iloc[0]),
            "removed": {row["removed"]: entry(row) for _, row in rows["removed"].iterrows()},
            **{kind: {f"{row['rate']:g}": entry(row) for _, row in rows[kind].iterrows()} for kind in DROPPING},
            "robustness": {kind: {level: relative_robustness(*rate_curve(table, kind, level)) for level in LEVELS}
                           for kind in DROPPING}}


def markdown(table: pd.DataFrame, summary: dict[str, Any]) -> str:
    """The table of the report notes, with the relative robustness beneath it; a ratio without a reference
    (r(none) ≤ 0) says so instead of printing nan."""
    shown = table[["condition", "window_pearson", "window_mse", "rating_pearson", "rating_mse"]].copy()
    r_none = {level: float(summary["none"][level]["pearson"]) for level in LEVELS}
    shown["rating_relative_r"] = [relative_cell(v, r_none["rating"]) for v in table["rating_relative_r"]]
    shown = shown.rename(columns={"window_pearson": "window r", "window_mse": "window MSE",
                                  "rating_pearson": "rating r", "rating_mse": "rating MSE",
                                  "rating_relative_r": "rating r / r(none)"})
    rates = summary["rates"]
    robustness = "; ".join(f"{kind}: window {relative_cell(values['window'], r_none['window'])}, "
                           f"rating {relative_cell(values['rating'], r_none['rating'])}"
                           for kind, values in summary["robustness"].items())
    return ("Missing modalities (the test split again with data removed: whole modalities, or a fraction of "
            "frames at random or in one block per window; dropped frames are masked and zeroed; MSE on the "
            "rating scale):\n\n"
            + shown.to_markdown(index=False, floatfmt=".3f", colalign=["left"] + ["right"] * 5)
            + f"\n\nRelative robustness (area under r over missing rates {rates[0]:g}-{rates[-1]:g} / "
              f"(r(0) x {rates[-1] - rates[0]:g}); 1 = no loss): {robustness}")


def robustness_figure(table: pd.DataFrame, title: str = "Test r with missing data"):
    """r against the missing rate (random, block) per window and per rating; removed modalities as
    horizontal lines."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    removed = table[table["kind"] == "removed"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, level in zip(axes, LEVELS):
        for kind, style in zip(DROPPING, ("o-", "s--")):
            ax.plot(*rate_curve(table, kind, level), style, ms=4, label=f"frames dropped: {kind}")
        for k, (_, row) in enumerate(removed.iterrows()):
            ax.axhline(row[f"{level}_pearson"], ls=":", lw=1.2, color=colors[(k + 2) % len(colors)],
                       label=row["condition"])
        ax.axhline(0, color="k", lw=0.6)
        ax.set(xlabel="fraction of frames dropped", title=f"per {level}")
    axes[0].set_ylabel("Pearson r")
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def missing_modality_report(model: torch.nn.Module, loader: Iterable, modalities: Sequence[str], out_dir: Path,
                            evaluation: dict[str, Any], loggers: list | tuple = (),
                            half_range: float = 1.0) -> dict[str, Any]:
    """Evaluate every condition on the test `loader`, write the CSV (and the plot when
    `evaluation["plots"]`); returns {"summary": for test_metrics.json, "table": markdown}. `half_range`: the
    rating scale's, so that MSE is on it."""
    rates, seed = [float(r) for r in evaluation["missing_rates"]], int(evaluation["bootstrap_seed"])
    table = evaluate_conditions(model, loader, modalities, rates, seed, half_range)
    out_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(out_dir / CSV_NAME, index=False)
    summary = summarize(table, modalities, rates, seed)
    if evaluation.get("plots", True):
        fig = robustness_figure(table)
        log_figure(loggers, "test/missing_modalities", fig)  # scores only, no ids
        save_figure(fig, out_dir / PLOT_NAME)
    return {"summary": summary, "table": markdown(table, summary)}
