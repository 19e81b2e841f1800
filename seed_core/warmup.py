"""Warm-up stage: behaviour cloning on expert walkthrough steps, for models too small to follow the format.

Not part of SEED. The paper starts from an instruct model that already answers in the `<think>`/`<action>`
format; SmolLM2-135M-Instruct (the embedded default) produced no admissible action at all zero-shot, which
leaves GRPO with no signal. The warm-up is a short SFT (`seed_core.sft.train_sft`, LoRA by default) on
expert steps of *training* games disjoint from the RL games: each game's stored walkthrough is replayed
through our environment and every step is rendered exactly as `rollout.play` renders it (same step prompt,
same history, same window, same step cap), with a short templated `<think>` and the expert action. It is
sized to make the policy valid most of the time while still losing most games, so RL has room to improve.
Paper recipes turn it off (`warmup.enabled: false`), and the stage then passes the base model through.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .config import EnvConfig, Params
from .data import GameEntry, data_root, game_path, read_manifest
from .envs.alfworld import EnvPool, EnvState
from .prompts import parse_response, step_prompt
from .records import write_json

EVAL_GAMES = 2
"""Warm-up games whose steps are held out for the eval loss (not trained on); a WarmupConfig field candidate."""
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


def completion(think: str, action: str) -> str:
    return f"<think>{think}</think>\n<action>{action}</action>"


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
                _Replay(e, _walkthrough(game_path(data_root, e.game_id)), s, s.task)
                for e, s in zip(chunk, pool.reset([e.game_id for e in chunk]))
            ]
            for t in range(env.max_steps):
                live = [i for i, g in enumerate(games) if not g.won and t < len(g.walk)]
                if not live:
                    break
                sent = {}
                for i in live:
                    g, s = games[i], games[i].state
                    prompt = step_prompt(g.task, s.observation, list(s.admissible_actions), g.history, env.history_length)
                    response = completion(g.think[t], g.walk[t])
                    action, valid = parse_response(response)
                    if not valid or action != g.walk[t]:
                        raise ValueError(f"{g.entry.game_id} step {t}: expert response {response!r} does not parse to its action")
                    g.steps.append({"prompt": prompt, "completion": response, "game_id": g.entry.game_id, "step": t})
                    g.history.append((s.observation, action))
                    sent[i] = action
                for i, new in pool.step(sent).items():
                    games[i].state, games[i].won = new, new.won
        examples.extend(x for g in games if g.won for x in g.steps)
        bar.update(len(chunk))
    bar.close()
    return examples


def _walkthrough(path: Path) -> list[str]:
    """The stored expert actions (as `AlfworldGame.walkthrough`, without starting the game), lower-cased
    because that is the form `parse_response` gives and `rollout.play` sends."""
    return [a.lower() for a in json.loads(path.read_text())["walkthrough"]]


# ---------------------------------------------------------------- stage


def link_model(src: Path, out_dir: Path) -> None:
    """`out_dir` becomes `src` by hard links (no copy), built in a temp folder and renamed into place."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for f in sorted(Path(src).rglob("*")):
            dst = tmp / f.relative_to(src)
            if f.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.link(f, dst)
        tmp.chmod(0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def split_eval(examples: list[dict], n_games: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, eval): the steps of `n_games` seeded-random games go to eval; none when too few games."""
    games = sorted({x["game_id"] for x in examples})
    if len(games) < 2 * n_games:
        return examples, []
    held = set(random.Random(seed).sample(games, n_games))
    return [x for x in examples if x["game_id"] not in held], [x for x in examples if x["game_id"] in held]


def run_warmup(params: Params, manifest_path: Path, base_model_dir: Path, out_dir: Path, metrics_path: Path) -> dict:
    """The warm-up stage: `out_dir` gets the warmed-up model (or the base model, linked, when disabled)."""
    cfg = params.warmup
    if not cfg.enabled:
        link_model(base_model_dir, out_dir)
        metrics = {"warmup/enabled": False}
        write_json(metrics_path, metrics)
        return metrics

    from .sft import train_sft  # torch/trl imports are heavy; the disabled path does not need them

    t0 = time.perf_counter()
    root = data_root(params.data.alfworld_data)
    entries = read_manifest(Path(manifest_path), root)
    examples = expert_examples(root, entries, params.env)
    kept = {x["game_id"] for x in examples}
    if not kept:
        raise ValueError(
            f"none of the {len(entries)} warm-up games' walkthroughs wins within env.max_steps={params.env.max_steps}; "
            "raise env.max_steps or prepare.warmup_games"
        )
    train, held = split_eval(examples, EVAL_GAMES, cfg.seed)
    replay_s = time.perf_counter() - t0
    sft = train_sft(
        Path(base_model_dir),
        [{"prompt": x["prompt"], "completion": x["completion"]} for x in train],
        [{"prompt": x["prompt"], "completion": x["completion"]} for x in held] or None,
        Path(out_dir),
        epochs=cfg.epochs,
        learning_rate=cfg.learning_rate,
        batch_size=cfg.batch_size,
        lora_r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        max_seq_len=cfg.max_seq_len,
        seed=cfg.seed,
    )
    metrics = {
        "warmup/enabled": True,
        "warmup/games": len(entries),
        "warmup/games_won_by_walkthrough": len(kept),
        "warmup/games_skipped": sorted({e.game_id for e in entries} - kept),
        "warmup/train_games": len({x["game_id"] for x in train}),
        "warmup/eval_games": len({x["game_id"] for x in held}),
        "warmup/train_steps": len(train),
        "warmup/eval_steps": len(held),
        "time/replay_s": round(replay_s, 1),
        **{f"sft/{k}": v for k, v in sft.items()},
    }
    write_json(metrics_path, metrics)
    return metrics
