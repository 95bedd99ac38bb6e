"""What `empathic-predict` runs: read the checkpoint's kind, score the data, write the tables and the card.

Outputs, in `out_dir` (default: the run's folder):
  predictions.csv          fusion: one row per (session, story) pair, and one (story_id empty) per session
                           without a pair to score; text: one row per input row, its columns kept. Rows
                           that could not be scored stay, with `status` and `reason`; a session shorter
                           than one window is scored as one window, with a `note`.
                           Each score carries its split-conformal interval (the run's test report: the
                           rating-level half-width for a pair, each output's for a text row), cut to the scale.
  session_predictions.csv  fusion: one row per session of sessions.csv
  window_predictions.csv   fusion: one row per window (start and end in seconds), with the window-level interval
  model_card.md            the checkpoint's model card (model, training data, test metrics, interval)
Nothing leaves the machine: no logger is used.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from empathic_fusion.config import validate
from empathic_fusion.core.files import atomic_write_text
from empathic_fusion.evaluation.card import ModelCard, fusion_card, text_card
from empathic_fusion.models.checkpoints import OpenedCheckpoint, WrongKindError, module_from, open_checkpoint
from empathic_fusion.utils.run_output import shown, what_now

log = logging.getLogger(__name__)
PREDICTIONS = "predictions.csv"
ALSO_WRITTEN = ("session_predictions.csv", "window_predictions.csv", "model_card.md")  # named after it when written


@dataclass
class PredictResult:
    kind: str  # fusion | text
    out_dir: Path
    scored: int
    not_scored: int

    def summary(self) -> str:
        """What empathic-predict prints last: where predictions.csv went, its counts and the other files."""
        also = [name for name in ALSO_WRITTEN if (self.out_dir / name).is_file()]
        reasons = "; each not scored row says why in its status and reason columns" if self.not_scored else ""
        return what_now([("run folder", shown(self.out_dir)),
                         ("predictions", f"{shown(self.out_dir / PREDICTIONS)}  ({self.scored} scored, "
                                         f"{self.not_scored} not scored{reasons})"),
                         ("also", ", ".join(also) or None)])


def default_store(data_dir: str | Path, dataset_dir: Path) -> Path:
    """A store per dataset folder that reruns find again: `<data_dir>/features/predict/<name>-<path hash>`."""
    resolved = dataset_dir.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:10]
    return Path(data_dir) / "features" / "predict" / f"{resolved.name}-{digest}"


def _write_csv(table, path: Path) -> None:
    atomic_write_text(path, table.to_csv(index=False))


def _predict_dataset(cfg: DictConfig, opened: OpenedCheckpoint, card: ModelCard, out_dir: Path) -> tuple[int, int]:
    from empathic_fusion.scoring.fusion import score_dataset

    model = module_from(opened).eval()
    ckpt = opened.path
    dataset_dir = Path(cfg.data.dataset_dir)
    store_dir = Path(cfg.data.store_dir) if cfg.data.store_dir else default_store(cfg.paths.data_dir, dataset_dir)
    log.info("scoring %s with %s (features in %s)", dataset_dir, ckpt, store_dir)
    scores = score_dataset(model, card, dataset_dir, store_dir, cfg.accelerator, int(cfg.data.extract_workers),
                           cfg.data.batch_size, bool(cfg.progress))
    _write_csv(scores.pairs, out_dir / PREDICTIONS)
    _write_csv(scores.sessions, out_dir / "session_predictions.csv")
    _write_csv(scores.windows, out_dir / "window_predictions.csv")
    unscored = scores.pairs[scores.pairs.status != "scored"]
    lone = unscored.story_id == ""  # a session without a pair to score: its one row
    for reason, rows in unscored[~lone].groupby("reason").session_id:
        sessions = list(dict.fromkeys(rows))
        log.warning("not scored: %d pair(s) of session(s) %s: %s", len(rows),
                    ", ".join(sessions[:5]) + (f" and {len(sessions) - 5} more" if len(sessions) > 5 else ""), reason)
    for row in unscored[lone].itertuples():
        log.warning("not scored: session '%s': %s", row.session_id, row.reason)
    return scores.scored, len(unscored)


def _predict_table(cfg: DictConfig, opened: OpenedCheckpoint, card: ModelCard, out_dir: Path) -> tuple[int, int]:
    from empathic_fusion.scoring.table import score_table
    from empathic_fusion.scoring.text import TextScorer

    scorer = TextScorer(module_from(opened), cfg.accelerator)
    table = score_table(scorer, card, Path(cfg.data.path), bool(cfg.progress))
    _write_csv(table, out_dir / PREDICTIONS)
    unscored = table[table.status != "scored"]
    for reason, rows in unscored.groupby("reason").groups.items():
        lines = [str(i + 2) for i in list(rows)[:10]]
        log.warning("not scored: %s, %d row(s) (line %s%s): %s", cfg.data.path, len(rows), ", ".join(lines),
                    ", ..." if len(rows) > 10 else "", reason)
    return int((table.status == "scored").sum()), len(unscored)


@dataclass(frozen=True)
class Kind:
    """What a kind of checkpoint scores (its data key, and what that names), its card and its scorer."""

    key: str
    what: str
    card: Callable[..., ModelCard]
    score: Callable[[DictConfig, OpenedCheckpoint, ModelCard, Path], tuple[int, int]]


KINDS = {"fusion": Kind("dataset_dir", "dataset folder", fusion_card, _predict_dataset),
         "text": Kind("path", "CSV table", text_card, _predict_table)}


def run_predict(cfg: DictConfig) -> PredictResult:
    """Score `data.dataset_dir` (fusion checkpoint) or `data.path` (text checkpoint) with `ckpt_path`."""
    validate(cfg)
    opened = open_checkpoint(cfg.ckpt_path)  # read once: its kind, its card and its model
    ckpt, kind = opened.path, opened.header["module"]
    out_dir = Path(cfg.out_dir or cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if kind not in KINDS:
        raise WrongKindError(f"{ckpt}: a '{kind}' checkpoint; empathic-predict scores {' and '.join(KINDS)} "
                             "checkpoints")
    this, (other, that) = KINDS[kind], next((name, k) for name, k in KINDS.items() if name != kind)
    if not cfg.data[this.key] or cfg.data[that.key]:
        raise WrongKindError(f"{ckpt} is a {kind} checkpoint: give data.{this.key}=<{this.what}> "
                             f"(data.{that.key}= is for {other} checkpoints)")
    card = this.card(opened)
    scored, not_scored = this.score(cfg, opened, card, out_dir)
    atomic_write_text(out_dir / "model_card.md", f"# Model card\n\n{card.markdown()}\n")
    for note in (card.banner(), card.sanity):  # generated training data; no better than the training mean
        if note:
            print(note.replace("**", ""))
    return PredictResult(kind, out_dir, scored, not_scored)
