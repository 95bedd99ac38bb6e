"""Text pipeline end to end on synthetic tables with planted signal: grouped CV against baselines,
persona conditioning, the saved model, the robustness report, the train.py interface on an unseen
table (the web app's Text tab is tested in tests/test_app.py)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from src.text.perturb import PERTURBATIONS
from src.text.pipeline import train_text
from src.text.scorer import TextScorer
from src.text.synthetic import make_text_table
from src.utils import PROJECT_ROOT

LABELS = ["cognitive", "emotional", "behavioral"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One 3-fold run with persona columns and the persona ablation, final model and robustness report."""
    root = tmp_path_factory.mktemp("text_run")
    make_text_table(54, 4, seed=0, persona_effect=True).to_csv(root / "table.csv", index=False)
    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            "data=text_csv", "model=text_regressor", f"data.path={root / 'table.csv'}", "data.text_columns=[text]",
            f"data.label_columns=[{','.join(LABELS)}]", "data.group_column=writer", "data.n_folds=3",
            "data.persona_columns=[gender,empathic_concern]", "model.persona_ablation=true",
            "model.encoder.cache_dir=null", "model.max_epochs=40", "model.robustness.n_texts=12"])
    with open_dict(cfg):
        cfg.paths.output_dir = str(root / "out")
    return train_text(cfg), root / "out"


def test_grouped_cv_beats_trivial_baselines(run):
    results, out = run
    for output in LABELS + ["overall"]:
        rows = results["cv"][output]
        assert rows["text_regressor"]["spearman"]["mean"] > 0.6
        assert rows["text_regressor"]["qwk"]["mean"] > rows["majority class"]["qwk"]["mean"] + 0.4
        assert rows["text_regressor"]["mse"]["mean"] < 0.6 * rows["training mean"]["mse"]["mean"]
    oof = pd.read_csv(out / "oof_predictions.csv")
    assert sorted(oof.row_index) == list(range(54 * 4)) and set(oof.fold) == {0, 1, 2}
    assert "TF-IDF + ridge" in (out / "text_metrics.md").read_text()


def test_persona_conditioning_helps_where_the_persona_carries_signal(run):
    results, _ = run
    emotional = results["cv"]["emotional"]
    with_persona = emotional["text_regressor"]["mse"]["mean"]
    without = emotional["text_regressor without persona"]["mse"]["mean"]
    assert with_persona < 0.8 * without  # high empathic concern shifts emotional ratings; text cannot see it


def test_saved_model_scores_new_text_and_uses_the_persona(run):
    results, _ = run
    scorer = TextScorer.load(results["model_path"])
    assert scorer.output_names == LABELS + ["overall"]
    texts = ["I am so sorry. My heart goes out to you. The bus was late.", "The bus was late. It rained all day."]
    scores = scorer.score({"text": texts})
    assert scores["emotional"][0] > scores["emotional"][1] + 1.0
    assert np.allclose(scores["overall"], np.mean([scores[k] for k in LABELS], axis=0))
    persona = pd.DataFrame({"gender": ["female", "female"], "empathic_concern": [5, 1]})
    by_persona = scorer.score({"text": [texts[0]] * 2}, persona)
    assert by_persona["emotional"][0] > by_persona["emotional"][1] + 1.0


def test_robustness_report_lists_all_seven_perturbations(run):
    _, out = run
    report = (out / "robustness.md").read_text()
    assert all(report.count(f"| {name} |") == 2 for name in PERTURBATIONS)  # |change| and signed change
    table = pd.read_csv(out / "robustness.csv")
    assert set(table.perturbation) == set(PERTURBATIONS) and set(table.output) == set(LABELS + ["overall"])
    assert sorted(table[table.perturbation == "leetspeak"].level.unique()) == [0.1, 0.3, 0.6]
    assert (table.mean_abs_change >= 0).all() and table.mean_abs_change.max() > 0
    assert (out / "robustness.png").stat().st_size > 1000


def test_train_py_runs_on_an_unseen_jsonl_given_its_columns(tmp_path):
    table = make_text_table(30, 3, seed=5).rename(columns={"text": "reply", "writer": "author", "emotional": "score"})
    table.to_json(tmp_path / "fresh.jsonl", orient="records", lines=True)
    command = [sys.executable, "train.py", "data=text_csv", "model=text_regressor", f"data.path={tmp_path / 'fresh.jsonl'}",
               "data.text_columns=[reply]", "data.label_columns=[score]", "data.group_column=author", "data.n_folds=3",
               "model.encoder.cache_dir=null", "model.final_fit=false", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "folds grouped by author" in done.stdout and "TF-IDF + ridge" in done.stdout
    metrics = pd.read_csv(tmp_path / "run" / "fold_metrics.csv")
    model = metrics[metrics.row == "text_regressor"]
    assert len(model) == 3 and model.spearman.mean() > 0.5


def test_fine_tuning_top_layers_changes_only_those_and_round_trips(tmp_path):
    import torch

    from src.text.datamodule import TextDataModule
    from src.text.encoder import TextEncoder
    from src.text.pipeline import fit_module
    from src.text.scorer import save_bundle

    table = make_text_table(8, 2, seed=3)
    dm = TextDataModule(None, ["text"], ["emotional"], "writer", n_folds=2, batch_size=8, val_fraction=0.25, table=table)
    dm.use_fold(None)
    encoder = TextEncoder(trainable_layers=1, max_length=32)
    assert dm.embedder is None and not encoder.frozen
    before = {k: v.clone() for k, v in encoder.model.state_dict().items()}
    settings = {"encoder": {"trainable_layers": 1, "max_length": 32}, "max_epochs": 2}
    module = fit_module(settings, dm, encoder, {"accelerator": "cpu"}, seed=0)
    after = encoder.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("encoder.layer.5.") for k in changed)  # MiniLM-L6: the top layer only
    path = save_bundle(tmp_path / "model.pt", module, settings, dm.persona)
    scorer = TextScorer.load(path)
    texts = ["I am so sorry. The bus was late.", "It rained all day."]
    module.eval()  # no dropout
    expected = module.predict_scores({"texts": {"text": texts}, "persona_ids": torch.zeros(2, 0, dtype=torch.long),
                                      "persona_numeric": torch.zeros(2, 0)})
    assert np.allclose(scorer.score({"text": texts})["emotional"], expected[:, 0].detach().numpy(), atol=1e-5)
