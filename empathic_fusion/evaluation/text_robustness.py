"""Robustness report (Haleas, "Exploring the Empathy of Leading Large Language Models", section 4.2.1): how much each perturbation moves each output score.

For every perturbation (and, for the character-level ones, every graded noise level) the mean
absolute and the mean signed change of every output over the given texts, as a table, a CSV and a
bar plot of mean absolute change per perturbation and output.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from empathic_fusion.datamodules.text_datamodule import TextDataModule
from empathic_fusion.models.predict import predict_texts
from empathic_fusion.models.text_module import TextEmpathyModule
from empathic_fusion.evaluation.text_perturb import CHARACTER_LEVEL, PERTURBATIONS, perturb


def robustness_table(module: TextEmpathyModule, texts: list[str], levels: tuple[float, ...] = (0.1, 0.3, 0.6),
                     seed: int = 0, context: dict[str, list[str]] | None = None,
                     persona: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (perturbation, level, output): mean |change|, mean change, share of texts changed.
    Only the scored text (the model's first field) is perturbed; context fields and persona stay."""
    if not texts:
        raise ValueError("the robustness report needs at least one text")
    first = module.net.fields[0]
    context = {k: v for k, v in (context or {}).items() if k != first}
    score = (lambda batch: predict_texts(module, {first: batch, **context}, persona))
    base = score(texts)
    rows = []
    for name in PERTURBATIONS:
        for level in (levels if name in CHARACTER_LEVEL else (1.0,)):
            perturbed = [perturb(t, name, level, seed) for t in texts]
            scores = score(perturbed)
            changed = float(np.mean([a != b for a, b in zip(texts, perturbed)]))
            for output, values in scores.items():
                delta = values - base[output]
                rows.append({"perturbation": name, "level": level, "output": output,
                             "mean_abs_change": float(np.mean(np.abs(delta))), "mean_change": float(np.mean(delta)),
                             "texts_changed": changed, "n_texts": len(texts)})
    return pd.DataFrame(rows)


def default_level_view(table: pd.DataFrame, level: float = 0.3, value: str = "mean_abs_change") -> pd.DataFrame:
    """Perturbation x output of `value`, character-level ones at `level` (rule-based at 1)."""
    chosen = table[(table.level == level) | ~table.perturbation.isin(CHARACTER_LEVEL)]
    view = chosen.pivot(index="perturbation", columns="output", values=value)
    return view.loc[[p for p in PERTURBATIONS if p in view.index], list(dict.fromkeys(table.output))]


def write_report(table: pd.DataFrame, out_dir: Path, level: float = 0.3) -> dict[str, Path]:
    """robustness.csv (every level), robustness.md and robustness.png (character level at `level`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    view = default_level_view(table, level)
    paths = {"csv": out_dir / "robustness.csv", "md": out_dir / "robustness.md", "png": out_dir / "robustness.png"}
    table.to_csv(paths["csv"], index=False)
    header = "| perturbation | " + " | ".join(view.columns) + " |"
    lines = [f"Mean absolute score change (character-level perturbations at level {level}; "
             f"n = {int(table.n_texts.iloc[0])} texts)", "", header, "|---" * (len(view.columns) + 1) + "|"]
    lines += [f"| {p} | " + " | ".join(f"{v:.3f}" for v in row) + " |" for p, row in view.iterrows()]
    signed = default_level_view(table, level, "mean_change")
    lines += ["", "Mean signed change (negative: the perturbation lowers the score)", "", header,
              "|---" * (len(signed.columns) + 1) + "|"]
    lines += [f"| {p} | " + " | ".join(f"{v:+.3f}" for v in row) + " |" for p, row in signed.iterrows()]
    paths["md"].write_text("\n".join(lines) + "\n")
    ax = view.plot.bar(figsize=(9, 4.5), rot=25)
    ax.set_ylabel("mean |score change|")
    ax.set_title("Score change per perturbation and output")
    plt.tight_layout()
    plt.savefig(paths["png"], dpi=100)
    plt.close("all")
    return paths


def robustness_report(module: TextEmpathyModule, datamodule: TextDataModule, settings: dict[str, Any], seed: int,
                      out_dir: Path) -> Path | None:
    """The perturbation report of the tested module on (up to n_texts of) the test fold's texts."""
    n_texts = int(settings["n_texts"] or 0)
    if not n_texts or not len(datamodule.test_rows):
        return None
    dm = datamodule
    pick = np.sort(np.random.default_rng(seed).permutation(dm.test_rows)[:n_texts])
    fields = {f: [values[i] for i in pick] for f, values in dm.fields.items()}
    table = robustness_table(module, fields[dm.spec.fields[0]], tuple(settings["levels"]), seed,
                             context=fields, persona=dm.table.iloc[pick][dm.spec.persona_columns].reset_index(drop=True))
    paths = write_report(table, out_dir, settings["report_level"])
    print(paths["md"].read_text())
    return paths["md"]
