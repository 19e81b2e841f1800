"""Sokoban rooms: generation from seeds, gym-sokoban's rules and rewards, rendering, the solver, the oracle.

Pure numpy (no torch): hand-made rooms are written as maps in verl-agent's symbols, one row per string."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import deque

import numpy as np
import pytest

from seed_core.envs.sokoban import room as room_module
from seed_core.envs.sokoban.env import Sokoban
from seed_core.envs.sokoban.oracle import (
    Push,
    SokobanOracleTeacher,
    analyze_episode,
    check_skill,
    failure_answer,
    success_answer,
)
from seed_core.envs.sokoban.room import (
    ACTIONS,
    GenerationError,
    Room,
    check_room_params,
    generate_room,
    is_solvable,
    room_from_text,
    search,
    solve,
    step_labels,
)
from seed_core.method.skills import consistency_metrics
from seed_core.records import DataError, Skill, Step, Trajectory

# symbol -> (fixed tile, box here, player here)
_MAP = {
    "#": (0, False, False),
    "_": (1, False, False),
    "O": (2, False, False),
    "X": (1, True, False),
    "√": (2, True, False),
    "P": (1, False, True),
    "S": (2, False, True),
}


def room_from_map(*rows: str) -> Room:
    fixed = np.array([[_MAP[ch][0] for ch in row] for row in rows], dtype=np.int8)
    boxes = [(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if _MAP[ch][1]]
    (player,) = [(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if _MAP[ch][2]]
    return Room(fixed, tuple(boxes), player)


def play(room: Room, actions) -> Room:
    for a in actions:
        room, _, _ = room.step(a)
    return room


# ---------------------------------------------------------------- generation


def test_rooms_are_deterministic_per_seed_solvable_and_start_unsolved():
    rooms = {seed: generate_room(seed) for seed in range(200)}
    for seed in (0, 17, 199):
        again = generate_room(seed)
        assert again == rooms[seed] and again.sha256() == rooms[seed].sha256()
    assert len({r.sha256() for r in rooms.values()}) >= 180  # different seeds, different rooms (mostly)
    for seed, room in rooms.items():
        assert room.fixed.shape == (6, 6) and len(room.boxes) == 1
        assert not room.fixed[[0, -1], :].any() and not room.fixed[:, [0, -1]].any(), f"seed {seed}: border"
        assert room.boxes_on_target() == 0, f"seed {seed} starts with a box on its target"
        plan = solve(room)
        assert plan, f"seed {seed} has no plan"
        assert play(room, plan).won
    assert generate_room(3, (7, 8), 2).fixed.shape == (7, 8)
    assert len(generate_room(3, (7, 8), 2).boxes) == 2


def test_sha256_covers_layout_boxes_and_player():
    room = room_from_map("#####", "#P_X#", "#O__#", "#####")
    assert room.sha256() == room_from_map("#####", "#P_X#", "#O__#", "#####").sha256()
    assert room.sha256() != room_from_map("#####", "#_PX#", "#O__#", "#####").sha256()  # player
    assert room.sha256() != room_from_map("#####", "#PX_#", "#O__#", "#####").sha256()  # box
    assert room.sha256() != room_from_map("#####", "#P_X#", "#_O_#", "#####").sha256()  # target


@pytest.mark.parametrize(
    "dim, boxes, names",
    [
        ((4, 6), 1, "env.sokoban.dim"),
        ((6, 3), 1, "env.sokoban.dim"),
        ((6,), 1, "env.sokoban.dim"),
        ("6x6", 1, "env.sokoban.dim"),
        ((6, 6), 0, "env.sokoban.boxes"),
        ((6, 6), 6, "env.sokoban.boxes"),
        ((6, 6), True, "env.sokoban.boxes"),
    ],
)
def test_impossible_parameters_name_the_parameter(dim, boxes, names):
    with pytest.raises(GenerationError, match=names):
        check_room_params(dim, boxes)
    with pytest.raises(GenerationError, match=names):
        generate_room(0, dim, boxes)


def test_parameter_limits():
    assert check_room_params((5, 5), 3) == (5, 5)
    assert check_room_params([6, 6], 5) == (6, 6)
    with pytest.raises(GenerationError, match=r"from 1 to 5"):
        check_room_params((6, 6), 6)
    with pytest.raises(GenerationError, match="seed"):
        generate_room(-1)


def test_exhausted_tries_name_the_seed():
    # 3 boxes in a 3x3 interior: many single tries find no room
    for seed in range(200):
        try:
            generate_room(seed, (5, 5), 3, tries=1)
        except GenerationError as e:
            msg = str(e)
            break
    else:
        pytest.fail("every (5, 5) 3-box room came out in one try")
    assert msg.startswith(f"no solvable room for seed {seed} with dim (5, 5) and 3 boxes within 1 try;")


def test_exhausted_tries_message(monkeypatch):
    monkeypatch.setattr(room_module, "_reverse_play", lambda fixed, player: None)
    with pytest.raises(GenerationError) as e:
        generate_room(17, (6, 6), 2)
    assert str(e.value).startswith("no solvable room for seed 17 with dim (6, 6) and 2 boxes within 20 tries;")


# ---------------------------------------------------------------- solver


def test_solver_finds_a_shortest_plan_on_hand_made_rooms():
    line = room_from_map("#######", "#P_X_O#", "#######")
    assert solve(line) == ["right", "right", "right"]
    # two pushes (up and left, either order) plus walking round the box: 5 moves at least
    corner = room_from_map("#####", "#O__#", "#_X_#", "#__P#", "#####")
    plan = solve(corner)
    assert len(plan) == 5 and play(corner, plan).won
    # the target is behind the box: walk round it through the row below (5 moves), then push right
    detour = room_from_map("######", "#_XOP#", "#____#", "######")
    plan = solve(detour)
    assert len(plan) == 6 and plan[-1] == "right" and play(detour, plan).won
    assert solve(room_from_map("######", "#OX_P#", "######")) == ["left", "left"]
    assert solve(room_from_map("####", "#P√#", "####")) == []  # already won


def test_solver_optimum_matches_exhaustive_search_on_generated_rooms():
    for seed in range(20):
        room = generate_room(seed)
        plan = solve(room)
        assert play(room, plan).won
        # a plain BFS over rooms (no pruning) reaches a won room first at the same depth
        seen, todo = {room.state_key()}, deque([(room, 0)])
        while todo:
            r, d = todo.popleft()
            if r.won:
                break
            for a in ACTIONS:
                n = r.moved(a)
                if n.state_key() not in seen:
                    seen.add(n.state_key())
                    todo.append((n, d + 1))
        assert d == len(plan), f"seed {seed}: solver {len(plan)} moves, exhaustive {d}"


def test_unsolvable_rooms():
    cornered = room_from_map("#####", "#X_O#", "#__P#", "#####")  # box in a corner, not on a target
    assert solve(cornered) is None and not is_solvable(cornered)
    assert search(cornered) == (None, True)
    on_wall = room_from_map("######", "#_X__#", "#___P#", "#O___#", "######")  # box on the top wall, target below
    assert solve(on_wall) is None
    # the state budget: undecided rather than unsolvable
    far = room_from_map("#######", "#P____#", "#__X__#", "#_____#", "#____O#", "#######")
    assert search(far, max_states=3) == (None, False)
    assert solve(far, max_states=3) is None and solve(far) is not None


# ---------------------------------------------------------------- rules and rewards


def test_push_onto_target_rewards_and_wins():
    room = room_from_map("#####", "#PXO#", "#####")
    nxt, reward, won = room.step("right")
    assert reward == pytest.approx(-0.1 + 1) and won and nxt.won
    assert nxt.player == (1, 2) and nxt.boxes == ((1, 3),)
    assert room.player == (1, 1) and room.boxes == ((1, 2),)  # the old room is unchanged


def test_push_off_target_is_penalised():
    room = room_from_map("######", "#P√__#", "######")
    assert room.won
    nxt, reward, won = room.step("right")
    assert reward == pytest.approx(-0.1 - 1) and not won
    assert nxt.boxes == ((1, 3),) and nxt.text() == "# # # # # #\n# _ S X _ #\n# # # # # #"
    # a box pushed from one target onto the next: the count of boxes on targets, and so the reward, stays
    two = room_from_map("#######", "#P√O__#", "#X____#", "#_____#", "#######")
    nxt, reward, won = two.step("right")
    assert reward == pytest.approx(-0.1) and nxt.boxes_on_target() == 1 and not won


def test_plain_moves_and_pushes_cost_the_step_penalty():
    room = room_from_map("######", "#PX_O#", "#____#", "######")
    nxt, reward, won = room.step("right")  # push onto floor
    assert reward == pytest.approx(-0.1) and not won and nxt.boxes == ((1, 3),)
    nxt, reward, _ = room.step("down")  # walk
    assert reward == pytest.approx(-0.1) and nxt.player == (2, 1) and nxt.boxes == room.boxes


@pytest.mark.parametrize(
    "rows, action",
    [
        (("#####", "#P_O#", "#X__#", "#####"), "left"),  # into a wall
        (("#####", "#P_O#", "#X__#", "#####"), "up"),
        (("#####", "#_PX#", "#O__#", "#####"), "right"),  # box into a wall
        (("######", "#PXX_#", "#OO__#", "######"), "right"),  # box into another box
        (("#####", "#P_O#", "#X__#", "#####"), "jump"),  # not an action
        (("#####", "#P_O#", "#X__#", "#####"), "Up"),
        (("#####", "#P_O#", "#X__#", "#####"), ""),
    ],
)
def test_blocked_moves_and_unknown_actions_change_nothing(rows, action):
    room = room_from_map(*rows)
    nxt, reward, won = room.step(action)
    assert nxt == room and reward == pytest.approx(-0.1) and not won


def test_moves_off_a_grid_without_border_walls_are_blocked():
    room = Room(np.array([[1, 1, 2]], dtype=np.int8), ((0, 1),), (0, 0))
    assert room.step("up")[0] == room and room.step("left")[0] == room
    assert room.step("right")[2]  # pushed onto the target
    assert Room(np.array([[2, 1, 1]], dtype=np.int8), ((0, 2),), (0, 1)).step("right")[0].boxes == ((0, 2),)


def test_rooms_are_immutable_and_validated():
    room = room_from_map("#####", "#PXO#", "#####")
    with pytest.raises(ValueError):
        room.fixed[1, 1] = 0
    with pytest.raises(ValueError, match="target"):
        Room(np.array([[1, 1, 1]]), ((0, 1),), (0, 0))  # no target for the box
    with pytest.raises(ValueError, match="wall"):
        Room(np.array([[0, 1, 2]]), ((0, 1),), (0, 0))  # player on a wall
    with pytest.raises(ValueError):
        Room(np.array([[1, 4, 2]]), ((0, 1),), (0, 0))  # a box code in the fixed grid


# ---------------------------------------------------------------- rendering


def test_text_uses_verl_agent_symbols():
    fixed = np.array(
        [[0, 0, 0, 0, 0, 0], [0, 2, 2, 1, 1, 0], [0, 1, 1, 1, 2, 0], [0, 0, 0, 0, 0, 0]],
        dtype=np.int8,
    )
    room = Room(fixed, ((2, 2), (1, 2), (1, 3)), (1, 1))
    assert room.text() == "# # # # # #\n# S √ X _ #\n# _ X _ O #\n# # # # # #"
    assert room.boxes == ((1, 2), (1, 3), (2, 2))  # sorted
    assert room.boxes_on_target() == 1 and not room.won


def test_rgb_is_tile_aligned_and_deterministic():
    room = generate_room(5)
    img = room.rgb()
    assert img.shape == (96, 96, 3) and img.dtype == np.uint8
    assert np.array_equal(img, generate_room(5).rgb())
    assert room.rgb(tile=8).shape == (48, 48, 3)

    # same tile code -> identical 16x16 block anywhere; different codes -> different blocks
    blocks = {}
    for (r, c), code in np.ndenumerate(room.tiles()):
        block = img[16 * r : 16 * r + 16, 16 * c : 16 * c + 16]
        if code in blocks:
            assert np.array_equal(blocks[code], block)
        blocks[code] = block
    codes = sorted(blocks)
    for i, a in enumerate(codes):
        for b in codes[i + 1 :]:
            assert not np.array_equal(blocks[a], blocks[b]), (a, b)

    # two rooms differing in one tile differ only inside that tile's block
    a = room_from_map("#####", "#P_X#", "#O__#", "#####")
    b = room_from_map("#####", "#P_X#", "#O_##", "#####")
    diff = np.argwhere((a.rgb() != b.rgb()).any(axis=2))
    assert len(diff) and (diff // 16 == (2, 3)).all()


def test_all_seven_sprites_differ():
    room = Room(np.array([[0, 1, 2, 2, 2, 1]], dtype=np.int8), ((0, 3), (0, 4), (0, 5)), (0, 2))
    # wall, floor, player on target, box on target (twice), box; then player, target, box, floor
    tiles = {int(code): room.rgb()[:, 16 * c : 16 * c + 16].tobytes() for c, code in enumerate(room.tiles()[0])}
    other = Room(np.array([[1, 2, 1, 1]], dtype=np.int8), ((0, 2),), (0, 0))
    tiles |= {int(code): other.rgb()[:, 16 * c : 16 * c + 16].tobytes() for c, code in enumerate(other.tiles()[0])}
    assert sorted(tiles) == list(range(7)) and len(set(tiles.values())) == 7


# ---------------------------------------------------------------- oracle

# box at (3, 4) on the right wall with its target up that wall at (1, 4): push it up twice (4 moves in all)
WALL_ROOM = ("######", "#___O#", "#____#", "#__PX#", "#____#", "######")


def test_analysis_names_the_push_into_a_corner():
    room = room_from_map(*WALL_ROOM)
    assert len(solve(room)) == 4
    # 1 up, 2 right, 3 down pushes the box from (3, 4) into the corner (4, 4), 4 bumps it, 5 is no move
    a = analyze_episode(room, ["up", "right", "down", "down", None, "left"])
    assert not a.won and a.steps == 6 and len(a.start_plan) == 4
    assert a.dead_step == 3 and a.dead_push == Push(3, "down", (3, 4), (4, 4))
    assert a.dead_reason == "corner" and a.dead_walls == ("down", "right")
    assert a.bump_steps == (4,) and a.invalid_steps == (5,) and a.last_plan is None
    answer = failure_answer(a)
    assert "step 3: pushing the box down into (4, 4) left it in a corner" in answer["episode_skill"]
    assert answer["episode_skill"].startswith("Never push a box into a corner")
    assert answer["episode_skill"].count("(row, col), row 0 at the top") == 1
    assert "step 3 (push down)" in answer["episode_summary"]


def test_analysis_names_a_push_against_a_wall_without_target():
    room = room_from_map("#######", "#O____#", "#_____#", "#__PX_#", "#_____#", "#######")
    a = analyze_episode(room, ["up", "down", "right"])
    assert a.dead_step == 3 and a.dead_reason == "wall" and a.dead_walls == ("right",)
    assert a.revisit_steps == (2,)
    skill = failure_answer(a)["episode_skill"]
    assert "against the wall right of it, where it can never reach the target at (1, 1)" in skill
    assert skill.startswith("Never push a box against a wall unless its target lies along that wall")


def test_analysis_of_a_win_and_of_running_out_of_steps():
    room = room_from_map(*WALL_ROOM)
    won = analyze_episode(room, ["down", "right", "up", "up", "left"])  # the last action comes after the win
    assert won.won and won.steps == 4 and won.dead_step is None and won.wasted == 0
    skill = success_answer(won)["episode_skill"]
    assert skill.startswith("Workflow: walk to the side of the box opposite its target")
    assert "with: down, right, up, up (4 steps, optimal 4)" in skill

    lost = analyze_episode(room, ["left", "right", "left", "bogus"])
    assert not lost.won and lost.dead_step is None
    assert lost.revisit_steps == (2, 3) and lost.invalid_steps == (4,) and lost.wasted == 3
    assert lost.last_plan == ("down", "right", "right", "up", "up")
    skill = failure_answer(lost)["episode_skill"]
    assert "the room still needed 5 more step(s): down, right, right, up, up" in skill
    assert "Failure after 4 step(s) (optimal 4): the room stayed solvable" in failure_answer(lost)["episode_summary"]


def dead_end(room: Room) -> list[str] | None:
    """The shortest move sequence from `room` into a state with no plan (None if there is none)."""
    seen, todo = {room.state_key()}, deque([(room, [])])
    while todo:
        r, path = todo.popleft()
        for a in ACTIONS:
            n = r.moved(a)
            if n.state_key() in seen or n.won:
                continue
            seen.add(n.state_key())
            if n.boxes != r.boxes and search(n) == (None, True):
                return [*path, a]
            todo.append((n, [*path, a]))
    return None


def trajectory(seed: int, actions: list[str], won: bool, valid: list[bool] | None = None) -> Trajectory:
    valid = valid or [True] * len(actions)
    steps = [Step("", list(ACTIONS), "", a, [], [], a, v, 0.0, "") for a, v in zip(actions, valid)]
    return Trajectory(
        f"t{seed}",
        str(seed),
        "train",
        "sokoban",
        "push the box",
        "g",
        0,
        won,
        0.0,
        len(steps),
        valid.count(False),
        steps,
    )


def test_oracle_teacher_answers_like_the_alfworld_one():
    seed = next(s for s in range(50) if dead_end(generate_room(s)))
    room = generate_room(seed)
    bad = dead_end(room)
    teacher = SokobanOracleTeacher((6, 6), 1)
    good, lost = trajectory(seed, solve(room), True), trajectory(seed, bad, False)
    answers = teacher.complete_trajectories([good, lost])
    assert [a.prompt_tokens for a in answers] == [0, 0]
    assert [a.completion_tokens for a in answers] == [len(a.text.split()) for a in answers]
    assert teacher.stats.calls == 2 and teacher.stats.completion_tokens == sum(a.completion_tokens for a in answers)
    assert json.loads(answers[0].text)["episode_skill"].startswith("Workflow:")
    fail = json.loads(answers[1].text)
    assert f"the decisive mistake was step {len(bad)}: pushing the box {bad[-1]}" in fail["episode_skill"]
    # byte-identical, also from a fresh teacher
    assert SokobanOracleTeacher([6, 6], 1).analyze_trajectory(lost) == answers[1].text
    assert teacher.analyze_trajectory(lost) == answers[1].text


def test_oracle_max_chars_keeps_whole_sentences():
    seed = next(s for s in range(50) if dead_end(generate_room(s)))
    room = generate_room(seed)
    traj = trajectory(seed, [*dead_end(room), "up", "bogus", "down", "down"], False)
    full = json.loads(SokobanOracleTeacher((6, 6), 1).analyze_trajectory(traj))
    assert "the decisive mistake was step" in full["episode_skill"] and len(full["episode_skill"]) > 500
    for budget in (120, 250, 400):
        short = json.loads(SokobanOracleTeacher((6, 6), 1, max_chars=budget).analyze_trajectory(traj))
        first = full["episode_skill"].split(". ")[0] + "."
        assert len(short["episode_skill"]) <= budget or short["episode_skill"] == first
        assert len(short["episode_summary"]) <= budget // 2 or short["episode_summary"].count(". ") == 0
        assert short["episode_skill"].endswith(".") and short["episode_skill"].startswith(first)
        assert all(s in full["episode_skill"] for s in short["episode_skill"].split(". "))
        assert (short["episode_skill"] != first) == (budget > 120)  # 120 holds only the rule


def test_played_claims_state_only_what_the_episode_shows():
    rng = np.random.default_rng(1)
    solver, played = SokobanOracleTeacher((6, 6), 1), SokobanOracleTeacher((6, 6), 1, claims="played")
    kinds = set()
    for seed in range(40):
        room, actions = generate_room(seed), []
        while len(actions) < 15 and not room.won:
            plan = solve(room)
            actions.append(plan[0] if plan and rng.random() < 0.5 else str(rng.choice(list(ACTIONS))))
            room = room.moved(actions[-1])
        traj = trajectory(seed, actions, room.won)
        a = played.analyze(traj)
        kinds.add("won" if a.won else "dead" if a.dead_push else "alive")
        text = " ".join(json.loads(played.analyze_trajectory(traj)).values())
        full = " ".join(json.loads(solver.analyze_trajectory(traj)).values())
        # the solver's facts are gone; its plans only ever appear in the solver version
        assert "optimal" not in text and "shortest plan" not in text and "still needed" not in text, text
        assert "optimal" in full
        # every move list left is the moves the episode made, so checking it needs no solver
        lists = re.findall(r"(?<!one of )\b(?:up|down|left|right)(?:, (?:up|down|left|right)\b)+", text)
        assert all(ls.split(", ") == list(a.effective) for ls in lists), (lists, a.effective)
        assert played.check_skill(traj, text).consistent
    assert kinds == {"won", "dead", "alive"}  # every kind of answer was exercised
    with pytest.raises(ValueError, match="solver, played"):
        SokobanOracleTeacher((6, 6), 1, claims="plan")


def test_oracle_replays_invalid_steps_as_no_ops_and_refuses_a_changed_room():
    room = generate_room(4)
    plan = solve(room)
    teacher = SokobanOracleTeacher((6, 6), 1)
    # the same moves, the first one an invalid response: the env played a no-op, so the room is not won
    traj = trajectory(4, plan, False, valid=[False] + [True] * (len(plan) - 1))
    a = teacher.analyze(traj)
    assert a.invalid_steps == (1,) and not a.won
    with pytest.raises(DataError, match="t4 records won=True"):
        teacher.analyze(trajectory(4, plan[:-1], True))
    with pytest.raises(DataError, match="not a room seed"):
        teacher.analyze_trajectory(Trajectory("t", "kitchen-3", "train", "sokoban", "", "g", 0, False, 0, 0, 0))


# ---------------------------------------------------------------- step labels and skill checks


def test_step_labels_optimal_wasted_invalid_and_the_winning_move():
    room = room_from_map(*WALL_ROOM)  # shortest plan: down, right, up, up
    # left walks away (5 to go), right comes back (4), an invalid answer changes nothing, then the plan; the
    # move after the win gets no label
    labels = step_labels(room, ["left", "right", None, "down", "right", "up", "up", "left"])
    assert labels == ["wasted", "optimal", "wasted", "optimal", "optimal", "optimal", "optimal"]


def test_step_labels_a_bump_a_push_into_a_corner_and_what_follows():
    room = room_from_map(*WALL_ROOM)
    # right bumps the box into the wall, up and right walk away, down pushes the box into the corner (4, 4);
    # after that no move can matter
    labels = step_labels(room, ["right", "up", "right", "down", "down", "bogus"])
    assert labels == ["wasted", "wasted", "wasted", "fatal", "lost", "lost"]
    assert step_labels(room, []) == []


def test_step_labels_agree_with_the_solver_plan_on_generated_rooms():
    for seed in range(20):
        room = generate_room(seed)
        plan = solve(room)
        assert step_labels(room, plan) == ["optimal"] * len(plan)


def test_room_from_text_reads_back_every_state_of_a_plan():
    for seed in range(10):
        room = generate_room(seed)
        for action in [*solve(room), "up"]:
            assert room_from_text(room.text()) == room
            room = room.moved(action)
    on_target = room_from_map("#####", "#S_X#", "#___#", "#####")  # the player on the target
    assert room_from_text(on_target.text()) == on_target
    with pytest.raises(ValueError, match="at least one"):
        room_from_text(on_target.text().replace("X", "_"))  # no box: not a room


def won_episode() -> tuple[Room, list[str], object]:
    room = room_from_map(*WALL_ROOM)
    actions = ["down", "right", "up", "up"]
    return room, actions, analyze_episode(room, actions)


def test_check_skill_accepts_true_claims_and_the_oracles_own_answer():
    room, actions, a = won_episode()
    ok = check_skill("Success. Walk below the box, then push it: down, right, up, up.", room, actions, a)
    assert ok.outcome is True and (ok.move_lists, ok.move_lists_true) == (1, 1) and ok.consistent
    answer = success_answer(a)
    own = check_skill(f"{answer['episode_summary']}\n{answer['episode_skill']}", room, actions, a)
    assert own.consistent and own.move_lists >= 1
    # a lost episode: the plan left from its last state is a true claim, a made-up plan is not
    lost = analyze_episode(room, ["left", "right", "left"])
    text = failure_answer(lost)["episode_skill"]  # "... the room still needed 5 more step(s): down, right, ..."
    check = check_skill(text, room, ["left", "right", "left"], lost)
    assert check.outcome is True and check.move_lists_true == check.move_lists >= 1 and check.consistent


def test_check_skill_flags_false_outcomes_false_plans_and_empty_claims():
    room, actions, a = won_episode()
    assert check_skill("Failure: the box got stuck.", room, actions, a).outcome is False
    assert check_skill("Success, then failure.", room, actions, a).outcome is False  # both claimed
    wrong = check_skill("Success in 3 steps with: down, left, left.", room, actions, a)
    assert wrong.outcome is True and (wrong.move_lists, wrong.move_lists_true) == (1, 0) and not wrong.consistent
    empty = check_skill("Always think before you move.", room, actions, a)
    assert empty.outcome is None and empty.move_lists == 0 and not empty.consistent
    # "never reached" is a failure claim, not a success
    assert check_skill("The box never reached the target.", room, actions, a).outcome is False


def test_check_skill_checks_the_counts_and_step_numbers_it_states():
    room, actions, a = won_episode()  # 4 steps, pushes at steps 3 and 4, no bump, revisit or invalid answer
    counts = "0 invalid response(s), 0 move(s) with no effect, 0 move(s) back to an earlier position."
    true = check_skill(f"Success in 4 step(s). 2 push(es), {counts} Step 3 pushes the box up.", room, actions, a)
    assert (true.facts, true.facts_true) == (6, 6) and true.consistent
    # the Stage-1 analyzer's kind of lie: right outcome and wording, wrong counts, a step the episode never had
    lie = check_skill(f"Success in 4 step(s). 1 push(es), {counts} A bump at step 9.", room, actions, a)
    assert lie.outcome is True and (lie.facts, lie.facts_true) == (6, 4) and not lie.consistent
    revisits = check_skill("Success. 2 move(s) went back to an earlier position (step 2, 3).", room, actions, a)
    assert (revisits.facts, revisits.facts_true) == (
        3,
        2,
    ) and not revisits.consistent  # steps 2, 3 exist; not 2 revisits


def test_the_oracles_answers_are_consistent_on_random_episodes():
    rng = np.random.default_rng(0)
    teacher, short = SokobanOracleTeacher((6, 6), 1), SokobanOracleTeacher((6, 6), 1, max_chars=300)
    played = SokobanOracleTeacher((6, 6), 1, max_chars=300, claims="played")
    for seed in range(60):
        room, actions = generate_room(seed), []
        while len(actions) < 15 and not room.won:  # random moves and invalid answers, now and then the solver's
            plan = solve(room)
            actions.append(plan[0] if plan and rng.random() < 0.3 else str(rng.choice([*ACTIONS, "bogus"])))
            room = room.moved(actions[-1])
        traj = trajectory(seed, actions, room.won, valid=[a in ACTIONS for a in actions])
        for t in (teacher, short, played):
            answer = json.loads(t.analyze_trajectory(traj))
            check = t.check_skill(traj, f"{answer['episode_summary']}\n{answer['episode_skill']}")
            assert check.consistent and check.facts > 0, answer  # every oracle summary states its counts


def test_consistency_metrics_over_a_batch_of_skills():
    seed = 4
    plan = solve(generate_room(seed))
    won = trajectory(seed, plan, True)

    def skill(summary: str, text: str, status: str = "ok") -> Skill:
        return Skill(won.traj_id, won.game_id, "sokoban", "success", summary, text, status, "", "test", "")

    skills = [
        skill(f"Success in {len(plan)} step(s).", "Push it: " + ", ".join(plan) + "."),  # all true
        skill("Failure.", "Push it: " + ", ".join(plan) + "."),  # false outcome
        skill("Success in 99 step(s).", "Go: up, up, up, up."),  # a false count, a false plan (up x4 loses room 4)
        skill("", "", "failed"),  # not parsed: not counted
    ]
    assert not generate_room(seed).moved("up").moved("up").moved("up").moved("up").won
    m = consistency_metrics(Sokoban(), [won] * 4, skills)
    assert m == {
        "skills/consistent": 1 / 3,
        "skills/outcome_true": 2 / 3,
        "skills/move_lists_true": 2 / 3,
        "skills/facts_true": 1 / 2,
    }
    assert consistency_metrics(Sokoban(), [won], [skills[-1]]) == {}


@pytest.mark.e2e
def test_modules_import_without_torch():
    code = "import sys, seed_core.envs.sokoban.oracle, seed_core.envs.sokoban.room; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
