"""Hugging Face backend: batched generation with per-token log-probs, and batched re-scoring.

Generation buckets prompts by token length before batching (padding to the longest prompt of a random
batch wasted a third of the prefill here), left-pads each bucket, runs `generate` with the KV cache and stops
a sequence at the first stop string or EOS. The returned log-probs are the model's temperature-1 log-probs of
the sampled tokens (raw logits, before temperature/top-p warping), which is what PPO's ratio and SEED's
re-scoring compare against. They are gathered step by step while generating (`_SampledLogprobs`), so only one
step's (B, V) log-softmax is alive at a time instead of all T steps' logits.

Scoring (`sequence_logprobs`) never materializes full-vocabulary logits for the whole batch: it runs the
decoder once, keeps the hidden states of the scored positions only, and projects them to the vocabulary in
chunks (each chunk under activation checkpointing when gradients are on).

Vision-language models take one image per prompt (`images=`): the prompt's IMAGE_MARK becomes the model's image
tokens (`policy.encoder.vision`) and every forward pass over it gets the same pixels.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import torch
from torch.utils.checkpoint import checkpoint
from transformers import LogitsProcessor, LogitsProcessorList

from seed_core import distributed
from seed_core.policy import Generation
from seed_core.policy.vision import IMAGE_MARK, VisionError, vision_inputs
from seed_core.runtime import derive_seed


def _chunks(seq: list[int], size: int) -> list[list[int]]:
    return [seq[i : i + size] for i in range(0, len(seq), size)]


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Consecutive index groups whose padded size (count x longest) stays within `max_tokens` (one item at least)."""
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if cur and max(longest, n) * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    return batches


def _chunked_token_logprobs(
    lm_head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, chunk: int
) -> torch.Tensor:
    """log softmax(lm_head(hidden))[targets] for hidden (N, H), targets (N,) -> (N,) float32."""

    def one(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = lm_head(h).float()
        return logits.gather(-1, t[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)

    out = []
    for s in range(0, hidden.shape[0], chunk):
        h, t = hidden[s : s + chunk], targets[s : s + chunk]
        out.append(checkpoint(one, h, t, use_reentrant=False) if torch.is_grad_enabled() else one(h, t))
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)


class _SampledLogprobs(LogitsProcessor):
    """Collects log pi(sampled token) at temperature 1 during `generate`, holding one step's (B, V) log-softmax.

    Keeping `output_logits` instead holds (B, T, V): 16 analyses x 384 tokens x 49,152 is 1.2 GB in fp32, most of
    an RL process's peak memory. Step k's processor call sees the token sampled at step k-1 as the last input id;
    `generate` puts custom processors ahead of the temperature/top-p warpers, so the scores here are raw.
    """

    def __init__(self) -> None:
        self.prev: torch.Tensor | None = None  # (B, V) log-softmax of the latest step
        self.taken: list[torch.Tensor] = []  # T-1 tensors (B,)

    def _take(self, tokens: torch.Tensor) -> None:
        if self.prev is not None:
            self.taken.append(self.prev.gather(-1, tokens[:, None]).squeeze(-1))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1])
        self.prev = scores.float().log_softmax(-1)
        return scores

    def finish(self, new: torch.Tensor) -> torch.Tensor:
        """new: (B, T) generated ids -> (B, T) their log-probs."""
        self._take(new[:, -1])
        self.prev = None
        return torch.stack(self.taken, dim=1)


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    score_mask: torch.Tensor,
    chunk: int = 512,
    pixels: dict | None = None,
) -> torch.Tensor:
    """Log-probs of the tokens marked in `score_mask`.

    input_ids, attention_mask, score_mask: (B, L), right-padded; score_mask[b, p] marks token p as scored
    (p >= 1), predicted from position p - 1. `pixels`: a vision-language model's image inputs, one image per
    row. Returns (B, L) float32, zero where not scored. Differentiable when grad is enabled.
    """
    if pixels:  # the multimodal base model merges the image features in (positions: its own, right padding)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # under peft: LoRA stays in
        hidden = base.model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **pixels
        ).last_hidden_state
    else:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = model.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # (B, L, H)
    return _scored_logprobs(model, hidden, input_ids, score_mask, chunk)


def _scored_logprobs(model, hidden: torch.Tensor, input_ids: torch.Tensor, score_mask: torch.Tensor, chunk: int):
    """hidden (B, L, H) of input_ids (B, L) -> (B, L) float32 log-probs of the tokens marked in score_mask (p >= 1,
    predicted at p - 1), zero elsewhere: the LM head runs on the scored positions only."""
    scored = score_mask[:, 1:].bool()  # (B, L-1): target p+1 is predicted at p
    lp = _chunked_token_logprobs(model.get_output_embeddings(), hidden[:, :-1][scored], input_ids[:, 1:][scored], chunk)
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    out[:, 1:][scored] = lp
    return out


SHARED_PREFIX_MIN = 32
"""Items of one group share their prompts' common prefix in a scoring pass (`HFPolicy.score(groups=...)`) when it is
at least this many tokens; a shorter one saves less than the extra pass over it costs."""


def common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix all of `seqs` share."""
    first, n = seqs[0], min(len(x) for x in seqs)
    for x in seqs[1:]:
        n = next((i for i in range(n) if x[i] != first[i]), n)
    return n


@torch.no_grad()
def prefix_cache(model: torch.nn.Module, prefix_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The keys and values of a shared prompt prefix, per decoder layer, each (1, heads, P, head_dim): run once, then
    continued by every micro-batch of the rows that share it (`prefix_logprobs`). prefix_ids: (1, P)."""
    past = model.get_decoder()(input_ids=prefix_ids, use_cache=True).past_key_values
    return [(layer.keys, layer.values) for layer in past.layers]


@torch.no_grad()
def prefix_logprobs(
    model: torch.nn.Module,
    prefix: list[tuple[torch.Tensor, torch.Tensor]],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    score_mask: torch.Tensor,
    chunk: int = 512,
) -> torch.Tensor:
    """`sequence_logprobs` of the rows prefix + input_ids[b], the prefix given as its cache (`prefix_cache`).

    input_ids, attention_mask, score_mask: (B, L), right-padded continuations, each with at least one token before
    its first scored one (a scored token is predicted from the position before it). Returns (B, L) float32, zero
    where not scored. No gradient: a pass that trains runs every token of every row."""
    from transformers import DynamicCache

    batch = input_ids.shape[0]
    cache = DynamicCache(  # every row attends to the same prefix keys and values (views: nothing is copied here)
        ddp_cache_data=[(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in prefix]
    )
    p = prefix[0][0].shape[2]
    position_ids = p + (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    full_mask = torch.cat([attention_mask.new_ones(batch, p), attention_mask], dim=1)
    hidden = model.get_decoder()(
        input_ids=input_ids, attention_mask=full_mask, position_ids=position_ids, past_key_values=cache, use_cache=True
    ).last_hidden_state  # (B, L, H)
    return _scored_logprobs(model, hidden, input_ids, score_mask, chunk)


class Scorer(torch.nn.Module):
    """`sequence_logprobs` as a module: the one forward that every scoring and training pass goes through. Under FSDP2
    it is the root unit, whose forward gathers what the blocks do not hold (embeddings, final norm, the head tied to
    the embeddings) before the decoder and the chunked head use them (`distributed.shard`)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, score_mask, pixels: dict | None = None) -> torch.Tensor:
        return sequence_logprobs(self.model, input_ids, attention_mask, score_mask, pixels=pixels)


class ChatEncoder:
    """User-message text -> chat-template token ids: the one encoder of every prompt that is sampled or scored, so the
    HF and vLLM backends and the re-scoring see identical prompt tokens."""

    def __init__(self, tokenizer, max_prompt_tokens: int = 2048, vision=None):
        self.tok = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.vision = vision  # a VisionInputs for a vision-language model, else None

    def encode_full(self, prompt: str, image=None) -> list[int]:
        """Chat-template token ids of one user message, ending with the assistant header, untruncated.

        The message is data: text in it that spells a special token (`<|im_end|>`, `<|im_start|>system`, as a
        model or a teacher may write into a response or a skill) is encoded as ordinary text, so it can never
        end the user turn or open a new one. Prompts without such text are encoded exactly as before. With an
        `image`, the prompt's one IMAGE_MARK becomes the model's image tokens."""
        if image is not None:
            return self._encode_with_image(prompt, image)
        if any(t in prompt for t in self._special_strings) and self._template is not None:
            head, tail = self._template
            return head + self._ids(prompt, split_special_tokens=True) + tail
        ids = self.tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict):
            ids = ids["input_ids"]
        return list(ids)

    def _encode_with_image(self, prompt: str, image) -> list[int]:
        if self.vision is None:
            raise VisionError(
                "env.observation shows images, but this model is text-only: set vision.composite: true (the CPU "
                "composite) or model.name_or_path to a vision-language model, or set env.observation: text"
            )
        if prompt.count(IMAGE_MARK) != 1 or self._template is None:
            raise VisionError(
                f"a prompt with an image must hold {IMAGE_MARK!r} exactly once, where the image goes; this one holds "
                f"it {prompt.count(IMAGE_MARK)} times"
            )
        (head, tail), (before, _, after) = self._template, prompt.partition(IMAGE_MARK)
        data = functools.partial(self._ids, split_special_tokens=True)
        return head + data(before) + self.vision.image_tokens(image) + data(after) + tail

    @functools.cached_property
    def _template(self) -> tuple[list[int], list[int]] | None:
        """(head, tail) ids of the chat template around a user message, or None when it cannot be split."""
        marker = "\ue000SEED-MESSAGE\ue000"
        text = self.tok.apply_chat_template(
            [{"role": "user", "content": marker}], add_generation_prompt=True, tokenize=False
        )
        if text.count(marker) != 1:
            return None
        head, _, tail = text.partition(marker)
        return self._ids(head), self._ids(tail)

    def _ids(self, text: str, split_special_tokens: bool = False) -> list[int]:
        return list(self.tok(text, add_special_tokens=False, split_special_tokens=split_special_tokens)["input_ids"])

    @functools.cached_property
    def _special_strings(self) -> frozenset[str]:
        added = getattr(self.tok, "added_tokens_decoder", {}) or {}
        return frozenset(self.tok.all_special_tokens) | {t.content for t in added.values() if t.special}

    def encode_prompt(self, prompt: str, image=None) -> list[int]:
        """`encode_full`, keeping the last `max_prompt_tokens` tokens (a prompt with an image is never cut)."""
        ids = self.encode_full(prompt, image)
        if image is not None and len(ids) > self.max_prompt_tokens:
            raise VisionError(
                f"a prompt with an image is {len(ids)} tokens, over max_prompt_tokens={self.max_prompt_tokens}, and "
                "cutting it could cut the image: raise rollout.max_prompt_tokens (and evaluate.generation's) or lower "
                "env.history_length"
            )
        return ids[-self.max_prompt_tokens :]


class HFPolicy:
    """A transformers causal LM (CPU or one GPU): the `Sampler` of the HF backend and the trainer's scorer."""

    def __init__(
        self, model, tokenizer, *, batch_size: int = 16, max_prompt_tokens: int = 2048, score_tokens: int = 8192
    ):
        self.encoder = ChatEncoder(tokenizer, max_prompt_tokens, vision_inputs(model.config))
        self.tok = tokenizer
        self.model = model
        self.scorer = Scorer(model)
        self.sharded = False  # `shard` wraps the scorer in FSDP2: every scoring pass is then a collective
        self.batch_size = batch_size
        self.score_tokens = score_tokens  # tokens per scoring micro-batch
        self.device = next(model.parameters()).device
        # On CUDA every forward pass runs under autocast (bf16 where supported): fp32 master weights of a full
        # fine-tuning run then cost fp32 memory only, not fp32 compute. The CPU computes in the weights' dtype.
        half = torch.bfloat16 if self.device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float16
        self.autocast = functools.partial(torch.autocast, "cuda", dtype=half, enabled=self.device.type == "cuda")

    # ------------------------------------------------------------------ generation

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[str],
        *,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        stop: Sequence[str] = (),
        seed: int | None = None,
        images: Sequence | None = None,
    ) -> list[Generation]:
        images = list(images) if images is not None else [None] * len(prompts)
        encoded = [self.encoder.encode_prompt(p, im) for p, im in zip(prompts, images)]
        order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
        results: list[Generation | None] = [None] * len(prompts)
        for n, idx in enumerate(_chunks(order, self.batch_size)):
            if seed is not None:
                torch.manual_seed(derive_seed(seed, n, stride=1_000_003))
            batch, pixels = [encoded[i] for i in idx], self.pixels([images[i] for i in idx])
            for i, g in zip(idx, self._generate_batch(batch, temperature, top_p, max_new_tokens, stop, pixels)):
                results[i] = g
        return results  # type: ignore[return-value]

    def pixels(self, images: Sequence) -> dict:
        """The model's pixel inputs for one batch (one image or None per row), on its device and in its float
        dtype; {} when no row has an image."""
        if all(im is None for im in images):
            return {}
        if self.encoder.vision is None:
            self.encoder.encode_full(IMAGE_MARK, images[0])  # raises the text-only model's error
        dtype = next(p for p in self.model.parameters() if p.is_floating_point()).dtype
        return {
            k: v.to(self.device, dtype=dtype) if v.is_floating_point() else v.to(self.device)
            for k, v in self.encoder.vision.pixels(list(images)).items()
        }

    def _generate_batch(
        self, batch: list[list[int]], temperature, top_p, max_new_tokens, stop, pixels: dict | None = None
    ) -> list[Generation]:
        pad = self.tok.pad_token_id
        width = max(len(x) for x in batch)
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch], device=self.device)
        attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch], device=self.device)
        sampling = temperature > 0
        recorder = _SampledLogprobs()
        with self.autocast():
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                do_sample=sampling,
                temperature=temperature if sampling else None,
                top_p=top_p if sampling else None,
                top_k=None,
                max_new_tokens=max_new_tokens,
                stop_strings=list(stop) or None,
                tokenizer=self.tok if stop else None,
                pad_token_id=pad,
                logits_processor=LogitsProcessorList([recorder]),
                return_dict_in_generate=True,
                **(pixels or {}),
            )
        new = out.sequences[:, width:]  # (B, T)
        logprobs = recorder.finish(new)
        return [self.cut_at_stop(new[b].tolist(), logprobs[b].tolist(), stop) for b in range(len(batch))]

    def cut_at_stop(self, ids: list[int], lps: list[float], stop: Sequence[str]) -> Generation:
        """Trim one generated row at EOS (kept as a token) or right after the first stop string."""
        eos = self.tok.eos_token_id
        finished = False
        if eos in ids:
            k = ids.index(eos) + 1
            ids, lps, finished = ids[:k], lps[:k], True
        text = self.tok.decode(ids, skip_special_tokens=True)
        hits = [text.find(s) + len(s) for s in stop if s in text]
        if hits:
            end = min(hits)
            # the shortest token prefix whose decoded text reaches the end of the stop string
            lo, hi = 1, len(ids)
            while lo < hi:
                mid = (lo + hi) // 2
                if len(self.tok.decode(ids[:mid], skip_special_tokens=True)) >= end:
                    hi = mid
                else:
                    lo = mid + 1
            ids, lps, finished = ids[:lo], lps[:lo], True
            text = text[:end]
        return Generation(text=text, token_ids=ids, logprobs=lps, finished=finished)

    # ------------------------------------------------------------------ the rest of the Sampler protocol

    def sync(self, model: torch.nn.Module) -> float:
        """Copy `model`'s trainable weights into this policy's (a rank's private sampling copy of the learner);
        nothing to do when `model` is this policy's own. Returns the seconds it took."""
        if model is self.model:
            return 0.0
        t0 = time.perf_counter()
        full = dict(model.named_parameters())
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if p.requires_grad:
                    p.copy_(full[name])
        return time.perf_counter() - t0

    def reset_cache(self) -> None:
        """Nothing to forget: `generate` keeps no cache between calls."""

    def sleep(self) -> None:
        """Nothing to free: the weights are the trainer's own."""

    def close(self) -> None:
        """Nothing to release."""

    # ------------------------------------------------------------------ scoring

    def shard(self) -> None:
        """Wrap the scorer in FSDP2 over the ranks (`distributed.shard`): from now on every scoring pass is a
        collective, run in lockstep with the other ranks."""
        distributed.shard(self.scorer, self.model)
        self.sharded = True

    def token_logprobs(
        self, prompts: Sequence[str], responses: Sequence[Sequence[int]], images: Sequence | None = None
    ) -> list[torch.Tensor]:
        images = list(images) if images is not None else [None] * len(prompts)
        with torch.inference_mode():
            return self.score(
                [self.encoder.encode_prompt(p, im) for p, im in zip(prompts, images)], responses, images=images
            )

    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        max_tokens: int | None = None,
        images: Sequence | None = None,
        pad: tuple | None = None,
        groups: Sequence | None = None,
    ) -> list[torch.Tensor]:
        """Per-token log-probs of each response after its prompt ids, in length-sorted micro-batches of at most
        `max_tokens` (default `score_tokens`) padded tokens; `images[i]` is prompt i's image (vision models).
        Differentiable when called with grad enabled. Sharded, every rank runs as many forward passes as the
        busiest one (each is a collective): the missing ones score `pad`, (prompt ids, response, image), and are
        thrown away.

        `groups[i]`, a key per item: without grad, on one rank and text only, the items of a group whose prompts
        share at least SHARED_PREFIX_MIN leading tokens run that prefix once (`prefix_logprobs`), the same
        log-probs to float rounding (a test bounds it)."""
        images = list(images) if images is not None else [None] * len(prompt_ids)
        cap = max_tokens or self.score_tokens
        out: list[torch.Tensor | None] = [None] * len(prompt_ids)
        rest = range(len(prompt_ids))
        if groups is not None and not torch.is_grad_enabled() and not self.sharded and all(i is None for i in images):
            rest = self._score_shared(prompt_ids, responses, cap, groups, out)
        lengths = {i: len(prompt_ids[i]) + len(responses[i]) for i in rest}
        order = sorted(lengths, key=lambda i: lengths[i])
        batches = micro_batches([lengths[i] for i in order], cap)
        passes = distributed.all_max(len(batches)) if self.sharded else len(batches)  # agreed before the first one
        if passes > len(batches) and pad is None:
            raise ValueError("a sharded policy scores in lockstep: pass `pad`, an item to score in idle passes")
        for mb in batches:
            ids = [order[j] for j in mb]
            prompts, answers = [prompt_ids[i] for i in ids], [responses[i] for i in ids]
            for i, lp in zip(ids, self.score_batch(prompts, answers, [images[i] for i in ids])):
                out[i] = lp
        for _ in range(passes - len(batches)):
            self.score_batch([pad[0]], [pad[1]], [pad[2]])
        return out  # type: ignore[return-value]

    def _score_shared(self, prompt_ids, responses, max_tokens: int, groups: Sequence, out: list) -> list[int]:
        """Scores into `out` the items of each group with a shared prefix worth running once; returns the others."""
        members: dict = {}
        for i, g in enumerate(groups):
            members.setdefault(g, []).append(i)
        rest = []
        for ids in members.values():
            # each row keeps one prompt token after the prefix: its first response token is predicted from there
            p = min(common_prefix([prompt_ids[i] for i in ids]), min(len(prompt_ids[i]) for i in ids) - 1)
            if len(ids) < 2 or p < SHARED_PREFIX_MIN:
                rest += ids
                continue
            with self.autocast():  # the prefix runs once per group, not once per micro-batch
                prefix = prefix_cache(self.model, torch.tensor([list(prompt_ids[ids[0]][:p])], device=self.device))
            ids = sorted(ids, key=lambda i: len(prompt_ids[i]) + len(responses[i]))
            for mb in micro_batches([len(prompt_ids[i]) - p + len(responses[i]) for i in ids], max_tokens):
                items = [ids[j] for j in mb]
                tails = [list(prompt_ids[i][p:]) for i in items]
                ids_, attn, score = self._padded(tails, [responses[i] for i in items])
                with self.autocast():
                    lp = prefix_logprobs(self.model, prefix, ids_, attn, score)
                for b, (i, t) in enumerate(zip(items, tails)):
                    out[i] = lp[b, len(t) : len(t) + len(responses[i])]
        return rest

    def _padded(self, prompts: list[Sequence[int]], responses: list[Sequence[int]]):
        """(ids, attention, score mask), each (B, L): prompt + response rows, right-padded; the responses scored."""
        pad = self.tok.pad_token_id
        seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=self.device)
        attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=self.device)
        score = torch.zeros_like(ids, dtype=torch.bool)
        for b, (p, r) in enumerate(zip(prompts, responses)):
            score[b, len(p) : len(p) + len(r)] = True
        return ids, attn, score

    def score_batch(
        self, prompts: list[Sequence[int]], responses: list[Sequence[int]], images: Sequence | None = None
    ) -> list[torch.Tensor]:
        ids, attn, score = self._padded(prompts, responses)
        with self.autocast():
            lp = self.scorer(ids, attn, score, self.pixels(images or [None] * len(prompts)))
        return [lp[b, len(p) : len(p) + len(r)] for b, (p, r) in enumerate(zip(prompts, responses))]
