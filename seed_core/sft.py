"""Supervised fine-tuning on (user prompt -> assistant answer) pairs, loss on the answer tokens only.

One routine for every SFT in the pipeline: the warm-up (behaviour cloning of expert steps) and Stage 1 of
SEED (the analyzer SFT: analyzer prompt -> skill JSON; the paper trains 3 epochs and does not publish the
learning rate or batch size). It is trl's SFTTrainer on a conversational prompt-completion dataset, with
`completion_only_loss=True` set explicitly: trl renders prompt+completion with the model's chat template and
labels only the tokens after the rendered prompt (which ends with the assistant header), i.e. the answer
text and the end-of-turn tokens. The prompt is the same chat-templated user message that the policy
backend encodes at generation time, so the model is trained in exactly the context it acts in.

Full fine-tuning or LoRA (peft, on every linear layer); a LoRA run is merged into the base weights, so the
output is always a plain safetensors HF folder that every later stage (and vLLM) loads as is; the adapter
is kept beside it in `adapter/`. On CPU the batch is built by gradient accumulation over single examples,
which wastes no compute on padding (step prompts range from ~400 to ~1,300 tokens); on GPU it is one
padded micro-batch.

A vision-language model's examples, with an "image" or without (the perception warm-up, behaviour cloning on
visual Sokoban, Stage 1's analyzer examples mixed with image rehearsal steps), are tokenized by the policy's own
encoder (`image_rows`: the prompt ids it samples with, then the chat template's assistant turn) and trained by
transformers' Trainer with `ImageCollator`, which adds the pixels; the settings, the metrics and the output are
the same as above. LoRA adapts the language model only; the vision encoder trains in full or stays frozen
(`train_vision`).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from seed_core.config import SFTSettings
from seed_core.models import CHECKPOINT_ABOVE_TOKENS
from seed_core.records import DataError, publish_dir

IGNORE = -100  # label of a token that carries no loss


def to_conversational(examples: list[dict]):
    """An HF dataset in trl's conversational prompt-completion form (extra keys are dropped)."""
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": x["prompt"]}],
                "completion": [{"role": "assistant", "content": x["completion"]}],
            }
            for x in examples
        ]
    )


# The dataset-shaping settings, shared by the trainer's config and by `prepare`.
DATA_ARGS = dict(
    # Loss on the answer only, stated rather than left to trl's dataset-type default.
    completion_only_loss=True,
    assistant_only_loss=False,
    packing=False,
    shuffle_dataset=False,  # the trainer's sampler shuffles every epoch
    dataset_num_proc=None,
)


def sft_args(out_dir: Path, settings: SFTSettings, cpu: bool):
    from trl import SFTConfig

    s = settings
    micro = 1 if cpu else s.batch_size
    return SFTConfig(
        # trl turns it on by default; recomputing costs a forward pass, needed only for long micro-batches
        gradient_checkpointing=micro * s.max_seq_len > CHECKPOINT_ABOVE_TOKENS,
        output_dir=str(out_dir),
        num_train_epochs=s.epochs,
        learning_rate=s.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=0.05,  # a float below 1 is a ratio of the total steps
        per_device_train_batch_size=micro,
        per_device_eval_batch_size=micro,
        gradient_accumulation_steps=s.batch_size // micro,
        max_grad_norm=1.0,
        weight_decay=0.0,
        max_length=s.max_seq_len,
        **DATA_ARGS,
        save_strategy="no",
        eval_strategy="no",  # evaluated explicitly before and after training
        logging_strategy="steps",
        logging_steps=1,
        report_to="none",
        seed=s.seed,
        data_seed=s.seed,
        use_cpu=cpu,
        # bf16 autocast over fp32 weights on GPUs; on CPU it measured slower than fp32 (casts dominate).
        bf16=not cpu and torch.cuda.is_bf16_supported(),
        dataloader_num_workers=0,
        remove_unused_columns=True,
    )


def prepare(tokenizer, examples: list[dict]) -> dict[str, list[list[int]]]:
    """{"input_ids", "labels"} of each example as SFTTrainer trains conversational prompt-completion data with
    the loss on the completion only: the prompt is the chat template of the user message up to the assistant
    header, and every later token of the whole exchange's template (the answer and its end of turn) is labelled.
    `tests/test_sft.py` holds this to the trainer's own prepared dataset."""
    rows: dict[str, list[list[int]]] = {"input_ids": [], "labels": []}
    for x in examples:
        user = [{"role": "user", "content": x["prompt"]}]
        prompt = _token_ids(tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=True))
        exchange = user + [{"role": "assistant", "content": x["completion"]}]
        full = _token_ids(tokenizer.apply_chat_template(exchange, tokenize=True))
        rows["input_ids"].append(full)
        rows["labels"].append([IGNORE] * len(prompt) + full[len(prompt) :])
    return rows


def _token_ids(encoded) -> list[int]:
    return list(encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded)


def completion_mask(tokenizer, example: dict) -> tuple[list[int], list[bool]]:
    """(input_ids, mask) of one example as trained: mask[i] is True where token i carries loss."""
    row = prepare(tokenizer, [example])
    return row["input_ids"][0], [label != IGNORE for label in row["labels"][0]]


def _fitting(tokenizer, examples: list[dict], max_seq_len: int, vision=None) -> list[dict]:
    if not examples:
        return []
    if vision is not None:
        from seed_core.policy.hf import ChatEncoder

        lengths = [len(r["input_ids"]) for r in image_rows(ChatEncoder(tokenizer, vision=vision), examples)]
    else:
        lengths = [len(r) for r in prepare(tokenizer, examples)["input_ids"]]
    return [x for x, n in zip(examples, lengths) if n <= max_seq_len]


def answer_ids(tokenizer, completion: str) -> list[int]:
    """Token ids of the assistant turn `completion` as the chat template renders it after the generation prompt
    (the answer and its end-of-turn tokens)."""
    user = [{"role": "user", "content": "?"}]
    head = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": completion}], tokenize=False)
    if not full.startswith(head):
        raise ValueError("the chat template renders an assistant turn that does not extend its generation prompt")
    return list(tokenizer(full[len(head) :], add_special_tokens=False)["input_ids"])


def image_rows(encoder, examples: list[dict]) -> list[dict]:
    """{"input_ids", "labels", "index"} of image examples: the prompt ids are `encoder.encode_full(prompt, image)`,
    the ids the policy samples with, and only the answer carries loss."""
    rows = []
    for i, x in enumerate(examples):
        prompt, answer = encoder.encode_full(x["prompt"], x.get("image")), answer_ids(encoder.tok, x["completion"])
        rows.append({"input_ids": prompt + answer, "labels": [IGNORE] * len(prompt) + answer, "index": i})
    return rows


class ImageCollator:
    """Right-padded ids, labels and attention mask of a batch of `image_rows`, plus its pixels."""

    def __init__(self, pad_id: int, vision, images: list):
        self.pad_id, self.vision, self.images = pad_id, vision, images

    def __call__(self, rows: list[dict]) -> dict:
        width = max(len(r["input_ids"]) for r in rows)

        def padded(key: str, fill: int) -> torch.Tensor:
            return torch.tensor([r[key] + [fill] * (width - len(r[key])) for r in rows])

        mask = torch.tensor([[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"])) for r in rows])
        images = [self.images[r["index"]] for r in rows]
        pixels = self.vision.pixels(images) if any(im is not None for im in images) else {}
        return {
            "input_ids": padded("input_ids", self.pad_id),
            "attention_mask": mask,
            "labels": padded("labels", IGNORE),
            **pixels,
        }


class AnswerOnlyLoss:
    """Trainer mixin: trl's SFT loss (minus the summed answer-token log-probs over the answer tokens of the optimizer
    step) with the LM head computed on the answer positions only.

    trl's fused head scores only the labelled positions where Triton runs (a GPU); elsewhere it projects every
    position onto the 49k vocabulary, in the forward and again in the backward: 46 % of a warm-up SFT step on the
    2-core CPU. `sequence_logprobs`, the forward of every scoring and training pass, projects the answer positions only.
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from seed_core.policy.hf import sequence_logprobs

        scored = inputs["labels"] != IGNORE  # (B, L): the answer tokens; labels equal input_ids there
        pixels = {k: v for k, v in inputs.items() if k.startswith(PIXEL_KEYS)}
        logprobs = sequence_logprobs(model, inputs["input_ids"], inputs["attention_mask"], scored, pixels=pixels)
        # Like trl: over the optimizer step's answer tokens when the trainer counts them (gradient accumulation),
        # else over this batch's (the trainer then divides by the accumulation steps).
        tokens = scored[:, 1:].sum() if num_items_in_batch is None else num_items_in_batch
        loss = -logprobs.sum() / torch.as_tensor(tokens).clamp(min=1)
        return (loss, {"log_probs": logprobs}) if return_outputs else loss


PIXEL_KEYS = ("pixel_values", "pixel_attention_mask", "image_grid_thw")  # what `VisionInputs.pixels` returns


def make_image_trainer(
    model,
    tokenizer,
    train: list[dict],
    eval: list[dict] | None,
    args,
    *,
    lora: tuple[int, int] | None,
    train_vision: bool,
    callbacks: tuple = (),
):
    """transformers' Trainer over image examples ({"prompt", "completion", "image"}; text-only ones may be mixed in),
    with `train_sft`'s `args`."""
    from datasets import Dataset
    from transformers import Trainer

    from seed_core.models import freeze_vision, with_lora
    from seed_core.policy.hf import ChatEncoder
    from seed_core.policy.vision import vision_inputs

    vision = vision_inputs(model.config)
    encoder = ChatEncoder(tokenizer, vision=vision)
    if lora is not None:
        model = with_lora(model, *lora, train_vision=train_vision)
    else:
        freeze_vision(model, not train_vision)
    args.remove_unused_columns = False  # the collator reads "index"
    examples = train + (eval or [])
    rows = image_rows(encoder, examples)

    class ImageTrainer(AnswerOnlyLoss, Trainer):
        pass

    return ImageTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows[: len(train)]),
        eval_dataset=Dataset.from_list(rows[len(train) :]) if eval else None,
        data_collator=ImageCollator(tokenizer.pad_token_id, vision, [x.get("image") for x in examples]),
        processing_class=tokenizer,
        callbacks=list(callbacks),
    )


def make_trainer(
    model,
    tokenizer,
    train: list[dict],
    eval: list[dict] | None,
    work_dir: Path,
    settings: SFTSettings,
    *,
    device: str = "cpu",
    callbacks: tuple = (),
):
    """The SFTTrainer `train_sft` runs on `device` (exposed so tests can inspect its prepared datasets)."""
    from trl import SFTTrainer

    from seed_core.models import lora_config

    s = settings
    peft_config = lora_config(model, s.lora_r, s.lora_alpha) if s.lora_r is not None else None

    class AnswerSFTTrainer(AnswerOnlyLoss, SFTTrainer):
        pass

    return AnswerSFTTrainer(
        model=model,
        args=sft_args(work_dir, settings, cpu=device == "cpu"),
        train_dataset=to_conversational(train),
        eval_dataset=to_conversational(eval) if eval else None,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=list(callbacks),
    )


def train_sft(
    model_path: Path,
    train: list[dict],
    eval: list[dict] | None,
    out_dir: Path,
    settings: SFTSettings,
    *,
    device: str = "cpu",
    dtype: str = "auto",
    log: Callable[[dict], None] | None = None,
    train_vision: bool = True,
) -> dict:
    """Fine-tune `model_path` on `train` ({"prompt", "completion"} dicts, each with an "image" for a vision model)
    and write the result to `out_dir`.

    `settings.lora_r` None is full fine-tuning; `train_vision` trains a vision model's encoder (else it is frozen); `device`
    is "cpu" or "cuda" (bf16 autocast over the fp32 weights). LoRA on a CPU trains over frozen weights in the dtype
    `pick_dtype(dtype)` chooses (bf16 where the CPU computes it faster; peft keeps the adapters fp32) and merges the
    adapters into the fp32 weights at the end. `log` receives every logged training dict. Returns metrics: train loss (trainer mean over the run, first and last
    logged step), eval loss before and after when `eval` is given, examples, tokens, answer tokens, examples
    dropped for exceeding `max_seq_len`, seconds.
    """
    from transformers import AutoConfig, AutoTokenizer, TrainerCallback, set_seed

    from seed_core.models import auto_class, pick_dtype, save_adapter
    from seed_core.policy.vision import vision_inputs

    if not train:
        raise ValueError("train_sft: no training examples")
    t0 = time.perf_counter()
    s = settings
    set_seed(s.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    config = AutoConfig.from_pretrained(model_path)
    vision = vision_inputs(config)  # a vision model trains on the image path, text-only rows included
    # Trained weights are fp32 master weights (AdamW on bf16 rounds small updates away). Frozen weights under LoRA
    # may run in bf16 on a CPU that computes it faster: 1.6x the SFT step of fp32 on the 2-core EPYC (bf16 autocast
    # over fp32 weights: 1.4x, the casts cost). A vision model's encoder trains in full, so it stays fp32.
    frozen = pick_dtype(dtype, device) if s.lora_r is not None and device == "cpu" and vision is None else torch.float32
    model = auto_class(model_path).from_pretrained(model_path, dtype=frozen, use_safetensors=True)

    class _Log(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if log and logs:
                log({"step": state.global_step, **logs})

    # Over-long examples are dropped, not truncated: a prompt cut at either end is not one the policy acts
    # on, and a cut answer teaches no end of turn (trl's keep-the-end truncation is deprecated).
    n_train, n_eval = len(train), len(eval or [])
    train, eval = (
        _fitting(tokenizer, train, s.max_seq_len, vision),
        _fitting(tokenizer, eval or [], s.max_seq_len, vision) or None,
    )
    if not train:
        raise ValueError(f"train_sft: every training example is longer than max_seq_len={s.max_seq_len}; raise it")
    metrics: dict = {"data/dropped_too_long": n_train - len(train) + n_eval - len(eval or [])}
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.work.", dir=out_dir.parent))
    try:
        if vision is not None:
            args = sft_args(work, s, cpu=device == "cpu")
            lora = (s.lora_r, s.lora_alpha) if s.lora_r is not None else None
            trainer = make_image_trainer(
                model, tokenizer, train, eval, args, lora=lora, train_vision=train_vision, callbacks=(_Log(),)
            )
        else:
            trainer = make_trainer(model, tokenizer, train, eval, work, s, device=device, callbacks=(_Log(),))
        ds = trainer.train_dataset
        metrics |= {
            "data/examples": len(train),  # after dropping over-long ones
            "data/tokens": sum(len(r) for r in ds["input_ids"]),
            "data/answer_tokens": sum(sum(t != IGNORE for t in r) for r in ds["labels"]),
            "data/eval_examples": len(eval or []),
        }
        if eval:
            metrics["eval/loss_before"] = trainer.evaluate()["eval_loss"]
        result = trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        metrics |= {
            "train/loss": result.training_loss,
            "train/loss_first": losses[0] if losses else math.nan,
            "train/loss_last": losses[-1] if losses else math.nan,
            "train/optimizer_steps": trainer.state.global_step,
        }
        if eval:
            metrics["eval/loss_after"] = trainer.evaluate()["eval_loss"]

        def write(tmp: Path) -> None:
            model = trainer.model
            if s.lora_r is not None:
                save_adapter(model, tmp / "adapter")
                if (
                    frozen != torch.float32
                ):  # the adapters merge into the fp32 weights: the checkpoint is full precision
                    from peft import PeftModel

                    full = auto_class(model_path).from_pretrained(model_path, dtype=torch.float32, use_safetensors=True)
                    model = PeftModel.from_pretrained(full, tmp / "adapter")
                model = model.merge_and_unload()
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)

        publish_dir(out_dir, write)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    metrics["time/train_s"] = round(time.perf_counter() - t0, 1)
    return metrics


# ---------------------------------------------------------------- the analyzer SFT set on disk (build_sft_data -> train_analyzer)

SFT_COLUMNS = ("prompt", "completion", "traj_id", "game_id", "task_type", "outcome")
SFT_SPLITS = ("train", "validation")


def write_dataset(rows: dict[str, list[dict[str, str]]], path: Path) -> None:
    from datasets import Dataset, DatasetDict, Features, Value

    features = Features({c: Value("string") for c in SFT_COLUMNS})
    # Column-wise, so a split left without examples (every teacher answer for its games dropped) is an empty
    # split with the right columns rather than an error (`from_list([])` cannot see the columns).
    DatasetDict(
        {k: Dataset.from_dict({c: [r[c] for r in rows[k]] for c in SFT_COLUMNS}, features=features) for k in SFT_SPLITS}
    ).save_to_disk(str(path))


def load_examples(sft_dir: str | Path) -> dict[str, list[dict[str, str]]]:
    """{split: rows} of a folder written by `run_build_sft_data`."""
    from datasets import load_from_disk

    path = Path(sft_dir) / "dataset"
    if not (path / "dataset_dict.json").exists():
        raise DataError(f"no SFT dataset at {path}; run the build_sft_data stage (`dvc repro build_sft_data`)")
    dd = load_from_disk(str(path))
    return {k: dd[k].to_list() for k in SFT_SPLITS}
