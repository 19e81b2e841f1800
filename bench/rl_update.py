"""Cost of SEED over GRPO on one collected batch; prints one JSON line of side-by-side ratios.

One batch (B games x N rollouts, the embedded default's settings) is collected once and saved. Each
measurement then runs in its own process (so peak RSS is its own), from the same starting weights:
- grpo: re-scoring (reference) + the PPO update;
- seed: analysis by pi_old + re-scoring (reference and skill contexts) + the PPO+OPD update
  (both through `Trainer.learn`, the RL stage's own steps 3-6, after the sampler has generated for the batch's last
  step prompts: in the RL stage the analysis follows the collection on a warm engine, and a cold one's first calls
  cost seconds that the stage never pays);
- rescore: the skill-context re-scoring pass alone (each trajectory's shared prompt prefix run once), versus the
  same pass with every prompt run whole, and versus
- forward: a plain full-logits forward pass over the same prompt+response tokens.
The SEED/GRPO ratio is reported for the update alone and for the whole update including the shared collection,
with SEED's extra seconds by part (analysis, teacher pass, optimizer pass) and the collection time at which those
parts would make the whole-update ratio 1.10 (`break_even_collect_s`: the ratio falls as collection's share grows).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from seed_core import distributed  # noqa: E402
from seed_core.config import load_params  # noqa: E402
from seed_core.envs import environment  # noqa: E402
from seed_core.method.rescore import score_steps, step_tokens  # noqa: E402
from seed_core.method.update import Trainer  # noqa: E402
from seed_core.models import load_for  # noqa: E402
from seed_core.records import Trajectory, read_jsonl, write_jsonl  # noqa: E402
from seed_core.rollout import play  # noqa: E402
from seed_core.runtime import peak_rss_mb  # noqa: E402
from seed_core.stages.rl import INIT, games_for_update  # noqa: E402


def trainer(params, model_dir, method):
    params = dataclasses.replace(params, rl=dataclasses.replace(params.rl, method=method))
    model, tok = load_for(model_dir, params.model, full_finetune=params.rl.lora_r is None)
    return Trainer(model, tok, params, sampler_dir=model_dir)  # the sampler `rollout.backend` names


def worker(mode: str, params_path: str, model_dir: Path, batch_path: Path) -> dict:
    params = load_params(params_path)
    trajs = list(read_jsonl(batch_path, Trajectory))
    t = trainer(params, model_dir, "grpo" if mode in ("grpo", "forward") else "seed")
    out: dict = {}
    if mode in ("grpo", "seed"):
        gen = params.rollout  # warm the engine as the stage's collection leaves it (untimed, both methods alike)
        last = [tr.steps[-1].prompt for tr in trajs]
        t.sampler.generate(last, temperature=gen.temperature, max_new_tokens=gen.max_new_tokens, seed=0)
        t.sampler.reset_cache()
        start = time.perf_counter()
        m, _ = t.learn(trajs, 0)  # steps 3-6, exactly as the RL stage runs them
        out["seconds"] = time.perf_counter() - start
        out["metrics"] = {k: v for k, v in m.items() if k.startswith(("opd/", "skills/", "time/"))}
    else:
        skills = ["Go to the places where the object usually is first, take it, then finish the task."] * len(trajs)
        steps = step_tokens(t.policy.encoder, trajs, skills)
        out["tokens"] = sum(len(s.teacher_ids) + len(s.response_ids) for s in steps)
        with torch.no_grad():  # untimed: a process's first passes cost extra, which would fall on whichever runs first
            t.policy.score([s.teacher_ids for s in steps[:2]], [s.response_ids for s in steps[:2]])
        start = time.perf_counter()
        if mode == "rescore":
            shared = score_steps(t.policy, steps, "teacher", params.rl.micro_batch_tokens)
            out["seconds"] = time.perf_counter() - start
            # the same pass with every step's prompt run whole (no prefix shared across a trajectory's steps)
            start = time.perf_counter()
            with torch.no_grad():
                whole = t.policy.score(
                    [s.teacher_ids for s in steps], [s.response_ids for s in steps], params.rl.micro_batch_tokens
                )
            out["unshared_seconds"] = time.perf_counter() - start
            out["max_abs_logp_diff"] = max((a - b).abs().max().item() for a, b in zip(shared, whole))
        else:  # plain forward with full-vocabulary logits, one step at a time (no padding)
            with torch.no_grad(), distributed.gathered(t.policy.scorer):  # the trainer's model may be sharded
                for s in steps:
                    t.model(input_ids=torch.tensor([s.teacher_ids + s.response_ids])).logits.float().log_softmax(-1)
            out["seconds"] = time.perf_counter() - start
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default=str(REPO / "params.yaml"))
    ap.add_argument("--model", default=None, help="starting weights (default: the RL stage's, rl.init of params)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="GRPO and SEED updates measured in turn this many times (the ratio is the median of the rounds')",
    )
    ap.add_argument("--worker", choices=["grpo", "seed", "rescore", "forward"], help=argparse.SUPPRESS)
    ap.add_argument("--batch", default="/tmp/seed-bench-rl-batch.jsonl", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        model_dir = Path(args.model)
        print(json.dumps(worker(args.worker, args.params, model_dir, Path(args.batch))))
        return

    params = load_params(args.params)
    model_dir = Path(args.model) if args.model else REPO / INIT[params.rl.init]
    if not (model_dir / "config.json").exists():
        sys.exit(f"{model_dir} does not exist: run `dvc repro train_analyzer` first (or pass --model)")
    env = environment(params)
    train = env.read_manifest(REPO / "data/manifests/train.json")
    t = trainer(params, model_dir, "grpo")
    with env.open_pool(params.env.workers) as pool:
        start = time.perf_counter()
        trajs = play(
            t.sampler,
            pool,
            games_for_update(train, params.rl, 0),
            group_size=params.rl.group_size,
            env=params.env,
            gen=params.rollout,
            seed=0,
            tag="bench",
            progress=False,
        )
        collect_s = time.perf_counter() - start
    write_jsonl(args.batch, trajs)
    t.close()
    del t

    def measure(mode: str) -> dict:
        cmd = [sys.executable, __file__, "--worker", mode, "--params", args.params, "--model", str(model_dir)]
        proc = subprocess.run([*cmd, "--batch", args.batch], capture_output=True, text=True, check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    # GRPO and SEED in turn, so that a slow spell of a noisy machine falls on both methods alike
    rounds = [(measure("grpo"), measure("seed")) for _ in range(args.rounds)]
    res = {"grpo": rounds[-1][0], "seed": rounds[-1][1], "rescore": measure("rescore"), "forward": measure("forward")}
    update_ratios = [s["seconds"] / g["seconds"] for g, s in rounds]
    whole_ratios = [(s["seconds"] + collect_s) / (g["seconds"] + collect_s) for g, s in rounds]

    def extra(part: str) -> float:  # SEED's seconds over GRPO's in one step of `learn`, median over rounds
        return statistics.median(s["metrics"][f"time/{part}_s"] - g["metrics"][f"time/{part}_s"] for g, s in rounds)

    extra_s = {"analysis": extra("analysis"), "teacher_pass": extra("rescore"), "optimizer_pass": extra("update")}
    extra_s["total"] = statistics.median(s["seconds"] - g["seconds"] for g, s in rounds)
    grpo_s = statistics.median(g["seconds"] for g, _ in rounds)
    print(
        json.dumps(
            {
                "bench": "rl_update",
                "model": str(model_dir.relative_to(REPO) if model_dir.is_relative_to(REPO) else model_dir),
                "episodes": len(trajs),
                "steps": sum(tr.length for tr in trajs),
                "seed_over_grpo_update_only": round(statistics.median(update_ratios), 3),
                "seed_over_grpo_with_collection": round(statistics.median(whole_ratios), 3),
                "rounds": {
                    "update_only": [round(r, 3) for r in update_ratios],
                    "with_collection": [round(r, 3) for r in whole_ratios],
                },
                "rescore_tokens_per_s": round(res["rescore"]["tokens"] / res["rescore"]["seconds"], 1),
                "plain_forward_tokens_per_s": round(res["forward"]["tokens"] / res["forward"]["seconds"], 1),
                "rescore_over_plain_forward_throughput": round(
                    res["forward"]["seconds"] / res["rescore"]["seconds"], 3
                ),
                # a trajectory's steps share their instructions, task and skill: run once per trajectory
                "rescore_shared_prefix_speedup": round(
                    res["rescore"]["unshared_seconds"] / res["rescore"]["seconds"], 3
                ),
                "rescore_shared_prefix_max_abs_logp_diff": res["rescore"]["max_abs_logp_diff"],
                "peak_rss_mb": {k: round(v["peak_rss_mb"]) for k, v in res.items()},
                "seconds": {"collect": round(collect_s, 1), **{k: round(v["seconds"], 1) for k, v in res.items()}},
                "seed_extra_s": {k: round(v, 1) for k, v in extra_s.items()},
                # (grpo + collect + extra) / (grpo + collect) = 1.10 at this collection time
                "break_even_collect_s": round(extra_s["total"] / 0.10 - grpo_s, 1),
                "seed_metrics": {k: v for k, v in res["seed"]["metrics"].items() if not k.startswith("time/")},
            }
        )
    )


if __name__ == "__main__":
    main()
