"""ALFWorld expert replay: each game's stored walkthrough played through our environment as step examples.

The warm-up stage trains on these (behaviour cloning), and train_analyzer's rehearsal mixes some into the
analyzer SFT set. Every step is rendered exactly as `rollout.play` renders it (same step prompt, same
history, same window, same step cap), with a short templated `<think>` and the expert action.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from seed_core.config import EnvConfig
from seed_core.envs import EnvState, GameEntry
from seed_core.envs.alfworld.data import game_path
from seed_core.envs.alfworld.env import EnvPool
from seed_core.envs.alfworld.prompts import step_prompt
from seed_core.turns import completion, parse_response

REPLAY_CHUNK = 32
"""Games replayed per environment pool; a pool keeps every game it loaded, so chunks bound the memory."""

_NUM = re.compile(r"\s+\d+$")
_PROCESS = ("clean", "heat", "cool")


def _base(name: str) -> str:
    """`apple 1` -> `apple`: the think text talks about kinds, the action names the instance."""
    return _NUM.sub("", name.strip())


def think_texts(walkthrough: list[str]) -> list[str]:
    """One short reasoning line per walkthrough step: the subgoal of the task that the next action serves.

    Derived from the walkthrough (what is picked up, processed with what, and where it goes), so it is the
    same expert knowledge as the action, phrased as a plan. One short sentence naming the task's object and
    the receptacle or appliance the action will name: the task is in the prompt already, and every think
    token is paid for at generation time in every rollout.
    """
    taken = [a.split(" from ")[0][len("take ") :] for a in walkthrough if a.startswith("take ")]
    obj = _base(taken[0]) if taken else "object"
    placed = [a.split(" to ", 1)[1] for a in walkthrough if a.startswith("move ")]
    lamps = [a[len("use ") :] for a in walkthrough if a.startswith("use ")]
    target = _base((placed or lamps or [""])[-1])  # where the object must end up (a lamp for look_at tasks)
    # The task sentence words it several ways ("heat some apple ...", "put a hot apple ..."): ask the walkthrough.
    verb = next((a.split()[0] for a in walkthrough if a.split()[0] in _PROCESS), None)

    holding, processed, n_placed = False, False, 0
    out = []
    for a in walkthrough:
        word, _, rest = a.partition(" ")
        if word == "go":
            dest = _base(rest[len("to ") :])
            if not holding:
                goal = f"find {'another' if n_placed else 'the'} {obj}"
            elif verb and not processed:
                goal = f"bring the {obj} to the {dest} to {verb} it"
            else:
                goal = f"bring the {obj} to the {target or dest}"
        elif word == "open":
            goal = f"look inside the {_base(rest)}"
        elif word == "take":
            goal, holding = f"pick up the {obj} I see here", True
        elif word in _PROCESS:
            goal, processed = f"{word} the {obj} with the {_base(rest.split(' with ')[-1])}", True
        elif word == "move":
            goal, holding, processed, n_placed = f"put the {obj} on the {target}", False, False, n_placed + 1
        elif word == "use":
            goal = f"look at the {obj} under the {_base(rest)}"
        else:
            goal = a
        out.append(f"I need to {goal}.")
    return out


@dataclass
class _Replay:
    entry: GameEntry
    walk: list[str]
    state: EnvState
    task: str = ""
    won: bool = False

    def __post_init__(self) -> None:
        self.think = think_texts(self.walk)
        self.history: list[tuple[str, str]] = []
        self.steps: list[dict] = []


def expert_examples(data_root: Path, entries: list[GameEntry], env: EnvConfig, progress: bool = True) -> list[dict]:
    """Expert (prompt, completion) steps of every game whose walkthrough wins within `env.max_steps`.

    Games are replayed in lock-step through an `EnvPool` (env.workers processes), and the history is kept
    exactly as `rollout.play` keeps it: (observation acted on, parsed action), shown through
    `prompts.step_prompt` with `env.history_length`. A game whose walkthrough is longer than the step cap or
    does not end in a win contributes nothing (find them as the entries missing from the result's game ids).
    Each example: {"prompt", "completion", "game_id", "step"}.
    """
    examples: list[dict] = []
    bar = tqdm(total=len(entries), desc="replay walkthroughs", unit="game", disable=not progress)
    for c in range(0, len(entries), REPLAY_CHUNK):
        chunk = entries[c : c + REPLAY_CHUNK]
        with EnvPool(data_root, env.workers) as pool:
            games = [
                _Replay(e, walkthrough_of(game_path(data_root, e.game_id)), s, s.task)
                for e, s in zip(chunk, pool.reset([e.game_id for e in chunk]))
            ]
            for t in range(env.max_steps):
                live = [i for i, g in enumerate(games) if not g.won and t < len(g.walk)]
                if not live:
                    break
                sent = {}
                for i in live:
                    g, s = games[i], games[i].state
                    prompt = step_prompt(
                        g.task, s.observation, list(s.admissible_actions), g.history, env.history_length
                    )
                    response = completion(g.think[t], g.walk[t])
                    action, valid = parse_response(response)
                    if not valid or action != g.walk[t]:
                        raise ValueError(
                            f"{g.entry.game_id} step {t}: expert response {response!r} does not parse to its action"
                        )
                    g.steps.append({"prompt": prompt, "completion": response, "game_id": g.entry.game_id, "step": t})
                    g.history.append((s.observation, action))
                    sent[i] = action
                for i, new in pool.step(sent).items():
                    games[i].state, games[i].won = new, new.won
        examples.extend(x for g in games if g.won for x in g.steps)
        bar.update(len(chunk))
    bar.close()
    return examples


def walkthrough_of(path: Path) -> list[str]:
    """The stored expert actions (as `AlfworldGame.walkthrough`, without starting the game), lower-cased
    because that is the form `parse_response` gives and `rollout.play` sends."""
    return [a.lower() for a in json.loads(path.read_text())["walkthrough"]]
