"""Sokoban's prompts: the step prompt after verl-agent's Sokoban prompt (the symbols of the grid, the goal and the
rules, then the same history, current-observation, actions and instruction parts as ALFWorld's), in the text, image
or both views; the solver's plan as a hint; the perception warm-up's question."""

from __future__ import annotations

from seed_core.policy.vision import IMAGE_MARK
from seed_core.turns import ANSWER_INSTRUCTION, format_actions, recent

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

SOKOBAN_PROMPT = (
    """You are an expert agent playing Sokoban on a grid.
Your task is to: {task}
{legend}
Rules: moving into a box pushes it one cell if the cell behind it is free. You can only push, never pull, so a box pushed into a corner or against a wall without a target is stuck for good.
{history}Your current observation is:
{observation}
Your admissible actions are [{actions}].

"""
    + ANSWER_INSTRUCTION
)


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
        first, shown = recent(history, history_length)
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
