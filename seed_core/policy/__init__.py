"""Policy backends: batched generation and per-token log-probs behind one protocol.

Prompts are user-message texts; each backend applies its model's chat template itself, so the same prompt
strings (and the skill-injected ones) work with the HF backend on CPU and a vLLM backend on GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Generation:
    text: str  # decoded response, cut right after the first stop string when one was hit
    token_ids: list[int]  # response token ids, same cut
    logprobs: list[float]  # log pi(token | prompt, previous tokens) at temperature 1, one per token id
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
    ) -> list[Generation]:
        """One response per prompt; temperature 0 means greedy."""
        ...

    def token_logprobs(self, prompts: Sequence[str], responses: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per-token log-probs (T=1) of the given response tokens under the given prompts: one 1-D tensor each."""
        ...
