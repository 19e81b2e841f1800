"""The `train_analyzer` stage: SEED Stage 1's analyzer SFT, and the before/after analyzer check.

Fine-tunes the starting policy (models/warmup) on the build_sft_data set (analyzer prompt -> skill JSON,
loss on the answer tokens only, `seed_core.sft.train_sft`), and measures what matters for Stage 2: whether
the model, used as its own analyzer exactly as the RL stage uses it (greedy, stopping at the first "}",
no re-ask), writes skills that parse and say something true, on the held-out validation games'
trajectories, before SFT (the starting model) and after (the analyzer). Without Stage 1 a small model
rarely emits a parseable skill, which silently turns SEED's OPD signal off.

Skill quality (our choice; the paper reports none), both against the teacher's skill for the same
trajectory, over the held-out trajectories that have one:
- `skill_token_f1`: bag-of-words F1 of the analyzer's episode_skill against the teacher's (lower-cased
  alphanumeric tokens, as SQuAD's F1); an answer that does not parse scores 0;
- `target_location_hit`: over the trajectories whose teacher skill names a true starting receptacle of the
  task's target object (read from the game file, e.g. "cabinet 3"), the share whose analyzer skill names one
  of those same receptacles. Null when no teacher skill names one.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from seed_core.config import Params
from seed_core.envs import Environment, environment, observation_image
from seed_core.method.skills import PARSED, analyze, consistency_metrics
from seed_core.method.teachers import checkpoint_teacher
from seed_core.models import resolve_device
from seed_core.records import DataError, Skill, Trajectory, read_jsonl, write_jsonl, write_metrics
from seed_core.sft import load_examples, train_sft

_TOKEN = re.compile(r"[a-z0-9]+")


def token_f1(pred: str, ref: str) -> float:
    """Bag-of-words F1 between two texts (lower-cased alphanumeric tokens); 0 when either is empty."""
    p, r = Counter(_TOKEN.findall(pred.lower())), Counter(_TOKEN.findall(ref.lower()))
    common = sum((p & r).values())
    if not common:
        return 0.0
    precision, recall = common / sum(p.values()), common / sum(r.values())
    return 2 * precision * recall / (precision + recall)


def names_in(text: str, names: Sequence[str]) -> set[str]:
    """The instance names ("cabinet 3") that occur in `text` as whole names ("cabinet 31" is not "cabinet 3")."""
    low = text.lower()
    return {n for n in names if re.search(rf"(?<![a-z0-9]){re.escape(n)}(?![0-9])", low)}


def skill_quality(
    trajs: Sequence[Trajectory], skills: Sequence[Skill], reference: dict[str, Skill], env: Environment
) -> dict[str, float | int | None]:
    """Parse rate, token F1 and target-location hit of `skills` (one per trajectory) against `reference`, and where
    the environment can check a skill's claims (Sokoban) whether they are true (`consistent`, `outcome_true`,
    `move_lists_true`, `facts_true`: `consistency_metrics`)."""
    parsed = [s.parse_status in PARSED for s in skills]
    f1s, hits = [], []
    for t, s, ok in zip(trajs, skills, parsed):
        ref = reference.get(t.traj_id)
        if ref is None:
            continue
        f1s.append(token_f1(s.skill, ref.skill) if ok else 0.0)
        named = names_in(ref.skill, env.key_names(t))
        if named:
            hits.append(ok and bool(names_in(s.skill, sorted(named))))
    return {
        "parse_rate": sum(parsed) / len(parsed) if parsed else 0.0,
        "skill_token_f1": statistics.fmean(f1s) if f1s else None,
        "target_location_hit": sum(hits) / len(hits) if hits else None,
        "skill_chars_mean": statistics.fmean(len(s.skill) for s, ok in zip(skills, parsed) if ok)
        if any(parsed)
        else 0.0,
        "location_eligible": len(hits),
    } | {k.replace("skills/", ""): v for k, v in consistency_metrics(env, trajs, skills).items()}


def measure_analyzer(
    model_path: Path,
    trajs: Sequence[Trajectory],
    reference: dict[str, Skill],
    env: Environment,
    params: Params,
    tag: str,
) -> tuple[dict, list[Skill]]:
    """`model_path` as its own analyzer on `trajs`: metrics under `analyzer/<tag>/`, and its Skill records."""
    t0 = time.perf_counter()
    cfg = params.train_analyzer
    teacher = checkpoint_teacher(
        model_path,
        max_new_tokens=cfg.analyzer_max_new_tokens,
        model=params.model,
        batch_size=params.rollout.batch_size,
    )
    tqdm.write(f"analyzer check ({tag}): {teacher.name} on {len(trajs)} held-out trajectories")
    skills, stats = analyze(trajs, teacher, reask=False, max_skill_chars=params.build_sft_data.max_skill_chars)
    q = skill_quality(trajs, skills, reference, env)
    metrics = {f"analyzer/{tag}/{k}": v for k, v in q.items() if k != "location_eligible"}
    metrics |= {
        f"analyzer/{tag}/producer": teacher.name,
        f"analyzer/{tag}/failed": stats.failed,
        f"analyzer/{tag}/completion_tokens_mean": stats.completion_tokens / max(1, len(trajs)),
        f"time/analyzer_{tag}_s": round(time.perf_counter() - t0, 1),
    }
    return metrics, skills


def heldout_set(sft_dir: Path) -> tuple[list[Trajectory], dict[str, Skill]]:
    """The validation games' trajectories and the teacher's parsed skills for them, by trajectory id."""
    path = Path(sft_dir) / "validation_trajectories.jsonl"
    if not path.exists():
        raise DataError(f"{path} does not exist; run the build_sft_data stage (`dvc repro build_sft_data`)")
    trajs = list(read_jsonl(path, Trajectory))
    ids = {t.traj_id for t in trajs}
    reference = {
        s.traj_id: s
        for s in read_jsonl(Path(sft_dir) / "skills.jsonl", Skill)
        if s.traj_id in ids and s.parse_status in PARSED
    }
    return trajs, reference


def rehearsal_examples(params: Params, manifest: Path, env: Environment) -> list[dict]:
    """Expert (step prompt -> action) examples of the first `train_analyzer.rehearsal_games` warm-up games, with
    their images when the agent sees images."""
    n = params.train_analyzer.rehearsal_games
    if not n:
        return []
    examples = env.expert_examples(env.read_manifest(manifest)[:n], params.env, progress=False)
    if params.env.observation == "text":
        return [{"prompt": x["prompt"], "completion": x["completion"]} for x in examples]
    return [
        {"prompt": x["prompt"], "completion": x["completion"], "image": observation_image(params.env, x["observation"])}
        for x in examples
    ]


def run_train_analyzer(
    params: Params,
    sft_dir: Path,
    start_model: Path,
    out_dir: Path,
    metrics_path: Path,
    heldout_path: Path,
    rehearsal_manifest: Path = Path("data/manifests/warmup.json"),
) -> dict:
    """The train_analyzer stage. Writes the analyzer to `out_dir`, metrics to `metrics_path`, and the held-out
    skills of the teacher, the starting model and the analyzer side by side to `heldout_path` (JSONL)."""

    cfg, t0 = params.train_analyzer, time.perf_counter()
    examples = load_examples(sft_dir)
    if not examples["train"]:
        raise DataError(
            f"the SFT set in {sft_dir} has no training examples (no teacher answer parsed): see "
            "metrics/sft_data.json, and check the teacher section of params.yaml"
        )
    trajs, reference = heldout_set(sft_dir)
    env = environment(params)
    before, before_skills = measure_analyzer(start_model, trajs, reference, env, params, "before")
    rehearsal = rehearsal_examples(params, rehearsal_manifest, env)
    sft = train_sft(
        Path(start_model),
        [{"prompt": r["prompt"], "completion": r["completion"]} for r in examples["train"]] + rehearsal,
        [{"prompt": r["prompt"], "completion": r["completion"]} for r in examples["validation"]] or None,
        Path(out_dir),
        cfg,
        device=resolve_device(params.model.device),
        dtype=params.model.dtype,
        log=lambda m: tqdm.write(str(m)),
    )
    after, after_skills = measure_analyzer(out_dir, trajs, reference, env, params, "after")

    write_jsonl(
        heldout_path,
        [
            {
                "traj_id": t.traj_id,
                "game_id": t.game_id,
                "task_type": t.task_type,
                "outcome": b.outcome,
                "target_locations": env.key_names(t),
                "teacher_skill": reference[t.traj_id].skill if t.traj_id in reference else None,
                "before_status": b.parse_status,
                "before_skill": b.skill,
                "before_raw": b.raw_output,
                "after_status": a.parse_status,
                "after_skill": a.skill,
                "after_raw": a.raw_output,
            }
            for t, b, a in zip(trajs, before_skills, after_skills)
        ],
    )
    metrics = {
        "analyzer/heldout_trajectories": len(trajs),
        "analyzer/heldout_with_teacher_skill": len(reference),
        "analyzer/location_eligible": skill_quality(trajs, before_skills, reference, env)["location_eligible"],
        "analyzer/rehearsal_examples": len(rehearsal),
        **before,
        **after,
        **{f"sft/{k}": v for k, v in sft.items()},
        "time/total_s": round(time.perf_counter() - t0, 1),
    }
    write_metrics(metrics_path, metrics)
    return metrics
