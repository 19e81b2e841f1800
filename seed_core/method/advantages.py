"""Advantage estimators: GRPO (trajectory level) and GiGPO (episode + anchor-state step level).

GRPO (Stage 2, step 5 of the method): a trajectory's advantage is its return normalized within its group
(the N rollouts of one game), A = (R - mean_group(R)) / (std_group(R) + eps); the caller broadcasts it to
every response token of every step of the trajectory.

GiGPO (a baseline): advantage = episode advantage + omega * step advantage, where the step advantage
normalizes discounted returns-to-go (gamma = 0.95) within "anchor groups": steps of the same game group
whose raw observation is identical.

Choices the paper leaves open, and departures from the verl lineage:
- std is the unbiased (n - 1) estimate, as `torch.std` and verl compute it.
- A group of one (a singleton GRPO group, or an anchor state seen once) gets advantage exactly 0 under
  both normalizations: it has nothing to be compared with. verl-agent's step level does the same; verl's
  GRPO instead gives a singleton its raw return (mean 0, std 1), which we do not copy.
- A group whose values are all equal gets advantage exactly 0. The formula already gives ~0, but float
  rounding in the mean leaves a residue of order ulp / eps (0.03 for eight float32 rewards of 0.3 with
  eps = 1e-6), so we zero such groups explicitly.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

Norm = Literal["mean_std", "mean"]


def _group_normalize(values: torch.Tensor, ids: torch.Tensor, norm: Norm, eps: float) -> torch.Tensor:
    """Normalize `values` within the groups given by `ids`, vectorized over all groups.

    Args:
        values: (N,) float.
        ids: (N,) long, any integers; equal ids form a group, members need not be contiguous.
        norm: "mean_std" -> (v - mean) / (std + eps); "mean" -> v - mean.
        eps: added to the std.

    Returns:
        (N,) same dtype as `values`; 0 for singleton groups and for groups of equal values.
    """
    if norm not in get_args(Norm):
        raise ValueError(f"unknown norm {norm!r}; valid: {', '.join(get_args(Norm))}")
    if values.dim() != 1 or values.shape != ids.shape:
        raise ValueError(f"values and ids must both be (N,), got {tuple(values.shape)} and {tuple(ids.shape)}")
    # Compact arbitrary ids to 0..G-1 so per-group statistics live in dense (G,) tensors.
    _, inverse = torch.unique(ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(
        0, inverse, torch.ones_like(values)
    )
    mean = torch.zeros_like(count).index_add_(0, inverse, values) / count
    centered = values - mean[inverse]
    if norm == "mean_std":
        sq_sum = torch.zeros_like(count).index_add_(0, inverse, centered**2)
        # Unbiased variance; clamp the denominator so singletons do not divide by zero (they are zeroed below).
        std = (sq_sum / (count - 1).clamp(min=1)).sqrt()
        centered = centered / (std[inverse] + eps)
    group_max = torch.full_like(count, -torch.inf).scatter_reduce_(0, inverse, values, reduce="amax")
    group_min = torch.full_like(count, torch.inf).scatter_reduce_(0, inverse, values, reduce="amin")
    constant = (group_max == group_min)[inverse]  # also true for every singleton
    return torch.where(constant, torch.zeros_like(centered), centered)


def grpo_advantages(
    returns: torch.Tensor, group_ids: torch.Tensor, norm: Norm = "mean_std", eps: float = 1e-6
) -> torch.Tensor:
    """GRPO trajectory advantages, normalized within each group.

    Args:
        returns: (N,) float, one return per trajectory.
        group_ids: (N,) long, trajectories of the same game share an id.
        norm: "mean_std" (the paper) or "mean" (no division by the std).
        eps: added to the group std.

    Returns:
        (N,) advantages; 0 for singleton groups and groups with equal returns.
    """
    return _group_normalize(returns, group_ids, norm, eps)


def discounted_returns(step_rewards: torch.Tensor, traj_index: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per-trajectory discounted return-to-go, G_t = r_t + gamma * G_{t+1}, restarting at each trajectory.

    Args:
        step_rewards: (S,) float, one reward per step; a trajectory's steps are contiguous and in order.
        traj_index: (S,) long, the trajectory each step belongs to.
        gamma: discount factor.

    Returns:
        (S,) returns-to-go, same dtype as `step_rewards`.
    """
    if step_rewards.dim() != 1 or step_rewards.shape != traj_index.shape:
        raise ValueError(
            f"step_rewards and traj_index must both be (S,), got {tuple(step_rewards.shape)} "
            f"and {tuple(traj_index.shape)}"
        )
    rewards, trajs = step_rewards.tolist(), traj_index.tolist()
    out = [0.0] * len(rewards)
    running = 0.0
    for s in reversed(range(len(rewards))):
        # The last step of a trajectory (next step belongs to another one) starts a fresh sum.
        is_last = s == len(rewards) - 1 or trajs[s + 1] != trajs[s]
        running = rewards[s] + (0.0 if is_last else gamma * running)
        out[s] = running
    return torch.tensor(out, dtype=step_rewards.dtype, device=step_rewards.device)


def anchor_ids(group_ids: list, observations: list[str]) -> torch.Tensor:
    """Map each step to an anchor-state id: equal (group id, raw observation) pairs share an id.

    Args:
        group_ids: length S, the game group of each step (any hashable values).
        observations: length S, the raw environment observation each step acted on.

    Returns:
        (S,) long, ids numbered 0, 1, ... in order of first appearance.
    """
    if len(group_ids) != len(observations):
        raise ValueError(f"group_ids has {len(group_ids)} entries but observations has {len(observations)}")
    index: dict[tuple, int] = {}
    ids = [index.setdefault((g, o), len(index)) for g, o in zip(group_ids, observations)]
    return torch.tensor(ids, dtype=torch.long)


def gigpo_step_advantages(
    step_returns: torch.Tensor, anchor_ids: torch.Tensor, norm: Norm = "mean_std", eps: float = 1e-6
) -> torch.Tensor:
    """GiGPO step-level advantages: discounted returns normalized within each anchor group.

    Args:
        step_returns: (S,) float, discounted return-to-go of each step (see `discounted_returns`).
        anchor_ids: (S,) long, from `anchor_ids(...)`.
        norm: "mean_std" or "mean", as in `grpo_advantages`.
        eps: added to the anchor-group std.

    Returns:
        (S,) step advantages; 0 for anchor states seen once and anchor groups with equal returns.
    """
    return _group_normalize(step_returns, anchor_ids, norm, eps)


def gigpo_advantages(episode_adv_per_step: torch.Tensor, step_adv: torch.Tensor, omega: float = 1.0) -> torch.Tensor:
    """GiGPO combined advantage, episode + omega * step.

    Args:
        episode_adv_per_step: (S,) the trajectory's GRPO advantage repeated for each of its steps.
        step_adv: (S,) from `gigpo_step_advantages`.
        omega: weight of the step term (1.0 in GiGPO).

    Returns:
        (S,) per-step advantages, to be broadcast over each step's response tokens.
    """
    return episode_adv_per_step + omega * step_adv
