"""The credit probe's AUC (`seed_core.method.credit`): hand-computed cases, ties, the within-trajectory variant,
GRPO's 0.5 by construction, and the bootstrap interval."""

import math

import pytest
import torch

from seed_core.method.credit import auc, auc_counts, bootstrap_auc, credit_table

SCORES = torch.tensor([0.9, 0.4, 0.4, 0.1])
POSITIVE = torch.tensor([True, True, False, False])


def test_pooled_auc_by_hand_with_a_tie():
    # pairs (positive, negative): 0.9>0.4, 0.9>0.1, 0.4=0.4 (half), 0.4>0.1 -> 3.5 of 4
    assert auc_counts(SCORES, POSITIVE) == (3.5, 4)
    assert auc(SCORES, POSITIVE) == 0.875
    assert auc(-SCORES, POSITIVE) == 0.125  # reversed ranking, the tie still half


@pytest.mark.parametrize(
    "groups, wins, pairs",
    [
        ([0, 1, 0, 1], 2.0, 2),  # 0.9 vs 0.4 in trajectory 0, 0.4 vs 0.1 in trajectory 1
        ([0, 0, 0, 1], 1.5, 2),  # 0.9 vs 0.4 and the tie 0.4 vs 0.4; 0.1 has no positive beside it
        ([0, 0, 1, 1], 0.0, 0),  # no trajectory holds both kinds
    ],
)
def test_within_trajectory_auc_counts_only_pairs_of_one_trajectory(groups, wins, pairs):
    assert auc_counts(SCORES, POSITIVE, torch.tensor(groups)) == (wins, pairs)
    value = auc(SCORES, POSITIVE, torch.tensor(groups))
    assert value == wins / pairs if pairs else math.isnan(value)


def test_a_trajectory_level_signal_is_exactly_half_within_trajectories():
    g = torch.Generator().manual_seed(0)
    traj = torch.randint(0, 12, (200,), generator=g)
    advantage = torch.randn(12, generator=g)[traj]  # GRPO: one number per trajectory, broadcast to its steps
    optimal = torch.rand(200, generator=g) < 0.4
    assert auc(advantage, optimal, traj) == 0.5
    assert auc(advantage, optimal) != 0.5  # pooled, trajectories with more optimal steps can rank higher


def test_credit_table_rows_skip_uncovered_steps_and_bracket_the_estimate():
    g = torch.Generator().manual_seed(1)
    n = 120
    traj = torch.arange(n) // 6  # 20 trajectories of 6 steps
    room = traj // 4  # 5 rooms of 4 trajectories
    optimal = torch.rand(n, generator=g) < 0.5
    informative = optimal.float() + 0.8 * torch.randn(n, generator=g)
    partial = informative.clone()
    partial[:30] = math.nan  # steps without a skill
    rows = credit_table({"dense": informative, "partial": partial}, optimal, traj, room, n_boot=200, seed=3)
    dense = rows["dense"]
    assert dense["steps"] == n and rows["partial"]["steps"] == n - 30
    assert dense["pooled"] == auc(informative, optimal)
    assert dense["within"] == auc(informative, optimal, traj)
    assert dense["pooled_lo"] <= dense["pooled"] <= dense["pooled_hi"]
    assert dense["within_lo"] <= dense["within"] <= dense["within_hi"]
    assert dense["within_lo"] > 0.5  # the signal carries credit, and the interval says so
    assert dense["mean_positive"] > dense["mean_other"]
    # the same seed gives the same interval; no bootstrap leaves it NaN
    assert bootstrap_auc(informative, optimal, traj, room, True, 200, 3) == (dense["within_lo"], dense["within_hi"])
    bare = credit_table({"dense": informative}, optimal, traj, room, n_boot=0)["dense"]
    assert math.isnan(bare["pooled_lo"]) and bare["pooled"] == dense["pooled"]


def test_bootstrap_keeps_each_drawn_copy_of_a_trajectory_apart():
    # one room, one trajectory: every resample draws that room once, so the interval is the point itself; if
    # copies were merged a room drawn twice would compare a step with its own copy
    scores = torch.tensor([0.2, 0.9, 0.5])
    optimal = torch.tensor([True, False, False])
    lo, hi = bootstrap_auc(
        scores, optimal, torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long), True, 50
    )
    assert lo == hi == auc(scores, optimal, torch.zeros(3, dtype=torch.long)) == 0.0
