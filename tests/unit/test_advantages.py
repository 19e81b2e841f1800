"""seed_core.method.advantages against hand-computed numbers and a naive per-group python loop."""

import math
import statistics

import pytest
import torch

from seed_core.method.advantages import (
    anchor_ids,
    discounted_returns,
    gigpo_advantages,
    gigpo_step_advantages,
    grpo_advantages,
)

EPS = 1e-6


def naive_group_normalize(values: list[float], ids: list[int], norm: str, eps: float = EPS) -> list[float]:
    out = []
    for v, i in zip(values, ids):
        group = [w for w, j in zip(values, ids) if j == i]
        if len(group) == 1 or len(set(group)) == 1:
            out.append(0.0)
            continue
        centered = v - statistics.mean(group)
        out.append(centered / (statistics.stdev(group) + eps) if norm == "mean_std" else centered)
    return out


def naive_discounted(rewards: list[float], trajs: list[int], gamma: float) -> list[float]:
    out = []
    for s, t in enumerate(trajs):
        later = [r for r, u in zip(rewards[s:], trajs[s:]) if u == t]
        out.append(sum(gamma**k * r for k, r in enumerate(later)))
    return out


def make_batch(group_size: int, num_groups: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random returns (float64) with every other group all-equal, shuffled, with sparse non-contiguous ids."""
    gen = torch.Generator().manual_seed(seed)
    returns, ids = [], []
    for g in range(num_groups):
        if g % 2:
            values = [float(torch.randint(-3, 4, (), generator=gen))] * group_size
        else:
            # Rewards on ALFWorld's grid (10 * won - 0.1 * invalid steps), so ties within a group happen.
            won = torch.randint(0, 2, (group_size,), generator=gen)
            invalid_steps = torch.randint(0, 4, (group_size,), generator=gen)
            values = (10 * won - 0.1 * invalid_steps).tolist()
        returns += values
        ids += [1000 + 7 * g] * group_size
    perm = torch.randperm(len(ids), generator=gen)
    return torch.tensor(returns, dtype=torch.float64)[perm], torch.tensor(ids)[perm]


@pytest.mark.parametrize("norm", ["mean_std", "mean"])
@pytest.mark.parametrize("num_groups", [1, 2, 5])
@pytest.mark.parametrize("group_size", [1, 2, 3, 8])
def test_grpo_matches_naive_loop(group_size, num_groups, norm):
    returns, ids = make_batch(group_size, num_groups, seed=group_size * 10 + num_groups)
    got = grpo_advantages(returns, ids, norm=norm)
    want = naive_group_normalize(returns.tolist(), ids.tolist(), norm)
    assert got.shape == (group_size * num_groups,)
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=1e-9)


@pytest.mark.parametrize("norm", ["mean_std", "mean"])
def test_grpo_mixed_group_sizes_match_naive_loop(norm):
    gen = torch.Generator().manual_seed(0)
    ids = torch.tensor([5, 2, 2, 9, 5, 5, 3, 2, 5, 5, 5, 5, 5, 5])  # sizes 9, 3, 1, 1
    returns = torch.randn(len(ids), generator=gen, dtype=torch.float64)
    want = naive_group_normalize(returns.tolist(), ids.tolist(), norm)
    assert torch.allclose(grpo_advantages(returns, ids, norm=norm), torch.tensor(want, dtype=torch.float64), atol=1e-9)


def test_grpo_hand_example():
    # mean 2.5; deviations 7.5, -2.5 x3; unbiased var = (56.25 + 3 * 6.25) / 3 = 25, std 5.
    adv = grpo_advantages(torch.tensor([10.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]))
    assert adv.tolist() == pytest.approx([7.5 / (5 + EPS), -2.5 / (5 + EPS), -2.5 / (5 + EPS), -2.5 / (5 + EPS)])
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    mean_only = grpo_advantages(torch.tensor([10.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]), norm="mean")
    assert mean_only.tolist() == [7.5, -2.5, -2.5, -2.5]


@pytest.mark.parametrize("norm", ["mean_std", "mean"])
def test_grpo_singleton_and_equal_groups_are_exactly_zero(norm):
    # In float32 the mean of eight 0.3s is off by an ulp, which (x - mean) / (std + 1e-6) turns into
    # 0.029 for every member without the explicit equal-group rule.
    returns = torch.tensor([0.3] * 8 + [9.7, 9.7, 3.0], dtype=torch.float32)
    ids = torch.tensor([0] * 8 + [1, 1, 2])
    adv = grpo_advantages(returns, ids, norm=norm)
    assert adv.tolist() == [0.0] * 11
    assert not adv.isnan().any()


def test_grpo_unknown_norm_lists_valid_values():
    with pytest.raises(ValueError, match="valid: mean_std, mean"):
        grpo_advantages(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]), norm="std")


def test_discounted_returns_hand_example():
    # Trajectory 0: [0, 0, 10] -> [0.95^2 * 10, 0.95 * 10, 10]; trajectory 1: [-0.1, 10] -> [-0.1 + 9.5, 10];
    # trajectory 2: a single step.
    rewards = torch.tensor([0.0, 0.0, 10.0, -0.1, 10.0, 3.0], dtype=torch.float64)
    trajs = torch.tensor([0, 0, 0, 1, 1, 2])
    got = discounted_returns(rewards, trajs, gamma=0.95)
    assert got.tolist() == pytest.approx([9.025, 9.5, 10.0, 9.4, 10.0, 3.0])
    assert got.dtype == torch.float64


@pytest.mark.parametrize("num_trajs,max_len", [(1, 1), (3, 5), (8, 30)])
def test_discounted_returns_match_naive_loop(num_trajs, max_len):
    gen = torch.Generator().manual_seed(num_trajs)
    lengths = torch.randint(1, max_len + 1, (num_trajs,), generator=gen).tolist()
    trajs = torch.tensor([t for t, n in enumerate(lengths) for _ in range(n)])
    rewards = torch.randn(len(trajs), generator=gen, dtype=torch.float64)
    want = naive_discounted(rewards.tolist(), trajs.tolist(), 0.95)
    assert torch.allclose(discounted_returns(rewards, trajs, 0.95), torch.tensor(want, dtype=torch.float64))


def test_anchor_ids_group_equal_pairs_only():
    ids = anchor_ids([0, 0, 1, 0, 1, 1], ["a", "b", "a", "a", "a", "b"])
    # ("a" in group 0) and ("a" in group 1) are different anchors: the same text in another game.
    assert ids.tolist() == [0, 1, 2, 0, 2, 3]
    assert ids.dtype == torch.long


def test_anchor_ids_length_mismatch():
    with pytest.raises(ValueError, match="2 entries but observations has 1"):
        anchor_ids([0, 0], ["a"])


def test_gigpo_step_advantages_hand_example():
    # Two rollouts of one game, gamma 0.95. Rollout A: start -> kitchen -> win (rewards 0, 0, 10).
    # Rollout B: start -> hall -> kitchen, fails (rewards 0, 0, 0).
    obs = ["start", "kitchen", "fridge", "start", "hall", "kitchen"]
    anchors = anchor_ids([0] * 6, obs)
    returns = discounted_returns(
        torch.tensor([0.0, 0.0, 10.0, 0.0, 0.0, 0.0], dtype=torch.float64), torch.tensor([0, 0, 0, 1, 1, 1]), 0.95
    )
    adv = gigpo_step_advantages(returns, anchors, norm="mean")
    # "start": returns 9.025 and 0 (mean 4.5125); "kitchen": 9.5 and 0 (mean 4.75); the rest are singletons.
    assert adv.tolist() == pytest.approx([4.5125, 4.75, 0.0, -4.5125, 0.0, -4.75])
    adv_std = gigpo_step_advantages(returns, anchors)
    # Two-member groups: |x - mean| = d / 2 and unbiased std = d / sqrt(2), so A = +-sqrt(2) / 2.
    h = math.sqrt(2) / 2
    assert adv_std.tolist() == pytest.approx([h, h, 0.0, -h, 0.0, -h], abs=1e-6)


@pytest.mark.parametrize("norm", ["mean_std", "mean"])
def test_gigpo_step_advantages_match_naive_loop(norm):
    gen = torch.Generator().manual_seed(1)
    groups = torch.randint(0, 3, (40,), generator=gen).tolist()
    obs = [f"room {k}" for k in torch.randint(0, 5, (40,), generator=gen).tolist()]
    anchors = anchor_ids(groups, obs)
    returns = torch.randint(0, 3, (40,), generator=gen).double() * 0.95
    want = naive_group_normalize(returns.tolist(), [hash((g, o)) for g, o in zip(groups, obs)], norm)
    assert torch.allclose(gigpo_step_advantages(returns, anchors, norm=norm), torch.tensor(want, dtype=torch.float64))


def test_gigpo_advantages_combine_with_omega():
    episode = torch.tensor([1.0, 1.0, -1.0])
    step = torch.tensor([2.0, -4.0, 0.5])
    assert gigpo_advantages(episode, step, omega=0.5).tolist() == [2.0, -1.0, -0.75]
    assert gigpo_advantages(episode, step).tolist() == [3.0, -3.0, -0.5]
