"""Every prompt template: the actors' step prompts, the analyzer prompt, and skill injection.

The ALFWorld step prompt follows the verl-agent ALFWorld protocol described in seed-method.md: the task, the
number of steps taken, the last `history_length` (observation, action) pairs, the current step and
observation, the admissible actions, then the `<think>`/`<action>` instruction. Step 0 has no history part.
The Sokoban step prompt follows verl-agent's Sokoban prompt: the symbols of the grid, the goal and the rules,
then the same history, current-observation, actions and instruction parts. The wording is ours; the content
and order are the protocols'. Both state the task on a line of its own (`TASK_LINE_PREFIX`), where SEED's
skill block goes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

from seed_core.policy.vision import IMAGE_MARK

TASK_LINE_PREFIX = "Your task is to: "

STEP_PROMPT_NO_HISTORY = """You are an expert agent operating in the ALFRED embodied environment.
Your task is to: {task}
Your current observation is: {observation}
Your admissible actions of the current situation are: [{actions}].

Now it's your turn to take an action.
You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags.
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags."""

STEP_PROMPT = """You are an expert agent operating in the ALFRED embodied environment.
Your task is to: {task}
Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_count} observations and the corresponding actions you took: {history}
You are now at step {current_step} and your current observation is: {observation}
Your admissible actions of the current situation are: [{actions}].

Now it's your turn to take an action.
You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags.
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags."""


SOKOBAN_TASK = "push every box (X) onto a target (O)."

SOKOBAN_SYMBOLS = "Symbols: # wall, _ floor, O target, X box, √ box on a target, P you, S you on a target."
SOKOBAN_IMAGE_LEGEND = (
    "The image shows the room, one square tile per cell: red-brown bricks are walls, plain beige tiles floor, a red "
    "ring a target, a brown crossed square a box (green when it is on a target), the blue disk you."
)
SOKOBAN_LEGENDS = {
    "text": SOKOBAN_SYMBOLS,
    "image": SOKOBAN_IMAGE_LEGEND,
    "both": f"{SOKOBAN_IMAGE_LEGEND}\n{SOKOBAN_SYMBOLS}",
}

SOKOBAN_PROMPT = """You are an expert agent playing Sokoban on a grid.
Your task is to: {task}
{legend}
Rules: moving into a box pushes it one cell if the cell behind it is free. You can only push, never pull, so a box pushed into a corner or against a wall without a target is stuck for good.
{history}Your current observation is:
{observation}
Your admissible actions are [{actions}].

Now it's your turn to take an action.
You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags.
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags."""


def sokoban_step_prompt(
    task: str,
    observation: str,
    admissible_actions: list[str],
    history: list[tuple[str, str]],
    history_length: int,
    view: str = "text",
) -> str:
    """The Sokoban user message for one step; `history` and `history_length` as in `step_prompt`.

    `view` is `env.observation`: `text` shows the grid, `image` an IMAGE_MARK where the room's image goes, `both`
    the mark and the grid. Past observations stay text-only and an image view shows past actions alone
    (verl-agent's visual prompt carries no image history)."""
    part = ""
    if history:
        first, shown = _recent(history, history_length)
        lines = "".join(
            f"\n[Action {first + i}: '{act}']"
            if view == "image"
            else f"\n[Observation {first + i}:\n{obs}\nAction {first + i}: '{act}']"
            for i, (obs, act) in enumerate(shown)
        )
        part = (
            f"Prior to this step, you have already taken {len(history)} step(s). Below are the most recent "
            f"{len(shown)} observations and the corresponding actions you took:{lines}\n"
            f"You are now at step {len(history) + 1}. "
        )
    shown_now = {"text": observation, "image": IMAGE_MARK, "both": f"{IMAGE_MARK}\n{observation}"}[view]
    return SOKOBAN_PROMPT.format(
        task=task,
        legend=SOKOBAN_LEGENDS[view],
        history=part,
        observation=shown_now,
        actions=format_actions(admissible_actions),
    )


SOKOBAN_PLAN_HINT = "The shortest plan from this state: {plan}. Take its first move now."
"""The strongest hint a skill block could hold: the solver's plan from the current state (`Sokoban.plan_hint`)."""

PERCEPTION_PROMPT = f"""{IMAGE_MARK}
{SOKOBAN_IMAGE_LEGEND}
Write the room as text, one row per line, cells separated by single spaces.
{SOKOBAN_SYMBOLS}"""
"""The perception warm-up's question: its answer is the room's grid text (`Room.text`)."""


def _recent(history: list[tuple[str, str]], history_length: int) -> tuple[int, list[tuple[str, str]]]:
    """The last `history_length` pairs of `history` and the 1-based step number of the first of them."""
    shown = history[-history_length:] if history_length > 0 else []
    return len(history) - len(shown) + 1, shown


def format_actions(actions: list[str]) -> str:
    return ", ".join(f"'{a}'" for a in actions)


def step_prompt(
    task: str,
    observation: str,
    admissible_actions: list[str],
    history: list[tuple[str, str]],
    history_length: int,
) -> str:
    """The user message for one step.

    `history` is every (observation, action) pair of the episode so far, oldest first; only the last
    `history_length` are shown, numbered by their step number (1-based) in the episode.
    """
    if not history:
        return STEP_PROMPT_NO_HISTORY.format(
            task=task, observation=observation, actions=format_actions(admissible_actions)
        )
    first, shown = _recent(history, history_length)
    lines = "".join(
        f"\n[Observation {first + i}: '{obs}', Action {first + i}: '{act}']" for i, (obs, act) in enumerate(shown)
    )
    return STEP_PROMPT.format(
        task=task,
        step_count=len(history),
        history_count=len(shown),
        history=lines,
        current_step=len(history) + 1,
        observation=observation,
        actions=format_actions(admissible_actions),
    )


def step_prompter(env) -> Callable[..., str]:
    """The step prompt of `env` (an EnvConfig): `(task, observation, actions, history, history_length) -> str`."""
    if env.name == "sokoban":
        return functools.partial(sokoban_step_prompt, view=env.observation)
    return step_prompt


"""The step prompt of each `env.name`."""
CLOSED_ACTIONS = {"alfworld": False, "sokoban": True}
"""Whether a well-formatted response must also name an admissible action to be valid: verl-agent counts an
unknown Sokoban move as invalid (and plays a no-op), while ALFWorld answers an inadmissible command itself."""


# ---------------------------------------------------------------- skill injection (SEED's teacher context)

SKILL_BLOCK = """**Episode-Level Skill**
Refer to this episode-level skill when deciding what action to take in the current episode:
[{skill}]"""


def inject_skill(prompt: str, skill: str, template: str = SKILL_BLOCK) -> str:
    """Insert the skill block on its own line right after the line stating the task.

    The skill is inserted as data: `str.replace`-free, no format-string evaluation of the skill text, so a
    skill containing braces or instructions cannot change the template.
    """
    lines = prompt.split("\n")
    for i, line in enumerate(lines):
        if line.startswith(TASK_LINE_PREFIX):
            head, sep, tail = template.partition("{skill}")
            if not sep:
                raise ValueError("skill template must contain the placeholder {skill}")
            block = head + skill + tail
            return "\n".join(lines[: i + 1] + [block] + lines[i + 1 :])
    raise ValueError(f"prompt has no line starting with {TASK_LINE_PREFIX!r}: cannot place the skill block")


# ---------------------------------------------------------------- response parsing

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def parse_response(response: str, choices: Sequence[str] | None = None) -> tuple[str, bool]:
    """(action, valid) from a model response.

    Lower-cased; the action is the text between the first `<action>` and the next `</action>`. Valid when
    both `<think>...</think>` and `<action>...</action>` are present and the response has no CJK characters,
    and, given a closed action set `choices` (Sokoban), when the action is one of them.
    An invalid response still yields something to send to the environment (the whole lower-cased text, or
    the tagged action when only the think tags are missing), which the environment answers with
    "Nothing happens."; the caller charges the invalid-step penalty.
    """
    text = response.lower()
    start = text.find("<action>")
    end = text.find("</action>", start + len("<action>")) if start >= 0 else -1
    if start >= 0 and end >= 0:
        action = text[start + len("<action>") : end].strip()
    else:
        action = text.strip()[-200:]
    think_start = text.find("<think>")
    has_think = think_start >= 0 and text.find("</think>", think_start) >= 0
    valid = start >= 0 and end >= 0 and has_think and not _CJK.search(response)
    return action, valid and (choices is None or action in choices)


# ---------------------------------------------------------------- analyzer (hindsight skill)

# The skill placeholder shown in ANALYZER_PROMPT's answer format. Echoing it instead of writing a skill is a
# common small-model failure, so the parser rejects it.
SKILL_PLACEHOLDER = "<one policy-facing rule>"

ANALYZER_PROMPT = """You are an expert analyst of agents acting in a text-based environment.
Below is one finished episode of an agent. Read it and write a hindsight skill: one instruction that will help a future agent facing a similar task.

Task: {task}
Outcome: {outcome}
Trajectory (for each step: the observation the agent saw, its full response, and the step's return, i.e. the sum of the rewards from that step to the end of the episode):
{trajectory}

Write the skill as an instruction addressed to a future agent, not as a retelling of this episode.
- If the outcome is success: state the decision rule and the order of actions that worked, as a reusable workflow.
- If the outcome is failure: state the core mistake and the warning signs that it is happening, as a rule that avoids it.
Write exactly one skill for the whole episode.

Answer with one JSON object with exactly these two fields and nothing else:
{{"episode_summary": "<a concise summary of the episode>", "episode_skill": "<one policy-facing rule>"}}"""

REASK_PROMPT = """{prompt}

Your previous answer was:
<<<
{answer}
>>>
It could not be used: {error}.
Answer again with only the JSON object {{"episode_summary": "...", "episode_skill": "..."}}, where episode_skill is a non-empty string, and nothing else."""
