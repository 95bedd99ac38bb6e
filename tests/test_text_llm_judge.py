"""LLM judge: prompts from the papers, answer parsing, and the openai client against a loopback server."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from empathic_fusion.evaluation.judge_report import evaluate_judge
from empathic_fusion.evaluation.llm_judge import ChatClient, build_messages, parse_score
from empathic_fusion.utils import CONFIG_DIR


def test_prompts_carry_the_papers_wording():
    share = build_messages("story_share", "B's story", ["A's story"])
    assert share[0]["role"] == "system" and "psychologist with expertise in analyzing empathy" in share[0]["content"]
    assert "scale from 0 to 1, how much person A would empathize with B's story" in share[1]["content"]
    assert "A's story" in share[1]["content"] and "B's story" in share[1]["content"]
    base = build_messages("story_empathy", "I lost my job.")[0]["content"]
    assert "To what extent did you feel empathy for the storyteller?" in base and "I lost my job." in base
    assert base.startswith("Role: You are an AI assistant designed to assess the empathy level")
    persona = build_messages("story_persona", "story", persona={"gender": "female", "empathic_concern": 4, "x": None})[0]["content"]
    assert "gender: female, empathic concern: 4" in persona and "x:" not in persona
    listener = build_messages("listener_turn", "Oh no, I am sorry.", ["My dog died.", "earlier turn"])[0]["content"]
    assert 'Speaker: "My dog died."' in listener and 'Listener: "Oh no, I am sorry."' in listener
    with pytest.raises(ValueError, match="person A"):
        build_messages("story_share", "text")
    with pytest.raises(ValueError, match="unknown prompt"):
        build_messages("reflection", "text")


@pytest.mark.parametrize("answer, prompt, expected", [
    ("4", "story_empathy", 4.0), ("Task 1:\n- Response: 2", "story_empathy", 2.0), ("0.75", "story_share", 4.0),
    ("I'd say 0.5.", "story_share", 3.0), ("no idea", "story_empathy", np.nan), ("7", "story_empathy", np.nan),
    ("1.5", "story_share", np.nan), (None, "listener_turn", np.nan)])
def test_parse_score_maps_to_the_label_scale(answer, prompt, expected):
    value = parse_score(answer, prompt, (1.0, 5.0))
    assert (np.isnan(value) and np.isnan(expected)) or value == pytest.approx(expected)


class _FakeChat(BaseHTTPRequestHandler):
    """OpenAI-style endpoint: the first request fails with 503 (to exercise retries); then it answers 5
    when the story mentions 'sorry' and 2 otherwise, in the 000 answer format."""

    calls: list[dict] = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append({"body": body, "auth": self.headers.get("Authorization")})
        if len(type(self).calls) == 1:
            self.send_response(503)
            self.end_headers()
            return
        text = body["messages"][-1]["content"]
        story = text.split('Story: "', 1)[1].split('"', 1)[0]
        answer = f"Task 1:\n- Response: {5 if 'sorry' in story else 2}"
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        return


@pytest.fixture
def fake_endpoint():
    _FakeChat.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeChat)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_client_retries_then_caches_by_prompt_hash(fake_endpoint, tmp_path):
    client = ChatClient(fake_endpoint, "judge-model", api_key="k123", cache_dir=tmp_path, timeout_s=5, max_retries=2)
    messages = build_messages("story_empathy", "I am so sorry that happened.")
    assert parse_score(client.complete(messages), "story_empathy", (1, 5)) == 5.0
    assert len(_FakeChat.calls) == 2 and client.requests == 1  # the client retried the 503 once
    assert _FakeChat.calls[-1]["auth"] == "Bearer k123" and _FakeChat.calls[-1]["body"]["model"] == "judge-model"
    assert (tmp_path / f"{client.cache_key(messages)}.json").exists()
    again = ChatClient(fake_endpoint, "judge-model", cache_dir=tmp_path, timeout_s=5)
    assert again.complete(messages) == client.complete(messages) and len(_FakeChat.calls) == 2  # from disk


def test_client_gives_up_after_bounded_retries(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeChat)  # take a free port, then close it:
    server.server_close()  # every try is refused at once
    client = ChatClient(f"http://127.0.0.1:{server.server_address[1]}/v1", "m", timeout_s=1, max_retries=1)
    with pytest.raises(RuntimeError, match="no answer after 2 tries"):
        client.complete([{"role": "user", "content": "hi"}])


def _judge_cfg(tmp_path, path):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[
            "judge=llm_judge", "+data=text_csv", f"data.path={path}", "data.text_columns=[story]",
            "data.label_columns=[empathy]", "data.group_column=writer", "data.cv_folds=2",
            f"judge.cache_dir={tmp_path / 'cache'}"])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "out")
    return cfg


def _judge_table(tmp_path):
    table = pd.DataFrame({"writer": [f"w{i}" for i in range(8)],
                          "story": ["I am sorry for you" if i % 2 else "It rained" for i in range(8)],
                          "empathy": [5 if i % 2 else 2 for i in range(8)]})
    table.loc[0, "empathy"] = 3
    path = tmp_path / "stories.csv"
    table.to_csv(path, index=False)
    return path


def test_evaluate_judge_scores_every_fold(fake_endpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("EMPATHIC_LLM_BASE_URL", fake_endpoint)
    monkeypatch.setenv("EMPATHIC_LLM_MODEL", "judge-model")
    cfg = _judge_cfg(tmp_path, _judge_table(tmp_path))
    result = evaluate_judge(cfg, tmp_path / "out")
    judge = result["summary"].set_index("model").loc["LLM judge"]
    assert result["answered"] == [1.0, 1.0] and judge["n_runs"] == 2  # one row per fold, mean ± std
    assert judge["spearman_mean"] > 0.8 and judge["mse_mean"] == pytest.approx(1 / 8, abs=0.13)
    runs = pd.read_csv(tmp_path / "out" / "runs.csv")
    assert set(runs.model) == {"LLM judge", "training mean"} and sorted(runs.fold.unique()) == [0, 1]
    assert "LLM judge" in (tmp_path / "out" / "llm_judge_table.md").read_text()


def test_without_endpoint_it_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("EMPATHIC_LLM_BASE_URL", raising=False)
    cfg = _judge_cfg(tmp_path, _judge_table(tmp_path))
    assert evaluate_judge(cfg, tmp_path / "out") == {"skipped": "no endpoint"}
    assert "no endpoint configured" in capsys.readouterr().out
