"""Warm-up: expert examples replayed from walkthroughs, rendered exactly as rollouts render prompts."""

from __future__ import annotations

import json

import pytest

from seed_core.config import EnvConfig, params_from_dict
from seed_core.envs.alfworld.data import GameEntry, list_games, task_type_of
from seed_core.envs.alfworld.expert import expert_examples, think_texts
from seed_core.envs.alfworld.prompts import step_prompt
from seed_core.stages.warmup import run_warmup, split_eval
from seed_core.turns import completion, parse_response


def test_think_texts_follow_the_plan():
    walk = [
        "go to sinkbasin 1",
        "take apple 1 from sinkbasin 1",
        "go to microwave 1",
        "heat apple 1 with microwave 1",
        "go to countertop 2",
        "move apple 1 to countertop 2",
    ]
    assert think_texts(walk) == [
        "I need to find the apple.",
        "I need to pick up the apple I see here.",
        "I need to bring the apple to the microwave to heat it.",
        "I need to heat the apple with the microwave.",
        "I need to bring the apple to the countertop.",
        "I need to put the apple on the countertop.",
    ]
    two = ["go to shelf 1", "take cd 1 from shelf 1", "go to safe 1", "move cd 1 to safe 1", "go to desk 1"]
    assert think_texts(two)[-1] == "I need to find another cd."
    look = ["go to dresser 1", "use desklamp 1", "take alarmclock 2 from dresser 1"]
    assert think_texts(look)[1] == "I need to look at the alarmclock under the desklamp."


def test_completion_parses_to_its_action():
    action, valid = parse_response(completion("I need to find the apple.", "go to fridge 1"))
    assert (action, valid) == ("go to fridge 1", True)


@pytest.fixture(scope="module")
def games(alfworld_root) -> list[GameEntry]:
    ids = list_games(alfworld_root, "valid_seen")
    picked = [
        next(g for g in ids if task_type_of(g) == t) for t in ("pick_heat_then_place_in_recep", "look_at_obj_in_light")
    ]
    return [GameEntry(g, "valid_seen", task_type_of(g), "") for g in picked]


def test_expert_examples_match_rollout_prompts_and_win(games, alfworld_root):
    from seed_core.envs.alfworld.env import AlfworldGame

    env = EnvConfig(max_steps=30, history_length=2, workers=0)
    examples = expert_examples(alfworld_root, games, env, progress=False)
    for entry in games:
        steps = [x for x in examples if x["game_id"] == entry.game_id]
        # An independent in-process replay, with the history kept the way rollout.play keeps it.
        game = AlfworldGame(alfworld_root, entry.game_id)
        state, history = game.reset(), []
        walk = game.walkthrough()
        assert [x["step"] for x in steps] == list(range(len(walk)))
        for t, (x, expert) in enumerate(zip(steps, walk)):
            expected = step_prompt(state.task, state.observation, state.admissible_actions, history, env.history_length)
            assert x["prompt"] == expected, f"step {t}"
            action, valid = parse_response(x["completion"])
            assert valid and action == expert.lower() and action in state.admissible_actions
            assert x["completion"].startswith("<think>") and len(x["completion"]) < 160  # short: cheap to generate
            history.append((state.observation, action))
            state = game.step(action)
        assert state.won, f"walkthrough of {entry.game_id} does not win"
        game.close()
    assert "Prior to this step" not in steps[0]["prompt"] and "[Observation 1:" in steps[1]["prompt"]


def test_games_not_won_within_max_steps_are_skipped(games, alfworld_root):
    short = EnvConfig(max_steps=2, history_length=2, workers=0)
    assert expert_examples(alfworld_root, games[:1], short, progress=False) == []


def test_split_eval_holds_out_whole_games():
    ex = [{"game_id": f"g{i // 3}", "step": i % 3} for i in range(30)]
    train, held = split_eval(ex, 2, seed=0)
    assert len({x["game_id"] for x in held}) == 2 and len(held) == 6 and len(train) == 24
    assert not {x["game_id"] for x in held} & {x["game_id"] for x in train}
    assert split_eval(ex[:9], 2, seed=0) == (ex[:9], [])  # too few games to spare any


def test_disabled_warmup_links_the_base_model(tmp_path):
    base = tmp_path / "base"
    (base / "sub").mkdir(parents=True)
    (base / "model.safetensors").write_bytes(b"weights")
    (base / "sub" / "x.json").write_text("{}")
    out, metrics_path = tmp_path / "models" / "warmup", tmp_path / "metrics" / "warmup.json"
    out.mkdir(parents=True)
    (out / "stale").write_text("old")
    params = params_from_dict({"warmup": {"enabled": False}})
    metrics = run_warmup(params, tmp_path / "no-manifest.json", base, out, metrics_path)
    assert metrics == {"warmup/enabled": False} == json.loads(metrics_path.read_text())
    assert sorted(p.name for p in out.rglob("*")) == ["model.safetensors", "sub", "x.json"]
    assert (out / "model.safetensors").stat().st_ino == (base / "model.safetensors").stat().st_ino  # linked, not copied
