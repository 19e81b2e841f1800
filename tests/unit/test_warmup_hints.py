"""`warmup.skill_hints`: expert steps trained again with a true hint in SEED's skill block."""

from types import SimpleNamespace

import pytest

from seed_core.config import params_from_dict
from seed_core.envs import GameEntry
from seed_core.envs.sokoban.env import Sokoban
from seed_core.envs.sokoban.room import generate_room, room_from_text, solve
from seed_core.method.prompts import SKILL_BLOCK, parse_response
from seed_core.stages.warmup import with_skill_hints

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
