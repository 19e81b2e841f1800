"""The `build_sft_data` stage: SEED Stage 1's analyzer SFT set (analyzer prompt -> skill JSON).

Rolls out the starting policy (models/warmup: the warmed-up model, or the base model passed through when the
warm-up is off) on M training games x K samples with the plain step prompt, has the teacher write one
hindsight skill per finished trajectory (`seed_core.method.skills.analyze`), keeps only the answers that parse, and
writes them as an HF `datasets` DatasetDict with a train / validation split by GAME, so no validation
trajectory shares a game with a training one.

Choices where the paper is silent:
- the M games are the train manifest's first games taken round-robin over task types (the manifest is
  sorted by game id, hence by task type: a plain prefix of a small M would cover one or two types);
- the validation games are a seeded random `validation_fraction` of the M games (at least one, and at
  least one left for training);
- the training target is the canonical answer `json.dumps({"episode_summary", "episode_skill"})` (UTF-8,
  not \\u-escaped) of the parsed skill, not the teacher's raw text: what the analyzer learns is exactly the
  format the parser reads, without a teacher's prose, fences or trailing commas;
- the rollout plays at most ROLLOUT_CHUNK_GAMES games per environment pool (a pool keeps every game it
  loaded); chunk c samples with seed `seed * 1009 + c`.

Output folder (written to a temp folder and renamed into place, so it is whole or absent):
  dataset/                       DatasetDict.save_to_disk: train, validation; columns COLUMNS
  preview.jsonl                  one readable line per example (split, ids, outcome, task, summary, skill)
  skills.jsonl                   every Skill record, parsed or not, with the teacher's raw answer
  validation_trajectories.jsonl  the raw trajectories of the validation games (train_analyzer's check)
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from tqdm import tqdm

from seed_core.config import ConfigError, ModelConfig, Params, TeacherConfig
from seed_core.envs import Environment, GameEntry, environment
from seed_core.method.skills import PARSE_STATUSES, PARSED, AnalysisStats, TrajectoryTeacher, analyze, analyzer_prompt
from seed_core.method.teachers import OpenAITeacher, Teacher, checkpoint_teacher
from seed_core.policy import open_sampler
from seed_core.records import Skill, Trajectory, publish_dir, write_jsonl, write_metrics
from seed_core.rollout import play
from seed_core.runtime import derive_seed, seed_everything
from seed_core.sft import SFT_SPLITS as SPLITS
from seed_core.sft import write_dataset

TEACHER_KINDS = ("oracle", "openai", "policy")
ROLLOUT_CHUNK_GAMES = 16
"""Games rolled out per environment pool (bounds the memory of loaded games)."""
LABEL_CHUNK = 16
"""Trajectories per teacher call: the unit of the labelling progress bar."""


# ---------------------------------------------------------------- games and split


def select_games(entries: Sequence[GameEntry], n: int) -> list[GameEntry]:
    """The first `n` games of the manifest taken round-robin over task types (in order of first appearance)."""
    if n > len(entries):
        raise ConfigError(
            f"params: `build_sft_data.games` is {n} but the train manifest has {len(entries)} games; "
            "lower it or raise prepare.train_games"
        )
    queues: dict[str, list[GameEntry]] = {}
    for e in entries:
        queues.setdefault(e.task_type, []).append(e)
    picked: list[GameEntry] = []
    while len(picked) < n:
        for q in queues.values():
            if q and len(picked) < n:
                picked.append(q.pop(0))
    return picked


def split_games(game_ids: Sequence[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, validation) game ids, both sorted: a seeded random `fraction` of the games (at least one, and
    at least one game left for training) is held out."""
    ids = sorted(set(game_ids))
    if len(ids) < 2:
        raise ConfigError("params: `build_sft_data.games` must be >= 2 to hold out validation games (got 1)")
    n_val = min(len(ids) - 1, max(1, round(fraction * len(ids))))
    val = set(random.Random(seed).sample(ids, n_val))
    return [g for g in ids if g not in val], [g for g in ids if g in val]


# ---------------------------------------------------------------- teachers


def make_teacher(
    cfg: TeacherConfig, env: Environment | None, *, model: ModelConfig, batch_size: int
) -> Teacher | TrajectoryTeacher:
    """The teacher named by `teacher.kind` (`env` gives the oracle). `openai` checks its API key variable here,
    before any rollout."""
    if cfg.kind == "oracle":
        return env.oracle(cfg.oracle_max_chars, cfg.oracle_claims)
    if cfg.kind == "openai":
        return OpenAITeacher(
            cfg.base_url,
            cfg.model,
            cfg.api_key_env,
            cache_dir=cfg.cache_dir,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            concurrency=cfg.concurrency,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
        )
    if cfg.kind == "policy":
        return checkpoint_teacher(
            cfg.policy_path, max_new_tokens=cfg.max_new_tokens, model=model, batch_size=batch_size
        )
    raise ConfigError(f"params: `teacher.kind` must be one of {list(TEACHER_KINDS)}, got {cfg.kind!r}")


def check_teacher_key(cfg: TeacherConfig) -> None:
    """Raise MissingAPIKeyError when the `openai` teacher's key variable is unset (no model load, no I/O), so a
    flow can refuse before it starts anything."""
    if cfg.kind == "openai":
        make_teacher(cfg, None, model=ModelConfig(), batch_size=1)


def label(
    trajs: Sequence[Trajectory], teacher: Teacher | TrajectoryTeacher, max_skill_chars: int, progress: bool = True
) -> tuple[list[Skill], AnalysisStats]:
    """`analyze` in chunks of LABEL_CHUNK trajectories (a progress bar over a slow teacher), counts summed."""
    skills: list[Skill] = []
    total = AnalysisStats()
    bar = tqdm(total=len(trajs), desc=f"label ({teacher.name})", unit="traj", disable=not progress)
    for s in range(0, len(trajs), LABEL_CHUNK):
        part, stats = analyze(trajs[s : s + LABEL_CHUNK], teacher, max_skill_chars=max_skill_chars)
        skills += part
        for f in fields(AnalysisStats):
            setattr(total, f.name, getattr(total, f.name) + getattr(stats, f.name))
        bar.update(len(part))
        bar.set_postfix(parsed=total.ok + total.ok_after_reask)
    bar.close()
    return skills, total


# ---------------------------------------------------------------- dataset


def canonical_answer(skill: Skill) -> str:
    """The training target: the parsed skill as the JSON object the analyzer must write."""
    return json.dumps({"episode_summary": skill.summary, "episode_skill": skill.skill}, ensure_ascii=False)


def example_rows(trajs: Sequence[Trajectory], skills: Sequence[Skill]) -> list[dict[str, str]]:
    """One row per trajectory whose skill parsed, in trajectory order."""
    return [
        {
            "prompt": analyzer_prompt(t),
            "completion": canonical_answer(s),
            "traj_id": t.traj_id,
            "game_id": t.game_id,
            "task_type": t.task_type,
            "outcome": s.outcome,
        }
        for t, s in zip(trajs, skills)
        if s.parse_status in PARSED
    ]


def preview_line(split: str, row: dict[str, str], traj: Trajectory, skill: Skill) -> dict:
    return {
        "split": split,
        "traj_id": row["traj_id"],
        "game_id": row["game_id"],
        "task_type": row["task_type"],
        "outcome": row["outcome"],
        "task": traj.task,
        "steps": traj.length,
        "parse_status": skill.parse_status,
        "episode_summary": skill.summary,
        "episode_skill": skill.skill,
    }


# ---------------------------------------------------------------- stage


def _length_stats(values: Sequence[int], prefix: str) -> dict[str, float]:
    if not values:
        return {f"{prefix}/min": 0, f"{prefix}/mean": 0.0, f"{prefix}/max": 0}
    return {
        f"{prefix}/min": min(values),
        f"{prefix}/mean": round(statistics.fmean(values), 1),
        f"{prefix}/max": max(values),
    }


def run_build_sft_data(
    params: Params, manifest_path: Path, model_dir: Path, out_dir: Path, metrics_path: Path, progress: bool = True
) -> dict:
    """The build_sft_data stage; returns the metrics also written to `metrics_path`."""
    cfg, t0 = params.build_sft_data, time.perf_counter()
    env = environment(params)
    games = select_games(env.read_manifest(Path(manifest_path)), cfg.games)
    train_ids, val_ids = split_games([g.game_id for g in games], cfg.validation_fraction, cfg.seed)
    # The teacher first: a missing API key or teacher checkpoint is refused before any rollout is spent.
    teacher = make_teacher(params.teacher, env, model=params.model, batch_size=params.rollout.batch_size)

    trajs: list[Trajectory] = []
    with open_sampler(model_dir, params, params.rollout, cfg.seed) as policy:
        for c, s in enumerate(range(0, len(games), ROLLOUT_CHUNK_GAMES)):
            seed = derive_seed(cfg.seed, c, stride=1009)
            seed_everything(seed)
            with env.open_pool(params.env.workers) as pool:
                trajs += play(
                    policy,
                    pool,
                    games[s : s + ROLLOUT_CHUNK_GAMES],
                    group_size=cfg.samples,
                    env=params.env,
                    gen=params.rollout,
                    seed=seed,
                    tag=f"sft/c{c}",
                    progress=progress,
                )
    del policy  # its memory is not needed while labelling
    t_rollout = time.perf_counter()

    skills, stats = label(trajs, teacher, cfg.max_skill_chars, progress)
    t_label = time.perf_counter()

    split_of = {g: "train" for g in train_ids} | {g: "validation" for g in val_ids}
    rows: dict[str, list[dict[str, str]]] = {k: [] for k in SPLITS}
    preview = []
    by_traj = {t.traj_id: (t, s) for t, s in zip(trajs, skills)}
    for row in example_rows(trajs, skills):
        split = split_of[row["game_id"]]
        rows[split].append(row)
        preview.append(preview_line(split, row, *by_traj[row["traj_id"]]))
    preview.sort(key=lambda p: SPLITS.index(p["split"]))

    def write(tmp: Path) -> None:
        write_dataset(rows, tmp / "dataset")
        write_jsonl(tmp / "preview.jsonl", preview)
        write_jsonl(tmp / "skills.jsonl", skills)
        write_jsonl(tmp / "validation_trajectories.jsonl", [t for t in trajs if split_of[t.game_id] == "validation"])

    publish_dir(out_dir, write)

    ts = teacher.stats
    kept = [r for k in SPLITS for r in rows[k]]
    metrics = {
        "sft_data/games": len(games),
        "sft_data/samples_per_game": cfg.samples,
        "sft_data/trajectories": len(trajs),
        "sft_data/success_rate": sum(t.won for t in trajs) / len(trajs),
        "sft_data/invalid_rate": sum(t.invalid_count for t in trajs) / max(1, sum(t.length for t in trajs)),
        "sft_data/parse_rate": stats.parse_rate,
        **{f"sft_data/parse_status/{k}": getattr(stats, k) for k in PARSE_STATUSES},
        "sft_data/truncated": stats.truncated,
        "sft_data/examples": len(kept),
        **{f"sft_data/examples/{k}": len(rows[k]) for k in SPLITS},
        "sft_data/games/train": len(train_ids),
        "sft_data/games/validation": len(val_ids),
        "sft_data/validation_trajectories": sum(split_of[t.game_id] == "validation" for t in trajs),
        **_length_stats([len(json.loads(r["completion"])["episode_skill"]) for r in kept], "sft_data/skill_chars"),
        **_length_stats([len(r["completion"]) for r in kept], "sft_data/completion_chars"),
        **_length_stats([len(r["prompt"]) for r in kept], "sft_data/prompt_chars"),
        "teacher/kind": params.teacher.kind,
        "teacher/name": teacher.name,
        # The cost of the data (every answer used, cached or not) ...
        "teacher/calls": stats.calls,
        "teacher/prompt_tokens": stats.prompt_tokens,
        "teacher/completion_tokens": stats.completion_tokens,
        "teacher/cache_hits": ts.cache_hits,
        # ... and what this run actually sent and was billed (zero on a fully cached re-run).
        "teacher/requests": ts.requests,
        "teacher/retries": ts.retries,
        "teacher/failures": ts.failures,
        "teacher/billed_prompt_tokens": ts.prompt_tokens,
        "teacher/billed_completion_tokens": ts.completion_tokens,
        **{f"teacher/errors/{k}": v for k, v in sorted(ts.errors.items())},
        "time/rollout_s": round(t_rollout - t0, 1),
        "time/label_s": round(t_label - t_rollout, 1),
        "time/total_s": round(time.perf_counter() - t0, 1),
    }
    write_metrics(metrics_path, metrics)
    return metrics


def preview_records(sft_dir: str | Path) -> list[dict]:
    """The preview lines of a built SFT folder (for reports)."""
    with open(Path(sft_dir) / "preview.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
