"""The Gradio app (serve.py) driven in headless Chromium with the network blocked: text scores and
flagging, a real clip scored with a tiny fusion checkpoint, every bad upload answered in the page;
screenshots of both tabs go to docs/. Also the per-session timelines of a run's test report."""
from __future__ import annotations

import csv
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import cv2
import numpy as np
import pytest

from empathic_fusion.utils import PROJECT_ROOT
from empathic_fusion.utils.compose import compose_config

LABELS = ["cognitive", "emotional", "behavioral"]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MEDIA = PROJECT_ROOT.parent / "shared" / "data" / "media"
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists() and os.environ.get("CI") != "true",
                                    reason="needs Debian chromium (.ci/run installs it; in CI this test must run)")


@pytest.fixture(scope="module")
def text_model(tmp_path_factory) -> Path:
    """A tiny text regressor with persona columns trained by the one training path (frozen packaged encoder)."""
    from empathic_fusion.pipeline import train
    from empathic_fusion.text.synthetic import make_text_table

    root = tmp_path_factory.mktemp("text_model")
    make_text_table(16, 2, seed=0, persona_effect=True).to_csv(root / "table.csv", index=False)
    cfg = compose_config(["data=text_csv", "model=text_regressor", "modality=t", f"data.path={root / 'table.csv'}",
                          "data.text_columns=[text]", f"data.label_columns=[{','.join(LABELS)}]",
                          "data.group_column=writer", "data.cv_folds=2", "data.persona_columns=[gender,empathic_concern]",
                          "model.net.encoder.cache_dir=null", "trainer.max_epochs=3", "trainer.enable_progress_bar=false",
                          "trainer.accelerator=cpu", "logger=none", "model.baselines.enabled=false"], root / "out")
    return Path(train(cfg)["best_checkpoint"])


@pytest.fixture(scope="module")
def fusion_run(tiny_dataset, tiny_store, tmp_path_factory) -> tuple[dict, Path]:
    """One epoch of the default fusion model on the tiny demo: a checkpoint with normalisation stats."""
    from empathic_fusion.pipeline import train

    out = tmp_path_factory.mktemp("fusion_run")
    cfg = compose_config([f"data.dataset_dir={tiny_dataset}", f"data.store_dir={tiny_store}", "data.demo=null",
                          "data.split_fractions=[0.6,0.2,0.2]", "data.extract_workers=1", "trainer.max_epochs=1",
                          "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", "logger=none",
                          "trainer.enable_model_summary=false", "evaluation.bootstrap=0"], out, "train")
    return train(cfg), out


def test_test_report_writes_a_local_timeline_per_test_session(fusion_run):
    import pandas as pd

    results, out = fusion_run
    sessions = set(pd.read_csv(out / "test_window_predictions.csv").session_id)
    written = {p.stem for p in (out / "test_timelines").glob("*.png")}
    assert sessions and written == sessions
    assert min(p.stat().st_size for p in (out / "test_timelines").glob("*.png")) > 5000


def test_checkpoint_carries_the_training_normalisation(fusion_run):
    import torch

    from empathic_fusion.models.empathy_module import STATS_KEY

    checkpoint = torch.load(fusion_run[0]["best_checkpoint"], map_location="cpu", weights_only=False)
    mean, std = checkpoint[STATS_KEY]["video"]
    assert mean.shape == std.shape == (1451,) and bool((std > 0).all())


def _blank_video(path: Path, seconds: float, fps: int = 15) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (160, 120))
    for _ in range(int(seconds * fps)):
        writer.write(np.full((120, 160, 3), 90, np.uint8))
    writer.release()
    return path


@pytest.fixture(scope="module")
def app_url(text_model, fusion_run, tmp_path_factory):
    from empathic_fusion.app.clip import ClipScorer
    from empathic_fusion.app.text import load_text_scorer
    from empathic_fusion.app.ui import build_app, launch

    flags = tmp_path_factory.mktemp("flags") / "flagged.csv"
    clip = ClipScorer(fusion_run[0]["best_checkpoint"], max_upload_mb=5.0)  # the demo .avi is 3.6 MB
    app = build_app(load_text_scorer(text_model), clip, flags)
    _, url, _ = launch(app, "127.0.0.1", None, block=False)
    yield url, flags
    app.close()


def _upload(page, elem_id: str, path: Path) -> None:
    page.set_input_files(f"#{elem_id} input[type=file]", str(path))
    page.wait_for_selector(f"#{elem_id} >> text={path.name}")


@needs_chromium
def test_app_in_headless_chromium_without_network(app_url, text_model, tiny_dataset, tmp_path):
    from playwright.sync_api import sync_playwright

    from empathic_fusion.app.text import load_text_scorer, score_text

    url, flags = app_url
    if MEDIA.is_dir():
        clip, audio = MEDIA / "WolfgangLanger_Pexels.mp4", None  # real person, silent AAC track
        short = MEDIA / "single_face.mp4"  # 2.4 s: shorter than one 8 s window
    else:
        clip, audio = tiny_dataset / "media" / "p001_s1.avi", tiny_dataset / "media" / "p001_s1.wav"
        short = _blank_video(tmp_path / "short.avi", 2.0)
    unreadable = tmp_path / "broken.mp4"
    unreadable.write_bytes(b"not a video at all" * 100)
    unsupported = tmp_path / "notes.txt"
    unsupported.write_text("hello")
    too_big = tmp_path / "huge.mp4"
    too_big.write_bytes(b"\0" * int(5.5 * 2 ** 20))
    no_face = _blank_video(tmp_path / "no_face.avi", 10.0)
    no_audio = tiny_dataset / "media" / "p001_s1.avi"  # the demo's video-only container
    bad_transcript = tmp_path / "transcript.csv"
    bad_transcript.write_text("start,end,speaker,phase,story_id,text\n"
                              "0,5,participant,story_share,,hi\n3,1,robot,x,,bad\n")
    story = "My grandmother taught me to bake bread every Sunday; when she passed away I kept the habit."
    text = "I am so sorry. My heart goes out to you. Maybe take a short walk."
    external: list[str] = []

    def block_external(route):
        host = urlparse(route.request.url).hostname
        if host in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            external.append(route.request.url)
            route.abort()

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch_persistent_context(profile, executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                                           headless=True, timeout=60000,
                                                           viewport={"width": 1200, "height": 1100})
            page = browser.new_page()
            page.route("**/*", block_external)
            page.set_default_timeout(60000)

            def open_clip_tab():
                page.goto(url)
                page.get_by_role("tab", name="Clip").click()

            def clip_message(video: Path, audio_file: Path | None = None, transcript: Path | None = None) -> str:
                open_clip_tab()
                _upload(page, "clip-video", video)
                if audio_file:
                    _upload(page, "clip-audio", audio_file)
                if transcript:
                    _upload(page, "clip-transcript-file", transcript)
                page.fill("#clip-story textarea", story)
                page.click("#clip-submit")
                page.wait_for_selector("#clip-status >> text=/scored|Cannot score/", timeout=240000)
                return page.text_content("#clip-status")

            # Text tab: type, score, read every output back, flag
            page.goto(url)
            page.fill("#text-text textarea", text)
            page.click("#text-submit")
            page.wait_for_selector("#text-status >> text=scored")
            shown = {n: float(page.input_value(f"#score-{n} input")) for n in LABELS + ["overall"]}
            page.click("#text-flag")
            page.wait_for_selector("#text-status >> text=flagged")
            page.screenshot(path=str(PROJECT_ROOT / "docs" / "app_text_tab.png"), full_page=True)

            # Clip tab: a real clip with a story
            message = clip_message(clip, audio)
            assert "scored" in message, message
            rating = float(page.input_value("#clip-rating input"))
            width = page.eval_on_selector("#clip-timeline img", "img => img.naturalWidth")
            page.screenshot(path=str(PROJECT_ROOT / "docs" / "app_clip_tab.png"), full_page=True)

            bad = {"no face": clip_message(no_face, tiny_dataset / "media" / "p001_s1.wav"),
                   "no audio": clip_message(no_audio),
                   "short": clip_message(short),
                   "unreadable": clip_message(unreadable),
                   "unsupported": clip_message(unsupported),
                   "too big": clip_message(too_big),
                   "transcript": clip_message(clip, audio, bad_transcript)}
            browser.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert not external, f"the page requested outside hosts: {external[:5]}"
    expected = score_text(load_text_scorer(text_model), {"text": text}, {})
    assert shown == pytest.approx(expected, abs=1e-3)
    with flags.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and rows[0]["text"] == text
    assert 1.0 <= rating <= 5.0 and width > 100
    assert "no face found" in bad["no face"]
    assert "no audio track" in bad["no audio"]
    assert "shorter than one window" in bad["short"]
    assert "unreadable video" in bad["unreadable"]
    assert "unsupported file type" in bad["unsupported"]
    assert "upload limit" in bad["too big"]
    assert "transcript does not parse" in bad["transcript"] and "line 3" in bad["transcript"]
