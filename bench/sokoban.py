"""Sokoban throughput; prints one JSON line of side-by-side ratios.

Measured in one run:
- environment: Sokoban steps/s (uniformly random moves in lock-step over 64 rooms) against ALFWorld's
  in-process steps/s (walkthrough replay of 8 real games), and room resets/s (generation from a seed) with
  and without the BFS solver's shortest plan;
- rollouts: generated tokens/s and env steps/s of SmolLM2 playing Sokoban rooms (step prompts of
  `recipes/sokoban.yaml`) against playing ALFWorld games, same backend, same batch (`--backend`, default vllm),
  same caps; with the prompt lengths in tokens, which is what differs.
Absolute times on shared machines are noisy; read the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from seed_core.config import load_params  # noqa: E402
from seed_core.envs.alfworld.data import data_root, list_games, stratified_subset, write_manifest  # noqa: E402
from seed_core.envs.alfworld.env import AlfworldGame, EnvPool  # noqa: E402
from seed_core.envs.sokoban.env import Sokoban, SokobanPool  # noqa: E402
from seed_core.envs.sokoban.room import ACTIONS, generate_room, solve  # noqa: E402
from seed_core.models import load_tokenizer  # noqa: E402
from seed_core.policy import open_sampler  # noqa: E402
from seed_core.rollout import play  # noqa: E402


def sokoban_step_rate(rooms: int, steps: int) -> float:
    rng = random.Random(0)
    with SokobanPool((6, 6), 1) as pool:
        pool.reset([str(s) for s in range(rooms)])
        t0 = time.perf_counter()
        for _ in range(steps):
            pool.step({i: rng.choice(list(ACTIONS)) for i in range(rooms)})
        return rooms * steps / (time.perf_counter() - t0)


def alfworld_step_rate(root: Path, games: list[str]) -> float:
    walks = {
        i: AlfworldGame.walkthrough(type("G", (), {"path": root / "json_2.1.1" / g / "game.tw-pddl"})())
        for i, g in enumerate(games)
    }
    with EnvPool(root, 0) as pool:
        pool.reset(games)
        n, t0 = 0, time.perf_counter()
        for t in range(max(len(w) for w in walks.values())):
            live = {i: w[t] for i, w in walks.items() if t < len(w)}
            pool.step(live)
            n += len(live)
        return n / (time.perf_counter() - t0)


def reset_rate(seeds: range, with_solver: bool) -> float:
    t0 = time.perf_counter()
    for s in seeds:
        room = generate_room(s)
        if with_solver:
            solve(room)
    return len(seeds) / (time.perf_counter() - t0)


def rollout_rate(params, model: Path, env, entries, group: int) -> tuple[float, float, float]:
    """(env steps/s, generated tokens/s, mean prompt tokens) of lock-step rollouts."""
    tok = load_tokenizer(model)
    with open_sampler(model, params, params.rollout, seed=0) as policy, env.open_pool(params.env.workers) as pool:
        t0 = time.perf_counter()
        trajs = play(
            policy,
            pool,
            entries,
            group_size=group,
            env=params.env,
            gen=params.rollout,
            seed=0,
            tag="bench",
            progress=False,
        )
        dt = time.perf_counter() - t0
    steps = [s for t in trajs for s in t.steps]
    prompt_tokens = statistics.fmean(len(tok(s.prompt).input_ids) for s in steps)
    return len(steps) / dt, sum(len(s.response_ids) for s in steps) / dt, prompt_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "models/base"), help="HF folder (default: models/base)")
    ap.add_argument("--backend", default="vllm", choices=["hf", "vllm"])
    ap.add_argument("--games", type=int, default=8, help="games (rooms) per rollout; x --group episodes")
    ap.add_argument("--group", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=3)
    args = ap.parse_args()

    root = data_root(None, REPO)
    alf_games = stratified_subset(list_games(root, "valid_seen"), args.games, seed=0)
    soko = sokoban_step_rate(64, 200)
    alf = alfworld_step_rate(root, alf_games)
    resets, resets_solved = reset_rate(range(2000), False), reset_rate(range(2000, 4000), True)

    rates = {}
    for name, recipe in (("sokoban", "recipes/sokoban.yaml"), ("alfworld", "params.yaml")):
        p = load_params(REPO / recipe)
        p = dataclasses.replace(
            p,
            env=dataclasses.replace(p.env, max_steps=args.max_steps),
            rollout=dataclasses.replace(p.rollout, backend=args.backend),
        )
        if name == "sokoban":
            env = Sokoban()
            entries = env.read_manifest(_sokoban_manifest(p, env))
        else:
            from seed_core.envs.alfworld import Alfworld

            env, entries = Alfworld(str(root)), write_manifest(Path("/tmp/seed-bench-alf.json"), root, alf_games)
        rates[name] = rollout_rate(p, Path(args.model), env, entries[: args.games], args.group)

    print(
        json.dumps(
            {
                "bench": "sokoban",
                "backend": args.backend,
                "env_steps_per_s": {"sokoban": round(soko, 1), "alfworld": round(alf, 1)},
                "env_step_ratio_sokoban_vs_alfworld": round(soko / alf, 1),
                "resets_per_s": {"generate": round(resets, 1), "generate_and_solve": round(resets_solved, 1)},
                "reset_cost_ratio_solver_included": round(resets / resets_solved, 3),
                "rollout_env_steps_per_s": {k: round(v[0], 3) for k, v in rates.items()},
                "rollout_tokens_per_s": {k: round(v[1], 2) for k, v in rates.items()},
                "prompt_tokens_mean": {k: round(v[2], 1) for k, v in rates.items()},
                "rollout_step_ratio_sokoban_vs_alfworld": round(rates["sokoban"][0] / rates["alfworld"][0], 3),
                "rollout_token_ratio_sokoban_vs_alfworld": round(rates["sokoban"][1] / rates["alfworld"][1], 3),
            }
        )
    )


def _sokoban_manifest(params, env: Sokoban) -> Path:
    out = Path("/tmp/seed-bench-sokoban")
    env.write_manifests(params.prepare, out)
    return out / "valid_seen.json"


if __name__ == "__main__":
    main()
