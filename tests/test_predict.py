"""`empathic-predict`: from a folder outside the repository, after a non-editable install of the package,
it scores a copy of the demo dataset without ratings.csv (every (session, story) pair and every session
exactly once, unscorable ones with their reason) and a text table without labels (every row exactly once,
in order, its columns kept), writing the checkpoint's model card beside the predictions."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from empathic_fusion.utils import PROJECT_ROOT
from tests.conftest import made_once

FORMAT2 = Path(__file__).parent / "data" / "format2"


def _install(root: Path) -> Path:
    """The package built as a wheel from a copy of the source and installed into root / "site"."""
    source = root / "source"
    shutil.copytree(PROJECT_ROOT / "empathic_fusion", source / "empathic_fusion",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(PROJECT_ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "wheel"), str(source)],
                   check=True, capture_output=True, cwd=root)
    wheel = next((root / "wheel").glob("empathic_fusion-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(root / "site"), str(wheel)], check=True,
                   capture_output=True, cwd=root)
    return root


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The package built as a wheel from a copy of the source and installed (not editable) into a folder of
    its own, once for both workers of `make test`; the environment that runs its console scripts from there."""
    root = made_once(tmp_path_factory, "install", _install)
    cwd = tmp_path_factory.mktemp("installed_cwd")  # this worker's own, away from the source checkout
    env = {**os.environ, "PYTHONPATH": str(root / "site"), "OMP_NUM_THREADS": "1"}
    where = subprocess.run([sys.executable, "-c", "import empathic_fusion; print(empathic_fusion.__file__)"],
                           env=env, cwd=cwd, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(root / "site")), where  # the installed copy, not the source checkout
    return {"env": env, "script": str(root / "site" / "bin" / "empathic-predict"), "cwd": str(cwd)}


def _predict(installed: dict, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, installed["script"], *overrides, "progress=false"], env=installed["env"],
                          cwd=installed["cwd"], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def text_fusion_run(tiny_dataset, tiny_store, tmp_path_factory) -> Path:
    """One epoch of the default fusion model on the tiny demo's text modality (with its test report)."""
    from empathic_fusion.pipeline import train
    from empathic_fusion.compose import compose_config

    out = tmp_path_factory.mktemp("text_fusion_run")
    train(compose_config([f"data.dataset_dir={tiny_dataset}", f"data.store_dir={tiny_store}", "data.demo=null",
                          "modality=t", "data.split_fractions=[0.6,0.2,0.2]", "data.extract_workers=1",
                          "trainer.max_epochs=1", "evaluation.bootstrap=50", "evaluation.missing_modalities=false",
                          "trainer.accelerator=cpu",
                          "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "logger=none"],
                         out))
    return out


@pytest.mark.slow
def test_predict_scores_an_unrated_dataset_from_an_installed_package(installed, text_fusion_run, tiny_dataset,
                                                                     tmp_path):
    dataset = Path(shutil.copytree(tiny_dataset, tmp_path / "new_sessions"))
    (dataset / "ratings.csv").unlink()
    sessions = pd.read_csv(dataset / "sessions.csv", dtype=str).session_id.tolist()
    lost, silent = sessions[0], sessions[1]
    (dataset / "transcripts" / f"{lost}.csv").unlink()  # phases and stories unknown: the session is listed
    transcript = dataset / "transcripts" / f"{silent}.csv"  # no story share: its pairs are listed, not scored
    rows = pd.read_csv(transcript, dtype=str, keep_default_na=False)
    rows[rows.phase != "story_share"].to_csv(transcript, index=False)
    out = tmp_path / "out"
    done = _predict(installed, f"ckpt_path={text_fusion_run}", f"data.dataset_dir={dataset}",
                    f"data.store_dir={tmp_path / 'store'}", f"out_dir={out}", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert "data warning(s) in this run" in log and f"session '{lost}'" in log

    pairs = pd.read_csv(out / "predictions.csv", dtype={"session_id": str, "story_id": str})
    lone = pairs[pairs.story_id.isna()]  # a session without a pair to score: one row with its reason
    assert lone.session_id.tolist() == [lost] and "no transcript" in lone.reason.iloc[0]
    pairs = pairs[pairs.story_id.notna()]
    expected = {(sid, story) for sid in sessions[1:] for story in
                pd.read_csv(dataset / "transcripts" / f"{sid}.csv", dtype=str, keep_default_na=False).story_id if story}
    assert len(pairs) == len(expected) and set(zip(pairs.session_id, pairs.story_id)) == expected  # each once
    scored = pairs[pairs.status == "scored"]
    assert set(scored.session_id) == set(sessions[2:])
    assert scored.predicted.between(1, 5).all() and (scored.windows > 0).all()
    assert (scored.interval_low <= scored.predicted).all() and (scored.predicted <= scored.interval_high).all()
    recorded = json.loads((text_fusion_run / "test_metrics.json").read_text())["intervals"]["levels"]
    window_scores = pd.read_csv(out / "window_predictions.csv")
    for table, level in ((scored, "rating"), (window_scores, "window")):
        q = recorded[level]["half_width"] or np.inf  # None: unbounded (too few calibration items)
        expected_low, expected_high = np.maximum(table.predicted - q, 1.0), np.minimum(table.predicted + q, 5.0)
        assert np.allclose(table.interval_low, expected_low) and np.allclose(table.interval_high, expected_high), level
    unscored = pairs[pairs.status != "scored"]
    assert set(unscored.session_id) == {silent} and (unscored.reason == "no story_share utterances").all()
    assert pairs.self_report.isna().all()  # nobody rated these

    per_session = pd.read_csv(out / "session_predictions.csv", dtype={"session_id": str}).set_index("session_id")
    assert sorted(per_session.index) == sorted(sessions)  # every session exactly once
    assert per_session.loc[lost, "stories_scored"] == 0 and "no transcript" in per_session.loc[lost, "reason"]
    assert per_session.loc[silent, "stories_scored"] == 0 and "no story_share" in per_session.loc[silent, "reason"]
    assert (per_session.drop(index=[lost, silent]).stories_scored > 0).all()
    windows = pd.read_csv(out / "window_predictions.csv", dtype={"session_id": str, "story_id": str})
    means = windows.groupby(["session_id", "story_id"]).raw_predicted.mean()
    indexed = scored.set_index(["session_id", "story_id"])
    assert np.allclose(means.loc[indexed.index].to_numpy(), indexed.raw_predicted.to_numpy(), atol=1e-5)
    assert "Demo model" in done.stdout and "**Model:**" in (out / "model_card.md").read_text()

    # the numbers are the model's: the test split's pairs get the test report's predictions
    test = pd.read_csv(text_fusion_run / "test_predictions.csv", dtype={"session_id": str, "story_id": str})
    test = test[~test.session_id.isin([lost, silent])].set_index(["session_id", "story_id"])
    assert len(test) and np.allclose(indexed.loc[test.index].raw_predicted.to_numpy(), test.predicted.to_numpy(),
                                     atol=1e-4)


@pytest.mark.slow
def test_predict_scores_a_text_table_without_labels_from_an_installed_package(installed, tmp_path):
    expected = json.loads((FORMAT2 / "expected.json").read_text())
    texts = expected["texts"]
    table = pd.DataFrame({"id": ["a", "b", "c", "d"], "text": [texts[0], "   ", texts[1], texts[2]],
                          "note": ["x", "y", "", "z"]})
    table.to_csv(tmp_path / "new.csv", index=False)
    out = tmp_path / "out"
    done = _predict(installed, f"ckpt_path={FORMAT2 / 'text_regressor.ckpt'}", f"data.path={tmp_path / 'new.csv'}",
                    f"out_dir={out}", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-3000:]
    scores = pd.read_csv(out / "predictions.csv", dtype={"id": str, "note": str}, keep_default_na=False)
    assert scores.id.tolist() == ["a", "b", "c", "d"] and scores.note.tolist() == ["x", "y", "", "z"]  # kept, in order
    assert scores.status.tolist() == ["scored", "not scored", "scored", "scored"]
    assert "every text field (text) is empty" in scores.reason[1]
    raw = pd.to_numeric(scores.predicted_emotional_raw[[0, 2, 3]]).to_numpy()
    assert raw == pytest.approx(expected["text_scores"]["emotional"], abs=1e-4)  # what the checkpoint predicts
    assert (out / "model_card.md").is_file()


def test_predict_names_the_kind_of_data_a_checkpoint_needs(tmp_path):
    from empathic_fusion.config import ConfigError
    from empathic_fusion.scoring.command import run_predict
    from empathic_fusion.compose import compose_config

    cfg = compose_config([f"ckpt_path={FORMAT2 / 'text_regressor.ckpt'}", f"data.dataset_dir={tmp_path}",
                          f"out_dir={tmp_path / 'out'}"], tmp_path / "run", "predict")
    with pytest.raises(ValueError, match="is a text checkpoint: give data.path="):
        run_predict(cfg)
    cfg = compose_config([f"ckpt_path={FORMAT2 / 'fusion_lf_lstm.ckpt'}", f"data.path={tmp_path / 'x.csv'}",
                          f"out_dir={tmp_path / 'out'}"], tmp_path / "run", "predict")
    with pytest.raises(ValueError, match="is a fusion checkpoint: give data.dataset_dir="):
        run_predict(cfg)
    with pytest.raises(ConfigError, match="ckpt_path=None: must be a checkpoint file or a run folder"):
        run_predict(compose_config([], tmp_path / "run", "predict"))


def test_a_table_without_the_models_text_column_is_refused_naming_file_and_columns(tmp_path):
    from empathic_fusion.scoring.table import TableError, read_table

    pd.DataFrame({"utterance": ["hi"]}).to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(TableError, match=r"t.csv: missing column\(s\) \['text'\]; the model reads column\(s\) \['text'\]"):
        read_table(tmp_path / "t.csv", ["text"])
    (tmp_path / "latin1.csv").write_bytes("text\nsch\xf6n\n".encode("latin-1"))
    with pytest.raises(TableError, match="latin1.csv, line 2: is not UTF-8"):
        read_table(tmp_path / "latin1.csv", ["text"])


@pytest.fixture(scope="module")
def conversation_run(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    """The shipped EmpatheticExchanges recipe (experiment=text_empathetic_exchanges: context columns and the
    previous turn of the conversation) trained on a small table of that shape, cut to seconds (3 folds, 2
    epochs). A reply's rating is the previous reply's emotional level (the first one's its own), so the model
    leans on previous_turns. Turn numbers 1, 6, 11: read as text they would order 11 before 6."""
    from empathic_fusion.pipeline import train
    from empathic_fusion.demo.generated_table import make_text_table
    from empathic_fusion.compose import compose_config

    root = tmp_path_factory.mktemp("conversation_run")
    rows = make_text_table(18, 3, seed=0)
    table = pd.DataFrame({"conv_id": rows.writer, "exchange_number": rows.turn * 5 + 1, "listener_utterance": rows.text,
                          "speaker_utterance": [f"my day {i % 4} was hard" for i in range(len(rows))],
                          "prompt": "work",
                          "empathy": rows.groupby("writer").emotional.shift(1).fillna(rows.emotional).astype(int)})
    table.to_csv(root / "table.csv", index=False)
    train(compose_config(["experiment=text_empathetic_exchanges", f"data.path={root / 'table.csv'}", "data.cv_folds=3",
                          "trainer.max_epochs=2", "model.net.encoder.cache_dir=null", "logger=none",
                          "trainer.enable_progress_bar=false", "evaluation.bootstrap=20", "evaluation.plots=false"],
                         root / "out"))
    return root / "out", table


@pytest.mark.slow
def test_predict_builds_the_previous_turns_of_the_shipped_text_recipe_from_the_raw_columns(conversation_run, tmp_path):
    """Scoring the training table without its labels (rows shuffled) needs only the raw columns: every row is
    scored, and the test fold's rows get the test report's predictions, so previous_turns was built as in
    training (from conv_id and exchange_number), not left empty."""
    from empathic_fusion.scoring.command import run_predict
    from empathic_fusion.datamodules.text_table import PREVIOUS_TURNS
    from empathic_fusion.scoring.text import TextScorer
    from empathic_fusion.compose import compose_config

    run, table = conversation_run
    unlabelled = table.drop(columns="empathy").assign(row=np.arange(len(table))).sample(frac=1.0, random_state=1)
    unlabelled.to_csv(tmp_path / "new.csv", index=False)
    result = run_predict(compose_config([f"ckpt_path={run}", f"data.path={tmp_path / 'new.csv'}",
                                         f"out_dir={tmp_path / 'out'}", "progress=false"], tmp_path / "run", "predict"))
    assert (result.scored, result.not_scored) == (len(table), 0)
    scores = pd.read_csv(tmp_path / "out" / "predictions.csv").set_index("row")
    assert (scores.status == "scored").all() and list(scores.index) == list(unlabelled.row)  # every row, in order
    test = pd.read_csv(run / "test_predictions.csv")
    assert len(test) > 0
    np.testing.assert_allclose(scores.loc[test.row_index, "predicted_empathy_raw"], test.prediction, atol=1e-4)

    scorer = TextScorer.load(run)
    assert scorer.input_columns == ["listener_utterance", "speaker_utterance", "prompt", "conv_id", "exchange_number"]
    later = table[table.exchange_number > 1]  # rows with a previous turn: without it they score differently
    fields = {f: later[f].tolist() for f in ("listener_utterance", "speaker_utterance", "prompt")}
    blind = scorer.score({**fields, PREVIOUS_TURNS: [""] * len(later)})["empathy"]
    assert np.abs(blind - scores.loc[later.index, "predicted_empathy_raw"].to_numpy()).mean() > 0.1


@pytest.mark.slow
def test_predict_names_the_raw_columns_a_derived_field_is_built_from(conversation_run, tmp_path):
    from empathic_fusion.scoring.command import run_predict
    from empathic_fusion.scoring.table import TableError
    from empathic_fusion.compose import compose_config

    run, table = conversation_run
    table.drop(columns=["empathy", "conv_id"]).to_csv(tmp_path / "new.csv", index=False)
    cfg = compose_config([f"ckpt_path={run}", f"data.path={tmp_path / 'new.csv'}", f"out_dir={tmp_path / 'out'}",
                          "progress=false"], tmp_path / "run", "predict")
    with pytest.raises(TableError) as error:
        run_predict(cfg)
    message = str(error.value)
    assert "missing column(s) ['conv_id']" in message and "previous_turns is built from conv_id and exchange_number" \
        in message and "'previous_turns'" not in message.split(";")[0]


@pytest.mark.slow
def test_the_text_tab_asks_for_the_raw_texts_and_earlier_turns_not_for_previous_turns(conversation_run):
    """The app's Text tab of the same recipe: boxes for the table's text columns and the conversation's
    earlier turns, none for the derived previous_turns; typing the earlier turn gives predict's score."""
    from empathic_fusion.app.text import TextModel
    from empathic_fusion.app.ui import build_app
    from empathic_fusion.scoring.table import score_table

    run, table = conversation_run
    model = TextModel(run)
    assert model.inputs == ["listener_utterance", "speaker_utterance", "prompt"] and model.context_turns == 1
    labels = [getattr(block, "label", None) or "" for block in build_app(text_scorer=model).blocks.values()]
    assert not any("previous_turns" == label for label in labels) and any("earlier turns" in label for label in labels)
    conversation = table[table.conv_id == table.conv_id.iloc[0]].sort_values("exchange_number")
    first, second = conversation.iloc[0], conversation.iloc[1]
    typed = {c: second[c] for c in model.inputs}
    earlier = f"{first.speaker_utterance} {first.prompt} {first.listener_utterance}"  # the turn as training joins it
    path = Path(run).parent / "conversation.csv"
    conversation.drop(columns="empathy").to_csv(path, index=False)
    expected = score_table(model.scorer, model.card, path, progress=False)["predicted_empathy_raw"].iloc[1]
    assert model.score(typed, {}, [earlier])["empathy"].raw == pytest.approx(expected, abs=1e-4)
    assert model.score(typed, {})["empathy"].raw != pytest.approx(expected, abs=1e-4)  # the earlier turn counts


@pytest.mark.slow
def test_a_session_shorter_than_a_window_is_scored_as_one_window_and_every_session_has_a_row(
        text_fusion_run, tiny_dataset, tmp_path):
    """A session whose clock ends at 2.4 s (the text model's: its transcript) is scored as one 8 s window,
    as training would window it (datamodules/windows.py), with a note and its real times; a session without
    a transcript has no pair to score and still has its row in predictions.csv, with the reason."""
    from empathic_fusion.scoring.command import run_predict
    from empathic_fusion.compose import compose_config

    dataset = Path(shutil.copytree(tiny_dataset, tmp_path / "new_sessions"))
    (dataset / "ratings.csv").unlink()
    sessions = pd.read_csv(dataset / "sessions.csv", dtype=str).session_id.tolist()
    short, lost = sessions[0], sessions[1]
    (dataset / "transcripts" / f"{lost}.csv").unlink()
    transcript = dataset / "transcripts" / f"{short}.csv"
    rows = pd.read_csv(transcript, dtype=str, keep_default_na=False)
    rows = rows[(rows.phase == "story_share") & (rows.speaker == "participant")].head(1).assign(start="0.2", end="2.4")
    rows.to_csv(transcript, index=False)
    out = tmp_path / "out"
    result = run_predict(compose_config([f"ckpt_path={text_fusion_run}", f"data.dataset_dir={dataset}",
                                         f"data.store_dir={tmp_path / 'store'}", f"out_dir={out}", "progress=false"],
                                        tmp_path / "run", "predict"))
    pairs = pd.read_csv(out / "predictions.csv", dtype={"session_id": str, "story_id": str}, keep_default_na=False)
    mine = pairs[pairs.session_id == short]
    assert len(mine) and (mine.status == "scored").all() and (mine.windows == 1).all()
    assert mine.note.str.contains("2.4 s long, shorter than one window \\(8 s\\)").all()
    assert (pairs[pairs.session_id != short].note == "").all()
    windows = pd.read_csv(out / "window_predictions.csv", dtype={"session_id": str})
    own = windows[windows.session_id == short]
    assert own.start_s.tolist() == [0.0] * len(mine) and own.end_s.tolist() == pytest.approx([2.4] * len(mine))
    assert (windows.end_s - windows.start_s <= 8.0 + 1e-9).all()
    lone = pairs[pairs.session_id == lost]  # no transcript: one row, no story, its reason
    assert len(lone) == 1 and lone.story_id.iloc[0] == "" and lone.status.iloc[0] == "not scored"
    assert "no transcript" in lone.reason.iloc[0]
    assert result.not_scored == int((pairs.status != "scored").sum()) and result.scored + result.not_scored == len(pairs)
