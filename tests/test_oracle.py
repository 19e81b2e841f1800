"""The ALFWorld oracle teacher on real trajectories: real games played with scripted responses (no model).

For three task types, a replayed walkthrough (success) and a scripted failure (wrong receptacles, a loop,
badly formatted responses, stopped before winning) are analyzed; the skills must name the walkthrough's
receptacles in order, the true location of the target, the loop and the invalid steps, parse with
`skills.parse_skill`, and be byte-identical on a second run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from seed_core.envs.alfworld.data import list_games, task_type_of
from seed_core.envs.alfworld.oracle import OracleTeacher, kind_of
from seed_core.envs.alfworld.prompts import step_prompt
from seed_core.method.skills import analyze, analyzer_prompt, parse_skill, prompt_hash
from seed_core.records import Step, Trajectory
from seed_core.turns import parse_response

# The cool game's object starts in a closed microwave, so its route includes an `open`.
TASK_TYPES = (
    "pick_and_place_simple",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "look_at_obj_in_light",
)
INVALID = "I should probably look around the room for it."  # no tags: an invalid-format response


@pytest.fixture(scope="module")
def root(alfworld_root) -> Path:
    return alfworld_root  # missing games fail (conftest), with the command that installs them


def _game_ids(root: Path) -> dict[str, str]:
    """The first valid_seen game of each task type (sorted ids: a fixed choice)."""
    out: dict[str, str] = {}
    for gid in list_games(root, "valid_seen"):
        out.setdefault(task_type_of(gid), gid)
    return out


def play(root: Path, game_id: str, script=None) -> Trajectory:
    """A real episode of a real game, each response parsed and stepped exactly as `rollout.play` does.

    `script` is the list of responses (default: the walkthrough, well formatted), or a function of the
    freshly reset game returning that list; the game is reset again after it, so it may probe the game.
    """
    from seed_core.envs.alfworld.env import AlfworldGame

    game = AlfworldGame(root, game_id)
    try:
        state = game.reset()
        if script is None:
            responses = _tagged(game.walkthrough())
        elif callable(script):
            responses = script(game, state)
            state = game.reset()
        else:
            responses = list(script)
        steps, history = [], []
        for response in responses:
            prompt = step_prompt(game.task, state.observation, state.admissible_actions, history, 5)
            action, valid = parse_response(response)
            new = game.step(action)
            steps.append(
                Step(
                    observation=state.observation,
                    admissible_actions=list(state.admissible_actions),
                    prompt=prompt,
                    response=response,
                    response_ids=[],
                    response_logprobs=[],
                    action=action,
                    valid=valid,
                    reward=(10.0 if new.won else 0.0) - (0.0 if valid else 0.1),
                    feedback=new.observation,
                )
            )
            history.append((state.observation, action))
            state = new
            if new.won:
                break
    finally:
        game.close()
    return Trajectory(
        traj_id=f"test:{game_id}#{0 if state.won else 1}",
        game_id=game_id,
        split=game_id.split("/")[0],
        task_type=task_type_of(game_id),
        task=game.task,
        group_id=f"test:{game_id}",
        sample_idx=0,
        won=state.won,
        episode_return=sum(s.reward for s in steps),
        length=len(steps),
        invalid_count=sum(not s.valid for s in steps),
        steps=steps,
    )


def _tagged(actions: list[str]) -> list[str]:
    return [f"<think>The next step of the plan is {a}.</think><action>{a}</action>" for a in actions]


def _wrong_receptacles(game, state, n: int) -> list[str]:
    """`n` 'go to' actions off the expert route whose arrival text shows no target object and no closed door
    (checked by playing them), so an episode made of them cannot find the target."""
    walkthrough = game.walkthrough()
    target = kind_of(_expert_takes(walkthrough)[0][0])
    picked: list[str] = []
    for a in state.admissible_actions:
        if a.startswith("go to ") and a not in walkthrough:
            seen = game.step(a).observation
            if seen.startswith("You arrive at") and not re.search(rf"\b{target} \d+", seen) and "closed" not in seen:
                picked.append(a)
        if len(picked) == n:
            return picked
    raise AssertionError(f"{game.game_id}: fewer than {n} receptacles without the target")


def wander(game, state) -> list[str]:
    """Three wrong receptacles, then back to the first, the second and the first again (a loop), with two
    untagged responses (steps 3 and 8); it stops before winning."""
    a, b, c = _wrong_receptacles(game, state, 3)
    return _tagged([a, b]) + [INVALID] + _tagged([c, a, b, a]) + [INVALID]


def _expert_takes(walkthrough: list[str]) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for a in walkthrough if (m := re.match(r"take (.+?) from (.+)$", a))]


@pytest.fixture(scope="module")
def episodes(root: Path) -> dict[str, tuple[Trajectory, Trajectory]]:
    """(success, failure) per task type, played once for the module."""
    ids = _game_ids(root)
    return {t: (play(root, ids[t]), play(root, ids[t], wander)) for t in TASK_TYPES}


@pytest.fixture(scope="module")
def oracle(root: Path) -> OracleTeacher:
    return OracleTeacher(root)


def _answer(oracle: OracleTeacher, traj: Trajectory) -> tuple[str, str]:
    parsed = parse_skill(oracle.analyze_trajectory(traj))
    assert parsed.ok, parsed.error
    return parsed.summary, parsed.skill


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_success_skill_is_the_walkthrough_route_in_order(episodes, oracle, task_type):
    success, _ = episodes[task_type]
    assert success.won and success.invalid_count == 0
    walkthrough = oracle.game_facts(success.game_id, task_type).walkthrough
    summary, skill = _answer(oracle, success)
    assert summary.startswith(f"Success in {len(walkthrough)} step(s), 0 invalid-format step(s)")
    # The workflow is the agent's own effective route, here the expert's, action for action and in order.
    assert skill.startswith(f"To {success.task.rstrip('.')}: {', '.join(walkthrough)}. Rule:"), skill
    receptacles = [a[len("go to ") :] for a in walkthrough if a.startswith("go to ")]
    assert receptacles and all(r in skill for r in receptacles)
    assert "Rule:" in skill and "detour" not in skill


def test_success_skill_names_the_appliance_rule(episodes, oracle):
    _, skill = _answer(oracle, episodes["pick_heat_then_place_in_recep"][0])
    assert re.search(r"heat it with microwave \d+ while holding it, and only then move it", skill)
    success = episodes["look_at_obj_in_light"][0]
    walkthrough = oracle.game_facts(success.game_id, "look_at_obj_in_light").walkthrough
    lamp = next(a for a in walkthrough if a.startswith("use "))
    _, skill = _answer(oracle, success)
    assert f"turn on {lamp[len('use ') :]} (at " in skill and f"with '{lamp}'" in skill
    assert re.search(r"done when you hold the \w+ beside the lit \w+lamp", skill)


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_failure_skill_names_true_location_and_loop(episodes, oracle, task_type):
    _, failure = episodes[task_type]
    assert not failure.won
    walkthrough = oracle.game_facts(failure.game_id, task_type).walkthrough
    obj, where = _expert_takes(list(walkthrough))[0]
    summary, skill = _answer(oracle, failure)
    # The true location: where the expert takes the object, told as where to go first.
    assert f"the {kind_of(obj)} is at {where}; go there first" in skill, skill
    assert f"{obj} at {where}" in skill
    assert f"True location: {obj} at {where}" in summary
    # The searched receptacles are named as the mistake, and the expert plan is given.
    first_wrong = failure.steps[0].action
    assert f"Do not search {first_wrong[len('go to ') :]}" in skill
    assert f"Plan that works: {', '.join(walkthrough)}." in skill
    assert f"step 1: '{first_wrong}' instead of '{walkthrough[0]}'" in skill
    # The loop: the first wrong receptacle was visited three times; only the first gave its arrival text,
    # so 'go to X' repeats with the same "Nothing happens." or arrival text at least twice.
    assert re.search(rf"You repeated '{re.escape(first_wrong)}' \d+ times", skill), skill
    assert "when an observation repeats" in skill


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_invalid_format_steps_are_counted(episodes, oracle, task_type):
    _, failure = episodes[task_type]
    invalid = [t for t, s in enumerate(failure.steps, 1) if not s.valid]
    assert invalid == [3, 8] and failure.invalid_count == 2
    summary, skill = _answer(oracle, failure)
    assert f"Failure after {len(failure.steps)} step(s), 2 invalid-format step(s)" in summary
    assert "2 response(s) broke the format (step 3, 8)" in skill
    assert "<think></think>" in skill and "<action></action>" in skill


def test_success_with_detours_keeps_only_the_effective_route(root, oracle):
    gid = _game_ids(root)["pick_and_place_simple"]
    walkthrough = oracle.game_facts(gid, "pick_and_place_simple").walkthrough
    wrong: list[str] = []

    def detour_then_plan(game, state):
        wrong.extend(_wrong_receptacles(game, state, 2))
        return _tagged(wrong) + [INVALID] + _tagged(list(walkthrough))

    traj = play(root, gid, detour_then_plan)
    assert traj.won and len(traj.steps) == len(walkthrough) + 3
    summary, skill = _answer(oracle, traj)
    assert summary.startswith(f"Success in {len(traj.steps)} step(s), 1 invalid-format step(s)")
    assert f": {', '.join(walkthrough)}. Rule:" in skill  # the detours are not part of the workflow
    assert f"This route needs {len(walkthrough)} actions; the episode took {len(traj.steps)}." in skill
    assert f"Skip the detours to {wrong[0][len('go to ') :]} and {wrong[1][len('go to ') :]}." in skill
    assert "1 response(s) broke the format (step 3)" in skill


def test_failure_after_taking_the_object_names_the_missing_transform(root, oracle):
    gid = _game_ids(root)["pick_heat_then_place_in_recep"]
    walkthrough = OracleTeacher(root).game_facts(gid, "pick_heat_then_place_in_recep").walkthrough
    obj, _ = _expert_takes(list(walkthrough))[0]
    heat = next(a for a in walkthrough if a.startswith("heat "))
    # Follow the plan but skip the heating: the object ends in the right receptacle, cold.
    traj = play(root, gid, _tagged([a for a in walkthrough if a != heat and not a.startswith("go to microwave")]))
    assert not traj.won
    summary, skill = _answer(oracle, traj)
    appliance = heat.split(" with ")[1]
    assert skill.startswith(f"After taking the {kind_of(obj)}, heat it with {appliance} ('{heat}') before placing it")
    assert "before it was heated" in skill
    assert f"it took {obj} but never heated it" in summary


def test_output_is_json_with_exactly_the_two_fields_and_deterministic(episodes, root):
    for success, failure in episodes.values():
        for traj in (success, failure):
            first = OracleTeacher(root).analyze_trajectory(traj)
            again = OracleTeacher(root).analyze_trajectory(
                Trajectory.from_dict(json.loads(json.dumps(__import__("dataclasses").asdict(traj))))
            )
            assert first == again  # byte-identical, from a fresh teacher and a JSON round trip of the record
            assert list(json.loads(first)) == ["episode_summary", "episode_skill"]


@pytest.mark.parametrize("budget", [40, 300])
def test_length_budget_keeps_whole_sentences_in_priority_order(episodes, oracle, root, budget):
    short = OracleTeacher(root, max_chars=budget)
    for success, failure in episodes.values():
        for traj in (success, failure):
            full = json.loads(oracle.analyze_trajectory(traj))
            cut = json.loads(short.analyze_trajectory(traj))
            for field in ("episode_summary", "episode_skill"):
                sentences = re.split(r"(?<=\.) ", full[field])
                kept = re.split(r"(?<=\.) ", cut[field])
                # the first sentence always; then only sentences of the full answer, in its order
                assert kept[0] == sentences[0]
                assert [s for s in sentences if s in kept] == kept, (field, cut[field])
                limit = budget // 2 if field == "episode_summary" else budget
                assert len(cut[field]) <= limit or kept == sentences[:1]
    # At 300 characters a failure still names the true location: the summary's second sentence.
    _, failure = episodes["pick_and_place_simple"]
    obj, where = _expert_takes(list(oracle.game_facts(failure.game_id, "pick_and_place_simple").walkthrough))[0]
    summary = json.loads(OracleTeacher(root, max_chars=300).analyze_trajectory(failure))["episode_summary"]
    assert f"True location: {obj} at {where}." in summary


def test_analyze_dispatches_trajectories_to_the_oracle(episodes, root):
    trajs = [t for pair in episodes.values() for t in pair]
    teacher = OracleTeacher(root)
    skills, stats = analyze(trajs, teacher)
    assert [s.parse_status for s in skills] == ["ok"] * len(trajs)
    assert [s.outcome for s in skills] == ["success", "failure"] * len(TASK_TYPES)
    assert all(s.producer == "oracle" and s.skill for s in skills)
    # The record keeps the analyzer prompt's hash: the SFT pair is (analyzer prompt -> oracle answer).
    assert [s.prompt_hash for s in skills] == [prompt_hash(analyzer_prompt(t)) for t in trajs]
    assert [s.raw_output for s in skills] == [teacher.analyze_trajectory(t) for t in trajs]
    words = sum(len(s.raw_output.split()) for s in skills)
    assert (stats.calls, stats.prompt_tokens, stats.completion_tokens, stats.parse_rate) == (len(trajs), 0, words, 1.0)
    assert (teacher.stats.calls, teacher.stats.prompt_tokens, teacher.stats.completion_tokens) == (len(trajs), 0, words)


def test_names_match_the_names_the_game_shows(episodes, oracle):
    """The oracle's demangling of the PDDL problem gives the names the running game showed the agent."""
    for task_type, (success, _) in episodes.items():
        facts = oracle.game_facts(success.game_id, task_type)
        shown = {a[len("go to ") :] for a in success.steps[0].admissible_actions if a.startswith("go to ")}
        assert shown <= facts.receptacles
        for obj, where in facts.expert_takes:
            assert where in facts.locations[obj]  # the walkthrough takes it where the PDDL problem puts it
        # Every instance the PDDL problem puts there is listed when the agent arrives (or opens it).
        obj, where = facts.expert_takes[0]
        t = next(i for i, s in enumerate(success.steps) if s.action == f"take {obj} from {where}")
        contents = next(
            s.feedback
            for s in reversed(success.steps[:t])
            if s.feedback.startswith((f"You arrive at {where}.", f"You open the {where}."))
        )
        expected = [o for o, rec in facts.instances_of(facts.target) if rec == where]
        assert obj in expected and all(f"a {o}," in contents or f"a {o}." in contents for o in expected), contents


def test_missing_game_file_is_refused_with_how_to_install(tmp_path, episodes):
    from seed_core.envs.alfworld.data import DataError

    traj = episodes["pick_and_place_simple"][0]
    with pytest.raises(DataError, match="game file .* does not exist; install the ALFWorld games"):
        OracleTeacher(tmp_path).analyze_trajectory(traj)
