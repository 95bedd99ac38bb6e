"""The README stays a front page: under its 200-line budget, and every `make` target it names exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_is_under_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) < 200


def test_every_make_target_the_readme_names_is_in_the_makefile():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    named = set(re.findall(r"\bmake ([a-z][a-z-]*)", (ROOT / "README.md").read_text()))
    assert named and named <= targets, named - targets
