"""The model card each tab of the app shows: which model and checkpoint, the data it was trained on,
the test metrics of the run that produced it, when and from which commit, and how far to trust a score.

Everything comes from the checkpoint (its header `checkpoint["empathic_fusion"]`, its hyperparameters)
and from the run folder beside it (`<run>/checkpoints/x.ckpt` -> `<run>/test_metrics.json`,
`<run>/run_info.json`), never from the data folder, which may not be on the serving machine.

Test MSE is shown on the label (rating) scale, named beside it. A model whose test report says it does
not beat the constant training mean (evaluation/report_parts.py `sanity_check`) has that sentence on its card.
Scores are clipped to the label scale of the training data (the page says when a raw score fell
outside it). The interval shown with a score is the run's split-conformal interval (the test report's
"intervals", empathic_fusion/evaluation/conformal.py): the score +- a half-width calibrated on the
validation split's residuals, so that it holds the rating of about the nominal share (90% by default) of
new items like those; it is the same width for every input, a statement over items, not about one
input. A run whose test report predates the intervals shows none, and says so.
"""
from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from empathic_fusion.dataset.scale import recorded_scale
from empathic_fusion.evaluation.conformal import METHOD, ConformalInterval
from empathic_fusion.evaluation.report_parts import MSE_SCALE, sanity_check
from empathic_fusion.models.checkpoints import OpenedCheckpoint

FUSION_OUTPUT = "empathy"  # a fusion model's one output: a rating (its windows averaged)
FUSION_WINDOW = "empathy (per window)"  # the same output scored per window
NO_INTERVALS = ("no interval: the run recorded no conformal calibration (its test report predates it); retrain, "
                "or re-run its test with evaluate.py ckpt_path=<this checkpoint>")
BANNER = ("**Demo model.** It was trained on generated data ({name}): its scores show how the app works, "
          "not real empathy.")


def interval_bounds(value, half_width: float, scale: tuple[float, float] | None):
    """The interval value +- half_width, cut to the label scale when there is one (value: a number or an
    array of them)."""
    low, high = value - half_width, value + half_width
    if scale is not None:
        low, high = np.maximum(low, scale[0]), np.minimum(high, scale[1])
    return low, high


@dataclass(frozen=True)
class TestMetrics:
    """One output's test metrics; mse on the label (rating) scale."""

    r: float | None
    r_low: float | None = None
    r_high: float | None = None
    mse: float | None = None


@dataclass
class ModelCard:
    kind: str  # "text" or "fusion"
    model: str  # module class and net, e.g. "FusionModule: LFLSTM on video+audio+text"
    checkpoint: Path
    data: dict[str, Any]  # name, sessions/rows, labels, scale, generated (a datamodule's describe())
    test: dict[str, TestMetrics] = field(default_factory=dict)  # per output name
    confidence: float | None = None  # of the bootstrap CI
    metrics_source: str = ""  # where the test metrics were read
    metrics_note: str = ""  # e.g. the metrics are of another checkpoint of the run
    date: str = "unknown"
    commit: str = "unknown"
    intervals: dict[str, ConformalInterval] = field(default_factory=dict)  # per output name (conformal)
    interval_note: str = NO_INTERVALS  # why an output has no interval
    sanity: str | None = None  # the test report's sentence when the model does not beat the constant training mean

    @property
    def generated(self) -> bool:
        return bool(self.data.get("generated"))

    @property
    def scale(self) -> tuple[float, float] | None:
        scale = self.data.get("scale")
        return (float(scale[0]), float(scale[1])) if scale else None

    def banner(self) -> str | None:
        """The demo-model warning for a checkpoint trained on generated data, else None."""
        return BANNER.format(name=self.data.get("name") or "unnamed") if self.generated else None

    def clip(self, value: float) -> tuple[float, bool]:
        """The score clipped to the label scale, and whether the raw score was outside it."""
        if self.scale is None or not math.isfinite(value):
            return value, False
        low, high = self.scale
        return min(max(value, low), high), not low <= value <= high

    @property
    def coverage(self) -> float | None:
        """The nominal coverage of the recorded intervals (None: none recorded)."""
        return next(iter(self.intervals.values())).coverage if self.intervals else None

    def interval(self, output: str) -> float | None:
        """Half-width of this output's split-conformal interval on the label scale (inf: the whole
        scale, too few calibration items; None: no interval recorded, see `interval_note`)."""
        interval = self.intervals.get(output)
        return interval.half_width if interval is not None else None

    def interval_bounds(self, output: str, value):
        """(low, high) of the interval around a score (or an array of scores) of this output, cut to the
        label scale; None when the output has no recorded interval."""
        half_width = self.interval(output)
        return None if half_width is None else interval_bounds(value, half_width, self.scale)

    def markdown(self) -> str:
        data = self.data
        labels = ", ".join(data.get("labels") or []) or "unknown"
        scale = f"{self.scale[0]:g}-{self.scale[1]:g}" if self.scale else "unknown (scores are not clipped)"
        size = ", ".join(f"{data[k]} {k}" for k in ("rows", "sessions", "participants", "ratings") if data.get(k) is not None)
        lines = [f"**Model:** {self.model}", f"**Checkpoint:** `{self.checkpoint}`",
                 f"**Training data:** {data.get('name') or 'unknown'}" + (f" ({size})" if size else "")
                 + f"; label {labels}, scale {scale}" + ("; generated data" if self.generated else ""),
                 f"**Test metrics** ({self.metrics_source or 'none recorded'}): " + self._metrics_text()]
        if self.sanity:
            lines.append(f"**{self.sanity}**")
        if self.metrics_note:
            lines.append(f"*{self.metrics_note}*")
        lines.append(f"**Trained:** {self.date}, commit `{self.commit}`")
        lines.append("**Interval shown with a score:** " + self._interval_text())
        return "\n\n".join(lines)

    def _interval_text(self) -> str:
        if not self.intervals:
            return self.interval_note
        parts = "; ".join(f"{name} {interval.describe()}" for name, interval in self.intervals.items())
        return (f"{self.coverage:.0%} {METHOD} interval, calibrated on the validation split: {parts}. It holds "
                f"the rating of about {self.coverage:.0%} of new items like the validation split's, with the same "
                "width for every input (not how sure the model is about one input); data unlike the training "
                "data can break it")

    def _metrics_text(self) -> str:
        if not self.test:
            return "not recorded for this checkpoint (no test_metrics.json beside its run); no interval"
        level = f"{self.confidence:.0%} " if self.confidence else ""
        parts = []
        for name, m in self.test.items():
            r = "r n/a" if m.r is None else f"r {m.r:.3f}"
            if m.r is not None and m.r_low is not None and m.r_high is not None:
                r += f" ({level}bootstrap CI {m.r_low:.3f} to {m.r_high:.3f})"
            mse = f", MSE {m.mse:.3f}" if m.mse is not None else ""
            parts.append(f"{name}: {r}{mse}")
        scale = f" (MSE on the {self.scale[0]:g}-{self.scale[1]:g} scale of the labels)" if self.scale else ""
        return "; ".join(parts) + (scale if any(m.mse is not None for m in self.test.values()) else "")


# ---- reading a card from a checkpoint --------------------------------------------------------------

def run_folder(ckpt_path: Path) -> Path:
    """<run>/checkpoints/x.ckpt -> <run>; a checkpoint outside a checkpoints/ folder: its own folder."""
    return ckpt_path.parent.parent if ckpt_path.parent.name == "checkpoints" else ckpt_path.parent


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


def _training_date(header: dict[str, Any], ckpt_path: Path) -> str:
    """When the checkpoint was written, in UTC: the header's `created` stamp, else the file's time."""
    if header.get("created"):
        stamp = dt.datetime.fromisoformat(str(header["created"])).astimezone(dt.timezone.utc)
    else:
        stamp = dt.datetime.fromtimestamp(ckpt_path.stat().st_mtime, tz=dt.timezone.utc)
    return stamp.strftime("%Y-%m-%d %H:%M UTC")


def _confidence(summary: dict[str, Any], run: Path) -> float | None:
    if summary.get("confidence") is not None:
        return float(summary["confidence"])
    config = run / ".hydra" / "config.yaml"  # the run's own config: evaluation.confidence
    try:
        value = ((yaml.safe_load(config.read_text()) or {}).get("evaluation") or {}).get("confidence")
    except (OSError, yaml.YAMLError):
        return None
    return float(value) if value is not None else None


def _metrics(values: dict[str, Any], ci: dict[str, Any] | None, mse_factor: float) -> TestMetrics:
    pearson = (ci or {}).get("pearson") or {}
    mse = values.get("mse")
    return TestMetrics(r=values.get("pearson"), r_low=pearson.get("low"), r_high=pearson.get("high"),
                       mse=None if mse is None else float(mse) * mse_factor)


def _sanity(summary: dict[str, Any], model: dict[str, Any], constant: dict[str, Any] | None, mse_factor: float,
            scale_name: str) -> str | None:
    """The report's sanity sentence; a report from before it was written gets the same check from its numbers."""
    if "sanity" in summary:
        return (summary["sanity"] or {}).get("message")
    if model.get("pearson") is None or model.get("mse") is None:
        return None
    scaled = (lambda values: {**values, "mse": float(values["mse"]) * mse_factor})
    return sanity_check(scaled(model), scaled(constant) if constant and constant.get("mse") is not None else None,
                        scale_name)["message"]


def fusion_card(opened: OpenedCheckpoint) -> ModelCard:
    """Card of a fusion checkpoint. Its test report gives MSE on the rating scale of the training data
    (`mse_scale: rating`); a report from before that gave it on the cosine scale (rating - midpoint) /
    half-range, which the card shows on the rating scale (x half-range^2: x 4 on 1-5). Checkpoints that
    predate the recorded scale were trained on 1-5."""
    ckpt_path, checkpoint, header, metrics_note = opened.path, opened.data, opened.header, opened.metrics_note
    hparams = checkpoint.get("hyper_parameters") or {}
    run_config = hparams.get("run_config") or {}
    data = dict(header.get("data") or hparams.get("data_info") or {})
    data.setdefault("name", data.get("dataset") or (run_config.get("data") or {}).get("name"))
    data.setdefault("labels", ["empathy"])
    scale = recorded_scale(data if data.get("scale") else hparams.get("data_info"))
    data["scale"] = scale.bounds()
    if "generated" not in data:  # checkpoints from before describe() said so: the demo config generates
        data["generated"] = (run_config.get("data") or {}).get("demo") is not None
    model = f"FusionModule: {_net_name(hparams)} on {'+'.join(header.get('modalities') or [])}"
    run = run_folder(ckpt_path)
    summary = _read_json(run / "test_metrics.json")
    rating = ((summary.get("model") or {}).get("rating")) or {}
    factor = 1.0 if summary.get("mse_scale") == MSE_SCALE else scale.half_range ** 2
    test = ({"empathy": _metrics(rating, (summary.get("ci") or {}).get("rating"), factor)} if rating else {})
    constant = ((summary.get("constant_baseline") or {}).get("rating")) or None
    sanity = _sanity(summary, rating, constant, factor, f"the {scale} rating scale") if rating else None
    intervals, note = _intervals(summary, {"rating": FUSION_OUTPUT, "window": FUSION_WINDOW})
    return ModelCard("fusion", model, ckpt_path, data, test, _confidence(summary, run),
                     _source(run, summary), metrics_note, _training_date(header, ckpt_path),
                     _commit(header, run), intervals, note, sanity)


def text_card(opened: OpenedCheckpoint) -> ModelCard:
    """Card of a text checkpoint: per label (and the overall mean) its test r, CI when recorded, MSE."""
    ckpt_path, checkpoint, header, metrics_note = opened.path, opened.data, opened.header, opened.metrics_note
    hparams = checkpoint.get("hyper_parameters") or {}
    run_config = hparams.get("run_config") or {}
    run = run_folder(ckpt_path)
    summary = _read_json(run / "test_metrics.json")
    info = hparams.get("data_info") or {}
    data = {**info, **(summary.get("data") or {}), **(header.get("data") or {})}
    data_cfg = run_config.get("data") or {}
    data.setdefault("name", data_cfg.get("name"))
    data.setdefault("generated", bool(data_cfg.get("generated", False)))
    if not data.get("scale") and data.get("levels"):
        data["scale"] = list(data["levels"])
    model = f"TextEmpathyModule: {text_model_description(header, hparams)}"
    labels = list(info.get("labels") or data.get("labels") or [])
    test: dict[str, TestMetrics] = {}
    baselines = set(summary.get("baselines") or {})
    ci = summary.get("ci") or {}
    for output, rows in (summary.get("outputs") or {}).items():
        own = [values for row, values in rows.items() if row not in baselines]
        if own:
            test[output] = _metrics(own[0], (ci.get(output) or {}) if output in ci else None, 1.0)
    if not test and (summary.get("model") or {}).get("rating"):
        main = "overall" if len(labels) > 1 else (labels[0] if labels else "score")
        test[main] = _metrics(summary["model"]["rating"], ci.get("rating"), 1.0)
    rating = (summary.get("model") or {}).get("rating")
    constant = ((summary.get("constant_baseline") or {}).get("rating")) or None
    sanity = _sanity(summary, rating, constant, 1.0, "the labels' scale") if rating else None
    intervals, note = _intervals(summary)
    return ModelCard("text", model, ckpt_path, data, test, _confidence(summary, run), _source(run, summary),
                     metrics_note, _training_date(header, ckpt_path), _commit(header, run), intervals, note, sanity)


def _intervals(summary: dict[str, Any],
               names: dict[str, str] | None = None) -> tuple[dict[str, ConformalInterval], str]:
    """The recorded conformal intervals per output (a fusion run's levels renamed by `names`), and why
    an output has none."""
    report = summary.get("intervals")
    if not report:
        return {}, NO_INTERVALS
    items = (report.get("levels") if names else report.get("outputs")) or {}
    intervals = {}
    for key in ([k for k in names if k in items] if names else items):  # a fusion run's rating level first
        item = items[key]
        interval = ConformalInterval.read(item, report)
        if interval is not None:
            intervals[(names or {}).get(key, key)] = interval
    reasons = [str(item["note"]) for item in items.values()
               if item.get("note") and item.get("half_width") is None and not item.get("unbounded")]
    if not reasons and not intervals and report.get("note"):
        reasons = [str(report["note"])]  # e.g. a text table without validation rows
    note = "no interval: " + (reasons[0] if reasons else "none was recorded")
    return intervals, note


def text_model_description(header: dict[str, Any], hparams: dict[str, Any]) -> str:
    """The net, its encoder by name (frozen or how many layers fine-tuned) and its stacked experts."""
    from empathic_fusion.core.sentence_encoder import encoder_name

    encoder = header.get("encoder") or {}
    layers = int(encoder.get("trainable_layers") or 0)
    text = f"{_net_name(hparams)} over {encoder_name(encoder.get('model_path'))} ({f'top {layers} layers fine-tuned' if layers else 'frozen'})"
    kinds: dict[str, int] = {}
    for label in header.get("stack") or {}:
        kind = str(label).split(" (")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    if kinds:
        text += "; stacked experts: " + ", ".join(kind if n == 1 else f"{kind} x{n}" for kind, n in kinds.items())
    at_end = [label for label, item in (header.get("stack") or {}).items()
              if isinstance(item, dict) and item.get("grid_end")]
    if at_end:
        text += f"; penalty at an end of its widened grid: {', '.join(at_end)}"
    if encoder.get("choice"):
        text += f". Encoder: {encoder['choice']}"
    return text


def _net_name(hparams: dict[str, Any]) -> str:
    """The class name of the net a checkpoint's hyperparameters build."""
    return str((hparams.get("net") or {}).get("_target_", "unknown")).rsplit(".", 1)[-1]


def _source(run: Path, summary: dict[str, Any]) -> str:
    return f"{run.name}/test_metrics.json" if summary else ""


def _commit(header: dict[str, Any], run: Path) -> str:
    return str(header.get("commit") or _read_json(run / "run_info.json").get("git_commit") or "unknown")
