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

import os
import random
import time
from pathlib import Path

from seed_core.config import Params
from seed_core.envs import environment
from seed_core.models import resolve_device
from seed_core.records import publish_dir, write_json

EVAL_GAMES = 2
"""Warm-up games whose steps are held out for the eval loss (not trained on); a WarmupConfig field candidate."""

# ---------------------------------------------------------------- stage


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


def run_warmup(params: Params, manifest_path: Path, base_model_dir: Path, out_dir: Path, metrics_path: Path) -> dict:
    """The warm-up stage: `out_dir` gets the warmed-up model (or the base model, linked, when disabled)."""
    cfg = params.warmup
    if not cfg.enabled:
        link_model(base_model_dir, out_dir)
        metrics = {"warmup/enabled": False}
        write_json(metrics_path, metrics)
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
        device=resolve_device(params.model.device),
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
