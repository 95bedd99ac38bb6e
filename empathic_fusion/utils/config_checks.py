"""The settings a user can get wrong, checked once when a run starts (train.py, evaluate.py).

One declarative table: each rule names a config key, what it must be, and a predicate. A key that
the composed config does not have is not checked (text runs have no windows, for example), and keys
the table does not know are left alone. Every violation is reported at once, as
`key=value: must be ...`, before any data is read or any epoch runs; Lightning would otherwise read
`trainer.max_epochs=-1` as "train forever" and `data.window_frames=0` would fail deep inside a batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import DictConfig, ListConfig, OmegaConf

RATING_SCALE = (1.0, 5.0)  # self-reported empathy, as the dataset contract validates it


class ConfigError(ValueError):
    """One or more settings out of their allowed range; the message lists each key, value and range."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(low: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _between(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Callable[[Any], bool]:
    return lambda v: _number(v) and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)


def _fractions(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 3 and all(_number(f) and f >= 0 for f in value)
            and abs(sum(value) - 1.0) <= 1e-6 and value[0] > 0)


@dataclass(frozen=True)
class Rule:
    key: str
    allowed: str
    check: Callable[[Any], bool]
    optional: bool = False  # null is allowed


RULES = (
    Rule("trainer.max_epochs", "an integer >= 1 (Lightning reads -1 as 'no limit')", _integer(1)),
    Rule("trainer.min_epochs", "an integer >= 0 or null", _integer(0), optional=True),
    Rule("data.window_frames", "an integer >= 1 (frames per window; the paper's 120 = 8 s at 15 fps)", _integer(1)),
    Rule("data.stride_seconds", "a number > 0 (seconds between window starts)", _between(0, math.inf, low_open=True)),
    Rule("data.split_fractions", "three non-negative fractions [train, val, test] summing to 1, train > 0",
         _fractions),
    Rule("data.batch_size", "an integer >= 1", _integer(1)),
    Rule("data.num_workers", "an integer >= 0", _integer(0)),
    Rule("data.extract_workers", "an integer >= 1", _integer(1)),
    Rule("data.cv_folds", "0 (no cross-validation) or an integer >= 2", lambda v: v == 0 or _integer(2)(v)),
    Rule("data.cv_fold", "an integer >= 0 (or null for a text run on every row)", _integer(0), optional=True),
    Rule("data.scenario", "story_share or reflection", lambda v: v in ("story_share", "reflection")),
    Rule("data.on_stale", "mask or error", lambda v: v in ("mask", "error")),
    Rule("model.optimizer.lr", "a learning rate > 0", _between(0, math.inf, low_open=True)),
    Rule("model.optimizer.weight_decay", "a number >= 0", _between(0, math.inf)),
    Rule("evaluation.threshold", "fixed or validation", lambda v: v in ("fixed", "validation")),
    Rule("evaluation.bootstrap", "an integer >= 0 (participant resamples; 0 = no intervals)", _integer(0)),
    Rule("evaluation.confidence", "a number strictly between 0 and 1", _between(0, 1, True, True)),
)


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError listing every setting of `cfg` that breaks a rule (see RULES)."""
    problems = []
    for rule in RULES:
        node = OmegaConf.select(cfg, rule.key, default="__absent__", throw_on_missing=False)
        if isinstance(node, str) and node == "__absent__":
            continue
        value = OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node
        if value is None and rule.optional:
            continue
        if not rule.check(value):
            problems.append(f"{rule.key}={value}: must be {rule.allowed}")
    threshold = OmegaConf.select(cfg, "model.threshold_rating")
    levels = OmegaConf.select(cfg, "data.levels")  # a text table's own rating scale, e.g. [1, 7]
    low, high = (float(levels[0]), float(levels[-1])) if levels else RATING_SCALE
    if threshold is not None and not _between(low, high)(threshold):
        problems.append(f"model.threshold_rating={threshold}: must be a rating within the scale {low:g}-{high:g}")
    cv_folds, cv_fold = OmegaConf.select(cfg, "data.cv_folds"), OmegaConf.select(cfg, "data.cv_fold")
    if isinstance(cv_folds, int) and cv_folds >= 2 and isinstance(cv_fold, int) and cv_fold >= cv_folds:
        problems.append(f"data.cv_fold={cv_fold}: must be in 0..{cv_folds - 1} (data.cv_folds={cv_folds})")
    if problems:
        raise ConfigError("invalid settings:\n  " + "\n  ".join(problems))
