"""Stage 2: SEED's self-evolving on-policy distillation, with GRPO, GRPO+OPSD and SDAR on the same path.

One policy update (`Trainer.update`) reads top to bottom in paper order:
  1. freeze pi_old: the current weights; nothing changes them before step 6, so no copy is made;
  2. collect B games x N rollouts with pi_old (a GRPO group per game);
  3. analyze: pi_old writes one hindsight skill per finished trajectory (`seed`, `grpo_opsd`), or each
     trajectory gets its task type's fixed skill (`sdar`), or nothing (`grpo`);
  4. re-score the sampled response tokens: pi_old under the ordinary prompt (PPO's old log-probs), the
     reference model (KL), and pi_old under the skill-augmented prompt (the OPD teacher), all once and
     detached, before any weight changes;
  5. advantages: GRPO trajectory advantage broadcast to every token of every step (or GiGPO);
  6. PPO epochs over mini-batches: L = L_pg + kl_coef * L_kl - entropy_coef * H + lambda * L_opd, with
     gradient clipping; the updated weights are the next actor and the next analyzer.

Departures, each a parameter: the embedded default trains LoRA adapters (the paper fine-tunes all weights at
lr 1e-6); the KL reference of a LoRA run is the adapter-off model, i.e. the starting checkpoint; an update
whose loss or gradient is not finite is skipped rather than applied.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import resource
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence, get_args

import torch
import yaml
from safetensors.torch import load_file, save_file
from torch.nn.utils.rnn import pad_sequence

from . import advantages as adv
from . import losses
from .config import Params, RLConfig
from .data import GameEntry, data_root, read_manifest
from .envs.alfworld import EnvPool
from .evaluate import summarize
from .models import ModelError, load_model, pick_dtype
from .policy.hf import HFPolicy, micro_batches
from .records import Skill, StorageError, Trajectory, storage_error, write_json, write_jsonl
from .rescore import StepTokens, score_steps, step_tokens
from .rollout import play
from .runtime import seed_everything
from .skills import analyze
from .teachers import PolicyTeacher

Method = Literal["grpo", "seed", "grpo_opsd", "sdar"]
# rl.init -> the checkpoint RL starts from (the dvc.yaml outputs of train_analyzer, warmup and prepare).
INIT = {"analyzer": "models/analyzer", "warmup": "models/warmup", "base": "models/base"}


@dataclass(frozen=True)
class MethodSpec:
    skills: Literal["none", "self", "fixed"]  # where the teacher context's skill comes from
    gate: losses.Gate  # sigmoid(beta * delta), or constant 0.5


def method_spec(method: str) -> MethodSpec:
    """The one place where a method name becomes switches."""
    if method == "grpo":
        return MethodSpec(skills="none", gate="sigmoid")
    if method == "seed":
        return MethodSpec(skills="self", gate="sigmoid")
    if method == "grpo_opsd":
        return MethodSpec(skills="self", gate="constant")
    if method == "sdar":
        return MethodSpec(skills="fixed", gate="sigmoid")
    raise ValueError(f"unknown rl.method {method!r}; valid: {', '.join(get_args(Method))}")


class NonFiniteError(RuntimeError):
    """Too many updates in a row had a NaN/inf loss or gradient."""


@dataclass
class Batch:
    """Everything step 6 needs, computed before any weight changes."""

    trajs: list[Trajectory]
    skills: list[Skill | None]
    steps: list[StepTokens]
    old_logp: list[torch.Tensor] | None  # None: one PPO epoch over one mini-batch, pi_old = the weights being trained
    ref_logp: list[torch.Tensor] | None
    teacher_logp: list[torch.Tensor | None]
    advantage: torch.Tensor  # (S,) one scalar per step, broadcast over its tokens
    delta: dict[int, tuple[float, float, int]] = dataclasses.field(default_factory=dict)
    """step -> (sum of Δ, tokens with gate > 0.5, tokens), from the first pass over the step."""


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Trainer:
    """The policy (LoRA adapters or full weights), its optimizer, and one `update` in paper order."""

    def __init__(self, model, tokenizer, params: Params, fixed_skills: dict[str, str] | None = None):
        self.cfg: RLConfig = params.rl
        self.params = params
        self.spec = method_spec(self.cfg.method)
        if self.spec.skills == "fixed" and not fixed_skills:
            raise ValueError("rl.method sdar needs fixed skills per task type (rl.sdar_skills)")
        self.fixed_skills = fixed_skills or {}
        self.ref_model = None
        if self.cfg.lora_r is not None:
            from peft import LoraConfig, get_peft_model

            torch.manual_seed(self.cfg.seed)  # LoRA A matrices are drawn at random: same seed, same start
            model = get_peft_model(
                model, LoraConfig(r=self.cfg.lora_r, lora_alpha=self.cfg.lora_alpha, lora_dropout=0.0, target_modules="all-linear")
            )
        elif self.cfg.kl_coef > 0:
            import copy

            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        if self.cfg.gradient_checkpointing:  # only while training: generation and scoring run in eval mode
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = model
        self.policy = HFPolicy(model, tokenizer, batch_size=params.rollout.batch_size, max_prompt_tokens=params.rollout.max_prompt_tokens)
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.trainable, lr=self.cfg.learning_rate, weight_decay=0.0)
        self.nonfinite_in_row = 0

    # ------------------------------------------------------------------ one update, in paper order

    def update(self, pool: EnvPool, games: Sequence[GameEntry], index: int) -> tuple[dict[str, float], list[dict]]:
        cfg, t = self.cfg, {}
        self.model.eval()  # 1. pi_old = the current weights, unchanged until step 6

        t0 = time.perf_counter()  # 2. collect
        trajs = play(
            self.policy, pool, games, group_size=cfg.group_size, env=self.params.env, gen=self.params.rollout,
            seed=cfg.seed * 100_003 + index, tag=f"rl/u{index:04d}", progress=False,
        )
        t["time/rollout_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()  # 3. analyze
        skills, skill_metrics = self.analyze(trajs, index)
        t["time/analysis_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()  # 4. re-score
        batch = self.rescore(trajs, skills)
        t["time/rescore_s"] = time.perf_counter() - t0

        batch.advantage = self.advantages(trajs, batch.steps)  # 5. advantages

        t0 = time.perf_counter()  # 6. optimize
        loss_metrics = self.optimize(batch, index)
        t["time/update_s"] = time.perf_counter() - t0

        metrics = {**rollout_metrics(trajs), **skill_metrics, **loss_metrics, **t, "memory/peak_rss_mb": peak_rss_mb()}
        if torch.cuda.is_available():
            metrics["memory/peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
        return metrics, skill_corpus(batch, index)

    # ------------------------------------------------------------------ the steps

    @torch.no_grad()
    def analyze(self, trajs: list[Trajectory], index: int) -> tuple[list[Skill | None], dict[str, float]]:
        """pi_old as its own analyzer (self skills), the task type's fixed skill (sdar), or none (grpo)."""
        if self.spec.skills == "none":
            return [None] * len(trajs), {}
        if self.spec.skills == "fixed":
            skills = [
                Skill(t.traj_id, t.game_id, t.task_type, "success" if t.won else "failure", "", self.fixed_skills[t.task_type],
                      "ok", "", "sdar:fixed", "")
                for t in trajs
            ]
            return skills, {"skills/parse_rate": 1.0, "skills/length_chars": _mean([len(s.skill) for s in skills])}
        # Skills are JSON objects; stopping at the first closing brace saves most of the analyzer's tokens.
        teacher = PolicyTeacher(self.policy, f"policy:u{index:04d}", self.cfg.analyzer_max_new_tokens, stop=("}",))
        skills, stats = analyze(trajs, teacher, reask=False, max_skill_chars=self.cfg.max_skill_chars)
        parsed = [s for s in skills if s.parse_status.startswith("ok")]
        return skills, {
            "skills/parse_rate": stats.parse_rate,
            "skills/length_chars": _mean([len(s.skill) for s in parsed]),
            "skills/truncated": float(stats.truncated),
            "skills/analyzer_tokens": float(stats.completion_tokens),
        }

    @torch.no_grad()
    def rescore(self, trajs: list[Trajectory], skills: list[Skill | None]) -> Batch:
        texts = [s.skill if s is not None and s.parse_status.startswith("ok") else None for s in skills]
        steps = step_tokens(self.policy, trajs, texts)
        mb = self.cfg.micro_batch_tokens
        # With one PPO epoch over a single mini-batch no optimizer step happens before a step's loss, so its
        # pi_old log-probs are the training forward's own (detached): the separate pass would repeat it.
        on_policy = self.cfg.ppo_epochs == 1 and len(steps) <= self.cfg.mini_batch_steps
        old = None if on_policy else score_steps(self.policy, steps, "prompt", mb)
        ref = None
        if self.cfg.kl_coef > 0:
            ref = self._reference_logp(steps)
        teacher = score_steps(self.policy, steps, "teacher", mb) if self.spec.skills != "none" else [None] * len(steps)
        return Batch(trajs, skills, steps, old, ref, teacher, torch.zeros(len(steps)))

    def _reference_logp(self, steps: list[StepTokens]) -> list[torch.Tensor]:
        if self.ref_model is None:  # LoRA: the adapter-off model is the starting checkpoint
            with self.model.disable_adapter():
                return score_steps(self.policy, steps, "prompt", self.cfg.micro_batch_tokens)
        ref_policy = HFPolicy(self.ref_model, self.policy.tok, max_prompt_tokens=self.policy.max_prompt_tokens)
        return score_steps(ref_policy, steps, "prompt", self.cfg.micro_batch_tokens)

    def advantages(self, trajs: list[Trajectory], steps: list[StepTokens]) -> torch.Tensor:
        """(S,) advantage of each step: its trajectory's GRPO advantage, plus omega x GiGPO step advantage."""
        groups = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in trajs))}
        returns = torch.tensor([t.episode_return for t in trajs], dtype=torch.float32)
        group_ids = torch.tensor([groups[t.group_id] for t in trajs])
        episode = adv.grpo_advantages(returns, group_ids, norm=self.cfg.adv_norm)  # (N,)
        step_traj = torch.tensor([s.traj for s in steps])
        per_step = episode[step_traj]
        if self.cfg.advantage == "grpo":
            return per_step
        if self.cfg.advantage == "gigpo":
            rewards = torch.tensor([trajs[s.traj].steps[s.step].reward for s in steps], dtype=torch.float32)
            disc = adv.discounted_returns(rewards, step_traj, self.cfg.gigpo_gamma)
            anchors = adv.anchor_ids([trajs[s.traj].group_id for s in steps], [trajs[s.traj].steps[s.step].observation for s in steps])
            step_adv = adv.gigpo_step_advantages(disc, anchors, norm=self.cfg.adv_norm)
            return adv.gigpo_advantages(per_step, step_adv, self.cfg.gigpo_omega)
        raise ValueError(f"unknown rl.advantage {self.cfg.advantage!r}; valid: grpo, gigpo")

    def optimize(self, batch: Batch, index: int) -> dict[str, float]:
        """PPO epochs over shuffled mini-batches of steps; token-mean losses accumulated over micro-batches."""
        cfg = self.cfg
        self.model.train()
        g = torch.Generator().manual_seed(cfg.seed * 7_919 + index)
        sums: dict[str, float] = {}
        tokens_seen = 0
        grad_norms, skipped = [], 0
        for _ in range(cfg.ppo_epochs):
            perm = torch.randperm(len(batch.steps), generator=g).tolist()
            for s0 in range(0, len(perm), cfg.mini_batch_steps):
                mini = sorted(perm[s0 : s0 + cfg.mini_batch_steps], key=lambda i: len(batch.steps[i].prompt_ids) + len(batch.steps[i].response_ids))
                n_tokens = sum(len(batch.steps[i].response_ids) for i in mini)
                self.opt.zero_grad(set_to_none=True)
                finite = True
                lengths = [len(batch.steps[i].prompt_ids) + len(batch.steps[i].response_ids) for i in mini]
                for mb in micro_batches(lengths, cfg.micro_batch_tokens):
                    ids = [mini[j] for j in mb]
                    loss, stats, n = self._micro_loss(batch, ids)
                    if not torch.isfinite(loss):
                        finite = False
                        break
                    (loss * (n / n_tokens)).backward()
                    for k, v in stats.items():
                        sums[k] = sums.get(k, 0.0) + v * n
                    tokens_seen += n
                norm = torch.nn.utils.clip_grad_norm_(self.trainable, cfg.grad_clip) if finite else torch.tensor(float("nan"))
                if not finite or not torch.isfinite(norm):
                    # Nothing from a NaN/inf state ever reaches the weights (or a checkpoint).
                    self.opt.zero_grad(set_to_none=True)
                    skipped += 1
                    self.nonfinite_in_row += 1
                    if self.nonfinite_in_row >= cfg.max_nonfinite_in_row:
                        raise NonFiniteError(
                            f"{self.nonfinite_in_row} optimizer steps in a row had a non-finite loss or gradient "
                            f"(update {index}); stopping with the last good checkpoint intact. Lower rl.learning_rate "
                            "or check the model's dtype."
                        )
                    continue
                self.nonfinite_in_row = 0
                grad_norms.append(float(norm))
                self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        out = {k: v / max(tokens_seen, 1) for k, v in sums.items()}
        out["train/grad_norm"] = _mean(grad_norms)
        out["train/skipped_steps"] = float(skipped)
        return out

    def _micro_loss(self, batch: Batch, ids: list[int]) -> tuple[torch.Tensor, dict[str, float], int]:
        """Loss of one micro-batch of steps (token-mean within it) and its stats."""
        cfg = self.cfg
        steps = [batch.steps[i] for i in ids]
        logp_list = self.policy.score_batch([s.prompt_ids for s in steps], [s.response_ids for s in steps])
        logp = pad_sequence(logp_list, batch_first=True)  # (b, T)
        mask = pad_sequence([torch.ones(len(s.response_ids), dtype=torch.bool) for s in steps], batch_first=True)
        old = logp.detach() if batch.old_logp is None else pad_sequence([batch.old_logp[i] for i in ids], batch_first=True)
        advantage = batch.advantage[ids][:, None].expand_as(logp)
        pg, pg_stats = losses.ppo_clip_loss(logp, old, advantage, mask, cfg.clip_eps, cfg.dual_clip_c)
        loss = pg
        stats = {"loss/pg": pg.item(), "train/clip_frac": pg_stats["clip_frac"], "train/approx_kl": pg_stats["approx_kl"]}
        if batch.ref_logp is not None:
            ref = pad_sequence([batch.ref_logp[i] for i in ids], batch_first=True)
            kl = losses.kl_loss(logp, ref, mask)
            loss = loss + cfg.kl_coef * kl
            stats["loss/kl"] = kl.item()
        if self.spec.skills != "none":
            have = [batch.teacher_logp[i] is not None for i in ids]
            teacher = pad_sequence([batch.teacher_logp[i] if h else torch.zeros(len(steps[j].response_ids)) for j, (i, h) in enumerate(zip(ids, have))], batch_first=True)
            opd_mask = torch.tensor(have, dtype=torch.float32)  # no skill (failed analysis): no OPD signal
            opd, opd_stats = losses.gated_opd_loss(logp, teacher, mask, opd_mask, cfg.opd_beta, self.spec.gate)
            with torch.no_grad():
                delta = (teacher - logp) * mask
                for j, (i, h) in enumerate(zip(ids, have)):
                    if h and i not in batch.delta:
                        n = len(steps[j].response_ids)
                        gate_high = float((torch.sigmoid(cfg.opd_beta * delta[j, :n]) > 0.5).sum())
                        batch.delta[i] = (float(delta[j, :n].sum()), gate_high, n)
            loss = loss + cfg.opd_lambda * opd
            stats["loss/opd"] = opd.item()
            stats.update(opd_stats)
        return loss, stats, int(mask.sum())


def skill_corpus(batch: Batch, index: int) -> list[dict]:
    """One entry per analyzed trajectory: the skill, the episode it came from, and how far the skill moved the
    log-probs of the episode's own tokens under pi_old (mean Δ = teacher - student over its response tokens)."""
    per_traj: dict[int, list[float]] = {}
    for step, (dsum, high, n) in batch.delta.items():
        acc = per_traj.setdefault(batch.steps[step].traj, [0.0, 0.0, 0])
        acc[0], acc[1], acc[2] = acc[0] + dsum, acc[1] + high, acc[2] + n
    out = []
    for i, (traj, skill) in enumerate(zip(batch.trajs, batch.skills)):
        if skill is None:
            continue
        dsum, high, n = per_traj.get(i, (0.0, 0.0, 0))
        out.append({
            "update": index,
            **dataclasses.asdict(skill),
            "trajectory": {
                "won": traj.won, "episode_return": traj.episode_return, "length": traj.length,
                "invalid_count": traj.invalid_count, "task": traj.task, "actions": [s.action for s in traj.steps],
            },
            "rescore": {"tokens": n, "delta_mean": dsum / n if n else 0.0, "gate_gt_half_ratio": high / n if n else 0.0},
        })
    return out


def rollout_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    m = summarize(trajs)
    out = {"rollout/success_rate": m["success/micro"], "rollout/invalid_rate": m["invalid_rate"], "rollout/episode_length": m["episode_length"]}
    out.update({f"rollout/success_rate/{k.split('/', 1)[1]}": v for k, v in m.items() if k.startswith("success/") and k not in ("success/micro", "success/macro")})
    return out


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


# ---------------------------------------------------------------- epochs: checkpoints, resume, outputs


def fingerprint(params: Params, init_dir: Path) -> dict:
    """What a resumed run must share with the run that wrote the checkpoints."""
    relevant = {k: dataclasses.asdict(getattr(params, k)) for k in ("model", "env", "rollout", "rl")}
    relevant["rl"].pop("epochs")  # more epochs may be added to a finished run
    weights = sorted(init_dir.glob("*.safetensors"))
    if not weights:
        raise ModelError(f"no starting model in {init_dir}; run the stage that writes it (`dvc repro`)")
    init = hashlib.sha256(b"".join(hashlib.sha256(w.read_bytes()).digest() for w in weights)).hexdigest()
    return {"params": relevant, "init_model_sha256": init}


def run_folder_name(params: Params, init_dir: Path) -> str:
    """`<method>-<advantage>-s<seed>-<hash of the fingerprint>`: one folder per parameter set."""
    digest = hashlib.sha256(json.dumps(fingerprint(params, init_dir), sort_keys=True).encode()).hexdigest()[:10]
    return f"{params.rl.method}-{params.rl.advantage}-s{params.rl.seed}-{digest}"


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} -> {vb!r}")
    return out


def completed_epochs(run_dir: Path, upto: int | None = None) -> list[Path]:
    """The complete epoch folders of a run, in order; with `upto`, only epochs 1..upto. A run folder is shared by
    every `rl.epochs` value (more epochs extend a finished run), so a run of fewer epochs stops at its own last."""
    done = sorted(p for p in run_dir.glob("epoch_[0-9][0-9][0-9]") if (p / "state.json").exists())
    return [p for p in done if upto is None or int(p.name[-3:]) <= upto]


def save_epoch(trainer: Trainer, run_dir: Path, epoch: int, corpus: list[dict], updates: list[dict], validation: dict) -> Path:
    """Write one epoch's checkpoint, skill corpus and metrics into a temp folder, then rename it into place.

    A failure (non-finite weights, disk full, read-only folder) leaves no temp folder and every earlier epoch
    as it was."""
    final = run_dir / f"epoch_{epoch:03d}"
    tmp = run_dir / f".epoch_{epoch:03d}.tmp"
    weights = {k: v.detach().cpu().contiguous() for k, v in trainer.model.named_parameters() if v.requires_grad}
    if not all(torch.isfinite(v).all() for v in weights.values()):
        raise NonFiniteError("refusing to checkpoint non-finite weights")
    opt_state, opt_meta = {}, {}
    for i, st in trainer.opt.state_dict()["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v) and v.dim() > 0:
                opt_state[f"{i}.{k}"] = v.contiguous()
            else:
                opt_meta[f"{i}.{k}"] = float(v)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for name, tensors in (("trainable.safetensors", weights), ("optimizer.safetensors", opt_state)):
            try:
                save_file(tensors, tmp / name)
            except Exception as e:  # SafetensorError carries the OS error only in its text
                if not isinstance(e, OSError) and type(e).__name__ != "SafetensorError":
                    raise
                raise storage_error(final / name, e) from e
        write_jsonl(tmp / "skills.jsonl", corpus)
        write_json(tmp / "metrics.json", {"updates": updates, "validation": validation})
        write_json(tmp / "state.json", {"epoch": epoch, "optimizer_scalars": opt_meta, "nonfinite_in_row": trainer.nonfinite_in_row})
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, StorageError):
            raise
        raise storage_error(final, e) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load_epoch(trainer: Trainer, epoch_dir: Path) -> None:
    """Restore weights, optimizer state and counters from an epoch folder; an unreadable or incomplete one is a
    ModelError saying to delete it, so a run never resumes from wrong weights."""
    try:
        weights = load_file(epoch_dir / "trainable.safetensors")
        params = dict(trainer.model.named_parameters())
        missing = sorted({k for k, p in params.items() if p.requires_grad} - set(weights))
        unexpected = sorted(set(weights) - set(params))
        if missing or unexpected:
            raise KeyError(f"its tensors do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
        state = json.loads((epoch_dir / "state.json").read_text())
        tensors = load_file(epoch_dir / "optimizer.safetensors")
        sd = trainer.opt.state_dict()
        new_state: dict[int, dict] = {}
        for key, v in tensors.items():
            i, k = key.split(".", 1)
            new_state.setdefault(int(i), {})[k] = v
        for key, v in state["optimizer_scalars"].items():
            i, k = key.split(".", 1)
            new_state.setdefault(int(i), {})[k] = torch.tensor(v)
        nonfinite = int(state["nonfinite_in_row"])
    except Exception as e:  # SafetensorError, OSError, JSONDecodeError, KeyError, ...
        n = int(epoch_dir.name[-3:]) if epoch_dir.name[-3:].isdigit() else 0
        resume = f"resumes after epoch_{n - 1:03d}" if n > 1 else "starts again from the initial model"
        raise ModelError(
            f"checkpoint {epoch_dir} is unreadable ({type(e).__name__}: {e}); delete {epoch_dir} and re-run the rl "
            f"stage (`dvc repro rl`): it {resume} and trains that epoch again"
        ) from e
    with torch.no_grad():
        for k, v in weights.items():
            params[k].copy_(v)
    sd["state"] = new_state
    trainer.opt.load_state_dict(sd)
    trainer.nonfinite_in_row = nonfinite


def training_dtype(params: Params) -> torch.dtype:
    """LoRA: the frozen base in the machine's fast dtype (peft keeps the adapters in fp32). Full fine-tuning:
    fp32 on CPU, where AdamW on bf16 weights would round small updates away."""
    dtype = pick_dtype(params.model.dtype, "cuda" if torch.cuda.is_available() else "cpu")
    if params.rl.lora_r is None and not torch.cuda.is_available():
        return torch.float32
    return dtype


def games_for_update(train: list[GameEntry], cfg: RLConfig, index: int) -> list[GameEntry]:
    """B games for update `index`, a function of (seed, index) only, so a resumed run draws the same ones."""
    rng = random.Random(cfg.seed * 1_000_003 + index)
    return rng.sample(train, min(cfg.games_per_update, len(train)))


class RLRun:
    """The `rl` stage as epochs: `pending()` lists the epochs left, `run_epoch(e)` trains and checkpoints one,
    `finish()` writes the final model and metrics. A killed run resumes after its last complete epoch, and
    refuses to resume checkpoints made under different parameters."""

    def __init__(self, params: Params, init_dir: Path, manifest_dir: Path, run_dir: Path, log=print):
        cfg = self.cfg = params.rl
        method_spec(cfg.method)
        self.params, self.run_dir, self.log = params, run_dir, log
        self.root = data_root(params.data.alfworld_data)
        self.train = read_manifest(manifest_dir / "train.json", self.root)
        self.panel = read_manifest(manifest_dir / "valid_seen.json", self.root)[: cfg.validation_games]
        fixed = yaml.safe_load(Path(cfg.sdar_skills).read_text()) if cfg.method == "sdar" else None

        run_dir.mkdir(parents=True, exist_ok=True)
        fp, fp_path = fingerprint(params, init_dir), run_dir / "run.json"
        if fp_path.exists():
            old = json.loads(fp_path.read_text())
            if old != fp:
                changes = "; ".join(_diff(old, fp)) or "the starting model changed"
                raise ValueError(
                    f"{run_dir} holds epochs of a run made under different parameters ({changes}); "
                    f"delete {run_dir} to start over, or restore the parameters to resume"
                )
        else:
            write_json(fp_path, fp)

        seed_everything(cfg.seed)
        model, self.tok = load_model(init_dir, dtype=training_dtype(params))
        self.trainer = Trainer(model, self.tok, params, fixed)
        done = completed_epochs(run_dir, cfg.epochs)
        if done:
            load_epoch(self.trainer, done[-1])
            log(f"resuming after {done[-1].name}")
        self.done = len(done)
        self.pool = EnvPool(self.root, params.env.workers)
        from .tracking import Tracker

        self.tracker = Tracker("rl", dataclasses.asdict(params))

    def pending(self) -> list[int]:
        return list(range(self.done + 1, self.cfg.epochs + 1))

    def run_epoch(self, epoch: int) -> dict:
        cfg, trainer = self.cfg, self.trainer
        updates, corpus = [], []
        for u in range(cfg.updates_per_epoch):
            index = (epoch - 1) * cfg.updates_per_epoch + u
            seed_everything(cfg.seed * 10_000 + index)
            metrics, skills = trainer.update(self.pool, games_for_update(self.train, cfg, index), index)
            updates.append({"update": index, **metrics})
            corpus += skills
            self.tracker.log(metrics, step=index)
            self.log(
                f"epoch {epoch} update {index}: success {metrics['rollout/success_rate']:.2f} "
                f"skills parsed {metrics.get('skills/parse_rate', 0):.2f} "
                f"OPD active {metrics.get('opd/active_token_ratio', 0):.2f}"
            )
            if self.spec_uses_skills and metrics.get("skills/parse_rate", 0) == 0:
                self.log("no skill parsed in this update: OPD contributed nothing (skills/parse_rate = 0)")
        self.tracker.log_skills(corpus, step=epoch * cfg.updates_per_epoch - 1)
        validation = {}
        if self.panel:
            trainer.model.eval()
            val = play(trainer.policy, self.pool, self.panel, group_size=1, env=self.params.env,
                       gen=dataclasses.replace(self.params.rollout, temperature=0.0), seed=0, tag=f"rl/val/e{epoch}", progress=False)
            m = summarize(val)
            validation = {"val/success_rate": m["success/micro"], "val/invalid_rate": m["invalid_rate"]}
            self.tracker.log(validation, step=epoch * cfg.updates_per_epoch - 1)
        save_epoch(trainer, self.run_dir, epoch, corpus, updates, validation)
        self.done = epoch
        return {"epoch": epoch, **updates[-1], **validation}

    @property
    def spec_uses_skills(self) -> bool:
        return self.trainer.spec.skills != "none"

    def finish(self, final_dir: Path, metrics_path: Path, plots_path: Path) -> dict:
        """The final model (adapters merged into plain weights) and the run's metrics files."""
        self.pool.close()
        self.tracker.finish()
        model = self.trainer.model
        final = model.merge_and_unload() if self.cfg.lora_r is not None else model
        tmp = final_dir.with_name(f".{final_dir.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        final.save_pretrained(tmp, safe_serialization=True)
        self.tok.save_pretrained(tmp)
        shutil.rmtree(final_dir, ignore_errors=True)
        tmp.rename(final_dir)

        updates, vals = [], []
        for ep in completed_epochs(self.run_dir, self.cfg.epochs):
            m = json.loads((ep / "metrics.json").read_text())
            updates += m["updates"]
            vals.append({"epoch": int(ep.name[-3:]), **m["validation"]})
        write_json(plots_path, updates)
        keys = sorted({k for u in updates for k in u if k.startswith(("opd/", "skills/"))})
        summary = {
            "method": self.cfg.method,
            "advantage": self.cfg.advantage,
            "updates": len(updates),
            "last_update": {k: v for k, v in updates[-1].items() if k != "update"} if updates else {},
            "mean_over_updates": {k: _mean([u[k] for u in updates if k in u]) for k in keys},
            "validation": vals,
        }
        write_json(metrics_path, summary)
        return summary


def run_rl(params: Params, init_dir: Path, manifest_dir: Path, run_dir: Path, final_dir: Path, metrics_path: Path, plots_path: Path, log=print) -> dict:
    """Every pending epoch, then the final outputs (the Prefect flow does the same with one task per epoch)."""
    run = RLRun(params, init_dir, manifest_dir, run_dir, log)
    for epoch in run.pending():
        run.run_epoch(epoch)
    return run.finish(final_dir, metrics_path, plots_path)
