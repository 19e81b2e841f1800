"""Evaluation: plain prompts (no skills), seen and unseen games, greedy and sampled decoding.

Success is reported per task type, as the macro average over task types (the paper's "Avg") and as the
micro average over games (what the baselines the paper copied used); both are always labelled. Sampled
mode averages over several seeds, as reproducers found single-seed sampled evaluation too noisy.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

from seed_core.config import Params, SamplingConfig
from seed_core.envs.alfworld.data import TASK_SHORT, TASK_TYPES, GameEntry, data_root, read_manifest
from seed_core.envs.alfworld.env import EnvPool
from seed_core.models import load_model, pick_dtype
from seed_core.policy.hf import HFPolicy
from seed_core.records import atomic_write_text, write_json, write_jsonl
from seed_core.rollout import play, summarize
from seed_core.runtime import seed_everything

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
    policy: HFPolicy, pool: EnvPool, games: dict[str, list[GameEntry]], params: Params, name: str, traj_dir: Path | None
) -> dict[str, dict[str, dict[str, float]]]:
    """{split: {mode: metrics}} for one model. Both splits play in the same lock-step batches (one rollout per
    mode and seed): a batch of 12 episodes costs little more than one of 6 on a CPU."""
    cfg = params.evaluate
    entries = [e for split in games.values() for e in split]
    runs: dict[str, dict[str, list[dict[str, float]]]] = {split: {} for split in games}
    for mode in cfg.modes:
        temps_seeds = (
            [(0.0, cfg.seed)]
            if mode == "greedy"
            else [(cfg.temperature, cfg.seed + i) for i in range(cfg.sampled_runs)]
        )
        for temp, seed in temps_seeds:
            seed_everything(seed)
            gen = SamplingConfig(
                temperature=temp,
                top_p=cfg.generation.top_p if temp > 0 else 1.0,
                max_new_tokens=cfg.generation.max_new_tokens,
                max_prompt_tokens=cfg.generation.max_prompt_tokens,
                batch_size=cfg.generation.batch_size,
            )
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
                if traj_dir is not None:
                    write_jsonl(traj_dir / name / split / f"{mode}-s{seed}.jsonl", part)
                runs[split].setdefault(mode, []).append(summarize(part))
    return {
        split: {mode: (r[0] | {"runs": 1}) if mode == "greedy" else average_runs(r) for mode, r in modes.items()}
        for split, modes in runs.items()
    }


def markdown_table(results: dict[str, dict[str, dict[str, dict[str, float]]]]) -> str:
    """One row per (model, split, mode): per-type success, macro and micro (labelled), invalid rate, length."""
    head = [
        "model",
        "split",
        "mode",
        *[TASK_SHORT[t] for t in TASK_TYPES],
        "macro avg",
        "micro avg",
        "invalid rate",
        "mean length",
        "runs",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, splits in results.items():
        for split, modes in splits.items():
            for mode, m in modes.items():
                cells = [model, split, mode]
                cells += [f"{100 * m[f'success/{t}']:.1f}" if f"success/{t}" in m else "–" for t in TASK_TYPES]
                cells += [
                    f"{100 * m['success/macro']:.1f}",
                    f"{100 * m['success/micro']:.1f}",
                    f"{100 * m['invalid_rate']:.1f}",
                    f"{m['episode_length']:.1f}",
                    str(int(m["runs"])),
                ]
                rows.append("| " + " | ".join(cells) + " |")
    return (
        "Success in %, no skills in the prompt. macro avg = mean over task types (the paper's Avg); "
        "micro avg = mean over games. Sampled rows average several seeds.\n\n" + "\n".join(rows) + "\n"
    )


def run_evaluate(
    params: Params,
    models: Iterable[tuple[str, Path]],
    manifest_dir: Path,
    metrics_path: Path,
    table_path: Path,
    traj_dir: Path | None,
) -> dict:
    root = data_root(params.data.alfworld_data)
    games = {s: read_manifest(manifest_dir / f"{s}.json", root) for s in SPLITS}
    dtype = pick_dtype(params.model.dtype)
    results = {}
    with EnvPool(root, params.env.workers) as pool:
        for name, path in models:
            model, tok = load_model(path, dtype=dtype)
            policy = HFPolicy(
                model,
                tok,
                batch_size=params.evaluate.generation.batch_size,
                max_prompt_tokens=params.evaluate.generation.max_prompt_tokens,
            )
            results[name] = evaluate_model(policy, pool, games, params, name, traj_dir)
            del model, policy
    write_json(metrics_path, results)
    atomic_write_text(table_path, markdown_table(results))
    return results
