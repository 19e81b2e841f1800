"""`seed probe`: does SEED's signal carry credit, and does the skill-conditioned teacher know more than the student?

Measurements on one model and one set of Sokoban rooms, whose solver judges every step
(`envs/sokoban/room.step_labels`: optimal, wasted, fatal, lost):

0. **Chance.** Uniformly random moves, RANDOM_RUNS episodes per room: the success a start must beat.
1. **Credit.** Play `group_size` episodes of each room (a GRPO group), write a skill per episode from each skill
   source, re-score every step's response under the plain and the skill-augmented prompt, and ask with what AUC
   each method's per-step signal tells the optimal moves from the others (`method.credit`), pooled and within
   trajectories:
   - `grpo/advantage`, `gigpo/advantage`: the step advantages the update would train on;
   - `<source>/delta`, `<source>/delta_action`, `<source>/gate`: SEED's Δ = log π(a|s, skill) − log π(a|s), as the
     mean over the step's response tokens and over its action tokens, and the mean gate σ(β·Δ);
   with skill sources `self` (the model as its own analyzer: what SEED uses), `oracle` (the solver-backed
   teacher: SEED with a perfect analyzer, an upper bound), and their controls `shuffled` and `shuffled_oracle`
   (each trajectory gets another room's self or oracle skill: what skill-shaped text does without the content,
   which must come out near 0.5).
2. **Teacher uplift.** Play each room greedily with the plain prompt, then again with a skill in every step's
   prompt: the oracle's skill of that first episode, the model's own skill of it, the solver's shortest plan from
   the current state (the strongest hint a skill could give: an upper bound), and another room's oracle skill
   (control). Success with and without, and the paired difference per room.

3. **Legibility.** The greedy move on the start of each room and on MOVE_STATES states off its solver's path
   (`Sokoban.off_path_examples`), judged by the solver: the share of optimal moves, against chance (the share of the
   four moves that are optimal in the same states). A model that reads the grid beats chance here first; one that
   does not cannot be taught by hints or credit it cannot see.

Every figure has a 95 % percentile bootstrap interval over rooms. The table is printed and the whole result
written as JSON (`--out`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from seed_core.config import Params
from seed_core.envs import GameEntry, environment
from seed_core.envs.sokoban.room import ACTIONS, room_from_text, step_labels
from seed_core.method import credit, losses
from seed_core.method.rescore import action_token_mask, score_steps, step_tokens
from seed_core.method.skills import PARSED, analyze, consistency_metrics, shuffled_skills
from seed_core.method.update import DeltaStats, Trainer, step_advantages, step_delta_means
from seed_core.models import load_for
from seed_core.records import Skill, Trajectory, atomic_write_text, write_json
from seed_core.rollout import play
from seed_core.runtime import seed_everything
from seed_core.turns import parse_response

RANDOM_RUNS = 200
MOVE_STATES = 3
"""Legibility: states off the solver's path per room, besides the start."""
UPLIFT = ("plain", "oracle", "self", "plan", "shuffled")


def _text(s: Skill | None) -> str | None:
    return s.skill if s is not None and s.parse_status in PARSED else None


def _interval(values: Sequence[float], clusters: Sequence[int], n: int, seed: int) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean of `values` over resampled `clusters`."""
    ids = sorted(set(clusters))
    if not values or n == 0:
        return math.nan, math.nan
    by = {c: [v for v, k in zip(values, clusters) if k == c] for c in ids}
    g = torch.Generator().manual_seed(seed)
    means = []
    for _ in range(n):
        draw = [ids[int(i)] for i in torch.randint(len(ids), (len(ids),), generator=g)]
        pooled = [v for c in draw for v in by[c]]
        means.append(sum(pooled) / len(pooled))
    q = torch.tensor(means, dtype=torch.float64)
    return float(torch.quantile(q, 0.025)), float(torch.quantile(q, 0.975))


def self_skills(trainer: Trainer, trajs: list[Trajectory]) -> list[Skill]:
    return trainer.analyze(trajs, 0)[0]


def oracle_skills(env, params: Params, trajs: list[Trajectory]) -> list[Skill]:
    return analyze(
        trajs,
        env.oracle(params.teacher.oracle_max_chars, params.teacher.oracle_claims),
        max_skill_chars=params.rl.max_skill_chars,
    )[0]


def probe_credit(trainer: Trainer, env, pool, games: list[GameEntry], group_size: int, seed: int, n_boot: int) -> dict:
    """Part 1 on `games` x `group_size` episodes sampled at `rollout.temperature`."""
    params, cfg = trainer.params, trainer.cfg
    t0 = time.perf_counter()
    trajs = play(
        trainer.sampler, pool, games, group_size=group_size, env=params.env, gen=params.rollout,
        seed=seed, tag="probe",
    )  # fmt: skip
    labels = [env.step_labels(t) for t in trajs]
    times = {"rollout_s": time.perf_counter() - t0}

    t0 = time.perf_counter()
    skills = {"self": self_skills(trainer, trajs), "oracle": oracle_skills(env, params, trajs)}
    skills["shuffled"] = shuffled_skills(trajs, skills["self"])
    skills["shuffled_oracle"] = shuffled_skills(trajs, skills["oracle"])
    times["analysis_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    policy, mb = trainer.policy, cfg.micro_batch_tokens
    # the longest part of the probe (about 9 of every 10 minutes on 2 cores): one bar tick per scoring pass
    passes = tqdm(total=1 + len(skills), desc="credit re-scoring", unit="pass", leave=False)
    steps = step_tokens(policy.encoder, trajs, [None] * len(trajs), env=params.env)
    plain = score_steps(policy, steps, "prompt", mb)
    passes.update()
    actions = [action_token_mask(policy.tok, s.response_ids) for s in steps]
    optimal = torch.tensor([labels[s.traj][s.step] == "optimal" for s in steps])
    groups = torch.tensor([s.traj for s in steps])
    rooms = {g.game_id: i for i, g in enumerate(games)}
    clusters = torch.tensor([rooms[trajs[s.traj].game_id] for s in steps])
    signals = {
        f"{kind}/advantage": step_advantages(trajs, steps, dataclasses.replace(cfg, advantage=kind))
        for kind in ("grpo", "gigpo")
    }
    for source, chosen in skills.items():
        with_skill = step_tokens(policy.encoder, trajs, [_text(s) for s in chosen], env=params.env)
        teacher = score_steps(policy, with_skill, "teacher", mb)
        per_step = []
        for lp, tp, act in zip(plain, teacher, actions):
            if tp is None:  # no parsed skill: this source says nothing about the step
                per_step.append(dict.fromkeys(("delta_mean", "delta_action_mean", "gate_mean"), math.nan))
                continue
            delta = (tp - lp).float().cpu()
            gate = losses.opd_gate(delta, cfg.opd_beta, "sigmoid")
            per_step.append(step_delta_means(DeltaStats(delta, gate), act))
        for name in ("delta", "delta_action", "gate"):
            signals[f"{source}/{name}"] = torch.tensor([p[f"{name}_mean"] for p in per_step])
        passes.set_postfix_str(source)
        passes.update()
    passes.close()
    times["rescore_s"] = time.perf_counter() - t0

    table = credit.credit_table(signals, optimal, groups, clusters, n_boot=n_boot, seed=seed)
    counts = {k: sum(lab.count(k) for lab in labels) for k in ("optimal", "wasted", "fatal", "lost")}
    skill_stats = {
        source: {
            "parse_rate": sum(_text(s) is not None for s in chosen) / len(chosen),
            **consistency_metrics(env, trajs, chosen),
        }
        for source, chosen in skills.items()
        if not source.startswith("shuffled")
    }
    return {
        "episodes": len(trajs),
        "success_rate": sum(t.won for t in trajs) / len(trajs),
        "steps": len(steps),
        "labels": counts,
        "skills": skill_stats,
        "table": table,
        "time": times,
        # per episode and per step, for `credit_rows` (not part of the JSON summary)
        "trajectories": trajs,
        "step_labels": labels,
        "skill_texts": {source: [_text(s) for s in chosen] for source, chosen in skills.items()},
        "step_signals": {name: values.tolist() for name, values in signals.items()},
        "step_at": [(s.traj, s.step) for s in steps],
    }


PER_EPISODE = ("trajectories", "step_labels", "skill_texts", "step_signals", "step_at")


def credit_rows(c: dict) -> list[dict]:
    """One row per episode of `probe_credit`'s result `c`: the trajectory, its step labels, the text of each skill
    source (None: none parsed) and each signal per step (None: that source had no parsed skill, or the step was not
    scored), so a probe can be re-analysed later without re-running it."""
    rows = [
        {
            **dataclasses.asdict(t),
            "step_labels": lab,
            "skills": {source: texts[i] for source, texts in c["skill_texts"].items()},
            "signals": {name: [None] * len(t.steps) for name in c["step_signals"]},
        }
        for i, (t, lab) in enumerate(zip(c["trajectories"], c["step_labels"]))
    ]
    for k, (i, step) in enumerate(c["step_at"]):
        for name, values in c["step_signals"].items():
            rows[i]["signals"][name][step] = None if math.isnan(values[k]) else values[k]
    return rows


def probe_uplift(trainer: Trainer, env, pool, games: list[GameEntry], seed: int, n_boot: int) -> dict:
    """Part 2: greedy success on `games` with the plain prompt and with each kind of skill in the prompt."""
    params = trainer.params
    greedy = dataclasses.replace(params.rollout, temperature=0.0)

    def run(tag: str, skill: Callable[[GameEntry, str], str | None] | None) -> list[Trajectory]:
        return play(
            trainer.sampler, pool, games, group_size=1, env=params.env, gen=greedy, seed=seed,
            tag=f"uplift/{tag}", skill=skill,
        )  # fmt: skip

    t0 = time.perf_counter()
    plain = run("plain", None)
    oracle = oracle_skills(env, params, plain)
    own = self_skills(trainer, plain)
    by_game = {
        "oracle": {t.game_id: _text(s) for t, s in zip(plain, oracle)},
        "self": {t.game_id: _text(s) for t, s in zip(plain, own)},
        "shuffled": {t.game_id: _text(s) for t, s in zip(plain, shuffled_skills(plain, oracle))},
    }
    played = {"plain": plain}
    for cond in ("oracle", "self", "shuffled"):
        played[cond] = run(cond, lambda g, _obs, m=by_game[cond]: m[g.game_id])
    played["plan"] = run("plan", lambda _g, obs: env.plan_hint(obs))
    rooms = list(range(len(games)))
    base = [float(t.won) for t in plain]
    out = {}
    for cond in UPLIFT:
        won = [float(t.won) for t in played[cond]]
        lo, hi = _interval(won, rooms, n_boot, seed)
        row = {"success": sum(won) / len(won), "success_lo": lo, "success_hi": hi}
        if cond != "plain":
            diff = [w - b for w, b in zip(won, base)]
            dlo, dhi = _interval(diff, rooms, n_boot, seed)
            row |= {"uplift": sum(diff) / len(diff), "uplift_lo": dlo, "uplift_hi": dhi}
        steps = [s for t in played[cond] for s in t.steps]
        row["invalid_rate"] = sum(not s.valid for s in steps) / max(len(steps), 1)
        out[cond] = row
    return {"rooms": len(games), "conditions": out, "time": {"play_s": time.perf_counter() - t0}}


def probe_random(pool, games: list[GameEntry], max_steps: int, runs: int, seed: int, n_boot: int) -> dict:
    """The chance baseline: uniformly random admissible moves, `runs` episodes per room of at most `max_steps`."""
    rng = random.Random(seed)
    wins = [0] * len(games)
    for _ in range(runs):
        states = dict(enumerate(pool.reset([g.game_id for g in games])))
        for _ in range(max_steps):
            live = {i: s for i, s in states.items() if not s.won}
            if not live:
                break
            states |= pool.step({i: rng.choice(s.admissible_actions) for i, s in live.items()})
        for i, s in states.items():
            wins[i] += s.won
    per_room = [w / runs for w in wins]
    lo, hi = _interval(per_room, list(range(len(games))), n_boot, seed)
    return {
        "rooms": len(games),
        "runs": runs,
        "success": sum(per_room) / len(per_room),
        "success_lo": lo,
        "success_hi": hi,
    }


def probe_moves(trainer: Trainer, env, games: list[GameEntry], seed: int, n_boot: int) -> dict:
    """Part 3: the share of optimal greedy moves on the start and MOVE_STATES off-path states of each room, against
    chance on the same states; an invalid answer is the environment's no-op (never optimal)."""
    params = trainer.params
    starts = [x for x in env.expert_examples(games, params.env, progress=False) if x["step"] == 0]
    states = starts + env.off_path_examples(games, params.env, MOVE_STATES, seed, progress=False)
    t0 = time.perf_counter()
    gens = trainer.sampler.generate(
        [x["prompt"] for x in states], temperature=0.0, max_new_tokens=params.rollout.max_new_tokens
    )
    room_of = {g.game_id: i for i, g in enumerate(games)}
    model, chance, invalid, rooms = [], [], [], []
    for x, gen in zip(states, gens):
        room = room_from_text(x["observation"])
        optimal = {a for a in ACTIONS if step_labels(room, [a]) == ["optimal"]}
        action = parse_response(gen.text)[0]
        model.append(float(action in optimal))
        chance.append(len(optimal) / len(ACTIONS))
        invalid.append(float(action not in ACTIONS))
        rooms.append(room_of[x["game_id"]])
    out = {"rooms": len(set(rooms)), "states": len(states), "time": {"generate_s": time.perf_counter() - t0}}
    for key, values in (("optimal", model), ("chance", chance), ("invalid", invalid)):
        lo, hi = _interval(values, rooms, n_boot, seed)
        out |= {key: sum(values) / len(values), f"{key}_lo": lo, f"{key}_hi": hi}
    diff = [m - c for m, c in zip(model, chance)]
    lo, hi = _interval(diff, rooms, n_boot, seed)
    return out | {"above_chance": sum(diff) / len(diff), "above_chance_lo": lo, "above_chance_hi": hi}


def run_probe(
    params: Params,
    model_dir: Path,
    manifests: Sequence[Path],
    games: int,
    group_size: int,
    seed: int,
    n_boot: int = 1000,
    parts: Sequence[str] = ("credit", "uplift"),
    out: Path | None = None,
    traj_out: Path | None = None,
) -> dict:
    """Load `model_dir` as SEED's RL stage would (params.rl with `method: seed`), take the first `games` rooms of
    the `manifests` (in order), and run the chosen parts; the result (without trajectories) goes to `out` as JSON, the credit
    part's episodes with their step labels, skills and per-step signals to `traj_out` (JSON lines, `credit_rows`)."""
    env = environment(params)
    if env.name != "sokoban":
        raise ValueError(
            f"seed probe needs an environment whose solver labels every step: env.name is {env.name!r}; use a "
            "Sokoban params file (recipes/sokoban.yaml)"
        )
    entries = [e for m in manifests for e in env.read_manifest(m)][:games]
    if len(entries) < 2:
        raise ValueError(
            f"seed probe needs two rooms or more (the shuffled control), got {len(entries)} from "
            f"{', '.join(map(str, manifests))}"
        )
    params = dataclasses.replace(params, rl=dataclasses.replace(params.rl, method="seed"))
    result: dict = {
        "model": str(model_dir),
        "manifests": [str(m) for m in manifests],
        "seed": seed,
        "group_size": group_size,
    }
    with env.open_pool(params.env.workers) as pool:
        if "random" in parts:
            result["random"] = probe_random(pool, entries, params.env.max_steps, RANDOM_RUNS, seed, n_boot)
        if {"credit", "uplift", "moves"} & set(parts):
            seed_everything(seed)
            model, tok = load_for(model_dir, params.model, full_finetune=params.rl.lora_r is None)
            trainer = Trainer(model, tok, params, sampler_dir=model_dir, env=env)
            try:
                if "credit" in parts:
                    result["credit"] = probe_credit(trainer, env, pool, entries, group_size, seed, n_boot)
                if "uplift" in parts:
                    result["uplift"] = probe_uplift(trainer, env, pool, entries, seed, n_boot)
                if "moves" in parts:
                    result["moves"] = probe_moves(trainer, env, entries, seed, n_boot)
            finally:
                trainer.close()
    if "credit" in result and traj_out is not None:
        atomic_write_text(traj_out, "".join(json.dumps(r) + "\n" for r in credit_rows(result["credit"])))
    if "credit" in result:
        result["credit"] = {k: v for k, v in result["credit"].items() if k not in PER_EPISODE}
    if out is not None:
        write_json(out, result)
    return result


def _ci(row: dict, key: str) -> str:
    v, lo, hi = row[key], row.get(f"{key}_lo", math.nan), row.get(f"{key}_hi", math.nan)
    if math.isnan(v):
        return "n/a"
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]" if not math.isnan(lo) else f"{v:.3f}"


def format_result(result: dict) -> str:
    """The printed tables: credit AUCs per signal, then uplift per condition."""
    lines = []
    if "random" in result:
        r = result["random"]
        lines += [f"random moves: {r['rooms']} rooms x {r['runs']} episodes, success {_ci(r, 'success')}", ""]
    if "moves" in result:
        m = result["moves"]
        lines += [
            f"legibility: {m['states']} states of {m['rooms']} rooms, greedy move optimal {_ci(m, 'optimal')}, "
            f"chance {_ci(m, 'chance')}, difference {_ci(m, 'above_chance')}, invalid {_ci(m, 'invalid')}",
            "",
        ]
    if "credit" in result:
        c = result["credit"]
        lines += [
            f"credit: {c['episodes']} episodes, success {c['success_rate']:.3f}, {c['steps']} steps {c['labels']}",
            f"skills: {json.dumps(c['skills'])}",
            f"{'signal':<29} {'pooled AUC [95% CI]':<26} {'within-trajectory AUC':<26} {'mean opt / other':<20}",
        ]
        for name, row in c["table"].items():
            means = f"{row['mean_positive']:+.3f} / {row['mean_other']:+.3f}"
            lines.append(f"{name:<29} {_ci(row, 'pooled'):<26} {_ci(row, 'within'):<26} {means:<20}")
    if "uplift" in result:
        u = result["uplift"]
        lines += [
            "",
            f"uplift: {u['rooms']} rooms, greedy",
            f"{'condition':<10} {'success [95% CI]':<26} {'paired uplift':<26} invalid",
        ]
        for cond, row in u["conditions"].items():
            up = _ci(row, "uplift") if "uplift" in row else ""
            lines.append(f"{cond:<10} {_ci(row, 'success'):<26} {up:<26} {row['invalid_rate']:.3f}")
    return "\n".join(lines)
