"""Teachers: the OpenAI-compatible client against a real local HTTP server with scripted faults, and the
policy-as-teacher adapter."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from helpers import PROXY_VARS, chat_endpoint, chat_reply, reply
from seed_core.method.teachers import MissingAPIKeyError, OpenAITeacher, PolicyTeacher
from seed_core.policy import Generation

KEY_ENV = "SEED_TEST_TEACHER_KEY"
KEY = "sk-test-0123456789-not-a-real-key"
TIMEOUT_S = 0.3


class FakeChatAPI:
    """POST /v1/chat/completions. `faults[prompt]` lists what the next requests for that prompt get (one entry
    each, consumed in order); afterwards a success whose content is "answer to <prompt>"."""

    def __init__(self):
        self.faults: dict[str, list[str]] = {}
        self.requests: list[tuple[str, dict]] = []  # (prompt, headers) of every request received
        self.lock = threading.Lock()

    def count(self, prompt: str | None = None) -> int:
        with self.lock:
            return sum(1 for p, _ in self.requests if prompt is None or p == prompt)

    def handle(self, h: BaseHTTPRequestHandler, body: dict) -> None:
        prompt = body["messages"][0]["content"]
        with self.lock:
            self.requests.append((prompt, dict(h.headers)))
            script = self.faults.get(prompt, [])
            fault = script.pop(0) if script else "ok"
        if h.path != "/v1/chat/completions":
            return reply(h, 404, b'{"error": "not found"}')
        if fault == "sleep":
            time.sleep(TIMEOUT_S * 3)  # the client has given up by now; its retry is already in flight
            return reply(h, 200, b"{}")
        if fault in ("429", "500", "400"):
            return reply(h, int(fault), b'{"error": "injected"}', {"Retry-After": "0"} if fault == "429" else {})
        if fault == "notjson":
            return reply(h, 200, b"<html>bad gateway</html>")
        if fault == "nochoices":
            return reply(h, 200, b'{"object": "chat.completion"}')
        reply(h, 200, chat_reply(f"answer to {prompt}", len(prompt), 7))


@pytest.fixture
def api(monkeypatch):
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(KEY_ENV, KEY)
    fake = FakeChatAPI()
    with chat_endpoint(fake.handle) as url:
        fake.base_url = url
        yield fake


def _teacher(api, cache_dir, **kw) -> OpenAITeacher:
    args = dict(cache_dir=cache_dir, timeout_s=TIMEOUT_S, backoff_base_s=0.01, concurrency=3, max_retries=5)
    return OpenAITeacher(api.base_url, "glm-test", KEY_ENV, **{**args, **kw})


@pytest.mark.fault("teacher", n=5)  # timeout, 429, 500, body not JSON, no choices
def test_faults_are_retried_counted_and_cached(api, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    prompts = ["p-clean", "p-all-faults", "p-500", "p-nochoices", "p-unicode café 技能"]
    api.faults = {"p-all-faults": ["sleep", "429", "500", "notjson"], "p-500": ["500"], "p-nochoices": ["nochoices"]}
    teacher = _teacher(api, tmp_path / "cache")
    answers = teacher.complete_batch(prompts)

    assert [a.text for a in answers] == [f"answer to {p}" for p in prompts]
    assert not any(a.cached for a in answers)
    assert [(a.prompt_tokens, a.completion_tokens) for a in answers] == [(len(p), 7) for p in prompts]
    assert [api.count(p) for p in prompts] == [1, 5, 2, 2, 1]
    s = teacher.stats
    assert (s.calls, s.requests, s.retries, s.failures, s.dropped, s.cache_hits) == (5, 11, 6, 6, 0, 0)
    assert s.errors == {"timeout": 1, "http_429": 1, "http_500": 2, "malformed": 2}
    assert (s.prompt_tokens, s.completion_tokens) == (sum(map(len, prompts)), 35)

    # The key reached the server, and nowhere else.
    assert {h["Authorization"] for _, h in api.requests} == {f"Bearer {KEY}"}
    cache_files = sorted((tmp_path / "cache").iterdir())
    assert len(cache_files) == 5
    for f in cache_files:
        assert KEY not in f.read_text(encoding="utf-8")
    assert KEY not in repr(teacher) and KEY not in str(teacher) and KEY_ENV in repr(teacher)
    assert KEY not in json.dumps(dataclasses.asdict(teacher.stats)) and KEY not in repr(teacher.stats)
    assert KEY not in caplog.text and "retry" in caplog.text

    # Second run, fresh object, same cache: zero requests, identical answers.
    before = api.count()
    again = _teacher(api, tmp_path / "cache")
    answers2 = again.complete_batch(prompts)
    assert api.count() == before
    assert [a.text for a in answers2] == [a.text for a in answers] and all(a.cached for a in answers2)
    assert [(a.prompt_tokens, a.completion_tokens) for a in answers2] == [(len(p), 7) for p in prompts]
    assert (again.stats.calls, again.stats.cache_hits, again.stats.requests, again.stats.prompt_tokens) == (5, 5, 0, 0)


@pytest.mark.fault("teacher")
def test_exhausted_retries_give_none_and_nothing_is_cached(api, tmp_path):
    api.faults = {"p": ["500"] * 10}
    teacher = _teacher(api, tmp_path / "cache", max_retries=2)
    assert teacher.complete_batch(["p"]) == [None]
    assert api.count("p") == 3
    s = teacher.stats
    assert (s.requests, s.retries, s.failures, s.dropped, s.prompt_tokens) == (3, 2, 3, 1, 0)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    # The failure is asked again on the next run (it was not cached); the server has recovered by now.
    api.faults = {}
    assert teacher.complete_batch(["p"])[0].text == "answer to p"


@pytest.mark.fault("teacher")
def test_client_errors_other_than_429_are_not_retried(api, tmp_path):
    api.faults = {"p": ["400"]}
    teacher = _teacher(api, tmp_path / "cache")
    assert teacher.complete_batch(["p"]) == [None]
    assert api.count("p") == 1 and teacher.stats.errors == {"http_400": 1} and teacher.stats.retries == 0


@pytest.mark.fault("teacher")
def test_connection_errors_are_retried(api, tmp_path):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    teacher = OpenAITeacher(
        f"http://127.0.0.1:{port}/v1",
        "m",
        KEY_ENV,
        cache_dir=tmp_path,
        max_retries=1,
        backoff_base_s=0.01,
        timeout_s=TIMEOUT_S,
    )
    assert teacher.complete_batch(["p"]) == [None]
    assert teacher.stats.errors == {"connection": 2} and teacher.stats.dropped == 1


def test_cache_key_covers_model_and_decoding_settings(api, tmp_path):
    _teacher(api, tmp_path / "cache").complete_batch(["p"])
    _teacher(api, tmp_path / "cache").complete_batch(["p"])
    assert api.count("p") == 1
    _teacher(api, tmp_path / "cache", max_tokens=100).complete_batch(["p"])
    _teacher(api, tmp_path / "cache", temperature=0.7).complete_batch(["p"])
    assert api.count("p") == 3
    assert {json.loads(f.read_text())["max_tokens"] for f in (tmp_path / "cache").iterdir()} == {4096, 100}


@pytest.mark.fault("teacher", n=2)  # key unset, key empty
def test_missing_key_is_refused_at_construction(api, tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(MissingAPIKeyError, match=rf"environment variable {KEY_ENV} is not set \(or empty\); export it"):
        _teacher(api, tmp_path / "cache")
    monkeypatch.setenv(KEY_ENV, "")
    with pytest.raises(MissingAPIKeyError, match=KEY_ENV):
        _teacher(api, tmp_path / "cache")
    assert api.count() == 0


class FakePolicy:
    def __init__(self):
        self.calls = []

    def generate(self, prompts, *, temperature, top_p, max_new_tokens, stop=(), seed=None):
        self.calls.append(dict(prompts=list(prompts), temperature=temperature, max_new_tokens=max_new_tokens))
        return [Generation(f"skill for {p}", list(range(len(p))), [0.0] * len(p), True) for p in prompts]


def test_policy_teacher_one_batched_greedy_call():
    policy = FakePolicy()
    teacher = PolicyTeacher(policy, name="smollm2@abc123", max_new_tokens=256)
    answers = teacher.complete_batch(["ab", "abcd"])
    assert [a.text for a in answers] == ["skill for ab", "skill for abcd"]
    assert [a.completion_tokens for a in answers] == [2, 4] and teacher.stats.completion_tokens == 6
    assert policy.calls == [dict(prompts=["ab", "abcd"], temperature=0.0, max_new_tokens=256)]
    assert teacher.complete_batch([]) == [] and len(policy.calls) == 1
