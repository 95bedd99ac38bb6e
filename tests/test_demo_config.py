"""The demo generator refuses timings that would write empty transcript rows, and its output folder
has the permissions the umask gives (a lab's shared demo data stays readable)."""
from __future__ import annotations

import os
import stat

import pytest

from empathic_fusion.dataset import load_dataset
from empathic_fusion.demo.generate import MIN_UTTERANCE_S, DemoConfig, generate_demo, plan_demo


@pytest.mark.parametrize("field, value", [("reflection_s", 3.0), ("story_share_s", 1.0), ("warm_up_s", 0.5),
                                          ("n_participants", 0)])
def test_too_short_phases_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"data.demo.{field}={value}: must be"):
        DemoConfig(**{field: value})


@pytest.mark.parametrize("reflection_s", [4.0, 8.0])
def test_every_planned_utterance_has_a_length(reflection_s):
    cfg = DemoConfig(n_participants=3, sessions_per_participant=1, warm_up_s=1.0, story_share_s=6.0,
                     story_receive_s=1.0, reflection_s=reflection_s, cool_down_s=1.0)
    _, transcripts, _ = plan_demo(cfg)
    for transcript in transcripts.values():
        assert ((transcript.end - transcript.start) >= MIN_UTTERANCE_S - 1e-6).all()


def test_demo_folder_respects_the_umask(tmp_path):
    cfg = DemoConfig(n_participants=1, sessions_per_participant=1, stories_per_session=1, frame_size=64,
                     warm_up_s=1.0, story_share_s=3.0, story_receive_s=1.0, reflection_s=4.0, cool_down_s=1.0)
    previous = os.umask(0o022)
    try:
        out = generate_demo(tmp_path / "demo", cfg, workers=1)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755  # mkdtemp alone gives 0700
    load_dataset(out)  # and what it wrote passes the dataset contract
