"""A small synthetic text table with planted signal, for tests and a first try of the text pipeline.

Each row is one turn of a writer; its text mixes phrases of three kinds with neutral filler.
Cognitive, emotional and behavioral labels (1-5) rise with the number of phrases of their kind;
with `persona_effect`, readers with high empathic concern rate emotional empathy one level higher
(the persona column carries signal the text does not).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

PHRASES = {
    "cognitive": ["I understand how you feel", "it sounds like you are overwhelmed", "I can see why that hurts",
                  "that must be confusing for you", "I hear what you are saying"],
    "emotional": ["I am so sorry", "my heart goes out to you", "that makes me sad too", "I feel your pain",
                  "this breaks my heart"],
    "behavioral": ["you could talk to a counselor", "try writing down your thoughts", "let us make a plan together",
                   "maybe take a short walk", "call a friend tonight"],
}
FILLER = ["the bus was late", "we had pasta for dinner", "the report is due on monday", "it rained all day",
          "the store closes at nine", "my phone battery died", "the meeting moved to noon"]


def make_text_table(n_writers: int = 60, turns_per_writer: int = 4, seed: int = 0,
                    persona_effect: bool = False) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for w in range(n_writers):
        concern = int(rng.integers(1, 6))
        gender = str(rng.choice(["female", "male", "nonbinary"]))
        for t in range(turns_per_writer):
            counts = {k: int(rng.integers(0, 3)) for k in PHRASES}
            parts = [str(rng.choice(FILLER))] + [str(p) for k, c in counts.items()
                                                 for p in rng.choice(PHRASES[k], size=c, replace=False)]
            order = rng.permutation(len(parts))
            text = ". ".join(parts[i] for i in order).capitalize() + "."
            labels = {k: int(np.clip(1 + 2 * c + rng.choice([-1, 0, 0, 0, 1]), 1, 5)) for k, c in counts.items()}
            if persona_effect:
                labels["emotional"] = int(np.clip(labels["emotional"] + (2 if concern >= 4 else -1), 1, 5))
            rows.append({"writer": f"w{w:03d}", "turn": t, "text": text, **labels,
                         "gender": gender, "empathic_concern": concern})
    return pd.DataFrame(rows)
