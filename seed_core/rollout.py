"""Groups of multi-turn episodes played in lock-step batches, written as Trajectory records.

Every live episode of every group advances one step per round: one batched generation call for all their
prompts, then one parallel environment step. A group is `group_size` episodes of the same game with
different samples (a GRPO group). An episode ends when it is won or after `max_steps` steps.
`summarize` is the success summary of played trajectories that RL metrics and evaluation share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tqdm import tqdm

from seed_core.config import EnvConfig, SamplingConfig
from seed_core.envs import GameEntry, GamePool, game, task_columns
from seed_core.method.prompts import inject_skill
from seed_core.policy import Sampler
from seed_core.records import Step, Trajectory
from seed_core.runtime import derive_seed
from seed_core.turns import parse_response

STOP = ("</action>",)


@dataclass
class _Episode:
    game: GameEntry
    group_id: str
    sample_idx: int
    task: str = ""
    observation: str = ""
    actions: tuple[str, ...] = ()
    done: bool = False
    won: bool = False

    def __post_init__(self) -> None:
        self.steps: list[Step] = []
        self.history: list[tuple[str, str]] = []


def play(
    policy: Sampler,
    pool: GamePool,
    games: Sequence[GameEntry],
    *,
    group_size: int,
    env: EnvConfig,
    gen: SamplingConfig,
    seed: int,
    tag: str,
    progress: bool = True,
    skill: Callable[[GameEntry, str], str | None] | None = None,
) -> list[Trajectory]:
    """Play `group_size` episodes of each game; returns one Trajectory per episode, in (game, sample) order.

    `tag` names the batch (e.g. `eval/greedy/valid_seen` or `rl/u0003`) and prefixes group ids. `skill` (the teacher
    uplift probe; never RL or evaluation) gives a skill for (game, current observation), placed in the step prompt
    as SEED's teacher context places it; the steps record the prompts as played.
    """
    episodes = [_Episode(g, f"{tag}:{g.game_id}", k) for g in games for k in range(group_size)]
    for ep, s in zip(episodes, pool.reset([e.game.game_id for e in episodes])):
        ep.task, ep.observation, ep.actions = s.task, s.observation, tuple(s.admissible_actions)

    rules = game(env.name)  # its step prompt, action set and renderer
    bar = tqdm(total=env.max_steps, desc=f"rollout {tag}", unit="step", disable=not progress, leave=False)
    for t in range(env.max_steps):
        live = [i for i, ep in enumerate(episodes) if not ep.done]
        if not live:
            break
        prompts = [
            rules.step_prompt(env, ep.task, ep.observation, list(ep.actions), ep.history)
            for ep in (episodes[i] for i in live)
        ]
        if skill is not None:
            hints = [skill(episodes[i].game, episodes[i].observation) for i in live]
            prompts = [p if h is None else inject_skill(p, h) for p, h in zip(prompts, hints)]
        images = [rules.render(env, episodes[i].observation) for i in live]
        gens = policy.generate(
            prompts,
            **({} if images[0] is None else {"images": images}),  # a text-only sampler need not take images
            temperature=gen.temperature,
            top_p=gen.top_p,
            max_new_tokens=gen.max_new_tokens,
            stop=STOP,
            seed=derive_seed(seed, t, stride=10_007),
        )
        parsed = [
            parse_response(g.text, episodes[i].actions if rules.closed_actions else None) for i, g in zip(live, gens)
        ]
        # An invalid response to a closed action set is a no-op (the empty action); ALFWorld answers any text.
        results = pool.step(
            {i: action if valid or not rules.closed_actions else "" for i, (action, valid) in zip(live, parsed)}
        )
        for i, prompt, g, (action, valid) in zip(live, prompts, gens, parsed):
            ep, new = episodes[i], results[i]
            last = new.won or t == env.max_steps - 1
            reward = new.reward + (env.win_reward if new.won else 0.0) - (0.0 if valid else env.invalid_penalty)
            ep.steps.append(
                Step(
                    observation=ep.observation,
                    admissible_actions=list(ep.actions),
                    prompt=prompt,
                    response=g.text,
                    response_ids=list(g.token_ids),
                    response_logprobs=list(g.logprobs),
                    action=action,
                    valid=valid,
                    reward=reward,
                    feedback=new.observation,
                )
            )
            ep.history.append((ep.observation, action))
            ep.observation, ep.actions, ep.won, ep.done = new.observation, tuple(new.admissible_actions), new.won, last
        bar.update(1)
        bar.set_postfix(live=len(live), won=sum(ep.won for ep in episodes))
    bar.close()

    return [
        Trajectory(
            traj_id=f"{ep.group_id}#{ep.sample_idx}",
            game_id=ep.game.game_id,
            split=ep.game.split,
            task_type=ep.game.task_type,
            task=ep.task,
            group_id=ep.group_id,
            sample_idx=ep.sample_idx,
            won=ep.won,
            episode_return=sum(s.reward for s in ep.steps),
            length=len(ep.steps),
            invalid_count=sum(not s.valid for s in ep.steps),
            steps=ep.steps,
        )
        for ep in episodes
    ]


def summarize(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Success per task type present, macro and micro success, invalid-action rate, mean episode length."""
    if not trajs:
        raise ValueError("no trajectories to summarize")
    out: dict[str, float] = {}
    per_type = []
    known = list(task_columns())
    for t in known + sorted({tr.task_type for tr in trajs} - set(known)):
        won = [tr.won for tr in trajs if tr.task_type == t]
        if won:
            out[f"success/{t}"] = sum(won) / len(won)
            per_type.append(out[f"success/{t}"])
    out["success/macro"] = sum(per_type) / len(per_type)
    out["success/micro"] = sum(tr.won for tr in trajs) / len(trajs)
    steps = sum(tr.length for tr in trajs)
    out["invalid_rate"] = sum(tr.invalid_count for tr in trajs) / steps if steps else 0.0
    out["episode_length"] = steps / len(trajs)
    out["episodes"] = len(trajs)
    return out
