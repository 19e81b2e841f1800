"""SFT routine: the answer-only loss mask token by token, loss going down, and the saved model folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seed_core.config import SFTSettings
from seed_core.sft import IGNORE, completion_mask, make_trainer, prepare, train_sft

EXAMPLE = {
    "prompt": "Your task is to: put a mug in cabinet.\nAct now.",
    "completion": "<think>Find the mug.</think>\n<action>go to shelf 1</action>",
}


@pytest.fixture(scope="module")
def tok(base_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_model_dir)


@pytest.fixture(scope="module")
def tiny_dir(tok, tmp_path_factory) -> Path:
    """A tiny random-init llama with the real tokenizer, saved as an HF folder (train_sft loads from disk)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    d = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    return d


def _chat(tok, ex: dict, with_answer: bool) -> list[int]:
    msgs = [{"role": "user", "content": ex["prompt"]}]
    if with_answer:
        msgs.append({"role": "assistant", "content": ex["completion"]})
    out = tok.apply_chat_template(msgs, add_generation_prompt=not with_answer, tokenize=True, return_dict=False)
    return list(out["input_ids"] if isinstance(out, dict) else out)


def test_mask_covers_exactly_the_answer_tokens(tok):
    ids, mask = completion_mask(tok, EXAMPLE)
    prompt_ids = _chat(tok, EXAMPLE, with_answer=False)  # what the policy backend feeds at generation time
    assert ids == _chat(tok, EXAMPLE, with_answer=True)
    assert ids[: len(prompt_ids)] == prompt_ids
    for i, (t, m) in enumerate(zip(ids, mask)):
        # every prompt token (system, user turn, assistant header) is masked; every later token carries loss
        assert m == (i >= len(prompt_ids)), (i, tok.decode([t]), m)
    answer = tok.decode([t for t, m in zip(ids, mask) if m])
    assert answer == EXAMPLE["completion"] + "<|im_end|>\n"  # the end-of-turn token is learned too


def test_mask_is_the_one_the_trainer_trains_on(tok, tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    other = {"prompt": "Short one.", "completion": "<think>x</think>\n<action>look</action>"}
    trainer = make_trainer(
        AutoModelForCausalLM.from_pretrained(tiny_dir),
        tok,
        [EXAMPLE, other],
        None,
        tmp_path,
        SFTSettings(epochs=1, learning_rate=1e-3, batch_size=2, lora_r=None, lora_alpha=16, max_seq_len=512, seed=0),
    )
    assert trainer.completion_only_loss is True
    for row, ex in zip(trainer.train_dataset, [EXAMPLE, other]):
        ids, mask = completion_mask(tok, ex)
        assert row["input_ids"] == ids
        assert [label != IGNORE for label in row["labels"]] == mask
        assert all(label in (IGNORE, t) for label, t in zip(row["labels"], ids))


def _dataset(n: int, offset: int = 0) -> list[dict]:
    # A fixed template with one varying slot: learnable by a tiny model in a few steps, and held-out rows
    # share the template, so validation loss must fall when training works.
    objs = ["mug", "apple", "book", "pen", "cup", "knife", "plate", "bowl", "vase", "key", "box", "egg"]
    return [
        {
            "prompt": f"Your task is to: find the {objs[(i + offset) % len(objs)]}.",
            "completion": f"<think>I need to find the {objs[(i + offset) % len(objs)]}.</think>\n<action>go to shelf {i % 3 + 1}</action>",
        }
        for i in range(n)
    ]


# LoRA cannot move a random-init model's tied embedding, so its loss falls less than full fine-tuning's.
# LoRA over bf16 frozen weights (what `auto` picks on a CPU that computes bf16 faster) still saves fp32 weights.
@pytest.mark.parametrize(
    "lora_r,lr,drop,dtype",
    [(None, 1e-2, 1.0, "auto"), (8, 3e-2, 0.2, "float32"), (8, 3e-2, 0.2, "bfloat16")],
    ids=["full", "lora", "lora-bf16-frozen"],
)
def test_training_lowers_validation_loss_and_saves_a_plain_model(tiny_dir, tmp_path, lora_r, lr, drop, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "out"
    logged = []
    too_long = {"prompt": "word " * 300, "completion": "<think>x</think>\n<action>look</action>"}
    m = train_sft(
        tiny_dir,
        _dataset(16) + [too_long],
        _dataset(4, offset=16),
        out,
        SFTSettings(epochs=3, learning_rate=lr, batch_size=4, lora_r=lora_r, lora_alpha=16, max_seq_len=128, seed=0),
        dtype=dtype,
        log=logged.append,
    )
    assert m["eval/loss_after"] < m["eval/loss_before"] - drop, m
    assert m["train/loss_last"] < m["train/loss_first"], m
    assert m["data/examples"] == 16 and m["data/eval_examples"] == 4 and m["data/dropped_too_long"] == 1
    assert m["train/optimizer_steps"] == 12 and any("loss" in d for d in logged)
    assert m["data/answer_tokens"] < m["data/tokens"]

    assert (out / "model.safetensors").exists() and not list(out.glob("*.bin"))
    assert (out / "adapter").is_dir() == (lora_r is not None)
    assert not list(tmp_path.glob(".out.*"))  # temp folders of the atomic write are gone
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    model = AutoModelForCausalLM.from_pretrained(out, use_safetensors=True)  # plain model: merged, no peft
    assert not any("lora" in n for n, _ in model.named_parameters())
    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert not torch.equal(model.model.layers[0].mlp.down_proj.weight, base.model.layers[0].mlp.down_proj.weight)
    if lora_r is not None:  # the merged weights compute what base + adapter computes
        from peft import PeftModel

        x = torch.tensor([[1, 2, 3, 4, 5]])
        with torch.no_grad():
            expected = PeftModel.from_pretrained(base, out / "adapter")(input_ids=x).logits
            assert torch.allclose(model(input_ids=x).logits, expected, atol=1e-4)
    assert AutoTokenizer.from_pretrained(out).eos_token == "<|im_end|>"


def test_no_usable_training_examples_is_an_error(tiny_dir, tmp_path):
    kw = dict(epochs=1, learning_rate=1e-3, batch_size=1, lora_r=None, lora_alpha=16, seed=0)
    with pytest.raises(ValueError, match="no training examples"):
        train_sft(tiny_dir, [], None, tmp_path / "o", SFTSettings(max_seq_len=64, **kw))
    with pytest.raises(ValueError, match="longer than max_seq_len=8; raise it"):
        train_sft(tiny_dir, _dataset(2), None, tmp_path / "o", SFTSettings(max_seq_len=8, **kw))
    assert not (tmp_path / "o").exists()


def test_prepare_drops_nothing_and_tokenizes_every_row(tok):
    rows = prepare(tok, _dataset(5))
    assert len(rows["input_ids"]) == 5 and all(any(label != IGNORE for label in r) for r in rows["labels"])


def test_sft_recomputes_activations_only_for_long_micro_batches(tmp_path):
    """trl checkpoints by default; here only a micro-batch above CHECKPOINT_ABOVE_TOKENS does (a CPU: one example)."""
    from seed_core.models import CHECKPOINT_ABOVE_TOKENS
    from seed_core.sft import sft_args

    def ckpt(max_seq_len, cpu):
        settings = SFTSettings(epochs=1, learning_rate=1e-3, batch_size=4, max_seq_len=max_seq_len, seed=0)
        return sft_args(tmp_path, settings, cpu=cpu).gradient_checkpointing

    assert not ckpt(1024, cpu=True) and not ckpt(CHECKPOINT_ABOVE_TOKENS, cpu=True)
    assert ckpt(CHECKPOINT_ABOVE_TOKENS + 1, cpu=True)
    assert ckpt(2048, cpu=False)  # a GPU's micro-batch is the whole batch: 4 x 2,048 tokens


@pytest.mark.parametrize("num_items", [None, 40])
def test_answer_only_head_gives_trls_loss_and_gradients(tok, tiny_dir, tmp_path, num_items):
    """The trainer's loss projects only the answer positions; trl's own (its fused head, which on a CPU projects every
    position) gives the same loss and gradients on a padded batch, with and without an optimizer-step token count."""
    from transformers import AutoModelForCausalLM
    from trl import SFTTrainer

    trainer = make_trainer(
        AutoModelForCausalLM.from_pretrained(tiny_dir),
        tok,
        _dataset(3),
        None,
        tmp_path,
        SFTSettings(epochs=1, learning_rate=1e-3, batch_size=3, lora_r=4, lora_alpha=8, max_seq_len=512, seed=0),
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    assert (batch["attention_mask"] == 0).any()  # rows of different lengths: right padding is exercised
    model = trainer.model.train()

    def loss_and_grads(compute_loss):
        model.zero_grad()
        loss = compute_loss(trainer, model, dict(batch), num_items_in_batch=num_items)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]

    ours, ours_grads = loss_and_grads(type(trainer).compute_loss)
    trls, trls_grads = loss_and_grads(SFTTrainer.compute_loss)
    assert type(trainer).compute_loss is not SFTTrainer.compute_loss
    torch.testing.assert_close(ours, trls, rtol=1e-5, atol=1e-6)
    assert ours_grads and any(g.abs().sum() > 0 for g in ours_grads)
    for a, b in zip(ours_grads, trls_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
