"""ALFWorld's step prompt, after the verl-agent ALFWorld protocol described in seed-method.md: the task, the number
of steps taken, the last `history_length` (observation, action) pairs, the current step and observation, the
admissible actions, then the `<think>`/`<action>` instruction. Step 0 has no history part. The wording is ours;
the content and order are the protocol's."""

from __future__ import annotations

from seed_core.turns import ANSWER_INSTRUCTION, format_actions, recent

STEP_PROMPT_NO_HISTORY = (
    """You are an expert agent operating in the ALFRED embodied environment.
Your task is to: {task}
Your current observation is: {observation}
Your admissible actions of the current situation are: [{actions}].

"""
    + ANSWER_INSTRUCTION
)

STEP_PROMPT = (
    """You are an expert agent operating in the ALFRED embodied environment.
Your task is to: {task}
Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_count} observations and the corresponding actions you took: {history}
You are now at step {current_step} and your current observation is: {observation}
Your admissible actions of the current situation are: [{actions}].

"""
    + ANSWER_INSTRUCTION
)


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
    first, shown = recent(history, history_length)
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
