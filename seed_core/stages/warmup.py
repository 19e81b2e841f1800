"""Warm-up stage: behaviour cloning on expert walkthrough steps, for models too small to follow the format.

Not part of SEED. The paper starts from an instruct model that already answers in the `<think>`/`<action>`
format; SmolLM2-135M-Instruct (the embedded default) produced no admissible action at all zero-shot, which
leaves GRPO with no signal. The warm-up is a short SFT (`seed_core.sft.train_sft`, LoRA by default) on
expert steps of *training* games disjoint from the RL games: each game's stored walkthrough is replayed
through our environment and every step is rendered exactly as `rollout.play` renders it (same step prompt,
same history, same window, same step cap), with a short templated `<think>` and the expert action. It is
sized to make the policy valid most of the time while still losing most games, so RL has room to improve.
Paper recipes turn it off (`warmup.enabled: false`), and the stage then passes the base model through.

SEED's teacher is the policy reading a skill block, which a tiny model cloned on plain prompts ignores (even the
solver's plan from the current state barely moved its moves). With `warmup.skill_hints` (Sokoban) every expert step
is also trained with a true hint in that block: the solver's plan from the step's state, or the oracle's skill of
the expert's own episode. With `warmup.off_path_states` (Sokoban) each training room also gives states its expert
plan never visits (ends of random walks, still solvable), each with the solver's move from there: DAgger's state
coverage, with the solver as the expert. Both are further departures, for the CPU setting only.

A vision-language policy on image observations first learns to see (`warmup.perception_epochs`): an SFT from each
state's image to the room's grid text, on every state of the warm-up rooms' expert plans, written to
models/perception; the behaviour cloning then starts from it. Otherwise models/perception is the base model.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path

from seed_core.config import Params
from seed_core.envs import environment, observation_image
from seed_core.method.prompts import inject_skill
from seed_core.method.skills import parse_skill
from seed_core.models import load_for, resolve_device
from seed_core.policy import is_vision_dir
from seed_core.policy.vision import check_observation
from seed_core.records import publish_dir, write_metrics

EVAL_GAMES = 2
"""Warm-up games whose steps are held out for the eval loss (not trained on); a WarmupConfig field candidate."""

# ---------------------------------------------------------------- stage


def with_skill_hints(examples: list[dict], kinds: tuple[str, ...], env, params: Params) -> list[dict]:
    """`examples` followed by each expert step again with a true hint in the skill block, one copy per kind in
    `kinds` (`warmup.skill_hints`): `plan`, the solver's plan from the step's state; `episode`, the oracle's skill of
    the expert's own episode (won, every move optimal), written as the Stage-1 teacher writes skills."""
    if not kinds:
        return examples
    if env.name != "sokoban":
        raise ValueError(
            f"params: `warmup.skill_hints` is {list(kinds)}, but only Sokoban's solver can write true hints for every "
            f"step (env.name is {env.name!r}); set warmup.skill_hints: []"
        )
    episode: dict[str, str] = {}
    if "episode" in kinds:
        by_game: dict[str, list[dict]] = {}
        for x in examples:
            by_game.setdefault(x["game_id"], []).append(x)
        trajs = [env.expert_trajectory(game, steps) for game, steps in by_game.items()]
        answers = env.oracle(params.teacher.oracle_max_chars).complete_trajectories(trajs)
        episode = {t.game_id: parse_skill(a.text).skill for t, a in zip(trajs, answers)}
    out = list(examples)
    for kind in kinds:
        for x in examples:
            hint = env.plan_hint(x["observation"]) if kind == "plan" else episode[x["game_id"]]
            out.append({**x, "prompt": inject_skill(x["prompt"], hint), "hint": kind})
    return out


def with_off_path_states(examples: list[dict], entries, per_room: int, env, params: Params) -> list[dict]:
    """`examples` followed by `per_room` off-path states of each of their games (`Sokoban.off_path_examples`,
    seeded by warmup.seed), each with the solver's move from there (`warmup.off_path_states`)."""
    if not per_room:
        return examples
    if env.name != "sokoban":
        raise ValueError(
            f"params: `warmup.off_path_states` is {per_room}, but only Sokoban's solver can label states off the "
            f"expert's path (env.name is {env.name!r}); set warmup.off_path_states: 0"
        )
    games = {x["game_id"] for x in examples}
    mine = [e for e in entries if e.game_id in games]
    return examples + env.off_path_examples(mine, params.env, per_room, params.warmup.seed)


def link_model(src: Path, out_dir: Path) -> None:
    """`out_dir` becomes `src` by hard links (no copy), published atomically."""

    def write(tmp: Path) -> None:
        for f in sorted(Path(src).rglob("*")):
            dst = tmp / f.relative_to(src)
            if f.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.link(f, dst)

    publish_dir(out_dir, write)


def split_eval(examples: list[dict], n_games: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, eval): the steps of `n_games` seeded-random games go to eval; none when too few games."""
    games = sorted({x["game_id"] for x in examples})
    if len(games) < 2 * n_games:
        return examples, []
    held = set(random.Random(seed).sample(games, n_games))
    return [x for x in examples if x["game_id"] not in held], [x for x in examples if x["game_id"] in held]


def cell_accuracy(policy, examples: list[dict]) -> dict[str, float]:
    """Shares of grid cells a greedy answer to perception examples gets right (a missing cell is wrong): all cells,
    and the object cells (you, boxes, targets), which walls and floor (~90 % of a 6x6 room) cannot hide."""
    gens = policy.generate(
        [x["prompt"] for x in examples], images=[x["image"] for x in examples], temperature=0.0,
        max_new_tokens=max(len(x["completion"]) for x in examples) + 8,  # a token is a character or more
    )  # fmt: skip
    hits: dict[str, list[bool]] = {"cells": [], "objects": []}
    for x, g in zip(examples, gens):
        said = [row.split(" ") for row in g.text.strip().split("\n")]
        for r, row in enumerate(x["completion"].split("\n")):
            for c, cell in enumerate(row.split(" ")):
                hit = r < len(said) and c < len(said[r]) and said[r][c] == cell
                hits["cells"].append(hit)
                if cell not in "#_":
                    hits["objects"].append(hit)
    return {k: sum(v) / len(v) if v else float("nan") for k, v in hits.items()}


def perception(params: Params, entries, base_model_dir: Path, out_dir: Path) -> dict:
    """The perception SFT (image -> grid text) from `base_model_dir` into `out_dir`, with the held-out rooms' cell
    accuracy before and after."""
    from seed_core.policy.hf import HFPolicy
    from seed_core.sft import train_sft

    cfg, t0 = params.warmup, time.perf_counter()
    examples = [
        {**x, "image": observation_image(params.env, x["observation"])}
        for x in environment(params).perception_examples(entries, params.env)
    ]
    train, held = split_eval(examples, EVAL_GAMES, cfg.seed)

    def accuracy(model_dir: Path, when: str) -> dict[str, float]:
        if not held:
            return {}
        model, tok = load_for(model_dir, params.model)
        scores = cell_accuracy(HFPolicy(model, tok, batch_size=params.rollout.batch_size), held)
        return {f"perception/{k}_accuracy_{when}": v for k, v in scores.items()}

    before = accuracy(base_model_dir, "before")
    sft = train_sft(
        Path(base_model_dir),
        [{k: x[k] for k in ("prompt", "completion", "image")} for x in train],
        [{k: x[k] for k in ("prompt", "completion", "image")} for x in held] or None,
        Path(out_dir),
        dataclasses.replace(cfg, epochs=cfg.perception_epochs),
        device=resolve_device(params.model.device),
        dtype=params.model.dtype,
        train_vision=True,
    )
    return {
        "perception/train_examples": len(train),
        "perception/eval_examples": len(held),
        **before,
        **accuracy(out_dir, "after"),
        **{f"perception/sft/{k}": v for k, v in sft.items()},
        "time/perception_s": round(time.perf_counter() - t0, 1),
    }


def run_warmup(
    params: Params,
    manifest_path: Path,
    base_model_dir: Path,
    out_dir: Path,
    metrics_path: Path,
    perception_dir: Path | None = None,
) -> dict:
    """The warm-up stage: `out_dir` gets the warmed-up model (or the base model, linked, when disabled), and
    `perception_dir` the perception-trained one (or the base model, linked, when there is no perception SFT)."""
    cfg = params.warmup
    vision = is_vision_dir(base_model_dir)
    check_observation(params.env.observation, vision, base_model_dir)
    metrics: dict = {}
    start = Path(base_model_dir)
    if perception_dir is not None:
        if vision and params.env.observation != "text" and cfg.perception_epochs > 0:
            entries = environment(params).read_manifest(Path(manifest_path))
            metrics |= perception(params, entries, Path(base_model_dir), Path(perception_dir))
            start = Path(perception_dir)
        else:
            link_model(base_model_dir, perception_dir)
    if not cfg.enabled:
        link_model(start, out_dir)
        metrics |= {"warmup/enabled": False}
        write_metrics(metrics_path, metrics)
        return metrics

    from seed_core.sft import train_sft  # torch/trl imports are heavy; the disabled path does not need them

    t0 = time.perf_counter()
    env = environment(params)
    entries = env.read_manifest(Path(manifest_path))
    examples = env.expert_examples(entries, params.env)
    kept = {x["game_id"] for x in examples}
    if not kept:
        raise ValueError(
            f"none of the {len(entries)} warm-up games' expert plans wins within env.max_steps={params.env.max_steps}; "
            "raise env.max_steps or prepare.warmup_games"
        )
    train, held = split_eval(examples, EVAL_GAMES, cfg.seed)
    train = with_skill_hints(train, cfg.skill_hints, env, params)  # the held-out loss stays the plain prompts'
    train = with_off_path_states(train, entries, cfg.off_path_states, env, params)
    replay_s = time.perf_counter() - t0
    keys = ("prompt", "completion", "image") if params.env.observation != "text" else ("prompt", "completion")
    for x in examples:
        x["image"] = observation_image(params.env, x.get("observation", ""))
    sft = train_sft(
        start,
        [{k: x[k] for k in keys} for x in train],
        [{k: x[k] for k in keys} for x in held] or None,
        Path(out_dir),
        cfg,
        device=resolve_device(params.model.device),
        dtype=params.model.dtype,
        train_vision=params.vision.trainable,
    )
    metrics |= {
        "warmup/enabled": True,
        "warmup/games": len(entries),
        "warmup/games_won_by_walkthrough": len(kept),
        "warmup/games_skipped": sorted({e.game_id for e in entries} - kept),
        "warmup/train_games": len({x["game_id"] for x in train}),
        "warmup/eval_games": len({x["game_id"] for x in held}),
        "warmup/train_steps": sum("hint" not in x and "off_path" not in x for x in train),
        "warmup/train_off_path_steps": sum("off_path" in x for x in train),
        "warmup/train_hinted_steps": sum("hint" in x for x in train),
        "warmup/eval_steps": len(held),
        "time/replay_s": round(replay_s, 1),
        **{f"sft/{k}": v for k, v in sft.items()},
    }
    write_metrics(metrics_path, metrics)
    return metrics
