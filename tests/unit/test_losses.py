"""seed_core.method.losses against hand-computed values, gradient checks, and a naive per-token loop."""

import math

import pytest
import torch

from seed_core.method.losses import (
    gated_opd_loss,
    kl_loss,
    kl_low_var,
    masked_mean,
    ppo_clip_loss,
    sampler_mismatch,
    truncated_is_weights,
)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_masked_mean_hand_value_ignores_garbage_padding():
    x = torch.tensor([[1.0, 2.0, float("inf")], [4.0, float("nan"), 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(7 / 3)


def test_masked_mean_empty_mask_is_zero():
    assert masked_mean(torch.ones(2, 3), torch.zeros(2, 3)).item() == 0.0


# Ratios 1.0, 1.5, 0.5, 1.1 with advantages 1, 1, -1, -1, and a padded token with ratio e^50.
PPO_RATIOS = [1.0, 1.5, 0.5, 1.1, math.exp(50)]
PPO_ADV = [1.0, 1.0, -1.0, -1.0, 1.0]
PPO_MASK = [1, 1, 1, 1, 0]


def ppo_inputs():
    logp = torch.tensor([[math.log(r) for r in PPO_RATIOS]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 5, dtype=torch.float64)
    return logp, old, torch.tensor([PPO_ADV], dtype=torch.float64), torch.tensor([PPO_MASK])


def test_ppo_clip_hand_values():
    logp, old, adv, mask = ppo_inputs()
    loss, stats = ppo_clip_loss(logp, old, adv, mask)
    # Per token: max(-1, -1) = -1; max(-1.5, -1.2) = -1.2 (clipped); max(0.5, 0.8) = 0.8 (clipped);
    # max(1.1, 1.1) = 1.1. Mean over the 4 valid tokens: -0.3 / 4.
    assert loss.item() == pytest.approx(-0.075)
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert stats["dual_clip_frac"] == 0.0
    assert stats["approx_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.5) + math.log(1.1)) / 4)
    loss.backward()
    # d/dlogp of -A * r is -A * r; clipped tokens and the padded token get no gradient.
    assert logp.grad[0].tolist() == pytest.approx([-1.0 / 4, 0.0, 0.0, 1.1 / 4, 0.0])


def test_ppo_dual_clip_bounds_large_ratio_with_negative_advantage():
    logp = torch.tensor([[3.0]], dtype=torch.float64, requires_grad=True)  # ratio e^3 ~ 20.1
    old = torch.zeros(1, 1, dtype=torch.float64)
    adv = torch.tensor([[-1.0]], dtype=torch.float64)
    mask = torch.ones(1, 1)
    loss, stats = ppo_clip_loss(logp, old, adv, mask, dual_clip_c=3.0)
    assert loss.item() == pytest.approx(3.0)  # min(max(e^3, 1.2), 3)
    assert stats["dual_clip_frac"] == 1.0
    loss.backward()
    assert logp.grad.item() == 0.0
    no_dual, _ = ppo_clip_loss(logp, old, adv, mask, dual_clip_c=None)
    assert no_dual.item() == pytest.approx(math.exp(3))


def test_ppo_dual_clip_leaves_positive_advantages_alone():
    logp = torch.tensor([[3.0]], dtype=torch.float64)
    loss, stats = ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([[1.0]]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-1.2)
    assert stats == pytest.approx({"clip_frac": 1.0, "dual_clip_frac": 0.0, "approx_kl": -3.0})


def naive_ppo(logp, old, adv, mask, eps=0.2, c=3.0) -> float:
    total, n = 0.0, 0
    for b in range(len(logp)):
        for t in range(len(logp[b])):
            if not mask[b][t]:
                continue
            r = math.exp(logp[b][t] - old[b][t])
            pg = max(-adv[b][t] * r, -adv[b][t] * min(max(r, 1 - eps), 1 + eps))
            if adv[b][t] < 0:
                pg = min(pg, -adv[b][t] * c)
            total, n = total + pg, n + 1
    return total / n if n else 0.0


def naive_opd(student, teacher, mask, opd_mask, beta=5.0) -> float:
    total, n = 0.0, 0
    for b in range(len(student)):
        for t in range(len(student[b])):
            if mask[b][t]:
                d = teacher[b][t] - student[b][t]
                total, n = total + opd_mask[b] * sigmoid(beta * d) * d, n + 1
    return total / n if n else 0.0


SHAPES = [(1, 1), (2, 3), (4, 7), (8, 16)]


@pytest.mark.parametrize("shape", SHAPES)
def test_ppo_matches_naive_loop(shape):
    gen = torch.Generator().manual_seed(shape[0] * 100 + shape[1])
    logp = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    old = logp + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.8
    adv = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = torch.rand(shape, generator=gen) < 0.7
    loss, _ = ppo_clip_loss(logp, old, adv, mask)
    assert loss.item() == pytest.approx(naive_ppo(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()))


@pytest.mark.parametrize("shape", SHAPES)
def test_opd_matches_naive_loop(shape):
    gen = torch.Generator().manual_seed(shape[0] * 100 + shape[1])
    student = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    teacher = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    mask = torch.rand(shape, generator=gen) < 0.7
    opd_mask = (torch.rand(shape[0], generator=gen) < 0.7).double()
    loss, _ = gated_opd_loss(student, teacher, mask, opd_mask)
    want = naive_opd(student.tolist(), teacher.tolist(), mask.tolist(), opd_mask.tolist())
    assert loss.item() == pytest.approx(want)


def test_kl_low_var_hand_values():
    logp = torch.zeros(1, 4, dtype=torch.float64)
    ref = torch.tensor([[0.0, 1.0, -1.0, 5.0]], dtype=torch.float64)
    # k3(d) = e^d - d - 1: 0, e - 2, e^-1, and e^5 - 6 ~ 142 clamped to 10.
    assert kl_low_var(logp, ref)[0].tolist() == pytest.approx([0.0, math.e - 2, math.exp(-1), 10.0])
    assert kl_loss(logp, ref, torch.tensor([[1, 1, 1, 0]])).item() == pytest.approx((math.e - 2 + math.exp(-1)) / 3)


def test_kl_low_var_zero_at_equality_positive_elsewhere():
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 5, generator=gen, dtype=torch.float64)
    assert kl_low_var(logp, logp).abs().max().item() == 0.0
    ref = logp + torch.randn(3, 5, generator=gen, dtype=torch.float64).clamp(min=1e-3)
    assert (kl_low_var(logp, ref) > 0).all()


# Sequence 0: delta 0 and 0.2 (gates 0.5, sigmoid(1)); sequence 1: delta -0.2 and a padded token.
OPD_STUDENT = [[-1.0, -2.0], [-0.5, -3.0]]
OPD_TEACHER = [[-1.0, -1.8], [-0.7, -3.0]]
OPD_MASK = [[1, 1], [1, 0]]


def opd_inputs(opd_mask):
    student = torch.tensor(OPD_STUDENT, dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor(OPD_TEACHER, dtype=torch.float64)
    return student, teacher, torch.tensor(OPD_MASK), torch.tensor(opd_mask)


def test_opd_hand_values_and_stats():
    student, teacher, mask, opd_mask = opd_inputs([1.0, 1.0])
    loss, _ = gated_opd_loss(student, teacher, mask, opd_mask)
    # (0.5 * 0 + sigmoid(1) * 0.2 + sigmoid(-1) * -0.2) / 3 valid tokens
    assert loss.item() == pytest.approx((0.2 * sigmoid(1) - 0.2 * sigmoid(-1)) / 3)

    student, teacher, mask, opd_mask = opd_inputs([1.0, 0.0])
    loss, stats = gated_opd_loss(student, teacher, mask, opd_mask)
    # Sequence 1 contributes nothing but its valid token still counts in the denominator.
    assert loss.item() == pytest.approx(0.2 * sigmoid(1) / 3)
    assert stats == pytest.approx(
        {
            "opd/active_token_ratio": 2 / 3,
            "opd/gate_mean": (0.5 + sigmoid(1)) / 2,
            "opd/gate_gt_half_ratio": 0.5,
            "opd/delta_mean": 0.1,
        }
    )
    assert all(isinstance(v, float) for v in stats.values())


def test_opd_gradient_is_minus_gate_over_valid_tokens():
    student, teacher, mask, opd_mask = opd_inputs([1.0, 0.0])
    loss, _ = gated_opd_loss(student, teacher, mask, opd_mask)
    loss.backward()
    g = torch.sigmoid(5.0 * (teacher - student.detach()))
    want = -g * mask * opd_mask[:, None] / 3
    assert torch.allclose(student.grad, want)
    assert student.grad.flatten().tolist() == pytest.approx([-0.5 / 3, -sigmoid(1) / 3, 0.0, 0.0])


def test_opd_failed_analysis_gets_exactly_zero_gradient():
    gen = torch.Generator().manual_seed(0)
    student = torch.randn(4, 6, generator=gen).requires_grad_()
    teacher = torch.randn(4, 6, generator=gen)
    opd_mask = torch.tensor([True, False, True, False])
    loss, _ = gated_opd_loss(student, teacher, torch.ones(4, 6), opd_mask)
    loss.backward()
    assert (student.grad[~opd_mask] == 0).all()
    assert (student.grad[opd_mask] < 0).all()


@pytest.mark.parametrize("gate", ["sigmoid", "constant"])
def test_opd_never_pushes_a_token_down(gate):
    gen = torch.Generator().manual_seed(1)
    student = (torch.randn(8, 16, generator=gen) * 3).requires_grad_()
    teacher = (torch.randn(8, 16, generator=gen) * 3).requires_grad_()
    mask = torch.rand(8, 16, generator=gen) < 0.8
    opd_mask = (torch.rand(8, generator=gen) < 0.7).float()
    loss, _ = gated_opd_loss(student, teacher, mask, opd_mask, gate=gate)
    loss.backward()
    # Gradient descent moves student_logp by -grad, so grad <= 0 means no token's log-prob is lowered.
    assert (student.grad <= 0).all()
    assert (student.grad[~mask] == 0).all()
    assert teacher.grad is None  # the teacher is a fixed target


def test_opd_constant_gate_is_exactly_half():
    student, teacher, mask, opd_mask = opd_inputs([1.0, 1.0])
    loss, stats = gated_opd_loss(student, teacher, mask, opd_mask, gate="constant")
    assert stats["opd/gate_mean"] == 0.5
    assert stats["opd/gate_gt_half_ratio"] == 0.0
    loss.backward()
    assert student.grad.flatten().tolist() == pytest.approx([-0.5 / 3, -0.5 / 3, -0.5 / 3, 0.0])


def test_opd_unknown_gate_lists_valid_values():
    student, teacher, mask, opd_mask = opd_inputs([1.0, 1.0])
    with pytest.raises(ValueError, match="valid: sigmoid, constant"):
        gated_opd_loss(student, teacher, mask, opd_mask, gate="hard")


def test_zero_mask_batch_gives_zero_loss_and_no_nan():
    logp = torch.randn(2, 3, requires_grad=True)
    other = torch.randn(2, 3)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    pg, pg_stats = ppo_clip_loss(logp, other, torch.randn(2, 3), mask)
    kl = kl_loss(logp, other, mask)
    opd, opd_stats = gated_opd_loss(logp, other, mask, torch.ones(2))
    total = pg + 0.01 * kl + 0.01 * opd
    assert [pg.item(), kl.item(), opd.item(), total.item()] == [0.0, 0.0, 0.0, 0.0]
    assert set(pg_stats.values()) == {0.0} and set(opd_stats.values()) == {0.0}
    total.backward()
    assert (logp.grad == 0).all()


def test_opd_no_active_tokens_gives_zero_stats():
    student, teacher, mask, _ = opd_inputs([0.0, 0.0])
    loss, stats = gated_opd_loss(student, teacher, mask, torch.zeros(2))
    assert loss.item() == 0.0
    assert stats == {
        "opd/active_token_ratio": 0.0,
        "opd/gate_mean": 0.0,
        "opd/gate_gt_half_ratio": 0.0,
        "opd/delta_mean": 0.0,
    }


def test_truncated_is_weights_hand_values():
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    sampler = torch.tensor([[-1.0, -1.0, -3.0]])  # ratios e^0, e^-1, e^2.5 (capped at 2)
    w = truncated_is_weights(old, sampler, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, math.exp(-1.0), 2.0]]))


def test_is_weights_scale_each_tokens_policy_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.ones(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    w = torch.tensor([[0.5, 2.0]])
    loss, _ = ppo_clip_loss(logp, logp.detach(), adv, mask, is_weights=w)
    loss.backward()
    # at ratio 1 the unclipped term's gradient is -A * r / n = -1/2 per token, times the token's weight
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, -1.0]]))
    plain = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ppo_clip_loss(plain, plain.detach(), adv, mask)[0].backward()
    torch.testing.assert_close(plain.grad, torch.tensor([[-0.5, -0.5]]))


def test_sampler_mismatch_hand_values():
    old = torch.tensor([[-1.0, -2.0, 9.0]])
    sampler = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    m = sampler_mismatch(old, sampler, mask)
    d = torch.tensor([0.5, -1.0])
    assert m["mismatch/abs_mean"] == pytest.approx(0.75)
    assert m["mismatch/abs_max"] == pytest.approx(1.0)  # the padded 9.0 is ignored
    assert m["mismatch/k3"] == pytest.approx(float((d.exp() - 1 - d).mean()))
    assert sampler_mismatch(old, sampler, torch.zeros(1, 3, dtype=torch.bool))["mismatch/abs_max"] == 0.0
