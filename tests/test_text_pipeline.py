"""Text models on the one path, on synthetic tables with planted signal: a fold trained by
empathic_fusion.pipeline.train against its baselines, the self-describing checkpoint and TextScorer, the
robustness report, evaluate.py on a checkpoint (own fold, new CSV) and on a sweep, a failing job of
a multirun, Optuna and fine-tuning (the web app's Text tab is tested in tests/test_app.py)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from empathic_fusion.evaluation.text_perturb import PERTURBATIONS
from empathic_fusion.scoring.text import TextScorer
from empathic_fusion.demo.generated_table import make_text_table
from empathic_fusion.utils import PROJECT_ROOT
from tests.conftest import made_once

pytestmark = pytest.mark.slow

LABELS = ["cognitive", "emotional", "behavioral"]


def _finetune(table: Path, *extra: str) -> list[str]:
    """model=text_finetune on a small table, cut to run in seconds (one trained layer, two inner folds)."""
    return ["data=text_csv", "model=text_finetune", "modality=t", f"data.path={table}", "data.text_columns=[text]",
            "data.label_columns=[emotional]", "data.group_column=writer", "data.cv_folds=3",
            "model.net.encoder.cache_dir=null", "model.net.encoder.max_length=32", "model.net.experts.2.trainable_layers=1",
            "model.net.experts.2.inner_folds=2", "logger=none", *extra]


def _overrides(root: Path, *extra: str) -> list[str]:
    return ["data=text_csv", "model=text_regressor", "modality=t", f"data.path={root / 'table.csv'}",
            "data.text_columns=[text]", f"data.label_columns=[{','.join(LABELS)}]", "data.group_column=writer",
            "data.cv_folds=3", "data.persona_columns=[gender,empathic_concern]", "model.net.encoder.cache_dir=null",
            "trainer.max_epochs=25", "trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "logger=csv", *extra]


def _text_run(root: Path) -> tuple[dict, Path, Path]:
    from empathic_fusion.pipeline import train
    from empathic_fusion.compose import compose_config

    make_text_table(54, 4, seed=0, persona_effect=True).to_csv(root / "table.csv", index=False)
    cfg = compose_config(_overrides(root, "model.robustness.n_texts=12", "evaluation.groups=[gender,empathic_concern]"),
                         root / "out")
    return train(cfg), root / "out", root


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Fold 0 of a 3-fold run with persona columns through empathic_fusion.pipeline.train (the train.py path),
    trained once for both workers of `make test` (tests read it and write elsewhere)."""
    return made_once(tmp_path_factory, "text_run", _text_run)


def test_one_fold_beats_trivial_baselines_in_the_fusion_format(run):
    results, out, _ = run
    saved = json.loads((out / "test_metrics.json").read_text())
    model, baseline = saved["model"]["rating"], saved["baselines"]
    assert set(baseline) == {"TF-IDF + ridge", "ridge on frozen embeddings", "training mean"}
    assert model["spearman"] > 0.6 and model["mse"] < 0.6 * baseline["training mean"]["rating"]["mse"]
    assert set(saved["outputs"]) == set(LABELS + ["overall"]) and results["best_validation"]["val/loss"] > 0
    predictions = pd.read_csv(out / "test_predictions.csv")
    assert predictions.participant_id.str.startswith("w").all() and set(predictions.fold) == {0}
    assert (out / "csv").is_dir() and "TF-IDF + ridge" in (out / "test_metrics.md").read_text()


def test_results_per_group_of_a_text_table_column(run):
    _, out, root = run
    table = pd.read_csv(root / "table.csv")
    predictions = pd.read_csv(out / "test_predictions.csv")
    groups = pd.read_csv(out / "test_groups.csv")
    gender = groups[groups.attribute == "gender"]
    rows = table.iloc[predictions.row_index]
    assert len(gender) >= 2 and gender.n_ratings.sum() == len(rows) and (gender.n_participants >= 5).all()
    for group in gender.itertuples():  # a value's group: its rows' writers; else the pool of the small ones
        if group.group in set(rows.gender):
            assert group.n_participants == predictions.participant_id[rows.gender.to_numpy() == group.group].nunique()
        else:
            assert group.group.startswith("other (pooled: ")
    saved = json.loads((out / "test_metrics.json").read_text())["groups"]["attributes"]
    assert saved["empathic_concern"]["kind"] == "3 quantile bins" and "Per group" in (out / "test_metrics.md").read_text()


def test_checkpoint_describes_itself_and_scores_new_text_with_the_persona(run):
    import torch

    results, _, _ = run
    checkpoint = torch.load(results["best_checkpoint"], map_location="cpu", weights_only=False)
    info = checkpoint["hyper_parameters"]["data_info"]
    assert info["labels"] == LABELS and info["fields"] == ["text"] and info["persona"]["columns"] == ["gender", "empathic_concern"]
    assert checkpoint["empathic_fusion"]["encoder"]["identity"] and len(info["target_mean"]) == 3
    assert not any(k.startswith("net.encoder") for k in checkpoint["state_dict"])  # frozen: weights not copied
    scorer = TextScorer.load(results["best_checkpoint"])
    assert scorer.output_names == LABELS + ["overall"] and scorer.persona.columns == ["gender", "empathic_concern"]
    texts = ["I am so sorry. My heart goes out to you. The bus was late.", "The bus was late. It rained all day."]
    scores = scorer.score({"text": texts})
    assert scores["emotional"][0] > scores["emotional"][1] + 1.0
    assert np.allclose(scores["overall"], np.mean([scores[k] for k in LABELS], axis=0))
    persona = pd.DataFrame({"gender": ["female", "female"], "empathic_concern": [5, 1]})
    by_persona = scorer.score({"text": [texts[0]] * 2}, persona)
    assert by_persona["emotional"][0] > by_persona["emotional"][1] + 1.0


def test_robustness_report_reads_the_checkpoint(run):
    _, out, _ = run
    report = (out / "robustness.md").read_text()
    assert all(report.count(f"| {name} |") == 2 for name in PERTURBATIONS)  # |change| and signed change
    table = pd.read_csv(out / "robustness.csv")
    assert set(table.perturbation) == set(PERTURBATIONS) and set(table.output) == set(LABELS + ["overall"])
    assert (table.mean_abs_change >= 0).all() and table.mean_abs_change.max() > 0


def test_evaluate_scores_a_text_checkpoint_on_its_fold_and_on_a_new_csv(run, tmp_path):
    from empathic_fusion.pipeline import evaluate
    from empathic_fusion.compose import compose_config

    results, out, root = run
    own = evaluate(compose_config([f"ckpt_path={results['best_checkpoint']}", "trainer.enable_progress_bar=false"],
                                  tmp_path / "own", "evaluate"))
    trained = json.loads((out / "test_metrics.json").read_text())["model"]["rating"]
    assert own["model"]["rating"]["pearson"] == pytest.approx(trained["pearson"], abs=1e-5)
    fresh = make_text_table(10, 2, seed=9, persona_effect=True)
    fresh.to_csv(tmp_path / "fresh.csv", index=False)
    new = evaluate(compose_config([f"ckpt_path={results['best_checkpoint']}", f"test_csv={tmp_path / 'fresh.csv'}",
                                   "trainer.enable_progress_bar=false"], tmp_path / "new", "evaluate"))
    assert new["data"]["test_rows"] == 20 and new["model"]["rating"]["spearman"] > 0.5 and not new["baselines"]

    # split-conformal intervals per label and overall, calibrated on the fold's validation rows
    written = json.loads((out / "test_metrics.json").read_text())
    intervals, rows = written["intervals"], pd.read_csv(out / "test_predictions.csv")
    assert set(intervals["outputs"]) == set(LABELS + ["overall"]) and not intervals["in_sample"]
    for name, item in intervals["outputs"].items():
        assert item["n_calibration"] == written["data"]["val_rows"] > 0 and item["n_test"] == len(rows)
        pred, true = (rows.prediction, rows.target) if name == "overall" else (rows[f"{name}_pred"], rows[f"{name}_true"])
        inside = (true - pred).abs() <= (item["half_width"] if item["half_width"] is not None else np.inf)
        assert item["test_coverage"] == pytest.approx(inside.mean(), abs=1e-6)
        again = own["intervals"]["outputs"][name]  # evaluate.py on the same fold calibrates the same
        assert again["unbounded"] == item["unbounded"] and (item["half_width"] is None or
                                                            again["half_width"] == pytest.approx(item["half_width"], abs=1e-5))
    assert all(item["half_width"] is None and item["n_calibration"] == 0 for item in new["intervals"]["outputs"].values())
    assert "no validation rows" in new["intervals"]["note"]  # a table tested whole


def test_multirun_over_folds_records_a_failing_job_and_builds_sweep_tables(run, tmp_path):
    _, _, root = run
    sweep = tmp_path / "sweep"
    command = [sys.executable, "train.py", "-m", *_overrides(root, "trainer.max_epochs=3", "logger=none"),
               "data.cv_fold=0,7", f"hydra.sweep.dir={sweep}"]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 1, done.stderr[-3000:]  # the other job ran; the sweep says one failed
    assert re.search(r"^  failed +1 job\(s\): .*failures\.json$", done.stdout, re.M), done.stdout[-2000:]
    failure = json.loads((sweep / "failures" / "1.json").read_text())
    assert "data.cv_fold=7" in failure["overrides"] and "data.cv_fold=7: must be in 0..2" in failure["error"]
    assert (sweep / "0" / "test_metrics.json").exists()
    tables = subprocess.run([sys.executable, "evaluate.py", f"sweep_dir={sweep}", "tables.plots=false",
                             f"hydra.run.dir={tmp_path / 'tables'}"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                            timeout=200)
    assert tables.returncode == 0, tables.stderr[-3000:]
    table = (sweep / "paper_table_rating.md").read_text()  # the sweep's tables go into its folder
    assert "TextRegressor" in table and "TF-IDF + ridge" in table and "training mean" in table
    # and say which job has no results, and why
    assert "1 job(s) of the sweep have no results" in table and "data.cv_fold=7: must be in 0..2" in table
    assert json.loads((sweep / "failures.json").read_text())[0]["job"] == 1


def test_optuna_searches_a_text_model_on_a_validation_metric(run, tmp_path):
    _, _, root = run
    sweep = tmp_path / "optuna"
    command = [sys.executable, "train.py", *_overrides(root, "trainer.max_epochs=2", "logger=none"),
               "hparams_search=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.sampler.n_startup_trials=2",
               f"hydra.sweep.dir={sweep}"]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    best = (sweep / "optimization_results.yaml").read_text()
    assert "best_value" in best and "model.optimizer.lr" in best


def test_fine_tuning_top_layers_beside_a_tfidf_expert_changes_only_those_and_round_trips(tmp_path):
    import torch

    from empathic_fusion.pipeline import train
    from empathic_fusion.compose import compose_config

    make_text_table(8, 3, seed=3).to_csv(tmp_path / "table.csv", index=False)
    cfg = compose_config(["data=text_csv", "model=text_regressor", "modality=t", f"data.path={tmp_path / 'table.csv'}",
                          "data.text_columns=[text]", "data.label_columns=[emotional]", "data.group_column=writer",
                          "data.cv_folds=2", "data.batch_size=8", "data.val_fraction=0.25",
                          "model.net.encoder.trainable_layers=1", "model.net.encoder.max_length=32",
                          "model.net.experts=[{_target_:empathic_fusion.models.text.experts.TfidfRidgeExpert,min_df:1}]",
                          "model.net.head_input=embeddings",
                          "model.net.encoder.cache_dir=null", "model.baselines.enabled=false", "trainer.max_epochs=2",
                          "trainer.enable_progress_bar=false", "logger=none"], tmp_path / "out")
    results = train(cfg)
    checkpoint = torch.load(results["best_checkpoint"], map_location="cpu", weights_only=False)
    scorer = TextScorer.load(results["best_checkpoint"])
    pretrained = type(scorer.module.net.encoder)(max_length=32).model.state_dict()
    tuned = scorer.module.net.encoder.model.state_dict()
    changed = {k for k in pretrained if not torch.equal(pretrained[k], tuned[k])}
    assert changed and all(k.startswith("encoder.layer.5.") for k in changed)  # MiniLM-L6: the top layer only
    assert any(k.startswith("net.encoder.model.encoder.layer.5.") for k in checkpoint["state_dict"])
    assert "net.experts.0._extra_state" in checkpoint["state_dict"] and scorer.module.net.experts[0].fitted
    texts = ["I am so sorry. The bus was late.", "It rained all day."]
    batch = {"texts": {"text": texts}, "persona_ids": torch.zeros(2, 0, dtype=torch.long),
             "persona_numeric": torch.zeros(2, 0)}
    with torch.no_grad():
        expected = scorer.module(batch)[:, 0].numpy()
    assert np.allclose(scorer.score({"text": texts})["emotional"], expected, atol=1e-5)


def test_the_fine_tune_recipe_stacks_a_cross_fitted_encoder_expert_that_travels_in_the_checkpoint(tmp_path):
    """model=text_finetune on a small table: the fine-tuned expert is fitted (inner folds), weighed in
    the stack and reported in the header; a checkpoint scores new text as the trained module does."""
    import torch

    from empathic_fusion.pipeline import train
    from empathic_fusion.compose import compose_config

    make_text_table(30, 4, seed=0).to_csv(tmp_path / "table.csv", index=False)
    cfg = compose_config(_finetune(tmp_path / "table.csv", "model.net.experts.2.epochs=2", "model.baselines.enabled=false",
                                   "trainer.max_epochs=3", "trainer.enable_progress_bar=false"), tmp_path / "out")
    results = train(cfg)
    checkpoint = torch.load(results["best_checkpoint"], map_location="cpu", weights_only=False)
    stack = checkpoint["empathic_fusion"]["stack"]
    assert list(stack)[-1] == "fine-tuned encoder" and stack["fine-tuned encoder"]["alpha"] is None
    assert results["model"]["rating"]["pearson"] > 0.5
    scorer = TextScorer.load(results["best_checkpoint"])
    expert = scorer.module.net.experts[-1]
    assert expert.fitted and expert.fields == ["text"] and scorer.module.encoder.frozen
    texts = ["I am so sorry. The bus was late.", "It rained all day."]
    batch = {"texts": {"text": texts}, "persona_ids": torch.zeros(2, 0, dtype=torch.long),
             "persona_numeric": torch.zeros(2, 0), "embeddings": scorer.module.encoder(texts),
             "layer_embeddings": {k: torch.from_numpy(scorer.module.encoder.layer_embeddings(texts, (k,))[:, 0])
                                  for k in scorer.module.net.layer_sets}}
    with torch.no_grad():
        expected = scorer.module(batch)[:, 0].numpy()
    assert np.allclose(scorer.score({"text": texts})["emotional"], expected, atol=1e-5)


def test_tfidf_branch_is_fitted_on_training_rows_and_travels_in_the_checkpoint(run, tmp_path):
    import torch

    from empathic_fusion.pipeline import train
    from empathic_fusion.compose import compose_config

    _, _, root = run
    cfg = compose_config(_overrides(root, "trainer.max_epochs=8", "logger=none", "model.baselines.enabled=false",
                                    "model.net.branch={_target_:empathic_fusion.models.text.branches.TfidfBranch,n_components:16,min_df:1}"),
                         tmp_path / "out")
    results = train(cfg)
    checkpoint = torch.load(results["best_checkpoint"], map_location="cpu", weights_only=False)
    assert "net.branch._extra_state" in checkpoint["state_dict"]
    scorer = TextScorer.load(results["best_checkpoint"])
    # the head reads the experts' scores (TF-IDF + an embedding ridge per layer set, the last 1, 2, 4 and all 6
    # layers: 5, 3 labels each), the branch and the persona
    assert scorer.module.net.branch.fitted and scorer.module.net.head[1].in_features == 3 * 5 + 16 + 16
    texts = ["I am so sorry. My heart goes out to you. The bus was late.", "The bus was late. It rained all day."]
    scores = scorer.score({"text": texts})
    assert scores["emotional"][0] > scores["emotional"][1] + 0.5
    assert json.loads((tmp_path / "out" / "test_metrics.json").read_text())["model"]["rating"]["spearman"] > 0.5


def test_a_killed_text_run_resumes_from_its_last_checkpoint_with_the_fitted_experts(run, tmp_path):
    """Resuming loaded last.ckpt with torch's weights-only unpickler, which refuses the experts'
    fitted vocabularies and coefficients: the rerun of a killed text job failed."""
    import torch

    from empathic_fusion.pipeline import train
    from empathic_fusion.compose import compose_config

    _, _, root = run
    overrides = _overrides(root, "logger=none", "model.baselines.enabled=false")
    train(compose_config(overrides + ["trainer.max_epochs=2"], tmp_path / "out"))
    (tmp_path / "out" / "test_metrics.json").unlink()  # as if killed after epoch 2
    resumed = train(compose_config(overrides + ["trainer.max_epochs=3"], tmp_path / "out"))
    last = torch.load(tmp_path / "out" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["epoch"] == 2 and "net.experts.0._extra_state" in last["state_dict"]
    assert resumed["model"]["rating"]["spearman"] > 0.5


def test_a_folder_left_by_another_recipe_is_not_resumed_with_a_state_dict_error(run, tmp_path):
    """A sweep run again into its old folder after the recipe changed (more experts) resumed the old
    last.ckpt and failed in Lightning's strict load; the run now stops first, naming the checkpoint."""
    from empathic_fusion.models.checkpoints import IncompatibleResumeError
    from empathic_fusion.pipeline import train
    from empathic_fusion.compose import compose_config

    _, _, root = run
    overrides = _overrides(root, "logger=none", "model.baselines.enabled=false", "trainer.max_epochs=1",
                           "model.robustness.n_texts=0")
    train(compose_config(overrides + ["model.net.experts.1.layers=[1]"], tmp_path / "out"))
    with pytest.raises(IncompatibleResumeError, match=r"last\.ckpt was written by a run of another model or recipe.*"
                                                      r"not in this model|missing there"):
        train(compose_config(overrides, tmp_path / "out"))


def _inference_tensors(module) -> list[str]:
    """Names of the inference tensors a module holds: parameters, buffers, and tensors or modules kept
    outside its registered children (a cached net in `__dict__`), recursively."""
    import torch

    found, seen = [], set()

    def walk(obj, name: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.is_inference():
                found.append(name)
        elif isinstance(obj, torch.nn.Module):
            for key, tensor in [*obj.named_parameters(recurse=False), *obj.named_buffers(recurse=False)]:
                walk(tensor, f"{name}.{key}")
            for key, value in vars(obj).items():
                if key not in ("_parameters", "_buffers", "_modules") and isinstance(value, (torch.Tensor, torch.nn.Module)):
                    walk(value, f"{name}.{key}")
            for key, child in obj.named_children():
                walk(child, f"{name}.{key}")
    walk(module, "module")
    return found


def test_the_fine_tune_recipe_leaves_no_inference_tensor_after_testing(tmp_path):
    """trainer.test runs under inference mode and restores the best checkpoint, so the fine-tuned expert
    rebuilds its net there; a net built in inference mode is made of inference tensors, which the report
    after the test cannot move (on a GPU the module goes back to the CPU after testing: 'Inference
    tensors do not track version counter'). The expert builds it outside inference mode."""
    import lightning as L

    from empathic_fusion.pipeline import train
    from empathic_fusion.compose import compose_config

    class Keep(L.Callback):
        module = None

        def on_test_end(self, trainer, module) -> None:
            Keep.module = module

    make_text_table(30, 4, seed=0).to_csv(tmp_path / "table.csv", index=False)
    cfg = compose_config(_finetune(tmp_path / "table.csv", "model.net.experts.2.epochs=1", "model.baselines.enabled=false",
                                   "trainer.max_epochs=2", "model.robustness.n_texts=4",
                                   "trainer.enable_progress_bar=false"), tmp_path / "out")
    results = train(cfg, extra_callbacks=[Keep()])
    assert (tmp_path / "out" / "test_metrics.json").is_file() and "robustness" in results
    expert = Keep.module.net.experts[-1]
    assert expert.__dict__["_net"] is not None  # rebuilt from the restored checkpoint while testing
    assert _inference_tensors(Keep.module) == []


@pytest.mark.gpu
def test_the_fine_tune_recipe_sweeps_its_folds_on_a_gpu_and_writes_the_sweep_table(tmp_path):
    """The GPU recipe end to end: train.py -m model=text_finetune trainer=gpu over two folds of a small table,
    each fold fine-tuned, tested and reported on the GPU, then the sweep's table over the folds."""
    make_text_table(30, 4, seed=0).to_csv(tmp_path / "table.csv", index=False)
    sweep = tmp_path / "sweep"
    command = [sys.executable, "train.py", "-m", *_finetune(tmp_path / "table.csv", "trainer=gpu", "data.cv_fold=0,1",
                                                         "model.net.experts.2.epochs=2", "model.robustness.n_texts=4",
                                                         "trainer.max_epochs=3"),
               "+hydra.callbacks.paper_tables._target_=empathic_fusion.evaluation.sweep.PaperTablesCallback",
               f"hydra.sweep.dir={sweep}"]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (sweep / "failures").exists(), [p.read_text()[-2000:] for p in (sweep / "failures").glob("*.json")]
    assert all((sweep / str(fold) / "test_metrics.json").is_file() for fold in (0, 1))
    assert "frozen encoder on cuda:0" in (sweep / "0" / "train.log").read_text()  # the table embedded on the GPU
    table = (sweep / "paper_table_rating.md").read_text()
    assert "TextRegressor" in table and "training mean" in table
