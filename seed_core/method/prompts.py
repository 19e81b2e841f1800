"""The method's prompts: the skill block and its injection (SEED's teacher context), and the analyzer prompt.

Each game writes its own step prompts (`envs/<game>/prompts.py`); every one states the task on a line of its own
(`turns.TASK_LINE_PREFIX`), where the skill block goes.
"""

from __future__ import annotations

from seed_core.turns import TASK_LINE_PREFIX

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
