"""Skill library: serialization, the tolerant analyzer-output parser, and analyze() with its one re-ask."""

from __future__ import annotations

import dataclasses
import json

import pytest

from seed_core.method.prompts import ANALYZER_PROMPT, SKILL_PLACEHOLDER
from seed_core.method.skills import (
    analyze,
    analyzer_prompt,
    parse_skill,
    prompt_hash,
    serialize_trajectory,
    shuffled_skills,
    step_returns,
)
from seed_core.method.teachers import TeacherAnswer, TeacherStats
from seed_core.records import Skill, Step, Trajectory

GOOD = '{"episode_summary": "found it", "episode_skill": "Check the shelves before the toilet."}'


def _ok(text: str, **kw) -> tuple[str, str]:
    r = parse_skill(text, **kw)
    assert r.ok, r.error
    return r.summary, r.skill


def _error(text: str) -> str:
    r = parse_skill(text)
    assert not r.ok and r.summary == "" and r.skill == ""
    return r.error


# ---------------------------------------------------------------- parser: accepted forms


def test_fenced_json_block():
    text = f"Here is my analysis.\n```json\n{GOOD}\n```\nHope this helps."
    assert _ok(text) == ("found it", "Check the shelves before the toilet.")


def test_raw_json_inside_prose():
    assert _ok(f"The agent looped. So: {GOOD} That is all.") == ("found it", "Check the shelves before the toilet.")


def test_trailing_commas_in_object_and_nested():
    text = '{"episode_summary": "s", "extra": {"steps": [1, 2, ], "k": "v",}, "episode_skill": "Do X.",\n}'
    assert _ok(text) == ("s", "Do X.")


def test_comma_inside_string_before_brace_is_kept():
    assert _ok('{"episode_skill": "open it, }", }')[1] == "open it, }"


def test_first_valid_object_wins():
    text = '{"episode_skill": "first"} and {"episode_skill": "second"}'
    assert _ok(text)[1] == "first"


def test_earlier_invalid_and_keyless_objects_are_skipped():
    text = 'state {x: 1} then {"note": "not it"} then {"episode_summary": "s", "episode_skill": "real one"}'
    assert _ok(text) == ("s", "real one")


def test_object_nested_in_a_wrapper_is_found():
    assert _ok('{"result": {"episode_skill": "inner"}, "oops": }')[1] == "inner"


def test_nested_braces_and_braces_inside_strings():
    text = (
        '{"episode_summary": "used {curly} and \\"quoted {\\" text", "meta": {"a": {"b": []}},'
        ' "episode_skill": "If the goal is {x}, look in }}} first."}'
    )
    assert _ok(text) == ('used {curly} and "quoted {" text', "If the goal is {x}, look in }}} first.")


def test_unicode_and_raw_newlines():
    assert _ok('{"episode_summary": "café", "episode_skill": "先检查柜台，\nthen the café table ☕"}') == (
        "café",
        "先检查柜台，\nthen the café table ☕",
    )


def test_summary_is_optional_and_whitespace_is_stripped():
    assert _ok('{"episode_skill": "  Do X.  "}') == ("", "Do X.")
    assert _ok('{"episode_summary": null, "episode_skill": "Do X."}') == ("", "Do X.")


@pytest.mark.fault("model_output")
def test_huge_answer_is_truncated_and_flagged():
    r = parse_skill(json.dumps({"episode_summary": "s", "episode_skill": "word " * 10_000}), max_skill_chars=100)
    assert r.ok and r.truncated and len(r.skill) <= 100 and r.skill.startswith("word word")
    assert not parse_skill(GOOD, max_skill_chars=100).truncated


# ---------------------------------------------------------------- parser: rejected forms, with their error


@pytest.mark.fault("model_output")
def test_missing_skill_field():
    assert "no JSON object has an \"episode_skill\" field (found fields ['episode_summary'])" in _error(
        '{"episode_summary": "only a summary"}'
    )


@pytest.mark.fault("model_output")
@pytest.mark.parametrize(
    "value, message",
    [
        ('""', '"episode_skill" is empty'),
        ('"   "', '"episode_skill" is empty'),
        ("null", "must be a string, got NoneType"),
        ('["a"]', "must be a string, got list"),
        ("3", "must be a string, got int"),
        (json.dumps(SKILL_PLACEHOLDER), "repeats the placeholder"),
    ],
)
def test_bad_skill_values(value, message):
    assert message in _error('{"episode_summary": "s", "episode_skill": %s}' % value)


@pytest.mark.fault("model_output", n=4)  # prose, empty, cut off, unquoted keys
def test_garbage():
    assert _error("I think the agent should have looked harder.") == "the answer contains no JSON object"
    assert _error("") == "the answer contains no JSON object"
    assert "never closed" in _error('{"episode_skill": "cut off by max_tokens')
    assert "invalid JSON at character 0" in _error("{episode_skill: unquoted}")


@pytest.mark.fault("model_output", n=2)
def test_degenerate_answers_are_fast_and_fail_cleanly():
    assert "never closed" in _error("{" * 50_000)
    assert "never closed" in _error('{"x": "' + "{" * 50_000)


# ---------------------------------------------------------------- serialization and prompt


def _step(i: int, reward: float) -> Step:
    return Step(
        observation=f"obs {i}",
        admissible_actions=["look"],
        prompt=f"prompt {i}",
        response=f"<think>t{i}</think><action>a{i}</action>",
        response_ids=[1, 2],
        response_logprobs=[-0.1, -0.2],
        action=f"a{i}",
        valid=True,
        reward=reward,
        feedback=f"fb {i}",
    )


def _traj(tid: str = "t0", won: bool = True, rewards=(-0.1, 0.0, 10.0)) -> Trajectory:
    return Trajectory(
        traj_id=tid,
        game_id="g0",
        split="train",
        task_type="pick_and_place_simple",
        task="put a candle in toilet.",
        group_id="grp",
        sample_idx=0,
        won=won,
        episode_return=sum(rewards),
        length=len(rewards),
        invalid_count=0,
        steps=[_step(i, r) for i, r in enumerate(rewards)],
    )


def test_step_returns_are_reward_to_go():
    assert step_returns([-0.1, 0.0, 10.0]) == pytest.approx([9.9, 10.0, 10.0])
    assert step_returns([]) == []


def test_serialize_trajectory_exact_text():
    assert serialize_trajectory(_traj()) == (
        "[Step 1]\nObservation: obs 0\nResponse: <think>t0</think><action>a0</action>\nStep return: 9.9\n\n"
        "[Step 2]\nObservation: obs 1\nResponse: <think>t1</think><action>a1</action>\nStep return: 10\n\n"
        "[Step 3]\nObservation: obs 2\nResponse: <think>t2</think><action>a2</action>\nStep return: 10\n\n"
        "[After step 3]\nObservation: fb 2"
    )
    assert "Step return: -0.2\n" in serialize_trajectory(_traj(won=False, rewards=(-0.1, -0.1, 0.0)))


def test_analyzer_prompt_content_and_hash():
    p = analyzer_prompt(_traj(won=False, rewards=(0.0,)))
    assert "Task: put a candle in toilet.\nOutcome: failure\n" in p and "[Step 1]\nObservation: obs 0" in p
    assert SKILL_PLACEHOLDER in ANALYZER_PROMPT and '{"episode_summary": "<a concise summary' in p
    assert prompt_hash(p) == prompt_hash(analyzer_prompt(_traj(won=False, rewards=(0.0,))))
    assert len(prompt_hash(p)) == 16 and prompt_hash(p) != prompt_hash(analyzer_prompt(_traj(rewards=(0.0,))))


# ---------------------------------------------------------------- analyze


class ScriptedTeacher:
    """Answers each prompt by the id of the trajectory it shows: a list of answers, one per ask."""

    name = "scripted"

    def __init__(self, script: dict[str, list[str | None]]):
        self.script = script
        self.stats = TeacherStats()
        self.batches: list[list[str]] = []

    def complete_batch(self, prompts):
        self.batches.append(list(prompts))
        out = []
        for p in prompts:
            key = next(k for k in self.script if f"Task: {k}\n" in p)
            text = self.script[key].pop(0)
            out.append(None if text is None else TeacherAnswer(text, 10, 3, cached=key == "cached"))
        return out


def _task_traj(task: str, won: bool = True) -> Trajectory:
    t = _traj(tid=f"id-{task}", won=won)
    t.task = task
    return t


def test_analyze_statuses_reask_and_counts():
    teacher = ScriptedTeacher(
        {
            "good": [GOOD],
            "reasked": [
                "The agent should check shelves first.",
                '```json\n{"episode_skill": "Check shelves first."}\n```',
            ],
            "hopeless": ["prose", "still prose"],
            "silent": [None],
            "cached": [GOOD],
        }
    )
    trajs = [_task_traj(k, won=k != "hopeless") for k in ("good", "reasked", "hopeless", "silent", "cached")]
    skills, stats = analyze(trajs, teacher)

    assert [s.parse_status for s in skills] == ["ok", "ok_after_reask", "failed", "dropped", "ok"]
    assert [s.skill for s in skills] == [
        "Check the shelves before the toilet.",
        "Check shelves first.",
        "",
        "",
        "Check the shelves before the toilet.",
    ]
    assert [s.raw_output for s in skills][1:4] == [
        '```json\n{"episode_skill": "Check shelves first."}\n```',
        "still prose",
        "",
    ]
    assert [s.outcome for s in skills] == ["success", "success", "failure", "success", "success"]
    assert {s.producer for s in skills} == {"scripted"} and skills[0].traj_id == "id-good"
    assert skills[0].prompt_hash == prompt_hash(analyzer_prompt(trajs[0]))

    # one first batch of 5, one re-ask batch for the 2 unparseable answers (never for the dropped one)
    assert [len(b) for b in teacher.batches] == [5, 2]
    reask = teacher.batches[1][0]
    assert reask.startswith(analyzer_prompt(trajs[1]))
    assert "The agent should check shelves first." in reask and "the answer contains no JSON object" in reask
    assert (stats.ok, stats.ok_after_reask, stats.failed, stats.dropped) == (2, 1, 1, 1)
    assert (stats.trajectories, stats.calls, stats.cached) == (5, 7, 1)
    assert (stats.prompt_tokens, stats.completion_tokens) == (60, 18)  # 6 answers, the dropped one has none
    assert stats.parse_rate == pytest.approx(3 / 5)


def test_analyze_without_reask_and_reask_unanswered():
    skills, stats = analyze([_task_traj("a")], ScriptedTeacher({"a": ["prose"]}), reask=False)
    assert skills[0].parse_status == "failed" and skills[0].raw_output == "prose" and stats.calls == 1
    skills, stats = analyze([_task_traj("a")], ScriptedTeacher({"a": ["prose", None]}))
    assert skills[0].parse_status == "failed" and skills[0].raw_output == "prose" and stats.calls == 2


def test_analyze_counts_truncated_skills():
    huge = json.dumps({"episode_skill": "x" * 500})
    skills, stats = analyze([_task_traj("a")], ScriptedTeacher({"a": [huge]}), max_skill_chars=50)
    assert skills[0].skill == "x" * 50 and stats.truncated == 1


def test_shuffled_skills_give_every_trajectory_another_games_skill():
    trajs = [dataclasses.replace(_traj(f"t{g}{k}", won=k == 0), game_id=f"g{g}") for g in range(3) for k in range(2)]
    trajs.append(dataclasses.replace(_traj("t30"), game_id="g3"))  # a game with one trajectory
    skills = [
        Skill(t.traj_id, t.game_id, t.task_type, "success", f"sum {t.traj_id}", f"rule of {t.traj_id}", "ok", "",
              "policy:u0000", "h")
        for t in trajs
    ]  # fmt: skip
    skills[2] = None  # g1's first trajectory has no skill: whoever takes it gets none
    out = shuffled_skills(trajs, skills)
    # game i takes game i+1's k-th skill (cycling); the last game takes the first game's
    assert [s.skill if s else None for s in out] == [
        None, "rule of t11", "rule of t20", "rule of t21", "rule of t30", "rule of t30", "rule of t00",
    ]  # fmt: skip
    for t, s in zip(trajs, out):
        if s is not None:
            assert s.traj_id == t.traj_id and s.game_id == t.game_id and s.producer == "shuffled:policy:u0000"
            assert s.outcome == ("success" if t.won else "failure")
            assert not s.skill.startswith(f"rule of t{t.game_id[1]}")  # never its own room's
    with pytest.raises(ValueError, match="two games or more"):
        shuffled_skills(trajs[:2], skills[:2])
