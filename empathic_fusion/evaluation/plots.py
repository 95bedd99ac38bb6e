"""Figures for a paper or a run page, drawn with matplotlib's Agg backend (no display needed).

Every function returns a Figure; `save_figure` writes a PNG and `log_figure` sends it to whatever
Lightning loggers are attached, when they can take images (TensorBoard, W&B, MLflow; CSV cannot).
Never pass a figure that shows participant ids to `log_figure`: remote loggers must not get them.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from empathic_fusion.dataset.scale import SELF_REPORT, RatingScale  # noqa: E402
from empathic_fusion.metrics import PAPER_SYMBOLS  # noqa: E402

log = logging.getLogger(__name__)


def _axis(scale: RatingScale) -> tuple[float, float]:
    """The scale with room for the jitter around the end ratings (half a point on 1-5)."""
    margin = scale.half_range / 4
    return scale.low - margin, scale.high + margin


def predicted_vs_true(predicted: np.ndarray, rated: np.ndarray, title: str = "Predicted vs self-rated empathy",
                      scale: RatingScale = SELF_REPORT) -> Figure:
    """Scatter of predictions against ratings (on `scale`) with the identity line; ratings jittered a little."""
    predicted, rated = np.asarray(predicted, float), np.asarray(rated, float)
    jitter = np.random.default_rng(0).uniform(-0.04, 0.04, len(rated)) * scale.half_range
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(rated + jitter, predicted, s=18, alpha=0.6, label=f"ratings (n = {len(rated)})")
    ax.plot((scale.low, scale.high), (scale.low, scale.high), "k--", lw=1, label="identity (perfect prediction)")
    ax.set(xlim=_axis(scale), ylim=_axis(scale), xlabel=f"self-rated empathy ({scale})",
           ylabel="predicted empathy", title=title)
    ax.set_aspect("equal")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def rating_distributions(first: np.ndarray, second: np.ndarray, labels: tuple[str, str] = ("self-rated", "predicted"),
                         title: str = "Distribution of empathy ratings", scale: RatingScale = SELF_REPORT) -> Figure:
    """Overlaid histograms of two sets of ratings on `scale` with their mean and std (like Figure 2 of
    "Talk, Listen, Connect", Roshanaei, Rezapour and Seif El-Nasr)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    width = scale.half_range / 8  # 0.25 on 1-5, centred on the integer ratings
    bins = np.arange(scale.low - width / 2, scale.high + width, width)
    for values, label, color in zip((first, second), labels, ("tab:blue", "tab:orange")):
        values = np.asarray(values, float)
        ax.hist(values, bins=bins, alpha=0.5, color=color, density=True,
                label=f"{label} (mean {values.mean():.2f}, std {values.std(ddof=1) if len(values) > 1 else 0:.2f})")
        ax.axvline(values.mean(), color=color, ls="--", lw=1)
    ax.set(xlabel=f"empathy ({scale})", ylabel="density", title=title, xlim=_axis(scale))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def per_participant_r(breakdown: pd.DataFrame, title: str = "Pearson r per test participant") -> Figure:
    """Bars of each participant's r (rating level), sorted; undefined r (constant ratings) hatched at 0."""
    data = breakdown.sort_values("pearson").reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(data) + 2), 4.5))
    colors = ["tab:green" if r >= 0 else "tab:red" for r in data["pearson"]]
    bars = ax.bar(range(len(data)), data["pearson"], color=colors)
    for bar, defined in zip(bars, data["r_defined"]):
        if not defined:
            bar.set(hatch="//", facecolor="lightgrey", edgecolor="grey", height=0.02)
    ax.set_xticks(range(len(data)), [f"{p}\n(n={n})" for p, n in zip(data["participant_id"], data["n"])],
                  rotation=90, fontsize=7)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(ylim=(-1.05, 1.05), ylabel="Pearson r (per rating)", title=title,
           xlabel="participant (n = ratings); grey hatched: r undefined (constant ratings)")
    fig.tight_layout()
    return fig


def empathy_timeline(curves: dict[str, tuple[np.ndarray, np.ndarray]], rated: dict[str, float] | None = None,
                     masks: dict[str, np.ndarray] | None = None, fps: float = 15.0, xlabel: str = "time (s)",
                     title: str = "Predicted empathy over time", scale: RatingScale = SELF_REPORT) -> Figure:
    """Predicted empathy per window (one line per curve, on `scale`), each curve's self-rating as a dashed
    line of its colour, and per-frame masks (e.g. face found, speech) as strips beneath."""
    masks = {k: np.asarray(v, bool) for k, v in (masks or {}).items() if v is not None}
    heights = [3.0] + [0.35] * len(masks)
    fig, axes = plt.subplots(1 + len(masks), 1, figsize=(8, sum(heights) + 1.0), sharex=bool(masks),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    ax = axes[0, 0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (label, (x, y)) in enumerate(curves.items()):
        color = colors[k % len(colors)]
        ax.plot(x, y, "o-" if len(x) < 40 else "-", ms=3, color=color, label=f"{label}: predicted")
        if rated and np.isfinite(rated.get(label, np.nan)):
            ax.axhline(rated[label], color=color, ls="--", lw=1, label=f"{label}: self-rated {rated[label]:g}")
    margin = scale.half_range / 10  # 0.2 on 1-5
    ax.set(ylim=(scale.low - margin, scale.high + margin), ylabel=f"empathy ({scale})", title=title)
    ax.legend(fontsize=7, loc="upper right")
    for row, (name, mask) in enumerate(masks.items(), start=1):
        strip = axes[row, 0]
        seconds = np.arange(len(mask) + 1) / fps
        strip.pcolormesh(seconds, [0, 1], mask[None, :].astype(float), cmap="Greens", vmin=0, vmax=1.3,
                         shading="flat")
        strip.set_yticks([0.5], [name], fontsize=8)
    axes[-1, 0].set_xlabel(xlabel)
    fig.tight_layout()
    return fig


def session_timelines(window_table: pd.DataFrame, out_dir: Path | str, scale: RatingScale = SELF_REPORT) -> list[Path]:
    """One PNG per session: predicted empathy over each rated story's windows (on the rating `scale`) next
    to its self-rating.

    Local files only (they name sessions): never pass these figures to `log_figure`.
    """
    paths = []
    for session_id, session in window_table.groupby("session_id", sort=True):
        curves, rated = {}, {}
        for story_id, windows in session.groupby("story_id", sort=True):
            curves[story_id] = (np.arange(len(windows)), windows["predicted"].to_numpy())
            rated[story_id] = float(windows["rated"].iloc[0])
        fig = empathy_timeline(curves, rated, xlabel="window of the phase (in order, one per stride)",
                               title=f"Session {session_id}: predicted empathy per window", scale=scale)
        paths.append(save_figure(fig, Path(out_dir) / f"{session_id}.png"))
    return paths


def modality_ablation(summary: pd.DataFrame, metric: str = "pearson", scale: float = 100.0,
                      title: str | None = None) -> Figure:
    """Grouped bars: one group per model, one bar per modality subset, error bars = std over runs."""
    models = list(dict.fromkeys(summary["model"]))
    modalities = list(dict.fromkeys(summary["modality"]))
    width = 0.8 / max(len(modalities), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(models) + 2), 4))
    for k, modality in enumerate(modalities):
        part = summary[summary["modality"] == modality].set_index("model").reindex(models)
        x = np.arange(len(models)) + (k - (len(modalities) - 1) / 2) * width
        ax.bar(x, part[f"{metric}_mean"] * scale, width, yerr=part[f"{metric}_std"] * scale, capsize=2, label=modality)
    ax.set_xticks(range(len(models)), models, fontsize=8)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(ylabel=f"{PAPER_SYMBOLS.get(metric, metric)} (x{scale:g})",
           title=title or f"Modality ablation: {PAPER_SYMBOLS.get(metric, metric)}")
    ax.legend(title="modalities", fontsize=8, ncol=min(len(modalities), 5))
    fig.tight_layout()
    return fig


def save_figure(fig: Figure, path: Path | str, dpi: int = 120) -> Path:
    """Write a PNG and close the figure (figures are not kept alive between runs of a sweep)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def log_figure(loggers: Iterable, name: str, fig: Figure, step: int | None = None) -> list[str]:
    """Send a figure to every attached logger that takes images; returns the names of those that did."""
    sent = []
    for logger in loggers or []:
        kind = type(logger).__name__
        try:
            if kind == "TensorBoardLogger":
                logger.experiment.add_figure(name, fig, global_step=step or 0, close=False)
            elif kind == "WandbLogger":
                logger.log_image(key=name, images=[fig], step=step)
            elif kind == "MLFlowLogger":
                logger.experiment.log_figure(logger.run_id, fig, f"{name}.png")
            else:
                continue
        except Exception as error:  # a logger failing to take a figure must not lose the run's results
            log.warning("could not log figure %s to %s: %s", name, kind, error)
            continue
        sent.append(kind)
    return sent
