"""This machine's roofline: the dense matmul ceiling of the model's shapes per dtype, and each pass of the pipeline as
a fraction of it; prints one JSON line.

Ceiling: the model's linear layers (q, k, v, o, gate, up, down, LM head) as plain `torch` matmuls of `--tokens`
rows (training, scoring, prefill) and of `--batch` rows (one decoding step of a batch), in fp32 and, where oneDNN
offers it, bf16; the FLOP-weighted throughput of all of them is that dtype's ceiling.

Passes, on synthetic steps of the embedded default's shape (a `--tokens`-token prompt and an `--answer`-token
response, the response alone carrying loss or scores), each measured side by side as the pipeline ran it before
the speed work (`before`) and as it runs now (`now`), and for the SFT step one switch at a time:
- sft_step: one warm-up/Stage-1 SFT example, LoRA forward and backward: before through trl's fused LM head (which
  without Triton, on a CPU, projects every position onto the vocabulary), now through the trainer's own loss
  (`sft.AnswerOnlyLoss`: the head on the answer positions only);
- score: a re-scoring pass (`sequence_logprobs` without grad, the LM head on response tokens only);
- update: the RL update's LoRA forward and backward over the same tokens;
- generate: HF `generate` of `--batch` prompts (the evaluation's HF backend; vLLM is `bench/rollout_throughput`).
Useful FLOPs count what the pass needs: 2 x params x tokens through the decoder, the attention scores, the LM head
only where a loss or a score needs it, and for a LoRA backward one more forward's worth (input gradients; the
frozen weights get none). A recomputed forward (gradient checkpointing) or an LM head over prompt positions is work
done but not useful, so it lowers the fraction. `fraction` = useful FLOP/s / the ceiling of the dtype the pass ran in.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from seed_core.models import CHECKPOINT_ABOVE_TOKENS, pick_dtype, use_checkpointing  # noqa: E402
from seed_core.policy.hf import sequence_logprobs  # noqa: E402
from seed_core.sft import AnswerOnlyLoss  # noqa: E402


def linear_shapes(cfg) -> list[tuple[int, int]]:
    """(in, out) of one layer's linear maps, then the LM head."""
    d, ff, kv = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads),
    )
    return [(d, d), (d, kv), (d, kv), (d, d), (d, ff), (d, ff), (ff, d)], (d, cfg.vocab_size)


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call (the ceiling's matmuls, milliseconds each)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ceiling(cfg, rows: int, dtype: torch.dtype, repeats: int) -> float:
    """GFLOP/s of the model's matmuls with `rows` rows in `dtype`, FLOP-weighted over the shapes."""
    layer, head = linear_shapes(cfg)
    flops = seconds = 0.0
    for k, n in [*layer, head]:
        a, b = torch.randn(rows, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        reps = 1 if (k, n) == head else cfg.num_hidden_layers
        flops += 2 * rows * k * n * reps
        seconds += timed(lambda a=a, b=b: a @ b, repeats) * reps
    return flops / seconds / 1e9


def forward_flops(cfg, length: int, head_positions: int) -> float:
    """Useful forward FLOPs of one sequence: linear maps, causal attention scores and values, the LM head."""
    layer, (d, vocab) = linear_shapes(cfg)
    body = sum(k * n for k, n in layer) * cfg.num_hidden_layers
    attention = 2 * cfg.num_hidden_layers * cfg.hidden_size * length * length  # QK^T and AV over the causal half
    return 2 * body * length + attention + 2 * d * vocab * head_positions


def lora_model(path: Path, dtype: torch.dtype):
    """The model with LoRA adapters as every stage trains it, and trl's fused LM head as SFTTrainer patches it in
    (`model(..., fused_lm_head=True)`)."""
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from seed_core.models import with_lora

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # what SFTTrainer asks for
    torch.manual_seed(0)
    model = with_lora(model, 16, 32)
    # enabled once, then switched per pass by `use_checkpointing`, as the RL update does
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def shared_prefix_fraction(tokenizer, files: list[str]) -> dict:
    """Of all step prompts' tokens (chat template applied), the share that lies in the prefix common to every step of
    the same game, less one copy per game: the tokens a scoring pass could skip by computing each game's prefix once."""
    from seed_core.policy.hf import ChatEncoder
    from seed_core.records import Trajectory, read_jsonl

    enc = ChatEncoder(tokenizer)
    by_game: dict[str, list[list[int]]] = {}
    for f in files:
        for t in read_jsonl(f, Trajectory):
            by_game.setdefault(t.game_id, []).extend(enc.encode_prompt(s.prompt) for s in t.steps)
    total = shared = 0
    for prompts in by_game.values():
        common = min(len(p) for p in prompts)
        for p in prompts[1:]:
            common = next((i for i, (a, b) in enumerate(zip(prompts[0][:common], p)) if a != b), common)
        total += sum(len(p) for p in prompts)
        shared += common * (len(prompts) - 1)
    return {"games": len(by_game), "prompt_tokens": total, "fraction": round(shared / max(total, 1), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=str(REPO / "models/base"), help="an HF folder of the model (default: models/base)"
    )
    ap.add_argument("--tokens", type=int, default=600, help="prompt tokens per step (the default's steps: ~550)")
    ap.add_argument("--answer", type=int, default=40, help="response tokens per step")
    ap.add_argument("--batch", type=int, default=16, help="prompts generated together (rollout.batch_size)")
    ap.add_argument("--new-tokens", type=int, default=16, help="tokens generated per prompt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--trajectories", nargs="*", default=[],
        help="trajectory .jsonl files (e.g. data/eval/warmup/*.jsonl): also report the share of their step prompts' "
        "tokens that every step of the same game repeats (what sharing a group's prompt prefix could save)",
    )  # fmt: skip
    args = ap.parse_args()
    path = Path(args.model)
    if not (path / "config.json").exists():
        sys.exit(f"no model at {path}: run `dvc repro prepare` first (or pass --model)")
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(path)
    dtypes = {"fp32": torch.float32} | (
        {"bf16": torch.bfloat16} if torch.ops.mkldnn._is_mkldnn_bf16_supported() else {}
    )
    length = args.tokens + args.answer
    ceilings = {
        name: {"train": ceiling(cfg, length, dt, args.repeats), "decode": ceiling(cfg, args.batch, dt, args.repeats)}
        for name, dt in dtypes.items()
    }
    auto = {torch.float32: "fp32", torch.bfloat16: "bf16"}[pick_dtype("auto")]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (1, length), generator=g)
    labels = ids.clone()
    labels[:, : args.tokens] = -100
    score_mask = torch.zeros_like(ids, dtype=torch.bool)
    score_mask[:, args.tokens :] = True
    attn = torch.ones_like(ids)
    useful_fwd = forward_flops(cfg, length, args.answer)

    def row(dtype: str, seconds: float, useful: float, tokens: int) -> dict:
        """A pass's throughput; its fraction of the `train` ceiling (prefill dominates even generation's FLOPs)."""
        return {
            "dtype": dtype,
            "tokens_per_s": round(tokens / seconds, 1),
            "gflops": round(useful / seconds / 1e9, 2),
            "fraction": round(useful / seconds / 1e9 / ceilings[dtype]["train"], 3),
        }

    models = {
        "fp32": lora_model(path, torch.float32),
        "bf16": lora_model(path, torch.bfloat16) if "bf16" in dtypes else None,
    }
    before_dtype = "bf16" if "bf16" in dtypes else "fp32"  # before: bf16 wherever oneDNN reported bf16 support

    def sft_step(weights: str, autocast: str, ckpt: bool, answer_only: bool = False):
        """An SFT step: trl's fused LM head, or the trainer's answer-only loss (`AnswerOnlyLoss`)."""
        model = models[weights].train()
        batch = {"input_ids": ids, "attention_mask": attn, "labels": labels}

        def run():
            use_checkpointing(model, ckpt)
            with torch.autocast("cpu", dtype=dtypes[autocast], enabled=autocast != weights):
                if answer_only:
                    loss = AnswerOnlyLoss().compute_loss(model, batch)
                else:
                    loss = -model(**batch, fused_lm_head=True).log_probs.sum()
            loss.backward()
            model.zero_grad(set_to_none=True)

        return run, autocast, 2 * useful_fwd, length

    def score(dt: str):
        def run():
            with torch.no_grad():
                sequence_logprobs(models[dt].eval(), ids, attn, score_mask)

        return run, dt, useful_fwd, length

    def update(dt: str, ckpt: bool):
        def run():
            model = models[dt].train()
            use_checkpointing(model, ckpt)
            sequence_logprobs(model, ids, attn, score_mask).sum().backward()
            model.zero_grad(set_to_none=True)

        return run, dt, 2 * useful_fwd, length

    prompts = torch.randint(0, cfg.vocab_size, (args.batch, args.tokens), generator=g)

    def generate(dt: str):
        def run():
            with torch.no_grad():
                models[dt].eval().generate(
                    input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                    max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=0,
                )  # fmt: skip

        # prefill of every prompt, then one decoding step per new token over the growing context
        useful = args.batch * (
            forward_flops(cfg, args.tokens, 1) + (args.new_tokens - 1) * forward_flops(cfg, 1, 1)
            + 2 * cfg.num_hidden_layers * cfg.hidden_size * 2 * args.tokens * (args.new_tokens - 1)
        )  # fmt: skip
        return run, dt, useful, args.batch * args.new_tokens

    lora_weights = "bf16" if auto == "bf16" else "fp32"
    plan = {
        # SFT before: fp32 weights and matmuls under trl's default gradient checkpointing and its fused head; one
        # switch at a time; now: LoRA over frozen weights in the `auto` dtype (adapters fp32), checkpointing by
        # need, the head on the answer positions only
        "sft_step": {
            "before": sft_step("fp32", "fp32", True),
            "no_checkpointing": sft_step("fp32", "fp32", False),
            f"autocast_{auto}": sft_step("fp32", auto, True),
            f"weights_{auto}": sft_step(lora_weights, lora_weights, True),
            "answer_only_head": sft_step("fp32", "fp32", True, answer_only=True),
            "now": sft_step(lora_weights, lora_weights, length > CHECKPOINT_ABOVE_TOKENS, answer_only=True),
        },
        "score": {"before": score(before_dtype), "now": score(auto)},
        "update": {"before": update(before_dtype, True), "now": update(auto, length > CHECKPOINT_ABOVE_TOKENS)},
        "generate": {"before": generate(before_dtype), "now": generate(auto)},
    }
    # Interleaved rounds, the median per variant: a slow spell of the machine hits every variant alike.
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.repeats + 1):
        for pass_name, variants in plan.items():
            for name, (run, *_rest) in variants.items():
                t0 = time.perf_counter()
                run()
                if r:  # round 0 warms every kernel up
                    times.setdefault((pass_name, name), []).append(time.perf_counter() - t0)
    rows = {
        p: {n: row(dt, statistics.median(times[p, n]), useful, tokens) for n, (_, dt, useful, tokens) in v.items()}
        for p, v in plan.items()
    }
    for r in rows.values():
        r["speedup"] = round(r["now"]["tokens_per_s"] / r["before"]["tokens_per_s"], 2)
    print(
        json.dumps(
            {
                "bench": "roofline",
                "threads": torch.get_num_threads(),
                "auto_dtype": auto,
                # beside auto_dtype: checks `models.cpu_bf16_faster`'s feature rule on a new kind of CPU
                "bf16_over_fp32": (
                    round(ceilings["bf16"]["train"] / ceilings["fp32"]["train"], 2) if "bf16" in ceilings else None
                ),
                "ceiling_gflops": {k: {kk: round(vv, 1) for kk, vv in v.items()} for k, v in ceilings.items()},
                "shape": {"prompt_tokens": args.tokens, "answer_tokens": args.answer, "batch": args.batch},
                "passes": rows,
                **(
                    {"shared_prefix": shared_prefix_fraction(AutoTokenizer.from_pretrained(path), args.trajectories)}
                    if args.trajectories
                    else {}
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
