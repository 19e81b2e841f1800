"""Sampling backends behind one protocol, `Sampler`: `hf.HFPolicy` (transformers) and `vllm.VLLMPolicy` (an
in-process engine); `make_sampler` picks one, so no caller names a backend's class.

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
    import torch

    from seed_core.config import Params, SamplingConfig
    from seed_core.policy.hf import HFPolicy


@dataclass
class Generation:
    text: str  # decoded response, cut right after the first stop string when one was hit
    token_ids: list[int]  # response token ids, same cut
    logprobs: list[float]  # the sampler's log-prob of each token id (HF: temperature 1; vLLM: the distribution sampled)
    finished: bool  # True when a stop string or EOS ended it, False when max_new_tokens cut it


class Sampler(Protocol):
    """What the rollouts, the analyzer and the evaluation sample from, whichever backend serves it."""

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

    def sync(self, model: torch.nn.Module) -> float:
        """Serve `model`'s current weights from now on (and wake a sleeping sampler); returns the seconds it took."""
        ...

    def reset_cache(self) -> None:
        """Forget every cached prompt, so the next pass starts as a fresh process would."""
        ...

    def sleep(self) -> None:
        """Free the accelerator memory the sampler holds until the next `sync` (a no-op where nothing is freed)."""
        ...

    def close(self) -> None:
        """Release the sampler's resources; it is not used again."""
        ...


def make_sampler(
    model_dir: Path | None,
    params: Params,
    gen: SamplingConfig,
    seed: int,
    max_new_tokens: int | None = None,
    learner: HFPolicy | None = None,
) -> Sampler:
    """The sampler `gen.backend` names for the checkpoint in `model_dir` (on `model.device`).

    `learner`: the trainer's own HF policy; the HF backend then samples from it (no second copy of the weights) and
    vLLM's prompts come from its encoder. Vision-language models are sampled by HF whatever the backend (vLLM takes
    no images here), with a warning. vLLM loads the weights from `model_dir` itself; `max_new_tokens` bounds every
    answer it will be asked for (default `gen.max_new_tokens`)."""
    from seed_core.models import load_for, load_tokenizer
    from seed_core.policy.hf import ChatEncoder, HFPolicy

    vision = learner.encoder.vision is not None if learner is not None else is_vision_dir(model_dir)
    if vision and gen.backend != "hf":
        warn_hf_only(model_dir or "the RL model")
    if gen.backend == "hf" or vision:
        if learner is not None:
            return learner
        model, tok = load_for(model_dir, params.model)
        return HFPolicy(model, tok, batch_size=gen.batch_size, max_prompt_tokens=gen.max_prompt_tokens)
    if model_dir is None:
        raise ValueError("rollout.backend vllm: the trainer needs the checkpoint folder to start the engine from")
    from seed_core.policy.vllm import VLLMPolicy

    encoder = learner.encoder if learner is not None else ChatEncoder(load_tokenizer(model_dir), gen.max_prompt_tokens)
    return VLLMPolicy.from_params(model_dir, encoder, params, seed, max_new_tokens or gen.max_new_tokens)


@contextmanager
def open_sampler(
    model_dir: Path, params: Params, gen: SamplingConfig, seed: int, max_new_tokens: int | None = None
) -> Iterator[Sampler]:
    """`make_sampler` for a checkpoint that must suit `env.observation`, closed on exit."""
    from seed_core.policy.vision import check_observation

    check_observation(params.env.observation, is_vision_dir(model_dir), model_dir)
    sampler = make_sampler(model_dir, params, gen, seed, max_new_tokens)
    try:
        yield sampler
    finally:
        sampler.close()


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
