"""The demo dataset's generator settings (`data.demo` of conf/data/demo.yaml); the generator is
empathic_fusion/demo/generate.py."""
from __future__ import annotations

from dataclasses import dataclass

from empathic_fusion.config.checks import require

MIN_UTTERANCE_S = 0.25  # shortest transcript row the generator writes


@dataclass
class DemoConfig:
    """Size, timing and signal strength of the demo dataset."""

    n_participants: int = 30
    sessions_per_participant: int = 2
    stories_per_session: int = 3
    fps: int = 15
    frame_size: int = 256
    seed: int = 0
    # phase durations in seconds (short, so that many sessions fit a laptop's first run)
    warm_up_s: float = 2.0
    story_share_s: float = 10.0
    story_receive_s: float = 2.0
    reflection_s: float = 8.0
    cool_down_s: float = 1.5
    # latent model
    weight_video: float = 0.6
    weight_audio: float = 0.6
    weight_text: float = 0.7
    weight_trait: float = 0.3
    story_deviation_sd: float = 0.6
    noise_sd: float = 0.4
    own_topic_probability: float = 0.45

    def __post_init__(self) -> None:
        """Phases too short for their utterances would give empty or reversed transcript rows."""
        shortest = {  # (the phase's spoken part) / (utterances in it) must leave MIN_UTTERANCE_S each
            "warm_up_s": (0.5 * self.warm_up_s - 0.2, 1), "story_share_s": (self.story_share_s, 4),
            "story_receive_s": (self.story_receive_s, 1), "reflection_s": (self.reflection_s - 2.2, 2),
            "cool_down_s": (0.4 * self.cool_down_s - 0.1, 1)}
        rules = {name: (spoken / n - (0.4 if n > 1 else 0.0) >= MIN_UTTERANCE_S,
                        f"longer: too short for its {n} utterance(s) of at least {MIN_UTTERANCE_S} s")
                 for name, (spoken, n) in shortest.items()}
        for name in ("n_participants", "sessions_per_participant", "stories_per_session", "fps", "frame_size"):
            rules[name] = (getattr(self, name) >= 1, "an integer >= 1")
        require("data.demo", self, rules)
