"""Calibration helpers: `warmup.skill_hints` (expert steps again with a true hint in the skill block) and the
chance baseline of `seed probe` (uniformly random moves)."""

from types import SimpleNamespace

import pytest

from seed_core.config import ConfigError, params_from_dict
from seed_core.envs import GameEntry
from seed_core.envs.sokoban.env import Sokoban
from seed_core.envs.sokoban.room import generate_room, room_from_text, solve
from seed_core.method.prompts import SKILL_BLOCK
from seed_core.stages.warmup import with_off_path_states, with_skill_hints
from seed_core.turns import parse_response

PARAMS = params_from_dict({"env": {"name": "sokoban", "max_steps": 15}, "teacher": {"oracle_max_chars": 300}})


def expert(seeds):
    env = Sokoban()
    entries = [GameEntry(str(s), "train", "sokoban", generate_room(s).sha256()) for s in seeds]
    return env, env.expert_examples(entries, PARAMS.env, progress=False)


def block(prompt: str) -> str:
    head = SKILL_BLOCK.split("{skill}")[0]
    return prompt.split(head, 1)[1].split("]\n", 1)[0] if head in prompt else ""


def test_plan_and_episode_hints_are_true_of_each_step():
    env, plain = expert([3, 5])
    out = with_skill_hints(plain, ("plan", "episode"), env, PARAMS)
    assert out[: len(plain)] == plain and len(out) == 3 * len(plain)
    plans = out[len(plain) : 2 * len(plain)]
    for x, p in zip(plain, plans):
        assert p["hint"] == "plan" and p["completion"] == x["completion"]  # the expert's move, now with a hint
        plan = solve(room_from_text(x["observation"]))
        assert block(p["prompt"]) == f"The shortest plan from this state: {', '.join(plan)}. Take its first move now."
        assert parse_response(x["completion"])[0] == plan[0]
    for x in out[2 * len(plain) :]:
        moves = [parse_response(e["completion"])[0] for e in plain if e["game_id"] == x["game_id"]]
        assert x["hint"] == "episode" and f"with: {', '.join(moves)} ({len(moves)} steps" in block(x["prompt"])
    assert with_skill_hints(plain, (), env, PARAMS) is plain


def test_hints_need_sokobans_solver():
    with pytest.raises(ValueError, match=r"only Sokoban's solver .* set warmup.skill_hints: \[\]"):
        with_skill_hints([{"game_id": "g"}], ("plan",), SimpleNamespace(name="alfworld"), PARAMS)


def test_off_path_states_are_new_solvable_and_labelled_by_the_solver():
    env, plain = expert([3, 5, 8])
    entries = [GameEntry(str(s), "train", "sokoban", generate_room(s).sha256()) for s in (3, 5, 8, 13)]
    on_path = {(x["game_id"], x["observation"]) for x in plain}
    out = with_off_path_states(plain, entries, 4, env, PARAMS)
    assert out[: len(plain)] == plain
    off = out[len(plain) :]
    assert len(off) == 3 * 4 and {x["game_id"] for x in off} == {"3", "5", "8"}  # room 13 is not among the examples'
    for x in off:
        room = room_from_text(x["observation"])
        plan = solve(room)
        assert x["off_path"] and plan and (x["game_id"], x["observation"]) not in on_path
        assert parse_response(x["completion"])[0] == plan[0]
        assert f"You are now at step {x['step'] + 1}. Your current observation is:\n{x['observation']}\n" in x["prompt"]
    assert len({(x["game_id"], x["observation"]) for x in off}) == len(off)  # no state twice
    assert with_off_path_states(plain, entries, 4, env, PARAMS) == out  # seeded by warmup.seed
    assert with_off_path_states(plain, entries, 0, env, PARAMS) is plain


def test_off_path_states_need_sokobans_solver():
    with pytest.raises(ValueError, match=r"only Sokoban's solver .* set warmup.off_path_states: 0"):
        with_off_path_states([{"game_id": "g"}], [], 2, SimpleNamespace(name="alfworld"), PARAMS)


def test_played_claims_need_sokobans_solver():
    with pytest.raises(ConfigError, match=r"only Sokoban's oracle .* set teacher.oracle_claims: solver"):
        params_from_dict({"teacher": {"oracle_claims": "played"}})
    assert params_from_dict({"env": {"name": "sokoban"}, "teacher": {"oracle_claims": "played"}}).teacher.oracle_claims
    with pytest.raises(ConfigError, match="oracle_claims"):
        params_from_dict({"env": {"name": "sokoban"}, "teacher": {"oracle_claims": "plan"}})


def test_random_moves_baseline_win_more_of_short_rooms():
    from seed_core.tools.probe import probe_random

    env = Sokoban()
    rooms = [GameEntry(str(s), "train", "sokoban", generate_room(s).sha256()) for s in (3, 17, 6, 77)]
    assert [len(solve(generate_room(int(r.game_id)))) for r in rooms][:2] == [1, 1]  # then two of 9+ moves
    with env.open_pool(0) as pool:
        both = probe_random(pool, rooms, 15, 100, seed=1, n_boot=100)
        short = probe_random(pool, rooms[:2], 15, 100, seed=1, n_boot=100)
        far = probe_random(pool, rooms[2:], 15, 100, seed=1, n_boot=100)
        assert probe_random(pool, rooms, 15, 100, seed=1, n_boot=100) == both  # seeded
    assert short["success"] > 0.25 > far["success"] and both["runs"] == 100 and both["rooms"] == 4
    assert both["success_lo"] <= both["success"] <= both["success_hi"]
