"""The real ALFWorld engine through our environment: stored walkthroughs win, in-process and in workers."""

import json

import pytest

from seed_core.envs.alfworld.data import TASK_TYPES, game_path, list_games, stratified_subset
from seed_core.envs.alfworld.env import AlfworldGame, EnvPool, GameSlots, split_initial_observation


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


def _planner_copies() -> set[str]:
    """The copies of fast-downward's library this process has mapped (each game loads its own)."""
    return {line.split()[5] for line in open("/proc/self/maps") if "libdownward.so" in line}


def test_a_closed_games_engine_plays_the_next_game_without_a_new_planner_copy(alfworld_root):
    a, b = list_games(alfworld_root, "valid_seen")[:2]
    fresh_b = AlfworldGame(alfworld_root, b)
    want = fresh_b.reset()
    game_a = AlfworldGame(alfworld_root, a)
    game_a.reset(), game_a.step("go to desk 1")
    fresh_b.close(), game_a.close()
    game_a.close()  # closing twice is harmless
    before = _planner_copies()
    reused = AlfworldGame(alfworld_root, b)  # takes a's engine, mid-game in another room
    assert _planner_copies() == before
    assert reused.reset() == want
    for action in reused.walkthrough():
        state = reused.step(action)
    assert state.won
    reused.close()


def test_idle_games_are_reused_and_bounded_by_the_slots(alfworld_root):
    a, b, c, d, e = list_games(alfworld_root, "valid_seen")[:5]
    games = GameSlots(alfworld_root)
    games.reset(0, a), games.reset(1, b)
    first_a, first_b = games.by_slot[0], games.by_slot[1]
    games.reset(0, c), games.reset(1, d)
    assert [g.game_id for gs in games.idle.values() for g in gs] == [a, b]
    games.reset(0, e)  # c leaves: three idle for two slots, so a, the least recently left, is closed
    assert [g.game_id for gs in games.idle.values() for g in gs] == [b, c]
    assert first_a._env is None
    games.reset(1, b)
    assert games.by_slot[1] is first_b  # reloaded from idle, not from disk
    assert games.by_slot[1].reset().task
    games.close()
    assert not games.by_slot and not games.idle and first_b._env is None
