"""LLM judge: an evaluation, not a training run. The papers' prompts are sent to an OpenAI-compatible
chat endpoint (the `openai` client), answers parsed into scores and scored per CV test fold with
the same metrics and mean ± std tables as the trained models (`python evaluate.py judge=llm_judge
+data=empathetic_exchanges`, conf/judge/llm_judge.yaml).

Prompts:
- `story_share`: Shen, Kim et al. 2024 (EmpathicStories++), Appendix C, Story Sharing: how much
  person A (first context column) would empathize with B's story (the text), 0-1, rescaled.
- `story_empathy`: Roshanaei, Rezapour and Seif El-Nasr ("Talk, Listen, Connect"), Appendix B,
  Figure 5: Role + Instructions + Story + Task 1 (empathy felt for the storyteller, digits 1-5).
  Tasks 2-5 are left out: only Task 1 is scored.
- `story_persona`: "Talk, Listen, Connect", Appendix B, Figure 6: the same with the reader's persona
  (the data's persona columns) put in the role.
- `listener_turn`: the "Talk, Listen, Connect" Figure 5 structure adapted to conversations
  (EmpatheticExchanges): the same role and output format, asking how empathic the listener's reply is.
EmpathicStories++'s Reflection prompt is cut off in the paper text we have, so it is not offered.
Endpoint, key, model, retries and timeout come from the environment only: EMPATHIC_LLM_BASE_URL,
EMPATHIC_LLM_API_KEY, EMPATHIC_LLM_MODEL, EMPATHIC_LLM_MAX_RETRIES, EMPATHIC_LLM_TIMEOUT_S.
Answers are cached on disk under the SHA-256 of (model, messages, temperature, max_tokens).
The evaluation over a table's CV folds is empathic_fusion/evaluation/judge_report.py.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

ENV_BASE_URL, ENV_API_KEY, ENV_MODEL = "EMPATHIC_LLM_BASE_URL", "EMPATHIC_LLM_API_KEY", "EMPATHIC_LLM_MODEL"
ENV_MAX_RETRIES, ENV_TIMEOUT = "EMPATHIC_LLM_MAX_RETRIES", "EMPATHIC_LLM_TIMEOUT_S"
PSYCHOLOGIST = ("You are a psychologist with expertise in analyzing empathy. You can predict how much people might "
                "empathize with each other, based on their past experiences.")
STORY_SHARE_USER = ("You will receive two stories, one from person A and the other from person B. Please predict, on a "
                    "scale from 0 to 1, how much person A would empathize with B's story. Return just the number, no "
                    "other text.\n\nPerson A's story: \"{story_a}\"\n\nPerson B's story: \"{story_b}\"")
ASSESSOR_ROLE = ("Role: You are an AI assistant designed to assess the empathy level of individuals based on their "
            "storytelling. Empathy is defined as the ability to understand, share, and vicariously experience the "
            "feelings, thoughts, and experiences of another person.")
PERSONA_ROLE = ("Role: You are {persona}. You are reading stories people shared about events in their lives. "
                    "Empathy is defined as the ability to understand, share, and vicariously experience the feelings, "
                    "thoughts, and experiences of another person.")
STORY_INSTRUCTIONS = ("Instructions: We previously recorded 170 people as they shared stories about events in their lives. "
                    "The audio from these videos was transcribed into text, resulting in some grammar errors and "
                    "misspellings. Additionally, you may notice fillers such as \"um,\" \"like,\" \"you know,\" \"I mean,\" "
                    "or \"okay.\" Please focus on the content of the story and try to ignore these errors. Read the story "
                    "carefully, as you will be asked to answer several questions about it.")
STORY_TASK = ("# Task 1:\n# - Question: To what extent did you feel empathy for the storyteller?\n"
             "# - Response: Please provide only digits, no decimals. Use the following scale:\n"
             "#   - 1 (Not at all)\n#   - 2 (A little)\n#   - 3 (Moderately)\n#   - 4 (Quite a bit)\n#   - 5 (Extremely)")
LISTENER_TASK = ("# Task 1:\n# - Question: To what extent does the listener's reply express empathy for the speaker?\n"
                 "# - Response: Please provide only digits, no decimals. Use the following scale:\n"
                 "#   - 1 (Not at all)\n#   - 2 (A little)\n#   - 3 (Moderately)\n#   - 4 (Quite a bit)\n#   - 5 (Extremely)")
PROMPTS = ("story_share", "story_empathy", "story_persona", "listener_turn")
PROMPT_SCALE = {"story_share": (0.0, 1.0), "story_empathy": (1.0, 5.0), "story_persona": (1.0, 5.0),
                "listener_turn": (1.0, 5.0)}


def describe_persona(persona: dict[str, Any]) -> str:
    """'a reader with gender: female, empathic concern: 4' from persona columns (missing ones skipped)."""
    parts = [f"{k.replace('_', ' ')}: {v}" for k, v in persona.items() if v is not None and not pd.isna(v)]
    return "a reader with " + ", ".join(parts) if parts else "a reader"


def build_messages(prompt: str, text: str, context: list[str] | None = None,
                   persona: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """Chat messages for one item; `context[0]` is person A's story (story_share) or the speaker turn."""
    context = [c for c in (context or []) if c]
    if prompt == "story_share":
        if not context:
            raise ValueError("prompt story_share needs person A's story: give a context column")
        return [{"role": "system", "content": PSYCHOLOGIST},
                {"role": "user", "content": STORY_SHARE_USER.format(story_a=context[0], story_b=text)}]
    if prompt in ("story_empathy", "story_persona"):
        role = PERSONA_ROLE.format(persona=describe_persona(persona or {})) if prompt == "story_persona" else ASSESSOR_ROLE
        body = f"{role}\n\n{STORY_INSTRUCTIONS}\n\nStory: \"{text}\"\n\nTasks:\n\n{STORY_TASK}\n\nAnswer as:\nTask 1:\n- Response: <digit>"
        return [{"role": "user", "content": body}]
    if prompt == "listener_turn":
        convo = "\n".join(f"Context: \"{c}\"" for c in context[1:]) + ("\n" if len(context) > 1 else "")
        speaker = f"Speaker: \"{context[0]}\"\n" if context else ""
        body = (f"{ASSESSOR_ROLE}\n\nInstructions: Below is part of a conversation. Read the speaker's turn and the "
                f"listener's reply carefully.\n\n{convo}{speaker}Listener: \"{text}\"\n\nTasks:\n\n{LISTENER_TASK}\n\n"
                "Answer as:\nTask 1:\n- Response: <digit>")
        return [{"role": "user", "content": body}]
    raise ValueError(f"unknown prompt {prompt!r}; known: {list(PROMPTS)}")


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def parse_score(answer: str, prompt: str, scale: tuple[float, float]) -> float:
    """The judge's number mapped to the label scale; NaN when there is no number in range.
    With 'Response:' in the answer the number after it counts (so 'Task 1' is not read as 1)."""
    if answer is None:
        return float("nan")
    tail = answer.split("Response:", 1)[1] if "Response:" in answer else answer
    match = _NUMBER.search(tail)
    if not match:
        return float("nan")
    value = float(match.group(0))
    low, high = PROMPT_SCALE[prompt]
    if not low <= value <= high:
        return float("nan")
    return scale[0] + (value - low) / (high - low) * (scale[1] - scale[0])


class ChatClient:
    """Chat completions through the `openai` client (its retries with backoff and its timeout), with a
    disk cache by prompt hash so a rerun sends nothing it has asked before."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, cache_dir: str | Path | None = None,
                 timeout_s: float = 60.0, max_retries: int = 4, temperature: float = 0.0, max_tokens: int = 16):
        from openai import OpenAI

        self.base_url, self.model = base_url, model
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.temperature, self.max_tokens = temperature, max_tokens
        self.client = OpenAI(base_url=base_url, api_key=api_key or "unused", timeout=timeout_s, max_retries=max_retries)
        self.requests = 0  # completions asked for (not answered from the cache)

    @classmethod
    def from_env(cls, **kwargs: Any) -> "ChatClient | None":
        """None without EMPATHIC_LLM_BASE_URL; retries and timeout from the environment when set."""
        base = os.environ.get(ENV_BASE_URL)
        if not base:
            return None
        if os.environ.get(ENV_MAX_RETRIES):
            kwargs["max_retries"] = int(os.environ[ENV_MAX_RETRIES])
        if os.environ.get(ENV_TIMEOUT):
            kwargs["timeout_s"] = float(os.environ[ENV_TIMEOUT])
        return cls(base, os.environ.get(ENV_MODEL, "default"), os.environ.get(ENV_API_KEY), **kwargs)

    def _payload(self, messages: list[dict[str, str]]) -> dict:
        return {"model": self.model, "messages": messages, "temperature": self.temperature, "max_tokens": self.max_tokens}

    def cache_key(self, messages: list[dict[str, str]]) -> str:
        return hashlib.sha256(json.dumps(self._payload(messages), sort_keys=True).encode()).hexdigest()

    def complete(self, messages: list[dict[str, str]]) -> str:
        from openai import OpenAIError

        key = self.cache_key(messages)
        cached = self.cache_dir / f"{key}.json" if self.cache_dir else None
        if cached is not None and cached.exists():
            return json.loads(cached.read_text())["content"]
        self.requests += 1
        try:
            response = self.client.chat.completions.create(**self._payload(messages))
        except OpenAIError as error:
            raise RuntimeError(f"{self.base_url}: no answer after {self.client.max_retries + 1} tries: "
                               f"{type(error).__name__}: {error}") from error
        content = response.choices[0].message.content or ""
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps({"content": content, "messages": messages, "model": self.model}))
        return content


def judge_rows(client: ChatClient, dm, rows: np.ndarray, prompt: str, scale: tuple[float, float]) -> np.ndarray:
    """Scores for the given rows (NaN where the answer had no usable number)."""
    first, *context_fields = dm.spec.fields
    persona_cols = dm.spec.persona_columns
    scores = []
    for i in rows:
        persona = {c: dm.table[c].iloc[i] for c in persona_cols}
        messages = build_messages(prompt, dm.fields[first][i], [dm.fields[f][i] for f in context_fields], persona)
        scores.append(parse_score(client.complete(messages), prompt, scale))
    return np.asarray(scores, dtype=float)
