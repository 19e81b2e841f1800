"""Evaluation: plain prompts (no skills), seen and unseen games, greedy and sampled decoding.

Success is reported per task type, as the macro average over task types (the paper's "Avg") and as the
micro average over games (what the baselines the paper copied used); both are always labelled. Sampled
mode averages over several seeds, as reproducers found single-seed sampled evaluation too noisy.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path

from seed_core.config import Params
from seed_core.envs import GameEntry, GamePool, environment
from seed_core.policy import Sampler, open_sampler
from seed_core.records import publish_dir, write_json, write_jsonl
from seed_core.rollout import play, summarize
from seed_core.runtime import derive_seed, seed_everything

SPLITS = ("valid_seen", "valid_unseen")


def average_runs(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over seeds, plus the std over seeds of macro and micro success."""
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    out = {k: sum(r[k] for r in runs) / len(runs) for k in keys}
    for k in ("success/macro", "success/micro"):
        out[f"{k}_std"] = statistics.pstdev(r[k] for r in runs) if len(runs) > 1 else 0.0
    out["runs"] = len(runs)
    return out


def evaluate_model(
    policy: Sampler,
    pool: GamePool,
    games: dict[str, list[GameEntry]],
    params: Params,
    name: str,
    traj_dir: Path,
) -> dict[str, dict[str, dict[str, float]]]:
    """{split: {mode: metrics}} for one model; its trajectories to `traj_dir/<split>/<mode>-s<seed>.jsonl`. Both
    splits play in the same lock-step batches (one rollout per
    mode and seed): a batch of 12 episodes costs little more than one of 6 on a CPU."""
    cfg = params.evaluate
    entries = [e for split in games.values() for e in split]
    runs: dict[str, dict[str, list[dict[str, float]]]] = {split: {} for split in games}
    for mode in cfg.modes:
        temps_seeds = (
            [(0.0, cfg.seed)]
            if mode == "greedy"
            else [(cfg.generation.temperature, derive_seed(cfg.seed, i, stride=1)) for i in range(cfg.sampled_runs)]
        )
        for temp, seed in temps_seeds:
            seed_everything(seed)
            # Each pass starts on an empty prompt cache (vLLM's prefix cache): otherwise the sampled rows of a
            # trained model were not reproducible between two processes of the same run.
            policy.reset_cache()
            gen = dataclasses.replace(cfg.generation, temperature=temp, top_p=cfg.generation.top_p if temp > 0 else 1.0)
            trajs = play(
                policy,
                pool,
                entries,
                group_size=1,
                env=params.env,
                gen=gen,
                seed=seed,
                tag=f"eval/{name}/{mode}/s{seed}",
            )
            for split, split_entries in games.items():
                ids = {e.game_id for e in split_entries}
                part = [t for t in trajs if t.game_id in ids]
                write_jsonl(traj_dir / split / f"{mode}-s{seed}.jsonl", part)
                runs[split].setdefault(mode, []).append(summarize(part))
    return {
        split: {mode: (r[0] | {"runs": 1}) if mode == "greedy" else average_runs(r) for mode, r in modes.items()}
        for split, modes in runs.items()
    }


def run_evaluate(
    params: Params, name: str, model_dir: Path, manifest_dir: Path, metrics_path: Path, traj_dir: Path
) -> dict[str, dict[str, dict[str, float]]]:
    """Score one model: {split: {mode: metrics}} to `metrics_path`, its trajectories to `traj_dir/<name>/`.

    One DVC stage per model (`evaluate@<name>`), so a change to the RL stage re-scores models/rl only."""
    env = environment(params)
    games = {s: env.read_manifest(manifest_dir / f"{s}.json") for s in SPLITS}
    results = {}
    with (
        open_sampler(model_dir, params, params.evaluate.generation, params.evaluate.seed) as policy,
        env.open_pool(params.env.workers) as pool,
    ):
        publish_dir(traj_dir / name, lambda tmp: results.update(evaluate_model(policy, pool, games, params, name, tmp)))
    write_json(metrics_path, results)
    return results
