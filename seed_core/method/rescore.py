"""Re-scoring (SEED step 4): the taken response tokens under the ordinary and the skill-augmented prompt.

For every step t of every trajectory, h_t is the ordinary step prompt and h~_t the same prompt with the
trajectory's skill inserted after the task line. The response tokens a_t are the sampled ones, identical in
both contexts. Teacher log-probs log pi_old(a_t | h~_t) are computed once, before the update, without grad.

Truncation: both contexts drop the same number of leading tokens (what the plain prompt needs to fit in
`max_prompt_tokens`), so the part of the plain prompt each one shows is the same and only the skill block
differs. With the embedded and paper settings prompts fit and nothing is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from seed_core.config import EnvConfig
from seed_core.envs import observation_image
from seed_core.method.prompts import SKILL_BLOCK, inject_skill
from seed_core.policy.hf import ChatEncoder, HFPolicy
from seed_core.records import Trajectory


@dataclass
class StepTokens:
    """One agent turn as the update sees it."""

    traj: int  # index of its trajectory in the batch
    step: int  # index within the trajectory
    prompt_ids: list[int]  # ordinary context h_t (chat template applied, truncated)
    teacher_ids: list[int] | None  # skill context h~_t, or None when the trajectory has no skill
    response_ids: list[int]  # a_t, identical in both contexts
    sampler_logp: list[float]  # the sampler's log-probs of a_t, as recorded while playing
    image: Any = None  # the observation's image (env.observation image/both), shown in both contexts

    @property
    def length(self) -> int:
        """Tokens of the ordinary context plus the response (what a training forward pass costs)."""
        return len(self.prompt_ids) + len(self.response_ids)


def step_tokens(
    encoder: ChatEncoder,
    trajs: Sequence[Trajectory],
    skills: Sequence[str | None],
    template: str = SKILL_BLOCK,
    env: EnvConfig | None = None,
) -> list[StepTokens]:
    """Token ids of every step's two contexts; `skills[i]` is trajectory i's skill text or None. With `env`, a step
    shows the image of its observation as it did when sampled (`env.observation`); the skill goes in as text."""
    out = []
    cap = encoder.max_prompt_tokens
    for i, (traj, skill) in enumerate(zip(trajs, skills)):
        for k, s in enumerate(traj.steps):
            if not s.response_ids:
                continue
            image = observation_image(env, s.observation) if env is not None else None
            plain = encoder.encode_prompt(s.prompt, image) if image is not None else encoder.encode_full(s.prompt)
            cut = max(0, len(plain) - cap)
            teacher = encoder.encode_full(inject_skill(s.prompt, skill, template), image)[cut:] if skill else None
            out.append(StepTokens(i, k, plain[cut:], teacher, list(s.response_ids), list(s.response_logprobs), image))
    return out


@torch.no_grad()
def score_steps(
    policy: HFPolicy, steps: Sequence[StepTokens], which: str, max_tokens: int
) -> list[torch.Tensor | None]:
    """Detached per-token log-probs of each step's response under `which` context ("prompt" or "teacher");
    None for steps without that context. In the teacher's context, the prompt prefix a trajectory's steps share runs
    once per trajectory."""
    idx = [i for i, s in enumerate(steps) if getattr(s, f"{which}_ids") is not None]
    scored = policy.score(
        [getattr(steps[i], f"{which}_ids") for i in idx],
        [steps[i].response_ids for i in idx],
        max_tokens,
        images=[steps[i].image for i in idx],
        pad=(steps[0].prompt_ids, steps[0].response_ids, steps[0].image) if steps else None,
        # The teacher's context runs the instructions, task and skill a trajectory's steps share once. pi_old's and the
        # reference's run as the training forward does: their log-probs are compared with its own (a ratio of exactly
        # 1, a KL of 0 at the start), and float rounding there would turn into an Adam step of full size.
        groups=[steps[i].traj for i in idx] if which == "teacher" else None,
    )
    out: list[torch.Tensor | None] = [None] * len(steps)
    for i, lp in zip(idx, scored):
        out[i] = lp
    return out


def action_token_mask(tokenizer, response_ids: Sequence[int]) -> list[bool]:
    """Which response tokens spell the action: those overlapping the text between the first `<action>` and the
    next `</action>` (tags excluded). Every token when the response has no such pair (an invalid answer is judged
    as a whole) or when the tokens decoded one by one do not add up to the decoded response (a character split
    across tokens)."""
    pieces = [tokenizer.decode([i]) for i in response_ids]
    text = "".join(pieces).lower()
    start = text.find("<action>")
    end = text.find("</action>", start + len("<action>")) if start >= 0 else -1
    if start < 0 or end < 0 or text != tokenizer.decode(list(response_ids)).lower():
        return [True] * len(pieces)
    start += len("<action>")
    mask, pos = [], 0
    for p in pieces:
        mask.append(pos < end and pos + len(p) > start)
        pos += len(p)
    return mask
