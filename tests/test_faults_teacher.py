"""Fault injection, teacher: what tests/test_teachers.py does not already inject. A real local HTTP server
drops connections (before the reply, and halfway through the body) and asks for a pause with 429 +
Retry-After; and the build_sft_data stage runs against a server that fails some prompts for longer than the
retry budget: the stage finishes, the failures are counted, and no failed answer is ever cached."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler

import pytest

from helpers import PROXY_VARS, chat_endpoint, chat_reply, read_stage_metrics, reply
from seed_core.config import params_from_dict
from seed_core.envs.alfworld.data import list_games, task_type_of, write_manifest
from seed_core.method.teachers import OpenAITeacher
from seed_core.records import Skill, read_jsonl
from seed_core.stages.build_sft_data import run_build_sft_data

KEY_ENV = "SEED_TEST_FAULT_TEACHER_KEY"
KEY = "sk-test-fault-suite-not-a-real-key"
SKILL = {"episode_summary": "The agent looked around.", "episode_skill": "Find the object before anything else."}


class ScriptedAPI:
    """POST /v1/chat/completions; `script(prompt, n)` says what the n-th request (0-based) for a prompt gets:
    "ok", "drop" (connection closed before any reply), "cut" (closed halfway through the body), "slow"
    (answers after the client's timeout), "notjson", "429" (Retry-After: `retry_after`) or "500"."""

    def __init__(self, script, retry_after: str = "0"):
        self.script = script
        self.retry_after = retry_after
        self.seen: dict[str, int] = {}
        self.log: list[tuple[str, str, float]] = []  # (prompt, what it got, time)
        self.lock = threading.Lock()
        self.slow_s = 0.0

    def handle(self, h: BaseHTTPRequestHandler, body: dict) -> None:
        prompt = body["messages"][0]["content"]
        with self.lock:
            n = self.seen.get(prompt, 0)
            self.seen[prompt] = n + 1
            what = self.script(prompt, n)
            self.log.append((prompt, what, time.monotonic()))
        answer = json.dumps(chat_reply(json.dumps(SKILL))).encode()
        h.close_connection = True
        if what == "drop":
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if what == "slow":
            time.sleep(self.slow_s)
        if what in ("429", "500"):
            return reply(h, int(what), b'{"error": "injected"}', {"Retry-After": self.retry_after})
        if what == "notjson":
            return reply(h, 200, b"<html><body>502 Bad Gateway</body></html>")
        if what == "cut":
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(answer)))
            h.end_headers()
            h.wfile.write(answer[: len(answer) // 2])
            h.wfile.flush()
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        reply(h, 200, answer)


@pytest.fixture
def serve(monkeypatch):
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(KEY_ENV, KEY)
    with ExitStack() as servers:
        yield lambda api: servers.enter_context(chat_endpoint(api.handle))


@pytest.mark.fault("teacher", n=3)
def test_dropped_connections_and_retry_after(serve, tmp_path):
    faults = {"p-drop": ["drop"], "p-cut": ["cut"], "p-429": ["429"]}
    api = ScriptedAPI(lambda p, n: faults[p][n] if n < len(faults[p]) else "ok", retry_after="1")
    # A backoff of 30 s: a retry sooner than that can only come from the server's Retry-After (1 s).
    teacher = OpenAITeacher(
        serve(api),
        "glm-test",
        KEY_ENV,
        cache_dir=tmp_path / "cache",
        timeout_s=5.0,
        backoff_base_s=30.0,
        max_retries=2,
        concurrency=3,
    )
    t0 = time.monotonic()
    answers = teacher.complete_batch(["p-429"])
    elapsed = time.monotonic() - t0
    assert answers[0].text == json.dumps(SKILL) and 1.0 <= elapsed < 10.0, elapsed
    (_, first, t_first), (_, second, t_second) = api.log
    assert (first, second) == ("429", "ok") and t_second - t_first >= 0.95

    teacher = OpenAITeacher(
        serve(api),
        "glm-test",
        KEY_ENV,
        cache_dir=tmp_path / "cache",
        timeout_s=5.0,
        backoff_base_s=0.01,
        max_retries=2,
        concurrency=3,
    )
    answers = teacher.complete_batch(["p-drop", "p-cut"])
    assert [a.text for a in answers] == [json.dumps(SKILL)] * 2 and not any(a.cached for a in answers)
    s = teacher.stats
    assert (s.requests, s.retries, s.failures, s.dropped) == (4, 2, 2, 0)
    assert s.errors == {"connection": 2}  # a half-sent body is a dropped connection, never a truncated answer
    cached = [json.loads(f.read_text()) for f in sorted((tmp_path / "cache").iterdir())]
    assert len(cached) == 3 and all(c["text"] == json.dumps(SKILL) for c in cached)


@pytest.fixture
def two_games(alfworld_root, tmp_path):
    """The first training game of two task types: the server fails every prompt of the `look` one."""
    first: dict[str, str] = {}
    for gid in list_games(alfworld_root, "train"):
        first.setdefault(task_type_of(gid), gid)
    games = [first["look_at_obj_in_light"], first["pick_and_place_simple"]]
    write_manifest(tmp_path / "train.json", alfworld_root, games)
    return tmp_path / "train.json"


@pytest.mark.fault("teacher", n=4)
def test_stage_finishes_when_failures_outlast_the_retry_budget(
    alfworld_root, tiny_model_dir, two_games, tmp_path, serve
):
    def script(prompt: str, n: int) -> str:
        task = prompt.split("Task: ", 1)[1].split("\n", 1)[0]
        if task.startswith("look"):
            return "500"  # every request: more failures than the retry budget
        return ["cut", "slow", "429"][n] if n < 3 else "ok"  # three transient faults, then an answer

    api = ScriptedAPI(script, retry_after="0")
    api.slow_s = 1.5
    params = params_from_dict(
        {
            "data": {"alfworld_data": str(alfworld_root)},
            "model": {"dtype": "float32"},
            "env": {"max_steps": 1, "workers": 0},
            "rollout": {"temperature": 1.0, "max_new_tokens": 12, "batch_size": 8},
            "teacher": {
                "kind": "openai",
                "model": "glm-test",
                "api_key_env": KEY_ENV,
                "base_url": serve(api),
                "cache_dir": str(tmp_path / "cache"),
                "max_retries": 3,
                "timeout_s": 0.5,
                "concurrency": 4,
            },
            "build_sft_data": {"seed": 0, "games": 2, "samples": 1, "validation_fraction": 0.5},
        }
    )
    m = run_build_sft_data(params, two_games, tiny_model_dir, tmp_path / "sft", tmp_path / "m.json", progress=False)

    # The stage finished: the look episode dropped after 4 requests, the other answered after 3 faults.
    assert (m["sft_data/parse_status/dropped"], m["sft_data/parse_status/ok"], m["sft_data/examples"]) == (1, 1, 1)
    assert (m["teacher/requests"], m["teacher/retries"], m["teacher/failures"]) == (8, 6, 7)
    assert {k: v for k, v in m.items() if k.startswith("teacher/errors/")} == {
        "teacher/errors/http_500": 4,
        "teacher/errors/connection": 1,
        "teacher/errors/timeout": 1,
        "teacher/errors/http_429": 1,
    }
    assert read_stage_metrics(tmp_path / "m.json") == m
    skills = list(read_jsonl(tmp_path / "sft" / "skills.jsonl", Skill))
    assert [(s.task_type, s.parse_status) for s in skills] == [
        ("look_at_obj_in_light", "dropped"),
        ("pick_and_place_simple", "ok"),
    ]
    assert skills[0].skill == skills[0].raw_output == "" and skills[1].skill == SKILL["episode_skill"]

    # Only the answer is cached: no failure, no half body.
    cached = [json.loads(f.read_text()) for f in sorted((tmp_path / "cache").iterdir())]
    assert len(cached) == 1 and cached[0]["text"] == json.dumps(SKILL)

    # The server recovers: a re-run asks only the dropped prompt again and serves the other from the cache.
    api.script = lambda prompt, n: "ok"
    before = len(api.log)
    m2 = run_build_sft_data(params, two_games, tiny_model_dir, tmp_path / "sft2", tmp_path / "m2.json", progress=False)
    assert len(api.log) - before == 1 == m2["teacher/requests"] and m2["teacher/cache_hits"] == 1
    assert m2["sft_data/parse_status/ok"] == 2 and len(list((tmp_path / "cache").iterdir())) == 2
