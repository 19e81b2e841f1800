"""Per-token losses of one SEED policy update: PPO clipped surrogate, low-variance KL, gated OPD.

Every loss takes (B, T) per-token tensors (B response sequences, T padded response length) and a (B, T)
mask of valid response tokens, and aggregates by token-mean: the sum over all valid tokens of the batch
divided by their number (0 when there are none, never NaN). The RL loop composes
L = pg + kl_coef * kl + lambda * opd (no entropy term: the paper's coefficient is 0, and the memory-lean scorer
never builds the full-vocabulary distributions an entropy needs).

Where this departs from, or pins down, the paper (Stage 2, step 5):
- PPO, KL and their numerical guards follow verl: log-ratios are clamped to [-20, 20] before `exp`, the
  dual clip bounds the loss of negative-advantage tokens by -A * c, and k3 is clamped to [-10, 10].
- Gated OPD divides by the number of valid tokens of the whole batch, including those of trajectories
  whose analysis failed (opd_mask 0): they contribute zero, but still count in the denominator, so the
  OPD term's scale per token does not grow when fewer analyses succeed, and it shares its denominator
  with the PPO term it is added to.
- gate="constant" (g = 0.5 everywhere) gives the GRPO+OPSD baseline, i.e. beta = 0.
- Sampler/trainer mismatch: when another engine samples (vLLM), its log-probs of the sampled tokens differ from
  the trainer's pi_old (other kernels, other precision), so the rollouts are slightly off-policy. The
  policy-gradient term is then weighted per token by truncated importance sampling, w = min(exp(pi_old -
  sampler), C) (Yao et al., "Your efficient RL framework secretly brings you off-policy RL training", 2025; verl
  and trl do the same), detached: the token-level correction is cheap, unbiased where w < C, and the cap C bounds
  the variance a rare token with a tiny sampler probability would add. KL and OPD terms are not weighted: they
  compare the trainer with itself.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

Gate = Literal["sigmoid", "constant"]

# verl's guard: exp of a log-ratio beyond this overflows or dominates the batch.
_LOG_RATIO_CLAMP = 20.0


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean of `x` over the valid positions of `mask`.

    Args:
        x: (B, T) or any shape.
        mask: same shape as `x`, bool or float (1 = valid).

    Returns:
        scalar tensor; 0 when the mask is empty.
    """
    valid = mask.bool()
    # `where`, not multiplication: padded positions may hold garbage such as inf, and inf * 0 is NaN.
    total = torch.where(valid, x, torch.zeros_like(x)).sum()
    return total / valid.sum().clamp(min=1)


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    dual_clip_c: float | None = 3.0,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with optional dual clip, token-mean aggregated.

    pg = max(-A * r, -A * clip(r, 1 - eps, 1 + eps)) with r = exp(logp - old_logp); when dual_clip_c is
    set, tokens with A < 0 use min(pg, -A * c), which bounds the loss of a very large ratio.

    Args:
        logp: (B, T) log-probs of the sampled tokens under the current policy (with grad).
        old_logp: (B, T) log-probs under the rollout policy pi_old.
        advantages: (B, T) per-token advantages (already broadcast over each step's tokens).
        mask: (B, T) bool/float, valid response tokens.
        clip_eps: clip range of the ratio.
        dual_clip_c: dual-clip constant (> 1), or None to disable.
        is_weights: (B, T) per-token importance weights (`truncated_is_weights`) multiplying each token's loss, or
            None.

    Returns:
        loss: scalar.
        stats: "clip_frac", fraction of valid tokens where the clipped branch is the larger loss;
            "dual_clip_frac", fraction of valid tokens where the dual clip bounds the loss;
            "approx_kl", token-mean of old_logp - logp. Python floats.
    """
    log_ratio = (logp - old_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_eps, 1 + clip_eps)
    pg = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(mask, dtype=torch.bool)
    if dual_clip_c is not None:
        bound = -advantages * dual_clip_c
        dual_clipped = (advantages < 0) & (pg > bound)
        pg = torch.where(dual_clipped, bound, pg)
    if is_weights is not None:
        pg = pg * is_weights.detach()
    with torch.no_grad():
        stats = {
            "clip_frac": masked_mean((clipped > unclipped).float(), mask).item(),
            "dual_clip_frac": masked_mean(dual_clipped.float(), mask).item(),
            "approx_kl": masked_mean(-log_ratio, mask).item(),
        }
    return masked_mean(pg, mask), stats


def truncated_is_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float = 2.0) -> torch.Tensor:
    """Per-token truncated importance weights min(exp(old_logp - sampler_logp), cap), detached.

    Args:
        old_logp: (B, T) pi_old's log-probs of the sampled tokens, computed by the trainer.
        sampler_logp: (B, T) the sampler's log-probs of the same tokens (the distribution it sampled from).
        cap: C >= 1, the largest weight.

    Returns:
        (B, T) weights in [0, cap].
    """
    log_ratio = (old_logp - sampler_logp).detach().clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return log_ratio.exp().clamp(max=cap)


def sampler_mismatch(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the sampler's log-probs are from the trainer's on the sampled tokens.

    Args:
        old_logp: (B, T) trainer log-probs; sampler_logp: (B, T) sampler log-probs; mask: (B, T) valid tokens.

    Returns:
        "mismatch/abs_mean" and "mismatch/abs_max" of |old - sampler|, and "mismatch/k3", the token-mean k3 estimate
        of KL(sampler || trainer) from the sampler's own samples: r - 1 - log r with r = exp(old - sampler).
        Python floats, 0.0 without valid tokens.
    """
    with torch.no_grad():
        diff = (old_logp - sampler_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        valid = mask.bool()
        return {
            "mismatch/abs_mean": masked_mean(diff.abs(), valid).item(),
            "mismatch/abs_max": diff.abs()[valid].max().item() if valid.any() else 0.0,
            "mismatch/k3": masked_mean(diff.exp() - 1 - diff, valid).item(),
        }


def kl_low_var(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10].

    Non-negative, 0 where logp == ref_logp; the clamp (as in verl) caps rare huge values.

    Args:
        logp: (B, T) log-probs under the current policy (with grad).
        ref_logp: (B, T) log-probs under the reference model.

    Returns:
        (B, T) per-token KL estimates.
    """
    diff = (ref_logp - logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return (diff.exp() - diff - 1).clamp(-10.0, 10.0)


def kl_loss(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean of `kl_low_var`.

    Args:
        logp: (B, T) current-policy log-probs (with grad).
        ref_logp: (B, T) reference log-probs.
        mask: (B, T) bool/float, valid response tokens.

    Returns:
        scalar.
    """
    return masked_mean(kl_low_var(logp, ref_logp), mask)


def opd_gate(
    delta: torch.Tensor, beta: float = 5.0, gate: Gate = "sigmoid", constant_gate: float = 0.5
) -> torch.Tensor:
    """The OPD gate g of each token: sigmoid(beta * delta) for gate="sigmoid", `constant_gate` for "constant".

    Args:
        delta: (B, T) teacher - student log-probs (detached).
    Returns:
        (B, T) gate values in [0, 1].
    """
    if gate not in get_args(Gate):
        raise ValueError(f"unknown gate {gate!r}; valid: {', '.join(get_args(Gate))}")
    return torch.sigmoid(beta * delta) if gate == "sigmoid" else torch.full_like(delta, constant_gate)


def gated_opd_loss(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor,
    opd_mask: torch.Tensor,
    beta: float = 5.0,
    gate: Gate = "sigmoid",
    constant_gate: float = 0.5,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Gated on-policy distillation toward the skill-conditioned teacher.

    delta = teacher - sg(student); g = sg(sigmoid(beta * delta)), or `constant_gate` for gate="constant";
    L = sum over valid tokens of opd_mask * g * (teacher - student) / number of valid tokens.
    The gradient w.r.t. student_logp is -opd_mask * g / num_valid <= 0 on valid tokens: no token is ever
    pushed down, and tokens the skill makes more likely (delta > 0) are pushed up hardest.

    Args:
        student_logp: (B, T) log pi_theta(a | h) of the sampled tokens, with grad.
        teacher_logp: (B, T) log pi_old(a | h with skill) of the same tokens; detached here regardless.
        mask: (B, T) bool/float, valid response tokens; also the denominator of the token-mean.
        opd_mask: (B,) bool/float, 0 for sequences whose trajectory's analysis failed.
        beta: gate sharpness for gate="sigmoid".
        gate: "sigmoid" (SEED) or "constant" (GRPO+OPSD).
        constant_gate: g for gate="constant".

    Returns:
        loss: scalar.
        stats: over active tokens (valid and opd_mask 1), python floats, 0.0 when there are none:
            "opd/active_token_ratio" (active / valid tokens), "opd/gate_mean", "opd/gate_gt_half_ratio",
            "opd/delta_mean".
    """
    teacher_logp = teacher_logp.detach()
    delta = teacher_logp - student_logp.detach()
    g = opd_gate(delta, beta, gate, constant_gate)
    weight = opd_mask.to(student_logp.dtype)[:, None] * g
    loss = masked_mean(weight * (teacher_logp - student_logp), mask)
    with torch.no_grad():
        active = mask.bool() & opd_mask.bool()[:, None]
        stats = {
            "opd/active_token_ratio": (active.sum() / mask.bool().sum().clamp(min=1)).item(),
            "opd/gate_mean": masked_mean(g, active).item(),
            "opd/gate_gt_half_ratio": masked_mean((g > 0.5).float(), active).item(),
            "opd/delta_mean": masked_mean(delta, active).item(),
        }
    return loss, stats
