"""The agent's turn, as every game and the method share it: a step prompt states the task on a line of its own
(`TASK_LINE_PREFIX`, where SEED's skill block goes), shows the last `history_length` (observation, action) pairs
and the admissible actions, and asks for `<think>...</think>` then `<action>...</action>` (`completion`), which
`parse_response` reads back."""

from __future__ import annotations

import re
from collections.abc import Sequence

TASK_LINE_PREFIX = "Your task is to: "
"""Every step prompt holds one line starting so, stating the task: `method.prompts.inject_skill` puts the skill
block after it."""


ANSWER_INSTRUCTION = """Now it's your turn to take an action.
You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags.
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags."""
"""The end of every step prompt: how to answer (verl-agent's wording)."""


def recent(history: list[tuple[str, str]], history_length: int) -> tuple[int, list[tuple[str, str]]]:
    """The last `history_length` pairs of `history` and the 1-based step number of the first of them."""
    shown = history[-history_length:] if history_length > 0 else []
    return len(history) - len(shown) + 1, shown


def format_actions(actions: list[str]) -> str:
    return ", ".join(f"'{a}'" for a in actions)


def completion(think: str, action: str) -> str:
    """A well-formed answer: the reasoning, then the action."""
    return f"<think>{think}</think>\n<action>{action}</action>"


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
