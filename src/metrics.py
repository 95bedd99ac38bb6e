"""Empathy metrics as in the paper: Pearson r, Spearman rho, accuracy, binary F1, MSE.

Scores live on the cosine scale (rating - 3) / 2. Accuracy and F1 binarise both prediction and
truth at a rating threshold (default 3: a rating above 3 counts as "empathized"). Window-level
metrics score every window; rating-level metrics first average the windows of each rating.
"""
from __future__ import annotations

import warnings

import torch
from torchmetrics.functional import mean_squared_error, pearson_corrcoef, spearman_corrcoef
from torchmetrics.functional.classification import binary_accuracy, binary_f1_score

METRIC_NAMES = ("pearson", "spearman", "accuracy", "f1", "mse")
PAPER_SYMBOLS = {"pearson": "r", "spearman": "rho", "accuracy": "Acc", "f1": "F1", "mse": "MSE"}


def rating_threshold_to_target(threshold_rating: float) -> float:
    return (threshold_rating - 3.0) / 2.0


def _correlation(fn, pred: torch.Tensor, target: torch.Tensor, name: str) -> float:
    if len(pred) < 2 or pred.max() == pred.min() or target.max() == target.min():
        warnings.warn(f"{name}: constant predictions or targets (or fewer than 2 items); reported as 0", stacklevel=3)
        return 0.0
    return float(fn(pred.double(), target.double()))


def empathy_metrics(pred: torch.Tensor, target: torch.Tensor, threshold: float = 0.0) -> dict[str, float]:
    """All paper metrics for 1-D predictions and targets on the cosine scale."""
    pred, target = pred.detach().flatten().float().cpu(), target.detach().flatten().float().cpu()
    if len(pred) == 0:
        return {name: float("nan") for name in METRIC_NAMES}
    pred_class, true_class = (pred > threshold).int(), (target > threshold).int()
    return {
        "pearson": _correlation(pearson_corrcoef, pred, target, "pearson"),
        "spearman": _correlation(spearman_corrcoef, pred, target, "spearman"),
        "accuracy": float(binary_accuracy(pred_class, true_class)),
        "f1": float(binary_f1_score(pred_class, true_class, zero_division=0)),
        "mse": float(mean_squared_error(pred, target)),
    }


def aggregate_by_rating(pred: torch.Tensor, target: torch.Tensor,
                        rating_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean prediction over each rating's windows, with that rating's target and index."""
    ids, inverse = torch.unique(rating_index, return_inverse=True)
    counts = torch.zeros(len(ids)).index_add_(0, inverse, torch.ones(len(inverse)))
    mean_pred = torch.zeros(len(ids)).index_add_(0, inverse, pred.float()) / counts
    first_target = torch.zeros(len(ids)).index_copy_(0, inverse, target.float())
    return mean_pred, first_target, ids


def format_table(rows: dict[str, dict[str, float]], scale: float = 1.0) -> str:
    """Markdown table with the paper's column symbols; scale=100 gives the paper's x100 display."""
    header = "| | " + " | ".join(PAPER_SYMBOLS[m] for m in METRIC_NAMES) + " |"
    lines = [header, "|---" * (len(METRIC_NAMES) + 1) + "|"]
    for name, values in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{values[m] * scale:.3f}" for m in METRIC_NAMES) + " |")
    return "\n".join(lines)
