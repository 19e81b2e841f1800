"""Stage 2: one SEED policy update, with GRPO, GRPO+OPSD and SDAR on the same path.

`Trainer.update` reads top to bottom in paper order:
  1. freeze pi_old: the current weights; nothing changes them before step 6, so no copy is made;
  2. collect B games x N rollouts with pi_old (a GRPO group per game);
then `Trainer.learn(trajs, index)`, which the RL stage, `bench/rl_update.py` and the tests all call:
  3. analyze: pi_old writes one hindsight skill per finished trajectory (`seed`, `grpo_opsd`; `seed_shuffled`
     then gives each trajectory another game's), or the environment's oracle writes it (`seed_oracle`), or each
     trajectory gets its task type's fixed skill (`sdar`), or nothing (`grpo`);
  4. re-score the sampled response tokens: pi_old under the ordinary prompt (PPO's old log-probs), the
     reference model (KL), and pi_old under the skill-augmented prompt (the OPD teacher), all once and
     detached, before any weight changes;
  5. advantages: GRPO trajectory advantage broadcast to every token of every step (or GiGPO);
  6. PPO epochs over mini-batches: L = L_pg + kl_coef * L_kl + lambda * L_opd (no entropy term), with
     gradient clipping; the updated weights are the next actor and the next analyzer (a vLLM sampler is synced
     to them before it samples again).

Sampling (steps 2 and 3) goes through `sampler`, the HF policy itself or a vLLM engine; everything scored (step 4)
and trained (step 6) goes through the trainer's own forward pass. With a vLLM sampler the policy gradient is
weighted by truncated importance sampling against the sampler's recorded log-probs (`rl.tis`, see `losses`).

Departures, each a parameter: the embedded default trains LoRA adapters (the paper fine-tunes all weights at
lr 1e-6); the KL reference of a LoRA run is the adapter-off model, i.e. the starting checkpoint; an update
whose loss or gradient is not finite is skipped rather than applied.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch.nn.utils.rnn import pad_sequence

from seed_core import distributed
from seed_core.config import METHODS, Params, RLConfig
from seed_core.envs import Environment, GameEntry, GamePool
from seed_core.method import advantages as adv
from seed_core.method import credit, losses
from seed_core.method.rescore import StepTokens, action_token_mask, score_steps, step_tokens
from seed_core.method.skills import PARSED, analyze, consistency_metrics
from seed_core.method.teachers import PolicyTeacher
from seed_core.models import CHECKPOINT_ABOVE_TOKENS, freeze_vision, use_checkpointing, with_lora
from seed_core.policy import Sampler, make_sampler
from seed_core.policy.hf import HFPolicy, micro_batches
from seed_core.policy.vision import check_observation, vision_inputs
from seed_core.records import Skill, Trajectory
from seed_core.rollout import play, summarize
from seed_core.runtime import derive_seed, peak_rss_mb


@dataclass(frozen=True)
class MethodSpec:
    skills: Literal["none", "self", "fixed", "shuffled", "oracle"]  # where the teacher context's skill comes from
    gate: losses.Gate  # sigmoid(beta * delta), or constant 0.5


def method_spec(method: str) -> MethodSpec:
    """The one place where a method name (`rl.method`) becomes switches."""
    if method == "grpo":
        return MethodSpec(skills="none", gate="sigmoid")
    if method == "seed":
        return MethodSpec(skills="self", gate="sigmoid")
    if method == "grpo_opsd":
        return MethodSpec(skills="self", gate="constant")
    if method == "sdar":
        return MethodSpec(skills="fixed", gate="sigmoid")
    if method == "seed_shuffled":
        return MethodSpec(skills="shuffled", gate="sigmoid")
    if method == "seed_oracle":
        return MethodSpec(skills="oracle", gate="sigmoid")
    raise ValueError(f"unknown rl.method {method!r}; valid: {', '.join(METHODS)}")


class NonFiniteError(RuntimeError):
    """Too many updates in a row had a NaN/inf loss or gradient."""


@dataclass(frozen=True)
class Batch:
    """Everything step 6 needs, computed before any weight changes. S = number of steps (agent turns)."""

    trajs: list[Trajectory]
    skills: list[Skill | None]
    steps: list[StepTokens]  # (S,)
    old_logp: list[torch.Tensor] | None  # None: one PPO epoch over one mini-batch, pi_old = the weights trained
    ref_logp: list[torch.Tensor] | None  # None: no KL term
    teacher_logp: list[torch.Tensor | None]  # None where the step's trajectory has no skill
    advantage: torch.Tensor  # (S,) one scalar per step, broadcast over its tokens


@dataclass
class DeltaStats:
    """Per step with a skill: how the skill moved pi_old's log-probs of the step's own tokens."""

    delta: torch.Tensor  # (n,) teacher - pi_old per response token, on the CPU
    gate: torch.Tensor  # (n,) the method's gate per token


class Trainer:
    """The policy (LoRA adapters or full weights), its optimizer, and one `update` in paper order."""

    def __init__(
        self,
        model,
        tokenizer,
        params: Params,
        fixed_skills: dict[str, str] | None = None,
        sampler_dir: Path | None = None,
        env: Environment | None = None,
    ):
        """`sampler_dir`: the checkpoint `model` was loaded from; with `rollout.backend: vllm` the engine starts
        from it (the LoRA adapters start at zero, so both serve the same weights until the first sync).
        `env`: the environment played; where its solver judges steps and skills (Sokoban), every update reports the
        credit probe (`credit/*`) and skill consistency (`skills/consistent`), and the skill corpus keeps each
        step's label."""
        self.env = env
        self.cfg: RLConfig = params.rl
        self.params = params
        self.spec = method_spec(self.cfg.method)
        if self.spec.skills == "fixed" and not fixed_skills:
            raise ValueError("rl.method sdar needs fixed skills per task type (rl.sdar_skills)")
        self.fixed_skills = fixed_skills or {}
        if self.spec.skills == "oracle" and env is None:
            raise ValueError("rl.method seed_oracle needs the environment: its oracle teacher writes the skills")
        check_observation(
            params.env.observation, vision_inputs(model.config) is not None, sampler_dir or "the RL model"
        )
        self.ref_model = None
        train_vision = params.vision.trainable
        if self.cfg.lora_r is not None:
            torch.manual_seed(self.cfg.seed)  # LoRA A matrices are drawn at random: same seed, same start
            model = with_lora(model, self.cfg.lora_r, self.cfg.lora_alpha, train_vision)
        else:
            if self.cfg.kl_coef > 0:
                self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            freeze_vision(model, not train_vision)
        if self.cfg.gradient_checkpointing is not False:  # only while training: generation and scoring run in eval
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = model
        gen = params.rollout
        self.policy = HFPolicy(model, tokenizer, batch_size=gen.batch_size, max_prompt_tokens=gen.max_prompt_tokens)
        self.ref_policy = (
            HFPolicy(self.ref_model, tokenizer, max_prompt_tokens=gen.max_prompt_tokens) if self.ref_model else None
        )
        new_tokens = max(gen.max_new_tokens, self.cfg.analyzer_max_new_tokens)
        self.sampler: Sampler = make_sampler(sampler_dir, params, gen, self.cfg.seed, new_tokens, learner=self.policy)
        # TIS corrects another backend's log-probs; a rank's HF copy (below) holds the learner's own weights
        self.tis = self.cfg.tis == "on" or (self.cfg.tis == "auto" and self.sampler is not self.policy)
        if distributed.active():  # a rank (of torchrun, even alone): the learner is sharded
            if self.sampler is self.policy:  # generation is no collective: a rank samples from its own full copy
                self.sampler = HFPolicy(
                    copy.deepcopy(model), tokenizer, batch_size=gen.batch_size, max_prompt_tokens=gen.max_prompt_tokens
                )
            for policy in filter(None, (self.policy, self.ref_policy)):  # the reference is a unit tree of its own
                policy.shard()
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.trainable, lr=self.cfg.learning_rate, weight_decay=0.0)
        self.nonfinite_in_row = 0

    # ------------------------------------------------------------------ one update, in paper order

    def update(self, pool: GamePool, games: Sequence[GameEntry], index: int) -> tuple[dict[str, float], list[dict]]:
        """Steps 1-6 on `games`; returns the update's metrics and its skill corpus."""
        self.model.eval()  # 1. pi_old = the current weights, unchanged until step 6

        t0 = time.perf_counter()  # 2. collect: rank r plays games[r::world], whole groups (rank-local advantages)
        rank, world = distributed.rank(), distributed.world()
        trajs = play(
            self.sampler, pool, list(games)[rank::world], group_size=self.cfg.group_size, env=self.params.env,
            gen=self.params.rollout, seed=derive_seed(derive_seed(self.cfg.seed, index, stride=100_003), rank, stride=world),
            tag=f"rl/u{index:04d}",
            progress=False,
        )  # fmt: skip
        rollout_s = time.perf_counter() - t0

        metrics, corpus = self.learn(trajs, index)
        everyone = [t for part in distributed.gather(trajs) for t in part]
        return {**rollout_metrics(everyone), "time/rollout_s": rollout_s, **metrics}, corpus

    def learn(
        self, trajs: list[Trajectory], index: int, skills: list[Skill | None] | None = None
    ) -> tuple[dict[str, float], list[dict]]:
        """Steps 3-6 on trajectories collected by pi_old (the current weights); returns metrics and skill corpus.
        `skills` replaces step 3's analysis (tests and benchmarks that hold the skills fixed)."""
        t = {}
        self.model.eval()

        t0 = time.perf_counter()  # 3. analyze
        skill_metrics = {}
        if skills is None:
            skills, skill_metrics = self.analyze(trajs, index)
        t["time/analysis_s"] = time.perf_counter() - t0

        self.sampler.sleep()  # the GPU is the trainer's until the sync (vLLM with vllm.sleep; else a no-op)

        t0 = time.perf_counter()  # 4. re-score and 5. advantages
        batch = self.build_batch(trajs, skills)
        t["time/rescore_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()  # 6. optimize
        loss_metrics, deltas = self.optimize(batch, index)
        t["time/update_s"] = time.perf_counter() - t0
        t["time/sync_s"] = self.sync_sampler()

        labels = [self.env.step_labels(tr) for tr in trajs] if self.env is not None else None
        actions = [action_token_mask(self.policy.tok, s.response_ids) for s in batch.steps]
        metrics = {**skill_metrics, **loss_metrics, **t, "memory/peak_rss_mb": peak_rss_mb()}
        if labels is not None and None not in labels:
            metrics |= credit_metrics(batch, deltas, actions, labels)
        if torch.cuda.is_available():
            metrics["memory/peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
        corpus = skill_corpus(batch, deltas, actions, labels, index)
        return metrics, [c for part in distributed.gather(corpus) for c in part]

    def close(self) -> None:
        """Shut the sampler down (a vLLM engine; the HF one needs nothing)."""
        self.sampler.close()
        self.sampler = self.policy

    def sync_sampler(self) -> float:
        """Make the sampler serve the current weights (after each update and after a checkpoint loads); seconds.
        Sharded, the weights are gathered first (every rank, a collective)."""
        if self.sampler is self.policy:
            return 0.0
        with distributed.gathered(self.policy.scorer):
            return self.sampler.sync(self.model)

    def build_batch(self, trajs: list[Trajectory], skills: list[Skill | None]) -> Batch:
        """Steps 4 and 5: every step's tokens, its pi_old, reference and teacher log-probs, and its advantage."""
        steps, old, ref, teacher = self.rescore(trajs, skills)
        return Batch(trajs, skills, steps, old, ref, teacher, self.advantages(trajs, steps))

    # ------------------------------------------------------------------ the steps

    @torch.no_grad()
    def analyze(self, trajs: list[Trajectory], index: int) -> tuple[list[Skill | None], dict[str, float]]:
        """pi_old as its own analyzer (self skills), the task type's fixed skill (sdar), or none (grpo)."""
        if self.spec.skills == "none":
            return [None] * len(trajs), {}
        if self.spec.skills == "fixed":
            skills = [
                Skill(t.traj_id, t.game_id, t.task_type, "success" if t.won else "failure", "",
                      self.fixed_skills[t.task_type], "ok", "", "sdar:fixed", "")
                for t in trajs
            ]  # fmt: skip
            lengths = [len(s.skill) for s in skills]
            return skills, {"skills/parse_rate": 1.0, "skills/length_chars": _all_mean(sum(lengths), len(lengths))}
        if self.spec.skills == "oracle":
            teacher = self.env.oracle(self.cfg.oracle_max_chars, self.cfg.oracle_claims)
        else:  # Skills are JSON objects; stopping at the first closing brace saves most of the analyzer's tokens.
            teacher = PolicyTeacher(self.sampler, f"policy:u{index:04d}", self.cfg.analyzer_max_new_tokens, stop=("}",))
        skills, stats = analyze(trajs, teacher, reask=False, max_skill_chars=self.cfg.max_skill_chars)
        lengths = [len(s.skill) for s in skills if s.parse_status in PARSED]
        # this rank's trajectories only: on one rank (the science runs) that is the whole update; measured on the
        # skills as written, before a control moves them to other games
        checked = consistency_metrics(self.env, trajs, skills) if self.env is not None else {}
        if self.spec.skills == "shuffled":
            skills = shuffle_skills(trajs, skills)
        return skills, checked | {  # over every rank's trajectories
            "skills/parse_rate": _all_mean(stats.parse_rate * len(trajs), len(trajs)),
            "skills/length_chars": _all_mean(sum(lengths), len(lengths)),
            "skills/truncated": distributed.all_sum(stats.truncated),
            "skills/analyzer_tokens": distributed.all_sum(stats.completion_tokens),
        }

    @torch.no_grad()
    def rescore(self, trajs: list[Trajectory], skills: list[Skill | None]):
        """(steps, old, ref, teacher): every step's tokens and its pi_old, reference and teacher log-probs."""
        texts = [s.skill if s is not None and s.parse_status in PARSED else None for s in skills]
        steps = step_tokens(self.policy.encoder, trajs, texts, env=self.params.env)
        mb = self.cfg.micro_batch_tokens
        # With one PPO epoch over a single mini-batch no optimizer step happens before a step's loss, so its
        # pi_old log-probs are the training forward's own (detached): the separate pass would repeat it.
        on_policy = self.cfg.ppo_epochs == 1 and self._mini_batches(len(steps)) == 1
        old = None if on_policy else score_steps(self.policy, steps, "prompt", mb)
        ref = self._reference_logp(steps) if self.cfg.kl_coef > 0 else None
        teacher = score_steps(self.policy, steps, "teacher", mb) if self.spec.skills != "none" else [None] * len(steps)
        return steps, old, ref, teacher

    def _reference_logp(self, steps: list[StepTokens]) -> list[torch.Tensor]:
        if self.ref_policy is None:  # LoRA: the adapter-off model is the starting checkpoint
            with self.model.disable_adapter():
                return score_steps(self.policy, steps, "prompt", self.cfg.micro_batch_tokens)
        return score_steps(self.ref_policy, steps, "prompt", self.cfg.micro_batch_tokens)

    def advantages(self, trajs: list[Trajectory], steps: list[StepTokens]) -> torch.Tensor:
        """(S,) advantage of each step: its trajectory's GRPO advantage, plus omega x GiGPO step advantage."""
        return step_advantages(trajs, steps, self.cfg)

    def _mini_batches(self, n_steps: int) -> int:
        """Optimizer steps per PPO epoch, the same on every rank: a rank takes its share of `mini_batch_steps`."""
        return distributed.all_max(-(-n_steps // self._rank_share()))

    def _rank_share(self) -> int:
        return -(-self.cfg.mini_batch_steps // distributed.world())

    def optimize(self, batch: Batch, index: int) -> tuple[dict[str, float], dict[int, DeltaStats]]:
        """PPO epochs over shuffled mini-batches of steps; token-mean losses accumulated over micro-batches.
        Returns the loss metrics and, per step with a skill, its DeltaStats.

        With several ranks, a mini-batch is every rank's share together: the token-mean divides by all ranks'
        tokens, every rank runs as many micro-batches as the busiest (zero-weight passes where it has none left:
        each FSDP pass is a collective), and a step is skipped on every rank if any rank saw a NaN/inf."""
        cfg = self.cfg
        self.model.train()
        g = torch.Generator().manual_seed(derive_seed(cfg.seed, index, stride=7_919))
        stats = StatSums()
        deltas: dict[int, DeltaStats] = {}
        grad_norms, skipped = [], 0
        share, n_minis = self._rank_share(), self._mini_batches(len(batch.steps))
        for _ in range(cfg.ppo_epochs):
            perm = torch.randperm(len(batch.steps), generator=g).tolist()
            for m in range(n_minis):
                mini = sorted(perm[m * share : (m + 1) * share], key=lambda i: batch.steps[i].length)
                self.opt.zero_grad(set_to_none=True)
                finite = self.backward(batch, mini, stats, deltas)
                norm = self.optimizer_step(finite, index)
                if norm is None:
                    skipped += 1
                else:
                    grad_norms.append(norm)
        self.opt.zero_grad(set_to_none=True)
        out = stats.merged()
        out["train/grad_norm"] = _mean(grad_norms)
        out["train/skipped_steps"] = float(skipped)
        return out, deltas

    def backward(self, batch: Batch, mini: list[int], stats: StatSums, deltas: dict[int, DeltaStats]) -> bool:
        """The gradient of one mini-batch's token-mean loss (every rank's share together), in micro-batches; their
        statistics into `stats`, the skill corpus's Δ into `deltas`. Returns whether every rank's loss was finite.
        Sharded, every rank runs as many passes as the busiest one (each FSDP pass is a collective): a rank out of
        micro-batches runs zero-weight passes over its first step."""
        world = distributed.world()
        n_tokens = distributed.all_sum(sum(len(batch.steps[i].response_ids) for i in mini))
        finite = True
        mbs = micro_batches([batch.steps[i].length for i in mini], self.cfg.micro_batch_tokens) if mini else []
        for b in range(distributed.all_max(len(mbs))):
            idle = b >= len(mbs)
            ids = [0] if idle else [mini[j] for j in mbs[b]]
            loss, mb_stats, n, mb_deltas = self.micro_loss(batch, ids)
            # FSDP averages gradients over ranks; scaling by world makes them the global token-mean's
            (loss * (0.0 if idle else n / n_tokens * world)).backward()
            if not torch.isfinite(loss):
                finite = False
            if idle or not finite:
                continue
            stats.add(mb_stats, n)
            for i, d in mb_deltas.items():
                deltas.setdefault(i, d)  # pi_old is fixed: every pass over a step gives the same
        return distributed.all_true(finite)

    def optimizer_step(self, finite: bool, index: int) -> float | None:
        """The optimizer step after a mini-batch's backward passes: its pre-clip gradient norm, or None when the
        loss or the gradient was not finite on some rank, and nothing reached the weights. Too many such steps
        in a row stop the run (`rl.max_nonfinite_in_row`), the last good checkpoint intact."""
        cfg = self.cfg
        norm = (
            distributed.full(torch.nn.utils.clip_grad_norm_(self.trainable, cfg.grad_clip))
            if finite
            else torch.tensor(float("nan"))
        )
        if finite and torch.isfinite(norm):
            self.nonfinite_in_row = 0
            self.opt.step()
            return float(norm)
        self.opt.zero_grad(set_to_none=True)  # nothing from a NaN/inf state ever reaches the weights
        self.nonfinite_in_row += 1
        if self.nonfinite_in_row >= cfg.max_nonfinite_in_row:
            raise NonFiniteError(
                f"{self.nonfinite_in_row} optimizer steps in a row had a non-finite loss or gradient "
                f"(update {index}); stopping with the last good checkpoint intact. Lower rl.learning_rate "
                "or check the model's dtype."
            )
        return None

    def micro_loss(
        self, batch: Batch, ids: list[int]
    ) -> tuple[torch.Tensor, dict[str, float], int, dict[int, DeltaStats]]:
        """Loss of one micro-batch of steps (token-mean within it), its stats, its token count, and the
        DeltaStats of its steps that have a skill."""
        cfg = self.cfg
        steps = [batch.steps[i] for i in ids]
        if cfg.gradient_checkpointing == "auto":  # by need: recomputing costs a forward pass
            padded = len(steps) * max(s.length for s in steps)
            use_checkpointing(self.model, padded > CHECKPOINT_ABOVE_TOKENS)
        logp = pad_sequence(
            self.policy.score_batch(
                [s.prompt_ids for s in steps], [s.response_ids for s in steps], [s.image for s in steps]
            ),
            batch_first=True,
        )  # (b, T)
        dev = logp.device  # the model's: scores live there; the advantages and masks are built on the CPU
        mask = pad_sequence([torch.ones(len(s.response_ids), dtype=torch.bool) for s in steps], batch_first=True).to(
            dev
        )
        # pi_old: stored, or (one epoch over one mini-batch) this forward's own log-probs, detached
        old = (
            logp.detach()
            if batch.old_logp is None
            else pad_sequence([batch.old_logp[i] for i in ids], batch_first=True)
        )
        advantage = batch.advantage[ids].to(dev)[:, None].expand_as(logp)
        sampler = pad_sequence([torch.tensor(s.sampler_logp, device=dev) for s in steps], batch_first=True)
        weights = losses.truncated_is_weights(old, sampler, cfg.tis_cap) if self.tis else None
        pg, pg_stats = losses.ppo_clip_loss(logp, old, advantage, mask, cfg.clip_eps, cfg.dual_clip_c, weights)
        loss = pg
        stats = {
            "loss/pg": pg.item(),
            "train/clip_frac": pg_stats["clip_frac"],
            "train/approx_kl": pg_stats["approx_kl"],
            **losses.sampler_mismatch(old, sampler, mask),
        }
        if weights is not None:
            stats["train/tis_capped_frac"] = losses.masked_mean((weights >= cfg.tis_cap).float(), mask).item()
        if batch.ref_logp is not None:
            kl = losses.kl_loss(logp, pad_sequence([batch.ref_logp[i] for i in ids], batch_first=True), mask)
            loss = loss + cfg.kl_coef * kl
            stats["loss/kl"] = kl.item()
        deltas: dict[int, DeltaStats] = {}
        if self.spec.skills != "none":
            have = [batch.teacher_logp[i] is not None for i in ids]
            teacher = pad_sequence(
                [
                    batch.teacher_logp[i] if h else torch.zeros(len(s.response_ids), device=dev)
                    for i, h, s in zip(ids, have, steps)
                ],
                batch_first=True,
            )
            opd_mask = torch.tensor(have, dtype=torch.float32, device=dev)  # no skill (failed analysis): no OPD signal
            opd, opd_stats = losses.gated_opd_loss(logp, teacher, mask, opd_mask, cfg.opd_beta, self.spec.gate)
            loss = loss + cfg.opd_lambda * opd
            stats["loss/opd"] = opd.item()
            stats.update(opd_stats)
            deltas = self.corpus_deltas(ids, have, [len(s.response_ids) for s in steps], teacher, old)
        return loss, stats, int(mask.sum()), deltas

    @torch.no_grad()
    def corpus_deltas(
        self, ids: list[int], have: list[bool], lengths: list[int], teacher: torch.Tensor, old: torch.Tensor
    ) -> dict[int, DeltaStats]:
        """What the skill did to pi_old's own tokens, for the skill corpus: Δ = teacher - pi_old and the method's
        gate, per step with a skill. teacher, old: (b, T)."""
        delta = teacher - old
        gate = losses.opd_gate(delta, self.cfg.opd_beta, self.spec.gate)
        return {
            i: DeltaStats(delta[j, :n].float().cpu(), gate[j, :n].float().cpu())
            for j, (i, h, n) in enumerate(zip(ids, have, lengths))
            if h
        }


def shuffle_skills(trajs: Sequence[Trajectory], skills: Sequence[Skill | None]) -> list[Skill | None]:
    """`seed_shuffled`'s control: the i-th trajectory of each game gets the skill written for the i-th trajectory
    (cyclically) of the next game, so every skill keeps its form and is re-scored against a room it does not
    describe. Each record takes its new trajectory's ids; `producer` names the trajectory it was written for."""
    games = list(dict.fromkeys(t.game_id for t in trajs))
    if len(games) < 2:
        raise ValueError(
            f"rl.method seed_shuffled needs at least 2 games per update (per rank) to move skills between; this one "
            f"has {len(games)}: raise rl.games_per_update"
        )
    by_game = {g: [i for i, t in enumerate(trajs) if t.game_id == g] for g in games}
    out: list[Skill | None] = []
    for i, t in enumerate(trajs):
        donors = by_game[games[(games.index(t.game_id) + 1) % len(games)]]
        src = skills[donors[by_game[t.game_id].index(i) % len(donors)]]
        moved = dict(traj_id=t.traj_id, game_id=t.game_id, task_type=t.task_type)
        out.append(None if src is None else dataclasses.replace(src, **moved, producer=f"shuffled:{src.traj_id}"))
    return out


def step_advantages(trajs: list[Trajectory], steps: list[StepTokens], cfg: RLConfig) -> torch.Tensor:
    """(S,) advantage of each step under `cfg.advantage`: its trajectory's GRPO advantage broadcast to the step, or
    that plus omega x GiGPO's anchor-state step advantage."""
    groups = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in trajs))}
    returns = torch.tensor([t.episode_return for t in trajs], dtype=torch.float32)
    group_ids = torch.tensor([groups[t.group_id] for t in trajs])
    episode = adv.grpo_advantages(returns, group_ids, norm=cfg.adv_norm)  # (N,)
    step_traj = torch.tensor([s.traj for s in steps])
    per_step = episode[step_traj]
    if cfg.advantage == "grpo":
        return per_step
    if cfg.advantage == "gigpo":
        rewards = torch.tensor([trajs[s.traj].steps[s.step].reward for s in steps], dtype=torch.float32)
        disc = adv.discounted_returns(rewards, step_traj, cfg.gigpo_gamma)
        anchors = adv.anchor_ids(
            [trajs[s.traj].group_id for s in steps], [trajs[s.traj].steps[s.step].observation for s in steps]
        )
        step_adv = adv.gigpo_step_advantages(disc, anchors, norm=cfg.adv_norm)
        return adv.gigpo_advantages(per_step, step_adv, cfg.gigpo_omega)
    raise ValueError(f"unknown rl.advantage {cfg.advantage!r}; valid: grpo, gigpo")


def step_delta_means(d: DeltaStats, action: list[bool]) -> dict[str, float]:
    """One step's mean Δ over all its response tokens and over its action tokens, and its mean gate."""
    mask = torch.tensor(action, dtype=torch.bool)
    return {
        "delta_mean": float(d.delta.mean()),
        "delta_action_mean": float(d.delta[mask].mean()) if mask.any() else float(d.delta.mean()),
        "gate_mean": float(d.gate.mean()),
    }


def credit_metrics(
    batch: Batch, deltas: dict[int, DeltaStats], actions: list[list[bool]], labels: list[list[str]]
) -> dict[str, float]:
    """The credit probe on this update's batch (`method.credit`, no intervals): pooled and within-trajectory AUC of
    the step advantage the update trained on and, where steps have a skill, of Δ (all tokens, action tokens) and
    the gate, for telling the solver's optimal moves from the others."""
    optimal = torch.tensor([labels[s.traj][s.step] == "optimal" for s in batch.steps])
    groups = torch.tensor([s.traj for s in batch.steps])
    signals = {"advantage": batch.advantage.float()}
    if deltas:
        nan = {"delta_mean": math.nan, "delta_action_mean": math.nan, "gate_mean": math.nan}
        per_step = [step_delta_means(deltas[i], actions[i]) if i in deltas else nan for i in range(len(batch.steps))]
        for name, key in (("delta", "delta_mean"), ("delta_action", "delta_action_mean"), ("gate", "gate_mean")):
            signals[name] = torch.tensor([p[key] for p in per_step], dtype=torch.float32)
    out = {"credit/optimal_frac": float(optimal.float().mean()) if len(optimal) else 0.0}
    for name, row in credit.credit_table(signals, optimal, groups, groups, n_boot=0).items():
        for kind, key in (("pooled", "auc"), ("within", "auc_within")):
            if not math.isnan(row[kind]):  # no pair to compare: left out, as JSON has no NaN
                out[f"credit/{key}/{name}"] = row[kind]
    return out


def skill_corpus(
    batch: Batch,
    deltas: dict[int, DeltaStats],
    actions: list[list[bool]],
    labels: list[list[str] | None] | None,
    index: int,
) -> list[dict]:
    """One entry per analyzed trajectory: the skill, the episode it came from, and how far the skill moved pi_old's
    log-probs of the episode's own response tokens (mean Δ = teacher - pi_old, mean gate of the method), in all
    and per step: each step's solver label where the environment has a solver, and its Δ and gate where it was
    re-scored with the skill, so a run can be probed after the fact."""
    steps_of: dict[int, list[int]] = {}
    for i, st in enumerate(batch.steps):
        steps_of.setdefault(st.traj, []).append(i)
    out = []
    for t, (traj, skill) in enumerate(zip(batch.trajs, batch.skills)):
        if skill is None:
            continue
        scored = [deltas[i] for i in steps_of.get(t, []) if i in deltas]
        delta = torch.cat([d.delta for d in scored]) if scored else torch.zeros(0)
        gate = torch.cat([d.gate for d in scored]) if scored else torch.zeros(0)
        steps = [
            {"step": batch.steps[i].step, "tokens": len(batch.steps[i].response_ids)}
            | ({"label": labels[t][batch.steps[i].step]} if labels and labels[t] is not None else {})
            | (step_delta_means(deltas[i], actions[i]) if i in deltas else {})
            for i in steps_of.get(t, [])
        ]
        out.append({
            "update": index,
            **dataclasses.asdict(skill),
            "trajectory": {
                "won": traj.won, "episode_return": traj.episode_return, "length": traj.length,
                "invalid_count": traj.invalid_count, "task": traj.task, "actions": [s.action for s in traj.steps],
            },
            "rescore": {
                "tokens": len(delta),
                "delta_mean": float(delta.mean()) if len(delta) else 0.0,
                "gate_mean": float(gate.mean()) if len(gate) else 0.0,
                "steps": steps,
            },
        })  # fmt: skip
    return out


def rollout_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    m = summarize(trajs)
    out = {
        "rollout/success_rate": m["success/micro"],
        "rollout/invalid_rate": m["invalid_rate"],
        "rollout/episode_length": m["episode_length"],
    }
    per_type = {
        k.split("/", 1)[1]: v
        for k, v in m.items()
        if k.startswith("success/") and k not in ("success/micro", "success/macro")
    }
    out.update({f"rollout/success_rate/{t}": v for t, v in per_type.items()})
    return out


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _all_mean(total: float, count: int) -> float:
    """Mean over every rank's items, from this rank's sum and count."""
    count = distributed.all_sum(count)
    return distributed.all_sum(total) / count if count else 0.0


STAT_REDUCTION = {
    "loss/pg": "mean", "loss/kl": "mean", "loss/opd": "mean",
    "train/clip_frac": "mean", "train/approx_kl": "mean", "train/tis_capped_frac": "mean",
    "mismatch/abs_mean": "mean", "mismatch/abs_max": "max", "mismatch/k3": "mean",
    "opd/active_token_ratio": "mean", "opd/gate_mean": "mean", "opd/gate_gt_half_ratio": "mean",
    "opd/delta_mean": "mean",
}  # fmt: skip
"""How each micro-batch statistic of the update combines over micro-batches and ranks: `mean`, weighted by the
micro-batch's tokens, or `max`. A statistic missing here is an error, so a new one names its reduction."""


class StatSums:
    """The update's micro-batch statistics, reduced by STAT_REDUCTION."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.maxima: dict[str, float] = {}
        self.tokens = 0

    def add(self, stats: dict[str, float], tokens: int) -> None:
        for k, v in stats.items():
            if k not in STAT_REDUCTION:
                raise KeyError(f"update statistic {k!r} has no reduction: add it to method.update.STAT_REDUCTION")
            if STAT_REDUCTION[k] == "max":
                self.maxima[k] = max(self.maxima.get(k, v), v)
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v * tokens
        self.tokens += tokens

    def merged(self) -> dict[str, float]:
        """Every rank's statistics reduced (the identity on one rank): token means and maxima."""
        sums: dict[str, float] = {}
        maxima: dict[str, float] = {}
        parts = distributed.gather((self.sums, self.maxima, self.tokens))
        for s, m, _ in parts:
            for k, v in s.items():
                sums[k] = sums.get(k, 0.0) + v
            for k, v in m.items():
                maxima[k] = max(maxima.get(k, v), v)
        tokens = sum(t for _, _, t in parts)
        return {k: v / max(tokens, 1) for k, v in sums.items()} | maxima
