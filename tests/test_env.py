"""The real ALFWorld engine through our environment: stored walkthroughs win, in-process and in workers."""

import json

import pytest

from seed_core.envs.alfworld.data import TASK_TYPES, game_path, list_games, stratified_subset
from seed_core.envs.alfworld.env import AlfworldGame, EnvPool, split_initial_observation


def test_split_initial_observation():
    room, task = split_initial_observation(
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.\n\nYour task is to: put a pen in drawer."
    )
    assert room == "You are in the middle of a room."
    assert task == "put a pen in drawer."


def test_reset_state(alfworld_root):
    gid = [
        g
        for g in list_games(alfworld_root, "valid_seen")
        if g.split("/")[1] == "look_at_obj_in_light-AlarmClock-None-DeskLamp-323"
    ][0]
    game = AlfworldGame(alfworld_root, gid)
    s = game.reset()
    assert s.task == "look at alarmclock under the desklamp."
    assert s.observation.startswith("You are in the middle of a room. Looking quickly around you, you see a bed 2,")
    assert "help" not in s.admissible_actions and "go to desk 1" in s.admissible_actions
    assert not s.won
    assert game.step("jump around").observation == "Nothing happens."
    game.close()


@pytest.mark.parametrize("split, workers", [("valid_seen", 0), ("valid_unseen", 2)])
def test_walkthroughs_win_every_task_type(alfworld_root, split, workers):
    games = stratified_subset(list_games(alfworld_root, split), 6, seed=1)
    assert {g.split("/")[1].rsplit("-", 4)[0] for g in games} == set(TASK_TYPES)
    plans = {i: json.loads(game_path(alfworld_root, g).read_text())["walkthrough"] for i, g in enumerate(games)}
    with EnvPool(alfworld_root, workers) as pool:
        states = pool.reset(games)
        assert all(s.task for s in states)
        won = {i: False for i in plans}
        for k in range(max(len(p) for p in plans.values())):
            actions = {i: p[k] for i, p in plans.items() if k < len(p)}
            for i, s in pool.step(actions).items():
                assert not won[i], f"{games[i]} won before its walkthrough ended"
                won[i] = s.won
        assert all(won.values()), [games[i] for i, w in won.items() if not w]
