"""The build_sft_data stage on real ALFWorld games with a tiny random-init model as the rolled-out policy:
the oracle teacher (dataset, split by game, preview, metrics, atomic output), the openai teacher refused
for a missing key before any rollout, and the openai teacher against a real local HTTP server (a second run
is served from the cache: zero requests, byte-identical preview)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from helpers import PROXY_VARS, chat_endpoint, chat_reply, read_stage_metrics, reply, tiny_policy
from seed_core.config import ConfigError, ModelConfig, params_from_dict
from seed_core.envs.alfworld import Alfworld
from seed_core.envs.alfworld.data import GameEntry, list_games, task_type_of, write_manifest
from seed_core.envs.alfworld.oracle import OracleTeacher
from seed_core.method.skills import analyzer_prompt
from seed_core.method.teachers import MissingAPIKeyError, PolicyTeacher, checkpoint_name
from seed_core.records import Skill, Trajectory, read_jsonl
from seed_core.sft import SFT_COLUMNS as COLUMNS
from seed_core.stages.build_sft_data import (
    make_teacher,
    run_build_sft_data,
    select_games,
    split_games,
)

GAMES, SAMPLES = 3, 2  # loading a game costs seconds: the fewest that exercise a split
KEY_ENV = "SEED_TEST_SFT_TEACHER_KEY"
REPO = Path(__file__).resolve().parent.parent
KEY = "sk-test-not-a-real-key"


@pytest.fixture(scope="session")
def tiny_model_dir(base_model_dir, tmp_path_factory) -> Path:
    """A tiny random-init llama with the real SmolLM2 tokenizer, saved as an HF folder."""
    out = tmp_path_factory.mktemp("tiny-model")
    policy = tiny_policy(base_model_dir)
    policy.model.save_pretrained(out, safe_serialization=True)
    policy.tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def train_manifest(alfworld_root, tmp_path_factory) -> Path:
    """The first training game of each of GAMES task types."""
    first: dict[str, str] = {}
    for gid in list_games(alfworld_root, "train"):
        first.setdefault(task_type_of(gid), gid)
    path = tmp_path_factory.mktemp("manifests") / "train.json"
    write_manifest(path, alfworld_root, sorted(first.values())[:GAMES])
    return path


def small_params(alfworld_root: Path, tmp: Path, **teacher):
    return params_from_dict(
        {
            "data": {"alfworld_data": str(alfworld_root)},
            "model": {"dtype": "float32"},
            "env": {"max_steps": 2, "workers": 0},
            "rollout": {"temperature": 1.0, "max_new_tokens": 12, "batch_size": 8},
            "teacher": {"cache_dir": str(tmp / "teacher_cache"), **teacher},
            "build_sft_data": {
                "seed": 3,
                "games": GAMES,
                "samples": SAMPLES,
                "validation_fraction": 0.25,
                "max_skill_chars": 1200,
            },
        }
    )


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_select_games_round_robin_over_task_types():
    entries = [
        GameEntry(f"train/{t}-{i}/trial", "train", t, "") for t in ("a_type", "b_type", "c_type") for i in range(3)
    ]
    picked = select_games(entries, 5)
    assert [e.task_type for e in picked] == ["a_type", "b_type", "c_type", "a_type", "b_type"]
    assert picked[3].game_id == "train/a_type-1/trial"
    with pytest.raises(ConfigError, match="build_sft_data.games"):
        select_games(entries, 10)


def test_split_games_holds_out_whole_games():
    ids = [f"g{i}" for i in range(8)]
    train, val = split_games(ids, 0.25, seed=0)
    assert len(val) == 2 and len(train) == 6 and not set(train) & set(val) and sorted(train + val) == ids
    assert split_games(ids, 0.25, seed=0) == (train, val)
    assert split_games(ids[:2], 0.9, seed=0)[0]  # at least one game is left for training
    with pytest.raises(ConfigError, match=">= 2"):
        split_games(ids[:1], 0.5, seed=0)


def test_make_teacher_dispatches_on_kind(alfworld_root, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    env = Alfworld(str(alfworld_root))
    oracle = make_teacher(small_params(alfworld_root, tmp_path).teacher, env, model=ModelConfig(), batch_size=2)
    assert isinstance(oracle, OracleTeacher)
    openai = small_params(alfworld_root, tmp_path, kind="openai", model="glm-test", api_key_env=KEY_ENV).teacher
    assert make_teacher(openai, env, model=ModelConfig(), batch_size=2).name == "openai:glm-test"
    policy = small_params(
        alfworld_root, tmp_path, kind="policy", policy_path=str(tiny_model_dir), max_new_tokens=7
    ).teacher
    t = make_teacher(policy, env, model=ModelConfig(dtype="float32"), batch_size=2)
    assert isinstance(t, PolicyTeacher) and t.max_new_tokens == 7 and t.stop == ("}",)
    assert t.name == "policy:" + checkpoint_name(tiny_model_dir) and t.name.startswith(f"policy:{tiny_model_dir.name}@")
    assert len(t.name.split("@")[1]) == 12 and t.policy.encoder.max_prompt_tokens > 100_000  # prompts are never cut


def test_oracle_dataset_split_preview_metrics(alfworld_root, tiny_model_dir, train_manifest, tmp_path):
    from datasets import load_from_disk

    params = small_params(alfworld_root, tmp_path)
    out = tmp_path / "data" / "sft"
    m = run_build_sft_data(params, train_manifest, tiny_model_dir, out, tmp_path / "sft_data.json", progress=False)

    # The output folder is whole and nothing temporary is left beside it.
    assert sorted(p.name for p in out.parent.iterdir()) == ["sft"]
    assert {p.name for p in out.iterdir()} == {
        "dataset",
        "preview.jsonl",
        "skills.jsonl",
        "validation_trajectories.jsonl",
    }

    dd = load_from_disk(str(out / "dataset"))
    assert set(dd) == {"train", "validation"}
    for split in dd.values():
        assert tuple(split.column_names) == COLUMNS
    train_games, val_games = set(dd["train"]["game_id"]), set(dd["validation"]["game_id"])
    assert len(val_games) == 1 and len(train_games) == GAMES - 1 and not train_games & val_games

    skills = {s.traj_id: s for s in read_jsonl(out / "skills.jsonl", Skill)}
    val_trajs = list(read_jsonl(out / "validation_trajectories.jsonl", Trajectory))
    assert len(skills) == GAMES * SAMPLES and {s.producer for s in skills.values()} == {"oracle"}
    assert {t.game_id for t in val_trajs} == val_games and len(val_trajs) == SAMPLES
    for row in dd["validation"]:
        traj = next(t for t in val_trajs if t.traj_id == row["traj_id"])
        assert row["prompt"] == analyzer_prompt(traj)
        assert row["outcome"] == ("success" if traj.won else "failure") and row["task_type"] == traj.task_type
    for row in dd["train"].to_list() + dd["validation"].to_list():
        s = skills[row["traj_id"]]
        assert row["completion"] == json.dumps(
            {"episode_summary": s.summary, "episode_skill": s.skill}, ensure_ascii=False
        )
        assert json.loads(row["completion"])["episode_skill"] and len(s.skill) <= 1200

    preview = read_lines(out / "preview.jsonl")
    assert len(preview) == len(dd["train"]) + len(dd["validation"])
    assert [p["split"] for p in preview] == ["train"] * len(dd["train"]) + ["validation"] * len(dd["validation"])
    assert all(p["episode_skill"] == skills[p["traj_id"]].skill and p["task"] for p in preview)

    assert read_stage_metrics(tmp_path / "sft_data.json") == m
    statuses = [m[f"sft_data/parse_status/{k}"] for k in ("ok", "ok_after_reask", "failed", "dropped")]
    assert m["sft_data/trajectories"] == GAMES * SAMPLES == sum(statuses)
    assert (
        m["sft_data/examples"]
        == m["sft_data/examples/train"] + m["sft_data/examples/validation"]
        == statuses[0] + statuses[1]
    )
    assert (m["sft_data/examples/train"], m["sft_data/examples/validation"]) == (
        len(dd["train"]),
        len(dd["validation"]),
    )
    assert (
        m["sft_data/parse_rate"] == m["sft_data/examples"] / m["sft_data/trajectories"] == 1.0
    )  # the oracle always parses
    assert (m["sft_data/games/train"], m["sft_data/games/validation"]) == (GAMES - 1, 1)
    lengths = [len(s.skill) for s in skills.values()]
    assert (m["sft_data/skill_chars/min"], m["sft_data/skill_chars/max"]) == (min(lengths), max(lengths))
    assert min(lengths) <= m["sft_data/skill_chars/mean"] <= max(lengths)
    assert m["teacher/calls"] == GAMES * SAMPLES and m["teacher/requests"] == 0 and m["teacher/name"] == "oracle"
    assert m["sft_data/success_rate"] == sum(s.outcome == "success" for s in skills.values()) / len(skills)
    assert not (tmp_path / "teacher_cache").exists()  # the oracle asks nothing, so nothing is cached


def test_missing_api_key_is_refused_before_any_rollout(
    alfworld_root, tiny_model_dir, train_manifest, tmp_path, monkeypatch
):
    monkeypatch.delenv(KEY_ENV, raising=False)

    def no_rollout(*a, **kw):
        raise AssertionError("a rollout was played before the API key was checked")

    monkeypatch.setattr("seed_core.stages.build_sft_data.play", no_rollout)
    params = small_params(alfworld_root, tmp_path, kind="openai", model="glm-test", api_key_env=KEY_ENV)
    out, metrics = tmp_path / "sft", tmp_path / "sft_data.json"
    with pytest.raises(MissingAPIKeyError, match=KEY_ENV):
        # A model folder that does not exist: the key must be checked before the policy is even loaded.
        run_build_sft_data(params, train_manifest, tmp_path / "no-model", out, metrics, progress=False)
    assert not out.exists() and not metrics.exists()


@pytest.mark.e2e
@pytest.mark.fault("teacher")
def test_flow_refuses_missing_api_key_before_starting(alfworld_root, tmp_path):
    """The stage's command line exits 2 with the variable's name and no traceback, before the flow starts."""
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "data": {"alfworld_data": str(alfworld_root)},
                "teacher": {"kind": "openai", "model": "glm-test", "api_key_env": KEY_ENV},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "flows" / "build_sft_data.py"),
            "--params",
            str(params),
            "--out-dir",
            str(tmp_path / "sft"),
            "--metrics",
            str(tmp_path / "m.json"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"environment variable {KEY_ENV} is not set" in proc.stderr and "Traceback" not in proc.stderr
    assert "Beginning flow run" not in proc.stdout + proc.stderr
    assert not (tmp_path / "sft").exists() and not (tmp_path / "m.json").exists()


class SkillAPI:
    """A chat-completions endpoint that answers the analyzer like an LLM would: some answers fenced JSON
    with a trailing comma, some prose (which the stage re-asks, and the re-ask gets clean JSON), and a 500
    on the first request of some prompts."""

    def __init__(self):
        self.requests: list[str] = []
        self.lock = threading.Lock()
        self.failed_once: set[str] = set()

    def answer(self, prompt: str) -> tuple[int, dict | None]:
        # Decided by the task sentence (fixed by the game file), not by the sampled steps, so the mix of
        # answers is the same on every machine: the test games are one look, one pick and one clean task.
        task = prompt.split("Task: ", 1)[1].split("\n", 1)[0]
        with self.lock:
            self.requests.append(prompt)
            if "clean" in task and prompt not in self.failed_once:
                self.failed_once.add(prompt)
                return 500, None
        skill = {"episode_summary": f"The agent tried to {task}", "episode_skill": f"To {task} first find the object."}
        if "Your previous answer was" in prompt:
            text = json.dumps(skill)
        elif task.startswith("look"):
            text = "I think the agent should explore more."
        else:
            text = "Here is the skill:\n```json\n" + json.dumps(skill)[:-1] + ",}\n```"
        return 200, chat_reply(text, len(prompt) // 4, len(text) // 4)

    def handle(self, h, body: dict) -> None:
        status, answer = self.answer(body["messages"][0]["content"])
        reply(h, status, answer or {"error": "injected"})


@pytest.fixture
def skill_api(monkeypatch):
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(KEY_ENV, KEY)
    api = SkillAPI()
    with chat_endpoint(api.handle) as url:
        api.base_url = url
        yield api


@pytest.mark.fault("teacher")
def test_openai_teacher_over_http_then_cached_rerun(alfworld_root, tiny_model_dir, train_manifest, tmp_path, skill_api):
    params = small_params(
        alfworld_root,
        tmp_path,
        kind="openai",
        model="glm-test",
        api_key_env=KEY_ENV,
        base_url=skill_api.base_url,
        max_retries=2,
        timeout_s=10.0,
        concurrency=2,
    )
    m1 = run_build_sft_data(
        params, train_manifest, tiny_model_dir, tmp_path / "a" / "sft", tmp_path / "a.json", progress=False
    )
    n = GAMES * SAMPLES
    sent = len(skill_api.requests)
    assert m1["sft_data/parse_rate"] == 1.0 and m1["sft_data/examples"] == n
    assert m1["sft_data/parse_status/ok"] + m1["sft_data/parse_status/ok_after_reask"] == n
    assert m1["sft_data/parse_status/ok_after_reask"] >= 1 and m1["sft_data/parse_status/ok"] >= 1
    assert m1["teacher/calls"] == n + m1["sft_data/parse_status/ok_after_reask"]
    assert m1["teacher/requests"] == sent == m1["teacher/calls"] + m1["teacher/retries"]
    assert m1["teacher/errors/http_500"] == m1["teacher/retries"] >= 1
    assert m1["teacher/cache_hits"] == 0 and m1["teacher/billed_prompt_tokens"] == m1["teacher/prompt_tokens"] > 0
    assert len(os.listdir(tmp_path / "teacher_cache")) == m1["teacher/calls"]
    written = [tmp_path / "a.json", *(tmp_path / "a" / "sft").rglob("*.jsonl"), *(tmp_path / "teacher_cache").iterdir()]
    assert not any(KEY in f.read_text(encoding="utf-8") for f in written)

    m2 = run_build_sft_data(
        params, train_manifest, tiny_model_dir, tmp_path / "b" / "sft", tmp_path / "b.json", progress=False
    )
    assert len(skill_api.requests) == sent  # zero requests: every answer came from the cache
    assert m2["teacher/requests"] == 0 and m2["teacher/cache_hits"] == m1["teacher/calls"]
    assert m2["teacher/billed_prompt_tokens"] == 0 and m2["teacher/prompt_tokens"] == m1["teacher/prompt_tokens"]
    assert (tmp_path / "a" / "sft" / "preview.jsonl").read_bytes() == (
        tmp_path / "b" / "sft" / "preview.jsonl"
    ).read_bytes()
    assert (tmp_path / "a" / "sft" / "skills.jsonl").read_bytes() == (
        tmp_path / "b" / "sft" / "skills.jsonl"
    ).read_bytes()
