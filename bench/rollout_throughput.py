"""Rollout throughput of SmolLM2 on real ALFWorld games; prints one JSON line of side-by-side ratios.

Measured in one run, on the same prompts and games:
- generation: plain HF `generate` (fp32, batch in arrival order, padded to the longest prompt, no early stop)
  versus our backend (dtype picked per machine, prompts bucketed by length, stop after </action>);
- rollouts: one episode at a time versus 8 and 16 episodes in lock-step (env steps/s, generated tokens/s);
- environment: walkthrough replay with 1 versus 2 worker processes (env steps/s);
- backends: the HF backend versus an in-process vLLM engine (`rollout.backend: vllm`) in the same dtype, on the same
  step prompts passed as token ids (generated tokens/s, 48 new tokens, stop at </action>), and in lock-step rollouts
  of 16 and 48 episodes (env steps/s). vLLM runs last: its CPU build pins this process's OpenMP threads.
`--backends-only` measures the backends alone. Absolute times on shared machines are noisy; read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from seed_core.config import EnvConfig, SamplingConfig  # noqa: E402
from seed_core.envs.alfworld.data import data_root, list_games, stratified_subset, write_manifest  # noqa: E402
from seed_core.envs.alfworld.env import AlfworldGame, EnvPool  # noqa: E402
from seed_core.envs.alfworld.prompts import step_prompt  # noqa: E402
from seed_core.models import load_model, pick_dtype  # noqa: E402
from seed_core.policy.hf import HFPolicy  # noqa: E402
from seed_core.rollout import STOP, play  # noqa: E402


def real_prompts(root: Path, games: list[str]) -> list[str]:
    """Step prompts of real games: step 0 and, after one walkthrough action, step 1 (with history)."""
    out = []
    for g in games:
        game = AlfworldGame(root, g)
        s = game.reset()
        out.append(step_prompt(s.task, s.observation, s.admissible_actions, [], 5))
        a = game.walkthrough()[0]
        s2 = game.step(a)
        out.append(step_prompt(s.task, s2.observation, s2.admissible_actions, [(s.observation, a)], 5))
        game.close()
    return out


def plain_generate_tps(model, tok, prompts: list[str], batch: int, max_new: int) -> float:
    """Baseline: fp32 HF generate, batches in arrival order, no stop strings."""
    n_tokens, t0 = 0, time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = [
            tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            for p in prompts[i : i + batch]
        ]
        tok.padding_side = "left"
        enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(
                **enc,
                do_sample=True,
                temperature=1.0,
                top_k=None,
                max_new_tokens=max_new,
                pad_token_id=tok.pad_token_id,
            )
        new = out[:, enc["input_ids"].shape[1] :]
        n_tokens += int((new != tok.pad_token_id).sum())
    return n_tokens / (time.perf_counter() - t0)


def ours_tps(policy, prompts: list[str], max_new: int) -> float:
    t0 = time.perf_counter()
    gens = policy.generate(prompts, temperature=1.0, max_new_tokens=max_new, stop=STOP, seed=0)
    return sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0)


def rollout_rates(policy, root, entries, episodes: int, max_steps: int, max_new: int) -> tuple[float, float]:
    """(env steps/s, generated tokens/s) playing `entries` `episodes` at a time in lock-step."""
    env = EnvConfig(max_steps=max_steps, history_length=5, workers=2)
    gen = SamplingConfig(temperature=1.0, max_new_tokens=max_new, batch_size=16)
    with EnvPool(root, env.workers) as pool:
        pool.reset([e.game_id for e in entries[:episodes]])  # warm the worker caches: loading is not stepping
        steps = tokens = 0
        t0 = time.perf_counter()
        for i in range(0, len(entries), episodes):
            trajs = play(
                policy,
                pool,
                entries[i : i + episodes],
                group_size=1,
                env=env,
                gen=gen,
                seed=i,
                tag="bench",
                progress=False,
            )
            steps += sum(t.length for t in trajs)
            tokens += sum(len(s.response_ids) for t in trajs for s in t.steps)
        dt = time.perf_counter() - t0
    return steps / dt, tokens / dt


def env_rate(root, games: list[str], workers: int) -> float:
    plans = {
        i: AlfworldGame.walkthrough(type("G", (), {"path": root / "json_2.1.1" / g / "game.tw-pddl"})())
        for i, g in enumerate(games)
    }
    with EnvPool(root, workers) as pool:
        t0 = time.perf_counter()
        pool.reset(games)
        n = 0
        for k in range(max(len(p) for p in plans.values())):
            acts = {i: p[k] for i, p in plans.items() if k < len(p)}
            pool.step(acts)
            n += len(acts) + (len(games) if k == 0 else 0)  # a reset counts as a step
        return n / (time.perf_counter() - t0)


def backend_rates(policy, engine, prompts, root, entries, args) -> dict:
    """Generation and lock-step rollouts, HF then vLLM, on the same prompts and games."""
    out: dict = {}
    for name, sampler in (("hf", policy), ("vllm", engine)):
        if sampler is None:
            sampler = engine_for(args.model, policy)
        ours_tps(sampler, prompts[:4], 8)  # warm-up: first-call allocations, the engine's first batch
        out[name] = {"gen_tokens_per_s": ours_tps(sampler, prompts, args.max_new_tokens)}
        for n in (16, 48):
            steps, tokens = rollout_rates(sampler, root, entries[:n], n, args.max_steps, args.max_new_tokens)
            out[name][f"rollout_b{n}"] = {"env_steps_per_s": steps, "tokens_per_s": tokens}
    hf, vl = out["hf"], out["vllm"]
    return {
        "backend_gen_tokens_per_s": {k: round(v["gen_tokens_per_s"], 2) for k, v in out.items()},
        "backend_gen_speedup_vllm_vs_hf": round(vl["gen_tokens_per_s"] / hf["gen_tokens_per_s"], 3),
        **{
            f"backend_rollout_b{n}_env_steps_per_s": {
                k: round(v[f"rollout_b{n}"]["env_steps_per_s"], 3) for k, v in out.items()
            }
            for n in (16, 48)
        },
        **{
            f"backend_rollout_b{n}_speedup_vllm_vs_hf": round(
                vl[f"rollout_b{n}"]["env_steps_per_s"] / hf[f"rollout_b{n}"]["env_steps_per_s"], 3
            )
            for n in (16, 48)
        },
    }


def engine_for(model_dir: str, policy: HFPolicy):
    from seed_core.policy.vllm import VLLMPolicy

    t0 = time.perf_counter()
    engine = VLLMPolicy(model_dir, policy.encoder, dtype=policy.model.dtype, device="cpu", seed=0, max_new_tokens=256)
    print(f"vLLM engine started in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=str(REPO / "models/base"), help="HF folder (default: models/base from `dvc repro prepare`)"
    )
    ap.add_argument("--games", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-steps", type=int, default=2)
    ap.add_argument("--backends-only", action="store_true", help="measure the HF and vLLM backends only")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    root = data_root(None, REPO)
    games = stratified_subset(list_games(root, "valid_seen"), max(args.games, 48), seed=0)
    entries = write_manifest(Path("/tmp/seed-bench-manifest.json"), root, games)
    games, entries48 = games[: args.games], entries
    entries = entries[: args.games]
    prompts = real_prompts(root, games)
    dtype = pick_dtype("auto")

    if args.backends_only:
        model, tok = load_model(args.model, dtype=dtype)
        policy = HFPolicy(model, tok, batch_size=16)
        rates = backend_rates(policy, None, prompts, root, entries48, args)
        print(json.dumps({"bench": "rollout_throughput", "dtype": str(dtype).replace("torch.", ""), **rates}))
        return

    fp32, tok = load_model(args.model, dtype=torch.float32)
    baseline = plain_generate_tps(fp32, tok, prompts, 16, args.max_new_tokens)
    model, tok = load_model(args.model, dtype=dtype)
    policy = HFPolicy(model, tok, batch_size=16)
    ours = ours_tps(policy, prompts, args.max_new_tokens)

    r1 = rollout_rates(policy, root, entries, 1, args.max_steps, args.max_new_tokens)
    r8 = rollout_rates(policy, root, entries, 8, args.max_steps, args.max_new_tokens)
    r16 = rollout_rates(policy, root, entries, 16, args.max_steps, args.max_new_tokens)
    e1, e2 = env_rate(root, games[:8], 1), env_rate(root, games[:8], 2)
    rates = backend_rates(policy, None, prompts, root, entries48, args)

    print(
        json.dumps(
            {
                "bench": "rollout_throughput",
                "dtype": str(dtype).replace("torch.", ""),
                "prompts": len(prompts),
                "gen_tokens_per_s_plain_fp32_b16": round(baseline, 2),
                "gen_tokens_per_s_ours_b16": round(ours, 2),
                "gen_speedup_ours_vs_plain": round(ours / baseline, 3),
                "rollout_env_steps_per_s": {"b1": round(r1[0], 3), "b8": round(r8[0], 3), "b16": round(r16[0], 3)},
                "rollout_tokens_per_s": {"b1": round(r1[1], 2), "b8": round(r8[1], 2), "b16": round(r16[1], 2)},
                "rollout_speedup_b8_vs_b1": round(r8[0] / r1[0], 3),
                "rollout_speedup_b16_vs_b1": round(r16[0] / r1[0], 3),
                "env_steps_per_s": {"workers1": round(e1, 2), "workers2": round(e2, 2)},
                "env_speedup_2_vs_1_workers": round(e2 / e1, 3),
                **rates,
            }
        )
    )


if __name__ == "__main__":
    main()
