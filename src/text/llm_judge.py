"""LLM-judge baseline: the papers' prompts sent to an OpenAI-compatible chat endpoint, answers parsed
into scores and scored with the same metrics as the text models.

Prompts:
- `story_share`: 002 (EmpathicStories++) Appendix C, Story Sharing: how much person A (first context
  column) would empathize with B's story (the text), 0-1, rescaled to the label scale.
- `story_empathy`: 000 (Talk, Listen, Connect) Appendix B, Figure 5: Role + Instructions + Story +
  Task 1 (empathy felt for the storyteller, digits 1-5). Tasks 2-5 are left out: only Task 1 is scored.
- `story_persona`: 000 Appendix B, Figure 6: the same with the reader's persona (the data's persona
  columns) put in the role.
- `listener_turn`: adapted from 000's Figure 5 structure for conversations (EmpatheticExchanges): the
  same role and output format, asking how empathic the listener's reply is to the speaker turn.
002's Reflection prompt is cut off in the seed text, so it is not offered.
Endpoint, key and model come only from EMPATHIC_LLM_BASE_URL, EMPATHIC_LLM_API_KEY, EMPATHIC_LLM_MODEL.
Answers are cached on disk under the SHA-256 of (model, messages, temperature, max_tokens).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from src.text.metrics import format_fold_table, summarize_folds, text_metrics

log = logging.getLogger(__name__)

ENV_BASE_URL, ENV_API_KEY, ENV_MODEL = "EMPATHIC_LLM_BASE_URL", "EMPATHIC_LLM_API_KEY", "EMPATHIC_LLM_MODEL"
PSYCHOLOGIST = ("You are a psychologist with expertise in analyzing empathy. You can predict how much people might "
                "empathize with each other, based on their past experiences.")
STORY_SHARE_USER = ("You will receive two stories, one from person A and the other from person B. Please predict, on a "
                    "scale from 0 to 1, how much person A would empathize with B's story. Return just the number, no "
                    "other text.\n\nPerson A's story: \"{story_a}\"\n\nPerson B's story: \"{story_b}\"")
ROLE_000 = ("Role: You are an AI assistant designed to assess the empathy level of individuals based on their "
            "storytelling. Empathy is defined as the ability to understand, share, and vicariously experience the "
            "feelings, thoughts, and experiences of another person.")
PERSONA_ROLE_000 = ("Role: You are {persona}. You are reading stories people shared about events in their lives. "
                    "Empathy is defined as the ability to understand, share, and vicariously experience the feelings, "
                    "thoughts, and experiences of another person.")
INSTRUCTIONS_000 = ("Instructions: We previously recorded 170 people as they shared stories about events in their lives. "
                    "The audio from these videos was transcribed into text, resulting in some grammar errors and "
                    "misspellings. Additionally, you may notice fillers such as \"um,\" \"like,\" \"you know,\" \"I mean,\" "
                    "or \"okay.\" Please focus on the content of the story and try to ignore these errors. Read the story "
                    "carefully, as you will be asked to answer several questions about it.")
TASK1_000 = ("# Task 1:\n# - Question: To what extent did you feel empathy for the storyteller?\n"
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
        role = PERSONA_ROLE_000.format(persona=describe_persona(persona or {})) if prompt == "story_persona" else ROLE_000
        body = f"{role}\n\n{INSTRUCTIONS_000}\n\nStory: \"{text}\"\n\nTasks:\n\n{TASK1_000}\n\nAnswer as:\nTask 1:\n- Response: <digit>"
        return [{"role": "user", "content": body}]
    if prompt == "listener_turn":
        convo = "\n".join(f"Context: \"{c}\"" for c in context[1:]) + ("\n" if len(context) > 1 else "")
        speaker = f"Speaker: \"{context[0]}\"\n" if context else ""
        body = (f"{ROLE_000}\n\nInstructions: Below is part of a conversation. Read the speaker's turn and the "
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
    """POST /chat/completions with retries (exponential backoff) and a disk cache by prompt hash."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, cache_dir: str | Path | None = None,
                 timeout_s: float = 60.0, max_retries: int = 4, backoff_s: float = 1.0, temperature: float = 0.0,
                 max_tokens: int = 16):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key = model, api_key
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.temperature, self.max_tokens = temperature, max_tokens
        self.requests = 0

    @classmethod
    def from_env(cls, **kwargs: Any) -> "ChatClient | None":
        base = os.environ.get(ENV_BASE_URL)
        if not base:
            return None
        return cls(base, os.environ.get(ENV_MODEL, "default"), os.environ.get(ENV_API_KEY), **kwargs)

    def _payload(self, messages: list[dict[str, str]]) -> dict:
        return {"model": self.model, "messages": messages, "temperature": self.temperature, "max_tokens": self.max_tokens}

    def cache_key(self, messages: list[dict[str, str]]) -> str:
        return hashlib.sha256(json.dumps(self._payload(messages), sort_keys=True).encode()).hexdigest()

    def complete(self, messages: list[dict[str, str]]) -> str:
        key = self.cache_key(messages)
        cached = self.cache_dir / f"{key}.json" if self.cache_dir else None
        if cached is not None and cached.exists():
            return json.loads(cached.read_text())["content"]
        content = self._post(self._payload(messages))
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps({"content": content, "messages": messages, "model": self.model}))
        return content

    def _post(self, payload: dict) -> str:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(payload).encode()
        for attempt in range(self.max_retries + 1):
            self.requests += 1
            try:
                request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    body = json.loads(response.read().decode())
                return body["choices"][0]["message"]["content"]
            except urllib.error.HTTPError as error:
                if error.code not in (408, 409, 429) and error.code < 500:
                    raise RuntimeError(f"{self.url}: HTTP {error.code}: {error.read()[:300]!r}") from error
                problem: Exception = error
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                problem = error
            if attempt < self.max_retries:
                wait = self.backoff_s * 2 ** attempt
                log.warning("%s failed (%s); retry %d/%d in %.1f s", self.url, problem, attempt + 1, self.max_retries, wait)
                time.sleep(wait)
        raise RuntimeError(f"{self.url}: no answer after {self.max_retries + 1} tries: {problem}")


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


def evaluate_judge(cfg, dm, out_dir: Path) -> dict[str, Any]:
    """Judge every test fold's rows; metrics vs the (mean) label next to the training mean; exits cleanly
    without an endpoint."""
    settings = cfg.model
    client = ChatClient.from_env(cache_dir=settings.get("cache_dir"), timeout_s=settings.timeout_s,
                                 max_retries=settings.max_retries, backoff_s=settings.backoff_s,
                                 temperature=settings.temperature, max_tokens=settings.max_tokens)
    if client is None:
        print(f"LLM judge: no endpoint configured (set {ENV_BASE_URL}, and {ENV_MODEL} / {ENV_API_KEY} as needed); "
              "nothing scored.")
        return {"skipped": "no endpoint"}
    scale = tuple(settings.get("scale") or dm.levels or (1, 5))
    per_fold, answered, predictions = {"llm judge": [], "training mean": []}, [], []
    for k in dm.fold_ids:
        train, test = dm.folds[k]
        test = test[: settings.max_items] if settings.get("max_items") else test
        target = dm.targets[test].mean(1)
        pred = judge_rows(client, dm, test, settings.prompt, scale)
        ok = ~np.isnan(pred)
        answered.append(float(ok.mean()))
        per_fold["llm judge"].append(text_metrics(pred[ok], target[ok], dm.levels))
        per_fold["training mean"].append(text_metrics(np.full(ok.sum(), dm.targets[train].mean()), target[ok], dm.levels))
        predictions.append(pd.DataFrame({"row_index": test, "fold": k, "target": target, "judge": pred}))
    summary = {row: summarize_folds(values) for row, values in per_fold.items()}
    table = format_fold_table(summary)
    target_name = dm.spec.label_columns[0] if len(dm.spec.label_columns) == 1 else "mean of labels"
    print(f"\nLLM judge ({settings.prompt}, {client.model}) vs {target_name}, {dm.n_folds}-fold grouped CV; "
          f"usable answers {np.mean(answered):.1%}; {client.requests} requests:\n\n{table}\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "llm_judge_metrics.md").write_text(table + "\n")
    (out_dir / "llm_judge_metrics.json").write_text(json.dumps({"summary": summary, "answered": answered}, indent=1))
    pd.concat(predictions).to_csv(out_dir / "llm_judge_predictions.csv", index=False)
    return {"summary": summary, "answered": answered, "requests": client.requests}
