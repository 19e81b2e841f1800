"""Credit probe: how well a per-step signal tells the moves a solver calls optimal from the others.

SEED's claim is a dense, token-level credit signal where GRPO has one number per episode. Where a solver labels
every step (Sokoban: `envs/sokoban/room.step_labels`), the claim can be measured on one batch, without learning
curves: the AUC with which a method's per-step signal (GRPO's trajectory advantage, GiGPO's combined advantage,
SEED's Δ = teacher − student log-prob of the step's tokens, and its gate) ranks optimal steps above the rest.
- pooled: every (optimal, other) pair of steps in the batch;
- within: only pairs of steps of the same trajectory. A trajectory-level signal is constant there, so GRPO's
  within-trajectory AUC is exactly 0.5 by construction: this is where a dense signal has to show.
The AUC is the Mann-Whitney statistic, P(s_optimal > s_other) + P(tie) / 2, over the counted pairs (NaN when
there are none). Intervals are percentile bootstraps over clusters (a room's steps are not independent), each
drawn copy of a cluster a trajectory group of its own.

Pure torch; pairs are compared by broadcasting, so a batch of S steps costs S^2 comparisons (a few thousand
steps is fine).
"""

from __future__ import annotations

import math

import torch


def auc_counts(scores: torch.Tensor, positive: torch.Tensor, groups: torch.Tensor | None = None) -> tuple[float, int]:
    """(wins, pairs): over the (positive, negative) pairs, wins counts 1 per pair the positive scores higher and
    1/2 per tie.

    Args:
        scores: (S,) float, one signal value per step.
        positive: (S,) bool, True for the steps that should score higher (optimal moves).
        groups: (S,) int, a trajectory id per step; only pairs within one group count. None: all pairs.
    """
    pos, neg = scores[positive], scores[~positive]
    diff = pos[:, None] - neg[None, :]  # (P, N)
    win = (diff > 0).double() + 0.5 * (diff == 0).double()
    if groups is not None:
        same = groups[positive][:, None] == groups[~positive][None, :]
        return float(win[same].sum()), int(same.sum())
    return float(win.sum()), int(diff.numel())


def auc(scores: torch.Tensor, positive: torch.Tensor, groups: torch.Tensor | None = None) -> float:
    """The AUC of `scores` for `positive` (shapes as in `auc_counts`): pooled, or within `groups`; NaN without
    pairs."""
    wins, pairs = auc_counts(scores, positive, groups)
    return wins / pairs if pairs else math.nan


def bootstrap_auc(
    scores: torch.Tensor,
    positive: torch.Tensor,
    groups: torch.Tensor,
    clusters: torch.Tensor,
    within: bool,
    n: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of the AUC (pooled, or within `groups` when `within`) over `n` resamples of the
    `clusters` ((S,) int, e.g. the room of each step) with replacement; (nan, nan) when no resample has pairs."""
    ids = torch.unique(clusters)
    if not len(ids):
        return math.nan, math.nan
    members = [torch.nonzero(clusters == c).flatten() for c in ids]
    g = torch.Generator().manual_seed(seed)
    stride = int(groups.max()) + 1 if groups.numel() else 1
    values = []
    for _ in range(n):
        draw = torch.randint(len(ids), (len(ids),), generator=g)
        idx = torch.cat([members[int(d)] for d in draw])
        # each drawn copy is its own set of trajectories: pairs never join two copies of one trajectory
        copy = torch.cat([torch.full((len(members[int(d)]),), k) for k, d in enumerate(draw)])
        value = auc(scores[idx], positive[idx], groups[idx] + copy * stride if within else None)
        if not math.isnan(value):
            values.append(value)
    if not values:
        return math.nan, math.nan
    q = torch.tensor(values, dtype=torch.float64)
    tail = (1 - level) / 2
    return float(torch.quantile(q, tail)), float(torch.quantile(q, 1 - tail))


def credit_table(
    signals: dict[str, torch.Tensor],
    positive: torch.Tensor,
    groups: torch.Tensor,
    clusters: torch.Tensor,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """For each named (S,) signal: pooled and within-trajectory AUC with bootstrap intervals, pair counts, and the
    signal's mean on positive and on other steps. `positive`, `groups` (trajectory per step) and `clusters` (room
    per step) are (S,) as in `bootstrap_auc`. A signal may be NaN on steps it does not cover (no skill): those
    steps are left out of its row."""
    rows = {}
    for name, s in signals.items():
        keep = ~torch.isnan(s)
        s, pos, grp, clu = s[keep], positive[keep], groups[keep], clusters[keep]
        row: dict[str, float] = {"steps": int(keep.sum()), "positive": int(pos.sum())}
        for kind, grouping in (("pooled", None), ("within", grp)):
            wins, pairs = auc_counts(s, pos, grouping)
            lo, hi = bootstrap_auc(s, pos, grp, clu, grouping is not None, n_boot, seed) if n_boot else (math.nan,) * 2
            row |= {
                kind: wins / pairs if pairs else math.nan,
                f"{kind}_lo": lo,
                f"{kind}_hi": hi,
                f"{kind}_pairs": pairs,
            }
        row["mean_positive"] = float(s[pos].mean()) if pos.any() else math.nan
        row["mean_other"] = float(s[~pos].mean()) if (~pos).any() else math.nan
        rows[name] = row
    return rows
