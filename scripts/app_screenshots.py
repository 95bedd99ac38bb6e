"""Refresh the web app's screenshots in docs/ (docs/app_text_tab.png, docs/app_clip_tab.png).

Serves the given models (checkpoints or run folders; by default those `make serve` trains), scores
a typed text and a clip in headless Chromium (Debian's /usr/bin/chromium through Playwright) with
every non-local request refused, and saves a full-page screenshot of each tab:

    make serve   # once, to train the demo models (then Ctrl+C)
    .venv/bin/python scripts/app_screenshots.py [--fusion RUN] [--text RUN] [--clip VIDEO] [--out docs]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVE_DIR = ROOT / "logs" / "serve_demo"
STORY = "My grandmother taught me to bake bread every Sunday; when she passed away I kept the habit."
TEXT = "I am so sorry. My heart goes out to you. Maybe take a short walk."


def default_text_run() -> Path:
    """The text run `make serve` serves: EmpatheticExchanges when it was trained, else the synthetic table."""
    real = SERVE_DIR / "text_empathetic_exchanges"
    return real if real.is_dir() else SERVE_DIR / "text_synthetic"


def default_clip() -> Path:
    """A real person on camera when ../shared/data/media is there, else a session of the demo dataset."""
    real = ROOT.parent / "shared" / "data" / "media" / "WolfgangLanger_Pexels.mp4"
    return real if real.is_file() else ROOT / "data" / "demo" / "media" / "p001_s1.avi"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fusion", type=Path, default=SERVE_DIR / "fusion", help="fusion checkpoint or run folder")
    parser.add_argument("--text", type=Path, default=None, help="text checkpoint or run folder")
    parser.add_argument("--clip", type=Path, default=None, help="video to score in the Clip tab")
    parser.add_argument("--chromium", type=Path, default=Path("/usr/bin/chromium"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))

    from empathic_fusion.app.clip import ClipScorer
    from empathic_fusion.app.text import TextModel
    from empathic_fusion.app.browser import local_chromium
    from empathic_fusion.app.ui import build_app, launch

    text = TextModel(args.text or default_text_run())
    clip = ClipScorer(args.fusion)
    video = args.clip or default_clip()
    flags = Path(tempfile.mkdtemp(prefix="empathy-flags-")) / "flagged.csv"
    app = build_app(text, clip, flags)
    _, url, _ = launch(app, "127.0.0.1", None, block=False)
    try:
        with local_chromium(args.chromium, timeout_ms=600000) as (browser, external):
            page = browser.new_page()
            page.goto(url)
            page.fill(f"#text-{text.inputs[0]} textarea", TEXT)
            page.click("#text-submit")
            page.wait_for_selector("#text-status >> text=scored")
            args.out.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out / "app_text_tab.png"), full_page=True)
            page.get_by_role("tab", name="Clip").click()
            page.set_input_files("#clip-video input[type=file]", str(video))
            page.wait_for_selector(f"#clip-video >> text={video.name}")
            page.fill("#clip-story textarea", STORY)
            page.click("#clip-submit")
            page.wait_for_selector("#clip-status >> text=/scored|Cannot score/")
            status = page.text_content("#clip-status")
            if "Cannot score" in status:
                raise SystemExit(f"the clip was not scored: {status}")
            page.screenshot(path=str(args.out / "app_clip_tab.png"), full_page=True)
    finally:
        app.close()
        shutil.rmtree(flags.parent, ignore_errors=True)
    if external:
        raise SystemExit(f"the page requested outside hosts: {external[:5]}")
    print(f"wrote {args.out / 'app_text_tab.png'} and {args.out / 'app_clip_tab.png'}")


if __name__ == "__main__":
    main()
