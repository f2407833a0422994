"""The decoupled PPO loss on hand-computed cases: standard PPO when behaviour == proximal, exact truncated
importance weights when the behaviour policy is stale, aggregation, masks, and the optional terms."""
from __future__ import annotations

import math

import pytest
import torch

from core.loss import (
    LossSettings,
    aggregation_weights,
    behaviour_weights,
    decoupled_ppo_loss,
    finish_stats,
    kl_penalty,
)

S = LossSettings(clip_eps_low=0.2, clip_eps_high=0.28, behaviour_weight_cap=2.0)


def logs(values):
    return torch.log(torch.tensor(values, dtype=torch.float64))


def token_mean(n: int) -> torch.Tensor:
    return torch.full((n,), 1.0 / n, dtype=torch.float64)


def test_behaviour_equal_to_proximal_is_standard_clipped_ppo():
    ratio = [0.5, 0.5, 1.0, 1.25, 1.25, 1.5, 1.5]
    A = [1.0, -1.0, 2.0, 1.0, -1.0, 1.0, -2.0]
    # -min(r A, clip(r, 0.8, 1.28) A) by hand:
    hand = [-0.5,  # r=0.5, A=+1: min(0.5, 0.8) = 0.5
            0.8,  # r=0.5, A=-1: min(-0.5, -0.8) = -0.8, clipped low
            -2.0,  # r=1: no clipping
            -1.25,  # r=1.25 < 1.28 with clip-higher: not clipped
            1.25,  # A<0: min(-1.25, -1.25)
            -1.28,  # r=1.5, A=+1: min(1.5, 1.28) = 1.28, clipped high
            3.0]  # r=1.5, A=-2: min(-3, -2.56) = -3
    proximal = logs([0.3] * 7)
    current = (proximal + logs(ratio)).clone().requires_grad_(True)
    out = decoupled_ppo_loss(current, proximal, proximal.clone(), torch.tensor(A, dtype=torch.float64),
                             token_mean(7), S)
    assert math.isclose(out.loss.item(), sum(hand) / 7, rel_tol=1e-12)
    out.loss.backward()
    # d/dcurrent of -r A is -r A; clipped tokens (1 and 5) get none
    expected_grad = [-(r * a) / 7 for r, a in zip(ratio, A)]
    expected_grad[1] = expected_grad[5] = 0.0
    assert torch.allclose(current.grad, torch.tensor(expected_grad, dtype=torch.float64), atol=1e-12)
    stats = finish_stats(out.sums, out.maxima)
    assert stats["clip_frac"] == pytest.approx(2 / 7)
    assert stats["clip_low_frac"] == pytest.approx(1 / 7) and stats["clip_high_frac"] == pytest.approx(1 / 7)
    assert stats["is_weight_mean"] == pytest.approx(1.0) and stats["is_weight_max"] == pytest.approx(1.0)
    assert stats["truncated_frac"] == 0.0
    assert stats["tokens"] == 7


def test_symmetric_clip_clips_what_clip_higher_lets_through():
    proximal = logs([0.3])
    current = proximal + math.log(1.25)
    A = torch.tensor([1.0], dtype=torch.float64)
    sym = LossSettings(clip_eps_low=0.2, clip_eps_high=0.2)
    for settings, expected in ((sym, -1.2), (S, -1.25)):
        out = decoupled_ppo_loss(current, proximal, proximal, A, token_mean(1), settings)
        assert out.loss.item() == pytest.approx(expected)


def test_stale_behaviour_weights_are_exact_truncated_and_detached():
    # proximal / behaviour = 0.5, 1, 1.5, 3 -> truncated at cap 2 -> 0.5, 1, 1.5, 2
    behaviour = logs([0.4, 0.4, 0.4, 0.1])
    proximal = logs([0.2, 0.4, 0.6, 0.3]).clone().requires_grad_(True)
    w, raw = behaviour_weights(proximal.detach(), behaviour, cap=2.0)
    assert torch.allclose(raw, torch.tensor([0.5, 1.0, 1.5, 3.0], dtype=torch.float64))
    assert torch.allclose(w, torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=torch.float64))

    ratio = [1.0, 1.1, 0.9, 1.0]
    A = [1.0, -1.0, 1.0, 2.0]
    current = (proximal.detach() + logs(ratio)).clone().requires_grad_(True)
    behaviour_leaf = behaviour.clone().requires_grad_(True)
    out = decoupled_ppo_loss(current, proximal, behaviour_leaf, torch.tensor(A, dtype=torch.float64),
                             token_mean(4), S)
    hand = [-0.5 * 1.0, -1.0 * -1.1, -1.5 * 0.9, -2.0 * 2.0]  # none clipped: 0.8 <= r <= 1.28
    assert out.loss.item() == pytest.approx(sum(hand) / 4, rel=1e-12)
    out.loss.backward()
    grad = [-wi * r * a / 4 for wi, r, a in zip([0.5, 1.0, 1.5, 2.0], ratio, A)]
    assert torch.allclose(current.grad, torch.tensor(grad, dtype=torch.float64), atol=1e-12)
    assert proximal.grad is None and behaviour_leaf.grad is None  # the weight carries no gradient
    stats = finish_stats(out.sums, out.maxima)
    assert stats["is_weight_mean"] == pytest.approx(1.5)  # (0.5 + 1 + 1.5 + 3) / 4, before truncation
    assert stats["is_weight_max"] == pytest.approx(3.0)
    assert stats["truncated_frac"] == pytest.approx(0.25)


def test_the_coupled_loss_is_standard_clipped_ppo_on_the_behaviour_logprobs():
    """The off-policy ablation's loss: the behaviour logprobs take the proximal ones' place (the ratio is
    current over behaviour, clipped around it) and there is no importance weight, whatever the proximal
    policy; it differs from the decoupled loss as soon as behaviour != proximal."""
    coupled = LossSettings(clip_eps_low=0.2, clip_eps_high=0.28, behaviour_weight_cap=0.5, policy_loss="coupled")
    behaviour = logs([0.4, 0.4, 0.4, 0.1])
    proximal = logs([0.2, 0.4, 0.6, 0.3])  # stale behaviour: weights 0.5, 1, 1.5, 3
    ratio = [0.5, 1.1, 1.5, 1.0]  # current / behaviour
    A = torch.tensor([-1.0, -1.0, 1.0, 2.0], dtype=torch.float64)
    current = (behaviour + logs(ratio)).clone().requires_grad_(True)
    out = decoupled_ppo_loss(current, proximal, behaviour, A, token_mean(4), coupled)
    # standard clipped PPO on behaviour, by hand: -min(r A, clip(r, 0.8, 1.28) A)
    hand = [0.8,  # r=0.5, A=-1: min(-0.5, -0.8), clipped low
            1.1,  # r=1.1, A=-1: not clipped
            -1.28,  # r=1.5, A=+1: clipped high
            -2.0]  # r=1: not clipped
    assert out.loss.item() == pytest.approx(sum(hand) / 4, rel=1e-12)
    # the same as the decoupled loss given behaviour as its proximal policy (there the weight is exactly 1)
    standard = decoupled_ppo_loss(current, behaviour, behaviour, A, token_mean(4), S)
    assert out.loss.item() == pytest.approx(standard.loss.item(), rel=1e-12)
    out.loss.backward()
    grad = [0.0, 1.1 / 4, 0.0, -2.0 / 4]  # clipped tokens get none; the others -r A / 4, with no weight
    assert torch.allclose(current.grad, torch.tensor(grad, dtype=torch.float64), atol=1e-12)
    stats = finish_stats(out.sums, out.maxima)
    assert stats["is_weight_mean"] == 1.0 and stats["is_weight_max"] == 1.0 and stats["truncated_frac"] == 0.0
    assert stats["clip_frac"] == pytest.approx(2 / 4)
    # the decoupled loss on the same tokens differs: its ratio is around the proximal policy, weighted
    # (ratio current / proximal = 1, 1.1, 1, 1/3, none clipped; weights 0.5, 1, 1.5, 2 after truncation)
    current.grad = None
    decoupled = decoupled_ppo_loss(current, proximal, behaviour, A, token_mean(4), S)
    by_hand = [0.5 * 1.0, 1.0 * 1.1, -1.5 * 1.0, -2.0 * 2 / 3]
    assert decoupled.loss.item() == pytest.approx(sum(by_hand) / 4, rel=1e-12)
    assert decoupled.loss.item() != pytest.approx(out.loss.item(), abs=0.01)
    decoupled.loss.backward()
    grad = [0.5 / 4, 1.1 / 4, -1.5 / 4, -2.0 * 2 / 3 / 4]  # -w (current / proximal) A / 4: no token clipped
    assert torch.allclose(current.grad, torch.tensor(grad, dtype=torch.float64), atol=1e-12)
    # and with behaviour == proximal the two agree
    same = [decoupled_ppo_loss(current, behaviour, behaviour, A, token_mean(4), s).loss.item() for s in (S, coupled)]
    assert same[0] == pytest.approx(same[1], rel=1e-12)
    with pytest.raises(ValueError, match="policy_loss"):
        LossSettings(policy_loss="off")


def test_masked_tokens_contribute_nothing():
    proximal = logs([0.3, 0.3, 0.3])
    current = (proximal + logs([1.1, 5.0, 0.9])).clone().requires_grad_(True)
    A = torch.tensor([1.0, 100.0, -1.0], dtype=torch.float64)
    weights = torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64)  # token 1 is padding
    out = decoupled_ppo_loss(current, proximal, proximal, A, weights, S)
    assert out.loss.item() == pytest.approx((-1.1 + 0.9) / 2)
    out.loss.backward()
    assert current.grad[1] == 0.0
    assert out.sums["tokens"] == 2 and out.maxima["is_weight_max"] == pytest.approx(1.0)


def test_aggregation_weights_by_hand():
    # two sequences in the mini-batch: one with 1 sampled token, one with 3 (all here)
    counts = torch.tensor([1.0, 3.0, 3.0, 3.0])
    tok = aggregation_weights(counts, "token_mean", total_tokens=4, total_sequences=2)
    assert torch.allclose(tok, torch.full((4,), 0.25))
    seq = aggregation_weights(counts, "seq_mean_token_mean", total_tokens=4, total_sequences=2)
    assert torch.allclose(seq, torch.tensor([0.5, 1 / 6, 1 / 6, 1 / 6]))
    losses = torch.tensor([4.0, 1.0, 2.0, 3.0])
    assert (tok * losses).sum().item() == pytest.approx(2.5)  # (4 + 1 + 2 + 3) / 4
    assert (seq * losses).sum().item() == pytest.approx(3.0)  # (4 + (1 + 2 + 3) / 3) / 2
    with pytest.raises(ValueError, match="loss_agg"):
        aggregation_weights(counts, "sum", 4, 2)


def test_loss_split_over_micro_batches_sums_to_the_whole():
    torch.manual_seed(0)
    n = 10
    proximal = -torch.rand(n, dtype=torch.float64)
    behaviour = proximal - 0.3 * torch.rand(n, dtype=torch.float64)
    current = proximal + 0.2 * torch.randn(n, dtype=torch.float64)
    A = torch.randn(n, dtype=torch.float64)
    counts = torch.tensor([4.0] * 4 + [6.0] * 6)
    for mode in ("token_mean", "seq_mean_token_mean"):
        w = aggregation_weights(counts, mode, total_tokens=10, total_sequences=2).double()
        whole = decoupled_ppo_loss(current, proximal, behaviour, A, w, S).loss.item()
        parts = sum(decoupled_ppo_loss(current[s], proximal[s], behaviour[s], A[s], w[s], S).loss.item()
                    for s in (slice(0, 4), slice(4, 10)))
        assert parts == pytest.approx(whole, rel=1e-12)


def test_kl_estimators_by_hand():
    current, reference = torch.tensor([-1.0]), torch.tensor([-1.5])  # log(p/q) = 0.5
    assert kl_penalty(current, reference, "k1").item() == pytest.approx(0.5)
    assert kl_penalty(current, reference, "k2").item() == pytest.approx(0.125)
    assert kl_penalty(current, reference, "k3").item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    assert kl_penalty(current, current, "k3").item() == 0.0
    with pytest.raises(ValueError, match="kl_type"):
        LossSettings(kl_type="k4")


def test_kl_and_entropy_terms_enter_the_loss():
    proximal = logs([0.5])
    current = proximal.clone().requires_grad_(True)
    A = torch.zeros(1, dtype=torch.float64)
    ref = proximal - 0.5
    settings = LossSettings(kl_coef=0.1, kl_type="k2", entropy_coef=0.01)
    out = decoupled_ppo_loss(current, proximal, proximal, A, token_mean(1), settings,
                             entropy=torch.tensor([2.0], dtype=torch.float64), reference=ref)
    assert out.loss.item() == pytest.approx(0.1 * 0.125 - 0.01 * 2.0)
    assert out.sums["kl_ref"] == pytest.approx(0.125) and out.sums["entropy"] == pytest.approx(2.0)
    out.loss.backward()
    assert current.grad.item() == pytest.approx(0.1 * 0.5)  # d/dc of 0.1 * 0.5 (c - r)^2


def test_clipped_value_loss_by_hand():
    settings = LossSettings(value_clip=0.2, value_coef=0.5)
    zero = torch.zeros(2, dtype=torch.float64)
    values = torch.tensor([0.5, 0.1], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, dtype=torch.float64)
    returns = torch.ones(2, dtype=torch.float64)
    out = decoupled_ppo_loss(zero.clone(), zero, zero, zero, token_mean(2), settings,
                             values=values, old_values=old, returns=returns)
    # token 0: unclipped (0.5-1)^2 = 0.25, clipped (0.2-1)^2 = 0.64 -> 0.5 * 0.64 = 0.32
    # token 1: inside the clip range -> 0.5 * 0.81 = 0.405
    assert out.sums["value_loss"] == pytest.approx(0.32 + 0.405)
    assert out.loss.item() == pytest.approx(0.5 * (0.32 + 0.405) / 2)
    assert out.sums["value_clip_frac"] == 1.0
    out.loss.backward()
    assert values.grad[0].item() == 0.0  # the clipped branch is the max: no gradient through V
    assert values.grad[1].item() == pytest.approx(0.5 * 0.5 * (0.1 - 1.0))  # coef * token weight * (V - R)
    with pytest.raises(ValueError, match="old_values"):
        decoupled_ppo_loss(zero, zero, zero, zero, token_mean(2), settings, values=values)
