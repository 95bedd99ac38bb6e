"""A headless Chromium that only reaches this machine, for the page tests and the docs screenshots.

Playwright (a `[dev]` extra) drives Debian's chromium; every request to a host other than localhost
is refused and recorded, so a page that would call out (fonts, analytics) is caught.
"""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def local_chromium(executable: str | Path, timeout_ms: float) -> Iterator[tuple[object, list[str]]]:
    """A browser context (1200 x 1100) and the list of outside URLs it was refused."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    external: list[str] = []

    def block_external(route) -> None:
        if urlparse(route.request.url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            external.append(route.request.url)
            route.abort()

    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(profile, executable_path=str(executable),
                                                           args=CHROMIUM_ARGS, headless=True, timeout=60000,
                                                           viewport={"width": 1200, "height": 1100})
            context.route("**/*", block_external)
            context.set_default_timeout(timeout_ms)
            yield context, external
            context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
