"""Sampling backends behind one protocol: `hf.HFPolicy` (transformers) and `vllm.VLLMPolicy` (an in-process engine).

Prompts are user-message texts; every backend turns them into token ids with the same `hf.ChatEncoder`, so the
sampled prompt tokens are the ones the trainer re-scores. Scoring (pi_old, reference, teacher log-probs) and the
update always run on `HFPolicy.score`, the trainer's own forward pass, whichever backend sampled.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from seed_core.config import Params, SamplingConfig


@dataclass
class Generation:
    text: str  # decoded response, cut right after the first stop string when one was hit
    token_ids: list[int]  # response token ids, same cut
    logprobs: list[float]  # the sampler's log-prob of each token id (HF: temperature 1; vLLM: the distribution sampled)
    finished: bool  # True when a stop string or EOS ended it, False when max_new_tokens cut it


class Policy(Protocol):
    def generate(
        self,
        prompts: Sequence[str],
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        stop: Sequence[str] = (),
        seed: int | None = None,
        images: Sequence | None = None,
    ) -> list[Generation]:
        """One response per prompt; temperature 0 means greedy. `images[i]`: prompt i's image (vision models)."""
        ...


@contextmanager
def open_sampler(
    model_dir: Path, params: Params, gen: SamplingConfig, seed: int, max_new_tokens: int | None = None
) -> Iterator[Policy]:
    """The sampler `gen.backend` names for the checkpoint in `model_dir` (on `model.device`), shut down on exit.

    vLLM loads the weights itself; its prompts still come from the trainer's encoder (the checkpoint's tokenizer).
    `max_new_tokens` bounds every answer the engine will be asked for (default `gen.max_new_tokens`)."""
    from seed_core.models import load_for, load_tokenizer
    from seed_core.policy.hf import ChatEncoder, HFPolicy
    from seed_core.policy.vision import check_observation

    vision = is_vision_dir(model_dir)
    check_observation(params.env.observation, vision, model_dir)
    if vision and gen.backend != "hf":
        warn_hf_only(model_dir)
    if gen.backend == "hf" or vision:
        model, tok = load_for(model_dir, params.model)
        yield HFPolicy(model, tok, batch_size=gen.batch_size, max_prompt_tokens=gen.max_prompt_tokens)
        return
    from seed_core.policy.vllm import VLLMPolicy

    encoder = ChatEncoder(load_tokenizer(model_dir), gen.max_prompt_tokens)
    engine = VLLMPolicy.from_params(model_dir, encoder, params, seed, max_new_tokens or gen.max_new_tokens)
    try:
        yield engine
    finally:
        engine.close()


def is_vision_dir(model_dir: Path) -> bool:
    """Whether the checkpoint in `model_dir` is a vision-language model (its config has a `vision_config`)."""
    import json

    config = Path(model_dir) / "config.json"
    return config.exists() and "vision_config" in json.loads(config.read_text())


def warn_hf_only(model_dir: Path) -> None:
    """Say that the vision-language model in `model_dir` is sampled by the HF backend: the vLLM path takes no
    images in this project yet."""
    import warnings

    warnings.warn(
        f"{model_dir} is a vision-language model; the vLLM backend takes no images in this project, so the HF "
        "backend samples it (set the backend to hf to silence this)",
        stacklevel=3,
    )
