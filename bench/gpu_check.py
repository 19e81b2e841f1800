"""GPU check: SEED's update at paper scale on one GPU, with only torch, transformers and peft; prints one JSON line.

For a lent GPU machine (no vLLM, no game files, no hub access): a random-init model built from a
Qwen2.5-3B-shaped config, a word-level tokenizer built here, and synthetic multi-turn trajectories of the paper's
shape (16 games x 8 rollouts, step prompts and responses of the paper's lengths). It measures
- one full-fine-tuning SEED update (fp32 master weights, bf16 autocast, lr 1e-6) and one LoRA update, through
  `Trainer.learn`, the RL stage's own steps 4-6 (the skills are given: analysis is generation, measured below);
- the share of weights the full-fine-tuning update changed (fp32 master weights keep lr 1e-6 steps; bf16
  weights would round most of them away), measured on the same update applied to a bf16 copy too;
- scoring (re-scoring pass) and HF generation tokens/s;
- peak GPU memory of each phase, and that every model is on the GPU;
- the scale-out path: a process group (NCCL on the GPU, gloo on the CPU) of one rank and the same full-fine-tuning
  update with the learner under FSDP2 (bf16 compute over fp32 master weights), against the unwrapped update above
  (largest weight difference, share of weights changed, peak memory), and a checkpoint round trip through the RL
  stage's own `save_epoch` / `load_epoch` (gathered full state dicts).
`--tiny` runs the same code path on a small config (a CPU check that the script works).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from seed_core.config import params_from_dict  # noqa: E402
from seed_core.method.update import Trainer  # noqa: E402
from seed_core.records import Skill, Step, Trajectory  # noqa: E402

QWEN25_3B = dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True)  # fmt: skip
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=4096, max_position_embeddings=4096, tie_word_embeddings=True)  # fmt: skip
CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tokenizer(words: int):
    """A word-level tokenizer with a chat template (no files, no hub): words w0..wN plus the chat specials."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]"]
    vocab = {t: i for i, t in enumerate(specials + [f"w{i}" for i in range(words)] + ["user", "assistant", "\n"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="[UNK]", additional_special_tokens=specials[1:3])  # fmt: skip
    fast.chat_template = CHAT
    return fast


def trajectories(games: int, group: int, steps: int, prompt_words: int, response_tokens: int, words: int, rng):
    """games x group episodes of `steps` steps: word prompts, random response ids, mixed outcomes per group."""
    out = []
    for g in range(games):
        for k in range(group):
            won = k % 2 == 0
            ss = [
                Step("obs", [], "Your task is to: w1 w2\n" + " ".join(f"w{rng.randrange(words)}" for _ in range(prompt_words)), "r",
                     [4 + rng.randrange(words) for _ in range(response_tokens)], [0.0] * response_tokens,
                     "go", True, 10.0 if won and t == steps - 1 else 0.0, "fb")
                for t in range(steps)
            ]  # fmt: skip
            out.append(Trajectory(f"g{g}#{k}", f"g{g}", "train", "pick_and_place_simple", "task", f"g{g}", k, won,
                                  sum(s.reward for s in ss), steps, 0, ss))  # fmt: skip
    return out


def skills_for(trajs, words: int, rng) -> list[Skill]:
    text = " ".join(f"w{rng.randrange(words)}" for _ in range(60))  # a ~60-token skill, as the paper's are short
    return [Skill(t.traj_id, t.game_id, t.task_type, "success", "", text, "ok", "", "gpu_check", "") for t in trajs]


def peak_mb(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else 0.0


def on_device(model, device: str) -> bool:
    return all(p.device.type == device for p in model.parameters())


def update(cfg, tok, params, trajs, skills, device: str, dtype) -> tuple[dict, Trainer]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(device).eval()
    trainer = Trainer(model, tok, params)
    before = [p.detach().clone() for p in trainer.trainable]
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    metrics, _ = trainer.learn(trajs, 0, skills=skills)
    seconds = time.perf_counter() - t0
    changed = sum(int((a != b.detach()).sum()) for a, b in zip(before, trainer.trainable))
    total = sum(a.numel() for a in before)
    out = {
        "seconds": round(seconds, 1),
        "peak_gpu_mb": round(peak_mb(device)),
        "on_device": on_device(trainer.model, device),
        "weights_changed_fraction": round(changed / total, 4),
        "grad_norm": round(metrics["train/grad_norm"], 4),
        "loss_opd": metrics.get("loss/opd"),
        "skipped_steps": metrics["train/skipped_steps"],
    }
    return out, trainer


def gathered(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The trainable weights, whole and on the CPU (gathered from the ranks' shards under FSDP2)."""
    from seed_core import distributed

    return {
        k: distributed.full(p).detach().cpu().clone() for k, p in trainer.model.named_parameters() if p.requires_grad
    }


def fsdp_update(cfg, params, tok, trajs, skills, device: str, reference: dict[str, torch.Tensor]) -> dict:
    """The full-fine-tuning update again, on one FSDP2 rank, compared with `reference` (the unwrapped update's
    weights); then a checkpoint round trip."""
    import socket
    import tempfile

    from transformers import AutoModelForCausalLM

    from seed_core import distributed
    from seed_core.stages.rl import load_epoch, save_epoch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    distributed.init(timeout_s=300)
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(device).eval()
        trainer = Trainer(model, tok, params)  # a rank: the learner is sharded
        initial = gathered(trainer)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        metrics, _ = trainer.learn(trajs, 0, skills=skills)
        seconds = time.perf_counter() - t0
        peak = peak_mb(device)
        weights = gathered(trainer)
        diff = max(float((weights[k] - reference[k]).abs().max()) for k in reference)
        with tempfile.TemporaryDirectory() as tmp:
            save_epoch(trainer, Path(tmp), 1, [], [], {})
            torch.manual_seed(1)  # other weights, so the load has to restore them
            again = Trainer(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(device).eval(), tok, params)
            load_epoch(again, Path(tmp) / "epoch_001")
            loaded = gathered(again)
            opt_entries = len(again.opt.state)
        return {
            "backend": "nccl" if device == "cuda" else "gloo",
            "seconds": round(seconds, 1),
            "peak_gpu_mb": round(peak),
            "max_abs_diff_vs_unwrapped": diff,
            "weights_changed_fraction": round(
                sum(int((weights[k] != initial[k]).sum()) for k in initial) / sum(v.numel() for v in initial.values()),
                4,
            ),
            "skipped_steps": metrics["train/skipped_steps"],
            "checkpoint_round_trip_equal": all(torch.equal(weights[k], loaded[k]) for k in weights),
            "checkpoint_optimizer_states": opt_entries,
        }
    finally:
        distributed.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a small config and batch (a CPU check of the script)")
    ap.add_argument("--games", type=int, default=16, help="B (paper 16)")
    ap.add_argument("--group", type=int, default=8, help="N (paper 8)")
    ap.add_argument("--steps", type=int, default=4, help="steps per episode (paper: up to 30; 4 keeps it in 8 min)")
    ap.add_argument("--prompt-words", type=int, default=1200, help="step prompt length (paper cap 2,048 tokens)")
    ap.add_argument("--response-tokens", type=int, default=160, help="response length (paper cap 512)")
    args = ap.parse_args()
    if args.tiny:
        args.games, args.group, args.steps, args.prompt_words, args.response_tokens = 2, 2, 2, 40, 8
    from transformers import Qwen2Config

    device = "cuda" if torch.cuda.is_available() else "cpu"
    words = 3000
    cfg = Qwen2Config(**(TINY if args.tiny else QWEN25_3B), pad_token_id=0, eos_token_id=2)
    tok = tokenizer(words)
    rng = random.Random(0)
    trajs = trajectories(args.games, args.group, args.steps, args.prompt_words, args.response_tokens, words, rng)
    skills = skills_for(trajs, words, rng)
    rl = {"method": "seed", "games_per_update": args.games, "group_size": args.group, "mini_batch_steps": 256,
          "micro_batch_tokens": 16384 if device == "cuda" else 2048, "gradient_checkpointing": True}  # fmt: skip
    half = torch.bfloat16 if device == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    result: dict = {"bench": "gpu_check", "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                    "torch": torch.__version__, "model": "tiny" if args.tiny else "qwen2.5-3b-shaped (random init)",
                    "episodes": len(trajs), "steps": len(trajs) * args.steps}  # fmt: skip

    # full fine-tuning at the paper's lr: fp32 master weights (what the RL stage loads), then the same on bf16
    full = params_from_dict({"rl": {**rl, "lora_r": None, "learning_rate": 1e-6}})
    result["full_ft"], trainer = update(cfg, tok, full, trajs, skills, device, torch.float32)
    policy = trainer.policy
    trainer.model.eval()  # as the RL stage's rollouts and re-scoring run it (no dropout, KV cache on)
    steps = [(policy.encoder.encode_prompt(s.prompt), s.response_ids) for t in trajs for s in t.steps]
    tokens = sum(len(p) + len(r) for p, r in steps)
    with torch.no_grad():
        t0 = time.perf_counter()
        policy.score([p for p, _ in steps], [r for _, r in steps], rl["micro_batch_tokens"])
        result["score_tokens_per_s"] = round(tokens / (time.perf_counter() - t0))
    prompts = [s.prompt for t in trajs[:16] for s in t.steps[:1]]
    policy.batch_size = len(prompts)
    t0 = time.perf_counter()
    gens = policy.generate(prompts, temperature=1.0, max_new_tokens=args.response_tokens, seed=0)
    result["generate_tokens_per_s"] = round(sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0), 1)
    reference = gathered(trainer)
    del trainer, policy
    if device == "cuda":
        torch.cuda.empty_cache()
    result["fsdp2_full_ft"] = fsdp_update(cfg, full, tok, trajs, skills, device, reference)
    del reference
    result["full_ft_bf16_weights"], trainer = update(cfg, tok, full, trajs, skills, device, half)
    del trainer

    lora = params_from_dict({"rl": {**rl, "lora_r": 16, "learning_rate": 1e-5}})
    result["lora"], trainer = update(cfg, tok, lora, trajs, skills, device, half)
    result["all_on_device"] = all(result[k]["on_device"] for k in ("full_ft", "full_ft_bf16_weights", "lora"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
