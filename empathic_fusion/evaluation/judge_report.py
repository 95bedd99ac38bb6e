"""The LLM judge as an evaluation (`evaluate.py judge=llm_judge +data=<text data>`): the judge of
empathic_fusion/evaluation/llm_judge.py scores every CV test fold of a text table, next to the training mean,
in the tables of `evaluate.py sweep_dir=`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from empathic_fusion.config.data import text_rating_scale
from empathic_fusion.config.evaluation import threshold_rating_on
from empathic_fusion.evaluation.tables import aggregate_runs, write_tables
from empathic_fusion.metrics import METRIC_NAMES, metrics_with_levels
from empathic_fusion.datamodules.build import build_datamodule
from empathic_fusion.evaluation.llm_judge import ENV_API_KEY, ENV_BASE_URL, ENV_MODEL, ChatClient, judge_rows


def evaluate_judge(cfg, out_dir: Path) -> dict[str, Any]:
    """Judge every CV test fold of `cfg.data` (the mean of the labels is the target), next to the
    training mean; one row per fold in runs.csv and a mean ± std table like `evaluate.py sweep_dir=`.
    Without an endpoint it says so and scores nothing. Rows without a usable answer are left out of
    the metrics and counted (`answered`)."""
    settings = cfg.judge
    client = ChatClient.from_env(cache_dir=settings.get("cache_dir"), timeout_s=settings.timeout_s,
                                 max_retries=settings.max_retries, temperature=settings.temperature,
                                 max_tokens=settings.max_tokens)
    if client is None:
        print(f"LLM judge: no endpoint configured (set {ENV_BASE_URL}, and {ENV_MODEL} / {ENV_API_KEY} as needed); "
              "nothing scored.")
        return {"skipped": "no endpoint"}
    if not cfg.get("data") or "_target_" not in cfg.data:
        raise ValueError("the LLM judge needs a text table: evaluate.py judge=llm_judge +data=<text data config>")
    dm = build_datamodule(OmegaConf.to_container(cfg.data, resolve=True), {}, ["text"])
    dm.setup()
    scale = tuple(settings.get("scale") or dm.levels or (1, 5))
    levels = cfg.data.get("levels")
    threshold = threshold_rating_on(text_rating_scale(levels), cfg.evaluation.threshold_rating,
                                    "data.levels" if levels else "the default 1-5 scale")
    runs, answered, predictions = [], [], []
    for k, (train, test) in enumerate(dm.folds):
        test = test[: settings.max_items] if settings.get("max_items") else test
        target = dm.targets[test].mean(1)
        pred = judge_rows(client, dm, test, settings.prompt, scale)
        ok = ~np.isnan(pred)
        answered.append(float(ok.mean()))
        constant = np.full(int(ok.sum()), dm.targets[train].mean())
        for name, values in (("LLM judge", pred[ok]), ("training mean", constant)):
            runs.append({"model": name, "modality": "t", "fold": k, "answered": float(ok.mean()),
                         **metrics_with_levels(values, target[ok], threshold, dm.levels)})
        predictions.append(pd.DataFrame({"row_index": test, "fold": k, "target": target, "judge": pred}))
    runs_frame = pd.DataFrame(runs)
    summary = aggregate_runs(runs_frame, METRIC_NAMES)  # runs.csv also has MAE, CCC, macro-F1, QWK
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = write_tables(summary, out_dir / "llm_judge_table", METRIC_NAMES, 1.0, 3,
                         f"LLM judge ({settings.prompt}) vs training mean, mean $\\pm$ std over {len(dm.folds)} folds")
    runs_frame.to_csv(out_dir / "runs.csv", index=False)
    pd.concat(predictions).to_csv(out_dir / "llm_judge_predictions.csv", index=False)
    (out_dir / "llm_judge_metrics.json").write_text(json.dumps({"runs": runs, "answered": answered}, indent=1))
    target_name = dm.spec.label_columns[0] if len(dm.spec.label_columns) == 1 else "mean of labels"
    print(f"\nLLM judge ({settings.prompt}, {client.model}) vs {target_name}, {len(dm.folds)}-fold grouped CV; "
          f"usable answers {np.mean(answered):.1%}; {client.requests} requests:\n\n{paths['md'].read_text()}")
    return {"summary": summary, "runs": runs_frame, "answered": answered, "requests": client.requests}
